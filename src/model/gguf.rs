//! GGUF loading: model configuration from metadata, tensors as shared `Arc<QTensor>`, and a writer
//! used by tests to build tiny models with known weights.
//!
//! candle's `gguf_file` parses the container; this module turns its generic errors into ones that
//! name the key or tensor, and checks shapes against the configuration so a truncated or mismatched
//! file fails at load time instead of deep inside a matmul.

use std::collections::HashMap;
use std::fs::File;
use std::io::BufReader;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use candle_core::quantized::gguf_file::{self, Content, Value};
use candle_core::quantized::{GgmlDType, QTensor};
use candle_core::{Device, Tensor};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use super::{ModelError, Result, io_err};

/// Architectures with an owned forward. They differ in RoPE layout, Qwen2's q/k/v biases, Qwen3's and Gemma 3's
/// per-head q/k norms, Phi-3's fused projections and Gemma 3's extra norms, scaled embeddings, GELU and per-layer
/// RoPE. Mistral GGUFs declare `llama` (llama.cpp's converter writes them so) and load as such.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
pub enum Arch {
    /// Llama family (SmolLM2 and friends). llama.cpp's converter permutes q/k rows so that RoPE on
    /// GGUF weights is the *interleaved* form (pairs `2i, 2i+1`; candle's `rope_i`).
    Llama,
    /// Qwen2 (Qwen2.5): NEOX RoPE like Qwen3, no q/k norms, and a bias on each of the q/k/v projections
    /// (`blk.N.attn_{q,k,v}.bias`).
    Qwen2,
    /// Qwen3: NEOX RoPE (pairs `i, i + d/2`; candle's `rope`) and RMSNorm on each q/k head.
    Qwen3,
    /// Phi-3 (and Phi-3.5 mini): NEOX RoPE, q/k/v fused in one `attn_qkv` matrix (q rows, then k, then v) and
    /// gate/up fused in `ffn_up` (gate rows first); both are split at load into the separate layers the
    /// forward and LoRA use. LongRoPE files (`rope_factors_long`) are refused.
    Phi3,
    /// Gemma 3: embeddings scaled by `sqrt(hidden)`, q/k head norms, norms after attention and after the MLP
    /// (`post_attention_norm`, `post_ffw_norm`) before each residual add, a GELU(tanh)-gated MLP, and two RoPE
    /// bases: sliding-window layers use base 10000 unscaled, every sixth layer (the global ones) the file's
    /// base and scaling. Norm weights in a GGUF already hold Gemma's `1 + w` (the converter adds the 1).
    Gemma3,
}

impl Arch {
    /// The `general.architecture` string and metadata key prefix.
    pub fn as_str(self) -> &'static str {
        match self {
            Arch::Llama => "llama",
            Arch::Qwen2 => "qwen2",
            Arch::Qwen3 => "qwen3",
            Arch::Phi3 => "phi3",
            Arch::Gemma3 => "gemma3",
        }
    }

    /// Whether RoPE rotates interleaved pairs (`2i, 2i+1`) rather than halves (`i, i + d/2`).
    pub fn interleaved_rope(self) -> bool {
        self == Arch::Llama
    }

    /// Whether the MLP gates with GELU (tanh approximation) instead of SiLU.
    pub fn gelu_mlp(self) -> bool {
        self == Arch::Gemma3
    }

    fn parse(s: &str) -> Result<Self> {
        match s {
            "llama" => Ok(Arch::Llama),
            "qwen2" => Ok(Arch::Qwen2),
            "qwen3" => Ok(Arch::Qwen3),
            "phi3" => Ok(Arch::Phi3),
            "gemma3" => Ok(Arch::Gemma3),
            other => Err(ModelError::UnsupportedArch(other.to_string())),
        }
    }
}

