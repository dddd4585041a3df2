//! Losses over per-token log-probabilities. All functions are differentiable candle graphs.

use std::sync::{Arc, Mutex, MutexGuard};

use candle_core::{Device, Tensor, Var};
use rayon::prelude::*;

use super::Result;
use super::data::Seq;
use crate::model::{GpuTrainer, LoraSet, ModelConfig, Targets, Transformer};

/// Per-token log-probs of a right-padded batch: `lp[n, t]` is `log p(ids[t+1] | ids[..=t])` and
/// `mask[n, t]` (f32) is 1 where that target is scored. Right padding is exact under a causal
/// mask: no real position attends to a pad.
pub struct TokenLogps {
    pub lp: Tensor,
    pub mask: Tensor,
}

impl TokenLogps {
    /// Masked sum per sequence, `[n]`.
    pub fn sums(&self) -> Result<Tensor> {
        Ok((&self.lp * &self.mask)?.sum(1)?)
    }

    /// Scored tokens per sequence.
    pub fn counts(&self) -> Result<Vec<f32>> {
        Ok(self.mask.sum(1)?.to_vec1()?)
    }
}

/// A right-padded batch as the training forward reads it: tokens `[n, l]` row-major, each position's target
/// (`ids[t+1]`, or a teacher's distribution, where scored), and the mask `[n, l − 1]`.
struct Encoded {
    tokens: Vec<u32>,
    targets: Targets,
    mask: Vec<f32>,
    n: usize,
    l: usize,
}

fn encode(seqs: &[&Seq], pad: u32) -> Encoded {
    let n = seqs.len();
    let l = seqs.iter().map(|s| s.ids.len()).max().unwrap_or(0).max(2);
    let mut tokens = Vec::with_capacity(n * l);
    // Per position t of the padded input: its target ids[t+1] and whether that target is scored; the last
    // position has no target.
    let mut targets = Targets::with_capacity(n * l);
    let mut mask = Vec::with_capacity(n * (l - 1));
    for s in seqs {
        tokens.extend(s.ids.iter().copied());
        tokens.extend(std::iter::repeat_n(pad, l - s.ids.len()));
        for t in 1..=l {
            let scored = t < l && s.mask.get(t).copied().unwrap_or(false);
            if t < l {
                mask.push(if scored { 1f32 } else { 0.0 });
            }
            match (&s.soft, s.ids.get(t)) {
                (_, None) => targets.push_none(),
                _ if !scored => targets.push_none(),
                (Some(soft), Some(_)) if soft.len() == s.ids.len() && !soft.at(t).0.is_empty() => {
                    let (ids, weights) = soft.at(t);
                    let pairs: Vec<(u32, f32)> =
                        ids.iter().copied().zip(weights.iter().copied()).collect();
                    targets.push_soft(&pairs);
                }
                (_, Some(&id)) => targets.push_token(id),
            }
        }
    }
    Encoded {
        tokens,
        targets,
        mask,
        n,
        l,
    }
}

/// Runs the training forward on `seqs` (padded with `pad`) and gathers target log-probs. Unscored
/// positions get 0 (the head never projects them; see [`Transformer::target_logps`]).
pub fn token_logps(
    model: &Transformer,
    lora: Option<&LoraSet>,
    seqs: &[&Seq],
    pad: u32,
) -> Result<TokenLogps> {
    let Encoded {
        tokens,
        targets,
        mask,
        n,
        l,
    } = encode(seqs, pad);
    let tokens = Tensor::from_vec(tokens, (n, l), &Device::Cpu)?;
    let lp = model.target_logps(&tokens, lora, &targets)?;
    Ok(TokenLogps {
        lp: lp.narrow(1, 0, l - 1)?.contiguous()?,
        mask: Tensor::from_vec(mask, (n, l - 1), &Device::Cpu)?,
    })
}

/// [`token_logps`] of one sequence on a GPU: under the pairs [`GpuTrainer::set_adapter`] gave it, or the
/// base's own with `base`.
pub fn gpu_token_logps(gpu: &GpuTrainer, seq: &Seq, pad: u32, base: bool) -> Result<TokenLogps> {
    let e = encode(&[seq], pad);
    let lp = if base {
        gpu.base_logps(&e.tokens, &e.targets)?
    } else {
        gpu.target_logps(&e.tokens, &e.targets)?
    };
    Ok(TokenLogps {
        lp: Tensor::from_slice(&lp[..e.l - 1], (1, e.l - 1), &Device::Cpu)?,
        mask: Tensor::from_vec(e.mask, (1, e.l - 1), &Device::Cpu)?,
    })
}

