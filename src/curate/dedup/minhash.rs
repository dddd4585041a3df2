//! Normalisation, shingling and MinHash signatures.
//!
//! Kept free of allocation in the hot path where possible: a signature costs one 64-bit hash per
//! shingle plus `num_perm` multiply-add-min steps per distinct shingle.

use super::ShingleKind;

/// Lowercases, drops punctuation and collapses whitespace, so formatting-only edits
/// ("Hello,  World!" vs "hello world") normalise to the same string and hash as exact duplicates.
///
/// Alphanumeric characters (Unicode-aware) are kept; every other run of characters becomes one
/// space. Punctuation is treated as a separator rather than deleted so "end.Start" does not fuse
/// into one word.
pub fn normalise(text: &str, out: &mut String) {
    out.clear();
    out.reserve(text.len());
    let mut pending_space = false;
    for c in text.chars() {
        if c.is_ascii() {
            if c.is_ascii_alphanumeric() {
                if pending_space && !out.is_empty() {
                    out.push(' ');
                }
                pending_space = false;
                out.push(c.to_ascii_lowercase());
            } else {
                pending_space = true;
            }
        } else if c.is_alphanumeric() {
            if pending_space && !out.is_empty() {
                out.push(' ');
            }
            pending_space = false;
            out.extend(c.to_lowercase());
        } else {
            pending_space = true;
        }
    }
}

/// 64-bit finaliser (murmur3 fmix64): a bijection, so distinct packed n-grams never collide.
#[inline]
pub fn fmix64(mut k: u64) -> u64 {
    k ^= k >> 33;
    k = k.wrapping_mul(0xff51_afd7_ed55_8ccd);
    k ^= k >> 33;
    k = k.wrapping_mul(0xc4ce_b9fe_1a85_ec53);
    k ^= k >> 33;
    k
}

/// Small seeded 64-bit hash over bytes (8 bytes per step). Not cryptographic: it only has to
/// spread real text well; a std-only implementation keeps the dependency list short.
#[inline]
pub fn hash_bytes(bytes: &[u8], seed: u64) -> u64 {
    const M: u64 = 0x9e37_79b9_7f4a_7c15;
    let mut h = seed ^ (bytes.len() as u64).wrapping_mul(M);
    let mut chunks = bytes.chunks_exact(8);
    for c in &mut chunks {
        let mut w = [0u8; 8];
        w.copy_from_slice(c);
        h = (h ^ fmix64(u64::from_le_bytes(w)))
            .rotate_left(27)
            .wrapping_mul(M);
    }
    let rest = chunks.remainder();
    if !rest.is_empty() {
        let mut w = [0u8; 8];
        w[..rest.len()].copy_from_slice(rest);
        h = (h ^ fmix64(u64::from_le_bytes(w) ^ 0xff))
            .rotate_left(27)
            .wrapping_mul(M);
    }
    fmix64(h)
}

/// SplitMix64: deterministic seeding for permutations and the corpus generator.
#[derive(Clone, Debug)]
pub struct SplitMix64(pub u64);

impl SplitMix64 {
    #[inline]
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        fmix64(self.0)
    }
    /// Uniform in `0..n` (n > 0); multiply-shift, bias negligible for small n.
    #[inline]
    pub fn below(&mut self, n: usize) -> usize {
        (((self.next_u64() >> 32) * n as u64) >> 32) as usize
    }
    #[inline]
    pub fn chance(&mut self, p: f64) -> bool {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64 <= p
    }
}

/// Writes the 64-bit hash of every shingle of `norm` into `out`, in text order and with repeats
/// (the sketch takes minima, so repeats are harmless and sorting them away would cost more than
/// it saves; use [`shingle_set`] for exact set operations).
///
/// Character shingles are taken over bytes of the normalised text; n-grams of up to 8 bytes are
/// packed into a u64 and mixed with a bijection, so they cannot collide. Texts shorter than one
/// shingle yield a single shingle of the whole text, so short texts still compare.
pub fn shingles(norm: &str, kind: ShingleKind, size: usize, seed: u64, out: &mut Vec<u64>) {
    out.clear();
    let bytes = norm.as_bytes();
    match kind {
        ShingleKind::Char => {
            if bytes.len() <= size {
                out.push(hash_bytes(bytes, seed));
            } else if size <= 8 {
                let mask = if size == 8 {
                    u64::MAX
                } else {
                    (1u64 << (8 * size)) - 1
                };
                let mut w: u64 = 0;
                for (i, &b) in bytes.iter().enumerate() {
                    w = (w << 8 | b as u64) & mask;
                    if i + 1 >= size {
                        out.push(fmix64(w ^ seed));
                    }
                }
            } else {
                for win in bytes.windows(size) {
                    out.push(hash_bytes(win, seed));
                }
            }
        }
        ShingleKind::Word => {
            // Hash words once, then combine `size` consecutive word hashes.
            let words: Vec<u64> = norm
                .split(' ')
                .filter(|w| !w.is_empty())
                .map(|w| hash_bytes(w.as_bytes(), seed))
                .collect();
            if words.is_empty() {
                out.push(hash_bytes(&[], seed));
            } else if words.len() <= size {
                out.push(combine(&words));
            } else {
                for win in words.windows(size) {
                    out.push(combine(win));
                }
            }
        }
    }
}

