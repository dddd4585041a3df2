//! The decode step on a GPU (`GpuDecoder`) against the CPU model's own decode, token by token, on tiny models
//! of each architecture it covers, with and without a LoRA adapter. On the emulated device this checks the
//! step's host code (the order of the launches, their shapes, the position and cache length kept on the
//! device, graph capture and replay) everywhere; on a GPU it also checks the kernels composed.

use candle_core::quantized::GgmlDType;
use candle_core::{Device, Tensor};
use hearth::gpu::{Device as GpuDevice, Gpu};
use hearth::model::{
    Arch, GpuDecoder, LoraConfig, LoraPair, LoraSet, LoraTarget, TinySpec, Transformer,
    write_tiny_model,
};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use super::devices;

const PROMPT: [u32; 9] = [72, 101, 108, 108, 111, 262, 119, 44, 300];

pub(super) fn tiny(dir: &std::path::Path, arch: Arch, dtype: GgmlDType) -> Transformer {
    let mut spec = TinySpec::new(arch);
    spec.dtype = dtype;
    let path = dir.join(format!("{}-{dtype:?}.gguf", arch.as_str()));
    write_tiny_model(&path, &spec).unwrap();
    Transformer::from_gguf(&path).unwrap()
}

/// The CPU model's logits for each token of `ids`, decoded one at a time through its KV cache.
fn cpu_steps(m: &Transformer, ids: &[u32], lora: Option<&LoraSet>) -> Vec<Vec<f32>> {
    let mut cache = m.new_cache();
    ids.iter()
        .map(|&t| {
            let t = Tensor::from_vec(vec![t], (1, 1), &Device::Cpu).unwrap();
            let out = m.forward(&t, Some(&mut cache), lora).unwrap();
            out.flatten_all().unwrap().to_vec1().unwrap()
        })
        .collect()
}

fn gpu_steps(d: &mut GpuDecoder, ids: &[u32]) -> Vec<Vec<f32>> {
    ids.iter().map(|&t| d.step(t).unwrap()).collect()
}

/// A LoRA set on every target with random `B` (a fresh set's `B` is zero and would change nothing).
pub(super) fn random_adapter(m: &Transformer, seed: u64, rslora: bool) -> LoraSet {
    let mut cfg = LoraConfig::new(4, 8.0, &LoraTarget::ALL);
    cfg.use_rslora = rslora;
    let fresh = LoraSet::fresh(m, cfg.clone(), seed).unwrap();
    let mut rng = StdRng::seed_from_u64(seed + 1);
    let mut set = LoraSet::empty(cfg);
    for (&(l, t), p) in fresh.iter() {
        let (out, r) = p.b.dims2().unwrap();
        let b: Vec<f32> = (0..out * r)
            .map(|_| rng.random_range(-0.2f32..0.2))
            .collect();
        let b = Tensor::from_vec(b, (out, r), &Device::Cpu).unwrap();
        set.insert(l, t, LoraPair::new(p.a.clone(), b, p.scale));
    }
    set
}

/// Steps compared, and how many agreed to the order of float additions.
#[derive(Default)]
struct Tally {
    steps: usize,
    exact: usize,
}

