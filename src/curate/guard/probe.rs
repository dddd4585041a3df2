//! The probe guard (`backend: Probe`): the builtin guard, plus a binary logistic head on a frozen
//! base model's pooled residual stream ([`super::embed`]). A prompt is judged on one combined
//! score, the two models' log-odds of unsafe added with the head's weights, against a threshold
//! chosen on the dev splits: at or above it the prompt is flagged; it is dropped only when the
//! builtin guard also calls it Unsafe and the head alone leans to unsafe, and a prompt the builtin
//! guard calls Unsafe that the combined score or the head clears goes to a person
//! (`Controversial`).
//!
//! Why: the builtin guard knows only the words of its training prompts; the base model has read
//! far more text, so an unsafe prompt in words the guard data lacks can still land near the
//! training prompts it means the same as. Why one sum rather than either model flagging alone: the
//! two err on different prompts, and a sum ranks unsafe above safe more often on every held-out
//! set than either does (docs/guard.md). Why a drop needs the head's own lean: the builtin guard
//! calls raw personal values Unsafe (PII), which a sentence teaching a phone number has, while the
//! head reads intent; where they part the sample goes to a person. Why the probe never drops by
//! itself: the head names no category and its flags were never checked for drop-level precision,
//! so they go to a person (the policy's `controversial` action), never silently out of the
//! training set.
//!
//! The head ships in `data/guard/probe.json`, written by `examples/guard_probe.rs`. It is tied to
//! the base it was trained on (the SHA-256 of its GGUF file): another base is refused.

use std::sync::Arc;

use serde::{Deserialize, Serialize};

use super::data::{COMPOSED_BASE, Split, dataset};
use super::embed::{MAX_TOKENS, embed};
use super::{
    BuiltinGuard, Category, GuardBackend, GuardError, SampleVerdict, Severity, Side, Verdict,
};
use crate::model::Base;

/// The shipped head, as `examples/guard_probe.rs` writes it.
pub const SHIPPED: &str = include_str!(concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/data/guard/probe.json"
));

/// Expansions of each prompt template kept for the probe's training (every composed prompt is
/// kept): expansions of one template differ in a filler word, and each costs a forward.
pub const PER_TEMPLATE: usize = 3;

/// A binary unsafe-vs-safe logistic head over `[mean, last]` pooled residuals after block `layer`,
/// with the training standardiser folded into `weights` and `bias`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ProbeHead {
    /// The base it reads, for people.
    pub base: String,
    /// SHA-256 of the base's GGUF file ([`Base::sha256`]); any other base is refused.
    pub base_sha256: String,
    /// The residual after this block (1-based) is read.
    pub layer: usize,
    /// Tokens read per text; must equal [`MAX_TOKENS`], the embedding the head was trained on.
    pub max_tokens: usize,
    /// Weight of the builtin guard's top category log-odds in the combined score; the head's
    /// margin enters with `1 − builtin_weight`.
    pub builtin_weight: f32,
    /// Combined score at or above which a prompt is flagged, chosen on the dev split only.
    pub threshold: f32,
    pub bias: f32,
    pub weights: Vec<f32>,
}

impl ProbeHead {
    /// The head shipped in `data/guard/probe.json`.
    pub fn shipped() -> Result<Self, GuardError> {
        serde_json::from_str(SHIPPED).map_err(|source| GuardError::ProbeFile {
            file: "data/guard/probe.json",
            source,
        })
    }

