//! The owned forward of the llama, qwen2, qwen3, phi3 and gemma3 architectures.
//!
//! Weights are immutable after load and shared (`Arc<QTensor>`, `Arc<PanelWeights>`, cheap `Tensor` clones),
//! so one [`Transformer`] serves many requests at once; each request owns its [`KvCache`] and passes the
//! [`LoraSet`] it started with (or none). Adapters are applied unmerged,
//! `y = W·x + scale·B·(A·x)`, so swapping an adapter never touches the base weights.
//!
//! Two op flavours share one code path: serving uses candle-nn's fused kernels (no backward), while
//! [`Transformer::forward_train`] uses differentiable equivalents (`train_ops`, and the head's log-softmax in
//! `head`). Quantized matmuls go through `QMatMulGrad`, whose backward multiplies by the weight (Q8_0 and the
//! types of `q8::kquant`: its requantized transpose, in int8; other types: the dequantized weight), so LoRA
//! parameters receive gradients through frozen quantized layers (plain `QMatMul` silently drops them). In
//! training, an int8 projection and its LoRA pair are one node (`lora_linear`), whose backward computes `dx`, `dA` and `dB` itself,
//! and so is the attention core between the projections (`attention_train`).

use std::sync::Arc;

use candle_core::quantized::{GgmlDType, QTensor};
use candle_core::{DType, Device, Tensor};

use super::gguf::{Arch, GgufFile, ModelConfig};
use super::huge_pages::HugePageReport;
use super::lora::{LoraPair, LoraSet, LoraTarget};
use super::{ModelError, Result};

mod attention_decode;
mod attention_train;
mod decode;
mod f32_gemm;
mod gpu_decode;
mod gpu_train;
pub use gpu_decode::{DeviceStatus, GpuDecoder, GpuModel};
pub use gpu_train::{GpuTrainer, PairGradient};
mod head;
pub use head::Targets;
mod kv_cache;
mod lora_linear;
mod lora_rows;
mod qlinear;
mod rope;
mod train_ops;
mod weight;

use attention_decode::decode_attention;
pub use kv_cache::{KvCache, KvPrecision};
pub(crate) use lora_rows::DecodeFactors;
pub use qlinear::QLinear;
pub use rope::MAX_POSITIONS;
use rope::Rope;
pub use weight::{
    DEFAULT_TRANSPOSE_LIMIT, Weight, set_transpose_cache_limit, transpose_cache_bytes,
};

/// Runs `f` on the contiguous f32 CPU data of `t`, or returns `None` when `t` is not such a tensor.
fn with_f32_slice<R>(t: &Tensor, f: impl FnOnce(&[f32]) -> R) -> Option<R> {
    if t.dtype() != DType::F32 || !t.is_contiguous() {
        return None;
    }
    let (storage, layout) = t.storage_and_layout();
    match &*storage {
        candle_core::Storage::Cpu(cpu) => {
            let s = cpu.as_slice::<f32>().ok()?;
            let start = layout.start_offset();
            s.get(start..start + t.elem_count()).map(f)
        }
        _ => None,
    }
}

fn rms_norm(x: &Tensor, w: &Tensor, eps: f32, train: bool) -> Result<Tensor> {
    Ok(if train {
        train_ops::rms_norm(x, w, eps)?
    } else {
        candle_nn::ops::rms_norm(&x.contiguous()?, w, eps)?
    })
}

/// One decoder block.
#[derive(Clone, Debug)]
pub struct Block {
    attn_norm: Tensor,
    ffn_norm: Tensor,
    q_norm: Option<Tensor>,
    k_norm: Option<Tensor>,
    /// Gemma 3's norms of the attention and MLP outputs, before each is added to the residual stream.
    post_attn_norm: Option<Tensor>,
    post_ffw_norm: Option<Tensor>,
    /// Qwen2's biases on the q/k/v projections (f32 vectors), added outside any LoRA delta: an adapter changes
    /// the weight, not the bias, as in PEFT.
    bias: Option<QkvBias>,
    q: QLinear,
    k: QLinear,
    v: QLinear,
    o: QLinear,
    gate: QLinear,
    up: QLinear,
    down: QLinear,
}

