//! The trainer's core guarantees: gradients reach every LoRA tensor through the quantized base,
//! the base never changes, the SFT mask is exact, a fact gets memorised, runs are deterministic.

use crate::train_util;

use candle_core::{D, Device, Tensor};
use hearth::model::lora::LoraTarget;
use hearth::model::{ChatMessage, GenerateConfig, Role, encode_chat, generate};
use hearth::train::data::Seq;
use hearth::train::data::encode_turns;
use hearth::train::loss::{dpo_loss, masked_nll, sequence_logps, token_logps};
use hearth::train::{LoraTrainer, TrainConfig};
use sha2::{Digest, Sha256};
use train_util::*;

fn logits(m: &hearth::model::Transformer, lora: Option<&hearth::model::LoraSet>) -> Vec<u32> {
    let ids = [1u32, 50, 72, 300, 101, 7, 9, 33];
    m.forward_ids(&ids, None, lora)
        .unwrap()
        .flatten_all()
        .unwrap()
        .to_vec1::<f32>()
        .unwrap()
        .into_iter()
        .map(f32::to_bits)
        .collect()
}

fn base_tensors_hash(m: &hearth::model::Transformer) -> String {
    let mut h = Sha256::new();
    for b in m.blocks() {
        for t in LoraTarget::ALL {
            let w = b.linear(t).dequantize().unwrap();
            for x in w.flatten_all().unwrap().to_vec1::<f32>().unwrap() {
                h.update(x.to_le_bytes());
            }
        }
    }
    format!("{:x}", h.finalize())
}

#[test]
fn every_lora_tensor_gets_a_nonzero_gradient() {
    let dir = tempfile::tempdir().unwrap();
    let (_, m, tok) = tiny(dir.path());
    let names = nonzero_gradients_after_one_step(&m, &tok, fast_cfg());
    assert_eq!(names.len(), 2 * 7 * m.blocks().len());
}

#[test]
fn base_unchanged_by_training_file_and_memory() {
    let dir = tempfile::tempdir().unwrap();
    let (path, m, tok) = tiny(dir.path());
    let file_before = hearth::train::sha256_file(&path).unwrap();
    let mem_before = base_tensors_hash(&m);
    let logits_before = logits(&m, None);
    let mut tr = LoraTrainer::new(&m, &tok, fast_cfg(), None).unwrap();
    tr.train_cycle(&mixed(), |_| {}).unwrap();
    let adapter = tr.adapter().unwrap();
    assert!(
        logits(&m, Some(&adapter)) != logits_before,
        "training changed nothing"
    );
    assert_eq!(hearth::train::sha256_file(&path).unwrap(), file_before);
    assert_eq!(base_tensors_hash(&m), mem_before);
    // Disabling the adapter restores the base exactly.
    assert_eq!(logits(&m, None), logits_before);
}

#[test]
fn base_unchanged_by_a_fresh_adapter_bitwise() {
    let dir = tempfile::tempdir().unwrap();
    let (_, m, tok) = tiny(dir.path());
    let tr = LoraTrainer::new(&m, &tok, fast_cfg(), None).unwrap();
    let fresh = tr.adapter().unwrap();
    assert_eq!(fresh.len(), 7 * m.blocks().len());
    assert_eq!(logits(&m, Some(&fresh)), logits(&m, None));
}

/// The tiny model with F32 weights, for tests that compare gradients of two graphs entry by entry.
/// With Q8_0 the forward rounds activations to int8, so a last-bit difference in summation order
/// between two graphs now and then flips one rounding and moves a gradient by ~1e-3 of its largest
/// entry (with B drawn unseeded each run, 1 run in 6 failed one such test, and a clean-clone CI run
/// failed the other). The chain rule and the mask are what these tests check; the Q8_0 training path
/// is covered by the tests above and below.
fn tiny_f32(dir: &std::path::Path) -> hearth::model::Transformer {
    let mut spec = hearth::model::TinySpec::new(hearth::model::Arch::Llama);
    spec.dtype = candle_core::quantized::GgmlDType::F32;
    let path = dir.join("base.gguf");
    hearth::model::write_tiny_model(&path, &spec).unwrap();
    hearth::model::load(&path).unwrap().0
}

