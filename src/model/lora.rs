//! LoRA adapters: PEFT load/save, fresh initialisation, and a registry that swaps adapters while
//! serving.
//!
//! An adapter is a [`LoraSet`]: `(layer, target) -> LoraPair` with `A: [r, in]`, `B: [out, r]` in
//! f32 and its scale (`alpha/r`, or `alpha/√r` for rsLoRA). Sets are immutable once built and
//! shared as `Arc<LoraSet>`: a request keeps the `Arc` it started with, so replacing an adapter in
//! the [`AdapterRegistry`] never changes a generation midway.

use std::collections::{BTreeMap, HashMap};
use std::path::Path;
use std::sync::{Arc, RwLock};

use candle_core::{DType, Device, Tensor, Var};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde::{Deserialize, Serialize};

use super::gguf::{Arch, ModelConfig};
use super::transformer::Transformer;
use super::{ModelError, Result, io_err};

/// The seven projections LoRA may adapt.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub enum LoraTarget {
    Q,
    K,
    V,
    O,
    Gate,
    Up,
    Down,
}

impl LoraTarget {
    pub const ALL: [LoraTarget; 7] = [
        LoraTarget::Q,
        LoraTarget::K,
        LoraTarget::V,
        LoraTarget::O,
        LoraTarget::Gate,
        LoraTarget::Up,
        LoraTarget::Down,
    ];

    /// PEFT / Hugging Face module name (`q_proj`, …).
    pub fn peft_name(self) -> &'static str {
        match self {
            LoraTarget::Q => "q_proj",
            LoraTarget::K => "k_proj",
            LoraTarget::V => "v_proj",
            LoraTarget::O => "o_proj",
            LoraTarget::Gate => "gate_proj",
            LoraTarget::Up => "up_proj",
            LoraTarget::Down => "down_proj",
        }
    }

    /// Parent module in the HF model tree.
    pub fn peft_parent(self) -> &'static str {
        match self {
            LoraTarget::Q | LoraTarget::K | LoraTarget::V | LoraTarget::O => "self_attn",
            _ => "mlp",
        }
    }

    pub fn from_peft_name(s: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|t| t.peft_name() == s)
    }

    /// GGUF tensor stem (`attn_q`, …): `blk.{layer}.{stem}.weight`.
    pub fn gguf_name(self) -> &'static str {
        match self {
            LoraTarget::Q => "attn_q",
            LoraTarget::K => "attn_k",
            LoraTarget::V => "attn_v",
            LoraTarget::O => "attn_output",
            LoraTarget::Gate => "ffn_gate",
            LoraTarget::Up => "ffn_up",
            LoraTarget::Down => "ffn_down",
        }
    }

    /// `model.layers.{layer}.self_attn.q_proj`: the module path PEFT patterns match against.
    pub fn module_path(self, layer: usize) -> String {
        format!(
            "model.layers.{layer}.{}.{}",
            self.peft_parent(),
            self.peft_name()
        )
    }
}

/// `target_modules` is a list, or a single string such as `"all-linear"`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum TargetModules {
    List(Vec<String>),
    One(String),
}

/// `adapter_config.json`. Unknown keys are kept in `extra` and written back unchanged.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct LoraConfig {
    #[serde(default = "default_peft_type")]
    pub peft_type: String,
    #[serde(default)]
    pub base_model_name_or_path: Option<String>,
    pub r: usize,
    pub lora_alpha: f64,
    pub target_modules: TargetModules,
    #[serde(default)]
    pub lora_dropout: f64,
    #[serde(default = "default_bias")]
    pub bias: String,
    #[serde(default)]
    pub use_rslora: bool,
    #[serde(default)]
    pub use_dora: bool,
    #[serde(default)]
    pub rank_pattern: BTreeMap<String, usize>,
    #[serde(default)]
    pub alpha_pattern: BTreeMap<String, f64>,
    #[serde(default)]
    pub modules_to_save: Option<Vec<String>>,
    #[serde(default)]
    pub task_type: Option<String>,
    #[serde(default)]
    pub peft_version: Option<String>,
    #[serde(flatten)]
    pub extra: serde_json::Map<String, serde_json::Value>,
}

fn default_peft_type() -> String {
    "LORA".into()
}
fn default_bias() -> String {
    "none".into()
}

