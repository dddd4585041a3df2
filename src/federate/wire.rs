//! Wire formats for model deltas.
//!
//! * gym blob: what zen/gym sends — `u64 LE header length` + compact JSON header whose entries carry `offsets`
//!   (not `data_offsets`) + raw bf16 bytes. Real safetensors readers reject it, so we read and write it ourselves.
//! * native: real safetensors (bf16, round-to-nearest-even) with PEFT tensor names, via the `safetensors` crate.
//!
//! Every decoder here takes bytes from the network: lengths and offsets are checked, never trusted.

use std::collections::HashMap;

use safetensors::tensor::{Dtype, SafeTensors, TensorView};

/// One named tensor of a delta (or of adapter state), always f32 in memory.
#[derive(Debug, Clone, PartialEq)]
pub struct Tensor {
    pub name: String,
    pub shape: Vec<usize>,
    pub data: Vec<f32>,
}

impl Tensor {
    pub fn new(name: impl Into<String>, shape: Vec<usize>, data: Vec<f32>) -> Tensor {
        Tensor {
            name: name.into(),
            shape,
            data,
        }
    }
}

/// A delta is an ordered list of tensors; the order is the wire order. This is the shape a trainer hands over.
pub type Delta = Vec<Tensor>;

/// Which wire dialect a coordinator or client speaks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum WireMode {
    /// zen/gym blob, bf16 by truncation, gym aggregation semantics.
    Gym,
    /// safetensors, bf16 round-to-nearest-even.
    Native,
}

/// How f32 values become bf16.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Rounding {
    /// Drop the low 16 bits (gym's numpy path).
    Truncate,
    /// Round to nearest, ties to even (torch; the `half` crate's conversion).
    NearestEven,
}

#[derive(Debug, thiserror::Error)]
pub enum WireError {
    #[error("blob shorter than its declared header ({0} bytes)")]
    Truncated(usize),
    #[error("header length {0} exceeds the limit")]
    HeaderTooLarge(u64),
    #[error("header is not valid JSON: {0}")]
    HeaderJson(String),
    #[error("tensor {name}: {reason}")]
    BadTensor { name: String, reason: String },
    #[error("unsupported dtype {dtype} for tensor {name}")]
    Dtype { name: String, dtype: String },
    #[error("tensor {0} contains a non-finite value")]
    NonFinite(String),
    #[error("safetensors: {0}")]
    SafeTensors(String),
    #[error("duplicate tensor name {0}")]
    Duplicate(String),
}

/// Largest accepted header; far above any adapter's, small enough that a hostile length cannot exhaust memory.
pub const MAX_HEADER_BYTES: u64 = 16 << 20;

#[inline]
pub fn bf16_to_f32(bits: u16) -> f32 {
    f32::from_bits((bits as u32) << 16)
}

#[inline]
pub fn f32_to_bf16_trunc(x: f32) -> u16 {
    (x.to_bits() >> 16) as u16
}

/// Round-to-nearest-even via `half` (which also keeps NaN a NaN).
#[inline]
pub fn f32_to_bf16_rne(x: f32) -> u16 {
    half::bf16::from_f32(x).to_bits()
}

#[inline]
pub fn f32_to_bf16(x: f32, r: Rounding) -> u16 {
    match r {
        Rounding::Truncate => f32_to_bf16_trunc(x),
        Rounding::NearestEven => f32_to_bf16_rne(x),
    }
}

/// Default rounding per mode: gym truncates, native rounds to nearest even.
pub fn rounding_for(mode: WireMode) -> Rounding {
    match mode {
        WireMode::Gym => Rounding::Truncate,
        WireMode::Native => Rounding::NearestEven,
    }
}

fn checked_numel(name: &str, shape: &[usize]) -> Result<usize, WireError> {
    shape
        .iter()
        .try_fold(1usize, |acc, &d| acc.checked_mul(d))
        .ok_or_else(|| WireError::BadTensor {
            name: name.to_owned(),
            reason: "shape overflows".into(),
        })
}

fn bf16_bytes(data: &[f32], r: Rounding, out: &mut Vec<u8>) {
    out.reserve(data.len() * 2);
    for &x in data {
        out.extend_from_slice(&f32_to_bf16(x, r).to_le_bytes());
    }
}

/// The gym header for tensors of these names and shapes laid out back to back, in this order. Compact, keys in
/// insertion order, as gym's `json.dumps(separators=(",",":"))` writes it. Returns the header and the data length.
pub fn gym_header<'a>(
    entries: impl IntoIterator<Item = (&'a str, &'a [usize])>,
) -> Result<(String, usize), WireError> {
    let mut header = String::from("{");
    let mut off = 0usize;
    for (i, (name, shape)) in entries.into_iter().enumerate() {
        let n = checked_numel(name, shape)?;
        if i > 0 {
            header.push(',');
        }
        let key = serde_json::to_string(name).map_err(|e| WireError::HeaderJson(e.to_string()))?;
        let dims: Vec<String> = shape.iter().map(|d| d.to_string()).collect();
        header.push_str(&format!(
            "{key}:{{\"dtype\":\"BF16\",\"shape\":[{}],\"offsets\":[{},{}]}}",
            dims.join(","),
            off,
            off + 2 * n
        ));
        off += 2 * n;
    }
    header.push('}');
    Ok((header, off))
}