/// A rank-4 adapter on every projection with `A` from `seed` and `B` random too (not zero), so that `A` gets
/// gradients as well. `B` is drawn from a generator seeded with `seed` as well, so a failure reproduces.
fn random_lora(m: &hearth::model::Transformer, seed: u64) -> hearth::model::LoraSet {
    let cfg = hearth::model::LoraConfig::new(4, 8.0, &LoraTarget::ALL);
    with_random_b(&hearth::model::LoraSet::fresh(m, cfg, seed).unwrap(), seed)
}

/// Through the trainer's own path (`token_logps`, whose head projects scored positions only): unscored
/// positions get log-prob 0 and no part of the loss, and every LoRA gradient equals the gradient of the
/// reference composition (all logits, log-softmax, gather, times the mask). Scoring every position instead
/// changes the gradients, so a mask the loss ignored would fail here.
#[test]
fn masked_tokens_contribute_zero_gradient() {
    let dir = tempfile::tempdir().unwrap();
    let m = tiny_f32(dir.path());
    let fresh = random_lora(&m, 3);
    let ids: Vec<u32> = (0..24u32).map(|i| (i * 53 + 3) % 290).collect();
    let mask: Vec<bool> = (0..24)
        .map(|i| i % 5 == 2 || (10..15).contains(&i))
        .collect();
    let grads_of = |mask: &[bool], reference: bool| {
        let (set, vars) = fresh.to_vars().unwrap();
        let seq = Seq {
            ids: ids.clone(),
            mask: mask.to_vec(),
            soft: None,
        };
        let tl = token_logps(&m, Some(&set), &[&seq], 0).unwrap();
        let lp = if reference {
            let t = Tensor::from_slice(&ids, (1, ids.len()), &Device::Cpu).unwrap();
            let logits = m
                .forward_train(&t, Some(&set))
                .unwrap()
                .narrow(1, 0, 23)
                .unwrap();
            let lsm = candle_nn::ops::log_softmax(&logits, D::Minus1).unwrap();
            let targets = Tensor::from_slice(&ids[1..], (1, 23, 1), &Device::Cpu).unwrap();
            lsm.gather(&targets, D::Minus1)
                .unwrap()
                .squeeze(D::Minus1)
                .unwrap()
        } else {
            let lps = tl.lp.flatten_all().unwrap().to_vec1::<f32>().unwrap();
            for (t, lp) in lps.iter().enumerate() {
                assert!(
                    mask[t + 1] || *lp == 0.0,
                    "unscored position {t} has log-prob {lp}"
                );
            }
            tl.lp.clone()
        };
        let loss = masked_nll(&lp, &tl.mask).unwrap();
        let g = loss.backward().unwrap();
        let grads: Vec<Vec<f32>> = vars
            .iter()
            .map(|(_, v)| {
                g.get(v.as_tensor())
                    .unwrap()
                    .flatten_all()
                    .unwrap()
                    .to_vec1()
                    .unwrap()
            })
            .collect();
        (loss.to_scalar::<f32>().unwrap(), grads)
    };
    let (loss, grads) = grads_of(&mask, false);
    let (ref_loss, ref_grads) = grads_of(&mask, true);
    assert!(
        (loss - ref_loss).abs() < 1e-4 * ref_loss.abs(),
        "{loss} vs {ref_loss}"
    );
    let mut all = vec![true; 24];
    all[0] = false;
    let (_, all_grads) = grads_of(&all, false);
    let dist = |a: &[Vec<f32>], b: &[Vec<f32>]| {
        let (mut d, mut n) = (0f32, 0f32);
        for (x, y) in a.iter().flatten().zip(b.iter().flatten()) {
            d = d.max((x - y).abs());
            n = n.max(y.abs());
        }
        d / n
    };
    assert!(
        dist(&grads, &ref_grads) < 1e-5,
        "{}",
        dist(&grads, &ref_grads)
    );
    assert!(
        dist(&all_grads, &ref_grads) > 0.05,
        "{}",
        dist(&all_grads, &ref_grads)
    );
}