impl LoraConfig {
    /// A plain LoRA on the given targets, as PEFT would write it for a causal LM.
    pub fn new(r: usize, lora_alpha: f64, targets: &[LoraTarget]) -> Self {
        Self {
            peft_type: default_peft_type(),
            base_model_name_or_path: None,
            r,
            lora_alpha,
            target_modules: TargetModules::List(
                targets.iter().map(|t| t.peft_name().to_string()).collect(),
            ),
            lora_dropout: 0.0,
            bias: default_bias(),
            use_rslora: false,
            use_dora: false,
            rank_pattern: BTreeMap::new(),
            alpha_pattern: BTreeMap::new(),
            modules_to_save: None,
            task_type: Some("CAUSAL_LM".into()),
            peft_version: None,
            extra: serde_json::Map::new(),
        }
    }

    /// The targets named by `target_modules` (`all-linear` means all seven).
    pub fn targets(&self) -> Result<Vec<LoraTarget>> {
        match &self.target_modules {
            TargetModules::One(s) if s == "all-linear" => Ok(LoraTarget::ALL.to_vec()),
            TargetModules::One(s) => Ok(vec![parse_target(s)?]),
            TargetModules::List(v) => v.iter().map(|s| parse_target(s)).collect(),
        }
    }

    /// Features we do not implement are refused rather than silently ignored.
    pub fn check_supported(&self) -> Result<()> {
        if self.peft_type != "LORA" {
            return Err(ModelError::Adapter(format!(
                "peft_type {} is not LORA",
                self.peft_type
            )));
        }
        if self.bias != "none" {
            return Err(ModelError::Adapter(format!(
                "bias = {} is not supported",
                self.bias
            )));
        }
        if self.modules_to_save.as_ref().is_some_and(|m| !m.is_empty()) {
            return Err(ModelError::Adapter(
                "modules_to_save is not supported".into(),
            ));
        }
        if self.r == 0 {
            return Err(ModelError::Adapter("r must be > 0".into()));
        }
        // PEFT's activated LoRA (aLoRA) has ordinary A/B tensors but applies them only from the
        // invocation tokens on; applied everywhere, its logits differ at every position.
        if self
            .extra
            .get("alora_invocation_tokens")
            .is_some_and(|v| !v.is_null())
        {
            return Err(ModelError::Adapter(
                "activated LoRA (alora_invocation_tokens) is not supported".into(),
            ));
        }
        Ok(())
    }

    /// Rank and alpha for one module, honouring `rank_pattern` / `alpha_pattern` (PEFT matches a
    /// pattern key as a suffix of the module path).
    fn rank_alpha(&self, layer: usize, t: LoraTarget) -> (usize, f64) {
        let path = t.module_path(layer);
        let matches = |k: &str| path == k || path.ends_with(&format!(".{k}"));
        let r = self
            .rank_pattern
            .iter()
            .find(|(k, _)| matches(k))
            .map_or(self.r, |(_, v)| *v);
        let a = self
            .alpha_pattern
            .iter()
            .find(|(k, _)| matches(k))
            .map_or(self.lora_alpha, |(_, v)| *v);
        (r, a)
    }

    /// `alpha / r`, or `alpha / √r` with rsLoRA.
    pub fn scale_for(&self, r: usize, alpha: f64) -> f64 {
        if self.use_rslora {
            alpha / (r as f64).sqrt()
        } else {
            alpha / r as f64
        }
    }
}

fn parse_target(s: &str) -> Result<LoraTarget> {
    // Accept a bare name or a path ending in it.
    let last = s.rsplit('.').next().unwrap_or(s);
    LoraTarget::from_peft_name(last)
        .ok_or_else(|| ModelError::Adapter(format!("unsupported target module `{s}`")))
}

/// Heads whose rows llama.cpp permutes for `t`, if any: Llama GGUFs store q/k rows per head in
/// interleaved-RoPE order (`convert_hf_to_gguf.py`'s `permute`), Hugging Face in half-split order.
/// A PEFT `lora_B` for q/k follows the HF rows, so it must be permuted like the weight
/// (llama.cpp's `convert_lora_to_gguf.py` does the same). Qwen3 is not permuted.
fn permuted_heads(model: &ModelConfig, t: LoraTarget) -> Option<usize> {
    match (model.arch, t) {
        (Arch::Llama, LoraTarget::Q) => Some(model.num_heads),
        (Arch::Llama, LoraTarget::K) => Some(model.num_kv_heads),
        _ => None,
    }
}

