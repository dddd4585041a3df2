//! One token of one sequence through the model over plain f32 buffers: the serving decode step.
//!
//! Through candle a decode step is about twenty small tensor ops per layer (norms, reshapes, transposes, rope,
//! silu, products, residual adds), each allocating its output and some forking onto the pool, while the weight
//! products are the only part that must cost anything. Here each step reuses a handful of buffers, quantizes each
//! projection input once for all the weights that read it (q/k/v, gate/up), and runs norms, rope, SiLU and the
//! residual adds as loops, so that the weight products are nearly all of a step. Weights other than Q8_0 still go
//! through candle per product. The math is the general path's, same formulas in the same precision, so the two
//! agree up to the order of float additions (tests compare them).

use super::attention_decode::attend_cached;
use super::qlinear::adapt_rows;
use super::weight::{Int8Input, forward_in_int8};
use super::*;
use crate::model::q8::kquant::KQuant;
use crate::model::q8::q8k;
use crate::model::q8::{PanelWeights, QuantizedRows, matvec_panels_many, matvec_quantized_many};

/// Buffers of one decode step, each the size of one activation.
struct Step {
    x: Vec<f32>,
    normed: Vec<f32>,
    q: Vec<f32>,
    k: Vec<f32>,
    v: Vec<f32>,
    context: Vec<f32>,
    out: Vec<f32>,
    gate: Vec<f32>,
    up: Vec<f32>,
}