/// The trainer's per-sequence graphs (`sequence_logps`) give the loss and every LoRA gradient of one
/// whole-batch graph (`token_logps`), for sequences of different lengths and a loss that couples rows (DPO
/// between two of them plus the SFT mean over all), on 1 and 3 threads alike; and recomputing each graph for
/// its backward (`activation_budget_mib`) gives the same bytes as keeping them.
#[test]
fn per_sequence_graphs_give_the_whole_batch_gradients() {
    // Without int8 rounding the graphs differ only in the order of summation, so the bounds are tight.
    let dir = tempfile::tempdir().unwrap();
    let m = tiny_f32(dir.path());
    let (set, vars) = random_lora(&m, 5).to_vars().unwrap();
    let seqs: Vec<Seq> = [19usize, 7, 26]
        .iter()
        .enumerate()
        .map(|(s, &n)| Seq {
            ids: (0..n as u32)
                .map(|i| (i * 37 + 11 * s as u32 + 5) % 290)
                .collect(),
            mask: (0..n).map(|i| i % 3 != 0).collect(),
            soft: None,
        })
        .collect();
    let refs: Vec<&Seq> = seqs.iter().collect();
    let loss_of = |tl: &hearth::train::loss::TokenLogps| {
        let sums = tl.sums().unwrap();
        let pick = |i: u32| sums.narrow(0, i as usize, 1).unwrap();
        let zero = pick(0).zeros_like().unwrap();
        let dpo = dpo_loss(&pick(2), &pick(1), &zero, &zero, 0.3).unwrap();
        (masked_nll(&tl.lp, &tl.mask).unwrap() + dpo).unwrap()
    };
    let whole = token_logps(&m, Some(&set), &refs, 0).unwrap();
    let whole_loss = loss_of(&whole);
    let store = whole_loss.backward().unwrap();
    let flat = |t: &Tensor| t.flatten_all().unwrap().to_vec1::<f32>().unwrap();
    let var_refs: Vec<_> = vars.iter().map(|(_, v)| v).collect();
    let mut kept = Vec::new();
    for (threads, recompute) in [(1, false), (3, false), (1, true), (3, true)] {
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(threads)
            .build()
            .unwrap();
        let (loss, grads) = pool.install(|| {
            let per = sequence_logps(&m, Some(&set), &refs, 0, recompute, None).unwrap();
            assert_eq!(per.logps.lp.dims(), whole.lp.dims());
            assert_eq!(flat(&per.logps.mask), flat(&whole.mask));
            let loss = loss_of(&per.logps);
            let grads = per.gradients(&loss, &var_refs).unwrap();
            (loss.to_scalar::<f32>().unwrap(), grads)
        });
        let bytes: Vec<Vec<f32>> = grads.iter().map(|g| flat(g.as_ref().unwrap())).collect();
        if recompute {
            assert_eq!(bytes, kept[usize::from(threads == 3)], "{threads} threads");
        } else {
            kept.push(bytes);
        }
        let expected = whole_loss.to_scalar::<f32>().unwrap();
        assert!(
            (loss - expected).abs() <= 1e-5 * expected.abs(),
            "{loss} vs {expected}"
        );
        for ((name, v), g) in vars.iter().zip(grads) {
            let (got, want) = (flat(&g.unwrap()), flat(store.get(v.as_tensor()).unwrap()));
            let scale = want.iter().fold(0f32, |a, x| a.max(x.abs()));
            assert!(scale > 0.0, "{name}: no gradient");
            let diff = got
                .iter()
                .zip(&want)
                .fold(0f32, |a, (x, y)| a.max((x - y).abs()));
            assert!(
                diff <= 1e-5 * scale,
                "{name} on {threads} threads: {diff} of {scale}"
            );
        }
    }
}

#[test]
fn the_loss_mask_covers_exactly_the_assistant_spans() {
    let dir = tempfile::tempdir().unwrap();
    let (_, _, tok) = tiny(dir.path());
    let prompt = vec![
        ChatMessage::new(Role::System, "be brief"),
        ChatMessage::new(Role::User, "hello there"),
        ChatMessage::new(Role::Assistant, "hi"),
        ChatMessage::new(Role::User, "where is the cat"),
    ];
    let seq = encode_turns(&tok, &prompt, "on the mat", 512).unwrap();
    let mut full = prompt.clone();
    full.push(ChatMessage::new(Role::Assistant, "on the mat"));
    assert_eq!(seq.ids, encode_chat(&tok, &full, false).unwrap().ids);
    let scored: Vec<u32> = seq
        .ids
        .iter()
        .zip(&seq.mask)
        .filter(|(_, m)| **m)
        .map(|(i, _)| *i)
        .collect();
    assert_eq!(
        tok.decode(&scored, false),
        "hi<|im_end|>on the mat<|im_end|>"
    );
    // Everything else (system, user, role headers, separators) is unscored.
    let rest: Vec<u32> = seq
        .ids
        .iter()
        .zip(&seq.mask)
        .filter(|(_, m)| !**m)
        .map(|(i, _)| *i)
        .collect();
    let rest = tok.decode(&rest, false);
    assert!(
        rest.contains("be brief") && rest.contains("where is the cat") && !rest.contains("mat")
    );
    // Truncation keeps the mask aligned, and a sample with nothing left to score is dropped.
    let short = encode_turns(&tok, &prompt, "on the mat", 8);
    assert!(short.is_none());
}