/// HF row order → GGUF row order: within each head, row `t·(d/2) + j` moves to `2j + t`.
pub fn to_gguf_rows(b: &Tensor, model: &ModelConfig, t: LoraTarget) -> Result<Tensor> {
    let Some(heads) = permuted_heads(model, t) else {
        return Ok(b.clone());
    };
    let (out, r) = b.dims2()?;
    if out != heads * model.head_dim {
        return Err(ModelError::Adapter(format!(
            "{} lora_B has {out} rows, expected {}",
            t.peft_name(),
            heads * model.head_dim
        )));
    }
    let half = model.head_dim / 2;
    Ok(b.reshape((heads, 2, half, r))?
        .transpose(1, 2)?
        .contiguous()?
        .reshape((out, r))?)
}

/// GGUF row order → HF row order (inverse of [`to_gguf_rows`]).
pub fn to_hf_rows(b: &Tensor, model: &ModelConfig, t: LoraTarget) -> Result<Tensor> {
    let Some(heads) = permuted_heads(model, t) else {
        return Ok(b.clone());
    };
    let (out, r) = b.dims2()?;
    if out != heads * model.head_dim {
        return Err(ModelError::Adapter(format!(
            "{} lora_B has {out} rows, expected {}",
            t.peft_name(),
            heads * model.head_dim
        )));
    }
    let half = model.head_dim / 2;
    Ok(b.reshape((heads, half, 2, r))?
        .transpose(1, 2)?
        .contiguous()?
        .reshape((out, r))?)
}

/// One adapted projection: `ΔW = scale·B·A`, and with DoRA a magnitude per output row:
/// `W' = m ⊙ (W + ΔW) / ‖W + ΔW‖_row` (PEFT's formulation; the norm is treated as a constant in backward).
#[derive(Clone, Debug)]
pub struct LoraPair {
    /// `[r, in]`
    pub a: Tensor,
    /// `[out, r]`
    pub b: Tensor,
    pub scale: f64,
    /// DoRA's `m`, `[out]` (rows in GGUF order, like `b`); `None` for plain LoRA.
    pub magnitude: Option<Tensor>,
    /// `m / ‖W + ΔW‖_row` for a pair that no longer changes (serving), computed on first use. A pair whose
    /// tensors train in place never fills it.
    pub(crate) dora_factor: std::sync::Arc<std::sync::OnceLock<Tensor>>,
    /// `A` and `B` as the decode loops read them, for a pair that no longer changes, filled on first use;
    /// `None` inside when a factor is not contiguous f32.
    pub(crate) decode_factors:
        std::sync::Arc<std::sync::OnceLock<Option<crate::model::transformer::DecodeFactors>>>,
}

impl LoraPair {
    /// A plain LoRA pair.
    pub fn new(a: Tensor, b: Tensor, scale: f64) -> Self {
        Self::with_magnitude(a, b, scale, None)
    }

    /// A pair with an optional DoRA magnitude.
    pub fn with_magnitude(a: Tensor, b: Tensor, scale: f64, magnitude: Option<Tensor>) -> Self {
        Self {
            a,
            b,
            scale,
            magnitude,
            dora_factor: Default::default(),
            decode_factors: Default::default(),
        }
    }

    pub fn rank(&self) -> usize {
        self.a.dims().first().copied().unwrap_or(0)
    }

    /// Whether any of the pair's tensors is being trained (a `Var` or a result of one).
    pub fn tracks(&self) -> bool {
        self.a.track_op()
            || self.b.track_op()
            || self.magnitude.as_ref().is_some_and(|m| m.track_op())
    }

    /// `scale·B·A`, `[out, in]` f32.
    pub fn delta(&self) -> Result<Tensor> {
        Ok(self.b.matmul(&self.a)?.affine(self.scale, 0.0)?)
    }

    /// DoRA's per-row factor `m / ‖W + ΔW‖_row` (`[out]`) for the dense weight `w`, or `None` for plain
    /// LoRA. The norm is detached, as in PEFT and the DoRA paper (§4.3): gradients reach `m`, `A` and `B`
    /// through the numerator and the adapted product only.
    pub fn dora_factor(&self, w: &Tensor) -> Result<Option<Tensor>> {
        let Some(m) = &self.magnitude else {
            return Ok(None);
        };
        let norm = row_norms(&(w + self.delta()?.detach())?)?;
        Ok(Some(m.broadcast_div(&norm)?))
    }
}