impl Block {
    /// The linear layer a LoRA target adapts.
    pub fn linear(&self, t: LoraTarget) -> &QLinear {
        match t {
            LoraTarget::Q => &self.q,
            LoraTarget::K => &self.k,
            LoraTarget::V => &self.v,
            LoraTarget::O => &self.o,
            LoraTarget::Gate => &self.gate,
            LoraTarget::Up => &self.up,
            LoraTarget::Down => &self.down,
        }
    }

    fn linear_mut(&mut self, t: LoraTarget) -> &mut QLinear {
        match t {
            LoraTarget::Q => &mut self.q,
            LoraTarget::K => &mut self.k,
            LoraTarget::V => &mut self.v,
            LoraTarget::O => &mut self.o,
            LoraTarget::Gate => &mut self.gate,
            LoraTarget::Up => &mut self.up,
            LoraTarget::Down => &mut self.down,
        }
    }
}

/// The q/k/v projection biases of one block.
#[derive(Clone, Debug)]
struct QkvBias {
    q: Tensor,
    k: Tensor,
    v: Tensor,
}

/// Which positions get logits.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Logits {
    All,
    Last,
    /// No logits: the final norm's output, for [`head::target_logps`].
    Hidden,
    /// No logits, no final norm: the residual stream after each block `n` whose bit `n` is set,
    /// stacked; the forward stops after the last of them.
    Residual(u64),
}

/// A loaded model: configuration plus frozen weights.
#[derive(Clone, Debug)]
pub struct Transformer {
    config: ModelConfig,
    embed: Weight,
    blocks: Vec<Block>,
    norm: Tensor,
    head: QLinear,
    rope: Rope,
    /// Gemma 3's tables for its sliding-window layers (see [`ModelConfig::is_sliding_layer`]).
    rope_sliding: Option<Rope>,
    kv_precision: KvPrecision,
    /// What the OS did with the weights' pages at load.
    huge_pages: HugePageReport,
}

fn norm_tensor(g: &mut GgufFile, name: &str, n: usize) -> Result<Tensor> {
    let q = g.tensor(name, Some(&[n]))?;
    Ok(q.dequantize(&Device::Cpu)?)
}

/// Llama 3.x's `rope_freqs.weight`, if the file has one: a divisor per RoPE frequency, checked to be finite and
/// positive so that a corrupt file fails at load instead of serving NaNs.
fn rope_freq_factors(g: &mut GgufFile, half: usize) -> Result<Option<Vec<f32>>> {
    const NAME: &str = "rope_freqs.weight";
    if !g.has_tensor(NAME) {
        return Ok(None);
    }
    let f = norm_tensor(g, NAME, half)?.to_vec1::<f32>()?;
    if let Some(bad) = f.iter().find(|x| !(x.is_finite() && **x > 0.0)) {
        return Err(ModelError::BadTensor {
            name: NAME.into(),
            reason: format!("frequency factor {bad} is not finite and positive"),
        });
    }
    Ok(Some(f))
}

/// Splits a matrix by rows into consecutive parts of `rows` rows each (Phi-3's fused q/k/v and gate/up): a row of a
/// block-quantized matrix is whole blocks, so each part is a byte range of the original.
fn split_rows(q: &QTensor, name: &str, rows: &[usize]) -> Result<Vec<QLinear>> {
    let dims = q.shape().dims();
    let (total, cols) = (dims[0], dims[1]);
    if rows.iter().sum::<usize>() != total {
        return Err(ModelError::BadTensor {
            name: name.into(),
            reason: format!("{total} rows do not split into {rows:?}"),
        });
    }
    let data = q.data()?;
    let row_bytes = data.len() / total;
    let mut start = 0;
    rows.iter()
        .map(|&n| {
            let bytes = &data[start * row_bytes..(start + n) * row_bytes];
            start += n;
            let part = candle_core::quantized::ggml_file::qtensor_from_ggml(
                q.dtype(),
                bytes,
                vec![n, cols],
                &Device::Cpu,
            )?;
            QLinear::from_qtensor(Arc::new(part))
        })
        .collect()
}

