//! The trainer's `device`: each sequence's forward and backward on a GPU (here the emulated one, which runs the
//! kernels' semantics on the CPU), the optimizer and the losses on the CPU. The same micro-batch gives the CPU's
//! gradients within the int8 rounding the CPU backward adds; what the GPU step cannot run stays on the CPU,
//! and the cycle's report says where training ran and why.

use crate::train_util;

use hearth::gpu::Device;
use hearth::model::LoraSet;
use hearth::train::{LoraTrainer, TrainConfig};
use train_util::*;

fn cfg() -> TrainConfig {
    TrainConfig {
        // Dropout masks A's columns: the GPU's gradients reach the vars through that mask.
        dropout: 0.2,
        replay_per_batch: 1,
        replay_fraction: 0.3,
        batch_size: 6,
        ..fast_cfg()
    }
}

/// `‖got − want‖ / ‖want‖` over every adapter tensor.
fn relative_error(
    got: &[(String, candle_core::Tensor)],
    want: &[(String, candle_core::Tensor)],
) -> f64 {
    let (mut diff, mut norm) = (0f64, 0f64);
    for ((gk, g), (wk, w)) in got.iter().zip(want) {
        assert_eq!(gk, wk);
        let g: Vec<f32> = g.flatten_all().unwrap().to_vec1().unwrap();
        let w: Vec<f32> = w.flatten_all().unwrap().to_vec1().unwrap();
        diff += g
            .iter()
            .zip(&w)
            .map(|(a, b)| ((a - b) as f64).powi(2))
            .sum::<f64>();
        norm += w.iter().map(|b| (*b as f64).powi(2)).sum::<f64>();
    }
    assert!(norm > 0.0, "no gradient");
    (diff / norm).sqrt()
}

#[test]
fn a_trainer_on_a_gpu_takes_the_cpu_gradients() {
    let dir = tempfile::tempdir().unwrap();
    let (_, m, tok) = tiny(dir.path());
    // B ≠ 0, so that every A has a gradient too.
    let parent = with_random_b(&LoraSet::fresh(&m, cfg().lora_config(), 1).unwrap(), 2);
    // SFT, DPO, KTO and a score: the objectives that need the base's own log-probs as a reference too.
    let samples = mixed();
    let mut cpu = LoraTrainer::new(&m, &tok, cfg(), Some(&parent)).unwrap();
    let want = cpu.gradients(&samples).unwrap();
    let mut gpu = LoraTrainer::new(&m, &tok, cfg(), Some(&parent)).unwrap();
    let status = gpu.use_device(Device::Emulated).clone();
    assert!(status.running_on.starts_with("emulated"), "{status:?}");
    assert_eq!(status.notice, None);
    let got = gpu.gradients(&samples).unwrap();
    // The CPU backward rounds each incoming gradient to int8 before a frozen transpose; the GPU's does not.
    let err = relative_error(&got, &want);
    assert!(err < 3e-2, "relative error {err}");
    // Columns of A the dropout mask zeroed get no gradient on either path.
    for ((k, g), (_, w)) in got.iter().zip(&want) {
        let g: Vec<f32> = g.flatten_all().unwrap().to_vec1().unwrap();
        let w: Vec<f32> = w.flatten_all().unwrap().to_vec1().unwrap();
        for (a, b) in g.iter().zip(&w) {
            assert_eq!(*a == 0.0, *b == 0.0, "{k}: a zero on one path only");
        }
    }
}

/// A reward that tells completions apart: their length in bytes.
struct Length;

impl hearth::train::Reward for Length {
    fn score(&self, _: &[hearth::message::ChatMessage], completion: &str, _: Option<&str>) -> f64 {
        completion.len() as f64
    }
}

/// With GRPO on, each scored prompt's group is sampled on the device from a decoder over the trainer's weights
/// under the current pairs: the same completions as the CPU samples from the same seeds, so the same gradients
/// (completions sampled without the pairs are rewarded otherwise, and the gradients are far apart).
#[test]
fn grpo_groups_sampled_on_a_gpu_give_the_cpu_gradients() {
    let dir = tempfile::tempdir().unwrap();
    let (_, m, tok) = tiny(dir.path());
    let recipe = TrainConfig {
        grpo_group_size: 3,
        grpo_max_new_tokens: 6,
        grpo_temperature: 1.0,
        ..cfg()
    };
    let parent = with_random_b(&LoraSet::fresh(&m, recipe.lora_config(), 1).unwrap(), 3);
    let samples = vec![
        scored("g1", "say hi", "hi", 1.0),
        scored("g2", "name a colour", "red", 0.5),
        sft("s1", "the sun is hot", "it is in the sky"),
    ];
    let trainer = |recipe: TrainConfig| {
        LoraTrainer::new(&m, &tok, recipe, Some(&parent))
            .unwrap()
            .with_reward(std::sync::Arc::new(Length))
    };
    let want = trainer(recipe.clone()).gradients(&samples).unwrap();
    let mut gpu = trainer(recipe);
    gpu.use_device(Device::Emulated);
    let got = gpu.gradients(&samples).unwrap();
    let err = relative_error(&got, &want);
    assert!(err < 3e-2, "relative error {err}");
}

