//! Deduplication of candidate training samples: exact duplicates, near duplicates (MinHash + LSH)
//! and a diversity floor per cluster of related samples.
//!
//! Why: a learner fed the same thing many times overfits to it, and self-generated samples tend
//! to repeat themselves; dropping repeats before training is cheap insurance.
//!
//! Decision order for each sample (see [`Deduper::check_and_insert`]):
//! 1. exact: a 64-bit hash of the normalised text ([`minhash::normalise`]: lowercase, punctuation
//!    as separator, whitespace collapsed) was already admitted → [`DedupDecision::ExactDuplicate`];
//! 2. near: LSH finds earlier admitted samples sharing a band; the best MinHash Jaccard estimate
//!    ≥ `threshold` → [`DedupDecision::NearDuplicate`];
//! 3. diversity floor: the sample joins the cluster of its most similar earlier sample when that
//!    estimate ≥ `cluster_threshold` (else it starts its own cluster); a cluster admits at most
//!    `max_per_cluster` units per `window` checks, where a grounded sample costs 1 and a
//!    self-generated one `self_generated_weight` → [`DedupDecision::DiversityFloor`];
//! 4. otherwise [`DedupDecision::Admit`], and the sample is remembered.
//!
//! Shingles: character 5-grams over the normalised text. One substituted word in 40 changes
//! ~8 of ~240 character 5-grams (Jaccard ≈ 0.94) but 5 of 36 word 5-grams (Jaccard 0.80, and
//! 0.60 after two edits). Character 5-grams keep lightly edited records (such as those of
//! [`near_dup_corpus`]) above 0.8 while unrelated records stay far below it; the cost is
//! ~6× more shingles than words, which the one-permutation sketch ([`minhash::Sketcher`])
//! absorbs.
//!
//! Sequence numbers: every call to `check_and_insert` consumes one sequence number (0 for a fresh
//! store, continuing after [`Deduper::load`]); `of` and `cluster` name sequence numbers of earlier
//! admitted samples. [`Deduper::next_seq`] tells the number the next call will get.
//!
//! Bounded state: at most `capacity` admitted signatures are kept; beyond that the oldest by
//! sequence number is evicted first (FIFO), together with its exact hash, LSH bucket entries and
//! cluster-window entries. An evicted sample can be admitted again — the capacity is the memory of
//! the store, so size it to the horizon over which repeats matter. Default 250,000: about 1.1 KB
//! per sample at 128 bins and 20 bands, ~0.3 GB (estimated from the data layout, not measured).

mod corpus;
pub mod minhash;
mod persist;

pub use corpus::{CorpusKind, CorpusRecord, near_dup_corpus};

use std::collections::{HashMap, VecDeque};
use std::hash::{BuildHasherDefault, Hasher};
use std::path::PathBuf;

use serde::{Deserialize, Serialize};

use minhash::{Sketcher, estimate_jaccard, fmix64, hash_bytes, normalise, shingles};

/// What to cut a normalised text into before MinHash.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum ShingleKind {
    /// Byte n-grams of the normalised text (robust to single-word edits on short text).
    Char,
    /// Word n-grams of the normalised text (cheaper, but edit-sensitive on short text).
    Word,
}

/// Where a sample came from (the engine's one definition); self-generated samples weigh more toward the
/// diversity floor because a model's own outputs are the likeliest to repeat a theme.
pub use crate::message::Origin;

/// Parameters of the deduper (graph parameters, so unknown fields are rejected).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct DedupConfig {
    /// Shingle kind (signature-defining: must match a loaded store).
    pub shingle: ShingleKind,
    /// Shingle size in bytes (Char) or words (Word) (signature-defining).
    pub shingle_size: usize,
    /// MinHash permutations = signature length (signature-defining).
    pub num_perm: usize,
    /// LSH bands; `bands * rows <= num_perm` (signature-defining).
    pub bands: usize,
    /// Rows per LSH band (signature-defining).
    pub rows: usize,
    /// Estimated Jaccard at or above which a sample is a near duplicate.
    pub threshold: f32,
    /// Estimated Jaccard at or above which a sample joins an earlier sample's cluster.
    pub cluster_threshold: f32,
    /// Units a cluster may admit per window (the diversity floor `k`).
    pub max_per_cluster: u32,
    /// Window length in sequence numbers (checks) for the diversity floor.
    pub window: u64,
    /// Units a self-generated sample costs toward the floor (a grounded one costs 1).
    pub self_generated_weight: u32,
    /// Maximum admitted signatures kept; the oldest are evicted first.
    pub capacity: usize,
    /// Seed of hashes and permutations (signature-defining).
    pub seed: u64,
}