impl Transformer {
    /// Loads a llama, qwen2, qwen3, phi3 or gemma3 GGUF, checking every tensor's shape against the metadata.
    pub fn from_gguf(path: impl AsRef<std::path::Path>) -> Result<Self> {
        let mut g = GgufFile::open(path)?;
        Self::from_gguf_file(&mut g)
    }

    pub fn from_gguf_file(g: &mut GgufFile) -> Result<Self> {
        Self::from_gguf_file_with(g, super::Requantize::Off)
    }

    /// [`Self::from_gguf_file`], re-encoding the weights as `requantize` says (see [`Self::requantized`];
    /// the file's weights and their re-encoded copy are both held for a moment).
    pub fn from_gguf_file_with(g: &mut GgufFile, requantize: super::Requantize) -> Result<Self> {
        let cfg = ModelConfig::from_gguf(&g.content)?;
        let (h, q, kv, ff) = (
            cfg.hidden_size,
            cfg.q_dim(),
            cfg.kv_dim(),
            cfg.intermediate_size,
        );
        let embed_q = g.tensor("token_embd.weight", Some(&[cfg.vocab_size, h]))?;
        let head = if cfg.tied_embeddings {
            QLinear::from_qtensor(embed_q.clone())?
        } else {
            QLinear::from_qtensor(g.tensor("output.weight", Some(&[cfg.vocab_size, h]))?)?
        };
        let embed = match (embed_q.dtype(), &head.weight) {
            (GgmlDType::F32 | GgmlDType::F16 | GgmlDType::BF16, _) => {
                Weight::Dense(embed_q.dequantize(&Device::Cpu)?)
            }
            // A tied table repacked for the head serves lookups too, rather than being held twice.
            (_, Weight::Panels(p)) if cfg.tied_embeddings => Weight::Panels(p.clone()),
            _ => Weight::Quant(embed_q),
        };
        // No with_capacity: a corrupt block_count must fail on the first missing tensor, not abort.
        let mut blocks = Vec::new();
        for l in 0..cfg.num_layers {
            let p = format!("blk.{l}");
            let lin = |g: &mut GgufFile, name: &str, out: usize, inp: usize| -> Result<QLinear> {
                QLinear::from_qtensor(g.tensor(&format!("{p}.{name}.weight"), Some(&[out, inp]))?)
            };
            let qkv_name = format!("{p}.attn_qkv.weight");
            let (qw, kw, vw) = if g.has_tensor(&qkv_name) {
                let fused = g.tensor(&qkv_name, Some(&[q + 2 * kv, h]))?;
                let [qw, kw, vw]: [QLinear; 3] = split_rows(&fused, &qkv_name, &[q, kv, kv])?
                    .try_into()
                    .map_err(|_| ModelError::BadTensor {
                        name: qkv_name.clone(),
                        reason: "not three parts".into(),
                    })?;
                (qw, kw, vw)
            } else {
                (
                    lin(g, "attn_q", q, h)?,
                    lin(g, "attn_k", kv, h)?,
                    lin(g, "attn_v", kv, h)?,
                )
            };
            let ow = lin(g, "attn_output", h, q)?;
            let (gw, uw) = if cfg.arch == Arch::Phi3 {
                // Gate rows first, as llama.cpp's SwiGLU on a fused `ffn_up` reads them.
                let name = format!("{p}.ffn_up.weight");
                let fused = g.tensor(&name, Some(&[2 * ff, h]))?;
                let [gw, uw]: [QLinear; 2] = split_rows(&fused, &name, &[ff, ff])?
                    .try_into()
                    .map_err(|_| ModelError::BadTensor {
                        name: name.clone(),
                        reason: "not two parts".into(),
                    })?;
                (gw, uw)
            } else {
                (lin(g, "ffn_gate", ff, h)?, lin(g, "ffn_up", ff, h)?)
            };
            let dw = lin(g, "ffn_down", h, ff)?;
            let (q_norm, k_norm) = if cfg.qk_norm {
                (
                    Some(norm_tensor(
                        g,
                        &format!("{p}.attn_q_norm.weight"),
                        cfg.head_dim,
                    )?),
                    Some(norm_tensor(
                        g,
                        &format!("{p}.attn_k_norm.weight"),
                        cfg.head_dim,
                    )?),
                )
            } else {
                (None, None)
            };
            // Biases are loaded wherever the file has them (Qwen2 always does; some Llama-family files too), and
            // then all three must be there.
            let bias = if g.has_tensor(&format!("{p}.attn_q.bias")) {
                Some(QkvBias {
                    q: norm_tensor(g, &format!("{p}.attn_q.bias"), q)?,
                    k: norm_tensor(g, &format!("{p}.attn_k.bias"), kv)?,
                    v: norm_tensor(g, &format!("{p}.attn_v.bias"), kv)?,
                })
            } else if cfg.arch == Arch::Qwen2 {
                return Err(ModelError::MissingTensor {
                    name: format!("{p}.attn_q.bias"),
                });
            } else {
                None
            };
            let (post_attn_norm, post_ffw_norm) = if cfg.arch == Arch::Gemma3 {
                (
                    Some(norm_tensor(
                        g,
                        &format!("{p}.post_attention_norm.weight"),
                        h,
                    )?),
                    Some(norm_tensor(g, &format!("{p}.post_ffw_norm.weight"), h)?),
                )
            } else {
                (None, None)
            };
            blocks.push(Block {
                bias,
                post_attn_norm,
                post_ffw_norm,
                attn_norm: norm_tensor(g, &format!("{p}.attn_norm.weight"), h)?,
                ffn_norm: norm_tensor(g, &format!("{p}.ffn_norm.weight"), h)?,
                q_norm,
                k_norm,
                q: qw,
                k: kw,
                v: vw,
                o: ow,
                gate: gw,
                up: uw,
                down: dw,
            });
        }
        let norm = norm_tensor(g, "output_norm.weight", h)?;
        let freq_factors = rope_freq_factors(g, cfg.head_dim / 2)?;
        let rope = Rope::new(&cfg, freq_factors.as_deref())?;
        let rope_sliding = Rope::sliding(&cfg)?;
        let mut model = Self {
            config: cfg,
            embed,
            blocks,
            norm,
            head,
            rope,
            rope_sliding,
            kv_precision: KvPrecision::default(),
            huge_pages: HugePageReport::default(),
        };
        if requantize == super::Requantize::Q8_0 {
            model = model.requantized(GgmlDType::Q8_0)?;
        }
        if std::env::var("HEARTH_HUGE_PAGES").as_deref() != Ok("off") {
            model.huge_pages = model.collapse_weights_into_huge_pages()?;
        }
        Ok(model)
    }