#[test]
fn a_fact_is_memorised_and_generated_greedily() {
    let dir = tempfile::tempdir().unwrap();
    let (_, m, tok) = tiny_with(dir.path(), false);
    let q = "what is the capital of zorbia";
    let a = "quixville";
    let samples = vec![sft("f1", q, a)];
    let cfg = TrainConfig {
        // Every sample here is trained on: no personalisation hold-out.
        holdout_fraction: 0.0,
        rank: 8,
        alpha: 16.0,
        learning_rate: 1e-2,
        warmup_steps: 2,
        steps: 40,
        batch_size: 1,
        replay_fraction: 0.0,
        ..TrainConfig::default()
    };
    let mut tr = LoraTrainer::new(&m, &tok, cfg, None).unwrap();
    let r = tr.train_cycle(&samples, |_| {}).unwrap();
    let (first, last) = (r.first_loss().unwrap(), r.last_loss().unwrap());
    assert!(last < first * 0.2, "loss {first} -> {last}");
    let adapter = tr.adapter().unwrap();
    let prompt = encode_chat(&tok, &[ChatMessage::new(Role::User, q)], true)
        .unwrap()
        .ids;
    let greedy = |lora| {
        generate(
            &m,
            &tok,
            &prompt,
            lora,
            &GenerateConfig::greedy(&tok, 12),
            |_| true,
        )
        .unwrap()
    };
    let out = greedy(Some(&adapter));
    assert!(out.text.contains(a), "generated {:?}", out.text);
    assert!(!greedy(None).text.contains(a), "the base already knew it");
}

/// The adapter bytes a cycle over `mixed()` gives with `seed`, trained on `threads` threads.
fn trained_bytes(seed: u64, threads: usize) -> Vec<u8> {
    let dir = tempfile::tempdir().unwrap();
    let (_, m, tok) = tiny(dir.path());
    let mut cfg = fast_cfg();
    cfg.seed = seed;
    cfg.dropout = 0.1;
    let mut tr = LoraTrainer::new(&m, &tok, cfg, None).unwrap();
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(threads)
        .build()
        .unwrap();
    pool.install(|| tr.train_cycle(&mixed(), |_| {})).unwrap();
    let out = dir.path().join("a");
    tr.adapter().unwrap().save_peft(&out, m.config()).unwrap();
    std::fs::read(out.join("adapter_model.safetensors")).unwrap()
}

#[test]
fn same_seed_gives_identical_delta_bytes_and_another_seed_does_not() {
    let a = trained_bytes(11, 2);
    assert_eq!(a, trained_bytes(11, 2));
    // The work splits differ with the thread count; the bytes do not.
    assert_eq!(a, trained_bytes(11, 1));
    assert_eq!(a, trained_bytes(11, 3));
    assert_ne!(a, trained_bytes(12, 2));
}

#[test]
fn a_non_finite_loss_skips_the_step_and_is_counted() {
    let dir = tempfile::tempdir().unwrap();
    let (_, m, tok) = tiny(dir.path());
    let mut cfg = fast_cfg();
    cfg.learning_rate = 1e30; // the first update overflows the model
    cfg.warmup_steps = 0;
    cfg.steps = 4;
    let mut tr = LoraTrainer::new(&m, &tok, cfg, None).unwrap();
    let r = tr.train_cycle(&mixed(), |_| {}).unwrap();
    assert_eq!(r.steps, 4);
    assert!(r.skipped_nonfinite >= 1, "{r:?}");
    assert!(r.losses[0].is_finite());
}

