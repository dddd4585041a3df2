//! The serving decode step on a GPU: the same math as [`Transformer::decode_token`] through `gpu::ops`, one
//! launch per kernel, with the weights resident on the device and LoRA pairs applied unmerged.
//!
//! The step keeps what changes between tokens (the position) on the device, so it is recorded once as a graph
//! and replayed per token where the vendor captures graphs; elsewhere it launches kernel by kernel. Only the
//! token's embedding row goes up and the logits come back.
//!
//! Q8_0 products quantize their input to int8 per 32 values, as the CPU path does, so the two agree to the
//! order of float additions, except where an input value sits on a rounding boundary. Q4_0, Q4_K, Q5_K and
//! Q6_K weights are dequantized in the kernel and multiply f32 inputs: the model their dequantized weights
//! define, which the CPU computes within its own 8-bit rounding of the activations.
//!
//! Covered: the llama, qwen2 (q/k/v biases), qwen3 (q/k norms), phi3 and gemma3 (scaled embeddings and
//! queries, post-norms, GELU, the sliding layers' RoPE tables) architectures with those weight types (load with
//! `requantize: Q8_0` for others), LoRA, rsLoRA and DoRA pairs. What is not covered is refused with the reason,
//! so that a caller can stay on the CPU.

use candle_core::quantized::GgmlDType;

use super::*;
use crate::gpu::ops::{self, AttentionShape, LoraShape, Rotation};
use crate::gpu::{Buffer, Gpu, Graph};
use crate::model::q8::QK8_0;

pub(super) struct GpuLora {
    pub(super) a: Buffer<f32>,
    pub(super) b: Buffer<f32>,
    pub(super) rank: usize,
    pub(super) scale: f32,
    /// DoRA's `m / ‖W + ΔW‖_row` per output, applied to the whole product (decoding only).
    pub(super) dora: Option<Buffer<f32>>,
}

/// One block's frozen weights on the device.
pub(super) struct GpuBlock {
    pub(super) attn_norm: Buffer<f32>,
    pub(super) ffn_norm: Buffer<f32>,
    pub(super) qk_norm: Option<(Buffer<f32>, Buffer<f32>)>,
    pub(super) bias: Option<[Buffer<f32>; 3]>,
    /// Gemma 3's norms of the attention's and the MLP's outputs, before the residual adds.
    pub(super) post_norms: Option<(Buffer<f32>, Buffer<f32>)>,
    /// Whether the block uses the sliding-window layers' RoPE tables (Gemma 3).
    pub(super) sliding: bool,
    /// The projections in [`LoraTarget::ALL`]'s order (q, k, v, o, gate, up, down), in GGUF layout.
    pub(super) proj: [Buffer<u8>; 7],
    /// Their GGUF types.
    pub(super) types: [GgmlDType; 7],
}

/// A block's LoRA pairs, in [`LoraTarget::ALL`]'s order.
pub(super) type BlockPairs = [Option<GpuLora>; 7];

/// The index of `t` in [`LoraTarget::ALL`].
pub(super) fn slot(t: LoraTarget) -> usize {
    LoraTarget::ALL
        .iter()
        .position(|&x| x == t)
        .expect("every target is in ALL")
}

/// A model's frozen weights on a GPU, shared by every [`GpuDecoder`] over it (one per concurrent sequence).
pub struct GpuModel {
    pub(super) gpu: Gpu,
    pub(super) config: ModelConfig,
    pub(super) embed: Weight,
    pub(super) blocks: Vec<GpuBlock>,
    pub(super) norm: Buffer<f32>,
    pub(super) head: Buffer<u8>,
    pub(super) head_type: GgmlDType,
    pub(super) cos: Buffer<f32>,
    pub(super) sin: Buffer<f32>,
    /// The sliding-window layers' own tables (Gemma 3).
    pub(super) sliding: Option<(Buffer<f32>, Buffer<f32>)>,
    pub(super) interleaved: bool,
    /// The model on the CPU (its weights shared, not copied): DoRA pairs' row factors come from its weights.
    pub(super) cpu: Transformer,
    /// The longest sequence a decoder over it holds (the RoPE tables' length).
    pub(super) capacity: usize,
}