    /// Puts the packed weights a decode step streams onto huge pages where the OS allows it (see
    /// [`super::huge_pages`]). `HEARTH_HUGE_PAGES=off` leaves them where they are, so that a benchmark can
    /// compare the two in one build.
    fn collapse_weights_into_huge_pages(&self) -> Result<HugePageReport> {
        let mut packed = Vec::new();
        let linears = self
            .blocks
            .iter()
            .flat_map(|b| LoraTarget::ALL.iter().map(|&t| b.linear(t)))
            .chain([&self.head]);
        for w in linears.map(QLinear::weight).chain([&self.embed]) {
            match w {
                Weight::Quant(q) => packed.push(q.data()?),
                Weight::Panels(p) => packed.push(std::borrow::Cow::Borrowed(p.bytes())),
                Weight::Dense(_) => {}
            }
        }
        let buffers: Vec<&[u8]> = packed.iter().map(|d| &d[..]).collect();
        let report = super::huge_pages::collapse_into_huge_pages(&buffers);
        tracing::debug!(?report, "weights on huge pages");
        Ok(report)
    }

    /// How many of the weights' 2 MiB chunks the OS moved onto huge pages at load, and how many it refused.
    pub fn huge_pages(&self) -> HugePageReport {
        self.huge_pages
    }

    /// The RoPE tables layer `layer` uses.
    fn rope_for(&self, layer: usize) -> &Rope {
        match &self.rope_sliding {
            Some(r) if self.config.is_sliding_layer(layer) => r,
            _ => &self.rope,
        }
    }

    /// The factor token embeddings are multiplied by on input (Gemma: `sqrt(hidden)`), if any.
    fn embed_scale(&self) -> Option<f32> {
        (self.config.arch == Arch::Gemma3).then(|| (self.config.hidden_size as f32).sqrt())
    }

