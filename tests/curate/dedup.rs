//! Dedup behaviour, persistence, one test per config option, and measured recall/precision.

use hearth::curate::dedup::minhash::{exact_jaccard, normalise, shingle_set};
use hearth::curate::dedup::{
    CorpusKind, DedupConfig, DedupDecision, DedupError, Deduper, Origin, ShingleKind,
    near_dup_corpus,
};

const G: Origin = Origin::Grounded;

/// A 40-word text whose words are all distinct, so edits have predictable effects.
fn base_text(tag: &str) -> Vec<String> {
    let words = [
        "river", "garden", "lantern", "copper", "meadow", "violin", "harbor", "pepper", "canyon",
        "marble", "orchid", "timber", "velvet", "falcon", "glacier", "saddle", "quartz", "willow",
        "ember", "lagoon", "pigeon", "summit", "tundra", "walnut", "anchor", "beacon", "cobalt",
        "dynamo", "fennel", "gravel", "hazel", "island", "jasper", "kettle", "ledger", "magnet",
        "nectar", "oyster", "parcel", "quiver",
    ];
    words.iter().map(|w| format!("{w}{tag}")).collect()
}

fn edited(words: &[String], n_subst: usize, marker: &str) -> String {
    let mut w = words.to_vec();
    for i in 0..n_subst {
        let pos = (i * 7 + 3) % w.len();
        w[pos] = format!("{marker}{marker}{marker}{i}");
    }
    w.join(" ")
}

fn cfg() -> DedupConfig {
    DedupConfig::default()
}

#[test]
fn exact_duplicates_ignore_case_punctuation_and_whitespace() {
    let mut d = Deduper::new(cfg()).unwrap();
    assert_eq!(
        d.check_and_insert("Hello, world: this is a test.", G),
        DedupDecision::Admit
    );
    assert_eq!(
        d.check_and_insert("  hello world THIS is a\n test!!! ", G),
        DedupDecision::ExactDuplicate { of: 0 }
    );
    assert_eq!(
        d.check_and_insert("hello world this is a", G),
        DedupDecision::Admit
    );
    assert_eq!(d.next_seq(), 3);
    assert_eq!(d.len(), 2);
}

#[test]
fn normalise_keeps_unicode_letters_and_separates_on_punctuation() {
    let mut s = String::new();
    normalise("Ünïcode—Straße,end.Start  ", &mut s);
    assert_eq!(s, "ünïcode straße end start");
    normalise("", &mut s);
    assert_eq!(s, "");
}

#[test]
fn one_edited_word_is_a_near_duplicate_distinct_text_is_admitted() {
    let mut d = Deduper::new(cfg()).unwrap();
    let w = base_text("");
    assert_eq!(d.check_and_insert(&w.join(" "), G), DedupDecision::Admit);
    match d.check_and_insert(&edited(&w, 1, "a"), G) {
        DedupDecision::NearDuplicate {
            of,
            jaccard_estimate,
        } => {
            assert_eq!(of, 0);
            assert!(jaccard_estimate >= 0.8, "{jaccard_estimate}");
        }
        other => panic!("expected near duplicate, got {other:?}"),
    }
    assert_eq!(
        d.check_and_insert(&base_text("x").join(" "), G),
        DedupDecision::Admit
    );
}

#[test]
fn empty_and_tiny_texts_do_not_panic() {
    let mut d = Deduper::new(cfg()).unwrap();
    assert_eq!(d.check_and_insert("", G), DedupDecision::Admit);
    assert_eq!(
        d.check_and_insert("!!!", G),
        DedupDecision::ExactDuplicate { of: 0 }
    );
    assert_eq!(d.check_and_insert("ab", G), DedupDecision::Admit);
    assert_eq!(d.check_and_insert("ab cd", G), DedupDecision::Admit);
}