impl Tally {
    /// Both paths quantize each product's input to int8 alike, so they differ in the order of float additions
    /// (relative error about 1e-7) until a value lands that close to a rounding boundary and one path rounds
    /// it the other way: one int8 step of one input, which moves that step's logits (and, through the cache,
    /// the rest of the sequence's) by up to a few 1e-2. Each step must be within that, and at least half exact:
    /// a path off by anything systematic (an f32 product where the CPU's is int8) is off at every step.
    fn compare(&mut self, what: &str, gpu: &[Vec<f32>], cpu: &[Vec<f32>]) {
        assert_eq!(gpu.len(), cpu.len());
        for (i, (g, c)) in gpu.iter().zip(cpu).enumerate() {
            assert_eq!(g.len(), c.len(), "{what} step {i}: vocabulary");
            assert!(
                g.iter().all(|v| v.is_finite()),
                "{what} step {i}: non-finite logits"
            );
            let scale = c.iter().fold(0f32, |m, v| m.max(v.abs())).max(1e-6);
            let err = g.iter().zip(c).fold(0f32, |m, (a, b)| m.max((a - b).abs())) / scale;
            assert!(err < 5e-2, "{what} step {i}: relative error {err}");
            self.steps += 1;
            self.exact += usize::from(err < 1e-5);
            let top = |v: &[f32]| (0..v.len()).max_by(|&a, &b| v[a].total_cmp(&v[b])).unwrap();
            let (tg, tc) = (top(g), top(c));
            // Only a tie within that error may pick another token.
            assert!(
                tg == tc || (c[tc] - c[tg]).abs() < err.max(1e-5) * 2.0 * scale,
                "{what} step {i}: top token {tg} against the CPU's {tc}"
            );
        }
    }

    fn check(&self, what: &str) {
        assert!(
            self.exact * 2 >= self.steps,
            "{what}: {} of {} steps agree to the order of additions",
            self.exact,
            self.steps
        );
    }
}

#[test]
fn the_gpu_step_matches_the_cpu_decode_for_each_architecture() {
    let dir = tempfile::tempdir().unwrap();
    for gpu in devices("the_gpu_step_matches_the_cpu_decode_for_each_architecture") {
        let mut t = Tally::default();
        for arch in ARCHS {
            let m = tiny(dir.path(), arch, GgmlDType::Q8_0);
            let what = format!("{arch:?} on {}", gpu.describe());
            let cpu = cpu_steps(&m, &PROMPT, None);
            let mut d = GpuDecoder::new(&gpu, &m, 32, None).unwrap();
            t.compare(&what, &gpu_steps(&mut d, &PROMPT), &cpu);
            assert_eq!(d.len(), PROMPT.len());
            // A new sequence starts at position 0 again, over the old cache contents.
            d.reset().unwrap();
            let again = gpu_steps(&mut d, &PROMPT[..3]);
            t.compare(&format!("{what}, after reset"), &again, &cpu[..3]);
        }
        t.check(&gpu.describe());
    }
}

#[test]
fn lora_pairs_apply_unmerged_on_the_gpu() {
    let dir = tempfile::tempdir().unwrap();
    for gpu in devices("lora_pairs_apply_unmerged_on_the_gpu") {
        let mut t = Tally::default();
        for (arch, rslora) in [(Arch::Llama, false), (Arch::Qwen3, true)] {
            let m = tiny(dir.path(), arch, GgmlDType::Q8_0);
            let set = random_adapter(&m, 5, rslora);
            let what = format!("{arch:?} rslora={rslora} on {}", gpu.describe());
            let cpu = cpu_steps(&m, &PROMPT, Some(&set));
            let base = cpu_steps(&m, &PROMPT, None);
            // The adapter moves the logits well beyond the tolerance, so matching it is not matching the base.
            let moved = cpu[3]
                .iter()
                .zip(&base[3])
                .fold(0f32, |a, (x, y)| a.max((x - y).abs()));
            assert!(moved > 0.1, "{what}: the adapter changes little ({moved})");
            let mut d = GpuDecoder::new(&gpu, &m, 16, Some(&set)).unwrap();
            t.compare(&what, &gpu_steps(&mut d, &PROMPT), &cpu);
            // Swapping the adapter out serves the base.
            d.set_adapter(None).unwrap();
            d.reset().unwrap();
            t.compare(
                &format!("{what}, adapter removed"),
                &gpu_steps(&mut d, &PROMPT),
                &base,
            );
        }
        t.check(&gpu.describe());
    }
}

