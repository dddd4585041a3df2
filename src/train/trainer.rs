//! The training loop: LoRA vars over a frozen base, AdamW with warmup + cosine decay, gradient
//! accumulation, clipping by global norm, a non-finite guard, seeded determinism (same seed and
//! data give identical adapter bytes) and resumable checkpoints.

use std::sync::{Arc, Mutex};
use std::time::Instant;

use candle_core::{Device, Tensor, Var};
use candle_nn::ParamsAdamW;
use rand::rngs::StdRng;
use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};
use serde::{Deserialize, Serialize};
use std::collections::HashMap;
use std::path::{Path, PathBuf};

use super::data::{Example, Seq, encode_sample, encode_text};
use super::loss::{
    SequenceLogps, TokenLogps, activation_bytes, advantage_loss, dpo_loss, kto_loss, masked_nll,
    sequence_logps,
};
use super::reward::{Reward, builtin};
use super::{Result, TrainConfig, TrainError, io_err};
use crate::message::Sample;
use crate::model::{
    DeviceStatus, GenerateConfig, GpuDecoder, GpuModel, GpuTrainer, LoraPair, LoraSet, StopReason,
    Tokenizer, Transformer,
};

/// What one optimizer step did.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct StepReport {
    /// 0-based step within the cycle.
    pub step: usize,
    pub loss: f64,
    pub lr: f64,
    /// Global gradient norm before clipping.
    pub grad_norm: f64,
    /// Non-pad tokens forwarded in this step.
    pub tokens: usize,
    /// The loss or gradient was not finite: no update was applied.
    pub skipped: bool,
}

/// What a cycle did; goes into the delta's provenance.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct CycleReport {
    pub steps: usize,
    pub skipped_nonfinite: usize,
    pub examples: usize,
    /// Samples that yielded no example (unknown role, truncated away, Scored without GRPO).
    pub samples_unused: usize,
    pub losses: Vec<f64>,
    pub tokens: usize,
    pub seconds: f64,
    pub tokens_per_second: f64,
    /// The step a checkpoint resumed this cycle at, if any.
    pub resumed_at_step: Option<usize>,
    /// Samples held out as personalisation probes (`holdout_fraction`).
    pub held_out: usize,
    /// Self-generated samples the collapse guard left out (`max_self_generated_share`).
    pub capped_self_generated: usize,
    /// [`super::data_digest`] of the samples this cycle trained on, after the hold-out and the guard.
    pub data_digest: String,
    /// CPU threads the cycle's kernels ran on (the rayon pool it ran in).
    pub threads: usize,
    /// Micro-batches whose saved activations would have exceeded `activation_budget_mib`, so that each of
    /// their sequences' forward ran again for its backward.
    #[serde(default)]
    pub recomputed_micro_batches: usize,
    /// Where the forward and backward ran: `cpu`, or the device and the GPU's name ([`LoraTrainer::use_device`]).
    #[serde(default)]
    pub device: String,
    /// Why training ran on the CPU when another device was asked for.
    #[serde(default)]
    pub device_notice: Option<String>,
    /// Seconds the cycle spent giving replay sequences the base's distributions (`replay_distill_top_k`).
    #[serde(default)]
    pub replay_distill_seconds: f64,
}

impl CycleReport {
    pub fn first_loss(&self) -> Option<f64> {
        self.losses.iter().copied().find(|l| l.is_finite())
    }
    pub fn last_loss(&self) -> Option<f64> {
        self.losses.iter().rev().copied().find(|l| l.is_finite())
    }
}

/// Trains one adapter over a borrowed, frozen model. Optimizer state persists across cycles; the
/// learning-rate schedule restarts (re-warms) at every cycle.
pub struct LoraTrainer<'m> {
    model: &'m Transformer,
    tok: &'m Tokenizer,
    cfg: TrainConfig,
    max_len: usize,
    set: LoraSet,
    vars: Vec<(String, Var)>,
    opt: AdamW,
    replay: Vec<Seq>,
    reward: Arc<dyn Reward>,
    pad: u32,
    cycle: u64,
    checkpoint_dir: Option<PathBuf>,
    /// Where the forward and backward run when not on the CPU ([`Self::use_device`]).
    gpu: Option<Arc<Mutex<GpuTrainer>>>,
    /// Where training runs, and why not where it was asked to.
    device: DeviceStatus,
}

/// Sequences of one micro-batch and which loss each row feeds.
#[derive(Default)]
struct Batch {
    seqs: Vec<Seq>,
    sft: Vec<u32>,
    replay: Vec<u32>,
    pairs: Vec<(u32, u32)>,
    kto: Vec<(u32, bool)>,
    /// Rated answers with their advantage.
    rated: Vec<(u32, f64)>,
    /// GRPO rows with their advantage, and the number of prompts they came from.
    grpo: Vec<(u32, f64)>,
    grpo_prompts: usize,
}

impl Batch {
    fn push(&mut self, s: Seq) -> u32 {
        self.seqs.push(s);
        (self.seqs.len() - 1) as u32
    }
}