/// [`token_logps`] of a micro-batch, one sequence per rayon task and per graph, joined into one detached leaf
/// that the loss is built on; [`SequenceLogps::gradients`] takes the loss back to that leaf, then through every
/// sequence's graph in parallel. Why: candle runs a backward pass node by node on the calling thread, so a
/// whole-batch graph is parallel only inside each op, and a small model's ops are too short for that to pay. By
/// the chain rule the gradients are those of the whole-batch graph; only the order in which the sequences'
/// contributions are summed differs. The split depends on the batch alone, not on the thread count, so a seed
/// still gives the same bytes on any machine; and no sequence is padded to the longest.
///
/// With `recompute`, no graph outlives its sequence's forward: the sequences run one at a time, and
/// [`SequenceLogps::gradients`] runs each forward again, one at a time, for its backward. The log-probs, and
/// so the gradients, are the same bytes; the saved activations are one sequence's instead of the batch's.
pub struct SequenceLogps<'a> {
    /// The leaf as `lp` (`[n, l − 1]`, zero past each sequence's end) and the mask, as [`token_logps`] gives them.
    pub logps: TokenLogps,
    leaf: Var,
    graphs: Graphs<'a>,
}

/// Where [`SequenceLogps::gradients`] finds each sequence's graph.
enum Graphs<'a> {
    /// Each sequence's own log-probs, `[1, its length − 1]`, with its graph.
    Kept(Vec<Tensor>),
    /// What builds them again.
    Recompute {
        model: &'a Transformer,
        lora: Option<Box<LoraSet>>,
        seqs: Vec<Seq>,
        pad: u32,
    },
    /// What runs each sequence's forward again on a GPU for its backward there.
    Gpu {
        trainer: Arc<Mutex<GpuTrainer>>,
        lora: Box<LoraSet>,
        seqs: Vec<Seq>,
        pad: u32,
    },
}

/// See [`SequenceLogps`]. With `gpu`, each sequence's forward (and, in [`SequenceLogps::gradients`], its
/// backward) runs there instead, one sequence at a time.
pub fn sequence_logps<'a>(
    model: &'a Transformer,
    lora: Option<&LoraSet>,
    seqs: &[&Seq],
    pad: u32,
    recompute: bool,
    gpu: Option<&Arc<Mutex<GpuTrainer>>>,
) -> Result<SequenceLogps<'a>> {
    let parts = if let Some(g) = gpu {
        let mut g = lock(g);
        if lora.is_some() {
            g.set_adapter(lora)?;
        }
        seqs.iter()
            .map(|s| gpu_token_logps(&g, s, pad, lora.is_none()))
            .collect::<Result<Vec<_>>>()?
    } else if recompute {
        seqs.iter()
            .map(|s| {
                let t = token_logps(model, lora, &[*s], pad)?;
                Ok(TokenLogps {
                    lp: t.lp.detach(),
                    mask: t.mask,
                })
            })
            .collect::<Result<Vec<_>>>()?
    } else {
        seqs.par_iter()
            .map(|s| token_logps(model, lora, &[*s], pad))
            .collect::<Result<Vec<_>>>()?
    };
    let width = parts
        .iter()
        .map(|p| p.lp.dim(1))
        .try_fold(1, |w, d| d.map(|d| w.max(d)))?;
    let widen = |t: &Tensor| -> Result<Tensor> {
        let d = t.dim(1)?;
        Ok(t.detach().pad_with_zeros(1, 0, width - d)?)
    };
    let lp = parts
        .iter()
        .map(|p| widen(&p.lp))
        .collect::<Result<Vec<_>>>()?;
    let mask = parts
        .iter()
        .map(|p| widen(&p.mask))
        .collect::<Result<Vec<_>>>()?;
    let leaf = Var::from_tensor(&Tensor::cat(&lp, 0)?)?;
    let graphs = if let (Some(trainer), Some(lora)) = (gpu, lora) {
        Graphs::Gpu {
            trainer: trainer.clone(),
            lora: Box::new(lora.clone()),
            seqs: seqs.iter().map(|s| (*s).clone()).collect(),
            pad,
        }
    } else if recompute {
        Graphs::Recompute {
            model,
            lora: lora.cloned().map(Box::new),
            seqs: seqs.iter().map(|s| (*s).clone()).collect(),
            pad,
        }
    } else {
        Graphs::Kept(parts.into_iter().map(|p| p.lp).collect())
    };
    Ok(SequenceLogps {
        logps: TokenLogps {
            lp: leaf.as_tensor().clone(),
            mask: Tensor::cat(&mask, 0)?,
        },
        leaf,
        graphs,
    })
}

