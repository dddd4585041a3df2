//! Per-coordinate aggregation of N worker updates: mean, median, trimmed mean, optionally weighted by data share.
//!
//! The hot path works on blocks of `LANES` coordinates: each worker's block is loaded (bf16 widened in place) into a
//! small `[worker][lane]` buffer that stays in L1, sorted across workers by a sorting network applied lane-wise (so
//! the compare-exchanges vectorise), then the kept rows are summed. Work is split across threads with
//! `std::thread::scope`. Kernels assume finite inputs: decoders refuse NaN/Inf at ingress.

use super::wire::{self, Delta, Rounding, Tensor, WireError, bf16_to_f32, f32_to_bf16};

/// Aggregation rule.
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case", tag = "kind")]
pub enum Method {
    Mean,
    /// Middle value; mean of the two middle values for even N (as gym).
    Median,
    /// Drop `floor(beta·N)` values at each end (at most down to the median), average the rest.
    Trimmed {
        beta: f32,
    },
    /// gym's `byzantine_robust`: drop the single lowest and highest when N ≥ 4, else plain mean.
    GymRobust,
}

impl Method {
    /// Parses gym's aggregation names (`byzantine_robust`, `median`, anything else = mean).
    pub fn from_gym_name(name: &str) -> Method {
        match name {
            "byzantine_robust" => Method::GymRobust,
            "median" => Method::Median,
            _ => Method::Mean,
        }
    }