/// The softmax of `logits` over its `k` largest entries (ties broken by the lower id), as (token, weight) pairs
/// in descending weight.
fn top_k_distribution(logits: &[f32], k: usize) -> Vec<(u32, f32)> {
    let k = k.min(logits.len());
    let mut idx: Vec<u32> = (0..logits.len() as u32).collect();
    let by_logit = |a: &u32, b: &u32| {
        logits[*b as usize]
            .total_cmp(&logits[*a as usize])
            .then(a.cmp(b))
    };
    if k < idx.len() {
        idx.select_nth_unstable_by(k, by_logit);
        idx.truncate(k);
    }
    idx.sort_unstable_by(by_logit);
    let max = idx.first().map_or(0.0, |&i| logits[i as usize]);
    let e: Vec<f32> = idx
        .iter()
        .map(|&i| (logits[i as usize] - max).exp())
        .collect();
    let sum: f32 = e.iter().sum();
    idx.into_iter().zip(e).map(|(i, e)| (i, e / sum)).collect()
}

/// Directory name of the checkpoint inside the checkpoint dir.
const CHECKPOINT: &str = "checkpoint";

#[derive(Serialize, Deserialize)]
struct CheckpointState {
    cycle: u64,
    next_step: usize,
    optimizer_steps: usize,
    recipe_sha256: String,
    data_digest: String,
}

/// A seed from parts (splitmix64 finaliser over a running mix).
fn mix(seed: u64, cycle: u64, index: u64, stream: u64) -> u64 {
    let mut z = seed;
    for p in [cycle, index, stream] {
        z = z.wrapping_add(p.wrapping_add(1).wrapping_mul(0x9E37_79B9_7F4A_7C15));
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^= z >> 31;
    }
    z
}

/// Example order: epoch `e` is a permutation seeded by (seed, cycle, e), so position `i` of the
/// stream is a pure function and a resumed run continues the same order.
struct Order {
    seed: u64,
    cycle: u64,
    n: usize,
    perms: HashMap<usize, Vec<usize>>,
}

impl Order {
    fn new(seed: u64, cycle: u64, n: usize) -> Self {
        Self {
            seed,
            cycle,
            n,
            perms: HashMap::new(),
        }
    }

    fn at(&mut self, i: usize) -> usize {
        let (epoch, pos) = (i / self.n, i % self.n);
        let (seed, cycle, n) = (self.seed, self.cycle, self.n);
        let perm = self.perms.entry(epoch).or_insert_with(|| {
            let mut p: Vec<usize> = (0..n).collect();
            p.shuffle(&mut StdRng::seed_from_u64(mix(
                seed,
                cycle,
                epoch as u64,
                0,
            )));
            p
        });
        perm[pos]
    }
}

/// AdamW with the same update as candle-nn's (decoupled weight decay, bias correction), but
/// with its moments reachable, so a checkpoint can save and restore them exactly.
struct AdamW {
    params: ParamsAdamW,
    step_t: usize,
    m: Vec<Tensor>,
    v: Vec<Tensor>,
}

impl AdamW {
    fn new(vars: &[(String, Var)], params: ParamsAdamW) -> Result<Self> {
        let zeros = |v: &Var| v.as_tensor().zeros_like();
        Ok(Self {
            params,
            step_t: 0,
            m: vars
                .iter()
                .map(|(_, v)| zeros(v))
                .collect::<candle_core::Result<_>>()?,
            v: vars
                .iter()
                .map(|(_, v)| zeros(v))
                .collect::<candle_core::Result<_>>()?,
        })
    }

    fn step(&mut self, vars: &[(String, Var)], grads: &[Option<Tensor>], lr: f64) -> Result<()> {
        self.step_t += 1;
        let p = &self.params;
        let (b1, b2) = (p.beta1, p.beta2);
        let scale_m = 1.0 / (1.0 - b1.powi(self.step_t as i32));
        let scale_v = 1.0 / (1.0 - b2.powi(self.step_t as i32));
        for (i, ((_, var), g)) in vars.iter().zip(grads).enumerate() {
            let Some(g) = g else { continue };
            let m = ((&self.m[i] * b1)? + (g * (1.0 - b1))?)?;
            let v = ((&self.v[i] * b2)? + (g.sqr()? * (1.0 - b2))?)?;
            let adjusted = ((&m * scale_m)? / ((&v * scale_v)?.sqrt()? + p.eps)?)?;
            let theta = (var.as_tensor() * (1.0 - lr * p.weight_decay))?;
            var.set(&(theta - (adjusted * lr)?)?)?;
            self.m[i] = m;
            self.v[i] = v;
        }
        Ok(())
    }
}

/// One micro-batch's loss and the per-sequence graphs its gradients flow through.
struct MicroLoss<'m> {
    loss: Tensor,
    /// Non-pad tokens forwarded.
    tokens: usize,
    /// Whether its gradients run each sequence's forward again (`activation_budget_mib`).
    recomputed: bool,
    /// `None` for an empty micro-batch (the loss is a constant).
    policy: Option<SequenceLogps<'m>>,
}

