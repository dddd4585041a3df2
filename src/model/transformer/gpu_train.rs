//! Training's forward and backward on a GPU: per-position target log-probabilities of one sequence under a LoRA
//! set, and the gradient of `Σ d_lp · lp` with respect to every pair's `A` and `B`, through `gpu::ops` over the
//! weights a [`GpuModel`] holds.
//!
//! The math is [`Transformer::target_logps`]'s with training's ops: the frozen Q8_0 products quantize their input
//! to int8 per 32 values as the CPU path does (Q4_0 and K-quant weights multiply f32 inputs, see
//! [`super::GpuDecoder`]), the LoRA terms multiply f32 inputs, attention is causal over the
//! sequence with its probabilities kept for the backward, and the head scores the positions its [`Targets`]
//! score (the others are never projected onto the vocabulary). The backward takes the frozen products' transposes in f32, where the CPU quantizes the incoming
//! gradient to int8: the two differ by that rounding.
//!
//! Gradients of all sequences given to [`GpuTrainer::accumulate`] add up on the device until
//! [`GpuTrainer::take_gradients`] brings them back, as a micro-batch's sum.

use std::sync::Arc;

use super::gpu_decode::{
    BlockPairs, GpuBlock, slot, unsupported, upload_pairs, weight_product, weight_product_t,
};
use super::*;
use crate::gpu::ops::{self, HeadTargets, LoraGrads, LoraShape, Rotation, RowMove, SequenceShape};
use crate::gpu::{Buffer, Gpu, GpuError};
use crate::model::q8::QK8_0;

type GpuResult<T> = std::result::Result<T, GpuError>;

/// One block's activations from the forward, as its backward reads them (`[len, ..]` each).
struct Saved {
    /// The block's input (the residual stream), its attention norm, and the stream after attention.
    x: Buffer<f32>,
    n1: Buffer<f32>,
    x_mid: Buffer<f32>,
    n2: Buffer<f32>,
    /// The attention's and the MLP's outputs before their post-norms (Gemma 3).
    attn_raw: Option<Buffer<f32>>,
    mlp_raw: Option<Buffer<f32>>,
    /// Queries and keys before their q/k norms (architectures that have them).
    qk_raw: Option<(Buffer<f32>, Buffer<f32>)>,
    /// Queries and keys after RoPE, values, the attention probabilities `[heads, len, len]` and the context.
    q: Buffer<f32>,
    k: Buffer<f32>,
    v: Buffer<f32>,
    p: Buffer<f32>,
    ctx: Buffer<f32>,
    gate: Buffer<f32>,
    up: Buffer<f32>,
    act: Buffer<f32>,
    /// `x·Aᵀ` of each pair applied, in [`LoraTarget::ALL`]'s order.
    t: [Option<Buffer<f32>>; 7],
}

/// One sequence's forward: what its backward needs.
struct Forward {
    len: usize,
    blocks: Vec<Saved>,
    /// The stream after the last block.
    last: Buffer<f32>,
    /// The head over the scored positions; `None` when none is scored.
    head: Option<Head>,
    positions: Buffer<i32>,
}

/// The head's side of a forward: the scored positions' probabilities `[scored, vocab]`, their targets, and
/// which positions they are (on the device and here).
struct Head {
    probs: Buffer<f32>,
    targets: HeadTargets,
    idx: Buffer<i32>,
    scored: Vec<usize>,
}

/// Accumulated `dA` and `dB` of each pair of a block, in [`LoraTarget::ALL`]'s order.
type BlockGrads = [Option<(Buffer<f32>, Buffer<f32>)>; 7];

/// One pair's gradients: `a` is `dA` `[rank, in]`, `b` is `dB` `[out, rank]`.
#[derive(Debug, Clone)]
pub struct PairGradient {
    pub layer: usize,
    pub target: LoraTarget,
    pub a: Tensor,
    pub b: Tensor,
}