#[test]
fn config_serde_defaults_and_rejects_unknown_fields() {
    let c: DedupConfig = serde_json::from_str(r#"{"threshold": 0.9}"#).unwrap();
    assert_eq!(c.threshold, 0.9);
    assert_eq!(c.num_perm, DedupConfig::default().num_perm);
    assert!(serde_json::from_str::<DedupConfig>(r#"{"treshold": 0.9}"#).is_err());
}

#[test]
fn invalid_configs_are_rejected() {
    let bad = [
        DedupConfig {
            bands: 30,
            rows: 5,
            ..cfg()
        },
        DedupConfig {
            threshold: 0.0,
            ..cfg()
        },
        DedupConfig {
            cluster_threshold: 0.9,
            ..cfg()
        },
        DedupConfig {
            shingle_size: 0,
            ..cfg()
        },
        DedupConfig {
            capacity: 0,
            ..cfg()
        },
        DedupConfig {
            max_per_cluster: 0,
            ..cfg()
        },
    ];
    for c in bad {
        assert!(
            matches!(Deduper::new(c.clone()), Err(DedupError::InvalidConfig(_))),
            "{c:?}"
        );
    }
}

// ---------- persistence ----------

#[test]
fn state_survives_restart_and_sequence_continues() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("dedup.state");
    let w = base_text("");
    let mut d = Deduper::new(cfg()).unwrap();
    assert_eq!(d.check_and_insert(&w.join(" "), G), DedupDecision::Admit);
    assert_eq!(
        d.check_and_insert("something else entirely", G),
        DedupDecision::Admit
    );
    d.save(&path).unwrap();
    let names: Vec<_> = std::fs::read_dir(dir.path())
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(names.len(), 1, "temp file left behind: {names:?}");

    let mut d2 = Deduper::load(&path, cfg()).unwrap();
    assert_eq!(d2.next_seq(), 2);
    assert_eq!(d2.len(), 2);
    assert_eq!(
        d2.check_and_insert("Something else, ENTIRELY.", G),
        DedupDecision::ExactDuplicate { of: 1 }
    );
    assert!(matches!(
        d2.check_and_insert(&edited(&w, 1, "b"), G),
        DedupDecision::NearDuplicate { of: 0, .. }
    ));
    // Saving again over the existing file works (rename replaces).
    d2.save(&path).unwrap();
    assert_eq!(Deduper::load(&path, cfg()).unwrap().next_seq(), 4);
}

#[test]
fn load_rejects_signature_config_mismatch_naming_the_field() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("s");
    let mut d = Deduper::new(cfg()).unwrap();
    d.check_and_insert("a b c", G);
    d.save(&path).unwrap();
    let err = match Deduper::load(
        &path,
        DedupConfig {
            num_perm: 64,
            bands: 16,
            rows: 4,
            ..cfg()
        },
    ) {
        Err(e) => e,
        Ok(_) => panic!("loaded with a different num_perm"),
    };
    assert!(
        matches!(
            &err,
            DedupError::ConfigMismatch {
                field: "num_perm",
                ..
            }
        ),
        "{err}"
    );
    assert!(err.to_string().contains("num_perm"), "{err}");
    // Policy fields may change across restarts.
    assert!(
        Deduper::load(
            &path,
            DedupConfig {
                threshold: 0.9,
                ..cfg()
            }
        )
        .is_ok()
    );
}

#[test]
fn load_reports_missing_and_corrupt_files() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("s");
    assert!(matches!(
        Deduper::load(&path, cfg()),
        Err(DedupError::Io { .. })
    ));
    let mut d = Deduper::new(cfg()).unwrap();
    d.check_and_insert("a b c d e f", G);
    d.save(&path).unwrap();
    let mut bytes = std::fs::read(&path).unwrap();
    let n = bytes.len();
    bytes[n / 2] ^= 0x55;
    std::fs::write(&path, &bytes).unwrap();
    assert!(matches!(
        Deduper::load(&path, cfg()),
        Err(DedupError::Corrupt { .. })
    ));
    std::fs::write(&path, &bytes[..n / 3]).unwrap();
    assert!(matches!(
        Deduper::load(&path, cfg()),
        Err(DedupError::Corrupt { .. })
    ));
    std::fs::write(&path, b"garbage").unwrap();
    assert!(matches!(
        Deduper::load(&path, cfg()),
        Err(DedupError::Corrupt { .. })
    ));
}