impl MicroLoss<'_> {
    /// The gradient of `loss` (this micro-batch's loss, possibly scaled) for each of `vars`.
    fn gradients(&self, loss: &Tensor, vars: &[(String, Var)]) -> Result<Vec<Option<Tensor>>> {
        match &self.policy {
            Some(p) => p.gradients(loss, &vars.iter().map(|(_, v)| v).collect::<Vec<_>>()),
            None => Ok(vec![None; vars.len()]),
        }
    }
}

fn rows(t: &Tensor, idx: &[u32]) -> Result<Tensor> {
    let i = Tensor::from_slice(idx, idx.len(), &Device::Cpu)?;
    Ok(t.index_select(&i, 0)?)
}

impl<'m> LoraTrainer<'m> {
    /// A trainer starting from `parent` (continuing a previous delta) or from a fresh adapter
    /// (`A` random from the seed, `B = 0`, so the model starts exactly at the base).
    pub fn new(
        model: &'m Transformer,
        tok: &'m Tokenizer,
        cfg: TrainConfig,
        parent: Option<&LoraSet>,
    ) -> Result<Self> {
        cfg.validate()?;
        crate::model::transformer::set_transpose_cache_limit(
            cfg.transpose_cache_mib.saturating_mul(1 << 20),
        );
        let init = match parent {
            Some(p) => {
                p.check_compatible(model)?;
                if p.config.use_dora != cfg.dora {
                    return Err(TrainError::Config(format!(
                        "the parent delta is {} but the recipe asks for {}",
                        if p.config.use_dora {
                            "DoRA"
                        } else {
                            "plain LoRA"
                        },
                        if cfg.dora { "DoRA" } else { "plain LoRA" }
                    )));
                }
                p.clone()
            }
            None => LoraSet::fresh(model, cfg.lora_config(), cfg.seed)?,
        };
        let (set, vars) = init.to_vars()?;
        let opt = AdamW::new(
            &vars,
            ParamsAdamW {
                lr: cfg.learning_rate,
                beta1: cfg.beta1,
                beta2: cfg.beta2,
                eps: cfg.eps,
                weight_decay: cfg.weight_decay,
            },
        )?;
        let max_len = cfg.max_seq_len.min(model.max_positions());
        let mut texts = cfg.replay_texts.clone();
        let lines = |s: &str| {
            s.lines()
                .map(str::trim)
                .filter(|l| !l.is_empty())
                .map(String::from)
                .collect::<Vec<_>>()
        };
        if let Some(path) = &cfg.replay_file {
            let s = std::fs::read_to_string(path).map_err(|e| io_err(path, e))?;
            texts.extend(lines(&s));
        }
        if cfg.replay_builtin {
            texts.extend(lines(super::BUILTIN_REPLAY));
        }
        let replay = texts
            .iter()
            .filter_map(|t| encode_text(tok, t, max_len))
            .collect();
        let pad = tok
            .token_id("<|endoftext|>")
            .or(tok.eos_id)
            .unwrap_or_default();
        Ok(Self {
            model,
            tok,
            reward: builtin(cfg.grpo_reward),
            cfg,
            max_len,
            set,
            vars,
            opt,
            replay,
            pad,
            cycle: 0,
            checkpoint_dir: None,
            gpu: None,
            device: DeviceStatus {
                running_on: "cpu".into(),
                notice: None,
            },
        })
    }

    /// Runs each sequence's forward and backward on `device` (the optimizer and the losses stay on the CPU).
    /// Where it does not open, or its training step does not cover the base or the recipe (DoRA), training
    /// stays on the CPU, with the reason in the returned status and in every cycle's report; so does the rest
    /// of a cycle in which the device fails.
    pub fn use_device(&mut self, device: crate::gpu::Device) -> &DeviceStatus {
        self.gpu = None;
        self.device = match device.open() {
            crate::gpu::Opened::Cpu(notice) => DeviceStatus {
                running_on: "cpu".into(),
                notice,
            },
            crate::gpu::Opened::Gpu(g) => match GpuModel::new(&g, self.model, self.max_len) {
                Ok(weights) => return self.use_gpu_weights(Arc::new(weights)),
                Err(e) => DeviceStatus {
                    running_on: "cpu".into(),
                    notice: Some(format!("device {device}: {e}; training on the CPU")),
                },
            },
        };
        if let Some(n) = &self.device.notice {
            tracing::warn!("trainer: {n}");
        }
        &self.device
    }