impl SequenceLogps<'_> {
    /// The gradient of `loss` (built on [`Self::logps`]) for each of `vars`, in order; `None` where the
    /// loss does not depend on it.
    pub fn gradients(&self, loss: &Tensor, vars: &[&Var]) -> Result<Vec<Option<Tensor>>> {
        let store = loss.backward()?;
        let Some(d_lp) = store.get(self.leaf.as_tensor()) else {
            return Ok(vec![None; vars.len()]);
        };
        let d_lp = d_lp.detach();
        let backward = |i: usize, lp: &Tensor| -> Result<Vec<Option<Tensor>>> {
            let d = d_lp.narrow(0, i, 1)?.narrow(1, 0, lp.dim(1)?)?;
            let store = (lp * d)?.sum_all()?.backward()?;
            Ok(vars
                .iter()
                .map(|v| store.get(v.as_tensor()).cloned())
                .collect())
        };
        let per_sequence = match &self.graphs {
            Graphs::Kept(graphs) => graphs
                .par_iter()
                .enumerate()
                .map(|(i, lp)| backward(i, lp))
                .collect::<Result<Vec<_>>>()?,
            Graphs::Recompute {
                model,
                lora,
                seqs,
                pad,
            } => seqs
                .iter()
                .enumerate()
                .map(|(i, s)| backward(i, &token_logps(model, lora.as_deref(), &[s], *pad)?.lp))
                .collect::<Result<Vec<_>>>()?,
            Graphs::Gpu {
                trainer,
                lora,
                seqs,
                pad,
            } => return gpu_gradients(&mut lock(trainer), lora, seqs, *pad, &d_lp, vars),
        };
        let mut total: Vec<Option<Tensor>> = vec![None; vars.len()];
        for grads in per_sequence {
            for (sum, g) in total.iter_mut().zip(grads) {
                if let Some(g) = g {
                    *sum = Some(match sum.take() {
                        Some(s) => (s + g)?,
                        None => g,
                    });
                }
            }
        }
        Ok(total)
    }
}

fn lock(g: &Mutex<GpuTrainer>) -> MutexGuard<'_, GpuTrainer> {
    g.lock().unwrap_or_else(|e| e.into_inner())
}

/// [`SequenceLogps::gradients`] on a GPU: each sequence's backward from its row of `d_lp` `[n, width]`, summed
/// on the device into each pair's `dA` and `dB` (of the tensors in `lora`, the ones the forward ran with), then
/// taken to `vars` by candle through whatever made those tensors from them (the dropout mask on `A`).
fn gpu_gradients(
    gpu: &mut GpuTrainer,
    lora: &LoraSet,
    seqs: &[Seq],
    pad: u32,
    d_lp: &Tensor,
    vars: &[&Var],
) -> Result<Vec<Option<Tensor>>> {
    gpu.set_adapter(Some(lora))?;
    let rows: Vec<Vec<f32>> = d_lp.to_vec2()?;
    for (s, d) in seqs.iter().zip(&rows) {
        let e = encode(&[s], pad);
        // Position l − 1 has no target, and the row is zero past the sequence's end.
        let mut d = d[..e.l - 1].to_vec();
        d.push(0.0);
        gpu.accumulate(&e.tokens, &e.targets, &d)?;
    }
    let mut surrogate: Option<Tensor> = None;
    for g in gpu.take_gradients()? {
        let Some(p) = lora.get(g.layer, g.target) else {
            continue;
        };
        let term = ((&p.a * &g.a)?.sum_all()? + (&p.b * &g.b)?.sum_all()?)?;
        surrogate = Some(match surrogate {
            Some(s) => (s + term)?,
            None => term,
        });
    }
    let Some(surrogate) = surrogate else {
        return Ok(vec![None; vars.len()]);
    };
    let store = surrogate.backward()?;
    Ok(vars
        .iter()
        .map(|v| store.get(v.as_tensor()).cloned())
        .collect())
}

/// Saved activations, in bytes, that a training forward over sequences of `lengths` tokens keeps for its
/// backward on a model shaped like `cfg`: per token and layer, f32 copies of about six hidden-size vectors
/// (norms, projections, residual sums), four intermediate-size ones (gate, up, their product, the activation)
/// and two rows of attention scores per head.
pub fn activation_bytes(cfg: &ModelConfig, lengths: impl IntoIterator<Item = usize>) -> usize {
    lengths
        .into_iter()
        .map(|l| {
            let per_token = 6 * cfg.hidden_size + 4 * cfg.intermediate_size + 2 * cfg.num_heads * l;
            l * cfg.num_layers * per_token * 4
        })
        .sum()
}