    /// How many values to drop at each end for N inputs.
    pub fn trim(&self, n: usize) -> usize {
        let max = n.saturating_sub(1) / 2;
        match *self {
            Method::Mean => 0,
            Method::Median => max,
            Method::Trimmed { beta } => {
                let b = if beta.is_finite() {
                    beta.clamp(0.0, 0.5)
                } else {
                    0.0
                };
                ((b as f64 * n as f64).floor() as usize).min(max)
            }
            Method::GymRobust => usize::from(n >= 4),
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum AggregateError {
    #[error("no inputs")]
    Empty,
    #[error("inputs disagree: {0}")]
    Mismatch(String),
    #[error("weights: {0}")]
    Weights(String),
    #[error(transparent)]
    Wire(#[from] WireError),
}

/// Coordinates per block: 8 workers × 128 lanes × 4 bytes = 4 KiB of scratch, well inside L1.
const LANES: usize = 128;

/// A worker's flat input.
pub trait Source: Sync {
    fn len(&self) -> usize;
    fn is_empty(&self) -> bool {
        self.len() == 0
    }
    /// Writes `out.len()` values starting at `start` as f32.
    fn load(&self, start: usize, out: &mut [f32]);
}

impl Source for &[f32] {
    fn len(&self) -> usize {
        <[f32]>::len(self)
    }
    #[inline(always)]
    fn load(&self, start: usize, out: &mut [f32]) {
        out.copy_from_slice(&self[start..start + out.len()]);
    }
}

/// bf16 little-endian bytes read in place (gym blob data, possibly unaligned).
#[derive(Clone, Copy)]
pub struct Bf16Bytes<'a>(pub &'a [u8]);

impl Source for Bf16Bytes<'_> {
    fn len(&self) -> usize {
        self.0.len() / 2
    }
    #[inline(always)]
    fn load(&self, start: usize, out: &mut [f32]) {
        let bytes = &self.0[2 * start..2 * (start + out.len())];
        for (o, c) in out.iter_mut().zip(bytes.chunks_exact(2)) {
            *o = bf16_to_f32(u16::from_le_bytes([c[0], c[1]]));
        }
    }
}

/// Where results go.
pub enum Out<'a> {
    F32(&'a mut [f32]),
    Bf16(&'a mut [u8], Rounding),
}

impl Out<'_> {
    fn len(&self) -> usize {
        match self {
            Out::F32(s) => s.len(),
            Out::Bf16(b, _) => b.len() / 2,
        }
    }
}

/// Optimal 19-comparator network for 8 inputs (Batcher odd-even merge).
const NET8: [(usize, usize); 19] = [
    (0, 1),
    (2, 3),
    (4, 5),
    (6, 7),
    (0, 2),
    (1, 3),
    (4, 6),
    (5, 7),
    (1, 2),
    (5, 6),
    (0, 4),
    (3, 7),
    (1, 5),
    (2, 6),
    (1, 4),
    (3, 6),
    (2, 4),
    (3, 5),
    (3, 4),
];

#[inline(always)]
fn cmpx(buf: &mut [f32], a: usize, b: usize, m: usize) {
    let (lo, hi) = buf.split_at_mut(b * LANES);
    let ra = &mut lo[a * LANES..a * LANES + m];
    let rb = &mut hi[..m];
    for (x, y) in ra.iter_mut().zip(rb.iter_mut()) {
        let (p, q) = (*x, *y);
        // `if` form rather than f32::min/max: maps to minps/maxps (inputs are finite).
        *x = if p < q { p } else { q };
        *y = if p < q { q } else { p };
    }
}

/// Sorts each lane of `buf` (`n` rows of `LANES`) across rows: the 8-network, else odd-even transposition.
#[inline(always)]
fn sort_lanes(buf: &mut [f32], n: usize, m: usize) {
    if n == 8 {
        for &(a, b) in NET8.iter() {
            cmpx(buf, a, b, m);
        }
    } else {
        for round in 0..n {
            let mut i = round % 2;
            while i + 1 < n {
                cmpx(buf, i, i + 1, m);
                i += 2;
            }
        }
    }
}

#[inline(always)]
fn reduce_block<S: Source>(
    srcs: &[S],
    weights: Option<&[f32]>,
    k: usize,
    start: usize,
    buf: &mut [f32],
    acc: &mut [f32],
) {
    let n = srcs.len();
    let m = acc.len();
    for (w, s) in srcs.iter().enumerate() {
        s.load(start, &mut buf[w * LANES..w * LANES + m]);
    }
    acc.fill(0.0);
    match weights {
        Some(wts) => {
            // Weighted mean only (robust weighted rules take the scalar path).
            for (w, &wt) in wts.iter().enumerate() {
                for (a, &v) in acc.iter_mut().zip(&buf[w * LANES..w * LANES + m]) {
                    *a += wt * v;
                }
            }
        }
        None => {
            if k > 0 {
                sort_lanes(buf, n, m);
            }
            for w in k..n - k {
                for (a, &v) in acc.iter_mut().zip(&buf[w * LANES..w * LANES + m]) {
                    *a += v;
                }
            }
            let d = (n - 2 * k) as f32;
            for a in acc.iter_mut() {
                *a /= d;
            }
        }
    }
}

#[inline(always)]
fn run_range<S: Source>(
    srcs: &[S],
    weights: Option<&[f32]>,
    k: usize,
    start: usize,
    mut out: Out<'_>,
) {
    let n = srcs.len();
    let mut buf = vec![0f32; n * LANES];
    let mut acc = [0f32; LANES];
    let len = out.len();
    let mut i = 0;
    while i < len {
        let m = LANES.min(len - i);
        reduce_block(srcs, weights, k, start + i, &mut buf, &mut acc[..m]);
        match &mut out {
            Out::F32(o) => o[i..i + m].copy_from_slice(&acc[..m]),
            Out::Bf16(o, r) => {
                for (c, &v) in o[2 * i..2 * (i + m)].chunks_exact_mut(2).zip(&acc[..m]) {
                    c.copy_from_slice(&f32_to_bf16(v, *r).to_le_bytes());
                }
            }
        }
        i += m;
    }
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn run_range_avx2<S: Source>(
    srcs: &[S],
    weights: Option<&[f32]>,
    k: usize,
    start: usize,
    out: Out<'_>,
) {
    run_range(srcs, weights, k, start, out)
}

/// Runtime dispatch: the same code compiled for AVX2 when the CPU has it (the crate builds for baseline x86-64).
fn run_range_best<S: Source>(
    srcs: &[S],
    weights: Option<&[f32]>,
    k: usize,
    start: usize,
    out: Out<'_>,
) {
    #[cfg(target_arch = "x86_64")]
    {
        if std::arch::is_x86_feature_detected!("avx2") && std::arch::is_x86_feature_detected!("fma")
        {
            // SAFETY: the features were just detected on this CPU.
            unsafe { run_range_avx2(srcs, weights, k, start, out) };
            return;
        }
    }
    run_range(srcs, weights, k, start, out)
}

/// Scalar path for weighted robust rules: sort (value, weight) pairs per coordinate.
fn run_weighted_robust<S: Source>(
    srcs: &[S],
    wts: &[f32],
    method: Method,
    start: usize,
    mut out: Out<'_>,
) {
    let n = srcs.len();
    let k = method.trim(n);
    let mut col = vec![0f32; n * LANES];
    let mut pairs: Vec<(f32, f32)> = Vec::with_capacity(n);
    let len = out.len();
    let mut i = 0;
    while i < len {
        let m = LANES.min(len - i);
        for (w, s) in srcs.iter().enumerate() {
            s.load(start + i, &mut col[w * LANES..w * LANES + m]);
        }
        for j in 0..m {
            pairs.clear();
            pairs.extend((0..n).map(|w| (col[w * LANES + j], wts[w])));
            pairs.sort_unstable_by(|a, b| a.0.total_cmp(&b.0));
            let v = if matches!(method, Method::Median) {
                // Weighted median: first value where the cumulative weight reaches half.
                let total: f32 = pairs.iter().map(|p| p.1).sum();
                let mut c = 0.0;
                let mut med = pairs[n - 1].0;
                for p in &pairs {
                    c += p.1;
                    if c >= 0.5 * total {
                        med = p.0;
                        break;
                    }
                }
                med
            } else {
                let kept = &pairs[k..n - k];
                let ws: f32 = kept.iter().map(|p| p.1).sum();
                if ws > 0.0 {
                    kept.iter().map(|p| p.0 * p.1).sum::<f32>() / ws
                } else {
                    kept.iter().map(|p| p.0).sum::<f32>() / kept.len() as f32
                }
            };
            match &mut out {
                Out::F32(o) => o[i + j] = v,
                Out::Bf16(o, r) => o[2 * (i + j)..2 * (i + j) + 2]
                    .copy_from_slice(&f32_to_bf16(v, *r).to_le_bytes()),
            }
        }
        i += m;
    }
}

/// Normalises data-share weights to sum 1; refuses negative, non-finite or all-zero weights.
pub fn normalize_weights(w: &[f32]) -> Result<Vec<f32>, AggregateError> {
    if w.iter().any(|x| !x.is_finite() || *x < 0.0) {
        return Err(AggregateError::Weights("negative or non-finite".into()));
    }
    let s: f64 = w.iter().map(|&x| x as f64).sum();
    if s <= 0.0 {
        return Err(AggregateError::Weights("sum to zero".into()));
    }
    Ok(w.iter().map(|&x| (x as f64 / s) as f32).collect())
}

/// gym's capacity score: `sqrt(memory_gb) * sqrt(tflops)`; data share is score / total.
pub fn capacity_score(memory_gb: f64, tflops: f64) -> f64 {
    memory_gb.max(0.0).sqrt() * tflops.max(0.0).sqrt()
}

/// Aggregates flat inputs into `out`, over `threads` threads. `weights` (one per input) makes it weighted.
pub fn aggregate_flat<S: Source>(
    srcs: &[S],
    weights: Option<&[f32]>,
    method: Method,
    out: Out<'_>,
    threads: usize,
) -> Result<(), AggregateError> {
    let n = srcs.len();
    if n == 0 {
        return Err(AggregateError::Empty);
    }
    let len = out.len();
    if let Some(s) = srcs.iter().find(|s| s.len() != len) {
        return Err(AggregateError::Mismatch(format!(
            "input of {} values, output {len}",
            s.len()
        )));
    }
    let weights = match weights {
        Some(w) if w.len() != n => {
            return Err(AggregateError::Weights(format!(
                "{} weights for {n} inputs",
                w.len()
            )));
        }
        Some(w) => Some(normalize_weights(w)?),
        None => None,
    };
    let k = method.trim(n);
    let robust_weighted = weights.is_some() && (k > 0 || matches!(method, Method::Median));
    let threads = threads.clamp(1, 64).min(len.div_ceil(LANES * 64).max(1));
    // Split on block boundaries so every thread but the last gets whole blocks.
    let per = len.div_ceil(threads).div_ceil(LANES) * LANES;
    let work = |start: usize, o: Out<'_>| {
        if robust_weighted {
            run_weighted_robust(srcs, weights.as_deref().unwrap_or(&[]), method, start, o)
        } else {
            run_range_best(srcs, weights.as_deref(), k, start, o)
        }
    };
    if threads == 1 {
        work(0, out);
        return Ok(());
    }
    std::thread::scope(|sc| {
        let work = &work;
        match out {
            Out::F32(o) => {
                for (t, chunk) in o.chunks_mut(per).enumerate() {
                    sc.spawn(move || work(t * per, Out::F32(chunk)));
                }
            }
            Out::Bf16(o, r) => {
                for (t, chunk) in o.chunks_mut(per * 2).enumerate() {
                    sc.spawn(move || work(t * per, Out::Bf16(chunk, r)));
                }
            }
        }
    });
    Ok(())
}

/// Aggregates f32 deltas tensor by tensor (names and shapes must agree, in the same order).
pub fn aggregate_deltas(
    deltas: &[Delta],
    weights: Option<&[f32]>,
    method: Method,
    threads: usize,
) -> Result<Delta, AggregateError> {
    let first = deltas.first().ok_or(AggregateError::Empty)?;
    for d in &deltas[1..] {
        check_same_layout(first, d)?;
    }
    let mut out = Vec::with_capacity(first.len());
    for (ti, t) in first.iter().enumerate() {
        let srcs: Vec<&[f32]> = deltas.iter().map(|d| d[ti].data.as_slice()).collect();
        let mut data = vec![0f32; t.data.len()];
        let th = if data.len() >= 1 << 18 { threads } else { 1 };
        aggregate_flat(&srcs, weights, method, Out::F32(&mut data), th)?;
        out.push(Tensor::new(t.name.clone(), t.shape.clone(), data));
    }
    Ok(out)
}

/// Checks two deltas carry the same tensor names and shapes in the same order.
pub fn check_same_layout(a: &[Tensor], b: &[Tensor]) -> Result<(), AggregateError> {
    if a.len() != b.len() {
        return Err(AggregateError::Mismatch(format!(
            "{} tensors vs {}",
            a.len(),
            b.len()
        )));
    }
    for (x, y) in a.iter().zip(b) {
        if x.name != y.name || x.shape != y.shape || x.data.len() != y.data.len() {
            return Err(AggregateError::Mismatch(format!(
                "{} {:?} vs {} {:?}",
                x.name, x.shape, y.name, y.shape
            )));
        }
    }
    Ok(())
}

/// gym's aggregate(): blobs in, blob out, computed straight from the bf16 bytes (no decode pass).
/// `rounding` is `Truncate` for gym parity.
pub fn aggregate_gym_blobs(
    blobs: &[&[u8]],
    weights: Option<&[f32]>,
    method: Method,
    rounding: Rounding,
    threads: usize,
) -> Result<Vec<u8>, AggregateError> {
    let views = blobs
        .iter()
        .map(|b| wire::decode_gym_view(b))
        .collect::<Result<Vec<_>, _>>()?;
    let first = views.first().ok_or(AggregateError::Empty)?;
    let mut srcs = Vec::with_capacity(views.len());
    for v in &views {
        if v.tensors.len() != first.tensors.len()
            || v.tensors
                .iter()
                .zip(&first.tensors)
                .any(|(a, b)| a.0 != b.0 || a.1 != b.1)
        {
            return Err(AggregateError::Mismatch("blob layouts differ".into()));
        }
        let flat = v
            .flat
            .ok_or_else(|| AggregateError::Mismatch("blob tensors are not contiguous".into()))?;
        srcs.push(Bf16Bytes(flat));
    }
    let (header, data_len) =
        wire::gym_header(first.tensors.iter().map(|t| (t.0.as_str(), t.1.as_slice())))?;
    let mut out = vec![0u8; 8 + header.len() + data_len];
    out[..8].copy_from_slice(&(header.len() as u64).to_le_bytes());
    out[8..8 + header.len()].copy_from_slice(header.as_bytes());
    let body = &mut out[8 + header.len()..];
    aggregate_flat(&srcs, weights, method, Out::Bf16(body, rounding), threads)?;
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn net8_sorts_all_zero_one_inputs() {
        // 0-1 principle: a comparator network sorts everything iff it sorts all 0/1 inputs.
        for mask in 0u32..256 {
            let mut buf = vec![0f32; 8 * LANES];
            for w in 0..8 {
                buf[w * LANES] = ((mask >> w) & 1) as f32;
            }
            sort_lanes(&mut buf, 8, 1);
            for w in 1..8 {
                assert!(buf[(w - 1) * LANES] <= buf[w * LANES], "mask {mask}");
            }
        }
    }

    #[test]
    fn trim_counts() {
        assert_eq!(Method::GymRobust.trim(3), 0);
        assert_eq!(Method::GymRobust.trim(4), 1);
        assert_eq!(Method::Median.trim(4), 1);
        assert_eq!(Method::Median.trim(5), 2);
        assert_eq!(Method::Trimmed { beta: 0.25 }.trim(8), 2);
        assert_eq!(Method::Trimmed { beta: 0.5 }.trim(8), 3);
    }
}