    /// [`Self::use_device`] over weights already on a device (of this trainer's base), for sequences of up to
    /// their capacity.
    pub fn use_gpu_weights(&mut self, weights: Arc<GpuModel>) -> &DeviceStatus {
        let on = weights.describe();
        let cpu = |notice: String| DeviceStatus {
            running_on: "cpu".into(),
            notice: Some(notice),
        };
        self.gpu = None;
        self.device = if self.cfg.dora {
            cpu(format!(
                "{on}: DoRA has no GPU training step; training on the CPU"
            ))
        } else {
            match GpuTrainer::new(weights) {
                Ok(t) => {
                    self.gpu = Some(Arc::new(Mutex::new(t)));
                    DeviceStatus {
                        running_on: on,
                        notice: None,
                    }
                }
                Err(e) => cpu(format!("{on}: {e}; training on the CPU")),
            }
        };
        if let Some(n) = &self.device.notice {
            tracing::warn!("trainer: {n}");
        }
        &self.device
    }

    /// Replaces the GRPO reward.
    pub fn with_reward(mut self, reward: Arc<dyn Reward>) -> Self {
        self.reward = reward;
        self
    }

    pub fn config(&self) -> &TrainConfig {
        &self.cfg
    }

    /// Adds chat turns (a prompt and the answer to keep) to the replay set, trained on their answer tokens:
    /// self-distilled replay ([`super::replay`]).
    pub fn add_replay_turns(&mut self, turns: &[super::replay::Turn]) {
        for t in turns {
            let prompt = [crate::model::ChatMessage::new(
                crate::message::Role::User,
                t.prompt.clone(),
            )];
            if let Some(seq) = super::data::encode_turns(self.tok, &prompt, &t.answer, self.max_len)
            {
                self.replay.push(seq);
            }
        }
    }

    /// With `replay_distill_top_k`, gives every replay sequence that has none the base's own next-token
    /// distribution at its scored tokens (no adapter: the frozen base), cut to the likeliest `k` and
    /// renormalised, which replay then trains towards. Once per sequence: the base never changes.
    fn distill_replay(&mut self) -> Result<()> {
        let k = self.cfg.replay_distill_top_k;
        if k == 0 {
            return Ok(());
        }
        for seq in self.replay.iter_mut().filter(|s| s.soft.is_none()) {
            let t = Tensor::from_slice(&seq.ids, (1, seq.ids.len()), &Device::Cpu)?;
            let logits = self.model.forward(&t, None, None)?.squeeze(0)?;
            let rows: Vec<Vec<f32>> = logits.to_dtype(candle_core::DType::F32)?.to_vec2()?;
            let mut soft = crate::model::Targets::with_capacity(seq.ids.len());
            soft.push_none();
            for i in 1..seq.ids.len() {
                if seq.mask[i] {
                    soft.push_soft(&top_k_distribution(&rows[i - 1], k));
                } else {
                    soft.push_none();
                }
            }
            seq.soft = Some(Arc::new(soft));
        }
        Ok(())
    }

    /// A detached copy of the current adapter, safe to save or serve while training continues.
    pub fn adapter(&self) -> Result<LoraSet> {
        Ok(self.set.snapshot()?)
    }

    /// Encodes samples into examples; returns them and how many samples yielded none. Rated answers get
    /// their advantage: `(score − baseline) / spread`, the spread being the root mean square of the scores
    /// around the baseline (so a lone score above a fixed baseline counts as +1), clamped to ±3.
    pub fn encode(&self, samples: &[Sample]) -> (Vec<Example>, usize) {
        let grpo = self.cfg.grpo_group_size > 0;
        let mut ex: Vec<Example> = samples
            .iter()
            .filter_map(|s| encode_sample(self.tok, s, self.max_len, grpo))
            .collect();
        let unused = samples.len() - ex.len();
        ex.extend(
            samples
                .iter()
                .flat_map(|s| super::data::prompt_variants(s, self.cfg.prompt_variants))
                .filter_map(|s| encode_sample(self.tok, &s, self.max_len, grpo)),
        );
        let scores: Vec<f64> = ex
            .iter()
            .filter_map(|e| match e {
                Example::Rated { score, .. } => Some(*score),
                _ => None,
            })
            .collect();
        if !scores.is_empty() {
            let n = scores.len() as f64;
            let baseline = self
                .cfg
                .score_baseline
                .unwrap_or_else(|| scores.iter().sum::<f64>() / n);
            let spread = (scores.iter().map(|s| (s - baseline).powi(2)).sum::<f64>() / n).sqrt();
            for e in &mut ex {
                if let Example::Rated {
                    score, advantage, ..
                } = e
                {
                    *advantage = if spread > 0.0 {
                        ((*score - baseline) / spread).clamp(-3.0, 3.0)
                    } else {
                        0.0
                    };
                }
            }
        }
        (ex, unused)
    }

    /// Gradients of one micro-batch (the first `batch_size` examples, in order) for every LoRA
    /// tensor, by PEFT key, without updating anything. For checks and tests.
    pub fn gradients(&mut self, samples: &[Sample]) -> Result<Vec<(String, Tensor)>> {
        let (ex, _) = self.encode(samples);
        let batch: Vec<&Example> = ex.iter().take(self.cfg.batch_size).collect();
        if batch.is_empty() {
            return Err(TrainError::NoData(samples.len()));
        }
        let mut rng = StdRng::seed_from_u64(self.cfg.seed);
        let micro = self.micro_loss(&batch, &mut rng)?;
        let grads = micro.gradients(&micro.loss, &self.vars)?;
        self.vars
            .iter()
            .zip(grads)
            .map(|((k, v), g)| {
                let g = match g {
                    Some(g) => g,
                    None => v.as_tensor().zeros_like()?,
                };
                Ok((k.clone(), g))
            })
            .collect()
    }