/// Sorted, deduplicated shingle hashes of `norm`: the exact set, for [`exact_jaccard`].
pub fn shingle_set(norm: &str, kind: ShingleKind, size: usize, seed: u64) -> Vec<u64> {
    let mut out = Vec::new();
    shingles(norm, kind, size, seed, &mut out);
    out.sort_unstable();
    out.dedup();
    out
}

#[inline]
fn combine(ws: &[u64]) -> u64 {
    let mut h = 0x243f_6a88_85a3_08d3u64;
    for &w in ws {
        h = fmix64(h.rotate_left(17) ^ w);
    }
    h
}

/// One-permutation MinHash with optimal densification (Li, Owen & Zhang 2012; Shrivastava 2017).
///
/// Why not `num_perm` independent permutations: on ~240 character shingles per record that is
/// 30k multiply-min steps per record, which alone caps throughput before any LSH work.
/// Here each shingle hash (already seeded and mixed) is used once: its high bits pick one of `k`
/// bins, its low 32 bits compete for that bin's minimum; empty bins borrow the value of a
/// non-empty bin chosen by a fixed per-bin probe sequence, so two texts that both miss a bin
/// borrow from the same place. That is one step per shingle, and a lower estimate error
/// against exact Jaccard because bins sample without replacement.
#[derive(Clone, Debug)]
pub struct Sketcher {
    k: usize,
    seed: u64,
    filled: Vec<bool>,
}

impl Sketcher {
    pub fn new(k: usize, seed: u64) -> Self {
        Self {
            k,
            seed: fmix64(seed ^ 0x0de5_1f1e_d000_0001),
            filled: vec![false; k],
        }
    }

    /// Fills `sig` (length `k`) from the shingle hashes. An empty input leaves `u32::MAX` everywhere.
    pub fn signature(&mut self, shingles: &[u64], sig: &mut [u32]) {
        let k = self.k.min(sig.len());
        let sig = &mut sig[..k];
        sig.fill(u32::MAX);
        self.filled.fill(false);
        let filled = &mut self.filled[..k];
        for &h in shingles {
            let bin = (((h >> 32) * k as u64) >> 32) as usize;
            let v = h as u32;
            if v < sig[bin] {
                sig[bin] = v;
            }
            filled[bin] = true;
        }
        if shingles.is_empty() {
            return;
        }
        for j in 0..k {
            if filled[j] {
                continue;
            }
            // Probe sequence depends only on (seed, j, attempt): identical across texts.
            let mut attempt = 0u64;
            loop {
                let r = fmix64(self.seed ^ ((j as u64) << 32 | attempt));
                let donor = (((r >> 32) * k as u64) >> 32) as usize;
                if filled[donor] {
                    sig[j] = sig[donor];
                    break;
                }
                attempt += 1;
            }
        }
    }
}

/// Fraction of equal positions: the unbiased MinHash estimate of Jaccard similarity.
#[inline]
pub fn estimate_jaccard(a: &[u32], b: &[u32]) -> f32 {
    if a.is_empty() {
        return 0.0;
    }
    let eq = a.iter().zip(b).filter(|(x, y)| x == y).count();
    eq as f32 / a.len() as f32
}

/// Exact Jaccard of two sorted, deduplicated shingle sets (used by evaluation code).
pub fn exact_jaccard(a: &[u64], b: &[u64]) -> f32 {
    let (mut i, mut j, mut inter) = (0, 0, 0usize);
    while i < a.len() && j < b.len() {
        match a[i].cmp(&b[j]) {
            std::cmp::Ordering::Less => i += 1,
            std::cmp::Ordering::Greater => j += 1,
            std::cmp::Ordering::Equal => {
                inter += 1;
                i += 1;
                j += 1;
            }
        }
    }
    let union = a.len() + b.len() - inter;
    if union == 0 {
        1.0
    } else {
        inter as f32 / union as f32
    }
}