    /// Fits `weights` and `bias` (threshold 0) to minimise the mean logistic loss plus
    /// `‖w‖² / (2·c·n)` on standardised features: scikit-learn's `LogisticRegression(C=c)`
    /// objective, by full-batch Adam (the problem is convex; `epochs` steps).
    pub fn fit(xs: &[Vec<f32>], ys: &[bool], c: f32, epochs: usize) -> (Vec<f32>, f32) {
        let d = xs.first().map_or(0, Vec::len);
        let n = xs.len().max(1) as f32;
        let mut mean = vec![0f32; d];
        for x in xs {
            for (m, v) in mean.iter_mut().zip(x) {
                *m += v / n;
            }
        }
        let mut var = vec![0f32; d];
        for x in xs {
            for ((s, v), m) in var.iter_mut().zip(x).zip(&mean) {
                *s += (v - m).powi(2) / n;
            }
        }
        let scale: Vec<f32> = var.iter().map(|v| 1.0 / (v.sqrt() + 1e-3)).collect();
        let us: Vec<Vec<f32>> = xs
            .iter()
            .map(|x| {
                x.iter()
                    .zip(&mean)
                    .zip(&scale)
                    .map(|((v, m), s)| (v - m) * s)
                    .collect()
            })
            .collect();
        let l2 = 1.0 / (c * n);
        let (mut w, mut b) = (vec![0f32; d], 0f32);
        let (mut mw, mut vw, mut mb, mut vb) = (vec![0f32; d], vec![0f32; d], 0f32, 0f32);
        let (b1, b2) = (0.9f32, 0.999f32);
        let mut gw = vec![0f32; d];
        for t in 1..=epochs {
            gw.iter_mut().for_each(|g| *g = 0.0);
            let mut gb = 0f32;
            for (u, &y) in us.iter().zip(ys) {
                let z = b + dot(&w, u);
                let g = (sigmoid(z) - f32::from(u8::from(y))) / n;
                gb += g;
                for (gi, v) in gw.iter_mut().zip(u) {
                    *gi += g * v;
                }
            }
            // A step size that shrinks late lets Adam settle at the optimum instead of hovering.
            let lr = 0.01 / (1.0 + 4.0 * t as f32 / epochs as f32);
            let (c1, c2) = (1.0 - b1.powi(t as i32), 1.0 - b2.powi(t as i32));
            let adam = |p: &mut f32, m: &mut f32, v: &mut f32, g: f32| {
                *m = b1 * *m + (1.0 - b1) * g;
                *v = b2 * *v + (1.0 - b2) * g * g;
                *p -= lr * (*m / c1) / ((*v / c2).sqrt() + 1e-8);
            };
            for i in 0..d {
                let g = gw[i] + l2 * w[i];
                adam(&mut w[i], &mut mw[i], &mut vw[i], g);
            }
            adam(&mut b, &mut mb, &mut vb, gb);
        }
        // Folded: w·((x − mean)·scale) + b = (w·scale)·x + (b − Σ w·scale·mean).
        let folded: Vec<f32> = w.iter().zip(&scale).map(|(w, s)| w * s).collect();
        let bias = b - dot(&folded, &mean);
        (folded, bias)
    }

    /// The head's margin (log-odds of unsafe) for one embedding.
    pub fn margin(&self, x: &[f32]) -> f32 {
        self.bias + dot(&self.weights, x)
    }

    /// The score a prompt is judged on, from the builtin guard's top category log-odds
    /// ([`BuiltinGuard::top_logit`]) and the head's margin.
    pub fn combined(&self, builtin_logit: f32, margin: f32) -> f32 {
        self.builtin_weight * builtin_logit + (1.0 - self.builtin_weight) * margin
    }
}

fn sigmoid(z: f32) -> f32 {
    1.0 / (1.0 + (-z).exp())
}

fn dot(a: &[f32], b: &[f32]) -> f32 {
    a.iter().zip(b).map(|(a, b)| a * b).sum()
}

/// The probe's training prompts and whether each is unsafe: the prompt side of the builtin
/// guard's training split, every composed prompt and [`PER_TEMPLATE`] expansions per template.
pub fn training_set() -> Result<(Vec<String>, Vec<bool>), GuardError> {
    let mut per = std::collections::HashMap::new();
    let mut texts = Vec::new();
    let mut ys = Vec::new();
    for s in dataset(Split::Train)? {
        if s.side != Side::Prompt {
            continue;
        }
        let n = per.entry(s.template).or_insert(0usize);
        *n += 1;
        if s.template < COMPOSED_BASE && *n > PER_TEMPLATE {
            continue;
        }
        ys.push(!s.labels.is_empty());
        texts.push(s.text);
    }
    Ok((texts, ys))
}