/// The activations of a step over up to `rows` tokens, each allocated once.
struct Scratch {
    rows: usize,
    x: Buffer<f32>,
    normed: Buffer<f32>,
    q: Buffer<f32>,
    k: Buffer<f32>,
    v: Buffer<f32>,
    context: Buffer<f32>,
    out: Buffer<f32>,
    gate: Buffer<f32>,
    up: Buffer<f32>,
    act: Buffer<f32>,
    /// `x·Aᵀ` of the pair being applied, `[rows, max rank]`.
    lora_t: Buffer<f32>,
    /// Each row's position, for RoPE (prefill; a decode step reads the decoder's position).
    positions: Buffer<i32>,
    /// The input of the products being run, quantized as the CPU path quantizes it: int8 values and a scale
    /// per 32, for the widest input (`[rows, max(hidden, q, ffn)]`).
    xq: Buffer<i8>,
    xd: Buffer<f32>,
}

impl Scratch {
    fn new(gpu: &Gpu, cfg: &ModelConfig, rows: usize, rank: usize) -> Result<Self> {
        let (h, hd, ff) = (cfg.hidden_size, cfg.head_dim, cfg.intermediate_size);
        let (qd, kvd) = (cfg.num_heads * hd, cfg.num_kv_heads * hd);
        let widest = h.max(qd).max(ff);
        Ok(Self {
            rows,
            xq: gpu.zeros(rows * widest)?,
            xd: gpu.zeros(rows * widest.div_ceil(QK8_0))?,
            x: gpu.zeros(rows * h)?,
            normed: gpu.zeros(rows * h)?,
            q: gpu.zeros(rows * qd)?,
            k: gpu.zeros(rows * kvd)?,
            v: gpu.zeros(rows * kvd)?,
            context: gpu.zeros(rows * qd)?,
            out: gpu.zeros(rows * h)?,
            gate: gpu.zeros(rows * ff)?,
            up: gpu.zeros(rows * ff)?,
            act: gpu.zeros(rows * ff)?,
            lora_t: gpu.zeros(rows * rank)?,
            positions: gpu.zeros(rows)?,
        })
    }
}

/// Prompt tokens per prefill launch: each weight is read once per chunk of rows.
const PREFILL_ROWS: usize = 64;

/// One sequence's decode on a GPU: its KV cache, its LoRA pairs and the step, over a shared [`GpuModel`].
pub struct GpuDecoder {
    model: std::sync::Arc<GpuModel>,
    /// Keys and values per block, `[kv_heads, capacity, head_dim]` each.
    caches: Vec<(Buffer<f32>, Buffer<f32>)>,
    pairs: Vec<BlockPairs>,
    /// The position of the next token (a device value, so a recorded step replays at every position).
    pos: Buffer<i32>,
    /// The token at each position the cache holds.
    tokens: Vec<u32>,
    /// A decode step's activations, and a prefill chunk's (made on first use).
    s: Scratch,
    prefill: Option<Scratch>,
    logits: Buffer<f32>,
    /// The largest rank of the pairs applied (1 without any), for the scratches' `lora_t`.
    rank: usize,
    /// The recorded step; `None` until the first step, or when the vendor does not capture graphs.
    graph: Option<Graph>,
    capture: bool,
}

/// Where a model's generation runs, and why not where it was asked to when it fell back to the CPU.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct DeviceStatus {
    /// `cpu`, or the device and the GPU's name.
    pub running_on: String,
    pub notice: Option<String>,
}

pub(super) fn unsupported(what: impl std::fmt::Display) -> ModelError {
    ModelError::Input(format!("gpu: {what}"))
}