// ---------- one test per config option ----------

/// Helper: the decision for `second` after admitting `first`.
fn second(config: DedupConfig, first: &str, second: &str) -> DedupDecision {
    let mut d = Deduper::new(config).unwrap();
    assert_eq!(d.check_and_insert(first, G), DedupDecision::Admit);
    d.check_and_insert(second, G)
}

#[test]
fn option_shingle_kind() {
    let w = base_text("");
    let (a, b) = (w.join(" "), edited(&w, 2, "s"));
    assert!(second(cfg(), &a, &b).is_duplicate());
    let word5 = DedupConfig {
        shingle: ShingleKind::Word,
        ..cfg()
    };
    assert_eq!(second(word5, &a, &b), DedupDecision::Admit);
}

#[test]
fn option_shingle_size() {
    let w = base_text("");
    let (a, b) = (w.join(" "), edited(&w, 2, "z"));
    assert!(second(cfg(), &a, &b).is_duplicate());
    let long = DedupConfig {
        shingle_size: 40,
        ..cfg()
    };
    assert_eq!(second(long, &a, &b), DedupDecision::Admit);
}

fn estimate(config: DedupConfig, a: &str, b: &str) -> f32 {
    match second(config, a, b) {
        DedupDecision::NearDuplicate {
            jaccard_estimate, ..
        } => jaccard_estimate,
        other => panic!("expected near duplicate, got {other:?}"),
    }
}

#[test]
fn option_num_perm() {
    let w = base_text("");
    let (a, b) = (w.join(" "), edited(&w, 2, "n"));
    let loose = DedupConfig {
        threshold: 0.5,
        cluster_threshold: 0.5,
        ..cfg()
    };
    let e128 = estimate(loose.clone(), &a, &b);
    let e10 = estimate(
        DedupConfig {
            num_perm: 10,
            bands: 10,
            rows: 1,
            ..loose
        },
        &a,
        &b,
    );
    // The estimate is a count of equal positions over num_perm: multiples of 1/10 here, and
    // 0.5/1.0 are the only multiples of 1/10 that are also multiples of 1/128.
    assert!(((e10 * 10.0) - (e10 * 10.0).round()).abs() < 1e-4, "{e10}");
    assert!(e128 < 1.0 && e128 != 0.5);
    assert_ne!(e128, e10);
}

#[test]
fn option_bands_and_rows() {
    // One band of all 128 rows: a pair only collides if the whole signature matches.
    let w = base_text("");
    let (a, b) = (w.join(" "), edited(&w, 1, "b"));
    assert!(second(cfg(), &a, &b).is_duplicate());
    let one_band = DedupConfig {
        bands: 1,
        rows: 128,
        ..cfg()
    };
    assert_eq!(second(one_band.clone(), &a, &b), DedupDecision::Admit);
    // Same effect through rows alone: 20 bands of 6 find it, 1 band of 100 rows does not.
    let rows100 = DedupConfig {
        bands: 1,
        rows: 100,
        ..cfg()
    };
    assert_eq!(second(rows100, &a, &b), DedupDecision::Admit);
    let many_bands = DedupConfig {
        bands: 64,
        rows: 2,
        threshold: 0.8,
        ..cfg()
    };
    assert!(second(many_bands, &a, &b).is_duplicate());
}

#[test]
fn option_threshold() {
    let w = base_text("");
    let (a, b) = (w.join(" "), edited(&w, 2, "t"));
    assert!(second(cfg(), &a, &b).is_duplicate());
    let strict = DedupConfig {
        threshold: 0.99,
        ..cfg()
    };
    assert_eq!(second(strict, &a, &b), DedupDecision::Admit);
}