    pub fn config(&self) -> &ModelConfig {
        &self.config
    }

    /// Longest sequence this instance serves: [`ModelConfig::max_positions`].
    pub fn max_positions(&self) -> usize {
        self.rope.cos.dim(0).unwrap_or(0)
    }

    /// Bytes of weights one decode step reads: every projection of every block and the output head (the
    /// embedding row and the norms are noise next to them). Divided into a measured read bandwidth, it bounds
    /// decode tokens/s.
    pub fn decode_read_bytes(&self) -> usize {
        let bytes = |l: &QLinear| match l.weight() {
            Weight::Quant(q) => q.storage_size_in_bytes(),
            Weight::Panels(p) => p.bytes().len(),
            Weight::Dense(t) => t.elem_count() * t.dtype().size_in_bytes(),
        };
        let per_block: usize = self
            .blocks
            .iter()
            .map(|b| {
                LoraTarget::ALL
                    .iter()
                    .map(|&t| bytes(b.linear(t)))
                    .sum::<usize>()
            })
            .sum();
        per_block + bytes(&self.head)
    }

    /// Bytes of weight transposes this model keeps for training's backward passes (see
    /// [`set_transpose_cache_limit`]).
    pub fn transposed_bytes(&self) -> usize {
        self.blocks
            .iter()
            .flat_map(|b| LoraTarget::ALL.map(|t| b.linear(t).transposed.kept()))
            .sum::<usize>()
            + self.head.transposed.kept()
    }

    pub fn blocks(&self) -> &[Block] {
        &self.blocks
    }

    /// A fresh cache sized for this model, in the precision it was given (see [`Self::with_kv_precision`]).
    pub fn new_cache(&self) -> KvCache {
        KvCache::new(&self.config, self.kv_precision)
    }

    /// This model with caches made by [`Self::new_cache`] (and so by [`super::generate`]) in `precision`.
    pub fn with_kv_precision(mut self, precision: KvPrecision) -> Self {
        self.kv_precision = precision;
        self
    }

    pub fn kv_precision(&self) -> KvPrecision {
        self.kv_precision
    }

    /// A copy with every block-quantized weight re-encoded as `dtype` (e.g. Q8_0: candle's Q4_1 CPU
    /// kernel is slower than Q8_0's at the same model). Weights whose row length is not a multiple of
    /// the block size are kept as they are.
    pub fn requantized(&self, dtype: GgmlDType) -> Result<Self> {
        let re = |w: &Weight| -> Result<Weight> {
            let (from, cols) = match w {
                Weight::Quant(q) => (q.dtype(), q.shape().dims().last().copied().unwrap_or(0)),
                Weight::Panels(p) => (p.dtype(), p.k()),
                Weight::Dense(_) => return Ok(w.clone()),
            };
            if from == dtype || !cols.is_multiple_of(dtype.block_size()) {
                return Ok(w.clone());
            }
            Weight::packed(Arc::new(QTensor::quantize(&w.dequantize()?, dtype)?))
        };
        let mut m = self.clone();
        let tied_same = match (&m.embed, &m.head.weight) {
            (Weight::Quant(a), Weight::Quant(b)) => Arc::ptr_eq(a, b),
            (Weight::Panels(a), Weight::Panels(b)) => Arc::ptr_eq(a, b),
            _ => false,
        };
        m.embed = re(&m.embed)?;
        let head = if tied_same {
            m.embed.clone()
        } else {
            re(&m.head.weight)?
        };
        m.head.set_weight(head);
        for b in &mut m.blocks {
            for t in LoraTarget::ALL {
                let lin = b.linear_mut(t);
                let w = re(&lin.weight)?;
                lin.set_weight(w);
            }
        }
        Ok(m)
    }