/// A LoRA set's training on the GPU over shared frozen weights; see the module doc.
pub struct GpuTrainer {
    model: Arc<GpuModel>,
    pairs: Vec<BlockPairs>,
    /// No pairs, for the base's own log-probabilities.
    none: Vec<BlockPairs>,
    grads: Vec<BlockGrads>,
    /// The norm weights' gradient, which nothing trains: room for the widest norm.
    dw: Buffer<f32>,
}

impl GpuTrainer {
    /// A trainer over `model`'s weights with no pairs yet ([`Self::set_adapter`]).
    pub fn new(model: Arc<GpuModel>) -> Result<Self> {
        let cfg = &model.config;
        let dw = model.gpu.zeros(cfg.hidden_size.max(cfg.head_dim))?;
        Ok(Self {
            pairs: (0..model.blocks.len())
                .map(|_| Default::default())
                .collect(),
            none: (0..model.blocks.len())
                .map(|_| Default::default())
                .collect(),
            grads: (0..model.blocks.len())
                .map(|_| Default::default())
                .collect(),
            dw,
            model,
        })
    }

    /// The weights this trainer runs over (a decoder over them samples on the same device).
    pub fn model(&self) -> &Arc<GpuModel> {
        &self.model
    }

    /// Uploads `lora`'s current values (the pairs a step differentiates) and zeroes the gradients. DoRA pairs
    /// are refused with the reason.
    pub fn set_adapter(&mut self, lora: Option<&LoraSet>) -> Result<()> {
        let gpu = &self.model.gpu;
        let (pairs, _) = upload_pairs(gpu, lora, self.model.blocks.len(), None)?;
        let mut grads = Vec::new();
        for block in &pairs {
            let mut g: BlockGrads = Default::default();
            for (i, pair) in block.iter().enumerate() {
                if let Some(p) = pair {
                    let (n, k) = proj_dims(&self.model.config, i);
                    g[i] = Some((gpu.zeros(p.rank * k)?, gpu.zeros(n * p.rank)?));
                }
            }
            grads.push(g);
        }
        self.pairs = pairs;
        self.grads = grads;
        Ok(())
    }

    /// `lp[t]`, position `t`'s weighted log-probability of its targets (0 where it has none), for `tokens`
    /// under the pairs set; `targets` has one entry per token.
    pub fn target_logps(&self, tokens: &[u32], targets: &Targets) -> Result<Vec<f32>> {
        let (lp, _) = self.forward(&self.pairs, tokens, targets)?;
        Ok(lp)
    }

    /// [`Self::target_logps`] of the base alone (no pairs applied), as a reference for the objectives that
    /// compare the two.
    pub fn base_logps(&self, tokens: &[u32], targets: &Targets) -> Result<Vec<f32>> {
        let (lp, _) = self.forward(&self.none, tokens, targets)?;
        Ok(lp)
    }

    /// Runs the forward over `tokens` and adds the gradient of `Σ d_lp[t] · lp[t]` to every pair's; returns
    /// the forward's `lp`.
    pub fn accumulate(
        &mut self,
        tokens: &[u32],
        targets: &Targets,
        d_lp: &[f32],
    ) -> Result<Vec<f32>> {
        if d_lp.len() != tokens.len() {
            return Err(ModelError::Input(format!(
                "gpu training: {} gradients for {} positions",
                d_lp.len(),
                tokens.len()
            )));
        }
        let (lp, fwd) = self.forward(&self.pairs, tokens, targets)?;
        self.backward(fwd, d_lp)?;
        Ok(lp)
    }

    /// The accumulated gradients per pair, in block then [`LoraTarget::ALL`] order; the accumulators start
    /// again from zero.
    pub fn take_gradients(&mut self) -> Result<Vec<PairGradient>> {
        let gpu = &self.model.gpu;
        let mut out = Vec::new();
        for (l, (grads, pairs)) in self.grads.iter().zip(&self.pairs).enumerate() {
            for (i, (g, p)) in grads.iter().zip(pairs).enumerate() {
                let (Some((da, db)), Some(p)) = (g, p) else {
                    continue;
                };
                let (n, k) = proj_dims(&self.model.config, i);
                let a = Tensor::from_vec(gpu.download(da)?, (p.rank, k), &Device::Cpu)?;
                let b = Tensor::from_vec(gpu.download(db)?, (n, p.rank), &Device::Cpu)?;
                gpu.write(da, &vec![0f32; p.rank * k])?;
                gpu.write(db, &vec![0f32; n * p.rank])?;
                out.push(PairGradient {
                    layer: l,
                    target: LoraTarget::ALL[i],
                    a,
                    b,
                });
            }
        }
        Ok(out)
    }