impl Default for DedupConfig {
    fn default() -> Self {
        Self {
            shingle: ShingleKind::Char,
            shingle_size: 5,
            num_perm: 128,
            bands: 20,
            rows: 6,
            threshold: 0.8,
            cluster_threshold: 0.7,
            max_per_cluster: 8,
            window: 10_000,
            self_generated_weight: 2,
            capacity: 250_000,
            seed: 0x6865_6172_7468,
        }
    }
}

impl DedupConfig {
    /// Rejects configurations that cannot work, so mistakes surface at graph load time.
    pub fn validate(&self) -> Result<(), DedupError> {
        let bad = |m: String| Err(DedupError::InvalidConfig(m));
        if self.shingle_size == 0 {
            return bad("shingle_size must be at least 1".into());
        }
        if self.num_perm == 0 || self.num_perm > 4096 {
            return bad(format!("num_perm must be 1..=4096, got {}", self.num_perm));
        }
        if self.bands == 0 || self.rows == 0 {
            return bad("bands and rows must be at least 1".into());
        }
        if self.bands.saturating_mul(self.rows) > self.num_perm {
            return bad(format!(
                "bands * rows ({} * {}) exceeds num_perm ({})",
                self.bands, self.rows, self.num_perm
            ));
        }
        if !(self.threshold > 0.0 && self.threshold <= 1.0) {
            return bad(format!(
                "threshold must be in (0, 1], got {}",
                self.threshold
            ));
        }
        if !(self.cluster_threshold > 0.0 && self.cluster_threshold <= self.threshold) {
            return bad(format!(
                "cluster_threshold must be in (0, threshold], got {}",
                self.cluster_threshold
            ));
        }
        if self.max_per_cluster == 0 || self.window == 0 || self.self_generated_weight == 0 {
            return bad(
                "max_per_cluster, window and self_generated_weight must be at least 1".into(),
            );
        }
        if self.capacity == 0 {
            return bad("capacity must be at least 1".into());
        }
        Ok(())
    }

    /// Fields that shape signatures and buckets: a saved store is only meaningful under the same
    /// values. The others (thresholds, floor, capacity) may change across restarts.
    fn signature_fields(&self) -> [(&'static str, String); 6] {
        [
            ("shingle", format!("{:?}", self.shingle)),
            ("shingle_size", self.shingle_size.to_string()),
            ("num_perm", self.num_perm.to_string()),
            ("bands", self.bands.to_string()),
            ("rows", self.rows.to_string()),
            ("seed", self.seed.to_string()),
        ]
    }
}

/// Outcome of one check; anything but `Admit` means the sample was not remembered.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum DedupDecision {
    Admit,
    ExactDuplicate { of: u64 },
    NearDuplicate { of: u64, jaccard_estimate: f32 },
    DiversityFloor { cluster: u64 },
}

impl DedupDecision {
    /// True for exact and near duplicates (not for the diversity floor).
    pub fn is_duplicate(&self) -> bool {
        matches!(
            self,
            DedupDecision::ExactDuplicate { .. } | DedupDecision::NearDuplicate { .. }
        )
    }
}

#[derive(Debug, thiserror::Error)]
pub enum DedupError {
    #[error("invalid dedup config: {0}")]
    InvalidConfig(String),
    #[error("dedup state {path}: {source}")]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("dedup state {path} is corrupt: {reason}")]
    Corrupt { path: PathBuf, reason: String },
    #[error("dedup state {path} was built with {field} = {saved}, but the config says {given}")]
    ConfigMismatch {
        path: PathBuf,
        field: &'static str,
        saved: String,
        given: String,
    },
}

/// Multiply hasher for keys that are already hashes or sequence numbers (SipHash would dominate
/// the per-sample cost).
#[derive(Default, Clone, Copy)]
pub(crate) struct MulHasher(u64);