/// Texts related to `w` and to each other at character 5-gram Jaccard ≈ 0.55 (8 of 40 words
/// replaced at the same positions): one cluster at `cluster_threshold` 0.4, no near duplicates.
fn related(w: &[String]) -> Vec<String> {
    (0..4).map(|i| edited(w, 8, &format!("r{i}"))).collect()
}

fn floor_cfg() -> DedupConfig {
    DedupConfig {
        cluster_threshold: 0.4,
        max_per_cluster: 2,
        bands: 42,
        rows: 3,
        ..cfg()
    }
}

fn run(config: DedupConfig, texts: &[String], origin: Origin) -> Vec<DedupDecision> {
    let mut d = Deduper::new(config).unwrap();
    texts
        .iter()
        .map(|t| d.check_and_insert(t, origin))
        .collect()
}

#[test]
fn option_max_per_cluster_caps_related_samples() {
    let r = related(&base_text(""));
    let out = run(floor_cfg(), &r, G);
    assert_eq!(out[0], DedupDecision::Admit);
    assert_eq!(out[1], DedupDecision::Admit);
    assert_eq!(out[2], DedupDecision::DiversityFloor { cluster: 0 });
    let out = run(
        DedupConfig {
            max_per_cluster: 3,
            ..floor_cfg()
        },
        &r,
        G,
    );
    assert_eq!(&out[..3], &[DedupDecision::Admit; 3]);
}

#[test]
fn option_cluster_threshold() {
    let r = related(&base_text(""));
    // At 0.79 the related texts are not similar enough to join one cluster.
    let out = run(
        DedupConfig {
            cluster_threshold: 0.79,
            ..floor_cfg()
        },
        &r,
        G,
    );
    assert!(out.iter().all(|d| *d == DedupDecision::Admit), "{out:?}");
}

#[test]
fn option_window() {
    let r = related(&base_text(""));
    let mut d = Deduper::new(DedupConfig {
        window: 3,
        ..floor_cfg()
    })
    .unwrap();
    assert_eq!(d.check_and_insert(&r[0], G), DedupDecision::Admit); // seq 0
    assert_eq!(d.check_and_insert(&r[1], G), DedupDecision::Admit); // seq 1
    assert!(matches!(
        d.check_and_insert(&r[2], G),
        DedupDecision::DiversityFloor { .. }
    )); // seq 2: 2 in window
    // seq 3: seq 0 left the window (window 3), so one slot is free again.
    assert_eq!(d.check_and_insert(&r[2], G), DedupDecision::Admit);
    // With the default (10k) window the same sequence stays capped.
    let mut d = Deduper::new(floor_cfg()).unwrap();
    for t in &r[..2] {
        d.check_and_insert(t, G);
    }
    d.check_and_insert(&r[2], G);
    assert!(matches!(
        d.check_and_insert(&r[2], G),
        DedupDecision::DiversityFloor { .. }
    ));
}

#[test]
fn option_self_generated_weight() {
    let r = related(&base_text(""));
    let c = DedupConfig {
        max_per_cluster: 3,
        ..floor_cfg()
    };
    // Grounded: three fit in k = 3.
    let out = run(c.clone(), &r[..3], G);
    assert_eq!(out, vec![DedupDecision::Admit; 3]);
    // Self-generated at weight 2: the second already fills the cluster (2 + 2 > 3).
    let out = run(c.clone(), &r[..3], Origin::SelfGenerated);
    assert_eq!(out[0], DedupDecision::Admit);
    assert!(matches!(out[1], DedupDecision::DiversityFloor { .. }));
    // At weight 1 self-generated samples count like grounded ones.
    let out = run(
        DedupConfig {
            self_generated_weight: 1,
            ..c
        },
        &r[..3],
        Origin::SelfGenerated,
    );
    assert_eq!(out, vec![DedupDecision::Admit; 3]);
}