/// Encodes a gym blob (see [`gym_header`]).
pub fn encode_gym(tensors: &[Tensor], rounding: Rounding) -> Result<Vec<u8>, WireError> {
    for t in tensors {
        let n = checked_numel(&t.name, &t.shape)?;
        if n != t.data.len() {
            return Err(WireError::BadTensor {
                name: t.name.clone(),
                reason: format!("shape holds {n} values, data {}", t.data.len()),
            });
        }
    }
    let (header, data_len) = gym_header(
        tensors
            .iter()
            .map(|t| (t.name.as_str(), t.shape.as_slice())),
    )?;
    let mut out = Vec::with_capacity(8 + header.len() + data_len);
    out.extend_from_slice(&(header.len() as u64).to_le_bytes());
    out.extend_from_slice(header.as_bytes());
    for t in tensors {
        bf16_bytes(&t.data, rounding, &mut out);
    }
    Ok(out)
}

/// A decoded gym blob that borrows the raw bf16 bytes (the aggregation hot path reads them in place).
#[derive(Debug)]
pub struct GymView<'a> {
    /// (name, shape, bf16 little-endian bytes), in wire order.
    pub tensors: Vec<(String, Vec<usize>, &'a [u8])>,
    /// All tensor bytes as one slice, when they lie back to back from offset 0 (as gym writes them).
    pub flat: Option<&'a [u8]>,
}

#[derive(serde::Deserialize)]
struct GymEntry {
    dtype: String,
    shape: Vec<usize>,
    offsets: [u64; 2],
}

fn split_header(blob: &[u8]) -> Result<(&[u8], &[u8]), WireError> {
    if blob.len() < 8 {
        return Err(WireError::Truncated(blob.len()));
    }
    let mut n = [0u8; 8];
    n.copy_from_slice(&blob[..8]);
    let hlen = u64::from_le_bytes(n);
    if hlen > MAX_HEADER_BYTES {
        return Err(WireError::HeaderTooLarge(hlen));
    }
    let end = 8 + hlen as usize;
    if blob.len() < end {
        return Err(WireError::Truncated(blob.len()));
    }
    Ok((&blob[8..end], &blob[end..]))
}

/// Parses a gym blob without copying tensor data. Order is recovered from the offsets (gym writes them in insertion
/// order), so we need no order-preserving JSON map.
pub fn decode_gym_view(blob: &[u8]) -> Result<GymView<'_>, WireError> {
    let (header, data) = split_header(blob)?;
    let map: HashMap<String, GymEntry> =
        serde_json::from_slice(header).map_err(|e| WireError::HeaderJson(e.to_string()))?;
    let mut entries: Vec<(String, GymEntry)> = map.into_iter().collect();
    entries.sort_by_key(|(_, e)| e.offsets);
    let mut tensors = Vec::with_capacity(entries.len());
    let mut prev_end = 0u64;
    let mut contiguous = true;
    for (name, e) in entries {
        if e.dtype != "BF16" {
            return Err(WireError::Dtype {
                name,
                dtype: e.dtype,
            });
        }
        let [s, t] = e.offsets;
        let n = checked_numel(&name, &e.shape)? as u64;
        let bad = |reason: &str| WireError::BadTensor {
            name: name.clone(),
            reason: reason.to_owned(),
        };
        if t < s || t - s != n.saturating_mul(2) {
            return Err(bad("offsets do not match shape"));
        }
        if s != prev_end {
            contiguous = false;
        }
        if s < prev_end {
            return Err(bad("overlapping offsets"));
        }
        if t > data.len() as u64 {
            return Err(bad("offsets past the end of the blob"));
        }
        prev_end = t;
        tensors.push((name, e.shape, &data[s as usize..t as usize]));
    }
    let flat = contiguous.then(|| &data[..prev_end as usize]);
    Ok(GymView { tensors, flat })
}

fn bf16_slice_to_f32(name: &str, bytes: &[u8]) -> Result<Vec<f32>, WireError> {
    let v: Vec<f32> = bytes
        .chunks_exact(2)
        .map(|c| bf16_to_f32(u16::from_le_bytes([c[0], c[1]])))
        .collect();
    if v.iter().any(|x| !x.is_finite()) {
        return Err(WireError::NonFinite(name.to_owned()));
    }
    Ok(v)
}