    /// A copy with every linear layer dense f32 and `lora` (if any) merged as `W + scale·B·A`.
    /// The exact reference for unmerged adapters, and the basis of merged exports.
    pub fn merged(&self, lora: Option<&LoraSet>) -> Result<Self> {
        let mut m = self.clone();
        for (l, b) in m.blocks.iter_mut().enumerate() {
            for t in LoraTarget::ALL {
                let lin = b.linear_mut(t);
                let mut w = lin.dequantize()?;
                if let Some(p) = lora.and_then(|s| s.get(l, t)) {
                    let factor = p.dora_factor(&w)?;
                    w = (w + p.delta()?)?;
                    if let Some(f) = factor {
                        w = w.broadcast_mul(&f.unsqueeze(1)?)?;
                    }
                }
                *lin = QLinear::from_dense(w)?;
            }
        }
        m.head = QLinear::from_dense(m.head.dequantize()?)?;
        Ok(m)
    }

    /// Logits for every position, `[b, l, vocab]`. `tokens: [b, l]` (u32); with a cache, positions
    /// continue from `cache.len()` and the new keys/values are appended.
    pub fn forward(
        &self,
        tokens: &Tensor,
        cache: Option<&mut KvCache>,
        lora: Option<&LoraSet>,
    ) -> Result<Tensor> {
        self.run(tokens, cache, lora, false, Logits::All)
    }

    /// Logits for the last position only, `[b, vocab]`: what decoding needs, without projecting
    /// every prompt position onto the vocabulary.
    pub fn forward_last(
        &self,
        tokens: &Tensor,
        cache: Option<&mut KvCache>,
        lora: Option<&LoraSet>,
    ) -> Result<Tensor> {
        Ok(self
            .run(tokens, cache, lora, false, Logits::Last)?
            .squeeze(1)?)
    }

    /// Differentiable forward for training: same math with backward-capable ops, no cache.
    pub fn forward_train(&self, tokens: &Tensor, lora: Option<&LoraSet>) -> Result<Tensor> {
        self.run(tokens, None, lora, true, Logits::All)
    }

    /// Training's log-probabilities: `lp[n, t]` is position `n·l + t`'s weighted target log-probability,
    /// `Σ w·log softmax(logits[n, t])[id]` over its [`Targets`] (for one token: that token's log-probability),
    /// and 0 where it has none (`tokens: [n, l]`; `targets` has `n·l` positions). Differentiable like
    /// [`Self::forward_train`], but the head's logits exist only inside one op and only for scored positions
    /// (see the `head` module), so callers must weigh `lp` by the same mask.
    pub fn target_logps(
        &self,
        tokens: &Tensor,
        lora: Option<&LoraSet>,
        targets: &Targets,
    ) -> Result<Tensor> {
        let (n, l) = tokens.dims2()?;
        if targets.len() != n * l {
            return Err(ModelError::Input(format!(
                "{} targets for {n}x{l} positions",
                targets.len()
            )));
        }
        let h = self.run(tokens, None, lora, true, Logits::Hidden)?;
        let h = h.reshape((n * l, self.config.hidden_size))?;
        Ok(head::target_logps(&self.head, &h, targets)?.reshape((n, l))?)
    }

    /// The residual stream (no final norm, no logits) after each of `layers` blocks, ascending and
    /// distinct, stacked as `[layers.len(), b, l, hidden]`: a frozen text representation for probes.
    /// The forward stops after the deepest of them.
    pub fn residual(&self, tokens: &Tensor, layers: &[usize]) -> Result<Tensor> {
        let n = self.config.num_layers;
        let mut mask = 0u64;
        for (i, &k) in layers.iter().enumerate() {
            if k == 0 || k > n || k >= 64 || (i > 0 && k <= layers[i - 1]) {
                return Err(ModelError::Input(format!(
                    "residual after blocks {layers:?}: each in 1..={}, ascending",
                    n.min(63)
                )));
            }
            mask |= 1 << k;
        }
        if mask == 0 {
            return Err(ModelError::Input("residual after no block".into()));
        }
        self.run(tokens, None, None, false, Logits::Residual(mask))
    }

    /// Convenience for one sequence: logits `[ids.len(), vocab]`.
    pub fn forward_ids(
        &self,
        ids: &[u32],
        cache: Option<&mut KvCache>,
        lora: Option<&LoraSet>,
    ) -> Result<Tensor> {
        let t = Tensor::from_slice(ids, (1, ids.len()), &Device::Cpu)?;
        Ok(self.forward(&t, cache, lora)?.squeeze(0)?)
    }