    fn forward(
        &self,
        pairs: &[BlockPairs],
        tokens: &[u32],
        targets: &Targets,
    ) -> Result<(Vec<f32>, Forward)> {
        let m = &self.model;
        let (gpu, cfg) = (&m.gpu, &m.config);
        let len = tokens.len();
        if len == 0 || len > m.capacity {
            return Err(unsupported(format!(
                "a training sequence of {len} positions (1..={} on this device)",
                m.capacity
            )));
        }
        if targets.len() != len {
            return Err(ModelError::Input(format!(
                "gpu training: {} targets for {len} positions",
                targets.len()
            )));
        }
        if let Some(t) = tokens.iter().find(|&&t| t as usize >= cfg.vocab_size) {
            return Err(ModelError::Input(format!(
                "token {t} is outside the vocabulary of {}",
                cfg.vocab_size
            )));
        }
        // The head projects only the scored positions, as the CPU's does: their rows are gathered first.
        let scored: Vec<usize> = (0..len).filter(|&i| !targets.at(i).0.is_empty()).collect();
        let mut offsets = vec![0usize];
        let (mut ids, mut weights) = (Vec::new(), Vec::new());
        for &i in &scored {
            let (t, w) = targets.at(i);
            ids.extend_from_slice(t);
            weights.extend_from_slice(w);
            offsets.push(ids.len());
        }
        let h = cfg.hidden_size;
        let x0 = m.embed_rows(tokens)?;
        let positions: Vec<i32> = (0..len as i32).collect();
        let positions = gpu.upload(&positions)?;
        let quant = Quant::new(gpu, cfg, len)?;
        let mut x = gpu.upload(&x0)?;
        let mut blocks = Vec::with_capacity(m.blocks.len());
        for (b, pairs) in m.blocks.iter().zip(pairs) {
            let (saved, next) = self.block_forward(b, pairs, &quant, x, &positions, len)?;
            blocks.push(saved);
            x = next;
        }
        let mut lp = vec![0f32; len];
        let head = match scored.len() {
            0 => None,
            rows => {
                let nf = gpu.zeros(len * h)?;
                ops::rms_norm(gpu, &x, &m.norm, &nf, (len, h), cfg.rms_eps)?;
                let idx: Vec<i32> = scored.iter().map(|&i| i as i32).collect();
                let idx = gpu.upload(&idx)?;
                let rows_nf = gpu.zeros(rows * h)?;
                ops::move_rows(gpu, RowMove::Gather, &nf, (&idx, &scored), &rows_nf, h)?;
                let probs = gpu.zeros(rows * cfg.vocab_size)?;
                quant.of(gpu, &rows_nf, (rows, h))?;
                let w = (m.head_type, &m.head);
                let shape = (rows, h, cfg.vocab_size);
                weight_product(gpu, w, quant.parts(), &rows_nf, &probs, shape)?;
                let targets = HeadTargets::new(gpu, &offsets, &ids, &weights, cfg.vocab_size)?;
                let rows_lp = gpu.zeros(rows)?;
                ops::head_logps(gpu, &probs, &targets, &rows_lp, cfg.vocab_size)?;
                for (&i, v) in scored.iter().zip(gpu.download(&rows_lp)?) {
                    lp[i] = v;
                }
                Some(Head {
                    probs,
                    targets,
                    idx,
                    scored,
                })
            }
        };
        gpu.synchronize()?;
        Ok((
            lp,
            Forward {
                len,
                blocks,
                last: x,
                head,
                positions,
            },
        ))
    }