    /// Where checkpoints go: with `cfg.checkpoint_every > 0`, the full training state is saved
    /// there every that many steps, and a cycle that finds a checkpoint of the same recipe, data
    /// and cycle resumes from it (bit-identically to an uninterrupted run).
    pub fn set_checkpoint_dir(&mut self, dir: impl Into<PathBuf>) {
        self.checkpoint_dir = Some(dir.into());
    }

    /// One training cycle of `cfg.steps` optimizer steps over `samples`, less the held-out probes and
    /// what the collapse guard caps (see [`super::data::select_training`]). `on_step` sees every
    /// step (metrics, progress); between steps the thread sleeps `step_sleep_ms`.
    pub fn train_cycle(
        &mut self,
        samples: &[Sample],
        mut on_step: impl FnMut(&StepReport),
    ) -> Result<CycleReport> {
        let selection = super::data::select_training(
            samples,
            self.cfg.holdout_fraction,
            self.cfg.max_self_generated_share,
        );
        let samples = &selection.train[..];
        let (examples, unused) = self.encode(samples);
        if examples.is_empty() {
            return Err(TrainError::NoData(samples.len()));
        }
        let distill_started = Instant::now();
        self.distill_replay()?;
        let replay_distill_seconds = distill_started.elapsed().as_secs_f64();
        let cycle = self.cycle;
        self.cycle += 1;
        let digest = super::data_digest(samples);
        let first = match self.checkpoint_dir.clone() {
            Some(dir) => self.resume(&dir, cycle, &digest)?.unwrap_or(0),
            None => 0,
        };
        let started = Instant::now();
        let mut report = CycleReport {
            examples: examples.len(),
            samples_unused: unused,
            held_out: selection.held_out,
            capped_self_generated: selection.capped,
            data_digest: digest.clone(),
            threads: rayon::current_num_threads(),
            resumed_at_step: (first > 0).then_some(first),
            replay_distill_seconds,
            device: self.device.running_on.clone(),
            device_notice: self.device.notice.clone(),
            ..CycleReport::default()
        };
        let mut order = Order::new(self.cfg.seed, cycle, examples.len());
        for step in first..self.cfg.steps {
            let lr = self.cfg.lr_at(step);
            let mut acc: Vec<Option<Tensor>> = vec![None; self.vars.len()];
            let mut loss_sum = 0.0;
            let mut tokens = 0;
            let mut finite = true;
            for k in 0..self.cfg.grad_accum {
                // Everything random in a micro-batch derives from (seed, cycle, index), so a
                // resumed run draws exactly what the interrupted one would have.
                let micro = (step * self.cfg.grad_accum + k) as u64;
                let mut rng = StdRng::seed_from_u64(mix(self.cfg.seed, cycle, micro, 1));
                let batch: Vec<&Example> = (0..self.cfg.batch_size)
                    .map(|j| &examples[order.at(micro as usize * self.cfg.batch_size + j)])
                    .collect();
                let attempt = match self.micro_gradients(&batch, &mut rng.clone()) {
                    Err(e) if self.gpu.is_some() => {
                        // The device failed (out of memory, a driver fault, a sequence it cannot hold): the
                        // rest of the cycle runs on the CPU, from this micro-batch's own draws again.
                        let notice = format!(
                            "{} failed at step {step}: {e}; the rest of the cycle ran on the CPU",
                            self.device.running_on
                        );
                        tracing::warn!("trainer: {notice}");
                        self.gpu = None;
                        self.device = DeviceStatus {
                            running_on: "cpu".into(),
                            notice: Some(notice),
                        };
                        report.device = self.device.running_on.clone();
                        report.device_notice = self.device.notice.clone();
                        self.micro_gradients(&batch, &mut rng)?
                    }
                    other => other?,
                };
                let (value, micro_tokens, recomputed, grads) = attempt;
                tokens += micro_tokens;
                report.recomputed_micro_batches += usize::from(recomputed);
                loss_sum += value;
                let Some(grads) = grads else {
                    finite = false;
                    continue;
                };
                for (slot, g) in acc.iter_mut().zip(grads) {
                    if let Some(g) = g {
                        *slot = Some(match slot.take() {
                            Some(prev) => (prev + g)?,
                            None => g,
                        });
                    }
                }
            }
            let mut sq = 0f64;
            for g in acc.iter().flatten() {
                sq += g.sqr()?.sum_all()?.to_scalar::<f32>()? as f64;
            }
            let grad_norm = sq.sqrt();
            let skipped = !finite || !grad_norm.is_finite();
            if skipped {
                report.skipped_nonfinite += 1;
            } else {
                let clip = if self.cfg.max_grad_norm > 0.0 && grad_norm > self.cfg.max_grad_norm {
                    self.cfg.max_grad_norm / (grad_norm + 1e-6)
                } else {
                    1.0
                };
                if clip < 1.0 {
                    for g in acc.iter_mut().flatten() {
                        *g = (&*g * clip)?;
                    }
                }
                self.opt.step(&self.vars, &acc, lr)?;
            }
            let sr = StepReport {
                step,
                loss: loss_sum,
                lr,
                grad_norm,
                tokens,
                skipped,
            };
            report.steps += 1;
            report.tokens += tokens;
            report.losses.push(loss_sum);
            if let Some(dir) = &self.checkpoint_dir
                && self.cfg.checkpoint_every > 0
                && (step + 1) % self.cfg.checkpoint_every == 0
                && step + 1 < self.cfg.steps
            {
                self.save_checkpoint(dir, cycle, step + 1, &digest)?;
            }
            on_step(&sr);
            if self.cfg.step_sleep_ms > 0 {
                std::thread::sleep(std::time::Duration::from_millis(self.cfg.step_sleep_ms));
            } else {
                std::thread::yield_now();
            }
        }
        if let Some(dir) = &self.checkpoint_dir {
            // The cycle's result is the delta now; a stale checkpoint must not resume later.
            let _ = std::fs::remove_dir_all(dir.join(CHECKPOINT));
        }
        report.seconds = started.elapsed().as_secs_f64();
        report.tokens_per_second = report.tokens as f64 / report.seconds.max(1e-9);
        Ok(report)
    }