/// `lora`'s pairs for `layers` blocks on the device (none with `None`), and the largest rank (1 without any).
/// DoRA pairs take their row factors from `dora`'s weights (the model the pairs adapt); without it, as in
/// training, whose backward does not differentiate the factor, they are refused.
pub(super) fn upload_pairs(
    gpu: &Gpu,
    lora: Option<&LoraSet>,
    layers: usize,
    dora: Option<&Transformer>,
) -> Result<(Vec<BlockPairs>, usize)> {
    let mut max_rank = 1;
    let mut out: Vec<BlockPairs> = (0..layers).map(|_| Default::default()).collect();
    for (l, pairs) in out.iter_mut().enumerate() {
        for t in LoraTarget::ALL {
            pairs[slot(t)] = match lora.and_then(|set| set.get(l, t)) {
                None => None,
                Some(pair) => {
                    let factor = match (&pair.magnitude, dora) {
                        (None, _) => None,
                        (Some(_), Some(model)) => {
                            let block = model.blocks.get(l).ok_or_else(|| {
                                unsupported(format!("a DoRA pair for block {l} of {layers}"))
                            })?;
                            match block.linear(t).dora_factor(pair)? {
                                Some(f) => Some(gpu.upload(&f32s(&f)?)?),
                                None => None,
                            }
                        }
                        (Some(_), None) => {
                            return Err(unsupported("DoRA pairs have no GPU training step yet"));
                        }
                    };
                    let rank = pair.a.dim(0)?;
                    max_rank = max_rank.max(rank);
                    Some(GpuLora {
                        a: gpu.upload(&f32s(&pair.a)?)?,
                        b: gpu.upload(&f32s(&pair.b)?)?,
                        rank,
                        scale: pair.scale as f32,
                        dora: factor,
                    })
                }
            };
        }
    }
    Ok((out, max_rank))
}

/// A weight's type and bytes in the GGUF layout, which the kernels read in place: Q8_0 (int8 products), or
/// Q4_0, Q4_K, Q5_K and Q6_K (dequantized in the kernel, `ops::kq_matmul`).
fn weight_bytes(w: &Weight, name: &str) -> Result<(GgmlDType, Vec<u8>)> {
    let read = |t: GgmlDType| t == GgmlDType::Q8_0 || ops::kq_reads(t);
    let refuse = |what: String| {
        unsupported(format!(
            "{name} is {what}; the GPU kernels read Q8_0, Q4_0, Q4_K, Q5_K and Q6_K (load with requantize: \
             Q8_0)"
        ))
    };
    match w {
        Weight::Quant(q) if read(q.dtype()) => Ok((q.dtype(), q.data()?.into_owned())),
        Weight::Panels(p) if read(p.dtype()) => Ok((p.dtype(), p.to_gguf())),
        Weight::Quant(q) => Err(refuse(format!("{:?}", q.dtype()))),
        Weight::Panels(p) => Err(refuse(format!("{:?}", p.dtype()))),
        Weight::Dense(_) => Err(refuse("dense".into())),
    }
}

/// `y = x·Wᵀ` for a weight of `dtype` over `rows` rows: Q8_0 through the int8 input `q8` the caller quantized
/// from `x` (as the CPU does), the other types on `x` itself.
#[allow(clippy::too_many_arguments)]
pub(super) fn weight_product(
    gpu: &Gpu,
    (dtype, w): (GgmlDType, &Buffer<u8>),
    q8: (&Buffer<i8>, &Buffer<f32>),
    x: &Buffer<f32>,
    y: &Buffer<f32>,
    shape: (usize, usize, usize),
) -> std::result::Result<(), crate::gpu::GpuError> {
    if dtype == GgmlDType::Q8_0 {
        ops::q8_matmul_q8(gpu, w, q8, y, shape)
    } else {
        ops::kq_matmul(gpu, dtype, w, x, y, shape)
    }
}