/// Mean negative log-likelihood over scored tokens (the SFT and replay loss). Unscored tokens
/// are multiplied by zero, so they contribute exactly zero gradient.
pub fn masked_nll(lp: &Tensor, mask: &Tensor) -> Result<Tensor> {
    let count = mask.sum_all()?.to_scalar::<f32>()?.max(1.0);
    Ok(((lp * mask)?.sum_all()? * (-1.0 / count as f64))?)
}

/// `−log σ(x)`, stable for large |x|: `relu(−x) + log(1 + e^{−|x|})`.
pub fn neg_log_sigmoid(x: &Tensor) -> Result<Tensor> {
    let nx = x.neg()?;
    Ok((nx.relu()? + ((x.abs()?.neg()?.exp()? + 1.0)?.log()?))?)
}

/// `σ(x) = 1 / (1 + e^{−x})`, from differentiable primitives.
pub fn sigmoid(x: &Tensor) -> Result<Tensor> {
    Ok((x.neg()?.exp()? + 1.0)?.recip()?)
}

/// DPO (sigmoid loss), mean over pairs: `−log σ(β·((π_c − ref_c) − (π_r − ref_r)))`. All `[p]`.
pub fn dpo_loss(
    pi_c: &Tensor,
    pi_r: &Tensor,
    ref_c: &Tensor,
    ref_r: &Tensor,
    beta: f64,
) -> Result<Tensor> {
    let margin = ((pi_c - ref_c)? - (pi_r - ref_r)?)?;
    Ok(neg_log_sigmoid(&(margin * beta)?)?.mean_all()?)
}

/// Advantage-weighted log-likelihood with a KL penalty to the reference, per token, averaged per
/// sequence then over `rows` (index, advantage): GRPO's objective, and that of rated answers.
pub fn advantage_loss(
    policy: &TokenLogps,
    reference: &TokenLogps,
    rows: &[(u32, f64)],
    kl_coef: f64,
) -> Result<Tensor> {
    let i: Vec<u32> = rows.iter().map(|g| g.0).collect();
    let adv: Vec<f32> = rows.iter().map(|g| g.1 as f32).collect();
    let adv = Tensor::from_vec(adv, (i.len(), 1), &Device::Cpu)?;
    let index = Tensor::new(i.as_slice(), &Device::Cpu)?;
    let lp = policy.lp.index_select(&index, 0)?;
    let rl = reference.lp.index_select(&index, 0)?;
    let mask = policy.mask.index_select(&index, 0)?;
    // k3 = e^{ref−π} − (ref−π) − 1: unbiased, always ≥ 0.
    let d = (rl - &lp)?;
    let k3 = ((d.exp()? - &d)? - 1.0)?;
    let per_tok = ((lp.broadcast_mul(&adv)?.neg()?) + (k3 * kl_coef)?)?;
    let per_seq = ((per_tok * &mask)?.sum(1)? / mask.sum(1)?.clamp(1f32, f32::MAX)?)?;
    Ok(per_seq.mean_all()?)
}

/// KTO, mean over items: desirable `w_d·(1 − σ(β(r − z)))`, undesirable `w_u·(1 − σ(β(z − r)))`
/// with `r = π − ref` and the reference point `z = max(0, mean r)` held constant (the batch
/// estimate of the KL term, as TRL detaches it).
pub fn kto_loss(
    pi: &Tensor,
    reference: &Tensor,
    desirable: &[bool],
    beta: f64,
    w_desirable: f64,
    w_undesirable: f64,
) -> Result<Tensor> {
    let r = (pi - reference)?;
    let z = r.detach().mean_all()?.to_scalar::<f32>()?.max(0.0) as f64;
    let sign: Vec<f32> = desirable
        .iter()
        .map(|d| if *d { 1.0 } else { -1.0 })
        .collect();
    let weight: Vec<f32> = desirable
        .iter()
        .map(|d| if *d { w_desirable } else { w_undesirable } as f32)
        .collect();
    let n = desirable.len();
    let sign = Tensor::from_vec(sign, n, &Device::Cpu)?;
    let weight = Tensor::from_vec(weight, n, &Device::Cpu)?;
    let x = ((r - z)? * sign)?;
    let per = ((sigmoid(&(x * beta)?)?.neg()? + 1.0)? * weight)?;
    Ok(per.mean_all()?)
}