    /// Writes adapter, optimizer moments and position atomically (temp dir + rename).
    fn save_checkpoint(
        &self,
        dir: &Path,
        cycle: u64,
        next_step: usize,
        digest: &str,
    ) -> Result<()> {
        std::fs::create_dir_all(dir).map_err(|e| io_err(dir, e))?;
        let tmp = dir.join(format!("{CHECKPOINT}.tmp"));
        let _ = std::fs::remove_dir_all(&tmp);
        std::fs::create_dir_all(&tmp).map_err(|e| io_err(&tmp, e))?;
        let mut tensors = HashMap::new();
        for (i, (k, v)) in self.vars.iter().enumerate() {
            tensors.insert(k.clone(), v.as_tensor().detach().copy()?);
            tensors.insert(format!("{k}#m"), self.opt.m[i].clone());
            tensors.insert(format!("{k}#v"), self.opt.v[i].clone());
        }
        let st = tmp.join("state.safetensors");
        candle_core::safetensors::save(&tensors, &st)?;
        let state = CheckpointState {
            cycle,
            next_step,
            optimizer_steps: self.opt.step_t,
            recipe_sha256: super::artifact::recipe_sha256(&self.cfg)?,
            data_digest: digest.to_string(),
        };
        let js = tmp.join("state.json");
        std::fs::write(&js, serde_json::to_vec_pretty(&state)?).map_err(|e| io_err(&js, e))?;
        let dest = dir.join(CHECKPOINT);
        let _ = std::fs::remove_dir_all(&dest);
        std::fs::rename(&tmp, &dest).map_err(|e| io_err(&dest, e))?;
        Ok(())
    }

    /// Loads a matching checkpoint; returns the step to continue from.
    fn resume(&mut self, dir: &Path, cycle: u64, digest: &str) -> Result<Option<usize>> {
        let cp = dir.join(CHECKPOINT);
        let js = cp.join("state.json");
        let Ok(text) = std::fs::read(&js) else {
            return Ok(None);
        };
        let state: CheckpointState = serde_json::from_slice(&text)?;
        if state.cycle != cycle
            || state.data_digest != digest
            || state.recipe_sha256 != super::artifact::recipe_sha256(&self.cfg)?
        {
            tracing::warn!(path = %cp.display(), "checkpoint of another run ignored");
            return Ok(None);
        }
        let st = cp.join("state.safetensors");
        let tensors = candle_core::safetensors::load(&st, &Device::Cpu)?;
        let get = |k: &str| {
            tensors
                .get(k)
                .cloned()
                .ok_or_else(|| TrainError::Config(format!("checkpoint lacks `{k}`")))
        };
        for (i, (k, v)) in self.vars.iter().enumerate() {
            v.set(&get(k)?)?;
            self.opt.m[i] = get(&format!("{k}#m"))?;
            self.opt.v[i] = get(&format!("{k}#v"))?;
        }
        self.opt.step_t = state.optimizer_steps;
        Ok(Some(state.next_step))
    }