#[test]
fn option_capacity_evicts_oldest_first() {
    let texts: Vec<String> = (0..3)
        .map(|i| base_text(&i.to_string()).join(" "))
        .collect();
    let mut d = Deduper::new(DedupConfig {
        capacity: 2,
        ..cfg()
    })
    .unwrap();
    for t in &texts {
        assert_eq!(d.check_and_insert(t, G), DedupDecision::Admit);
    }
    assert_eq!(d.len(), 2);
    // The oldest (seq 0) was evicted and is admitted again; seq 2 is still remembered.
    assert_eq!(d.check_and_insert(&texts[0], G), DedupDecision::Admit);
    assert_eq!(
        d.check_and_insert(&texts[2], G),
        DedupDecision::ExactDuplicate { of: 2 }
    );
    // With room for all, nothing is forgotten.
    let mut d = Deduper::new(cfg()).unwrap();
    for t in &texts {
        d.check_and_insert(t, G);
    }
    assert!(d.check_and_insert(&texts[0], G).is_duplicate());
}

#[test]
fn option_capacity_applies_on_load() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("s");
    let texts: Vec<String> = (0..3)
        .map(|i| base_text(&i.to_string()).join(" "))
        .collect();
    let mut d = Deduper::new(cfg()).unwrap();
    for t in &texts {
        d.check_and_insert(t, G);
    }
    d.save(&path).unwrap();
    let mut d = Deduper::load(
        &path,
        DedupConfig {
            capacity: 1,
            ..cfg()
        },
    )
    .unwrap();
    assert_eq!(d.len(), 1);
    assert_eq!(d.check_and_insert(&texts[1], G), DedupDecision::Admit);
}

#[test]
fn option_seed() {
    let w = base_text("");
    let (a, b) = (w.join(" "), edited(&w, 1, "n"));
    let e1 = estimate(cfg(), &a, &b);
    let e2 = estimate(DedupConfig { seed: 7, ..cfg() }, &a, &b);
    assert_ne!(e1, e2, "a different seed draws different hashes");
    // And a saved store refuses a different seed.
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("s");
    Deduper::new(cfg()).unwrap().save(&path).unwrap();
    assert!(matches!(
        Deduper::load(&path, DedupConfig { seed: 7, ..cfg() }),
        Err(DedupError::ConfigMismatch { field: "seed", .. })
    ));
}

// ---------- measured quality ----------

#[test]
fn corpus_is_deterministic_and_mixed() {
    let a = near_dup_corpus(2000, 9);
    assert_eq!(a, near_dup_corpus(2000, 9));
    assert_ne!(a, near_dup_corpus(2000, 10));
    let count = |f: fn(&CorpusKind) -> bool| a.iter().filter(|r| f(&r.kind)).count();
    assert!(count(|k| matches!(k, CorpusKind::Original)) > 900);
    assert!(count(|k| matches!(k, CorpusKind::NearDuplicate { .. })) > 400);
    assert!(count(|k| matches!(k, CorpusKind::FormatVariant)) > 50);
    assert!(count(|k| matches!(k, CorpusKind::HardNegative)) > 100);
    for r in &a {
        let words = r.text.split_whitespace().count();
        assert!((15..=65).contains(&words), "{words}: {}", r.text);
    }
}