/// Hyper-parameters read from GGUF metadata (and tensor shapes where metadata is optional).
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct ModelConfig {
    pub arch: Arch,
    pub vocab_size: usize,
    pub hidden_size: usize,
    pub intermediate_size: usize,
    pub num_layers: usize,
    pub num_heads: usize,
    pub num_kv_heads: usize,
    pub head_dim: usize,
    pub rope_theta: f32,
    pub rms_eps: f32,
    pub context_length: usize,
    /// No `output.weight`: the head reuses `token_embd.weight`.
    pub tied_embeddings: bool,
    /// Qwen3's RMSNorm on each query/key head before RoPE.
    pub qk_norm: bool,
    /// Linear RoPE scaling (`{arch}.rope.scaling.type = linear`): positions are divided by this factor. 1 when
    /// the file has none. Llama 3.x's per-frequency scaling is the `rope_freqs.weight` tensor instead.
    #[serde(default = "one")]
    pub rope_linear_factor: f32,
    /// Multiplies each query after RoPE on top of `1/sqrt(head_dim)`: Gemma 3 27B scales by
    /// `1/sqrt(hidden/heads)` instead (llama.cpp picks it from the layer count, as there is no key for it).
    #[serde(default = "one")]
    pub query_scale: f32,
    /// Gemma 3's sliding-window layers: the window (`{arch}.attention.sliding_window`), the RoPE base they use,
    /// and the period of the global layers among them (layer `l` is global when `(l + 1) % period == 0`).
    #[serde(default)]
    pub sliding: Option<SlidingWindow>,
}

/// Interleaved sliding-window attention (Gemma 3). hearth serves at most `window` positions on such a model, so
/// the window never cuts into the context and every layer attends causally to all of it: exactly the model's
/// attention, at the price of a shorter context.
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct SlidingWindow {
    pub window: usize,
    pub rope_theta: f32,
    pub global_period: usize,
}

fn one() -> f32 {
    1.0
}

impl ModelConfig {
    /// Width of the query projection output (`num_heads * head_dim`; not always `hidden_size`).
    pub fn q_dim(&self) -> usize {
        self.num_heads * self.head_dim
    }

    /// Width of the key/value projection outputs.
    pub fn kv_dim(&self) -> usize {
        self.num_kv_heads * self.head_dim
    }

    /// Positions served at most: the file's context, capped at
    /// [`MAX_POSITIONS`](super::transformer::MAX_POSITIONS) and, on a sliding-window model, at the window (see
    /// [`SlidingWindow`]).
    pub fn max_positions(&self) -> usize {
        let n = self.context_length.min(super::transformer::MAX_POSITIONS);
        self.sliding.map_or(n, |s| n.min(s.window))
    }

    /// Whether layer `l` is one of the sliding-window layers (which use their own RoPE base).
    pub fn is_sliding_layer(&self, l: usize) -> bool {
        self.sliding
            .is_some_and(|s| !(l + 1).is_multiple_of(s.global_period))
    }