    /// The adapter used for one micro-batch: the trained set, with dropout masks on `A`'s input
    /// columns when `dropout > 0` (inverted dropout, so the expected path is unchanged).
    fn dropped_set(&self, rng: &mut StdRng) -> Result<LoraSet> {
        let p = self.cfg.dropout;
        if p <= 0.0 {
            return Ok(self.set.clone());
        }
        let keep = (1.0 / (1.0 - p)) as f32;
        let mut out = LoraSet::empty(self.set.config.clone());
        for (&(l, t), pair) in self.set.iter() {
            let cols = pair.a.dims().get(1).copied().unwrap_or(0);
            let m: Vec<f32> = (0..cols)
                .map(|_| if rng.random::<f64>() < p { 0.0 } else { keep })
                .collect();
            let m = Tensor::from_vec(m, (1, cols), &Device::Cpu)?;
            out.insert(
                l,
                t,
                LoraPair::with_magnitude(
                    pair.a.broadcast_mul(&m)?,
                    pair.b.clone(),
                    pair.scale,
                    pair.magnitude.clone(),
                ),
            );
        }
        Ok(out)
    }

    /// Samples a GRPO group for one prompt from the current policy and scores it.
    fn grpo_group(
        &self,
        batch: &mut Batch,
        ids: &[u32],
        messages: &[crate::model::ChatMessage],
        answer: Option<&str>,
        rng: &mut StdRng,
    ) -> Result<()> {
        let policy = self.set.snapshot()?;
        let mut gen_cfg = GenerateConfig::greedy(self.tok, self.cfg.grpo_max_new_tokens);
        gen_cfg.temperature = self.cfg.grpo_temperature;
        let mut rows = Vec::new();
        let mut rewards = Vec::new();
        // On a device, the group samples there from one decoder over the trainer's weights: the prompt is
        // prefilled once and its cache reused by every completion.
        let mut on_gpu = match &self.gpu {
            Some(g) => {
                let weights = g.lock().unwrap_or_else(|e| e.into_inner()).model().clone();
                Some(GpuDecoder::on(weights, Some(&policy))?)
            }
            None => None,
        };
        for _ in 0..self.cfg.grpo_group_size {
            gen_cfg.seed = rng.random();
            let sampled = on_gpu.as_mut().and_then(|d| {
                crate::model::generate_on_gpu(d, self.tok, ids, &gen_cfg, |_| true)
                    .inspect_err(|e| tracing::warn!("trainer: GRPO sample on the CPU: {e}"))
                    .ok()
            });
            let out = match sampled {
                Some((out, _)) => out,
                None => crate::model::generate(
                    self.model,
                    self.tok,
                    ids,
                    Some(&policy),
                    &gen_cfg,
                    |_| true,
                )?,
            };
            let mut seq_ids = ids.to_vec();
            seq_ids.extend(&out.tokens);
            if let StopReason::StopToken(t) = out.reason {
                seq_ids.push(t);
            }
            seq_ids.truncate(self.max_len);
            if seq_ids.len() <= ids.len() {
                continue;
            }
            let mut mask = vec![false; seq_ids.len()];
            mask[ids.len()..].iter_mut().for_each(|m| *m = true);
            rewards.push(self.reward.score(messages, &out.text, answer));
            rows.push(batch.push(Seq {
                ids: seq_ids,
                mask,
                soft: None,
            }));
        }
        if rows.is_empty() {
            return Ok(());
        }
        let n = rewards.len() as f64;
        let mean = rewards.iter().sum::<f64>() / n;
        let std = (rewards.iter().map(|r| (r - mean).powi(2)).sum::<f64>() / n).sqrt();
        for (row, r) in rows.into_iter().zip(rewards) {
            batch.grpo.push((row, (r - mean) / (std + 1e-4)));
        }
        batch.grpo_prompts += 1;
        Ok(())
    }

    /// One micro-batch's share of a step: its loss (divided by `grad_accum`), non-pad tokens, whether its
    /// forward ran again for the backward, and its gradients for every var (`None` when the loss is not
    /// finite).
    #[allow(clippy::type_complexity)]
    fn micro_gradients(
        &self,
        batch: &[&Example],
        rng: &mut StdRng,
    ) -> Result<(f64, usize, bool, Option<Vec<Option<Tensor>>>)> {
        let micro = self.micro_loss(batch, rng)?;
        let loss = (&micro.loss / self.cfg.grad_accum as f64)?;
        let value = loss.to_scalar::<f32>()? as f64;
        let grads = if value.is_finite() {
            Some(micro.gradients(&loss, &self.vars)?)
        } else {
            None
        };
        Ok((value, micro.tokens, micro.recomputed, grads))
    }