/// A fresh adapter (`B = 0`) leaves every logit of the GPU step bitwise the base's, as on the CPU.
#[test]
fn a_fresh_adapter_decodes_bitwise_the_base() {
    let dir = tempfile::tempdir().unwrap();
    let m = tiny(dir.path(), Arch::Qwen3, GgmlDType::Q8_0);
    let fresh = LoraSet::fresh(&m, LoraConfig::new(4, 8.0, &LoraTarget::ALL), 9).unwrap();
    for gpu in devices("a_fresh_adapter_decodes_bitwise_the_base") {
        let mut base = GpuDecoder::new(&gpu, &m, 16, None).unwrap();
        let mut adapted = GpuDecoder::new(&gpu, &m, 16, Some(&fresh)).unwrap();
        assert_eq!(
            gpu_steps(&mut base, &PROMPT),
            gpu_steps(&mut adapted, &PROMPT),
            "{}",
            gpu.describe()
        );
    }
}

/// A recorded step replays exactly what launching kernel by kernel computes.
#[test]
fn a_replayed_graph_computes_what_the_launches_do() {
    let dir = tempfile::tempdir().unwrap();
    let m = tiny(dir.path(), Arch::Qwen2, GgmlDType::Q8_0);
    for gpu in devices("a_replayed_graph_computes_what_the_launches_do") {
        let mut launched = GpuDecoder::new(&gpu, &m, 16, None)
            .unwrap()
            .with_graph(false);
        let mut replayed = GpuDecoder::new(&gpu, &m, 16, None).unwrap();
        let a = gpu_steps(&mut launched, &PROMPT);
        let b = gpu_steps(&mut replayed, &PROMPT);
        assert!(!launched.replays_graph());
        if replayed.replays_graph() {
            assert_eq!(a, b, "{}", gpu.describe());
        } else {
            eprintln!("{}: no graph capture on this vendor", gpu.describe());
        }
    }
}

#[test]
fn what_the_gpu_step_cannot_run_is_refused_with_the_reason() {
    let dir = tempfile::tempdir().unwrap();
    let gpu = Gpu::open(GpuDevice::Emulated).unwrap();
    let refused = |m: &Transformer, cap: usize, lora: Option<&LoraSet>| match GpuDecoder::new(
        &gpu, m, cap, lora,
    ) {
        Ok(_) => panic!("accepted"),
        Err(e) => e.to_string(),
    };
    let f32_model = tiny(dir.path(), Arch::Llama, GgmlDType::F32);
    let e = refused(&f32_model, 16, None);
    assert!(
        e.contains("blk.0.attn_q") && e.contains("requantize: Q8_0"),
        "{e}"
    );
    let m = tiny(dir.path(), Arch::Llama, GgmlDType::Q8_0);
    let e = refused(&m, 0, None);
    assert!(e.contains("a cache of 0 positions"), "{e}");
    let e = refused(&m, 1 << 20, None);
    assert!(e.contains("positions"), "{e}");

    // Step errors: a token outside the vocabulary, and a full cache.
    let mut d = GpuDecoder::new(&gpu, &m, 2, None).unwrap();
    let e = d.step(1 << 30).unwrap_err().to_string();
    assert!(e.contains("outside the vocabulary"), "{e}");
    d.step(1).unwrap();
    d.step(2).unwrap();
    let e = d.step(3).unwrap_err().to_string();
    assert!(e.contains("full"), "{e}");
    assert_eq!(d.len(), 2);
}