    /// Reads the configuration; `content` supplies both metadata and tensor shapes.
    pub fn from_gguf(content: &Content) -> Result<Self> {
        let md = &content.metadata;
        let arch = Arch::parse(md_str(md, "general.architecture")?)?;
        let p = arch.as_str();
        let key = |k: &str| format!("{p}.{k}");
        let num_heads = md_usize(md, &key("attention.head_count"))?;
        let num_kv_heads = md_usize(md, &key("attention.head_count_kv")).or_else(|e| match e {
            ModelError::MissingKey { .. } => Ok(num_heads),
            e => Err(e),
        })?;
        let hidden_size = md_usize(md, &key("embedding_length"))?;
        let num_layers = md_usize(md, &key("block_count"))?;
        let context_length = md_usize(md, &key("context_length"))?;
        let rms_eps = md_f32(md, &key("attention.layer_norm_rms_epsilon"))?;
        let rope_theta = opt(md_f32(md, &key("rope.freq_base")))?.unwrap_or(10_000.0);
        if num_heads == 0 || num_kv_heads == 0 || !num_heads.is_multiple_of(num_kv_heads) {
            return Err(ModelError::BadKey {
                key: key("attention.head_count_kv"),
                reason: format!("{num_kv_heads} kv heads do not divide {num_heads} heads"),
            });
        }
        let head_dim = match opt(md_usize(md, &key("attention.key_length")))? {
            Some(d) => d,
            None => hidden_size / num_heads,
        };
        if head_dim == 0 || !head_dim.is_multiple_of(2) {
            return Err(ModelError::BadKey {
                key: key("attention.key_length"),
                reason: format!("head_dim {head_dim} must be even and non-zero"),
            });
        }
        if let Some(rd) = opt(md_usize(md, &key("rope.dimension_count")))?
            && rd != head_dim
        {
            return Err(ModelError::BadKey {
                key: key("rope.dimension_count"),
                reason: format!("partial RoPE ({rd} of {head_dim}) is not supported"),
            });
        }
        let rope_linear_factor = rope_linear_factor(md, &key)?;
        if let Some(name) = ["rope_factors_long.weight", "rope_factors_short.weight"]
            .into_iter()
            .find(|n| content.tensor_infos.contains_key(*n))
        {
            return Err(ModelError::BadTensor {
                name: name.into(),
                reason: "LongRoPE scaling is not supported (use a model without it, e.g. a 4k-context one)"
                    .into(),
            });
        }
        let sliding = if arch == Arch::Gemma3 {
            let window = md_usize(md, &key("attention.sliding_window"))?;
            if window == 0 {
                return Err(ModelError::BadKey {
                    key: key("attention.sliding_window"),
                    reason: "a window of 0 positions".into(),
                });
            }
            Some(SlidingWindow {
                window,
                rope_theta: opt(md_f32(md, &key("rope.freq_base_swa")))?.unwrap_or(10_000.0),
                global_period: 6,
            })
        } else {
            None
        };
        let embd = tensor_shape(content, "token_embd.weight")?;
        let [vocab_size, embd_hidden] = embd[..] else {
            return Err(bad_shape("token_embd.weight", &embd, "rank 2"));
        };
        if embd_hidden != hidden_size {
            return Err(bad_shape(
                "token_embd.weight",
                &embd,
                &format!("[vocab, {hidden_size}]"),
            ));
        }
        let intermediate_size = match opt(md_usize(md, &key("feed_forward_length")))? {
            Some(n) => n,
            // Phi-3's `ffn_up` holds gate and up.
            None if arch == Arch::Phi3 => tensor_shape(content, "blk.0.ffn_up.weight")?[0] / 2,
            None => tensor_shape(content, "blk.0.ffn_up.weight")?[0],
        };
        // Bounds far above any real model, so corrupt values fail here instead of overflowing
        // or allocating absurd buffers later.
        for (k, v) in [
            ("embedding_length", hidden_size),
            ("feed_forward_length", intermediate_size),
            ("block_count", num_layers),
            ("attention.head_count", num_heads),
            ("attention.key_length", head_dim),
        ] {
            if v == 0 || v > 1 << 20 {
                return Err(ModelError::BadKey {
                    key: key(k),
                    reason: format!("{v} is out of range"),
                });
            }
        }
        // Gemma 3 27B (62 layers) scales queries by 1/sqrt(hidden/heads) rather than 1/sqrt(head_dim).
        let query_scale = if arch == Arch::Gemma3 && num_layers == 62 {
            (head_dim as f32 / (hidden_size / num_heads) as f32).sqrt()
        } else {
            1.0
        };
        Ok(Self {
            arch,
            vocab_size,
            hidden_size,
            intermediate_size,
            num_layers,
            num_heads,
            num_kv_heads,
            head_dim,
            rope_theta,
            rms_eps,
            context_length,
            tied_embeddings: !content.tensor_infos.contains_key("output.weight"),
            qk_norm: matches!(arch, Arch::Qwen3 | Arch::Gemma3),
            rope_linear_factor,
            query_scale,
            sliding,
        })
    }
}

