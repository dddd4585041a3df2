//! The training recipe. Every knob lives here so that the recipe hash in a delta's provenance
//! covers everything that shaped the update.

use std::path::PathBuf;

use serde::{Deserialize, Serialize};

use crate::model::{LoraConfig, LoraTarget};

/// Which built-in reward GRPO scores completions with (a custom [`super::Reward`] can replace it).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum RewardKind {
    /// 1 when the completion contains the sample's accepted answer (case-insensitive).
    Contains,
    /// 1 when the trimmed completion equals the accepted answer.
    ExactMatch,
    /// 1 when the completion parses as JSON.
    JsonValid,
}

/// One training recipe. Unknown keys are refused: a typo must not silently train with a default.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct TrainConfig {
    /// Seeds LoRA init, data order, dropout masks and GRPO sampling.
    pub seed: u64,
    /// LoRA rank `r`.
    pub rank: usize,
    /// LoRA `alpha` (scale `alpha/r`, or `alpha/√r` with `rslora`).
    pub alpha: f64,
    pub rslora: bool,
    /// DoRA: also learn a magnitude per output row (`W' = m ⊙ (W + ΔW) / ‖W + ΔW‖_row`), saved as PEFT's
    /// `lora_magnitude_vector`. Such deltas have no llama.cpp export (llama.cpp cannot load DoRA).
    pub dora: bool,
    /// Probability of dropping an input feature of the LoRA path (one mask per projection and
    /// micro-batch, shared by its positions: applied to `A`'s columns, no base-model change).
    pub dropout: f64,
    /// Projections that get an adapter.
    pub targets: Vec<LoraTarget>,
    /// Peak learning rate (after warmup).
    pub learning_rate: f64,
    /// Cosine decay ends at `learning_rate × min_lr_ratio`.
    pub min_lr_ratio: f64,
    /// Linear warmup steps at the start of every cycle (re-warm after new data arrives).
    pub warmup_steps: usize,
    pub weight_decay: f64,
    pub beta1: f64,
    pub beta2: f64,
    pub eps: f64,
    /// Optimizer steps per training cycle.
    pub steps: usize,
    /// Examples per micro-batch.
    pub batch_size: usize,
    /// Micro-batches whose gradients are summed (averaged) into one optimizer step.
    pub grad_accum: usize,
    /// Clip the global gradient norm to this; 0 disables clipping.
    pub max_grad_norm: f64,
    /// Sequences are cut to this many tokens.
    pub max_seq_len: usize,
    /// Weight of the replay (plain language-model) loss in every micro-batch, against forgetting.
    pub replay_fraction: f64,
    /// Replay texts given inline.
    pub replay_texts: Vec<String>,
    /// A file of replay texts, one per non-empty line (added to `replay_texts`).
    pub replay_file: Option<PathBuf>,
    /// Add the general-language texts built into the binary ([`super::BUILTIN_REPLAY`]) to the replay set,
    /// so a graph needs no file beside it to guard against forgetting.
    pub replay_builtin: bool,
    /// Replay the base's own greedy answers to this many of hearth's everyday prompts as chat turns
    /// ([`super::replay`]), generated once per base and cached in the data directory; 0: none. Read where
    /// a cycle runs ([`super::cycle::run`]); a trainer built alone takes them through
    /// [`super::LoraTrainer::add_replay_turns`].
    pub replay_self_distilled: usize,
    /// Replay sequences drawn into every micro-batch (each weighted `replay_fraction / n` of its loss): more
    /// of them lower the variance of the pull towards the base without changing its weight; 0: no replay.
    pub replay_per_batch: usize,
    /// Train replay towards the base's own next-token distribution, cut to its this many likeliest tokens and
    /// renormalised (distillation: the whole distribution is kept, not one token per position), instead of
    /// towards the replay text's tokens; 0: the tokens.
    pub replay_distill_top_k: usize,
    /// Extra copies of each taught answer under rewordings of its question ([`super::data::PROMPT_VARIANTS`]:
    /// fixed wrappers around the user's last turn), up to this many per SFT sample: a fact seen under several
    /// phrasings is recalled from phrasings never trained (knowledge augmentation); 0: none.
    pub prompt_variants: usize,
    /// DPO inverse temperature β.
    pub dpo_beta: f64,
    /// Weight of an SFT loss on the preferred answer of each DPO pair (RPO): DPO alone widens the margin
    /// but may lower both answers' likelihood; this keeps the edited answer itself likely.
    pub dpo_sft_weight: f64,
    /// KTO β.
    pub kto_beta: f64,
    /// KTO weight of desirable (thumbs-up) examples.
    pub kto_desirable_weight: f64,
    /// KTO weight of undesirable (thumbs-down) examples.
    pub kto_undesirable_weight: f64,
    /// The score that counts as neutral in score feedback trained without GRPO: each scored answer is made
    /// likelier in proportion to how far its score is above this (in units of the cycle's spread of scores
    /// around it), less likely below it. `None`: the mean score of the cycle's scored answers.
    pub score_baseline: Option<f64>,
    /// Weight of the k3 KL estimate to the reference in that objective.
    pub score_kl_coef: f64,
    /// Completions sampled per prompt for GRPO; 0 disables GRPO, and score feedback then trains the scored
    /// answer itself (see `score_baseline`).
    pub grpo_group_size: usize,
    pub grpo_max_new_tokens: usize,
    pub grpo_temperature: f32,
    /// Weight of the k3 KL estimate to the reference (adapter disabled).
    pub grpo_kl_coef: f64,
    pub grpo_reward: RewardKind,
    /// Share of distinct prompts held out of training as the eval gate's personalisation probes (chosen by
    /// a hash of the prompt, so every copy and paraphrase-free repeat lands on the same side).
    pub holdout_fraction: f64,
    /// Collapse guard: the largest share of a cycle's samples that may be self-generated (the model's own
    /// answers); the newest beyond it are left out of the cycle.
    pub max_self_generated_share: f64,
    /// Save a resumable checkpoint every this many steps (0: never); needs a checkpoint dir.
    pub checkpoint_every: usize,
    /// Sleep after every optimizer step, so training yields the CPU to serving.
    pub step_sleep_ms: u64,
    /// MiB of saved activations a micro-batch's graphs may hold, as estimated from the model's shape and the
    /// sequences' lengths ([`super::loss::activation_bytes`]); past it, each sequence's forward runs again for its
    /// backward, one sequence at a time: the same update, for one more forward pass and less memory. The
    /// default is what is left of 1.5 GB over the base once `transpose_cache_mib` and ~0.45 GB for serving,
    /// the optimizer and the allocator's slack are taken.
    pub activation_budget_mib: usize,
    /// MiB of weight transposes kept across backward passes, for the whole process
    /// ([`crate::model::transformer::set_transpose_cache_limit`], set when a trainer is built); past it, each
    /// backward pass builds and drops its own: the same update, for more time and less memory.
    pub transpose_cache_mib: usize,
}