    /// One block over the sequence in `x` (moved into what is saved); returns the saved activations and the
    /// block's output.
    fn block_forward(
        &self,
        b: &GpuBlock,
        pairs: &BlockPairs,
        quant: &Quant,
        x: Buffer<f32>,
        positions: &Buffer<i32>,
        len: usize,
    ) -> Result<(Saved, Buffer<f32>)> {
        let m = &self.model;
        let (gpu, cfg) = (&m.gpu, &m.config);
        let Dims {
            h,
            hd,
            ff,
            eps,
            nh,
            nkv,
            qd,
            kvd,
            shape,
        } = Dims::of(cfg, len);
        let zeros = |n: usize| gpu.zeros::<f32>(n);
        let mut t: [Option<Buffer<f32>>; 7] = Default::default();
        let mut project = |target: LoraTarget,
                           input: &Buffer<f32>,
                           y: &Buffer<f32>,
                           (k, n): (usize, usize)|
         -> GpuResult<()> {
            let i = slot(target);
            let w = (b.types[i], &b.proj[i]);
            weight_product(gpu, w, quant.parts(), input, y, (len, k, n))?;
            if let Some(l) = &pairs[i] {
                let ti = zeros(len * l.rank)?;
                let s = LoraShape {
                    m: len,
                    k,
                    rank: l.rank,
                    n,
                };
                ops::lora_forward(gpu, input, &l.a, &l.b, &ti, y, s, l.scale)?;
                t[i] = Some(ti);
            }
            Ok(())
        };
        let n1 = zeros(len * h)?;
        ops::rms_norm(gpu, &x, &b.attn_norm, &n1, (len, h), eps)?;
        quant.of(gpu, &n1, (len, h))?;
        let (q, k, v) = (zeros(len * qd)?, zeros(len * kvd)?, zeros(len * kvd)?);
        project(LoraTarget::Q, &n1, &q, (h, qd))?;
        project(LoraTarget::K, &n1, &k, (h, kvd))?;
        project(LoraTarget::V, &n1, &v, (h, kvd))?;
        if let Some([bq, bk, bv]) = &b.bias {
            ops::add_rows(gpu, &q, bq, (len, qd))?;
            ops::add_rows(gpu, &k, bk, (len, kvd))?;
            ops::add_rows(gpu, &v, bv, (len, kvd))?;
        }
        let (q, k, qk_raw) = match &b.qk_norm {
            Some((qn, kn)) => {
                let (qo, ko) = (zeros(len * qd)?, zeros(len * kvd)?);
                ops::rms_norm(gpu, &q, qn, &qo, (len * nh, hd), eps)?;
                ops::rms_norm(gpu, &k, kn, &ko, (len * nkv, hd), eps)?;
                (qo, ko, Some((q, k)))
            }
            None => (q, k, None),
        };
        let (cos, sin) = m.rope_tables(b);
        for (buf, heads) in [(&q, nh), (&k, nkv)] {
            ops::rope(
                gpu,
                buf,
                cos,
                sin,
                positions,
                (len, heads, hd),
                m.interleaved,
                Rotation::Forward,
            )?;
        }
        let scale = m.attention_scale();
        let p = zeros(nh * len * len)?;
        ops::attention_scores(gpu, &q, &k, &p, shape, scale)?;
        ops::softmax_rows(gpu, &p, &p, (nh * len, len), true)?;
        let ctx = zeros(len * qd)?;
        ops::attention_context(gpu, &p, &v, &ctx, shape)?;
        quant.of(gpu, &ctx, (len, qd))?;
        // Gemma normalises each half's output before its residual add: the projection then writes a raw buffer,
        // kept for the backward, which the post-norm reads into the half's output.
        let (post_attn, post_ffw) = match &b.post_norms {
            Some((a, f)) => (Some(a), Some(f)),
            None => (None, None),
        };
        let raw_for = |post: Option<&Buffer<f32>>| post.map(|_| zeros(len * h)).transpose();
        let x_mid = zeros(len * h)?;
        let attn_raw = raw_for(post_attn)?;
        project(
            LoraTarget::O,
            &ctx,
            attn_raw.as_ref().unwrap_or(&x_mid),
            (qd, h),
        )?;
        if let (Some(raw), Some(w)) = (&attn_raw, post_attn) {
            ops::rms_norm(gpu, raw, w, &x_mid, (len, h), eps)?;
        }
        ops::add_into(gpu, &x_mid, &x, len * h)?;
        let n2 = zeros(len * h)?;
        ops::rms_norm(gpu, &x_mid, &b.ffn_norm, &n2, (len, h), eps)?;
        quant.of(gpu, &n2, (len, h))?;
        let (gate, up, act) = (zeros(len * ff)?, zeros(len * ff)?, zeros(len * ff)?);
        project(LoraTarget::Gate, &n2, &gate, (h, ff))?;
        project(LoraTarget::Up, &n2, &up, (h, ff))?;
        if cfg.arch.gelu_mlp() {
            ops::gelu_mul(gpu, &gate, &up, &act, len * ff)?;
        } else {
            ops::silu_mul(gpu, &gate, &up, &act, len * ff)?;
        }
        quant.of(gpu, &act, (len, ff))?;
        let out = zeros(len * h)?;
        let mlp_raw = raw_for(post_ffw)?;
        project(
            LoraTarget::Down,
            &act,
            mlp_raw.as_ref().unwrap_or(&out),
            (ff, h),
        )?;
        if let (Some(raw), Some(w)) = (&mlp_raw, post_ffw) {
            ops::rms_norm(gpu, raw, w, &out, (len, h), eps)?;
        }
        ops::add_into(gpu, &out, &x_mid, len * h)?;
        Ok((
            Saved {
                x,
                n1,
                x_mid,
                n2,
                attn_raw,
                mlp_raw,
                qk_raw,
                q,
                k,
                v,
                p,
                ctx,
                gate,
                up,
                act,
                t,
            },
            out,
        ))
    }