    /// The loss of one micro-batch, its non-pad token count and what its gradients need.
    fn micro_loss(&self, examples: &[&Example], rng: &mut StdRng) -> Result<MicroLoss<'m>> {
        let lora = self.dropped_set(rng)?;
        let mut b = Batch::default();
        for ex in examples {
            match ex {
                Example::Sft(s) => {
                    let i = b.push(s.clone());
                    b.sft.push(i);
                }
                Example::Preference { chosen, rejected } => {
                    let c = b.push(chosen.clone());
                    let r = b.push(rejected.clone());
                    b.pairs.push((c, r));
                }
                Example::Unpaired { seq, desirable } => {
                    let i = b.push(seq.clone());
                    b.kto.push((i, *desirable));
                }
                Example::Rated { seq, advantage, .. } => {
                    let i = b.push(seq.clone());
                    b.rated.push((i, *advantage));
                }
                Example::Prompt {
                    ids,
                    messages,
                    answer,
                } => self.grpo_group(&mut b, ids, messages, answer.as_deref(), rng)?,
            }
        }
        let f = self.cfg.replay_fraction;
        if f > 0.0 && !self.replay.is_empty() {
            for _ in 0..self.cfg.replay_per_batch {
                let s = self.replay[rng.random_range(0..self.replay.len())].clone();
                let i = b.push(s);
                b.replay.push(i);
            }
        }
        if b.seqs.is_empty() {
            return Ok(MicroLoss {
                loss: Tensor::new(0f32, &Device::Cpu)?,
                tokens: 0,
                recomputed: false,
                policy: None,
            });
        }
        let tokens = b.seqs.iter().map(|s| s.ids.len()).sum();
        let refs: Vec<&Seq> = b.seqs.iter().collect();
        let gpu = self.gpu.as_ref();
        // A GPU keeps one sequence's activations at a time whatever the budget (see `sequence_logps`).
        let recompute = gpu.is_none()
            && activation_bytes(self.model.config(), refs.iter().map(|s| s.ids.len()))
                > self.cfg.activation_budget_mib.saturating_mul(1 << 20);
        let policy = sequence_logps(self.model, Some(&lora), &refs, self.pad, recompute, gpu)?;
        let tl = &policy.logps;
        let needs_ref =
            !(b.pairs.is_empty() && b.kto.is_empty() && b.grpo.is_empty() && b.rated.is_empty());
        let reference = if needs_ref {
            // Without an adapter nothing is tracked: no graph to keep.
            let r = sequence_logps(self.model, None, &refs, self.pad, false, gpu)?.logps;
            Some(TokenLogps {
                lp: r.lp.detach(),
                mask: r.mask,
            })
        } else {
            None
        };
        let mut parts: Vec<(Tensor, f64)> = Vec::new();
        if !b.sft.is_empty() {
            let l = masked_nll(&rows(&tl.lp, &b.sft)?, &rows(&tl.mask, &b.sft)?)?;
            parts.push((l, b.sft.len() as f64));
        }
        if let Some(r) = &reference {
            let (pi, rf) = (tl.sums()?, r.sums()?.detach());
            if !b.pairs.is_empty() {
                let c: Vec<u32> = b.pairs.iter().map(|p| p.0).collect();
                let rj: Vec<u32> = b.pairs.iter().map(|p| p.1).collect();
                let l = dpo_loss(
                    &rows(&pi, &c)?,
                    &rows(&pi, &rj)?,
                    &rows(&rf, &c)?,
                    &rows(&rf, &rj)?,
                    self.cfg.dpo_beta,
                )?;
                let l = if self.cfg.dpo_sft_weight > 0.0 {
                    let chosen_nll = masked_nll(&rows(&tl.lp, &c)?, &rows(&tl.mask, &c)?)?;
                    (l + (chosen_nll * self.cfg.dpo_sft_weight)?)?
                } else {
                    l
                };
                parts.push((l, b.pairs.len() as f64));
            }
            if !b.kto.is_empty() {
                let i: Vec<u32> = b.kto.iter().map(|k| k.0).collect();
                let d: Vec<bool> = b.kto.iter().map(|k| k.1).collect();
                let l = kto_loss(
                    &rows(&pi, &i)?,
                    &rows(&rf, &i)?,
                    &d,
                    self.cfg.kto_beta,
                    self.cfg.kto_desirable_weight,
                    self.cfg.kto_undesirable_weight,
                )?;
                parts.push((l, b.kto.len() as f64));
            }
            if !b.rated.is_empty() {
                let l = advantage_loss(tl, r, &b.rated, self.cfg.score_kl_coef)?;
                parts.push((l, b.rated.len() as f64));
            }
            if !b.grpo.is_empty() {
                let l = advantage_loss(tl, r, &b.grpo, self.cfg.grpo_kl_coef)?;
                parts.push((l, b.grpo_prompts as f64));
            }
        }
        let total_w: f64 = parts.iter().map(|p| p.1).sum();
        let mut task: Option<Tensor> = None;
        for (l, w) in parts {
            let l = (l * (w / total_w))?;
            task = Some(match task {
                Some(t) => (t + l)?,
                None => l,
            });
        }
        let loss = match (task, b.replay.is_empty()) {
            (Some(t), true) => t,
            (Some(t), false) => {
                let r = masked_nll(&rows(&tl.lp, &b.replay)?, &rows(&tl.mask, &b.replay)?)?;
                ((t * (1.0 - f))? + (r * f)?)?
            }
            (None, false) => masked_nll(&rows(&tl.lp, &b.replay)?, &rows(&tl.mask, &b.replay)?)?,
            (None, true) => Tensor::new(0f32, &Device::Cpu)?,
        };
        Ok(MicroLoss {
            loss,
            tokens,
            recomputed: recompute,
            policy: Some(policy),
        })
    }
}
