//! Rotary position embeddings from precomputed tables.

use candle_core::{Device, Tensor};

use super::train_ops;
use crate::model::Result;
use crate::model::gguf::ModelConfig;

/// Positions served at most, whatever the file claims: RoPE tables are precomputed, and a
/// corrupt `context_length` must not allocate gigabytes. (32768 × 64 × 2 × 4 B = 16 MiB.)
pub const MAX_POSITIONS: usize = 32_768;

/// Precomputed RoPE tables `[positions, head_dim/2]` in f32.
#[derive(Clone, Debug)]
pub(super) struct Rope {
    pub(super) cos: Tensor,
    pub(super) sin: Tensor,
    pub(super) interleaved: bool,
}

impl Rope {
    /// Tables for `cfg`, each frequency divided by its `freq_factors` entry where given (Llama 3.x's
    /// `rope_freqs.weight`, one per pair, as llama.cpp applies it) and by the linear scaling factor.
    pub(super) fn new(cfg: &ModelConfig, freq_factors: Option<&[f32]>) -> Result<Self> {
        Self::with_base(cfg, cfg.rope_theta, cfg.rope_linear_factor, freq_factors)
    }

    /// Tables for Gemma 3's sliding-window layers: their own base, unscaled.
    pub(super) fn sliding(cfg: &ModelConfig) -> Result<Option<Self>> {
        cfg.sliding
            .map(|s| Self::with_base(cfg, s.rope_theta, 1.0, None))
            .transpose()
    }

    fn with_base(
        cfg: &ModelConfig,
        theta: f32,
        linear_factor: f32,
        freq_factors: Option<&[f32]>,
    ) -> Result<Self> {
        let half = cfg.head_dim / 2;
        let n = cfg.max_positions();
        let inv: Vec<f32> = (0..half)
            .map(|i| {
                let divisor = freq_factors.map_or(1.0, |f| f[i]) * linear_factor;
                1.0 / theta.powf(2.0 * i as f32 / cfg.head_dim as f32) / divisor
            })
            .collect();
        let mut cos = Vec::with_capacity(n * half);
        let mut sin = Vec::with_capacity(n * half);
        for p in 0..n {
            for f in &inv {
                let a = p as f32 * f;
                cos.push(a.cos());
                sin.push(a.sin());
            }
        }
        Ok(Self {
            cos: Tensor::from_vec(cos, (n, half), &Device::Cpu)?,
            sin: Tensor::from_vec(sin, (n, half), &Device::Cpu)?,
            interleaved: cfg.arch.interleaved_rope(),
        })
    }

    /// `x: [b, heads, l, d]` contiguous, positions `offset..offset+l`.
    pub(super) fn apply(&self, x: &Tensor, offset: usize, train: bool) -> Result<Tensor> {
        let l = x.dim(2)?;
        let cos = self.cos.narrow(0, offset, l)?;
        let sin = self.sin.narrow(0, offset, l)?;
        use candle_nn::rotary_emb as re;
        Ok(match (self.interleaved, train) {
            (_, true) => train_ops::rope(x, &cos, &sin, self.interleaved)?,
            (true, false) => re::rope_i(x, &cos, &sin)?,
            (false, false) => re::rope(x, &cos, &sin)?,
        })
    }
}