/// `‖row‖₂` of a `[out, in]` matrix, `[out]`. One formula for DoRA's initial magnitude and its forward, so a
/// fresh DoRA adapter's factor is exactly 1.
pub fn row_norms(w: &Tensor) -> Result<Tensor> {
    Ok(w.sqr()?.sum(1)?.sqrt()?)
}

/// A complete adapter. Immutable once built; share as `Arc<LoraSet>`.
#[derive(Clone, Debug)]
pub struct LoraSet {
    pub config: LoraConfig,
    pairs: BTreeMap<(usize, LoraTarget), LoraPair>,
}

const PEFT_PREFIX: &str = "base_model.model.";

/// PEFT key for one half of a pair: `base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight`.
pub fn peft_key(layer: usize, t: LoraTarget, b: bool) -> String {
    let ab = if b { "B" } else { "A" };
    format!("{PEFT_PREFIX}{}.lora_{ab}.weight", t.module_path(layer))
}

/// DoRA's magnitude key, e.g. `…q_proj.lora_magnitude_vector` (no `.weight`, as PEFT saves it).
pub fn peft_magnitude_key(layer: usize, t: LoraTarget) -> String {
    format!(
        "{PEFT_PREFIX}{}.lora_magnitude_vector",
        t.module_path(layer)
    )
}

/// Which tensor of an adapted module a PEFT key names.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum PeftPart {
    A,
    B,
    /// DoRA's `lora_magnitude_vector`.
    Magnitude,
}

/// Parses a PEFT key into `(layer, target, part)`. Tolerates an adapter name before `weight`
/// (`lora_A.default.weight`), as older PEFT versions saved; the magnitude has no `weight` of its own.
fn parse_peft_key(key: &str) -> Option<(usize, LoraTarget, PeftPart)> {
    let rest = key
        .strip_prefix(PEFT_PREFIX)?
        .strip_prefix("model.layers.")?;
    let mut parts = rest.split('.');
    let layer: usize = parts.next()?.parse().ok()?;
    let parent = parts.next()?;
    let t = LoraTarget::from_peft_name(parts.next()?)?;
    if t.peft_parent() != parent {
        return None;
    }
    let part = match parts.next()? {
        "lora_A" => PeftPart::A,
        "lora_B" => PeftPart::B,
        "lora_magnitude_vector" => PeftPart::Magnitude,
        _ => return None,
    };
    let tail: Vec<&str> = parts.collect();
    match (part, tail.as_slice()) {
        (_, ["weight"] | [_, "weight"]) | (PeftPart::Magnitude, [] | [_]) => Some((layer, t, part)),
        _ => None,
    }
}

impl LoraSet {
    /// An empty set (no projection adapted) with the given configuration.
    pub fn empty(config: LoraConfig) -> Self {
        Self {
            config,
            pairs: BTreeMap::new(),
        }
    }

    /// A fresh adapter as PEFT initialises one: `A ~ U(−1/√in, 1/√in)` (kaiming-uniform, a=√5),
    /// `B = 0`, so the adapted model starts exactly equal to the base.
    pub fn fresh(model: &Transformer, config: LoraConfig, seed: u64) -> Result<Self> {
        config.check_supported()?;
        let targets = config.targets()?;
        let mut rng = StdRng::seed_from_u64(seed);
        let mut set = Self::empty(config);
        for (l, blk) in model.blocks().iter().enumerate() {
            for &t in &targets {
                let lin = blk.linear(t);
                let (r, alpha) = set.config.rank_alpha(l, t);
                let bound = 1.0 / (lin.in_features() as f32).sqrt();
                let a: Vec<f32> = (0..r * lin.in_features())
                    .map(|_| rng.random_range(-bound..bound))
                    .collect();
                let a = Tensor::from_vec(a, (r, lin.in_features()), &Device::Cpu)?;
                let b = Tensor::zeros((lin.out_features(), r), DType::F32, &Device::Cpu)?;
                let scale = set.config.scale_for(r, alpha);
                // DoRA starts at m = ‖W‖_row (B = 0), so the adapted layer equals the base.
                let magnitude = match set.config.use_dora {
                    true => Some(row_norms(&lin.dequantize()?)?),
                    false => None,
                };
                set.pairs
                    .insert((l, t), LoraPair::with_magnitude(a, b, scale, magnitude));
            }
        }
        Ok(set)
    }

    pub fn get(&self, layer: usize, t: LoraTarget) -> Option<&LoraPair> {
        self.pairs.get(&(layer, t))
    }

    /// Adds or replaces one pair (used while building a set).
    pub fn insert(&mut self, layer: usize, t: LoraTarget, pair: LoraPair) {
        self.pairs.insert((layer, t), pair);
    }