/// Decodes a gym blob into f32 tensors; non-finite values are refused (they would poison any aggregate).
pub fn decode_gym(blob: &[u8]) -> Result<Delta, WireError> {
    let view = decode_gym_view(blob)?;
    view.tensors
        .into_iter()
        .map(|(name, shape, bytes)| {
            let data = bf16_slice_to_f32(&name, bytes)?;
            Ok(Tensor { name, shape, data })
        })
        .collect()
}

/// Encodes real safetensors with bf16 data (RNE unless told otherwise). safetensors sorts tensors by dtype and
/// name on disk; that is fine, names carry the meaning.
pub fn encode_safetensors(
    tensors: &[Tensor],
    rounding: Rounding,
    metadata: Option<HashMap<String, String>>,
) -> Result<Vec<u8>, WireError> {
    let mut bufs = Vec::with_capacity(tensors.len());
    for t in tensors {
        let n = checked_numel(&t.name, &t.shape)?;
        if n != t.data.len() {
            return Err(WireError::BadTensor {
                name: t.name.clone(),
                reason: format!("shape holds {n} values, data {}", t.data.len()),
            });
        }
        let mut b = Vec::new();
        bf16_bytes(&t.data, rounding, &mut b);
        bufs.push(b);
    }
    let mut views = Vec::with_capacity(tensors.len());
    for (t, b) in tensors.iter().zip(&bufs) {
        let v = TensorView::new(Dtype::BF16, t.shape.clone(), b)
            .map_err(|e| WireError::SafeTensors(e.to_string()))?;
        views.push((t.name.clone(), v));
    }
    safetensors::tensor::serialize(views, metadata)
        .map_err(|e| WireError::SafeTensors(e.to_string()))
}

/// Decodes safetensors (BF16, F16 or F32) into f32 tensors, sorted by name for a stable order.
pub fn decode_safetensors(bytes: &[u8]) -> Result<Delta, WireError> {
    let st = SafeTensors::deserialize(bytes).map_err(|e| WireError::SafeTensors(e.to_string()))?;
    let mut out = Vec::new();
    for (name, view) in st.tensors() {
        let raw = view.data();
        let data: Vec<f32> = match view.dtype() {
            Dtype::BF16 => bf16_slice_to_f32(&name, raw)?,
            Dtype::F16 => raw
                .chunks_exact(2)
                .map(|c| half::f16::from_bits(u16::from_le_bytes([c[0], c[1]])).to_f32())
                .collect(),
            Dtype::F32 => raw
                .chunks_exact(4)
                .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
                .collect(),
            other => {
                return Err(WireError::Dtype {
                    name,
                    dtype: format!("{other:?}"),
                });
            }
        };
        if data.iter().any(|x| !x.is_finite()) {
            return Err(WireError::NonFinite(name));
        }
        out.push(Tensor {
            name,
            shape: view.shape().to_vec(),
            data,
        });
    }
    out.sort_by(|a, b| a.name.cmp(&b.name));
    Ok(out)
}

/// Encodes in the given mode with that mode's rounding.
pub fn encode(mode: WireMode, tensors: &[Tensor]) -> Result<Vec<u8>, WireError> {
    match mode {
        WireMode::Gym => encode_gym(tensors, Rounding::Truncate),
        WireMode::Native => encode_safetensors(tensors, Rounding::NearestEven, None),
    }
}

/// Decodes in the given mode.
pub fn decode(mode: WireMode, bytes: &[u8]) -> Result<Delta, WireError> {
    match mode {
        WireMode::Gym => decode_gym(bytes),
        WireMode::Native => decode_safetensors(bytes),
    }
}

/// PEFT key for a LoRA factor, e.g. `base_model.model.model.layers.3.self_attn.q_proj.lora_A.weight`.
/// `module` is the path under the layer (`self_attn.q_proj`, `mlp.down_proj`); `factor` is `'A'` or `'B'`.
pub fn peft_lora_key(layer: usize, module: &str, factor: char) -> String {
    format!("base_model.model.model.layers.{layer}.{module}.lora_{factor}.weight")
}

/// The subset of PEFT's `adapter_config.json` that aggregation needs (unknown fields are ignored).
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct AdapterConfig {
    #[serde(default = "lora_str")]
    pub peft_type: String,
    #[serde(default)]
    pub base_model_name_or_path: Option<String>,
    pub r: usize,
    pub lora_alpha: f64,
    #[serde(default)]
    pub target_modules: Vec<String>,
    #[serde(default)]
    pub use_rslora: bool,
    #[serde(default)]
    pub use_dora: bool,
}

fn lora_str() -> String {
    "LORA".into()
}

impl AdapterConfig {
    /// PEFT's scale: `alpha / r`, or `alpha / sqrt(r)` with rsLoRA.
    pub fn scale(&self) -> f64 {
        let r = self.r.max(1) as f64;
        if self.use_rslora {
            self.lora_alpha / r.sqrt()
        } else {
            self.lora_alpha / r
        }
    }
}