    fn run(
        &self,
        tokens: &Tensor,
        mut cache: Option<&mut KvCache>,
        lora: Option<&LoraSet>,
        train: bool,
        which: Logits,
    ) -> Result<Tensor> {
        let cfg = &self.config;
        let (b, l) = tokens.dims2()?;
        if l == 0 {
            return Err(ModelError::Input("empty token sequence".into()));
        }
        let tokens = tokens.to_dtype(DType::U32)?;
        let max = tokens.flatten_all()?.max(0)?.to_scalar::<u32>()? as usize;
        if max >= cfg.vocab_size {
            return Err(ModelError::Input(format!(
                "token id {max} out of range for vocab {}",
                cfg.vocab_size
            )));
        }
        let offset = cache.as_ref().map_or(0, |c| c.len());
        if offset + l > self.max_positions() {
            return Err(ModelError::Input(format!(
                "{} positions exceed the context of {}",
                offset + l,
                self.max_positions()
            )));
        }
        if let Some(c) = cache.as_ref()
            && c.layers.len() != cfg.num_layers
        {
            return Err(ModelError::Input("KV cache built for another model".into()));
        }
        if let Some(s) = lora {
            s.check_compatible(self)?;
        }
        // One token of one sequence, nothing to differentiate: the serving decode step (decode.rs).
        if b == 1
            && l == 1
            && !train
            && let Some(c) = cache.as_deref_mut()
            && lora.is_none_or(|s| s.iter().all(|(_, p)| !p.tracks()))
        {
            return self.decode_token(&tokens, c, lora);
        }
        let mut x = self.embed.embedding(&tokens)?;
        if let Some(scale) = self.embed_scale() {
            x = (x * scale as f64)?;
        }
        // Several positions at once: each attends to the cache and to itself and the positions before it.
        let causal = l > 1;
        let mut taps = Vec::new();
        for (li, blk) in self.blocks.iter().enumerate() {
            let pair = |t| lora.and_then(|s| s.get(li, t));
            let h = rms_norm(&x, &blk.attn_norm, cfg.rms_eps, train)?;
            let h = self.attention(
                blk,
                li,
                &h,
                offset,
                causal,
                cache.as_deref_mut(),
                &pair,
                train,
            )?;
            let h = match &blk.post_attn_norm {
                Some(w) => rms_norm(&h, w, cfg.rms_eps, train)?,
                None => h,
            };
            x = train_ops::add(&x, &h)?;
            let h = rms_norm(&x, &blk.ffn_norm, cfg.rms_eps, train)?;
            // Independent projections of the same input run as two tasks: with two threads each gets one
            // whole matrix (one fork instead of a split per matrix); with one they run in turn.
            let (pg, pu) = (pair(LoraTarget::Gate), pair(LoraTarget::Up));
            let (g, u) = rayon::join(|| blk.gate.forward(&h, pg), || blk.up.forward(&h, pu));
            let act = if cfg.arch.gelu_mlp() {
                // candle's `gelu` is the tanh approximation Gemma uses, and differentiable.
                (g?.gelu()? * u?)?
            } else {
                train_ops::silu_mul(&g?, &u?)?
            };
            let h = blk.down.forward(&act, pair(LoraTarget::Down))?;
            let h = match &blk.post_ffw_norm {
                Some(w) => rms_norm(&h, w, cfg.rms_eps, train)?,
                None => h,
            };
            x = train_ops::add(&x, &h)?;
            if let Logits::Residual(mask) = which
                && mask >> (li + 1) & 1 == 1
            {
                taps.push(x.clone());
                if mask.checked_shr(li as u32 + 2).unwrap_or(0) == 0 {
                    return Ok(Tensor::stack(&taps, 0)?);
                }
            }
        }
        if let Some(c) = cache {
            c.len += l;
        }
        if which == Logits::Last {
            x = x.narrow(1, l - 1, 1)?;
        }
        let x = rms_norm(&x, &self.norm, cfg.rms_eps, train)?;
        if which == Logits::Hidden {
            return Ok(x);
        }
        self.head.forward(&x, None)
    }