    pub fn iter(&self) -> impl Iterator<Item = (&(usize, LoraTarget), &LoraPair)> {
        self.pairs.iter()
    }

    pub fn len(&self) -> usize {
        self.pairs.len()
    }

    pub fn is_empty(&self) -> bool {
        self.pairs.is_empty()
    }

    /// Checks layer indices and shapes against `model`, so a mismatched adapter is an error naming
    /// the module instead of a shape error deep in a matmul.
    pub fn check_compatible(&self, model: &Transformer) -> Result<()> {
        let blocks = model.blocks();
        for (&(l, t), p) in &self.pairs {
            let name = t.module_path(l);
            let blk = blocks.get(l).ok_or_else(|| {
                ModelError::Adapter(format!("{name}: model has {} layers", blocks.len()))
            })?;
            let lin = blk.linear(t);
            let (ra, ia) = p.a.dims2()?;
            let (ob, rb) = p.b.dims2()?;
            if ia != lin.in_features() || ob != lin.out_features() || ra != rb {
                return Err(ModelError::Adapter(format!(
                    "{name}: A {:?} / B {:?} do not fit a [{}, {}] weight",
                    p.a.dims(),
                    p.b.dims(),
                    lin.out_features(),
                    lin.in_features()
                )));
            }
        }
        Ok(())
    }

    /// Loads `adapter_config.json` + `adapter_model.safetensors` (f32, f16 or bf16) from `dir`,
    /// converting q/k `lora_B` rows to the GGUF layout of `model` (see [`to_gguf_rows`]).
    pub fn load_peft(dir: impl AsRef<Path>, model: &ModelConfig) -> Result<Self> {
        let dir = dir.as_ref();
        let cfg_path = dir.join("adapter_config.json");
        let cfg_text = std::fs::read_to_string(&cfg_path).map_err(|e| io_err(&cfg_path, e))?;
        let config: LoraConfig = serde_json::from_str(&cfg_text)?;
        config.check_supported()?;
        let st_path = dir.join("adapter_model.safetensors");
        let bytes = std::fs::read(&st_path).map_err(|e| io_err(&st_path, e))?;
        let tensors = candle_core::safetensors::load_buffer(&bytes, &Device::Cpu)
            .map_err(|e| ModelError::Adapter(format!("{}: {e}", st_path.display())))?;
        let mut halves: BTreeMap<(usize, LoraTarget), (Option<Tensor>, Option<Tensor>)> =
            BTreeMap::new();
        let mut magnitudes: BTreeMap<(usize, LoraTarget), Tensor> = BTreeMap::new();
        for (key, t) in tensors {
            let (l, tgt, part) = parse_peft_key(&key)
                .ok_or_else(|| ModelError::Adapter(format!("unsupported tensor `{key}`")))?;
            if part == PeftPart::Magnitude {
                if !config.use_dora {
                    return Err(ModelError::Adapter(format!(
                        "tensor `{key}` is a DoRA magnitude but use_dora is false"
                    )));
                }
                if t.rank() != 1 {
                    return Err(ModelError::Adapter(format!(
                        "tensor `{key}` has shape {:?}, expected [out]",
                        t.dims()
                    )));
                }
                magnitudes.insert((l, tgt), t.to_dtype(DType::F32)?);
                continue;
            }
            if t.rank() != 2 {
                return Err(ModelError::Adapter(format!(
                    "tensor `{key}` has shape {:?}, expected rank 2",
                    t.dims()
                )));
            }
            let t = t.to_dtype(DType::F32)?;
            let e = halves.entry((l, tgt)).or_default();
            if part == PeftPart::B {
                e.1 = Some(t)
            } else {
                e.0 = Some(t)
            }
        }
        let mut set = Self::empty(config);
        for ((l, t), (a, b)) in halves {
            let (Some(a), Some(b)) = (a, b) else {
                return Err(ModelError::Adapter(format!(
                    "{}: lora_A or lora_B missing",
                    t.module_path(l)
                )));
            };
            let r = a.dim(0)?;
            if b.dim(1)? != r {
                return Err(ModelError::Adapter(format!(
                    "{}: lora_A {:?} and lora_B {:?} disagree on rank",
                    t.module_path(l),
                    a.dims(),
                    b.dims()
                )));
            }
            let out = b.dim(0)?;
            let b = to_gguf_rows(&b, model, t)?;
            let magnitude = match (set.config.use_dora, magnitudes.remove(&(l, t))) {
                (false, _) => None,
                (true, Some(m)) if m.dim(0)? == out => {
                    // Rows follow B's order: permuted to GGUF order the same way.
                    Some(to_gguf_rows(&m.reshape((out, 1))?, model, t)?.reshape(out)?)
                }
                (true, Some(m)) => {
                    return Err(ModelError::Adapter(format!(
                        "{}: lora_magnitude_vector {:?} does not fit lora_B {:?}",
                        t.module_path(l),
                        m.dims(),
                        b.dims()
                    )));
                }
                (true, None) => {
                    return Err(ModelError::Adapter(format!(
                        "{}: a DoRA adapter (use_dora) without its lora_magnitude_vector",
                        t.module_path(l)
                    )));
                }
            };
            // Rank comes from the tensors (rank_pattern may be absent); alpha from the config.
            let (_, alpha) = set.config.rank_alpha(l, t);
            let scale = set.config.scale_for(r, alpha);
            set.pairs
                .insert((l, t), LoraPair::with_magnitude(a, b, scale, magnitude));
        }
        if let Some((l, t)) = magnitudes.keys().next() {
            return Err(ModelError::Adapter(format!(
                "{}: lora_magnitude_vector without lora_A/lora_B",
                t.module_path(*l)
            )));
        }
        Ok(set)
    }