impl Transformer {
    /// Logits `[1, 1, vocab]` for `token` at position `cache.len()`, appending its keys and values to `cache`.
    /// The caller has validated the token, the position, the cache and the adapter set, and `lora` trains
    /// nothing (its factors may be cached).
    pub(super) fn decode_token(
        &self,
        tokens: &Tensor,
        cache: &mut KvCache,
        lora: Option<&LoraSet>,
    ) -> Result<Tensor> {
        let cfg = &self.config;
        let (h, nh, nkv, hd, ff) = (
            cfg.hidden_size,
            cfg.num_heads,
            cfg.num_kv_heads,
            cfg.head_dim,
            cfg.intermediate_size,
        );
        let pos = cache.len();
        let embedded = self.embed.embedding(&tokens.flatten_all()?)?;
        let mut s = Step {
            x: embedded.flatten_all()?.to_vec1::<f32>()?,
            normed: vec![0f32; h],
            q: vec![0f32; nh * hd],
            k: vec![0f32; nkv * hd],
            v: vec![0f32; nkv * hd],
            context: vec![0f32; nh * hd],
            out: vec![0f32; h],
            gate: vec![0f32; ff],
            up: vec![0f32; ff],
        };
        let half = hd / 2;
        let rope_row = |t: &Tensor| -> Result<Vec<f32>> {
            Ok(t.narrow(0, pos, 1)?.flatten_all()?.to_vec1::<f32>()?)
        };
        let (cos, sin) = (rope_row(&self.rope.cos)?, rope_row(&self.rope.sin)?);
        let sliding = match &self.rope_sliding {
            Some(r) => Some((rope_row(&r.cos)?, rope_row(&r.sin)?)),
            None => None,
        };
        let interleaved = self.rope.interleaved;
        if let Some(scale) = self.embed_scale() {
            s.x.iter_mut().for_each(|x| *x *= scale);
        }
        for (li, blk) in self.blocks.iter().enumerate() {
            let (cos, sin) = match &sliding {
                Some((c, s)) if cfg.is_sliding_layer(li) => (c, s),
                _ => (&cos, &sin),
            };
            let rope = |x: &mut [f32]| {
                for head in x.chunks_exact_mut(hd) {
                    rotate(head, &cos[..half], &sin[..half], interleaved);
                }
            };
            let pair = |t| lora.and_then(|set| set.get(li, t));
            with_norm(&blk.attn_norm, |w| {
                rms_norm_into(&s.x, w, cfg.rms_eps, &mut s.normed)
            })?;
            QuantizedInput::new(&s.normed).project(vec![
                (&blk.q, pair(LoraTarget::Q), &mut s.q),
                (&blk.k, pair(LoraTarget::K), &mut s.k),
                (&blk.v, pair(LoraTarget::V), &mut s.v),
            ])?;
            if let Some(bias) = &blk.bias {
                for (x, b) in [
                    (&mut s.q, &bias.q),
                    (&mut s.k, &bias.k),
                    (&mut s.v, &bias.v),
                ] {
                    with_norm(b, |b| add_into(x, b))?;
                }
            }
            if let (Some(qn), Some(kn)) = (&blk.q_norm, &blk.k_norm) {
                for (x, norm) in [(&mut s.q, qn), (&mut s.k, kn)] {
                    with_norm(norm, |w| {
                        for head in x.chunks_exact_mut(hd) {
                            rms_norm_in_place(head, w, cfg.rms_eps);
                        }
                    })?;
                }
            }
            if cfg.query_scale != 1.0 {
                s.q.iter_mut().for_each(|x| *x *= cfg.query_scale);
            }
            rope(&mut s.q);
            rope(&mut s.k);
            let (kc, vc) = cache.append(
                li,
                &Tensor::from_slice(&s.k, (1, nkv, 1, hd), &Device::Cpu)?,
                &Tensor::from_slice(&s.v, (1, nkv, 1, hd), &Device::Cpu)?,
            )?;
            if attend_cached(&s.q, &kc, &vc, nh / nkv, &mut s.context).is_none() {
                return Err(ModelError::Input(
                    "decode: the key/value cache does not have the model's layout".into(),
                ));
            }
            QuantizedInput::new(&s.context).project(vec![(
                &blk.o,
                pair(LoraTarget::O),
                &mut s.out,
            )])?;
            if let Some(n) = &blk.post_attn_norm {
                with_norm(n, |w| rms_norm_in_place(&mut s.out, w, cfg.rms_eps))?;
            }
            add_into(&mut s.x, &s.out);
            with_norm(&blk.ffn_norm, |w| {
                rms_norm_into(&s.x, w, cfg.rms_eps, &mut s.normed)
            })?;
            QuantizedInput::new(&s.normed).project(vec![
                (&blk.gate, pair(LoraTarget::Gate), &mut s.gate),
                (&blk.up, pair(LoraTarget::Up), &mut s.up),
            ])?;
            if cfg.arch.gelu_mlp() {
                // GELU(gate)·up, with the tanh approximation as candle's `gelu` writes it.
                const SQRT_TWO_OVER_PI: f32 = 0.797_884_6;
                for (g, u) in s.gate.iter_mut().zip(&s.up) {
                    let x = *g;
                    *g = 0.5
                        * x
                        * (1.0 + (SQRT_TWO_OVER_PI * x * (1.0 + 0.044715 * x * x)).tanh())
                        * u;
                }
            } else {
                // SiLU(gate)·up, as candle's `silu` writes it: x / (1 + e^-x).
                for (g, u) in s.gate.iter_mut().zip(&s.up) {
                    *g = *g / (1.0 + (-*g).exp()) * u;
                }
            }
            QuantizedInput::new(&s.gate).project(vec![(
                &blk.down,
                pair(LoraTarget::Down),
                &mut s.out,
            )])?;
            if let Some(n) = &blk.post_ffw_norm {
                with_norm(n, |w| rms_norm_in_place(&mut s.out, w, cfg.rms_eps))?;
            }
            add_into(&mut s.x, &s.out);
        }
        cache.len += 1;
        with_norm(&self.norm, |w| {
            rms_norm_into(&s.x, w, cfg.rms_eps, &mut s.normed)
        })?;
        let mut logits = vec![0f32; cfg.vocab_size];
        QuantizedInput::new(&s.normed).project(vec![(&self.head, None, &mut logits)])?;
        Ok(Tensor::from_vec(
            logits,
            (1, 1, cfg.vocab_size),
            &Device::Cpu,
        )?)
    }
}

/// A projection input and, made on first use, its quantizations: each stage's products share them.
struct QuantizedInput<'a> {
    x: &'a [f32],
    int8: Int8Input<'a>,
}