    #[allow(clippy::too_many_arguments)]
    fn attention<'a>(
        &self,
        blk: &Block,
        layer: usize,
        x: &Tensor,
        offset: usize,
        causal: bool,
        cache: Option<&mut KvCache>,
        pair: &dyn Fn(LoraTarget) -> Option<&'a LoraPair>,
        train: bool,
    ) -> Result<Tensor> {
        let cfg = &self.config;
        let (b, l, _) = x.dims3()?;
        let (nh, nkv, hd) = (cfg.num_heads, cfg.num_kv_heads, cfg.head_dim);
        // q on one task, k and v (each a third of its size with GQA) on the other; see the MLP in `run`.
        let (pq, pk, pv) = (
            pair(LoraTarget::Q),
            pair(LoraTarget::K),
            pair(LoraTarget::V),
        );
        let (q, (k, v)) = rayon::join(
            || blk.q.forward(x, pq),
            || (blk.k.forward(x, pk), blk.v.forward(x, pv)),
        );
        let (mut q, mut k, mut v) = (q?, k?, v?);
        // Before RoPE and the q/k norms, as llama.cpp's qwen2 graph adds them.
        if let Some(bias) = &blk.bias {
            q = q.broadcast_add(&bias.q)?;
            k = k.broadcast_add(&bias.k)?;
            v = v.broadcast_add(&bias.v)?;
        }
        let mut q = q.reshape((b, l, nh, hd))?;
        let mut k = k.reshape((b, l, nkv, hd))?;
        let v = v.reshape((b, l, nkv, hd))?;
        if let (Some(qn), Some(kn)) = (&blk.q_norm, &blk.k_norm) {
            q = rms_norm(&q, qn, cfg.rms_eps, train)?;
            k = rms_norm(&k, kn, cfg.rms_eps, train)?;
        }
        // RoPE is linear, so scaling before it equals llama.cpp's scaling after.
        if cfg.query_scale != 1.0 {
            q = (q * cfg.query_scale as f64)?;
        }
        let rope = self.rope_for(layer);
        if train && cache.is_none() && offset == 0 {
            // Training: rotary embedding, scores, causal softmax and context as one node (`attention_train`).
            let table = |t: &Tensor| -> Result<Vec<f32>> {
                Ok(t.narrow(0, 0, l)?.flatten_all()?.to_vec1()?)
            };
            let core = attention_train::AttentionCore {
                num_heads: nh,
                num_kv_heads: nkv,
                head_dim: hd,
                cos: table(&rope.cos)?,
                sin: table(&rope.sin)?,
                interleaved: rope.interleaved,
                probabilities: Default::default(),
            };
            let ctx = q
                .contiguous()?
                .apply_op3(&k.contiguous()?, &v.contiguous()?, core)?;
            return blk.o.forward(&ctx, pair(LoraTarget::O));
        }
        let q = rope.apply(&q.transpose(1, 2)?.contiguous()?, offset, train)?;
        let k = rope.apply(&k.transpose(1, 2)?.contiguous()?, offset, train)?;
        let v = v.transpose(1, 2)?.contiguous()?;
        let (k, v) = match cache {
            Some(c) => c.append(layer, &k, &v)?,
            None => (k, v),
        };
        // GQA without repeating K/V: query head h uses kv head h / g, so group the g query heads
        // of each kv head along the row axis.
        let g = nh / nkv;
        if l == 1
            && !train
            && let Some(ctx) = decode_attention(&q, &k, &v, g)?
        {
            return blk.o.forward(&ctx, pair(LoraTarget::O));
        }
        // The general products run in f32 (a no-op for an f32 cache).
        let (k, v) = (k.to_dtype(DType::F32)?, v.to_dtype(DType::F32)?);
        let qg = q.reshape((b, nkv, g * l, hd))?;
        let scale = 1.0 / (hd as f64).sqrt();
        // Scale, causal mask and softmax as one op on hearth's threads (`train_ops`), in training and inference.
        let probs = train_ops::causal_softmax(
            &qg.matmul(&k.t()?)?,
            scale as f32,
            causal.then_some((l, offset)),
        )?;
        let ctx = probs
            .matmul(&v)?
            .reshape((b, nh, l, hd))?
            .transpose(1, 2)?
            .reshape((b, l, nh * hd))?;
        blk.o.forward(&ctx, pair(LoraTarget::O))
    }
}