    /// Writes the adapter in PEFT layout (bf16 tensors, `format: pt` metadata) into `dir`, with
    /// q/k `lora_B` rows converted back to Hugging Face order for `model`'s architecture.
    pub fn save_peft(&self, dir: impl AsRef<Path>, model: &ModelConfig) -> Result<()> {
        let dir = dir.as_ref();
        std::fs::create_dir_all(dir).map_err(|e| io_err(dir, e))?;
        let mut tensors: Vec<(String, Tensor)> = Vec::with_capacity(self.pairs.len() * 2);
        for (&(l, t), p) in &self.pairs {
            tensors.push((
                peft_key(l, t, false),
                p.a.to_dtype(DType::BF16)?.contiguous()?,
            ));
            tensors.push((
                peft_key(l, t, true),
                to_hf_rows(&p.b, model, t)?
                    .to_dtype(DType::BF16)?
                    .contiguous()?,
            ));
            if let Some(m) = &p.magnitude {
                let out = m.dim(0)?;
                let hf = to_hf_rows(&m.reshape((out, 1))?, model, t)?.reshape(out)?;
                tensors.push((
                    peft_magnitude_key(l, t),
                    hf.to_dtype(DType::BF16)?.contiguous()?,
                ));
            }
        }
        let meta = HashMap::from([("format".to_string(), "pt".to_string())]);
        let st_path = dir.join("adapter_model.safetensors");
        safetensors::serialize_to_file(tensors, Some(meta), &st_path)
            .map_err(|e| ModelError::Adapter(format!("{}: {e}", st_path.display())))?;
        let cfg_path = dir.join("adapter_config.json");
        let json = serde_json::to_string_pretty(&self.config)?;
        std::fs::write(&cfg_path, json).map_err(|e| io_err(&cfg_path, e))?;
        Ok(())
    }

