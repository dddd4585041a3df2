//! The curation actors inside the shipped graphs: nothing planted reaches the training set, every sample is
//! either admitted or recorded with a decision, and reordering the curation stage in a graph file (no code
//! change) changes what comes out.

use std::collections::BTreeMap;
use std::path::Path;

use hearth::actors::generate::DEMO_PLANTED;
use hearth::engine::message::Message;
use hearth::engine::{Graph, start};

const SAMPLES: usize = 80;

struct Outcome {
    admitted: Vec<Message>,
    decisions: Vec<Message>,
}

impl Outcome {
    fn reasons(&self) -> BTreeMap<String, usize> {
        let mut by = BTreeMap::new();
        for m in &self.decisions {
            let Message::Decision(d) = m else {
                panic!("not a decision")
            };
            // "guard: response: Unsafe (PII)" -> "guard: response: Unsafe (PII)"; dedup reasons name ids, cut them.
            let key = d
                .reason
                .split(" of #")
                .next()
                .unwrap_or("")
                .split(" #")
                .next()
                .unwrap_or("")
                .to_owned();
            *by.entry(key).or_default() += 1;
        }
        by
    }
}

fn run(graph_file: &str) -> Outcome {
    let dir = tempfile::tempdir().unwrap();
    let src =
        std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join(graph_file)).unwrap();
    let src = src.replace(
        "count: 2000, interval_us: 2000",
        &format!("count: {SAMPLES}, interval_us: 0"),
    );
    assert!(
        src.contains(&format!("count: {SAMPLES}")),
        "{graph_file}: generator line changed"
    );
    let graph = Graph::from_ron(&src).unwrap_or_else(|e| panic!("{graph_file}: {e:#?}"));
    let report = start(graph, Some(dir.path())).unwrap().wait();
    assert!(report.failed_nodes.is_empty(), "{:?}", report.failed_nodes);
    let read = |name: &str| -> Vec<Message> {
        std::fs::read_to_string(dir.path().join(name))
            .unwrap_or_default()
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect()
    };
    Outcome {
        admitted: read("training_set.jsonl"),
        decisions: read("decisions.jsonl"),
    }
}

fn check_invariants(name: &str, o: &Outcome) {
    let text = serde_json::to_string(&o.admitted).unwrap();
    for value in DEMO_PLANTED {
        assert!(
            !text.contains(value),
            "{name}: {value} reached the training set"
        );
    }
    assert_eq!(
        o.admitted.len() + o.decisions.len(),
        SAMPLES,
        "{name}: a sample was lost or doubled"
    );
    assert!(!o.admitted.is_empty(), "{name}: nothing admitted");
}

#[test]
fn reordering_curation_in_a_graph_file_changes_the_outcome_but_never_the_invariants() {
    let default = run("graphs/default.ron");
    let secrets_first = run("graphs/curate_secrets_first.ron");
    let guard_first = run("graphs/curate_guard_first.ron");
    for (name, o) in [
        ("default", &default),
        ("secrets_first", &secrets_first),
        ("guard_first", &guard_first),
    ] {
        check_invariants(name, o);
    }
    let default_text = serde_json::to_string(&default.admitted).unwrap();
    assert!(
        default_text.contains("<EMAIL>") && default_text.contains("<CREDIT_CARD>"),
        "{default_text}"
    );
    // The redactor runs first in default.ron and labels the pasted key <API_KEY>; with the secret filter first
    // it is labelled by provider rule instead, and it reaches the guard already redacted.
    let secrets_text = serde_json::to_string(&secrets_first.admitted).unwrap()
        + &serde_json::to_string(&secrets_first.decisions).unwrap();
    assert!(
        secrets_text.contains("<SECRET:github-pat>"),
        "{secrets_text}"
    );
    let default_all = default_text + &serde_json::to_string(&default.decisions).unwrap();
    assert!(!default_all.contains("<SECRET:github-pat>"));
    // A guard that sees raw personal data drops more than one that sees sentinels.
    let guard_drops = |o: &Outcome| {
        o.reasons()
            .iter()
            .filter(|(r, _)| r.starts_with("guard"))
            .map(|(_, n)| n)
            .sum::<usize>()
    };
    assert!(
        guard_drops(&guard_first) > guard_drops(&default),
        "guard first {:?} vs default {:?}",
        guard_first.reasons(),
        default.reasons()
    );
}