/// Training's `dx = dy·W` for a weight of `dtype`.
pub(super) fn weight_product_t(
    gpu: &Gpu,
    (dtype, w): (GgmlDType, &Buffer<u8>),
    dy: &Buffer<f32>,
    dx: &Buffer<f32>,
    shape: (usize, usize, usize),
) -> std::result::Result<(), crate::gpu::GpuError> {
    if dtype == GgmlDType::Q8_0 {
        ops::q8_matmul_t(gpu, w, dy, dx, shape)
    } else {
        ops::kq_matmul_t(gpu, dtype, w, dy, dx, shape)
    }
}

pub(super) fn f32s(t: &Tensor) -> Result<Vec<f32>> {
    Ok(t.to_dtype(DType::F32)?.flatten_all()?.to_vec1::<f32>()?)
}

impl GpuModel {
    /// Uploads `model`'s weights to `gpu` for sequences of up to `capacity` positions.
    pub fn new(gpu: &Gpu, model: &Transformer, capacity: usize) -> Result<Self> {
        let cfg = model.config().clone();
        let limit = ops::ATTENTION_MAX_POSITIONS.min(model.max_positions());
        if capacity == 0 || capacity > limit {
            return Err(unsupported(format!(
                "a cache of {capacity} positions (1..={limit} on the GPU for this model)"
            )));
        }
        let up_f32 = |t: &Tensor| -> Result<Buffer<f32>> { Ok(gpu.upload(&f32s(t)?)?) };
        let names = [
            "attn_q",
            "attn_k",
            "attn_v",
            "attn_output",
            "ffn_gate",
            "ffn_up",
            "ffn_down",
        ];
        let mut blocks = Vec::with_capacity(model.blocks.len());
        for (l, b) in model.blocks.iter().enumerate() {
            let (mut proj, mut types) = (Vec::with_capacity(7), [GgmlDType::Q8_0; 7]);
            for (i, (t, name)) in LoraTarget::ALL.iter().zip(names).enumerate() {
                let (dtype, bytes) =
                    weight_bytes(b.linear(*t).weight(), &format!("blk.{l}.{name}"))?;
                types[i] = dtype;
                proj.push(gpu.upload(&bytes)?);
            }
            blocks.push(GpuBlock {
                post_norms: match (&b.post_attn_norm, &b.post_ffw_norm) {
                    (Some(a), Some(f)) => Some((up_f32(a)?, up_f32(f)?)),
                    _ => None,
                },
                sliding: model.rope_sliding.is_some() && cfg.is_sliding_layer(l),
                attn_norm: up_f32(&b.attn_norm)?,
                ffn_norm: up_f32(&b.ffn_norm)?,
                qk_norm: match (&b.q_norm, &b.k_norm) {
                    (Some(q), Some(k)) => Some((up_f32(q)?, up_f32(k)?)),
                    _ => None,
                },
                bias: match &b.bias {
                    Some(bias) => Some([up_f32(&bias.q)?, up_f32(&bias.k)?, up_f32(&bias.v)?]),
                    None => None,
                },
                proj: proj
                    .try_into()
                    .map_err(|_| unsupported("seven projections"))?,
                types,
            });
        }
        let table = |t: &Tensor| -> Result<Buffer<f32>> {
            Ok(gpu.upload(&f32s(&t.narrow(0, 0, capacity)?)?)?)
        };
        let (head_type, head) = weight_bytes(model.head.weight(), "output")?;
        Ok(Self {
            gpu: gpu.clone(),
            embed: model.embed.clone(),
            norm: up_f32(&model.norm)?,
            head: gpu.upload(&head)?,
            head_type,
            cpu: model.clone(),
            cos: table(&model.rope.cos)?,
            sin: table(&model.rope.sin)?,
            sliding: match &model.rope_sliding {
                Some(r) => Some((table(&r.cos)?, table(&r.sin)?)),
                None => None,
            },
            interleaved: model.rope.interleaved,
            blocks,
            capacity,
            config: cfg,
        })
    }
}