/// The linear RoPE factor from `{arch}.rope.scaling.*`. Other scaling types (YaRN, LongRoPE) are refused rather
/// than ignored: ignoring one serves a model that decodes other tokens than llama.cpp without saying so.
fn rope_linear_factor(md: &HashMap<String, Value>, key: &dyn Fn(&str) -> String) -> Result<f32> {
    let ty = opt(md_str(md, &key("rope.scaling.type")))?;
    let factor = opt(md_f32(md, &key("rope.scaling.factor")))?;
    match (ty, factor) {
        (None | Some("none"), _) => Ok(1.0),
        (Some("linear"), None) => Ok(1.0),
        (Some("linear"), Some(f)) if f.is_finite() && f > 0.0 => Ok(f),
        (Some("linear"), Some(f)) => Err(ModelError::BadKey {
            key: key("rope.scaling.factor"),
            reason: format!("{f} is not a positive factor"),
        }),
        (Some(other), _) => Err(ModelError::BadKey {
            key: key("rope.scaling.type"),
            reason: format!("RoPE scaling `{other}` is not supported (supported: none, linear)"),
        }),
    }
}

fn bad_shape(name: &str, got: &[usize], want: &str) -> ModelError {
    ModelError::BadTensor {
        name: name.to_string(),
        reason: format!("shape {got:?}, expected {want}"),
    }
}

fn tensor_shape(content: &Content, name: &str) -> Result<Vec<usize>> {
    content
        .tensor_infos
        .get(name)
        .map(|t| t.shape.dims().to_vec())
        .ok_or_else(|| ModelError::MissingTensor {
            name: name.to_string(),
        })
}

/// Turns a `MissingKey` into `None`, keeping other errors.
fn opt<T>(r: Result<T>) -> Result<Option<T>> {
    match r {
        Ok(v) => Ok(Some(v)),
        Err(ModelError::MissingKey { .. }) => Ok(None),
        Err(e) => Err(e),
    }
}

pub(crate) fn md_get<'a>(md: &'a HashMap<String, Value>, key: &str) -> Result<&'a Value> {
    md.get(key).ok_or_else(|| ModelError::MissingKey {
        key: key.to_string(),
    })
}

fn bad_key(key: &str, v: &Value, want: &str) -> ModelError {
    ModelError::BadKey {
        key: key.to_string(),
        reason: format!("expected {want}, found {:?}", v.value_type()),
    }
}

/// Any non-negative integer type as `usize` (writers disagree on u32 vs u64 vs i32).
pub(crate) fn md_usize(md: &HashMap<String, Value>, key: &str) -> Result<usize> {
    let v = md_get(md, key)?;
    value_usize(v).ok_or_else(|| bad_key(key, v, "a non-negative integer"))
}

fn value_usize(v: &Value) -> Option<usize> {
    let n: i128 = match v {
        Value::U8(x) => *x as i128,
        Value::I8(x) => *x as i128,
        Value::U16(x) => *x as i128,
        Value::I16(x) => *x as i128,
        Value::U32(x) => *x as i128,
        Value::I32(x) => *x as i128,
        Value::U64(x) => *x as i128,
        Value::I64(x) => *x as i128,
        _ => return None,
    };
    usize::try_from(n).ok()
}

pub(crate) fn md_f32(md: &HashMap<String, Value>, key: &str) -> Result<f32> {
    let v = md_get(md, key)?;
    match v {
        Value::F32(x) => Ok(*x),
        Value::F64(x) => Ok(*x as f32),
        _ => Err(bad_key(key, v, "a float")),
    }
}

pub(crate) fn md_str<'a>(md: &'a HashMap<String, Value>, key: &str) -> Result<&'a str> {
    let v = md_get(md, key)?;
    match v {
        Value::String(s) => Ok(s),
        _ => Err(bad_key(key, v, "a string")),
    }
}

pub(crate) fn md_str_array<'a>(md: &'a HashMap<String, Value>, key: &str) -> Result<Vec<&'a str>> {
    let v = md_get(md, key)?;
    let Value::Array(items) = v else {
        return Err(bad_key(key, v, "an array of strings"));
    };
    items
        .iter()
        .enumerate()
        .map(|(i, it)| match it {
            Value::String(s) => Ok(s.as_str()),
            _ => Err(ModelError::BadKey {
                key: key.to_string(),
                reason: format!("element {i} is {:?}, expected a string", it.value_type()),
            }),
        })
        .collect()
}