    /// Writes a llama.cpp LoRA GGUF (`general.type = adapter`, tensors
    /// `blk.N.attn_q.weight.lora_a` `[r, in]` / `.lora_b` `[out, r]`, f32). llama.cpp scales by
    /// `alpha / rank` with one `adapter.lora.alpha`, so every pair must share `scale × rank`
    /// (rsLoRA is written as `alpha·√r`). Rows stay in GGUF order, as llama.cpp expects.
    pub fn save_gguf(&self, path: impl AsRef<Path>, model: &ModelConfig) -> Result<()> {
        use candle_core::quantized::gguf_file::Value;
        use candle_core::quantized::{GgmlDType, QTensor};
        if self.config.use_dora {
            return Err(ModelError::Adapter(
                "llama.cpp cannot load DoRA adapters (its converter stops on the magnitude vector); \
                 serve DoRA deltas with hearth or merge them into the weights"
                    .into(),
            ));
        }
        let mut alpha: Option<f64> = None;
        let mut tensors = Vec::with_capacity(self.pairs.len() * 2);
        for (&(l, t), p) in &self.pairs {
            let a = p.scale * p.rank() as f64;
            match alpha {
                None => alpha = Some(a),
                Some(prev) if (prev - a).abs() > 1e-6 * prev.abs().max(1.0) => {
                    return Err(ModelError::Adapter(format!(
                        "{}: scale×rank {a} differs from {prev}; llama.cpp LoRA has one alpha",
                        t.module_path(l)
                    )));
                }
                Some(_) => {}
            }
            let base = format!("blk.{l}.{}.weight", t.gguf_name());
            let a_t = p.a.to_dtype(DType::F32)?.contiguous()?;
            let b_t = p.b.to_dtype(DType::F32)?.contiguous()?;
            tensors.push((
                format!("{base}.lora_a"),
                QTensor::quantize(&a_t, GgmlDType::F32)?,
            ));
            tensors.push((
                format!("{base}.lora_b"),
                QTensor::quantize(&b_t, GgmlDType::F32)?,
            ));
        }
        let metadata = vec![
            ("general.type".to_string(), Value::String("adapter".into())),
            (
                "general.architecture".to_string(),
                Value::String(model.arch.as_str().into()),
            ),
            ("adapter.type".to_string(), Value::String("lora".into())),
            (
                "adapter.lora.alpha".to_string(),
                Value::F32(alpha.unwrap_or(self.config.lora_alpha) as f32),
            ),
        ];
        super::gguf::write_gguf(path, &metadata, &tensors)
    }

    /// Reads a llama.cpp LoRA GGUF written for `model`'s architecture.
    pub fn load_gguf(path: impl AsRef<Path>, model: &ModelConfig) -> Result<Self> {
        let mut g = super::gguf::GgufFile::open(path)?;
        let md = g.metadata();
        let kind = super::gguf::md_str(md, "general.type")?;
        let arch = super::gguf::md_str(md, "general.architecture")?;
        if kind != "adapter" || super::gguf::md_str(md, "adapter.type")? != "lora" {
            return Err(ModelError::Adapter(format!(
                "not a LoRA adapter GGUF (general.type = {kind})"
            )));
        }
        if arch != model.arch.as_str() {
            return Err(ModelError::Adapter(format!(
                "adapter for {arch}, model is {}",
                model.arch.as_str()
            )));
        }
        let alpha = super::gguf::md_f32(md, "adapter.lora.alpha")? as f64;
        let names: Vec<String> = g.content.tensor_infos.keys().cloned().collect();
        let mut pairs = BTreeMap::new();
        let mut targets = std::collections::BTreeSet::new();
        let mut max_r = 0;
        for name in names.iter().filter(|n| n.ends_with(".lora_a")) {
            let stem = &name[..name.len() - ".lora_a".len()];
            let parsed = stem
                .strip_prefix("blk.")
                .and_then(|r| r.strip_suffix(".weight"))
                .and_then(|r| r.split_once('.'))
                .and_then(|(l, t)| {
                    Some((
                        l.parse::<usize>().ok()?,
                        LoraTarget::ALL.into_iter().find(|x| x.gguf_name() == t)?,
                    ))
                });
            let Some((l, t)) = parsed else {
                return Err(ModelError::Adapter(format!("unsupported tensor `{name}`")));
            };
            let a = g.tensor(name, None)?.dequantize(&Device::Cpu)?;
            let b = g
                .tensor(&format!("{stem}.lora_b"), None)?
                .dequantize(&Device::Cpu)?;
            let (r, _) = a.dims2()?;
            if b.dims2()?.1 != r || r == 0 {
                return Err(ModelError::Adapter(format!(
                    "{stem}: lora_a {:?} / lora_b {:?}",
                    a.dims(),
                    b.dims()
                )));
            }
            max_r = max_r.max(r);
            targets.insert(t);
            pairs.insert((l, t), LoraPair::new(a, b, alpha / r as f64));
        }
        if let Some(stray) = names
            .iter()
            .find(|n| !n.ends_with(".lora_a") && !n.ends_with(".lora_b"))
        {
            return Err(ModelError::Adapter(format!("unsupported tensor `{stray}`")));
        }
        let targets: Vec<LoraTarget> = targets.into_iter().collect();
        let set = Self {
            config: LoraConfig::new(max_r.max(1), alpha, &targets),
            pairs,
        };
        Ok(set)
    }