/// Near-duplicate recall and precision at threshold 0.8 on the generated corpus. Truth is by
/// construction (near duplicates and format variants of an earlier record); recall is also given
/// against exact Jaccard ≥ 0.8 of the default character 5-gram sets.
#[test]
fn near_duplicate_recall_and_precision_at_0_8() {
    let n = 20_000;
    let recs = near_dup_corpus(n, 42);
    let c = DedupConfig {
        max_per_cluster: u32::MAX,
        ..cfg()
    };
    let mut d = Deduper::new(c.clone()).unwrap();
    let (mut tp, mut fp, mut fneg) = (0usize, 0usize, 0usize);
    let (mut j_pos, mut j_hit) = (0usize, 0usize);
    let mut norm = String::new();
    let mut sets: Vec<Vec<u64>> = Vec::with_capacity(n);
    for r in &recs {
        normalise(&r.text, &mut norm);
        sets.push(shingle_set(&norm, c.shingle, c.shingle_size, c.seed));
        let flagged = d.check_and_insert(&r.text, G).is_duplicate();
        match (r.is_duplicate(), flagged) {
            (true, true) => tp += 1,
            (false, true) => fp += 1,
            (true, false) => fneg += 1,
            _ => {}
        }
        if let (true, Some(src)) = (r.is_duplicate(), r.source)
            && exact_jaccard(&sets[r.id as usize], &sets[src as usize]) >= 0.8
        {
            j_pos += 1;
            j_hit += flagged as usize;
        }
    }
    let recall = tp as f64 / (tp + fneg) as f64;
    let precision = tp as f64 / (tp + fp) as f64;
    let recall_j = j_hit as f64 / j_pos as f64;
    println!(
        "dedup n={n}: recall {recall:.4} precision {precision:.4} (tp {tp} fp {fp} fn {fneg}); \
         recall on pairs with exact J>=0.8: {recall_j:.4} ({j_hit}/{j_pos})"
    );
    assert!(recall >= 0.96, "recall {recall}");
    assert!(precision >= 0.99, "precision {precision}");
    assert!(recall_j >= 0.97, "recall vs exact J {recall_j}");
}

/// Arbitrary Unicode input never panics and stays deterministic.
#[test]
fn garbage_input_does_not_panic() {
    let alphabet: Vec<char> = "aé字🙂 ,.!\n\t0Z_-".chars().collect();
    let mut rng = hearth::curate::dedup::minhash::SplitMix64(3);
    let texts: Vec<String> = (0..3000)
        .map(|_| {
            let len = rng.below(40);
            (0..len)
                .map(|_| alphabet[rng.below(alphabet.len())])
                .collect()
        })
        .collect();
    for kind in [ShingleKind::Char, ShingleKind::Word] {
        for size in [1, 5, 9] {
            let c = DedupConfig {
                shingle: kind,
                shingle_size: size,
                ..cfg()
            };
            let mut a = Deduper::new(c.clone()).unwrap();
            let mut b = Deduper::new(c).unwrap();
            for t in &texts {
                assert_eq!(a.check_and_insert(t, G), b.check_and_insert(t, G));
            }
        }
    }
}

/// A sample replayed after a crash (dedup saw and admitted it, the store never committed it) is admitted
/// again, not dropped as a duplicate of itself; another sample with the same text is still a duplicate. The
/// sample keys survive save and load.
#[test]
fn a_replayed_sample_is_not_its_own_duplicate() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("dedup.state");
    let mut d = Deduper::new(cfg()).unwrap();
    let text = "please book the table by the window for eight people on friday";
    assert_eq!(d.check_and_insert_keyed(text, G, 7), DedupDecision::Admit);
    d.save(&path).unwrap();
    let mut d = Deduper::load(&path, cfg()).unwrap();
    assert_eq!(d.check_and_insert_keyed(text, G, 7), DedupDecision::Admit);
    assert_eq!(d.len(), 1, "a replay is not remembered twice");
    assert!(matches!(
        d.check_and_insert_keyed(text, G, 8),
        DedupDecision::ExactDuplicate { .. }
    ));
    assert!(matches!(
        d.check_and_insert(text, G),
        DedupDecision::ExactDuplicate { .. }
    ));
}

// ---------- the diversity floor across restarts ----------

