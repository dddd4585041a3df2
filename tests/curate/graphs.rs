//! The curation actors inside the shipped graphs: nothing planted reaches the training set, every captured item
//! reaches exactly one terminal state in the store, and reordering the curation stage in a graph file (no code
//! change) changes what comes out.

use std::collections::BTreeMap;
use std::path::Path;

use hearth::demo::{SIMULATE_PLANTED, events_per_round};
use hearth::engine::start;
use hearth::message::Sample;
use hearth::store::{CurationCounts, Store};

const ROUNDS: usize = 3;

struct Outcome {
    admitted: Vec<Sample>,
    counts: CurationCounts,
    /// The quarantined samples, as text.
    quarantined: String,
}

impl Outcome {
    /// Decision counts by deciding node and the reason's first words (ids cut off).
    fn reasons(&self) -> BTreeMap<String, u64> {
        let mut by = BTreeMap::new();
        for (node, reason, n) in &self.counts.reasons {
            let short = reason.split(" of #").next().unwrap_or("");
            let short = short.split(" #").next().unwrap_or("");
            *by.entry(format!("{node}: {short}")).or_default() += n;
        }
        by
    }

    fn guard_decisions(&self) -> u64 {
        self.reasons()
            .iter()
            .filter(|(r, _)| r.starts_with("guard"))
            .map(|(_, n)| n)
            .sum()
    }
}

fn run(graph_file: &str) -> Outcome {
    let dir = tempfile::tempdir().unwrap();
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join(graph_file);
    let src = std::fs::read_to_string(path).unwrap();
    let shipped = "Simulate(rounds: 50, interval_ms: 20)";
    assert!(
        src.contains(shipped),
        "{graph_file}: the simulate line changed"
    );
    let src = src.replace(
        shipped,
        &format!("Simulate(rounds: {ROUNDS}, interval_ms: 0)"),
    );
    let graph =
        hearth::actors::ActorKind::graph(&src).unwrap_or_else(|e| panic!("{graph_file}: {e:#?}"));
    let report = start(graph, Some(dir.path())).unwrap().wait();
    assert!(report.failed_nodes.is_empty(), "{:?}", report.failed_nodes);
    let store = Store::open(dir.path()).unwrap();
    Outcome {
        admitted: store.training_set().unwrap(),
        counts: store.counts().unwrap(),
        quarantined: serde_json::to_string(&store.quarantine_list().unwrap()).unwrap(),
    }
}

fn check_invariants(name: &str, o: &Outcome) {
    let text = serde_json::to_string(&o.admitted).unwrap();
    for value in SIMULATE_PLANTED {
        assert!(
            !text.contains(value),
            "{name}: {value} reached the training set"
        );
    }
    let (interactions, feedback) = events_per_round();
    let captured = (ROUNDS * (interactions + feedback)) as u64;
    let c = &o.counts;
    assert_eq!(c.interactions + c.feedback, captured, "{name}: {c:?}");
    assert_eq!(c.pending, 0, "{name}: {c:?}");
    assert_eq!(
        c.admitted + c.dropped + c.quarantined,
        captured,
        "{name}: an item was lost or counted twice: {c:?}"
    );
    assert!(!o.admitted.is_empty(), "{name}: nothing admitted");
}

#[test]
fn reordering_curation_in_a_graph_file_changes_the_outcome_but_never_the_invariants() {
    let default = run("graphs/curate.ron");
    let secrets_first = run("graphs/curate_secrets_first.ron");
    let guard_first = run("graphs/curate_guard_first.ron");
    for (name, o) in [
        ("default", &default),
        ("secrets_first", &secrets_first),
        ("guard_first", &guard_first),
    ] {
        check_invariants(name, o);
    }
    let all = |o: &Outcome| serde_json::to_string(&o.admitted).unwrap() + &o.quarantined;
    let default_text = all(&default);
    assert!(default_text.contains("<EMAIL>"), "{default_text}");
    // The redactor runs first in curate.ron and labels the pasted key <API_KEY>; with the secret filter
    // first it is labelled by provider rule instead.
    assert!(default_text.contains("<API_KEY>"), "{default_text}");
    assert!(!default_text.contains("<SECRET:github-pat>"));
    let secrets_text = all(&secrets_first);
    assert!(
        secrets_text.contains("<SECRET:github-pat>"),
        "{secrets_text}"
    );
    // A guard that sees raw personal data stops more than one that sees sentinels.
    assert!(
        guard_first.guard_decisions() > default.guard_decisions(),
        "guard first {:?} vs default {:?}",
        guard_first.reasons(),
        default.reasons()
    );
}