impl GpuModel {
    /// The input rows of `ids`: their embeddings, scaled as the model scales them (Gemma).
    pub(super) fn embed_rows(&self, ids: &[u32]) -> Result<Vec<f32>> {
        let mut x = f32s(&self.embed.embedding(&Tensor::new(ids, &Device::Cpu)?)?)?;
        if let Some(scale) = self.cpu.embed_scale() {
            x.iter_mut().for_each(|v| *v *= scale);
        }
        Ok(x)
    }

    /// The RoPE tables block `b` uses.
    pub(super) fn rope_tables(&self, b: &GpuBlock) -> (&Buffer<f32>, &Buffer<f32>) {
        match &self.sliding {
            Some((c, s)) if b.sliding => (c, s),
            _ => (&self.cos, &self.sin),
        }
    }

    /// The attention's score scale: `1/√head_dim`, times the model's query scale (Gemma; RoPE is linear, so
    /// scaling the scores equals scaling the queries).
    pub(super) fn attention_scale(&self) -> f32 {
        self.config.query_scale / (self.config.head_dim as f32).sqrt()
    }

    /// The device and the GPU's name (`cuda:0: NVIDIA H100 ... (sm_90)`).
    pub fn describe(&self) -> String {
        format!("{}: {}", self.gpu.device(), self.gpu.describe())
    }
}

impl GpuDecoder {
    /// A decoder for `model` on `device` with a cache as long as the model's context allows (or the attention
    /// kernel holds); `None`, with the reason in the status, when the device does not open or the step does not
    /// cover the model: generation then stays on the CPU.
    pub fn open(device: crate::gpu::Device, model: &Transformer) -> (Option<Self>, DeviceStatus) {
        let cpu = |notice| DeviceStatus {
            running_on: "cpu".into(),
            notice,
        };
        let gpu = match device.open() {
            crate::gpu::Opened::Cpu(notice) => return (None, cpu(notice)),
            crate::gpu::Opened::Gpu(g) => g,
        };
        let capacity = model.max_positions().min(ops::ATTENTION_MAX_POSITIONS);
        match Self::new(&gpu, model, capacity, None) {
            Ok(d) => (
                Some(d),
                DeviceStatus {
                    running_on: format!("{device}: {}", gpu.describe()),
                    notice: None,
                },
            ),
            Err(e) => (
                None,
                cpu(Some(format!("device {device}: {e}; running on the CPU"))),
            ),
        }
    }

    /// Uploads `model`'s weights to `gpu` with room for `capacity` positions, and `lora`'s pairs if given.
    pub fn new(
        gpu: &Gpu,
        model: &Transformer,
        capacity: usize,
        lora: Option<&LoraSet>,
    ) -> Result<Self> {
        Self::on(
            std::sync::Arc::new(GpuModel::new(gpu, model, capacity)?),
            lora,
        )
    }

    /// A new sequence over weights already on the device, with `lora`'s pairs if given.
    pub fn on(model: std::sync::Arc<GpuModel>, lora: Option<&LoraSet>) -> Result<Self> {
        let (gpu, cfg) = (&model.gpu, &model.config);
        let kvd = cfg.num_kv_heads * cfg.head_dim;
        let caches = (0..model.blocks.len())
            .map(|_| {
                Ok((
                    gpu.zeros(kvd * model.capacity)?,
                    gpu.zeros(kvd * model.capacity)?,
                ))
            })
            .collect::<Result<Vec<_>>>()?;
        let mut dec = Self {
            caches,
            pairs: (0..model.blocks.len())
                .map(|_| Default::default())
                .collect(),
            pos: gpu.upload(&[0i32])?,
            tokens: Vec::new(),
            s: Scratch::new(gpu, cfg, 1, 1)?,
            prefill: None,
            logits: gpu.zeros(cfg.vocab_size)?,
            rank: 1,
            graph: None,
            capture: true,
            model,
        };
        dec.set_adapter(lora)?;
        Ok(dec)
    }

    /// The weights this decoder runs over.
    pub fn model(&self) -> &std::sync::Arc<GpuModel> {
        &self.model
    }