    fn backward(&mut self, f: Forward, d_lp: &[f32]) -> Result<()> {
        let m = self.model.clone();
        let (gpu, cfg) = (&m.gpu, &m.config);
        let (len, h) = (f.len, cfg.hidden_size);
        // Nothing scored: nothing to differentiate.
        let Some(head) = &f.head else {
            return Ok(());
        };
        let rows = head.scored.len();
        let rows_dlp: Vec<f32> = head.scored.iter().map(|&i| d_lp[i]).collect();
        let dlp = gpu.upload(&rows_dlp)?;
        ops::head_logps_backward(gpu, &head.probs, &head.targets, &dlp, cfg.vocab_size)?;
        let rows_dnf = gpu.zeros(rows * h)?;
        let w = (m.head_type, &m.head);
        weight_product_t(gpu, w, &head.probs, &rows_dnf, (rows, h, cfg.vocab_size))?;
        let dnf = gpu.zeros(len * h)?;
        let idx = (&head.idx, head.scored.as_slice());
        ops::move_rows(gpu, RowMove::Scatter, &rows_dnf, idx, &dnf, h)?;
        let dx = gpu.zeros(len * h)?;
        ops::rms_norm_backward(
            gpu,
            &f.last,
            &m.norm,
            &dnf,
            &dx,
            &self.dw,
            (len, h),
            cfg.rms_eps,
        )?;
        for (l, saved) in f.blocks.into_iter().enumerate().rev() {
            self.block_backward(l, saved, &dx, &f.positions, len)?;
        }
        gpu.synchronize()?;
        Ok(())
    }