/// One product of a stage: the layer, its adapter pair if any, and where its output goes.
type Projection<'l, 'y> = (&'l QLinear, Option<&'l LoraPair>, &'y mut [f32]);

impl<'a> QuantizedInput<'a> {
    fn new(x: &'a [f32]) -> Self {
        Self {
            x,
            int8: Int8Input::new(x, x.len()),
        }
    }

    fn q8(&self) -> Result<&QuantizedRows> {
        self.int8.q8_0().map_err(ModelError::from)
    }

    /// `y = W·x (+ scale·B·A·x, · DoRA factor)` for each projection of a stage: the Q8_0 and K-quant weights
    /// through their kernels on the input quantized once per form, then their adapters; other weights through
    /// [`QLinear::forward`].
    fn project(&self, outs: Vec<Projection>) -> Result<()> {
        let (mut gguf, mut panels, mut kq, mut rest) =
            (Vec::new(), Vec::new(), Vec::new(), Vec::new());
        for (lin, pair, y) in outs {
            let kind = match &lin.weight {
                Weight::Quant(q) if forward_in_int8(q.dtype()) => {
                    KQuant::of(q.dtype()).filter(|k| q8k::supports(*k))
                }
                _ => None,
            };
            match (&lin.weight, kind) {
                (Weight::Quant(q), Some(kind)) => kq.push((lin, kind, q.data()?, pair, y)),
                (Weight::Quant(q), None) if q.dtype() == GgmlDType::Q8_0 => {
                    gguf.push((lin, q.data()?, pair, y))
                }
                (Weight::Panels(p), _) => panels.push((lin, p, pair, y)),
                _ => rest.push((lin, pair, y)),
            }
        }
        if !kq.is_empty() {
            let mut products: Vec<(KQuant, &[u8], &mut [f32])> = kq
                .iter_mut()
                .map(|(_, kind, w, _, y)| (*kind, &w[..], &mut **y))
                .collect();
            let x = self.int8.q8_k().map_err(ModelError::from)?;
            q8k::matvec_many(x, &mut products).map_err(ModelError::from)?;
        }
        if !gguf.is_empty() {
            let mut products: Vec<(&[u8], &mut [f32])> = gguf
                .iter_mut()
                .map(|(_, w, _, y)| (&w[..], &mut **y))
                .collect();
            matvec_quantized_many(self.q8()?, &mut products).map_err(ModelError::from)?;
        }
        if !panels.is_empty() {
            let mut products: Vec<(&PanelWeights, &mut [f32])> = panels
                .iter_mut()
                .map(|(_, w, _, y)| (&***w, &mut **y))
                .collect();
            matvec_panels_many(self.q8()?, &mut products).map_err(ModelError::from)?;
        }
        let fused = gguf
            .into_iter()
            .map(|(lin, _, pair, y)| (lin, pair, y))
            .chain(panels.into_iter().map(|(lin, _, pair, y)| (lin, pair, y)))
            .chain(kq.into_iter().map(|(lin, _, _, pair, y)| (lin, pair, y)));
        for (lin, pair, y) in fused {
            let dora = match pair {
                Some(p) => lin.dora_factor(p)?,
                None => None,
            };
            if !adapt_rows(self.x, pair, dora.as_ref(), y) {
                rest.push((lin, pair, y));
            }
        }
        for (lin, pair, y) in rest {
            let t = Tensor::from_slice(self.x, (1, self.x.len()), &Device::Cpu)?;
            let out = lin.forward(&t, pair)?.flatten_all()?.to_vec1::<f32>()?;
            if out.len() != y.len() {
                return Err(ModelError::Input(format!(
                    "decode: a projection gave {} values for {}",
                    out.len(),
                    y.len()
                )));
            }
            y.copy_from_slice(&out);
        }
        Ok(())
    }
}

/// Runs `f` on a norm weight's (or bias's) values where they lie (both load as contiguous f32), not on a copy
/// made every step.
fn with_norm<R>(w: &Tensor, f: impl FnOnce(&[f32]) -> R) -> Result<R> {
    with_f32_slice(w, f)
        .ok_or_else(|| ModelError::Input("decode: a norm weight is not contiguous f32".into()))
}

/// `y = x / rms(x) · w`, as candle's `rms_norm` computes it.
fn rms_norm_into(x: &[f32], w: &[f32], eps: f32, y: &mut [f32]) {
    let m = rms(x, eps);
    for ((y, x), w) in y.iter_mut().zip(x).zip(w) {
        *y = x / m * w;
    }
}

fn rms_norm_in_place(x: &mut [f32], w: &[f32], eps: f32) {
    let m = rms(x, eps);
    for (x, w) in x.iter_mut().zip(w) {
        *x = *x / m * w;
    }
}

fn rms(x: &[f32], eps: f32) -> f32 {
    (x.iter().map(|v| v * v).sum::<f32>() / x.len() as f32 + eps).sqrt()
}

fn add_into(x: &mut [f32], d: &[f32]) {
    x.iter_mut().zip(d).for_each(|(x, d)| *x += d);
}

/// RoPE on one head at one position, as candle's `rope_i` (pairs `2i, 2i+1`; Llama GGUFs) or `rope` (pairs
/// `i, i + d/2`; Qwen) computes it.
fn rotate(x: &mut [f32], cos: &[f32], sin: &[f32], interleaved: bool) {
    let half = x.len() / 2;
    for (i, (&c, &s)) in cos.iter().zip(sin).enumerate() {
        let (a, b) = if interleaved {
            (2 * i, 2 * i + 1)
        } else {
            (i, i + half)
        };
        let (x0, x1) = (x[a], x[b]);
        x[a] = x0 * c - x1 * s;
        x[b] = x0 * s + x1 * c;
    }
}