    /// Replaces the LoRA pairs applied (none with `None`) and starts a new sequence: keys and values cached
    /// under other pairs are not reused.
    pub fn set_adapter(&mut self, lora: Option<&LoraSet>) -> Result<()> {
        self.graph = None;
        self.reset()?;
        let gpu = self.model.gpu.clone();
        let model = &self.model;
        let (pairs, max_rank) = upload_pairs(&gpu, lora, model.blocks.len(), Some(&model.cpu))?;
        self.pairs = pairs;
        if max_rank > self.rank {
            self.rank = max_rank;
            self.s.lora_t = gpu.zeros(max_rank)?;
            if let Some(p) = &mut self.prefill {
                p.lora_t = gpu.zeros(p.rows * max_rank)?;
            }
        }
        Ok(())
    }

    /// Records the step as a graph where the vendor can (the default), or launches it kernel by kernel.
    pub fn with_graph(mut self, capture: bool) -> Self {
        self.capture = capture;
        self.graph = None;
        self
    }

    /// Positions decoded so far.
    pub fn len(&self) -> usize {
        self.tokens.len()
    }

    pub fn is_empty(&self) -> bool {
        self.tokens.is_empty()
    }

    /// The token at each position the cache holds, in order.
    pub fn tokens(&self) -> &[u32] {
        &self.tokens
    }

    /// Keeps the first `keep` positions (a prompt that starts with them reuses their keys and values).
    pub fn truncate(&mut self, keep: usize) -> Result<()> {
        let keep = keep.min(self.tokens.len());
        self.model.gpu.write(&self.pos, &[keep as i32])?;
        self.tokens.truncate(keep);
        Ok(())
    }

    pub fn capacity(&self) -> usize {
        self.model.capacity
    }

    /// Whether steps replay a recorded graph.
    pub fn replays_graph(&self) -> bool {
        self.graph.is_some()
    }

    /// Starts a new sequence (the cache's old contents are overwritten as it fills again).
    pub fn reset(&mut self) -> Result<()> {
        self.truncate(0)
    }

    /// Runs `tokens` from the next position and returns the last one's logits: all but the last in chunks of
    /// rows (each weight read once per chunk), the last as a decode step.
    pub fn prefill(&mut self, tokens: &[u32]) -> Result<Vec<f32>> {
        let Some((&last, rest)) = tokens.split_last() else {
            return Err(ModelError::Input("gpu prefill: no tokens".into()));
        };
        if self.tokens.len() + tokens.len() > self.model.capacity {
            return Err(ModelError::Input(format!(
                "gpu prefill: {} tokens after {} do not fit a cache of {} positions",
                tokens.len(),
                self.tokens.len(),
                self.model.capacity
            )));
        }
        let h = self.model.config.hidden_size;
        for chunk in rest.chunks(PREFILL_ROWS) {
            let rows = chunk.len();
            if self.prefill.is_none() {
                let s = Scratch::new(&self.model.gpu, &self.model.config, PREFILL_ROWS, self.rank)?;
                self.prefill = Some(s);
            }
            let s = self.prefill.as_ref().expect("made above");
            let mut x = self.model.embed_rows(chunk)?;
            x.resize(s.rows * h, 0.0);
            self.model.gpu.write(&s.x, &x)?;
            let start = self.tokens.len();
            let mut positions: Vec<i32> = (start..start + rows).map(|p| p as i32).collect();
            positions.resize(s.rows, 0);
            self.model.gpu.write(&s.positions, &positions)?;
            self.launch_layers(s, rows, &s.positions)?;
            ops::advance(&self.model.gpu, &self.pos, rows as i32)?;
            self.tokens.extend_from_slice(chunk);
        }
        self.step(last)
    }

