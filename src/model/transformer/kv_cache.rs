//! The per-request key/value cache.

use candle_core::{DType, Tensor};
use serde::{Deserialize, Serialize};

use crate::model::gguf::ModelConfig;
use crate::model::{ModelError, Result};

/// How a [`KvCache`] stores keys and values.
///
/// At long context the cache is what a decode step reads besides the weights (SmolLM2-135M: 46 KB per cached
/// position in f32, the size of its Q8_0 weights at ~3,100 positions), so f16 halves both the memory a chat
/// holds and that part of each step's reads. f16 keeps 11 significant bits, as llama.cpp's default cache does;
/// f32 makes cached decoding agree with the cacheless forward up to the order of additions.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
pub enum KvPrecision {
    /// Exact: what the forward computed.
    #[default]
    F32,
    /// Rounded to half precision when stored; every attention over the cache reads the rounded values.
    F16,
}

impl KvPrecision {
    fn dtype(self) -> DType {
        match self {
            KvPrecision::F32 => DType::F32,
            KvPrecision::F16 => DType::F16,
        }
    }
}

/// Per-request key/value cache: for each layer, buffers `[b, kv_heads, capacity, head_dim]`
/// filled up to `len`. Buffers grow geometrically and are written in place (`slice_set`), so a
/// decode step copies one position instead of the whole history; attention reads a narrowed view.
#[derive(Debug)]
pub struct KvCache {
    pub(super) layers: Vec<Option<(Tensor, Tensor)>>,
    pub(super) len: usize,
    max_len: usize,
    precision: KvPrecision,
}

/// Initial cache capacity in positions (grows by doubling up to the context length).
const KV_INITIAL_CAPACITY: usize = 64;

impl KvCache {
    pub fn new(cfg: &ModelConfig, precision: KvPrecision) -> Self {
        Self {
            layers: vec![None; cfg.num_layers],
            len: 0,
            max_len: cfg.max_positions(),
            precision,
        }
    }

    pub fn precision(&self) -> KvPrecision {
        self.precision
    }

    /// Bytes the buffers hold (allocated capacity, not only the filled positions).
    pub fn bytes(&self) -> usize {
        self.layers
            .iter()
            .flatten()
            .map(|(k, v)| (k.elem_count() + v.elem_count()) * k.dtype().size_in_bytes())
            .sum()
    }

    /// Positions already cached (the offset of the next token).
    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    pub fn clear(&mut self) {
        self.layers.iter_mut().for_each(|l| *l = None);
        self.len = 0;
    }

    /// Forgets every position from `len` on (keeping the buffers): the next forward continues after position
    /// `len - 1`, overwriting what was cached after it.
    pub fn truncate(&mut self, len: usize) {
        self.len = self.len.min(len);
    }

    /// An independent copy (e.g. to reuse a cached system prompt for several requests). The
    /// buffers are written in place, so the cache is deliberately not `Clone`.
    pub fn fork(&self) -> Result<Self> {
        let mut layers = Vec::with_capacity(self.layers.len());
        for l in &self.layers {
            layers.push(match l {
                Some((k, v)) => Some((k.copy()?, v.copy()?)),
                None => None,
            });
        }
        Ok(Self {
            layers,
            len: self.len,
            max_len: self.max_len,
            precision: self.precision,
        })
    }

    /// Writes `k`, `v` (`[b, kv_heads, l, d]`, contiguous) after the cached positions of `layer`
    /// and returns views of everything cached so far, in the cache's precision.
    pub(super) fn append(
        &mut self,
        layer: usize,
        k: &Tensor,
        v: &Tensor,
    ) -> Result<(Tensor, Tensor)> {
        let dtype = self.precision.dtype();
        let (k, v) = (&k.to_dtype(dtype)?, &v.to_dtype(dtype)?);
        let (b, h, l, d) = k.dims4()?;
        let need = self.len + l;
        let slot = &mut self.layers[layer];
        let cap = slot.as_ref().map_or(0, |(kb, _)| kb.dim(2).unwrap_or(0));
        if slot
            .as_ref()
            .is_some_and(|(kb, _)| kb.dim(0).ok() != Some(b))
        {
            return Err(ModelError::Input(
                "batch size changed within one KV cache".into(),
            ));
        }
        if need > cap {
            let new_cap = need
                .max(2 * cap)
                .max(KV_INITIAL_CAPACITY)
                .min(self.max_len.max(need));
            let grow = |old: Option<&Tensor>| -> Result<Tensor> {
                let buf = Tensor::zeros((b, h, new_cap, d), k.dtype(), k.device())?;
                if let Some(old) = old
                    && self.len > 0
                {
                    buf.slice_set(&old.narrow(2, 0, self.len)?.contiguous()?, 2, 0)?;
                }
                Ok(buf)
            };
            let (kb, vb) = (
                grow(slot.as_ref().map(|s| &s.0))?,
                grow(slot.as_ref().map(|s| &s.1))?,
            );
            *slot = Some((kb, vb));
        }
        let (kb, vb) = slot.as_ref().expect("allocated above");
        kb.slice_set(k, 2, self.len)?;
        vb.slice_set(v, 2, self.len)?;
        Ok((kb.narrow(2, 0, need)?, vb.narrow(2, 0, need)?))
    }
}