#[test]
fn dpo_prefers_chosen_and_kto_separates_thumbs() {
    let dir = tempfile::tempdir().unwrap();
    let (_, m, tok) = tiny(dir.path());
    let samples = vec![
        pref("p1", "who is there", "the owl is there", "nobody at all"),
        thumbs("k1", "is the sea wet", "yes it is wet", true),
        thumbs("k2", "is the sea wet", "the sea is dry", false),
    ];
    let cfg = TrainConfig {
        // Every sample here is trained on: no personalisation hold-out.
        holdout_fraction: 0.0,
        steps: 12,
        batch_size: 3,
        learning_rate: 1e-2,
        warmup_steps: 1,
        replay_fraction: 0.0,
        dpo_beta: 0.5,
        kto_beta: 0.5,
        ..fast_cfg()
    };
    let mut tr = LoraTrainer::new(&m, &tok, cfg, None).unwrap();
    let r = tr.train_cycle(&samples, |_| {}).unwrap();
    assert!(
        r.last_loss().unwrap() < r.first_loss().unwrap(),
        "{:?}",
        r.losses
    );
    let adapter = tr.adapter().unwrap();
    let lp = |q: &str, a: &str, lora| {
        let s = encode_turns(&tok, &[ChatMessage::new(Role::User, q)], a, 64).unwrap();
        let t = hearth::train::loss::token_logps(&m, lora, &[&s], 0).unwrap();
        t.sums().unwrap().to_vec1::<f32>().unwrap()[0]
    };
    let ratio = |q, a| lp(q, a, Some(&adapter)) - lp(q, a, None);
    assert!(ratio("who is there", "the owl is there") > ratio("who is there", "nobody at all"));
    assert!(ratio("is the sea wet", "yes it is wet") > ratio("is the sea wet", "the sea is dry"));
}

#[test]
fn the_learning_rate_warms_up_decays_and_rewarms_each_cycle() {
    let cfg = TrainConfig {
        // Every sample here is trained on: no personalisation hold-out.
        holdout_fraction: 0.0,
        learning_rate: 1.0,
        warmup_steps: 4,
        steps: 14,
        min_lr_ratio: 0.1,
        ..TrainConfig::default()
    };
    assert!((cfg.lr_at(0) - 0.25).abs() < 1e-12);
    assert!((cfg.lr_at(3) - 1.0).abs() < 1e-12);
    assert!((cfg.lr_at(4) - 1.0).abs() < 1e-12);
    assert!((cfg.lr_at(14) - 0.1).abs() < 1e-12);
    assert!((4..13).all(|s| cfg.lr_at(s + 1) < cfg.lr_at(s)));
    let dir = tempfile::tempdir().unwrap();
    let (_, m, tok) = tiny(dir.path());
    let mut c = fast_cfg();
    c.warmup_steps = 2;
    let mut tr = LoraTrainer::new(&m, &tok, c, None).unwrap();
    let mut lrs = [Vec::new(), Vec::new()];
    for l in &mut lrs {
        tr.train_cycle(&mixed(), |s| l.push(s.lr)).unwrap();
    }
    assert_eq!(lrs[0], lrs[1]);
    assert!(lrs[0][0] < lrs[0][1]);
}

/// A pluggable reward whose scores vary within a group: longer completions score higher.
struct Length;

impl hearth::train::Reward for Length {
    fn score(&self, _: &[ChatMessage], completion: &str, _: Option<&str>) -> f64 {
        completion.len() as f64
    }
}

#[test]
fn grpo_samples_a_group_scores_it_and_updates() {
    let dir = tempfile::tempdir().unwrap();
    let (_, m, tok) = tiny(dir.path());
    let cfg = TrainConfig {
        // Every sample here is trained on: no personalisation hold-out.
        holdout_fraction: 0.0,
        grpo_group_size: 4,
        grpo_max_new_tokens: 6,
        grpo_reward: hearth::train::RewardKind::Contains,
        steps: 2,
        batch_size: 1,
        replay_fraction: 0.0,
        ..fast_cfg()
    };
    // An answer made of single letters some samples will contain, so advantages are non-zero.
    let samples = vec![scored("g1", "say a letter", "e", 1.0)];
    let tr = LoraTrainer::new(&m, &tok, cfg, None).unwrap();
    let mut tr = tr.with_reward(std::sync::Arc::new(Length));
    let before = logits(&m, Some(&tr.adapter().unwrap()));
    let r = tr.train_cycle(&samples, |_| {}).unwrap();
    assert_eq!(r.examples, 1);
    assert!(r.losses.iter().all(|l| l.is_finite()), "{r:?}");
    assert!(
        logits(&m, Some(&tr.adapter().unwrap())) != before,
        "no update"
    );
}

