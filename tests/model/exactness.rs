//! Exactness of the owned forward: adapters vs base and merged references, the forward vs an
//! independent plain-f32 implementation, and KV-cache decode vs full recompute.

use candle_core::quantized::GgmlDType;
use candle_core::{Device, Tensor};
use hearth::model::gguf::GgufFile;
use hearth::model::{
    Arch, GenerateConfig, KvPrecision, LoraConfig, LoraPair, LoraSet, LoraTarget, ModelConfig,
    TinySpec, Tokenizer, Transformer, generate, write_tiny_model,
};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use std::collections::HashMap;
use std::path::Path;

fn tiny(dir: &Path, arch: Arch, dtype: GgmlDType) -> (Transformer, std::path::PathBuf) {
    let mut spec = TinySpec::new(arch);
    spec.dtype = dtype;
    let path = dir.join(format!("{}-{dtype:?}.gguf", arch.as_str()));
    write_tiny_model(&path, &spec).unwrap();
    (Transformer::from_gguf(&path).unwrap(), path)
}

fn logits(m: &Transformer, ids: &[u32], lora: Option<&LoraSet>) -> Vec<f32> {
    m.forward_ids(ids, None, lora)
        .unwrap()
        .flatten_all()
        .unwrap()
        .to_vec1()
        .unwrap()
}

/// max |a-b| / max |b|; infinite when either side has a non-finite value (`f32::max` would skip a NaN, so
/// a path that overflowed to NaN would compare as exact).
fn rel_err(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len());
    if a.iter().chain(b).any(|x| !x.is_finite()) {
        return f32::INFINITY;
    }
    let scale = b.iter().fold(0f32, |m, x| m.max(x.abs())).max(1e-12);
    a.iter().zip(b).fold(0f32, |m, (x, y)| m.max((x - y).abs())) / scale
}

const ALL_ARCHS: [Arch; 5] = [
    Arch::Llama,
    Arch::Qwen2,
    Arch::Qwen3,
    Arch::Phi3,
    Arch::Gemma3,
];

const PROMPT: [u32; 7] = [72, 101, 108, 108, 111, 262, 119];