    /// Takes `dx`, the gradient at block `l`'s output, to its input, adding the block's pairs' gradients.
    fn block_backward(
        &self,
        l: usize,
        s: Saved,
        dx: &Buffer<f32>,
        positions: &Buffer<i32>,
        len: usize,
    ) -> Result<()> {
        let m = &self.model;
        let (gpu, cfg) = (&m.gpu, &m.config);
        let Dims {
            h,
            hd,
            ff,
            eps,
            nh,
            nkv,
            qd,
            kvd,
            shape,
        } = Dims::of(cfg, len);
        let b = &m.blocks[l];
        let zeros = |n: usize| gpu.zeros::<f32>(n);
        // The product's input gradient into `d_in` (added to it when `add`), and the pair's gradients.
        let back = |target: LoraTarget,
                    input: &Buffer<f32>,
                    dy: &Buffer<f32>,
                    d_in: &Buffer<f32>,
                    add: bool|
         -> GpuResult<()> {
            let i = slot(target);
            let (n, k) = proj_dims(cfg, i);
            let w = (b.types[i], &b.proj[i]);
            if add {
                let tmp = zeros(len * k)?;
                weight_product_t(gpu, w, dy, &tmp, (len, k, n))?;
                ops::add_into(gpu, d_in, &tmp, len * k)?;
            } else {
                weight_product_t(gpu, w, dy, d_in, (len, k, n))?;
            }
            if let (Some(p), Some(t), Some((acc_a, acc_b))) =
                (&self.pairs[l][i], &s.t[i], &self.grads[l][i])
            {
                let (da, db) = (zeros(p.rank * k)?, zeros(n * p.rank)?);
                let shape = LoraShape {
                    m: len,
                    k,
                    rank: p.rank,
                    n,
                };
                let grads = LoraGrads {
                    da: &da,
                    db: &db,
                    dx: d_in,
                };
                ops::lora_backward(gpu, input, &p.a, &p.b, t, dy, grads, shape, p.scale)?;
                ops::add_into(gpu, acc_a, &da, p.rank * k)?;
                ops::add_into(gpu, acc_b, &db, n * p.rank)?;
            }
            // The temporaries are freed on return: wait for the kernels that read them.
            gpu.synchronize()
        };
        let norm_back =
            |x: &Buffer<f32>, w: &Buffer<f32>, dy: &Buffer<f32>, rows: (usize, usize)| {
                let d = zeros(rows.0 * rows.1)?;
                ops::rms_norm_backward(gpu, x, w, dy, &d, &self.dw, rows, eps)?;
                GpuResult::Ok(d)
            };
        // The MLP: out = x_mid + post_ffw(down(act(gate(n2)) · up(n2))), the post-norm Gemma's only.
        let d_down = match (&s.mlp_raw, &b.post_norms) {
            (Some(raw), Some((_, post_ffw))) => Some(norm_back(raw, post_ffw, dx, (len, h))?),
            _ => None,
        };
        let dact = zeros(len * ff)?;
        back(
            LoraTarget::Down,
            &s.act,
            d_down.as_ref().unwrap_or(dx),
            &dact,
            false,
        )?;
        let (dgate, dup) = (zeros(len * ff)?, zeros(len * ff)?);
        if cfg.arch.gelu_mlp() {
            ops::gelu_mul_backward(gpu, &s.gate, &s.up, &dact, (&dgate, &dup), len * ff)?;
        } else {
            ops::silu_mul_backward(gpu, &s.gate, &s.up, &dact, (&dgate, &dup), len * ff)?;
        }
        let dn2 = zeros(len * h)?;
        back(LoraTarget::Gate, &s.n2, &dgate, &dn2, false)?;
        back(LoraTarget::Up, &s.n2, &dup, &dn2, true)?;
        let d = norm_back(&s.x_mid, &b.ffn_norm, &dn2, (len, h))?;
        ops::add_into(gpu, dx, &d, len * h)?;
        // Attention: x_mid = x + post_attn(o(attention(q, k, v))).
        let d_o = match (&s.attn_raw, &b.post_norms) {
            (Some(raw), Some((post_attn, _))) => Some(norm_back(raw, post_attn, dx, (len, h))?),
            _ => None,
        };
        let dctx = zeros(len * qd)?;
        back(
            LoraTarget::O,
            &s.ctx,
            d_o.as_ref().unwrap_or(dx),
            &dctx,
            false,
        )?;
        let ns = nh * len * len;
        let (dp, ds) = (zeros(ns)?, zeros(ns)?);
        ops::attention_grad_probs(gpu, &dctx, &s.v, &dp, shape)?;
        ops::softmax_backward(gpu, &s.p, &dp, &ds, (nh * len, len))?;
        let scale = m.attention_scale();
        let (dq, dk, dv) = (zeros(len * qd)?, zeros(len * kvd)?, zeros(len * kvd)?);
        ops::attention_grad_q(gpu, &ds, &s.k, &dq, shape, scale)?;
        ops::attention_grad_kv(gpu, (&ds, &s.p), (&s.q, &dctx), (&dk, &dv), shape, scale)?;
        let (cos, sin) = m.rope_tables(b);
        for (buf, heads) in [(&dq, nh), (&dk, nkv)] {
            ops::rope(
                gpu,
                buf,
                cos,
                sin,
                positions,
                (len, heads, hd),
                m.interleaved,
                Rotation::Inverse,
            )?;
        }
        // Buffers are freed only at the end of this function, after the synchronize: kernels may still read
        // them until then.
        let (dq, dk) = match (&s.qk_raw, &b.qk_norm) {
            (Some((q_raw, k_raw)), Some((qn, kn))) => (
                norm_back(q_raw, qn, &dq, (len * nh, hd))?,
                norm_back(k_raw, kn, &dk, (len * nkv, hd))?,
            ),
            _ => (dq, dk),
        };
        let dn1 = zeros(len * h)?;
        back(LoraTarget::Q, &s.n1, &dq, &dn1, false)?;
        back(LoraTarget::K, &s.n1, &dk, &dn1, true)?;
        back(LoraTarget::V, &s.n1, &dv, &dn1, true)?;
        let d = norm_back(&s.x, &b.attn_norm, &dn1, (len, h))?;
        ops::add_into(gpu, dx, &d, len * h)?;
        gpu.synchronize()?;
        Ok(())
    }
}