/// A prompt prefilled in chunks of rows gives the logits of decoding it token by token: the last token's, and
/// those of the steps after it. Also in two calls (a chat's next turn appended to the cache), and over more
/// tokens than one chunk holds.
#[test]
fn prefill_in_rows_matches_the_cpu_decode() {
    let dir = tempfile::tempdir().unwrap();
    let long: Vec<u32> = (0..150).map(|i| (i * 37 % 300) as u32 + 1).collect();
    for gpu in devices("prefill_in_rows_matches_the_cpu_decode") {
        let mut t = Tally::default();
        for arch in [Arch::Llama, Arch::Qwen2, Arch::Qwen3] {
            let m = tiny(dir.path(), arch, GgmlDType::Q8_0);
            let set = random_adapter(&m, 7, false);
            for lora in [None, Some(&set)] {
                let what = format!("{arch:?} lora={} on {}", lora.is_some(), gpu.describe());
                let cpu = cpu_steps(&m, &long, lora);
                let mut d = GpuDecoder::new(&gpu, &m, 160, lora).unwrap();
                let last = d.prefill(&long[..140]).unwrap();
                assert_eq!(d.len(), 140);
                t.compare(&what, &[last], &cpu[139..140]);
                t.compare(&what, &gpu_steps(&mut d, &long[140..]), &cpu[140..]);
                // Two turns: 5 tokens, then 6 more after them.
                d.reset().unwrap();
                t.compare(&what, &[d.prefill(&long[..5]).unwrap()], &cpu[4..5]);
                t.compare(&what, &[d.prefill(&long[5..11]).unwrap()], &cpu[10..11]);
                let e = d.prefill(&long[..150]).unwrap_err().to_string();
                assert!(e.contains("do not fit"), "{e}");
                assert!(d.prefill(&[]).is_err());
            }
        }
        t.check(&gpu.describe());
    }
}

/// What a serve or eval node's `device` gives: a decoder on a device that opens and covers the model; the CPU,
/// with the reason, otherwise; the CPU without a notice when asked for.
#[test]
fn opening_a_device_says_where_generation_runs() {
    let dir = tempfile::tempdir().unwrap();
    let m = tiny(dir.path(), Arch::Llama, GgmlDType::Q8_0);
    let (dec, status) = GpuDecoder::open(GpuDevice::Emulated, &m);
    assert!(dec.is_some() && status.notice.is_none(), "{status:?}");
    assert!(status.running_on.starts_with("emulated: "), "{status:?}");
    let (dec, status) = GpuDecoder::open(GpuDevice::Cpu, &m);
    assert!(dec.is_none() && status.notice.is_none() && status.running_on == "cpu");
    let (dec, status) = GpuDecoder::open(GpuDevice::Cuda(7), &m);
    if dec.is_none() {
        let notice = status.notice.unwrap();
        assert!(notice.starts_with("device cuda:7: "), "{notice}");
    }
    // Dense f32 weights have no GPU product: the CPU, with the reason.
    let dense = tiny(dir.path(), Arch::Llama, GgmlDType::F32);
    let (dec, status) = GpuDecoder::open(GpuDevice::Emulated, &dense);
    assert!(dec.is_none() && status.running_on == "cpu");
    let notice = status.notice.unwrap();
    assert!(
        notice.starts_with("device emulated: ") && notice.contains("requantize"),
        "{notice}"
    );
}

/// A prompt that starts with what the decoder's cache holds (a chat's next turn) prefills only the rest, and
/// answers as a fresh decoder does; a new adapter starts over.
#[test]
fn a_prompt_that_extends_the_cached_one_reuses_it() {
    use hearth::model::{GenerateConfig, generate_on_gpu};
    let dir = tempfile::tempdir().unwrap();
    let mut spec = TinySpec::new(Arch::Llama);
    spec.dtype = GgmlDType::Q8_0;
    let path = dir.path().join("reuse.gguf");
    write_tiny_model(&path, &spec).unwrap();
    let (m, tok) = hearth::model::load(&path).unwrap();
    let greedy = GenerateConfig::greedy(&tok, 8);
    for gpu in devices("a_prompt_that_extends_the_cached_one_reuses_it") {
        let mut d = GpuDecoder::new(&gpu, &m, 128, None).unwrap();
        let first: Vec<u32> = PROMPT.to_vec();
        let (out, reused) = generate_on_gpu(&mut d, &tok, &first, &greedy, |_| true).unwrap();
        assert_eq!(reused, 0);
        let mut second = first.clone();
        second.extend(&out.tokens);
        second.extend([33, 34, 35]);
        let (again, reused) = generate_on_gpu(&mut d, &tok, &second, &greedy, |_| true).unwrap();
        assert!(reused >= first.len(), "{reused}");
        let mut fresh = GpuDecoder::new(&gpu, &m, 128, None).unwrap();
        let (want, _) = generate_on_gpu(&mut fresh, &tok, &second, &greedy, |_| true).unwrap();
        assert_eq!(again.tokens, want.tokens, "{}", gpu.describe());
        d.set_adapter(None).unwrap();
        let (_, reused) = generate_on_gpu(&mut d, &tok, &second, &greedy, |_| true).unwrap();
        assert_eq!(reused, 0, "a new adapter reused the cache");
    }
}