    /// The same adapter with every `A`/`B` backed by a trainable [`Var`] (named by PEFT key), for
    /// an optimizer. The returned set's tensors share storage with the vars.
    pub fn to_vars(&self) -> Result<(LoraSet, Vec<(String, Var)>)> {
        let mut set = Self::empty(self.config.clone());
        let mut vars = Vec::with_capacity(self.pairs.len() * 2);
        for (&(l, t), p) in &self.pairs {
            let a = Var::from_tensor(&p.a)?;
            let b = Var::from_tensor(&p.b)?;
            let m = p.magnitude.as_ref().map(Var::from_tensor).transpose()?;
            set.pairs.insert(
                (l, t),
                LoraPair::with_magnitude(
                    a.as_tensor().clone(),
                    b.as_tensor().clone(),
                    p.scale,
                    m.as_ref().map(|m| m.as_tensor().clone()),
                ),
            );
            vars.push((peft_key(l, t, false), a));
            vars.push((peft_key(l, t, true), b));
            if let Some(m) = m {
                vars.push((peft_magnitude_key(l, t), m));
            }
        }
        Ok((set, vars))
    }

    /// A detached snapshot (plain tensors) of a set built by [`LoraSet::to_vars`], safe to
    /// publish to serving while training continues.
    pub fn snapshot(&self) -> Result<LoraSet> {
        let mut set = Self::empty(self.config.clone());
        for (&k, p) in &self.pairs {
            set.pairs.insert(
                k,
                LoraPair::with_magnitude(
                    p.a.detach().copy()?,
                    p.b.detach().copy()?,
                    p.scale,
                    p.magnitude
                        .as_ref()
                        .map(|m| m.detach().copy())
                        .transpose()?,
                ),
            );
        }
        Ok(set)
    }
}

/// Named adapters resident for serving. Readers take an `Arc` and release the lock at once;
/// replacing an adapter swaps the `Arc`, so in-flight requests finish with the set they started.
#[derive(Debug, Default)]
pub struct AdapterRegistry {
    inner: RwLock<HashMap<String, Arc<LoraSet>>>,
}

impl AdapterRegistry {
    pub fn new() -> Self {
        Self::default()
    }

    /// The current set under `name`.
    pub fn get(&self, name: &str) -> Option<Arc<LoraSet>> {
        self.inner
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .get(name)
            .cloned()
    }

    /// Installs or replaces `name`; returns the previous set.
    pub fn insert(&self, name: impl Into<String>, set: Arc<LoraSet>) -> Option<Arc<LoraSet>> {
        self.inner
            .write()
            .unwrap_or_else(|p| p.into_inner())
            .insert(name.into(), set)
    }

    pub fn remove(&self, name: &str) -> Option<Arc<LoraSet>> {
        self.inner
            .write()
            .unwrap_or_else(|p| p.into_inner())
            .remove(name)
    }

    /// Whether `set` is installed under some name (the very snapshot, not an equal copy).
    pub fn holds(&self, set: &Arc<LoraSet>) -> bool {
        self.inner
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .values()
            .any(|s| Arc::ptr_eq(s, set))
    }

    pub fn names(&self) -> Vec<String> {
        let mut v: Vec<String> = self
            .inner
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .keys()
            .cloned()
            .collect();
        v.sort();
        v
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn peft_keys_parse_with_and_without_an_adapter_name() {
        let q = "base_model.model.model.layers.3.self_attn.q_proj";
        let ok = |k: &str| parse_peft_key(&format!("{q}.{k}"));
        assert_eq!(ok("lora_A.weight"), Some((3, LoraTarget::Q, PeftPart::A)));
        assert_eq!(
            ok("lora_B.default.weight"),
            Some((3, LoraTarget::Q, PeftPart::B))
        );
        assert_eq!(
            ok("lora_magnitude_vector"),
            Some((3, LoraTarget::Q, PeftPart::Magnitude))
        );
        assert_eq!(
            ok("lora_magnitude_vector.default.weight"),
            Some((3, LoraTarget::Q, PeftPart::Magnitude))
        );
        // A and B need their `weight`; a wrong parent or part is not ours.
        assert_eq!(ok("lora_A"), None);
        assert_eq!(ok("lora_C.weight"), None);
        assert_eq!(
            parse_peft_key("base_model.model.model.layers.3.mlp.q_proj.lora_A.weight"),
            None
        );
        assert_eq!(
            parse_peft_key(&peft_magnitude_key(1, LoraTarget::Down)).map(|k| k.2),
            Some(PeftPart::Magnitude)
        );
        assert_eq!(
            parse_peft_key(&peft_key(1, LoraTarget::Down, true)),
            Some((1, LoraTarget::Down, PeftPart::B))
        );
    }
}