/// The cluster counts behind the diversity floor are saved and loaded with the rest of the state: a
/// cluster filled before the save is still full after the load, and a cap raised at load counts the
/// admissions made before it.
#[test]
fn cluster_counts_survive_save_and_load() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("dedup.state");
    let r = related(&base_text(""));
    let mut d = Deduper::new(floor_cfg()).unwrap();
    assert_eq!(d.check_and_insert(&r[0], G), DedupDecision::Admit);
    assert_eq!(d.check_and_insert(&r[1], G), DedupDecision::Admit);
    d.save(&path).unwrap();
    drop(d);

    let mut d = Deduper::load(&path, floor_cfg()).unwrap();
    assert_eq!(
        d.check_and_insert(&r[2], G),
        DedupDecision::DiversityFloor { cluster: 0 }
    );
    // One more slot (k = 3): the two admitted before the restart still count, so one fits and the next
    // does not.
    let mut d = Deduper::load(
        &path,
        DedupConfig {
            max_per_cluster: 3,
            ..floor_cfg()
        },
    )
    .unwrap();
    assert_eq!(d.check_and_insert(&r[2], G), DedupDecision::Admit);
    assert_eq!(
        d.check_and_insert(&r[3], G),
        DedupDecision::DiversityFloor { cluster: 0 }
    );
}

/// The `dedup` actor as a graph runs it: a source feeds it samples, its admitted samples and its decisions
/// go to `out-<run>.jsonl` in the data directory, which also holds the node's state across runs.
mod node_restart {
    use std::path::Path;
    use std::sync::Arc;

    use hearth::actors::jsonl_sink::JsonlSinkParams;
    use hearth::actors::{KindInfo, Outbox, Plan, PortSpec};
    use hearth::engine::{
        Actor, ActorError, ActorFactory, BuildContext, EdgeSpec, Produce, WhenFull,
    };
    use hearth::message::{Message, MessageType, Origin, Provenance, Sample, SampleContent};

    use super::*;

    static FEED: KindInfo = KindInfo {
        name: "test_feed",
        about: "emits the samples it was given, then stops",
        inputs: &[],
        outputs: &[PortSpec::new("out", MessageType::Sample)],
        source: true,
    };

    /// Each sample is (id, text).
    struct Feed(Vec<(String, String)>);
    struct FeedActor(std::vec::IntoIter<(String, String)>);