/// Decoders over one upload of the weights (a server's generation threads) keep their own caches and pairs:
/// interleaved, each computes what a decoder alone computes.
#[test]
fn sequences_over_one_copy_of_the_weights_stay_apart() {
    let dir = tempfile::tempdir().unwrap();
    let m = tiny(dir.path(), Arch::Qwen2, GgmlDType::Q8_0);
    let set = random_adapter(&m, 3, false);
    for gpu in devices("sequences_over_one_copy_of_the_weights_stay_apart") {
        let alone_base = gpu_steps(&mut GpuDecoder::new(&gpu, &m, 16, None).unwrap(), &PROMPT);
        let alone_lora = gpu_steps(
            &mut GpuDecoder::new(&gpu, &m, 16, Some(&set)).unwrap(),
            &PROMPT[2..],
        );
        let weights = std::sync::Arc::new(hearth::model::GpuModel::new(&gpu, &m, 16).unwrap());
        let mut a = GpuDecoder::on(weights.clone(), None).unwrap();
        let mut b = GpuDecoder::on(weights, Some(&set)).unwrap();
        let (mut got_a, mut got_b) = (Vec::new(), Vec::new());
        for (i, &t) in PROMPT.iter().enumerate() {
            got_a.push(a.step(t).unwrap());
            if i >= 2 {
                got_b.push(b.step(t).unwrap());
            }
        }
        assert_eq!(got_a, alone_base, "{}", gpu.describe());
        assert_eq!(got_b, alone_lora, "{}", gpu.describe());
    }
}

/// Serving decodes on several threads over one copy of the weights, on one device stream: a sequence that
/// records its step while another decodes must neither record the other's launches nor leave them unrun.
#[test]
fn a_step_recorded_while_another_thread_decodes_records_only_its_own() {
    let dir = tempfile::tempdir().unwrap();
    let m = tiny(dir.path(), Arch::Llama, GgmlDType::Q8_0);
    let set = random_adapter(&m, 5, false);
    for gpu in devices("a_step_recorded_while_another_thread_decodes_records_only_its_own") {
        let weights = std::sync::Arc::new(hearth::model::GpuModel::new(&gpu, &m, 16).unwrap());
        let alone = |lora: Option<&LoraSet>| {
            gpu_steps(&mut GpuDecoder::on(weights.clone(), lora).unwrap(), &PROMPT)
        };
        let (want_base, want_lora) = (alone(None), alone(Some(&set)));
        std::thread::scope(|s| {
            for (lora, want) in [(None, &want_base), (Some(&set), &want_lora)] {
                let weights = weights.clone();
                s.spawn(move || {
                    // A new decoder records its step afresh on its first token, each round.
                    for round in 0..20 {
                        let mut d = GpuDecoder::on(weights.clone(), lora).unwrap();
                        assert_eq!(&gpu_steps(&mut d, &PROMPT), want, "round {round}");
                    }
                });
            }
        });
    }
}

/// The architectures the GPU path runs, each tested against the CPU model.
pub(super) const ARCHS: [Arch; 5] = [
    Arch::Llama,
    Arch::Qwen2,
    Arch::Qwen3,
    Arch::Phi3,
    Arch::Gemma3,
];

/// The block types the GPU reads besides Q8_0: Q4_0 and the K-quants of Q4_K_M and Q5_K_M files.
pub(super) const BLOCK_TYPES: [GgmlDType; 4] = [
    GgmlDType::Q4_0,
    GgmlDType::Q4K,
    GgmlDType::Q5K,
    GgmlDType::Q6K,
];