/// The `Probe` backend: prompts judged on the combined score (see the module doc), responses by
/// the builtin guard. A prompt it flags without dropping names the builtin guard's most likely
/// category.
pub struct ProbeGuard {
    builtin: BuiltinGuard,
    base: Arc<Base>,
    head: ProbeHead,
}

impl std::fmt::Debug for ProbeGuard {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ProbeGuard")
            .field("base", &self.base.path)
            .field("layer", &self.head.layer)
            .field("threshold", &self.head.threshold)
            .finish_non_exhaustive()
    }
}

impl ProbeGuard {
    /// Refuses a base other than the head's (by file hash), and a head whose shape or embedding
    /// does not match the base and this build.
    pub fn new(
        builtin: BuiltinGuard,
        base: Arc<Base>,
        head: ProbeHead,
    ) -> Result<Self, GuardError> {
        if base.sha256 != head.base_sha256 {
            return Err(GuardError::WrongBase {
                path: base.path.display().to_string(),
                found: base.sha256.clone(),
                trained: head.base.clone(),
                expected: head.base_sha256.clone(),
            });
        }
        let cfg = base.model.config();
        let bad = |what: String| Err(GuardError::InvalidProbe(what));
        if head.layer == 0 || head.layer > cfg.num_layers {
            return bad(format!(
                "layer {} is not a block of the base (1..={})",
                head.layer, cfg.num_layers
            ));
        }
        if head.weights.len() != 2 * cfg.hidden_size {
            return bad(format!(
                "{} weights, the base's pooled residual has {}",
                head.weights.len(),
                2 * cfg.hidden_size
            ));
        }
        if !(0.0..=1.0).contains(&head.builtin_weight) || !head.threshold.is_finite() {
            return bad(format!(
                "builtin_weight {} must lie in 0..=1 and threshold {} be finite",
                head.builtin_weight, head.threshold
            ));
        }
        if head.max_tokens != MAX_TOKENS {
            return bad(format!(
                "trained on {} tokens per text, this build embeds {MAX_TOKENS}",
                head.max_tokens
            ));
        }
        Ok(Self {
            builtin,
            base,
            head,
        })
    }

    /// The probe's margins for `texts` (one forward per batch of similar lengths).
    pub fn margins(&self, texts: &[&str]) -> Result<Vec<f32>, GuardError> {
        let e = embed(&self.base.model, &self.base.tok, texts, &[self.head.layer])?;
        Ok(e.iter().map(|x| self.head.margin(x)).collect())
    }

    /// The prompt side's verdict: Unsafe when the combined score reaches the threshold, the
    /// builtin guard calls the prompt Unsafe and the head on its own leans to unsafe (margin ≥ 0);
    /// Safe when neither the builtin guard's Unsafe nor the combined score flags it; else
    /// Controversial.
    pub fn prompt_verdict(&self, prompt: &str) -> Result<Verdict, GuardError> {
        let v = self.builtin.verdict(prompt, Side::Prompt);
        let m = self.margins(&[prompt])?[0];
        let flagged = self
            .head
            .combined(self.builtin.top_logit(prompt, Side::Prompt), m)
            >= self.head.threshold;
        match (v.severity == Severity::Unsafe, flagged) {
            (true, true) if m >= 0.0 => return Ok(v),
            (false, false) => return Ok(Verdict::safe()),
            _ => {}
        }
        let s = self.builtin.scores(prompt, Side::Prompt);
        let top = Category::ALL
            .into_iter()
            .max_by(|a, b| s[a.index()].total_cmp(&s[b.index()]))
            .unwrap_or(Category::Violent);
        Ok(Verdict {
            severity: Severity::Controversial,
            categories: vec![top],
            refusal: None,
        })
    }

    pub fn head(&self) -> &ProbeHead {
        &self.head
    }
}

impl GuardBackend for ProbeGuard {
    /// The head was trained on prompts only, so responses get the builtin guard's verdict.
    fn classify(&self, prompt: &str, response: &str) -> Result<SampleVerdict, GuardError> {
        Ok(SampleVerdict {
            prompt: self.prompt_verdict(prompt)?,
            response: self.builtin.verdict(response, Side::Response),
        })
    }

    fn name(&self) -> &'static str {
        "probe"
    }
}