fn random_adapter(m: &Transformer, cfg: LoraConfig, seed: u64) -> LoraSet {
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

#[test]
fn zero_b_adapter_is_bitwise_equal_to_base() {
    let dir = tempfile::tempdir().unwrap();
    for arch in [Arch::Llama, Arch::Qwen3] {
        for dtype in [GgmlDType::F32, GgmlDType::Q8_0] {
            let (m, _) = tiny(dir.path(), arch, dtype);
            let set = LoraSet::fresh(&m, LoraConfig::new(4, 8.0, &LoraTarget::ALL), 3).unwrap();
            assert_eq!(set.len(), 7 * m.config().num_layers);
            // 7 rows take the candle-op LoRA path, 1 and 3 rows the direct small-batch path.
            for ids in [&PROMPT[..], &PROMPT[..1], &PROMPT[..3]] {
                let base = logits(&m, ids, None);
                let with = logits(&m, ids, Some(&set));
                // `==` on f32: bitwise except that +0 and -0 compare equal (x + 0·y may flip a
                // zero's sign).
                assert!(
                    base.iter().zip(&with).all(|(a, b)| a == b),
                    "{arch:?} {dtype:?}"
                );
            }
        }
    }
}

/// The same adapter with every value rounded to bf16, as a PEFT file on disk holds it: the decode loops then
/// keep its factors in bf16 (half the bytes per token), which must not change what they compute.
fn rounded_to_bf16(set: &LoraSet) -> LoraSet {
    let round = |t: &Tensor| {
        t.to_dtype(candle_core::DType::BF16)
            .unwrap()
            .to_dtype(candle_core::DType::F32)
            .unwrap()
    };
    let mut out = LoraSet::empty(set.config.clone());
    for (&(l, t), p) in set.iter() {
        out.insert(l, t, LoraPair::new(round(&p.a), round(&p.b), p.scale));
    }
    out
}

#[test]
fn random_adapter_matches_merged_f32_reference() {
    let dir = tempfile::tempdir().unwrap();
    for arch in ALL_ARCHS {
        let (m, _) = tiny(dir.path(), arch, GgmlDType::F32);
        for (rslora, bf16) in [(false, false), (true, false), (false, true)] {
            let mut cfg = LoraConfig::new(4, 8.0, &LoraTarget::ALL);
            cfg.use_rslora = rslora;
            let set = random_adapter(&m, cfg, 11);
            let set = if bf16 { rounded_to_bf16(&set) } else { set };
            let merged_model = m.merged(Some(&set)).unwrap();
            for ids in [&PROMPT[..1], &PROMPT[..3]] {
                let e = rel_err(
                    &logits(&m, ids, Some(&set)),
                    &logits(&merged_model, ids, None),
                );
                assert!(
                    e < 1e-4,
                    "{arch:?} bf16={bf16} direct path, {} rows: {e}",
                    ids.len()
                );
            }
            let unmerged = logits(&m, &PROMPT, Some(&set));
            let merged = logits(&merged_model, &PROMPT, None);
            let base = logits(&m, &PROMPT, None);
            let e = rel_err(&unmerged, &merged);
            eprintln!(
                "{arch:?} rslora={rslora}: unmerged vs merged rel err {e:.2e}, vs base {:.2e}",
                rel_err(&unmerged, &base)
            );
            assert!(e < 1e-4, "{arch:?} rslora={rslora}: rel err {e}");
            // The adapter must actually change the output, or the comparison proves nothing.
            assert!(
                rel_err(&unmerged, &base) > 1e-2,
                "{arch:?}: adapter had no effect"
            );
        }
    }
}

/// Plain-Rust f32 reference: weights dequantized from the GGUF, everything else hand-written.
struct Reference {
    cfg: ModelConfig,
    w: HashMap<String, Vec<f32>>,
}

impl Reference {
    fn load(path: &Path) -> Self {
        let mut g = GgufFile::open(path).unwrap();
        let cfg = ModelConfig::from_gguf(&g.content).unwrap();
        let names: Vec<String> = g.content.tensor_infos.keys().cloned().collect();
        let w = names
            .into_iter()
            .map(|n| {
                let t = g
                    .tensor(&n, None)
                    .unwrap()
                    .dequantize(&Device::Cpu)
                    .unwrap();
                (n, t.flatten_all().unwrap().to_vec1::<f32>().unwrap())
            })
            .collect();
        Self { cfg, w }
    }

    fn t(&self, name: &str) -> &[f32] {
        &self.w[name]
    }

    /// Rows `from..from + n` of the matrix `name` with `cols` columns: Phi-3 stores q/k/v as one matrix (q rows,
    /// then k, then v) and gate/up as one `ffn_up` (gate rows first).
    fn rows(&self, name: &str, cols: usize, from: usize, n: usize) -> &[f32] {
        &self.t(name)[from * cols..(from + n) * cols]
    }

    /// GELU, tanh approximation: `x/2 · (1 + tanh(sqrt(2/π) · (x + 0.044715 x³)))`.
    fn gelu(x: f32) -> f32 {
        let x = x as f64;
        (0.5 * x
            * (1.0 + ((2.0 / std::f64::consts::PI).sqrt() * (x + 0.044715 * x * x * x)).tanh()))
            as f32
    }

    fn matvec(w: &[f32], x: &[f32]) -> Vec<f32> {
        let n = x.len();
        w.chunks(n)
            .map(|row| row.iter().zip(x).map(|(a, b)| a * b).sum())
            .collect()
    }

    fn rms(x: &[f32], w: &[f32], eps: f32) -> Vec<f32> {
        let ms = x.iter().map(|v| v * v).sum::<f32>() / x.len() as f32;
        let r = 1.0 / (ms + eps).sqrt();
        x.iter().zip(w).map(|(v, g)| v * r * g).collect()
    }

    fn rope(&self, x: &mut [f32], pos: usize, layer: usize) {
        let d = self.cfg.head_dim;
        // Llama 3.x: `rope_freqs.weight` divides each frequency (llama.cpp's `theta / freq_factor`); linear
        // scaling divides the position.
        let factors = self.w.get("rope_freqs.weight");
        // Gemma 3: five sliding-window layers with base 10000 and no scaling, then one global layer with the
        // file's base and scaling.
        let gemma_local = self.cfg.arch == Arch::Gemma3 && layer % 6 != 5;
        let (base, linear) = if gemma_local {
            (10_000.0, 1.0)
        } else {
            (
                self.cfg.rope_theta as f64,
                self.cfg.rope_linear_factor as f64,
            )
        };
        let pos = pos as f64 / linear;
        for i in 0..d / 2 {
            let divisor = factors.map_or(1.0, |f| f[i] as f64);
            let theta = pos * base.powf(-2.0 * i as f64 / d as f64) / divisor;
            let (c, s) = (theta.cos() as f32, theta.sin() as f32);
            // Llama GGUF: interleaved pairs; Qwen2/Qwen3: halves (NEOX).
            let (a, b) = if self.cfg.arch == Arch::Llama {
                (2 * i, 2 * i + 1)
            } else {
                (i, i + d / 2)
            };
            let (x0, x1) = (x[a], x[b]);
            x[a] = x0 * c - x1 * s;
            x[b] = x0 * s + x1 * c;
        }
    }

    /// Logits for every position of `ids`.
    fn forward(&self, ids: &[u32]) -> Vec<Vec<f32>> {
        let c = &self.cfg;
        let (h, hd, nh, nkv) = (c.hidden_size, c.head_dim, c.num_heads, c.num_kv_heads);
        let emb = self.t("token_embd.weight");
        let gemma = c.arch == Arch::Gemma3;
        // Gemma multiplies the input embeddings (not the tied head) by sqrt(hidden).
        let emb_scale = if gemma { (h as f32).sqrt() } else { 1.0 };
        let mut xs: Vec<Vec<f32>> = ids
            .iter()
            .map(|&i| {
                emb[i as usize * h..(i as usize + 1) * h]
                    .iter()
                    .map(|v| v * emb_scale)
                    .collect()
            })
            .collect();
        let (qd, kvd, ff) = (nh * hd, nkv * hd, c.intermediate_size);
        for l in 0..c.num_layers {
            let p = |n: &str| format!("blk.{l}.{n}.weight");
            let fused = self.w.contains_key(&p("attn_qkv"));
            let (wq, wk, wv) = if fused {
                let n = p("attn_qkv");
                (
                    self.rows(&n, h, 0, qd),
                    self.rows(&n, h, qd, kvd),
                    self.rows(&n, h, qd + kvd, kvd),
                )
            } else {
                (
                    self.t(&p("attn_q")),
                    self.t(&p("attn_k")),
                    self.t(&p("attn_v")),
                )
            };
            let (wg, wu) = if self.w.contains_key(&p("ffn_gate")) {
                (self.t(&p("ffn_gate")), self.t(&p("ffn_up")))
            } else {
                (
                    self.rows(&p("ffn_up"), h, 0, ff),
                    self.rows(&p("ffn_up"), h, ff, ff),
                )
            };
            let post_norm = |name: &str, v: Vec<f32>| match self.w.get(&p(name)) {
                Some(w) => Self::rms(&v, w, c.rms_eps),
                None => v,
            };
            let mut qs = Vec::new();
            let mut ks = Vec::new();
            let mut vs = Vec::new();
            for (pos, x) in xs.iter().enumerate() {
                let xn = Self::rms(x, self.t(&p("attn_norm")), c.rms_eps);
                let mut q = Self::matvec(wq, &xn);
                let mut k = Self::matvec(wk, &xn);
                let mut v = Self::matvec(wv, &xn);
                // Qwen2: q/k/v biases, added to the projections before RoPE.
                for (buf, name) in [(&mut q, "attn_q"), (&mut k, "attn_k"), (&mut v, "attn_v")] {
                    if let Some(b) = self.w.get(&format!("blk.{l}.{name}.bias")) {
                        buf.iter_mut().zip(b).for_each(|(x, b)| *x += b);
                    }
                }
                for (buf, heads, norm) in
                    [(&mut q, nh, "attn_q_norm"), (&mut k, nkv, "attn_k_norm")]
                {
                    for hh in 0..heads {
                        let head = &mut buf[hh * hd..(hh + 1) * hd];
                        if let Some(w) = self.w.get(&p(norm)) {
                            let normed = Self::rms(head, w, c.rms_eps);
                            head.copy_from_slice(&normed);
                        }
                        self.rope(head, pos, l);
                    }
                }
                qs.push(q);
                ks.push(k);
                vs.push(v);
            }
            for t in 0..xs.len() {
                let mut ctx = vec![0f32; nh * hd];
                for hh in 0..nh {
                    let kvh = hh / (nh / nkv);
                    let q = &qs[t][hh * hd..(hh + 1) * hd];
                    let scores: Vec<f32> = (0..=t)
                        .map(|s| {
                            let k = &ks[s][kvh * hd..(kvh + 1) * hd];
                            q.iter().zip(k).map(|(a, b)| a * b).sum::<f32>() / (hd as f32).sqrt()
                        })
                        .collect();
                    let m = scores.iter().cloned().fold(f32::NEG_INFINITY, f32::max);
                    let e: Vec<f32> = scores.iter().map(|s| (s - m).exp()).collect();
                    let z: f32 = e.iter().sum();
                    for (s, es) in e.iter().enumerate() {
                        for d in 0..hd {
                            ctx[hh * hd + d] += es / z * vs[s][kvh * hd + d];
                        }
                    }
                }
                let o = post_norm(
                    "post_attention_norm",
                    Self::matvec(self.t(&p("attn_output")), &ctx),
                );
                xs[t].iter_mut().zip(&o).for_each(|(a, b)| *a += b);
                let xn = Self::rms(&xs[t], self.t(&p("ffn_norm")), c.rms_eps);
                let g = Self::matvec(wg, &xn);
                let u = Self::matvec(wu, &xn);
                let a: Vec<f32> = g
                    .iter()
                    .zip(&u)
                    .map(|(g, u)| {
                        if gemma {
                            Self::gelu(*g) * u
                        } else {
                            g / (1.0 + (-g).exp()) * u
                        }
                    })
                    .collect();
                let d = post_norm("post_ffw_norm", Self::matvec(self.t(&p("ffn_down")), &a));
                xs[t].iter_mut().zip(&d).for_each(|(a, b)| *a += b);
            }
        }
        let head = if c.tied_embeddings {
            "token_embd.weight"
        } else {
            "output.weight"
        };
        xs.iter()
            .map(|x| {
                Self::matvec(
                    self.t(head),
                    &Self::rms(x, self.t("output_norm.weight"), c.rms_eps),
                )
            })
            .collect()
    }

    fn greedy(&self, prompt: &[u32], n: usize) -> Vec<u32> {
        let mut ids = prompt.to_vec();
        let mut out = Vec::new();
        for _ in 0..n {
            let logits = self.forward(&ids);
            let next = hearth::model::generate::argmax(logits.last().unwrap());
            out.push(next);
            ids.push(next);
        }
        out
    }
}

#[test]
fn forward_matches_independent_f32_reference() {
    let dir = tempfile::tempdir().unwrap();
    for arch in ALL_ARCHS {
        for (dtype, tol) in [
            (GgmlDType::F32, 1e-4f32),
            (GgmlDType::Q8_0, 3e-2),
            (GgmlDType::Q4_0, 1.5e-1),
        ] {
            let (m, path) = tiny(dir.path(), arch, dtype);
            let r = Reference::load(&path);
            let want: Vec<f32> = r.forward(&PROMPT).concat();
            let got = logits(&m, &PROMPT, None);
            let e = rel_err(&got, &want);
            let abs = got
                .iter()
                .zip(&want)
                .fold(0f32, |m, (a, b)| m.max((a - b).abs()));
            eprintln!(
                "{arch:?} {dtype:?}: logits rel err vs reference {e:.2e}, max |Δlogit| {abs:.2e}"
            );
            assert!(e < tol, "{arch:?} {dtype:?}: logits rel err {e}");
            if dtype == GgmlDType::F32 {
                // Training's differentiable forward computes the same logits.
                let t = Tensor::from_slice(&PROMPT, (1, PROMPT.len()), &Device::Cpu).unwrap();
                let train: Vec<f32> = m
                    .forward_train(&t, None)
                    .unwrap()
                    .flatten_all()
                    .unwrap()
                    .to_vec1()
                    .unwrap();
                let e = rel_err(&train, &want);
                assert!(e < tol, "{arch:?} forward_train: rel err {e}");
            }
            if arch == Arch::Qwen2 && dtype == GgmlDType::F32 {
                // The biases matter: the reference without them is far off, so the match above tests them.
                let mut unbiased = Reference::load(&path);
                unbiased.w.retain(|k, _| !k.ends_with(".bias"));
                let e = rel_err(&got, &unbiased.forward(&PROMPT).concat());
                assert!(e > 1e-2, "Qwen2 biases had no effect: {e}");
            }
            if arch == Arch::Gemma3 && dtype == GgmlDType::F32 {
                // Each Gemma difference matters, so the match above tests it: the post-norms, and the global
                // layer's own RoPE base.
                let mut no_post = Reference::load(&path);
                no_post.w.retain(|k, _| !k.contains(".post_"));
                let e = rel_err(&got, &no_post.forward(&PROMPT).concat());
                assert!(e > 1e-2, "Gemma 3 post-norms had no effect: {e}");
                let mut one_base = Reference::load(&path);
                one_base.cfg.rope_theta = 10_000.0;
                let e = rel_err(&got, &one_base.forward(&PROMPT).concat());
                assert!(e > 1e-3, "Gemma 3 global RoPE base had no effect: {e}");
            }
            if dtype != GgmlDType::Q4_0 {
                // Greedy decode through generate() (KV cache) vs the reference.
                let tok = Tokenizer::from_gguf_metadata(GgufFile::open(&path).unwrap().metadata())
                    .unwrap();
                let cfg = GenerateConfig {
                    max_tokens: 12,
                    ..GenerateConfig::default()
                };
                let out = generate(&m, &tok, &PROMPT, None, &cfg, |_| true).unwrap();
                eprintln!("{arch:?} {dtype:?}: greedy {:?}", out.tokens);
                if dtype == GgmlDType::F32 {
                    // Exact f32 math on both sides: the same tokens.
                    assert_eq!(out.tokens, r.greedy(&PROMPT, 12), "{arch:?} {dtype:?}");
                } else {
                    // candle's Q8_0 kernel also quantizes activations, so near-ties may flip. Teacher-
                    // force the reference on the model's tokens: each pick must be the reference's
                    // argmax up to that tolerance.
                    let all: Vec<u32> = PROMPT.iter().chain(&out.tokens).copied().collect();
                    let ref_logits = r.forward(&all);
                    for (i, &t) in out.tokens.iter().enumerate() {
                        let row = &ref_logits[PROMPT.len() - 1 + i];
                        let max = row.iter().cloned().fold(f32::NEG_INFINITY, f32::max);
                        let scale = row.iter().fold(0f32, |m, x| m.max(x.abs()));
                        assert!(
                            row[t as usize] >= max - tol * scale,
                            "{arch:?} {dtype:?} step {i}: token {t}"
                        );
                    }
                }
            }
        }
    }
}

/// Llama 3.x RoPE scaling: a llama file with `rope_freqs.weight` (Llama 3.1's per-frequency divisors), and one
/// with linear scaling, match the reference in prefill, KV-cache decode and training forward; ignoring the
/// scaling would not.
#[test]
fn rope_scaling_matches_independent_f32_reference() {
    let dir = tempfile::tempdir().unwrap();
    for (freqs, linear) in [(true, None), (false, Some(4.0f32))] {
        let mut spec = TinySpec::new(Arch::Llama);
        spec.rope_freqs = freqs;
        spec.rope_linear_factor = linear;
        let path = dir.path().join(format!("scaled-{freqs}-{linear:?}.gguf"));
        write_tiny_model(&path, &spec).unwrap();
        let m = Transformer::from_gguf(&path).unwrap();
        let r = Reference::load(&path);
        let ids: Vec<u32> = (0..40u32).map(|i| (i * 37 + 5) % 290).collect();
        let want = r.forward(&ids);
        let got = m
            .forward_ids(&ids, None, None)
            .unwrap()
            .to_vec2::<f32>()
            .unwrap();
        let (e, abs) = (
            rel_err(&got.concat(), &want.concat()),
            max_abs_diff(&got.concat(), &want.concat()),
        );
        eprintln!("rope_freqs={freqs} linear={linear:?}: rel err {e:.2e}, max |Δlogit| {abs:.2e}");
        assert!(e < 1e-4, "rope_freqs={freqs} linear={linear:?}: {e}");
        // Decode one position at a time through the cache (the serving decode step).
        let mut cache = m.new_cache();
        m.forward_ids(&ids[..5], Some(&mut cache), None).unwrap();
        for i in 5..ids.len() {
            let row = m
                .forward_ids(&ids[i..i + 1], Some(&mut cache), None)
                .unwrap()
                .to_vec2::<f32>()
                .unwrap();
            let e = rel_err(&row[0], &want[i]);
            assert!(
                e < 1e-4,
                "rope_freqs={freqs} linear={linear:?} decode pos {i}: {e}"
            );
        }
        // Greedy tokens through generate() (the serving loop) are the reference's.
        let tok = Tokenizer::from_gguf_metadata(GgufFile::open(&path).unwrap().metadata()).unwrap();
        let cfg = GenerateConfig {
            max_tokens: 12,
            ..GenerateConfig::default()
        };
        let out = generate(&m, &tok, &PROMPT, None, &cfg, |_| true).unwrap();
        assert_eq!(
            out.tokens,
            r.greedy(&PROMPT, 12),
            "rope_freqs={freqs} linear={linear:?}"
        );
        // Training forward.
        let t = Tensor::from_slice(&ids, (1, ids.len()), &Device::Cpu).unwrap();
        let train: Vec<f32> = m
            .forward_train(&t, None)
            .unwrap()
            .flatten_all()
            .unwrap()
            .to_vec1()
            .unwrap();
        let e = rel_err(&train, &want.concat());
        assert!(e < 1e-4, "rope_freqs={freqs} linear={linear:?} train: {e}");
        // The same weights without the scaling give other logits, so the match above tests it.
        let mut plain = spec.clone();
        plain.rope_freqs = false;
        plain.rope_linear_factor = None;
        let plain_path = dir.path().join("plain.gguf");
        write_tiny_model(&plain_path, &plain).unwrap();
        let unscaled = Transformer::from_gguf(&plain_path).unwrap();
        let other = unscaled
            .forward_ids(&ids, None, None)
            .unwrap()
            .to_vec2::<f32>()
            .unwrap();
        let e = rel_err(&other.concat(), &want.concat());
        eprintln!("rope_freqs={freqs} linear={linear:?}: unscaled model vs reference {e:.2e}");
        assert!(
            e > 1e-2,
            "rope_freqs={freqs} linear={linear:?}: scaling had no effect ({e})"
        );
    }
}

fn max_abs_diff(a: &[f32], b: &[f32]) -> f32 {
    a.iter().zip(b).fold(0f32, |m, (x, y)| m.max((x - y).abs()))
}

#[test]
fn kv_cache_decode_equals_full_recompute() {
    let dir = tempfile::tempdir().unwrap();
    // F32 checks the cache logic at 1e-5. With Q8_0, a 16+ row prefill runs on dequantized f32
    // weights while single rows go through the Q8_0 decode kernel, which also quantizes the
    // activations: a few percent apart, while a wrong position or mask gives O(1) errors.
    for (arch, dtype, tol) in [
        (Arch::Llama, GgmlDType::F32, 1e-5f32),
        (Arch::Qwen3, GgmlDType::F32, 1e-5),
        (Arch::Qwen3, GgmlDType::Q8_0, 8e-2),
        (Arch::Qwen2, GgmlDType::F32, 1e-5),
        (Arch::Qwen2, GgmlDType::Q8_0, 8e-2),
        (Arch::Phi3, GgmlDType::F32, 1e-5),
        (Arch::Phi3, GgmlDType::Q8_0, 8e-2),
        (Arch::Gemma3, GgmlDType::F32, 1e-5),
        (Arch::Gemma3, GgmlDType::Q8_0, 8e-2),
    ] {
        let (m, _) = tiny(dir.path(), arch, dtype);
        let set = random_adapter(&m, LoraConfig::new(4, 8.0, &LoraTarget::ALL), 5);
        // 80 positions: crosses the cache's initial capacity (64), so growth is covered too, and decode
        // attention's split across threads (from 64 positions).
        let ids: Vec<u32> = (0..80u32).map(|i| (i * 37 + 5) % 290).collect();
        for lora in [None, Some(&set)] {
            let full = m
                .forward_ids(&ids, None, lora)
                .unwrap()
                .to_vec2::<f32>()
                .unwrap();
            // Prefill 5, then one at a time; also in a pool of 3 threads, where decode attention splits the
            // cached positions into three ranges (80 is not a multiple of 3) and combines them.
            let mut cache = m.new_cache();
            let mut inc = m
                .forward_ids(&ids[..5], Some(&mut cache), lora)
                .unwrap()
                .to_vec2::<f32>()
                .unwrap();
            for i in 5..ids.len() {
                inc.extend(
                    m.forward_ids(&ids[i..i + 1], Some(&mut cache), lora)
                        .unwrap()
                        .to_vec2::<f32>()
                        .unwrap(),
                );
            }
            assert_eq!(cache.len(), ids.len());
            let pool = rayon::ThreadPoolBuilder::new()
                .num_threads(3)
                .build()
                .unwrap();
            let mut cache3 = m.new_cache();
            m.forward_ids(&ids[..5], Some(&mut cache3), lora).unwrap();
            for i in 5..ids.len() {
                let row = pool.install(|| {
                    m.forward_ids(&ids[i..i + 1], Some(&mut cache3), lora)
                        .unwrap()
                        .to_vec2::<f32>()
                        .unwrap()
                });
                let e = rel_err(&row[0], &full[i]);
                assert!(e < tol, "{arch:?} 3 threads pos {i}: {e}");
            }
            // A fork continues independently of the original.
            let mut fork = cache.fork().unwrap();
            let a = m
                .forward_ids(&[9], Some(&mut fork), lora)
                .unwrap()
                .to_vec2::<f32>()
                .unwrap();
            let b = m
                .forward_ids(&[9], Some(&mut cache), lora)
                .unwrap()
                .to_vec2::<f32>()
                .unwrap();
            assert_eq!(a, b);
            // Chunks of 3 and 4 (rectangular masks with an offset).
            let mut cache2 = m.new_cache();
            let mut chunked = Vec::new();
            for c in ids.chunks(4).flat_map(|c| {
                if c.len() == 4 {
                    vec![&c[..3], &c[3..]]
                } else {
                    vec![c]
                }
            }) {
                chunked.extend(
                    m.forward_ids(c, Some(&mut cache2), lora)
                        .unwrap()
                        .to_vec2::<f32>()
                        .unwrap(),
                );
            }
            for (i, row) in full.iter().enumerate() {
                assert!(
                    rel_err(&inc[i], row) < tol,
                    "{arch:?} pos {i}: {}",
                    rel_err(&inc[i], row)
                );
                assert!(rel_err(&chunked[i], row) < tol, "{arch:?} chunked pos {i}");
            }
        }
    }
}

/// An f16 cache rounds keys and values once, when stored, and every attention over it reads the rounded values:
/// decoding one token at a time (the decode loops widen f16 lanes), in one thread or split across three, agrees
/// with one cached prefill of the same positions (the general path over the widened cache). The two paths compute a
/// new key in a different order of additions, and a difference of 1e-7 can round to a neighbouring f16 (2^-11
/// apart), so they agree to within 2.5e-4 rather than the f32 cache's 1e-5, still well below the ~8e-4 between f16
/// and f32 caches; a wrong position, mask or conversion is off by far more. The cache holds half the bytes of an
/// f32 one.
#[test]
fn f16_kv_cache_reads_back_what_it_stored() {
    let dir = tempfile::tempdir().unwrap();
    for arch in [Arch::Llama, Arch::Qwen3] {
        let (m, _) = tiny(dir.path(), arch, GgmlDType::F32);
        let m16 = m.clone().with_kv_precision(KvPrecision::F16);
        let ids: Vec<u32> = (0..80u32).map(|i| (i * 37 + 5) % 290).collect();
        let rows = |t: Tensor| t.to_vec2::<f32>().unwrap();
        let mut prefilled = m16.new_cache();
        let once = rows(m16.forward_ids(&ids, Some(&mut prefilled), None).unwrap());
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(3)
            .build()
            .unwrap();
        for threads in [None, Some(&pool)] {
            let mut cache = m16.new_cache();
            m16.forward_ids(&ids[..5], Some(&mut cache), None).unwrap();
            for i in 5..ids.len() {
                let mut step = || {
                    rows(
                        m16.forward_ids(&ids[i..i + 1], Some(&mut cache), None)
                            .unwrap(),
                    )
                };
                let row = match threads {
                    Some(p) => p.install(step),
                    None => step(),
                };
                let e = rel_err(&row[0], &once[i]);
                assert!(e < 2.5e-4, "{arch:?} {threads:?} pos {i}: {e}");
            }
        }
        let mut exact = m.new_cache();
        let f32_rows = rows(m.forward_ids(&ids, Some(&mut exact), None).unwrap());
        assert_eq!(exact.precision(), KvPrecision::F32);
        assert_eq!(prefilled.precision(), KvPrecision::F16);
        assert_eq!(2 * prefilled.bytes(), exact.bytes());
        let e = f32_rows
            .iter()
            .zip(&once)
            .map(|(a, b)| rel_err(b, a))
            .fold(0f32, f32::max);
        assert!(e > 0.0 && e < 5e-3, "{arch:?} f16 vs f32 cache: {e}");
    }
}

#[test]
fn batch_rows_equal_single_sequences() {
    let dir = tempfile::tempdir().unwrap();
    let (m, _) = tiny(dir.path(), Arch::Qwen3, GgmlDType::Q8_0);
    let a: Vec<u32> = vec![1, 2, 3, 4, 5, 6];
    let b: Vec<u32> = vec![100, 90, 80, 70, 60, 50];
    let both = Tensor::from_vec([a.clone(), b.clone()].concat(), (2, 6), &Device::Cpu).unwrap();
    let mut cache = m.new_cache();
    let out = m.forward(&both, Some(&mut cache), None).unwrap();
    assert_eq!(out.dims(), &[2, 6, m.config().vocab_size]);
    for (row, ids) in [a, b].iter().enumerate() {
        let single = m.forward_ids(ids, None, None).unwrap();
        let got = out.get(row).unwrap();
        let e = rel_err(
            &got.flatten_all().unwrap().to_vec1().unwrap(),
            &single.flatten_all().unwrap().to_vec1().unwrap(),
        );
        assert!(e < 1e-5, "row {row}: {e}");
    }
    // Decode one more token per row from the batched cache.
    let next = Tensor::from_vec(vec![7u32, 40], (2, 1), &Device::Cpu).unwrap();
    let step = m.forward_last(&next, Some(&mut cache), None).unwrap();
    assert_eq!(step.dims(), &[2, m.config().vocab_size]);
    let single = m
        .forward_ids(&[1, 2, 3, 4, 5, 6, 7], None, None)
        .unwrap()
        .get(6)
        .unwrap();
    let e = rel_err(
        &step.get(0).unwrap().to_vec1().unwrap(),
        &single.to_vec1().unwrap(),
    );
    assert!(e < 1e-5);
}

/// hearth's Q8_0 decode kernel (`model::q8`, used for up to 15 rows) against candle's own Q8_0 matmul and against
/// the dequantized f32 product: same activation quantization, so it matches candle up to float summation
/// order; against f32 the difference is the activation's int8 rounding. Shapes include a row count that is not
/// a multiple of four and a matrix large enough to be split across threads.
#[test]
fn q8_0_decode_kernel_matches_candle_and_the_f32_product() {
    use candle_core::quantized::{QMatMul, QTensor};
    let mut rng = StdRng::seed_from_u64(11);
    for (n_out, k) in [(6, 64), (576, 576), (1536, 576), (577, 1536)] {
        let w: Vec<f32> = (0..n_out * k)
            .map(|_| rng.random_range(-1.0f32..1.0))
            .collect();
        let w = Tensor::from_vec(w, (n_out, k), &Device::Cpu).unwrap();
        let q = std::sync::Arc::new(QTensor::quantize(&w, GgmlDType::Q8_0).unwrap());
        let linear = hearth::model::QLinear::from_qtensor(q.clone()).unwrap();
        let candle = QMatMul::from_arc(q.clone()).unwrap();
        let dense = q.dequantize(&Device::Cpu).unwrap();
        for m in [1usize, 3, 4, 15] {
            let x: Vec<f32> = (0..m * k).map(|_| rng.random_range(-2.0f32..2.0)).collect();
            let x = Tensor::from_vec(x, (m, k), &Device::Cpu).unwrap();
            let ours: Vec<f32> = linear
                .forward(&x, None)
                .unwrap()
                .flatten_all()
                .unwrap()
                .to_vec1()
                .unwrap();
            let theirs: Vec<f32> = candle_core::Module::forward(&candle, &x)
                .unwrap()
                .flatten_all()
                .unwrap()
                .to_vec1()
                .unwrap();
            let exact: Vec<f32> = x
                .matmul(&dense.t().unwrap())
                .unwrap()
                .flatten_all()
                .unwrap()
                .to_vec1()
                .unwrap();
            let scale = exact.iter().fold(0f32, |a, v| a.max(v.abs()));
            for ((a, b), e) in ours.iter().zip(&theirs).zip(&exact) {
                assert!(
                    (a - b).abs() <= 1e-4 * scale,
                    "{n_out}x{k} m={m}: ours {a} candle {b}"
                );
                assert!(
                    (a - e).abs() <= 2e-2 * scale,
                    "{n_out}x{k} m={m}: ours {a} f32 {e}"
                );
            }
        }
    }
}

/// Mistral's GGUFs declare `llama` (llama.cpp's converter writes them so): a Mistral-shaped tiny file (4 query heads
/// per kv head, untied head, RoPE base 1e6) loads and matches the reference. Mistral 7B v0.1's sliding window
/// (4096) is not applied, as llama.cpp's llama graph does not apply it either.
#[test]
fn mistral_shaped_llama_matches_reference() {
    use candle_core::quantized::gguf_file::Value;
    let dir = tempfile::tempdir().unwrap();
    let mut spec = TinySpec::new(Arch::Llama);
    spec.num_heads = 8;
    spec.num_kv_heads = 2;
    spec.head_dim = 8;
    spec.tied_embeddings = false;
    let src = dir.path().join("src.gguf");
    write_tiny_model(&src, &spec).unwrap();
    // Rewrite with Mistral's RoPE base and name.
    let mut g = GgufFile::open(&src).unwrap();
    let mut md: Vec<(String, Value)> = g
        .content
        .metadata
        .iter()
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    for (k, v) in md.iter_mut() {
        match k.as_str() {
            "llama.rope.freq_base" => *v = Value::F32(1_000_000.0),
            "general.name" => *v = Value::String("Mistral-7B-Instruct-v0.3 (tiny)".into()),
            _ => {}
        }
    }
    let names: Vec<String> = g.content.tensor_infos.keys().cloned().collect();
    let ts: Vec<_> = names
        .into_iter()
        .map(|n| {
            let t = g.tensor(&n, None).unwrap();
            let t = std::sync::Arc::try_unwrap(t).unwrap();
            (n, t)
        })
        .collect();
    let path = dir.path().join("mistral.gguf");
    hearth::model::gguf::write_gguf(&path, &md, &ts).unwrap();
    let m = Transformer::from_gguf(&path).unwrap();
    assert_eq!(m.config().rope_theta, 1_000_000.0);
    assert_eq!(m.config().num_heads / m.config().num_kv_heads, 4);
    let r = Reference::load(&path);
    let e = rel_err(&logits(&m, &PROMPT, None), &r.forward(&PROMPT).concat());
    assert!(e < 1e-4, "mistral-shaped: rel err {e}");
}

/// Gemma 3 serves at most its sliding window of positions, so that every layer's attention is the model's
/// (see `SlidingWindow`): a longer input is refused with an error, not silently given full attention.
#[test]
fn gemma3_context_is_capped_at_the_sliding_window() {
    let dir = tempfile::tempdir().unwrap();
    let mut spec = TinySpec::new(Arch::Gemma3);
    spec.sliding_window = 16;
    let path = dir.path().join("g.gguf");
    write_tiny_model(&path, &spec).unwrap();
    let m = Transformer::from_gguf(&path).unwrap();
    assert_eq!(m.max_positions(), 16);
    let ids: Vec<u32> = (0..16u32).map(|i| (i * 37 + 5) % 290).collect();
    let r = Reference::load(&path);
    let e = rel_err(
        &m.forward_ids(&ids, None, None)
            .unwrap()
            .flatten_all()
            .unwrap()
            .to_vec1()
            .unwrap(),
        &r.forward(&ids).concat(),
    );
    assert!(e < 1e-4, "{e}");
    let long: Vec<u32> = (0..17u32).collect();
    assert!(m.forward_ids(&long, None, None).is_err());
    let mut cache = m.new_cache();
    m.forward_ids(&ids, Some(&mut cache), None).unwrap();
    assert!(m.forward_ids(&[1], Some(&mut cache), None).is_err());
}

/// `Transformer::residual` stacks the stream after each asked block, stops after the deepest, and
/// refuses blocks the model lacks or an order that is not ascending.
#[test]
fn residual_taps_agree_and_check_their_blocks() {
    let dir = tempfile::tempdir().unwrap();
    let (m, _) = tiny(dir.path(), Arch::Llama, GgmlDType::F32);
    let t = Tensor::new(&[[3u32, 17, 42, 9, 100]], &Device::Cpu).unwrap();
    let both = m.residual(&t, &[1, 2]).unwrap();
    assert_eq!(both.dims(), &[2, 1, 5, m.config().hidden_size]);
    let first = m.residual(&t, &[1]).unwrap();
    let last = m.residual(&t, &[2]).unwrap();
    let v = |x: &Tensor| x.flatten_all().unwrap().to_vec1::<f32>().unwrap();
    assert_eq!(v(&both.get(0).unwrap()), v(&first.get(0).unwrap()));
    assert_eq!(v(&both.get(1).unwrap()), v(&last.get(0).unwrap()));
    assert_ne!(v(&first), v(&last));
    for bad in [&[0usize][..], &[3], &[2, 1], &[1, 1], &[]] {
        assert!(m.residual(&t, bad).is_err(), "{bad:?}");
    }
}