impl Default for TrainConfig {
    fn default() -> Self {
        Self {
            seed: 0,
            rank: 8,
            alpha: 16.0,
            rslora: false,
            dora: false,
            dropout: 0.0,
            targets: LoraTarget::ALL.to_vec(),
            learning_rate: 2e-4,
            min_lr_ratio: 0.1,
            warmup_steps: 10,
            weight_decay: 0.0,
            beta1: 0.9,
            beta2: 0.999,
            eps: 1e-8,
            steps: 100,
            batch_size: 4,
            grad_accum: 1,
            max_grad_norm: 1.0,
            max_seq_len: 512,
            replay_fraction: 0.05,
            replay_texts: Vec::new(),
            replay_file: None,
            replay_builtin: false,
            replay_self_distilled: 0,
            replay_per_batch: 1,
            replay_distill_top_k: 0,
            prompt_variants: 0,
            dpo_beta: 0.1,
            dpo_sft_weight: 0.0,
            kto_beta: 0.1,
            kto_desirable_weight: 1.0,
            kto_undesirable_weight: 1.0,
            score_baseline: None,
            score_kl_coef: 0.04,
            grpo_group_size: 0,
            grpo_max_new_tokens: 32,
            grpo_temperature: 1.0,
            grpo_kl_coef: 0.04,
            grpo_reward: RewardKind::Contains,
            holdout_fraction: 0.2,
            max_self_generated_share: 0.5,
            checkpoint_every: 0,
            step_sleep_ms: 0,
            activation_budget_mib: 768,
            transpose_cache_mib: crate::model::transformer::DEFAULT_TRANSPOSE_LIMIT >> 20,
        }
    }
}

impl TrainConfig {
    /// Rejects settings that cannot train, naming the field.
    pub fn validate(&self) -> Result<(), super::TrainError> {
        let bad =
            |field: &str, why: &str| Err(super::TrainError::Config(format!("{field}: {why}")));
        if self.rank == 0 {
            return bad("rank", "must be > 0");
        }
        if self.targets.is_empty() {
            return bad("targets", "at least one projection");
        }
        if !(0.0..1.0).contains(&self.dropout) {
            return bad("dropout", "must be in [0, 1)");
        }
        if !(0.0..=1.0).contains(&self.replay_fraction) {
            return bad("replay_fraction", "must be in [0, 1]");
        }
        if !(0.0..1.0).contains(&self.holdout_fraction) {
            return bad("holdout_fraction", "must be in [0, 1)");
        }
        if !(0.0..=1.0).contains(&self.max_self_generated_share) {
            return bad("max_self_generated_share", "must be in [0, 1]");
        }
        if self.batch_size == 0 || self.grad_accum == 0 {
            return bad("batch_size/grad_accum", "must be > 0");
        }
        if self.max_seq_len < 2 {
            return bad("max_seq_len", "must be >= 2");
        }
        if !(self.learning_rate.is_finite() && self.learning_rate >= 0.0) {
            return bad("learning_rate", "must be finite and >= 0");
        }
        if !(0.0..=1.0).contains(&self.min_lr_ratio) {
            return bad("min_lr_ratio", "must be in [0, 1]");
        }
        if self.max_grad_norm < 0.0 || !self.max_grad_norm.is_finite() {
            return bad("max_grad_norm", "must be finite and >= 0");
        }
        Ok(())
    }

    /// The PEFT adapter configuration this recipe trains.
    pub fn lora_config(&self) -> LoraConfig {
        let mut c = LoraConfig::new(self.rank, self.alpha, &self.targets);
        c.use_rslora = self.rslora;
        c.use_dora = self.dora;
        c.lora_dropout = self.dropout;
        c
    }

    /// Learning rate for `step` (0-based) of a cycle: linear warmup, then cosine decay to
    /// `learning_rate × min_lr_ratio` at the last step.
    pub fn lr_at(&self, step: usize) -> f64 {
        let peak = self.learning_rate;
        if step < self.warmup_steps {
            return peak * (step + 1) as f64 / self.warmup_steps as f64;
        }
        let span = self.steps.saturating_sub(self.warmup_steps).max(1);
        let progress = ((step - self.warmup_steps) as f64 / span as f64).min(1.0);
        let min = peak * self.min_lr_ratio;
        min + (peak - min) * 0.5 * (1.0 + (std::f64::consts::PI * progress).cos())
    }
}