/// A tiny Llama whose rows fill whole 256-weight blocks, stored as `dtype`.
pub(super) fn tiny_blocks(dir: &std::path::Path, dtype: GgmlDType) -> Transformer {
    let mut spec = TinySpec::new(Arch::Llama);
    spec.hidden_size = 256;
    spec.intermediate_size = 512;
    spec.head_dim = 64;
    spec.dtype = dtype;
    let path = dir.join(format!("blocks-{dtype:?}.gguf"));
    write_tiny_model(&path, &spec).unwrap();
    Transformer::from_gguf(&path).unwrap()
}

/// The types people download run on the GPU as stored, dequantized in the kernel and multiplied in f32: each
/// step's logits are those of the CPU model on the dequantized weights (every weight dense f32, `merged`), to
/// the order of float additions; a wrong scale, sub-block order or minimum moves them by far more. (The CPU
/// on the packed weights rounds activations to 8 bits, per 32 or per 256 depending on the CPU.)
#[test]
fn the_gpu_step_reads_the_four_bit_and_k_quant_types_as_stored() {
    let dir = tempfile::tempdir().unwrap();
    for gpu in devices("the_gpu_step_reads_the_four_bit_and_k_quant_types_as_stored") {
        for dtype in BLOCK_TYPES {
            let m = tiny_blocks(dir.path(), dtype);
            let set = random_adapter(&m, 4, false);
            let dense = m.merged(None).unwrap();
            let cpu = cpu_steps(&dense, &PROMPT, Some(&set));
            let mut d = GpuDecoder::new(&gpu, &m, 32, Some(&set)).unwrap();
            let got = gpu_steps(&mut d, &PROMPT);
            for (i, (g, c)) in got.iter().zip(&cpu).enumerate() {
                let scale = c.iter().fold(0f32, |m, v| m.max(v.abs()));
                let err = g.iter().zip(c).fold(0f32, |m, (a, b)| m.max((a - b).abs())) / scale;
                assert!(err < 1e-4, "{dtype:?} step {i}: relative error {err}");
            }
        }
    }
}

/// DoRA pairs decode on the GPU: the unmerged product times each output's factor `m / ‖W + ΔW‖_row`, which the
/// CPU model computes from its weights once per adapter, as the CPU decode does.
#[test]
fn dora_pairs_decode_on_the_gpu_as_on_the_cpu() {
    let dir = tempfile::tempdir().unwrap();
    let m = tiny(dir.path(), Arch::Llama, GgmlDType::Q8_0);
    let mut cfg = LoraConfig::new(4, 8.0, &LoraTarget::ALL);
    cfg.use_dora = true;
    let fresh = LoraSet::fresh(&m, cfg.clone(), 1).unwrap();
    // B ≠ 0 and magnitudes off the weights' own norms, so that both the delta and the factor matter.
    let mut rng = StdRng::seed_from_u64(2);
    let mut dora = LoraSet::empty(cfg);
    for (&(l, t), p) in fresh.iter() {
        let (out, r) = p.b.dims2().unwrap();
        let b: Vec<f32> = (0..out * r)
            .map(|_| rng.random_range(-0.2f32..0.2))
            .collect();
        let b = Tensor::from_vec(b, (out, r), &Device::Cpu).unwrap();
        let mag = (p.magnitude.as_ref().unwrap() * 1.3).unwrap();
        dora.insert(
            l,
            t,
            LoraPair::with_magnitude(p.a.clone(), b, p.scale, Some(mag)),
        );
    }
    for gpu in devices("dora_pairs_decode_on_the_gpu_as_on_the_cpu") {
        let mut t = Tally::default();
        let cpu = cpu_steps(&m, &PROMPT, Some(&dora));
        let base = cpu_steps(&m, &PROMPT, None);
        let mut d = GpuDecoder::new(&gpu, &m, 32, Some(&dora)).unwrap();
        let got = gpu_steps(&mut d, &PROMPT);
        t.compare(&gpu.describe(), &got, &cpu);
        t.check(&gpu.describe());
        assert_ne!(got, base, "the DoRA pairs change nothing");
    }
}