impl Hasher for MulHasher {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        self.0 = hash_bytes(bytes, self.0);
    }
    fn write_u64(&mut self, v: u64) {
        self.0 = (self.0 ^ v)
            .wrapping_mul(0x9e37_79b9_7f4a_7c15)
            .rotate_left(26);
    }
}

type FastMap<K, V> = HashMap<K, V, BuildHasherDefault<MulHasher>>;

#[derive(Clone, Debug)]
struct Entry {
    seq: u64,
    /// Who was admitted (a hash of the sample id; 0 when unknown), so a replay of that same sample
    /// after a crash is recognised rather than dropped as a duplicate of itself.
    key: u64,
    exact: u64,
    cluster: u64,
    sig: Box<[u32]>,
}

const EXACT_SALT: u64 = 0xe8ac_7000_0000_0001;
const NONE: u64 = u64::MAX;

/// Streaming deduper with bounded, persistable state. See the module docs for the rules.
pub struct Deduper {
    config: DedupConfig,
    sketcher: Sketcher,
    next_seq: u64,
    /// Admitted entries in admission order; `first_ord` is the ordinal of `entries[0]`.
    entries: VecDeque<Entry>,
    first_ord: u64,
    /// Exact hash → ordinal.
    exact: FastMap<u64, u64>,
    /// LSH: (band, band values) hash → newest ordinal in that bucket.
    heads: FastMap<u64, u64>,
    /// Per entry and band, the next older ordinal in the same bucket (`NONE` at the end); a
    /// chain ends early where it reaches evicted ordinals, so eviction never has to walk it.
    links: VecDeque<u64>,
    /// Cluster id → (seq, weight) of admissions still inside the window.
    clusters: FastMap<u64, VecDeque<(u64, u32)>>,
    norm: String,
    shingle_buf: Vec<u64>,
    sig_buf: Vec<u32>,
    cand_buf: Vec<u64>,
}

impl Deduper {
    pub fn new(config: DedupConfig) -> Result<Self, DedupError> {
        config.validate()?;
        Ok(Self {
            sketcher: Sketcher::new(config.num_perm, config.seed),
            next_seq: 0,
            entries: VecDeque::new(),
            first_ord: 0,
            exact: FastMap::default(),
            heads: FastMap::default(),
            links: VecDeque::new(),
            clusters: FastMap::default(),
            norm: String::new(),
            shingle_buf: Vec::new(),
            sig_buf: vec![0; config.num_perm],
            cand_buf: Vec::new(),
            config,
        })
    }

    pub fn config(&self) -> &DedupConfig {
        &self.config
    }

    /// Sequence number the next `check_and_insert` call will get.
    pub fn next_seq(&self) -> u64 {
        self.next_seq
    }

    /// Admitted signatures currently held (≤ `capacity`).
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    fn entry(&self, ord: u64) -> Option<&Entry> {
        let i = ord.checked_sub(self.first_ord)?;
        self.entries.get(usize::try_from(i).ok()?)
    }

    /// Checks `text` against everything admitted so far and remembers it if admitted.
    pub fn check_and_insert(&mut self, text: &str, origin: Origin) -> DedupDecision {
        self.check_and_insert_keyed(text, origin, 0)
    }