    impl ActorFactory<Message> for Feed {
        fn info(&self) -> &'static KindInfo {
            &FEED
        }
        fn build(&self, _: &BuildContext) -> Result<Box<dyn Actor<Message>>, ActorError> {
            Ok(Box::new(FeedActor(self.0.clone().into_iter())))
        }
    }

    impl Actor<Message> for FeedActor {
        fn handle(&mut self, _: &str, _: &Message, _: &mut Outbox) -> Result<(), ActorError> {
            Ok(())
        }
        fn produce(&mut self, out: &mut Outbox) -> Result<Produce, ActorError> {
            let Some((id, text)) = self.0.next() else {
                return Ok(Produce::Exhausted);
            };
            let own = id.starts_with("own");
            let sample = Sample {
                id,
                user: "u".to_owned(),
                // Ids starting with `own` stand for the model's own answers.
                origin: if own {
                    Origin::SelfGenerated
                } else {
                    Origin::Grounded
                },
                content: SampleContent::Sft {
                    prompt: vec![],
                    response: text,
                },
                provenance: Provenance::default(),
                created_at_unix_ms: 0,
            };
            out.send("out", Message::Sample(Arc::new(sample)))?;
            Ok(Produce::Produced)
        }
    }

    fn edge(from: &str, to: &str) -> EdgeSpec {
        EdgeSpec {
            from: from.to_owned(),
            to: to.to_owned(),
            capacity: 8,
            when_full: WhenFull::Block,
            feedback: false,
        }
    }

    /// What one run of the node did: the ids it admitted, and (id, reason) of what it dropped.
    struct Run {
        admitted: Vec<String>,
        dropped: Vec<(String, String)>,
    }

    fn run_node(dir: &Path, run: &str, config: &DedupConfig, samples: &[(&str, &str)]) -> Run {
        let feed = Feed(
            samples
                .iter()
                .map(|(id, t)| ((*id).to_owned(), (*t).to_owned()))
                .collect(),
        );
        let file = format!("out-{run}.jsonl");
        let plan = Plan::new("dedup-restart")
            .node("feed", Arc::new(feed), 1)
            .node("dedup", Arc::new(config.clone()), 1)
            .node("sink", Arc::new(JsonlSinkParams { path: file.clone() }), 1)
            .edge(edge("feed.out", "dedup.in"))
            .edge(edge("dedup.out", "sink.in"))
            .edge(edge("dedup.decisions", "sink.decisions"));
        let graph = hearth::engine::validate::validate(plan, Vec::new(), &[]).expect("valid");
        let report = hearth::engine::start(graph, Some(dir)).unwrap().wait();
        assert!(report.failed_nodes.is_empty(), "{:?}", report.failed_nodes);
        let mut out = Run {
            admitted: Vec::new(),
            dropped: Vec::new(),
        };
        let text = std::fs::read_to_string(dir.join(&file)).unwrap_or_default();
        for line in text.lines() {
            match serde_json::from_str::<Message>(line).expect("json line") {
                Message::Sample(s) => out.admitted.push(s.id.clone()),
                Message::Decision(d) => out.dropped.push((d.sample.id.clone(), d.reason.clone())),
                other => panic!("unexpected {other:?}"),
            }
        }
        out
    }

    /// The user's judgement of an answer (grounded) is not a duplicate of the model's answer itself
    /// (self-generated), though its text is the same; within each origin duplicates still go, and both
    /// states survive a restart.
    #[test]
    fn samples_are_compared_within_their_origin() {
        let dir = tempfile::tempdir().unwrap();
        let text = base_text("").join(" ");
        let config = DedupConfig::default();
        let first = run_node(
            dir.path(),
            "1",
            &config,
            &[
                ("own-1", &text),
                ("fb-1", &text),
                ("fb-2", &text),
                ("own-2", &text),
            ],
        );
        assert_eq!(first.admitted, ["own-1", "fb-1"]);
        let dropped: Vec<&str> = first.dropped.iter().map(|(id, _)| id.as_str()).collect();
        assert_eq!(dropped, ["fb-2", "own-2"]);
        assert!(
            dir.path()
                .join("dedup")
                .join("dedup.self_generated.state")
                .exists()
        );
        let second = run_node(
            dir.path(),
            "2",
            &config,
            &[("own-3", &text), ("fb-3", &text)],
        );
        assert!(second.admitted.is_empty(), "{:?}", second.admitted);
    }

    /// A restarted `dedup` node (a new instance over the same data directory) still caps a cluster that
    /// was filled before the restart.
    #[test]
    fn a_restarted_dedup_node_keeps_the_cluster_cap() {
        let dir = tempfile::tempdir().unwrap();
        let r = related(&base_text(""));
        let unrelated = base_text("x").join(" ");
        let config = floor_cfg(); // max_per_cluster: 2
        let first = run_node(dir.path(), "1", &config, &[("a", &r[0]), ("b", &r[1])]);
        assert_eq!(first.admitted, ["a", "b"]);
        assert!(first.dropped.is_empty(), "{:?}", first.dropped);
        assert!(dir.path().join("dedup").join("dedup.state").exists());

        let second = run_node(
            dir.path(),
            "2",
            &config,
            &[("c", &r[2]), ("d", unrelated.as_str())],
        );
        assert_eq!(second.admitted, ["d"]);
        assert_eq!(second.dropped.len(), 1, "{:?}", second.dropped);
        assert_eq!(second.dropped[0].0, "c");
        assert!(
            second.dropped[0].1.contains("diversity floor"),
            "{}",
            second.dropped[0].1
        );

        // The same sample in a fresh data directory is admitted: the restored count is what dropped it.
        let fresh = tempfile::tempdir().unwrap();
        let alone = run_node(fresh.path(), "1", &config, &[("c", &r[2])]);
        assert_eq!(alone.admitted, ["c"]);
    }
}