#[test]
fn builtin_rewards_score_as_documented() {
    use hearth::train::{Contains, ExactMatch, JsonValid, Reward};
    assert_eq!(
        Contains.score(&[], "It is Quixville.", Some("quixville")),
        1.0
    );
    assert_eq!(Contains.score(&[], "no idea", Some("quixville")), 0.0);
    assert_eq!(Contains.score(&[], "anything", None), 0.0);
    assert_eq!(ExactMatch.score(&[], " 42 ", Some("42")), 1.0);
    assert_eq!(ExactMatch.score(&[], "42!", Some("42")), 0.0);
    assert_eq!(JsonValid.score(&[], r#"{"a": [1, 2]}"#, None), 1.0);
    assert_eq!(JsonValid.score(&[], "{a: 1", None), 0.0);
}

/// A LoRA layer in training against candle's autograd of `x·Wᵀ + scale·(x·Aᵀ)·Bᵀ` over the dequantized weight
/// (a plain matmul, no gradient for it): the same output and the same gradients for `x`, `A` and `B`. With a
/// Q8_0 base the product and `dx` go through the int8 kernels (activations quantized, the backward through
/// the weight's requantized transpose), so those two agree within their rounding (`dx` off by 10% fails);
/// `A`'s and `B`'s gradients do not involve the base and agree tightly either way.
#[test]
fn lora_layer_gradients_match_the_composition() {
    use candle_core::Var;
    use candle_core::quantized::{GgmlDType, QTensor};
    use hearth::model::{LoraPair, QLinear};
    let dev = &Device::Cpu;
    let (n, inp, out, r, scale) = (10, 96, 64, 4, 2.5);
    let w = Tensor::randn(0f32, 0.2, (out, inp), dev).unwrap();
    let x0 = Tensor::randn(0f32, 1.0, (n, inp), dev).unwrap();
    let a0 = Tensor::randn(0f32, 0.3, (r, inp), dev).unwrap();
    let b0 = Tensor::randn(0f32, 0.3, (out, r), dev).unwrap();
    let weights = Tensor::randn(0f32, 1.0, (n, out), dev).unwrap();
    let rel = |got: &Tensor, want: &Tensor| {
        let (g, w): (Vec<f32>, Vec<f32>) = (
            got.flatten_all().unwrap().to_vec1().unwrap(),
            want.flatten_all().unwrap().to_vec1().unwrap(),
        );
        let scale = w.iter().fold(0f32, |m, v| m.max(v.abs()));
        g.iter()
            .zip(&w)
            .fold(0f32, |m, (a, b)| m.max((a - b).abs()))
            / scale
    };
    let layers = [
        (QLinear::from_dense(w.clone()).unwrap(), 1e-5f32),
        (
            QLinear::from_qtensor(std::sync::Arc::new(
                QTensor::quantize(&w, GgmlDType::Q8_0).unwrap(),
            ))
            .unwrap(),
            0.01,
        ),
    ];
    for (layer, tol) in layers {
        let (x, a, b) = (
            Var::from_tensor(&x0).unwrap(),
            Var::from_tensor(&a0).unwrap(),
            Var::from_tensor(&b0).unwrap(),
        );
        let pair = LoraPair::new(a.as_tensor().clone(), b.as_tensor().clone(), scale);
        let y = layer.forward(x.as_tensor(), Some(&pair)).unwrap();
        let grads = (&y * &weights)
            .unwrap()
            .sum_all()
            .unwrap()
            .backward()
            .unwrap();

        let (xr, ar, br) = (
            Var::from_tensor(&x0).unwrap(),
            Var::from_tensor(&a0).unwrap(),
            Var::from_tensor(&b0).unwrap(),
        );
        let wd = layer.dequantize().unwrap();
        let delta = xr
            .as_tensor()
            .matmul(&ar.as_tensor().t().unwrap())
            .unwrap()
            .matmul(&br.as_tensor().t().unwrap())
            .unwrap();
        let want =
            (xr.as_tensor().matmul(&wd.t().unwrap()).unwrap() + (delta * scale).unwrap()).unwrap();
        let want_grads = (&want * &weights)
            .unwrap()
            .sum_all()
            .unwrap()
            .backward()
            .unwrap();
        assert!(rel(&y, &want) < tol, "y: {}", rel(&y, &want));
        for (name, got, want, tol) in [
            ("x", x.as_tensor(), xr.as_tensor(), tol),
            ("A", a.as_tensor(), ar.as_tensor(), 1e-5),
            ("B", b.as_tensor(), br.as_tensor(), 1e-5),
        ] {
            let (g, w) = (grads.get(got).unwrap(), want_grads.get(want).unwrap());
            assert!(rel(g, w) < tol, "d{name}: {}", rel(g, w));
        }
    }
}