    /// [`Deduper::check_and_insert`] for a sample known by `key` (non-zero, e.g. a hash of its id): the
    /// same key with the same text again is a replay of an admitted sample (a restart re-curating
    /// what the store had not committed) and is admitted again without being counted twice.
    pub fn check_and_insert_keyed(
        &mut self,
        text: &str,
        origin: Origin,
        key: u64,
    ) -> DedupDecision {
        let seq = self.next_seq;
        self.next_seq += 1;

        normalise(text, &mut self.norm);
        let exact = hash_bytes(self.norm.as_bytes(), self.config.seed ^ EXACT_SALT);
        if let Some(e) = self.exact.get(&exact).and_then(|&o| self.entry(o)) {
            if key != 0 && e.key == key {
                return DedupDecision::Admit;
            }
            return DedupDecision::ExactDuplicate { of: e.seq };
        }

        let cfg = &self.config;
        shingles(
            &self.norm,
            cfg.shingle,
            cfg.shingle_size,
            cfg.seed,
            &mut self.shingle_buf,
        );
        self.sketcher
            .signature(&self.shingle_buf, &mut self.sig_buf);

        // Candidates: every earlier sample sharing at least one band.
        self.cand_buf.clear();
        for band in 0..cfg.bands {
            let mut ord = match self.heads.get(&band_key(&self.sig_buf, band, cfg.rows)) {
                Some(&o) => o,
                None => continue,
            };
            while ord != NONE && ord >= self.first_ord {
                self.cand_buf.push(ord);
                let at = (ord - self.first_ord) as usize * cfg.bands + band;
                ord = self.links.get(at).copied().unwrap_or(NONE);
            }
        }
        self.cand_buf.sort_unstable();
        self.cand_buf.dedup();
        let mut best: Option<(&Entry, f32)> = None;
        for &ord in &self.cand_buf {
            if let Some(e) = self.entry(ord) {
                let j = estimate_jaccard(&e.sig, &self.sig_buf);
                if best.is_none_or(|(_, bj)| j > bj) {
                    best = Some((e, j));
                }
            }
        }
        if let Some((e, j)) = best
            && j >= cfg.threshold
        {
            return DedupDecision::NearDuplicate {
                of: e.seq,
                jaccard_estimate: j,
            };
        }

        let cluster = match best {
            Some((e, j)) if j >= cfg.cluster_threshold => e.cluster,
            _ => seq,
        };
        let weight = match origin {
            Origin::Grounded => 1,
            Origin::SelfGenerated => cfg.self_generated_weight,
        };
        let (window, k) = (cfg.window, cfg.max_per_cluster as u64);
        let log = self.clusters.entry(cluster).or_default();
        while log
            .front()
            .is_some_and(|&(s, _)| s.saturating_add(window) <= seq)
        {
            log.pop_front();
        }
        // A cluster with nothing in the window always admits, so a heavy self-generated sample
        // can still start a cluster when k is smaller than its weight.
        let used: u64 = log.iter().map(|&(_, w)| w as u64).sum();
        if used > 0 && used + weight as u64 > k {
            return DedupDecision::DiversityFloor { cluster };
        }
        log.push_back((seq, weight));

        let sig: Box<[u32]> = self.sig_buf.as_slice().into();
        self.insert_entry(Entry {
            seq,
            key,
            exact,
            cluster,
            sig,
        });
        DedupDecision::Admit
    }

    fn insert_entry(&mut self, e: Entry) {
        self.remember(e);
        while self.entries.len() > self.config.capacity {
            self.evict_oldest();
        }
    }

    /// Indexes an admitted entry (no capacity check; `load` applies capacity once at the end).
    fn remember(&mut self, e: Entry) {
        let ord = self.first_ord + self.entries.len() as u64;
        self.exact.insert(e.exact, ord);
        for band in 0..self.config.bands {
            let key = band_key(&e.sig, band, self.config.rows);
            let prev = self.heads.insert(key, ord).unwrap_or(NONE);
            self.links.push_back(prev);
        }
        self.entries.push_back(e);
    }

    /// FIFO eviction of the oldest admitted sample and everything that refers to it.
    fn evict_oldest(&mut self) {
        let Some(e) = self.entries.pop_front() else {
            return;
        };
        let ord = self.first_ord;
        self.first_ord += 1;
        if self.exact.get(&e.exact) == Some(&ord) {
            self.exact.remove(&e.exact);
        }
        for band in 0..self.config.bands {
            let key = band_key(&e.sig, band, self.config.rows);
            // If the evicted entry is still a bucket's newest, the whole bucket is evicted.
            if self.heads.get(&key) == Some(&ord) {
                self.heads.remove(&key);
            }
            self.links.pop_front();
        }
        if let Some(log) = self.clusters.get_mut(&e.cluster) {
            while log.front().is_some_and(|&(s, _)| s <= e.seq) {
                log.pop_front();
            }
            if log.is_empty() {
                self.clusters.remove(&e.cluster);
            }
        }
    }
}

#[inline]
fn band_key(sig: &[u32], band: usize, rows: usize) -> u64 {
    let mut h = band as u64;
    for &v in &sig[band * rows..(band + 1) * rows] {
        h = fmix64(h.rotate_left(32) ^ v as u64);
    }
    h
}