    /// Logits `[vocab]` for `token` at the next position, appending its keys and values to the cache.
    pub fn step(&mut self, token: u32) -> Result<Vec<f32>> {
        if token as usize >= self.model.config.vocab_size {
            return Err(ModelError::Input(format!(
                "token {token} is outside the vocabulary of {}",
                self.model.config.vocab_size
            )));
        }
        if self.tokens.len() >= self.model.capacity {
            return Err(ModelError::Input(format!(
                "gpu decode: the cache holds {} positions and is full",
                self.model.capacity
            )));
        }
        let row = self.model.embed_rows(&[token])?;
        self.model.gpu.write(&self.s.x, &row)?;
        if self.capture && self.graph.is_none() {
            match self.model.gpu.capture(|_| self.launch_step()) {
                Ok(g) => self.graph = Some(g),
                Err(e) => {
                    tracing::debug!(error = %e, "gpu decode: no graph capture, launching per kernel");
                    self.capture = false;
                }
            }
        }
        match &self.graph {
            Some(g) => g.replay()?,
            None => self.launch_step()?,
        }
        self.tokens.push(token);
        Ok(self.model.gpu.download(&self.logits)?)
    }

    /// Quantizes `x` `[rows, k]` into the scratch's int8 input, which the next products read.
    fn quantize(
        &self,
        s: &Scratch,
        x: &Buffer<f32>,
        (rows, k): (usize, usize),
    ) -> std::result::Result<(), crate::gpu::GpuError> {
        ops::quantize_q8(&self.model.gpu, x, &s.xq, &s.xd, (rows, k))
    }

    /// `y = W·x (+ scale·B·A·x)` for one projection `[n, k]` over `rows` rows: the weight product on `x` as
    /// [`Self::quantize`] left it in the scratch, the LoRA delta on `x` in f32 (as on the CPU).
    fn project(
        &self,
        (w, pair): ((GgmlDType, &Buffer<u8>), &Option<GpuLora>),
        s: &Scratch,
        (x, y): (&Buffer<f32>, &Buffer<f32>),
        (rows, k, n): (usize, usize, usize),
    ) -> std::result::Result<(), crate::gpu::GpuError> {
        weight_product(&self.model.gpu, w, (&s.xq, &s.xd), x, y, (rows, k, n))?;
        if let Some(l) = pair {
            let shape = LoraShape {
                m: rows,
                k,
                rank: l.rank,
                n,
            };
            ops::lora_forward(&self.model.gpu, x, &l.a, &l.b, &s.lora_t, y, shape, l.scale)?;
            if let Some(f) = &l.dora {
                ops::mul_rows(&self.model.gpu, y, f, (rows, n))?;
            }
        }
        Ok(())
    }

    /// One decode step: the layers over the step's one row at the decoder's position, the head, and the
    /// position moved on.
    fn launch_step(&self) -> std::result::Result<(), crate::gpu::GpuError> {
        let (g, s, cfg) = (&self.model.gpu, &self.s, &self.model.config);
        let h = cfg.hidden_size;
        self.launch_layers(s, 1, &self.pos)?;
        ops::rms_norm(g, &s.x, &self.model.norm, &s.normed, (1, h), cfg.rms_eps)?;
        self.quantize(s, &s.normed, (1, h))?;
        weight_product(
            g,
            (self.model.head_type, &self.model.head),
            (&s.xq, &s.xd),
            &s.normed,
            &self.logits,
            (1, h, cfg.vocab_size),
        )?;
        ops::advance(g, &self.pos, 1)
    }