/// A block's widths over a sequence of `len` positions.
struct Dims {
    h: usize,
    hd: usize,
    ff: usize,
    eps: f32,
    nh: usize,
    nkv: usize,
    qd: usize,
    kvd: usize,
    shape: SequenceShape,
}

impl Dims {
    fn of(cfg: &ModelConfig, len: usize) -> Self {
        let (hd, nh, nkv) = (cfg.head_dim, cfg.num_heads, cfg.num_kv_heads);
        Self {
            h: cfg.hidden_size,
            hd,
            ff: cfg.intermediate_size,
            eps: cfg.rms_eps,
            nh,
            nkv,
            qd: nh * hd,
            kvd: nkv * hd,
            shape: SequenceShape {
                len,
                heads: nh,
                kv_heads: nkv,
                head_dim: hd,
            },
        }
    }
}

/// `(out, in)` of the projection at `i` in [`LoraTarget::ALL`]'s order.
fn proj_dims(cfg: &ModelConfig, i: usize) -> (usize, usize) {
    let (h, ff) = (cfg.hidden_size, cfg.intermediate_size);
    let (qd, kvd) = (
        cfg.num_heads * cfg.head_dim,
        cfg.num_kv_heads * cfg.head_dim,
    );
    match LoraTarget::ALL[i] {
        LoraTarget::Q => (qd, h),
        LoraTarget::K | LoraTarget::V => (kvd, h),
        LoraTarget::O => (h, qd),
        LoraTarget::Gate | LoraTarget::Up => (ff, h),
        LoraTarget::Down => (h, ff),
    }
}

/// The int8 input of the next frozen products, for the widest input of the sequence.
struct Quant {
    q: Buffer<i8>,
    d: Buffer<f32>,
}

impl Quant {
    fn new(gpu: &Gpu, cfg: &ModelConfig, len: usize) -> GpuResult<Self> {
        let widest = cfg
            .hidden_size
            .max(cfg.num_heads * cfg.head_dim)
            .max(cfg.intermediate_size);
        Ok(Self {
            q: gpu.zeros(len * widest)?,
            d: gpu.zeros(len * widest.div_ceil(QK8_0))?,
        })
    }

    /// Quantizes `x` `[rows, k]` for the products that follow.
    fn of(&self, gpu: &Gpu, x: &Buffer<f32>, shape: (usize, usize)) -> GpuResult<()> {
        ops::quantize_q8(gpu, x, &self.q, &self.d, shape)
    }

    fn parts(&self) -> (&Buffer<i8>, &Buffer<f32>) {
        (&self.q, &self.d)
    }
}