#[test]
fn a_cycle_reports_where_it_trained_and_why_not_on_the_device() {
    let dir = tempfile::tempdir().unwrap();
    let (_, m, tok) = tiny(dir.path());
    let run = |device: Device, recipe: TrainConfig| {
        let mut tr = LoraTrainer::new(&m, &tok, recipe, None).unwrap();
        tr.use_device(device);
        tr.train_cycle(&mixed(), |_| {}).unwrap()
    };
    let on_gpu = run(Device::Emulated, fast_cfg());
    assert!(on_gpu.device.starts_with("emulated"), "{}", on_gpu.device);
    assert_eq!(on_gpu.device_notice, None);
    let on_cpu = run(Device::Cpu, fast_cfg());
    assert_eq!(
        (on_cpu.device.as_str(), on_cpu.device_notice),
        ("cpu", None)
    );
    // The same recipe and data on either: the same steps, losses that differ by the backward's rounding only.
    assert_eq!(on_gpu.steps, on_cpu.steps);
    for (g, c) in on_gpu.losses.iter().zip(&on_cpu.losses) {
        assert!((g - c).abs() <= 2e-2 * c.abs().max(1.0), "{g} against {c}");
    }
    // DoRA has no GPU step: the CPU, with the reason.
    let dora = run(
        Device::Emulated,
        TrainConfig {
            dora: true,
            ..fast_cfg()
        },
    );
    assert_eq!(dora.device, "cpu");
    assert!(
        dora.device_notice.as_deref().unwrap_or("").contains("DoRA"),
        "{:?}",
        dora.device_notice
    );
}

/// A device that fails mid-cycle (here: weights uploaded for sequences shorter than the cycle's) hands the rest
/// of the cycle to the CPU from the failed micro-batch's own draws: the cycle ends as a CPU-only one does, to
/// the byte, and its report says so and why.
#[test]
fn a_device_that_fails_mid_cycle_leaves_the_rest_to_the_cpu() {
    let dir = tempfile::tempdir().unwrap();
    let (_, m, tok) = tiny(dir.path());
    let gpu = hearth::gpu::Gpu::open(Device::Emulated).unwrap();
    let short = std::sync::Arc::new(hearth::model::GpuModel::new(&gpu, &m, 8).unwrap());
    let mut failing = LoraTrainer::new(&m, &tok, cfg(), None).unwrap();
    assert!(
        failing
            .use_gpu_weights(short)
            .running_on
            .starts_with("emulated")
    );
    let report = failing.train_cycle(&mixed(), |_| {}).unwrap();
    assert_eq!(report.device, "cpu");
    let notice = report.device_notice.clone().unwrap_or_default();
    assert!(
        notice.contains("failed at step 0") && notice.contains("positions"),
        "{notice}"
    );
    let mut cpu = LoraTrainer::new(&m, &tok, cfg(), None).unwrap();
    let want = cpu.train_cycle(&mixed(), |_| {}).unwrap();
    assert_eq!(report.losses, want.losses);
    let bytes = |tr: &LoraTrainer, name: &str| {
        let out = dir.path().join(name);
        tr.adapter().unwrap().save_peft(&out, m.config()).unwrap();
        std::fs::read(out.join("adapter_model.safetensors")).unwrap()
    };
    assert_eq!(bytes(&failing, "failing"), bytes(&cpu, "cpu"));
}

#[test]
fn the_graph_names_the_trainer_device() {
    use hearth::train::cycle::TrainerSettings;
    let s: TrainerSettings = ron::from_str("(device: \"emulated\")").unwrap();
    assert_eq!(s.device, Device::Emulated);
    assert_eq!(
        s.cycle_settings("t", std::path::Path::new("/tmp")).device,
        Device::Emulated
    );
    let s: TrainerSettings = ron::from_str("()").unwrap();
    assert_eq!(s.device, Device::Cpu);
    let e = ron::from_str::<TrainerSettings>("(device: \"gpu0\")").unwrap_err();
    assert!(e.to_string().contains("gpu0"), "{e}");
}

/// The trainer node's `device` reaches each cycle: its delta's provenance says where it trained.
#[test]
fn a_cycle_on_the_trainer_device_records_it_in_the_delta() {
    use hearth::train::{Cycles, cycle::TrainerSettings};
    use std::sync::Arc;
    for (device, on) in [(Device::Emulated, "emulated"), (Device::Cpu, "cpu")] {
        let dir = tempfile::tempdir().unwrap();
        let (model, _, _) = tiny(dir.path());
        let data = dir.path().join("data");
        hearth::store::Store::open(&data).unwrap();
        let mut recipe = fast_cfg();
        recipe.steps = 1;
        let settings = TrainerSettings {
            min_samples: 2,
            await_verdict: false,
            device,
            train: Box::new(recipe),
            ..TrainerSettings::default()
        };
        let base = Arc::new(hearth::model::Base::load(&model).unwrap());
        let mut cycles = Cycles::new(
            settings.cycle_settings("t", &data),
            Arc::new(move || Ok(base.clone())),
        );
        for i in 0..2 {
            cycles.add(&sft(&format!("s{i}"), &format!("q{i}"), "a"));
        }
        cycles.maybe_start().unwrap();
        let delta = cycles.finished(true).unwrap().expect("a cycle ran");
        let record = hearth::store::Store::open(&data)
            .unwrap()
            .delta(&delta.id)
            .unwrap()
            .unwrap();
        let trained_on = record.provenance["metrics"]["device"]
            .as_str()
            .unwrap_or("");
        assert!(trained_on.starts_with(on), "{device}: {trained_on}");
    }
}