pub(crate) fn md_int_array(md: &HashMap<String, Value>, key: &str) -> Result<Vec<i64>> {
    let v = md_get(md, key)?;
    let Value::Array(items) = v else {
        return Err(bad_key(key, v, "an array of integers"));
    };
    items
        .iter()
        .enumerate()
        .map(|(i, it)| {
            value_usize(it)
                .map(|n| n as i64)
                .or(match it {
                    Value::I32(x) => Some(*x as i64),
                    Value::I64(x) => Some(*x),
                    _ => None,
                })
                .ok_or_else(|| ModelError::BadKey {
                    key: key.to_string(),
                    reason: format!("element {i} is {:?}, expected an integer", it.value_type()),
                })
        })
        .collect()
}

/// An opened GGUF: parsed header plus a reader for tensor data.
pub struct GgufFile {
    path: PathBuf,
    pub content: Content,
    reader: BufReader<File>,
}

impl std::fmt::Debug for GgufFile {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GgufFile")
            .field("path", &self.path)
            .field("tensors", &self.content.tensor_infos.len())
            .finish()
    }
}

impl GgufFile {
    /// Parses the header; tensor data is read lazily by [`GgufFile::tensor`].
    pub fn open(path: impl AsRef<Path>) -> Result<Self> {
        let path = path.as_ref().to_path_buf();
        let file = File::open(&path).map_err(|e| io_err(&path, e))?;
        let mut reader = BufReader::new(file);
        let content = Content::read(&mut reader).map_err(|e| ModelError::Gguf {
            path: path.display().to_string(),
            reason: e.to_string(),
        })?;
        Ok(Self {
            path,
            content,
            reader,
        })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    pub fn metadata(&self) -> &HashMap<String, Value> {
        &self.content.metadata
    }

    pub fn has_tensor(&self, name: &str) -> bool {
        self.content.tensor_infos.contains_key(name)
    }

    /// Reads one tensor, checking its shape when `expect` is given (dims in candle order, i.e.
    /// `[out, in]` for a linear weight).
    pub fn tensor(&mut self, name: &str, expect: Option<&[usize]>) -> Result<Arc<QTensor>> {
        let info =
            self.content
                .tensor_infos
                .get(name)
                .ok_or_else(|| ModelError::MissingTensor {
                    name: name.to_string(),
                })?;
        if let Some(want) = expect
            && info.shape.dims() != want
        {
            return Err(bad_shape(name, info.shape.dims(), &format!("{want:?}")));
        }
        let q = info
            .read(
                &mut self.reader,
                self.content.tensor_data_offset,
                &Device::Cpu,
            )
            .map_err(|e| ModelError::BadTensor {
                name: name.to_string(),
                reason: e.to_string(),
            })?;
        Ok(Arc::new(q))
    }
}

/// Writes a GGUF (v2, 32-byte aligned) with candle's writer. Used for tests and tiny fixtures.
pub fn write_gguf(
    path: impl AsRef<Path>,
    metadata: &[(String, Value)],
    tensors: &[(String, QTensor)],
) -> Result<()> {
    let path = path.as_ref();
    let mut f = std::io::BufWriter::new(File::create(path).map_err(|e| io_err(path, e))?);
    let md: Vec<(&str, &Value)> = metadata.iter().map(|(k, v)| (k.as_str(), v)).collect();
    let ts: Vec<(&str, &QTensor)> = tensors.iter().map(|(k, v)| (k.as_str(), v)).collect();
    gguf_file::write(&mut f, &md, &ts)?;
    use std::io::Write;
    f.flush().map_err(|e| io_err(path, e))?;
    Ok(())
}

/// Shape of a tiny random model for tests and benches.
#[derive(Debug, Clone)]
pub struct TinySpec {
    pub arch: Arch,
    pub hidden_size: usize,
    pub intermediate_size: usize,
    pub num_layers: usize,
    pub num_heads: usize,
    pub num_kv_heads: usize,
    pub head_dim: usize,
    pub tied_embeddings: bool,
    /// Storage type of the 2-D matrices (norms stay F32, as in real GGUFs).
    pub dtype: GgmlDType,
    pub seed: u64,
    /// Positions the model accepts (the tiny tokenizer spends about one token per character).
    pub context_length: usize,
    /// Write a `rope_freqs.weight` with Llama 3.1's per-frequency factors (see [`llama3_rope_factors`]).
    pub rope_freqs: bool,
    /// Write `rope.scaling.type = linear` with this factor.
    pub rope_linear_factor: Option<f32>,
    /// Write `tokenizer.ggml.add_bos_token` (BOS is `<|im_start|>`'s id) with the tiny BPE.
    pub add_bos_token: Option<bool>,
    /// Write `tokenizer.ggml.eot_token_id` with the tiny BPE.
    pub eot_token_id: Option<u32>,
    /// Gemma 3's `attention.sliding_window` (written for gemma3 only).
    pub sliding_window: usize,
    /// `tokenizer.*` metadata written in place of the tiny byte-level BPE's (a SentencePiece vocabulary, say), and
    /// any other key to replace (`general.name`); the embedding has a row per entry of its `tokenizer.ggml.tokens`.
    pub tokenizer: Option<Vec<(String, Value)>>,
}

impl TinySpec {
    /// hidden 64, 2 layers, 4 heads / 2 kv heads: small enough for debug-build tests. Qwen3 and Gemma 3 get
    /// head_dim 32, so `heads × head_dim` (128) differs from hidden as in the real models; the others get 16
    /// (= hidden / heads). Llama and Gemma 3 tie their embeddings, like SmolLM2 and Gemma. Gemma 3 gets 6
    /// layers, so that one of them (the sixth) is a global layer with the other RoPE base.
    pub fn new(arch: Arch) -> Self {
        Self {
            arch,
            hidden_size: 64,
            intermediate_size: 128,
            num_layers: if arch == Arch::Gemma3 { 6 } else { 2 },
            num_heads: 4,
            num_kv_heads: 2,
            head_dim: if matches!(arch, Arch::Qwen3 | Arch::Gemma3) {
                32
            } else {
                16
            },
            tied_embeddings: matches!(arch, Arch::Llama | Arch::Gemma3),
            dtype: GgmlDType::F32,
            seed: 7,
            context_length: 256,
            rope_freqs: false,
            rope_linear_factor: None,
            add_bos_token: None,
            eot_token_id: None,
            sliding_window: 512,
            tokenizer: None,
        }
    }
}

/// The RoPE frequency divisors Llama 3.1's converter writes as `rope_freqs.weight` (`convert_hf_to_gguf.py`,
/// `rope_type = llama3`): 1 for wavelengths under `original_context / high_freq_factor`, `factor` above
/// `original_context / low_freq_factor`, and a smooth blend between. Here with factor 8, low 1, high 4 and an
/// original context of 64 positions, so that a tiny model's few frequencies span all three regimes.
pub fn llama3_rope_factors(head_dim: usize, theta: f32) -> Vec<f32> {
    let (factor, low, high, original) = (8.0f64, 1.0f64, 4.0f64, 64.0f64);
    (0..head_dim / 2)
        .map(|i| {
            let freq = (theta as f64).powf(-2.0 * i as f64 / head_dim as f64);
            let wavelen = 2.0 * std::f64::consts::PI / freq;
            if wavelen < original / high {
                1.0
            } else if wavelen > original / low {
                factor as f32
            } else {
                let smooth = (original / wavelen - low) / (high - low);
                (1.0 / ((1.0 - smooth) / factor + smooth)) as f32
            }
        })
        .collect()
}

/// Writes a tiny model with seeded random weights and the tiny tokenizer from
/// [`super::tokenizer::tiny_vocab`]. Returns its configuration.
pub fn write_tiny_model(path: impl AsRef<Path>, spec: &TinySpec) -> Result<ModelConfig> {
    let (tokens, merges, types) = super::tokenizer::tiny_vocab();
    let vocab = match &spec.tokenizer {
        None => tokens.len(),
        Some(md) => match md.iter().find(|(k, _)| k == "tokenizer.ggml.tokens") {
            Some((_, Value::Array(t))) => t.len(),
            _ => {
                return Err(ModelError::MissingKey {
                    key: "tokenizer.ggml.tokens".into(),
                });
            }
        },
    };
    let h = spec.hidden_size;
    let mut rng = StdRng::seed_from_u64(spec.seed);
    let mut tensors: Vec<(String, QTensor)> = Vec::new();
    let mut mat = |name: String, rows: usize, cols: usize, scale: f32, dtype: GgmlDType| {
        let data: Vec<f32> = (0..rows * cols)
            .map(|_| rng.random_range(-scale..scale))
            .collect();
        (name, data, rows, cols, dtype)
    };
    let mut raw = Vec::new();
    let wscale = |fan_in: usize| 1.7 / (fan_in as f32).sqrt();
    // Small embeddings so the blocks, not the residual copy of the input token, decide the
    // (tied) logits: otherwise greedy decoding just repeats the last token.
    raw.push(mat("token_embd.weight".into(), vocab, h, 0.1, spec.dtype));
    if !spec.tied_embeddings {
        raw.push(mat("output.weight".into(), vocab, h, wscale(h), spec.dtype));
    }
    let (q, kv, ff) = (
        spec.num_heads * spec.head_dim,
        spec.num_kv_heads * spec.head_dim,
        spec.intermediate_size,
    );
    let phi3 = spec.arch == Arch::Phi3;
    for l in 0..spec.num_layers {
        let p = format!("blk.{l}");
        if phi3 {
            // Phi-3's converter fuses q, k and v (in that order) into one matrix, and gate and up.
            raw.push(mat(
                format!("{p}.attn_qkv.weight"),
                q + 2 * kv,
                h,
                wscale(h),
                spec.dtype,
            ));
        } else {
            for (name, rows) in [("attn_q", q), ("attn_k", kv), ("attn_v", kv)] {
                raw.push(mat(
                    format!("{p}.{name}.weight"),
                    rows,
                    h,
                    wscale(h),
                    spec.dtype,
                ));
            }
        }
        raw.push(mat(
            format!("{p}.attn_output.weight"),
            h,
            q,
            wscale(q),
            spec.dtype,
        ));
        if !phi3 {
            raw.push(mat(
                format!("{p}.ffn_gate.weight"),
                ff,
                h,
                wscale(h),
                spec.dtype,
            ));
        }
        raw.push(mat(
            format!("{p}.ffn_up.weight"),
            if phi3 { 2 * ff } else { ff },
            h,
            wscale(h),
            spec.dtype,
        ));
        raw.push(mat(
            format!("{p}.ffn_down.weight"),
            h,
            ff,
            wscale(ff),
            spec.dtype,
        ));
    }
    // Qwen2's q/k/v biases, large enough that dropping one (or adding it after RoPE) moves the logits.
    if spec.arch == Arch::Qwen2 {
        for l in 0..spec.num_layers {
            for (name, n) in [("attn_q", q), ("attn_k", kv), ("attn_v", kv)] {
                let data: Vec<f32> = (0..n).map(|_| rng.random_range(-0.5f32..0.5)).collect();
                raw.push((format!("blk.{l}.{name}.bias"), data, 1, n, GgmlDType::F32));
            }
        }
    }
    // Norm weights near 1 but not 1, so a missing norm multiply shows up in the exactness tests.
    let mut norm = |name: String, n: usize| {
        let data: Vec<f32> = (0..n).map(|_| rng.random_range(0.8f32..1.2)).collect();
        (name, data, 1, n, GgmlDType::F32)
    };
    let mut norms = vec![norm("output_norm.weight".into(), h)];
    if spec.rope_freqs {
        let f = llama3_rope_factors(spec.head_dim, 10_000.0);
        norms.push((
            "rope_freqs.weight".into(),
            f,
            1,
            spec.head_dim / 2,
            GgmlDType::F32,
        ));
    }
    for l in 0..spec.num_layers {
        norms.push(norm(format!("blk.{l}.attn_norm.weight"), h));
        norms.push(norm(format!("blk.{l}.ffn_norm.weight"), h));
        if matches!(spec.arch, Arch::Qwen3 | Arch::Gemma3) {
            norms.push(norm(format!("blk.{l}.attn_q_norm.weight"), spec.head_dim));
            norms.push(norm(format!("blk.{l}.attn_k_norm.weight"), spec.head_dim));
        }
        if spec.arch == Arch::Gemma3 {
            norms.push(norm(format!("blk.{l}.post_attention_norm.weight"), h));
            norms.push(norm(format!("blk.{l}.post_ffw_norm.weight"), h));
        }
    }
    for (name, data, rows, cols, dtype) in raw.into_iter().chain(norms) {
        let t = if rows == 1 {
            Tensor::from_vec(data, cols, &Device::Cpu)?
        } else {
            Tensor::from_vec(data, (rows, cols), &Device::Cpu)?
        };
        tensors.push((name, QTensor::quantize(&t, dtype)?));
    }
    let a = spec.arch.as_str();
    let u = |n: usize| Value::U32(n as u32);
    let mut md: Vec<(String, Value)> = vec![
        ("general.architecture".into(), Value::String(a.into())),
        ("general.name".into(), Value::String("hearth-tiny".into())),
        (format!("{a}.block_count"), u(spec.num_layers)),
        (format!("{a}.embedding_length"), u(h)),
        (format!("{a}.feed_forward_length"), u(ff)),
        (format!("{a}.context_length"), u(spec.context_length)),
        (format!("{a}.attention.head_count"), u(spec.num_heads)),
        (format!("{a}.attention.head_count_kv"), u(spec.num_kv_heads)),
        (format!("{a}.attention.key_length"), u(spec.head_dim)),
        (format!("{a}.attention.value_length"), u(spec.head_dim)),
        (format!("{a}.rope.dimension_count"), u(spec.head_dim)),
        // Gemma 3's global layers use a larger base than its sliding ones (10000, implied).
        (
            format!("{a}.rope.freq_base"),
            Value::F32(if spec.arch == Arch::Gemma3 {
                1_000_000.0
            } else {
                10_000.0
            }),
        ),
        (
            format!("{a}.attention.layer_norm_rms_epsilon"),
            Value::F32(1e-6),
        ),
    ];
    if spec.arch == Arch::Gemma3 {
        md.push((
            format!("{a}.attention.sliding_window"),
            u(spec.sliding_window),
        ));
    }
    if let Some(f) = spec.rope_linear_factor {
        md.push((
            format!("{a}.rope.scaling.type"),
            Value::String("linear".into()),
        ));
        md.push((format!("{a}.rope.scaling.factor"), Value::F32(f)));
    }
    if let Some(tok_md) = &spec.tokenizer {
        // A key given there (`general.name`, say) replaces the default: GGUF readers refuse a key twice.
        md.retain(|(k, _)| tok_md.iter().all(|(t, _)| t != k));
        md.extend(tok_md.iter().cloned());
    } else {
        md.push(("tokenizer.ggml.model".into(), Value::String("gpt2".into())));
        md.push(("tokenizer.ggml.pre".into(), Value::String("gpt2".into())));
        md.push((
            "tokenizer.ggml.tokens".into(),
            Value::Array(tokens.into_iter().map(Value::String).collect()),
        ));
        md.push((
            "tokenizer.ggml.merges".into(),
            Value::Array(merges.into_iter().map(Value::String).collect()),
        ));
        md.push((
            "tokenizer.ggml.token_type".into(),
            Value::Array(types.into_iter().map(Value::I32).collect()),
        ));
        let special = |t: &str| super::tokenizer::tiny_special_id(t).map(|i| Value::U32(i as u32));
        md.push((
            "tokenizer.ggml.bos_token_id".into(),
            special("<|im_start|>")?,
        ));
        md.push(("tokenizer.ggml.eos_token_id".into(), special("<|im_end|>")?));
        md.push((
            "tokenizer.ggml.padding_token_id".into(),
            special("<|endoftext|>")?,
        ));
        if let Some(b) = spec.add_bos_token {
            md.push(("tokenizer.ggml.add_bos_token".into(), Value::Bool(b)));
        }
        if let Some(id) = spec.eot_token_id {
            md.push(("tokenizer.ggml.eot_token_id".into(), Value::U32(id)));
        }
    }
    let path = path.as_ref();
    write_gguf(path, &md, &tensors)?;
    ModelConfig::from_gguf(&GgufFile::open(path)?.content)
}