    /// Every block over `rows` tokens in `s.x` at positions `pos[0]..` (RoPE reads each row's position from
    /// `rope_pos`), in the order of [`Transformer::decode_token`], appending their keys and values.
    fn launch_layers(
        &self,
        s: &Scratch,
        rows: usize,
        rope_pos: &Buffer<i32>,
    ) -> std::result::Result<(), crate::gpu::GpuError> {
        let cfg = &self.model.config;
        let (h, hd, ff, eps) = (
            cfg.hidden_size,
            cfg.head_dim,
            cfg.intermediate_size,
            cfg.rms_eps,
        );
        let (nh, nkv) = (cfg.num_heads, cfg.num_kv_heads);
        let (qd, kvd) = (nh * hd, nkv * hd);
        let att = AttentionShape {
            heads: nh,
            kv_heads: nkv,
            head_dim: hd,
            capacity: self.model.capacity,
        };
        let g = &self.model.gpu;
        let scale = self.model.attention_scale();
        for ((b, (k_cache, v_cache)), pairs) in
            self.model.blocks.iter().zip(&self.caches).zip(&self.pairs)
        {
            let (cos, sin) = self.model.rope_tables(b);
            let rope = |x: &Buffer<f32>, heads: usize| {
                ops::rope(
                    g,
                    x,
                    cos,
                    sin,
                    rope_pos,
                    (rows, heads, hd),
                    self.model.interleaved,
                    Rotation::Forward,
                )
            };
            let p = |t: LoraTarget| ((b.types[slot(t)], &b.proj[slot(t)]), &pairs[slot(t)]);
            ops::rms_norm(g, &s.x, &b.attn_norm, &s.normed, (rows, h), eps)?;
            self.quantize(s, &s.normed, (rows, h))?;
            self.project(p(LoraTarget::Q), s, (&s.normed, &s.q), (rows, h, qd))?;
            self.project(p(LoraTarget::K), s, (&s.normed, &s.k), (rows, h, kvd))?;
            self.project(p(LoraTarget::V), s, (&s.normed, &s.v), (rows, h, kvd))?;
            if let Some([bq, bk, bv]) = &b.bias {
                ops::add_rows(g, &s.q, bq, (rows, qd))?;
                ops::add_rows(g, &s.k, bk, (rows, kvd))?;
                ops::add_rows(g, &s.v, bv, (rows, kvd))?;
            }
            if let Some((qn, kn)) = &b.qk_norm {
                ops::rms_norm(g, &s.q, qn, &s.q, (rows * nh, hd), eps)?;
                ops::rms_norm(g, &s.k, kn, &s.k, (rows * nkv, hd), eps)?;
            }
            rope(&s.q, nh)?;
            rope(&s.k, nkv)?;
            ops::kv_append(g, k_cache, &s.k, &self.pos, rows, att)?;
            ops::kv_append(g, v_cache, &s.v, &self.pos, rows, att)?;
            ops::attention_decode(
                g, &s.q, k_cache, v_cache, &s.context, &self.pos, rows, att, scale,
            )?;
            self.quantize(s, &s.context, (rows, qd))?;
            self.project(p(LoraTarget::O), s, (&s.context, &s.out), (rows, qd, h))?;
            if let Some((post_attn, _)) = &b.post_norms {
                ops::rms_norm(g, &s.out, post_attn, &s.out, (rows, h), eps)?;
            }
            ops::add_into(g, &s.x, &s.out, rows * h)?;
            ops::rms_norm(g, &s.x, &b.ffn_norm, &s.normed, (rows, h), eps)?;
            self.quantize(s, &s.normed, (rows, h))?;
            self.project(p(LoraTarget::Gate), s, (&s.normed, &s.gate), (rows, h, ff))?;
            self.project(p(LoraTarget::Up), s, (&s.normed, &s.up), (rows, h, ff))?;
            if cfg.arch.gelu_mlp() {
                ops::gelu_mul(g, &s.gate, &s.up, &s.act, rows * ff)?;
            } else {
                ops::silu_mul(g, &s.gate, &s.up, &s.act, rows * ff)?;
            }
            self.quantize(s, &s.act, (rows, ff))?;
            self.project(p(LoraTarget::Down), s, (&s.act, &s.out), (rows, ff, h))?;
            if let Some((_, post_ffw)) = &b.post_norms {
                ops::rms_norm(g, &s.out, post_ffw, &s.out, (rows, h), eps)?;
            }
            ops::add_into(g, &s.x, &s.out, rows * h)?;
        }
        Ok(())
    }
}
