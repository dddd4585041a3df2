//! One host function per kernel: checks the shapes against the buffers (a short buffer is an error, never an
//! out-of-bounds launch), then launches on the GPU's stream. Results are read with [`Gpu::download`].

use candle_core::quantized::GgmlDType;

use super::{Arg, Buffer, Gpu, GpuError, Pod};
use crate::model::q8::{BLOCK_BYTES as Q8_BYTES, QK8_0 as QK};

/// Threads per block: a multiple of every warp width (32 on NVIDIA and RDNA, 64 on CDNA).
const BLOCK: u32 = 256;
/// Input rows per `q8_matmul` / `q8_matmul_t` block (`HEARTH_ROWS` in the kernels).
const ROWS: usize = 8;
/// Shared memory a block may use without opting in on every vendor (48 KiB).
const SHARED_LIMIT: usize = 48 * 1024;
/// The longest cache [`attention_decode`] reads: its scores and a 32-float scratch fill the shared memory.
pub const ATTENTION_MAX_POSITIONS: usize = SHARED_LIMIT / 4 - 32;

fn need<T: Pod>(op: &'static str, what: &str, buf: &Buffer<T>, n: usize) -> Result<(), GpuError> {
    if buf.len() < n {
        return Err(GpuError::Shape {
            op,
            reason: format!("{what} holds {} values, the shape needs {n}", buf.len()),
        });
    }
    Ok(())
}

fn dim(op: &'static str, what: &str, v: usize) -> Result<i32, GpuError> {
    if v == 0 || v > i32::MAX as usize {
        return Err(GpuError::Shape {
            op,
            reason: format!("{what} = {v} is out of range"),
        });
    }
    Ok(v as i32)
}

fn blocks(n: usize) -> u32 {
    n.div_ceil(BLOCK as usize) as u32
}

/// Rows of `k` values are whole Q8_0 blocks.
fn whole_blocks(op: &'static str, k: usize) -> Result<(), GpuError> {
    if !k.is_multiple_of(QK) {
        return Err(GpuError::Shape {
            op,
            reason: format!("k = {k} is not a multiple of {QK}"),
        });
    }
    Ok(())
}

/// Checks a Q8_0 weight `[n_out, k]` in GGUF bytes against its shape; `(m, k, n_out)` as kernel arguments.
fn q8_dims(
    op: &'static str,
    w: &Buffer<u8>,
    (m, k, n_out): (usize, usize, usize),
) -> Result<(i32, i32, i32), GpuError> {
    whole_blocks(op, k)?;
    let dims = (dim(op, "m", m)?, dim(op, "k", k)?, dim(op, "n_out", n_out)?);
    need(op, "the weight", w, n_out * k / QK * Q8_BYTES)?;
    Ok(dims)
}

/// `y[r][o] = Σ_i x[r][i] · W[o][i]` for a Q8_0 weight `[n_out, k]` in its GGUF bytes; `x` is `[m, k]`, `y`
/// `[m, n_out]`. Decode is `m = 1`; prefill passes its rows at once.
pub fn q8_matmul(
    gpu: &Gpu,
    w: &Buffer<u8>,
    x: &Buffer<f32>,
    y: &Buffer<f32>,
    (m, k, n_out): (usize, usize, usize),
) -> Result<(), GpuError> {
    const OP: &str = "q8_matmul";
    let (mi, ki, ni) = q8_dims(OP, w, (m, k, n_out))?;
    need(OP, "x", x, m * k)?;
    need(OP, "y", y, m * n_out)?;
    gpu.launch(
        OP,
        (n_out as u32, m.div_ceil(ROWS) as u32, 1),
        BLOCK,
        0,
        &[
            w.arg(),
            x.arg(),
            y.arg(),
            Arg::I32(ni),
            Arg::I32(ki),
            Arg::I32(mi),
        ],
    )
}

/// Quantizes `x` `[m, k]` as [`q8_matmul_q8`] reads it: each 32 values as a Q8_0 block (scale `amax / 127`,
/// rounded half away from zero), `q` `[m, k]` and the f16-rounded scales `d` `[m, k / 32]`, as the CPU path
/// quantizes a projection's input.
pub fn quantize_q8(
    gpu: &Gpu,
    x: &Buffer<f32>,
    q: &Buffer<i8>,
    d: &Buffer<f32>,
    (m, k): (usize, usize),
) -> Result<(), GpuError> {
    const OP: &str = "quantize_q8";
    whole_blocks(OP, k)?;
    let nb = dim(OP, "m · k / 32", m * k / QK)?;
    need(OP, "x", x, m * k)?;
    need(OP, "q", q, m * k)?;
    need(OP, "d", d, m * k / QK)?;
    gpu.launch(
        OP,
        (blocks(m * k / QK), 1, 1),
        BLOCK,
        0,
        &[x.arg(), q.arg(), d.arg(), Arg::I32(nb)],
    )
}

/// `y[r][o] = Σ_blocks d_w · d_x · Σ_j w_q · x_q` for a Q8_0 weight `[n_out, k]` in its GGUF bytes and rows
/// quantized by [`quantize_q8`]: the serving product, in the CPU path's precision.
pub fn q8_matmul_q8(
    gpu: &Gpu,
    w: &Buffer<u8>,
    (q, d): (&Buffer<i8>, &Buffer<f32>),
    y: &Buffer<f32>,
    (m, k, n_out): (usize, usize, usize),
) -> Result<(), GpuError> {
    const OP: &str = "q8_matmul_q8";
    let (mi, ki, ni) = q8_dims(OP, w, (m, k, n_out))?;
    need(OP, "q", q, m * k)?;
    need(OP, "d", d, m * k / QK)?;
    need(OP, "y", y, m * n_out)?;
    gpu.launch(
        OP,
        (n_out as u32, m.div_ceil(ROWS) as u32, 1),
        BLOCK,
        0,
        &[
            w.arg(),
            q.arg(),
            d.arg(),
            y.arg(),
            Arg::I32(ni),
            Arg::I32(ki),
            Arg::I32(mi),
        ],
    )
}

/// Training's product with a Q8_0 weight's transpose: `dx[r][i] = Σ_o dy[r][o] · W[o][i]`, `W` `[n_out, k]`
/// in its GGUF bytes, `dy` `[m, n_out]`, `dx` `[m, k]`.
pub fn q8_matmul_t(
    gpu: &Gpu,
    w: &Buffer<u8>,
    dy: &Buffer<f32>,
    dx: &Buffer<f32>,
    (m, k, n_out): (usize, usize, usize),
) -> Result<(), GpuError> {
    const OP: &str = "q8_matmul_t";
    let (mi, ki, ni) = q8_dims(OP, w, (m, k, n_out))?;
    need(OP, "dy", dy, m * n_out)?;
    need(OP, "dx", dx, m * k)?;
    gpu.launch(
        OP,
        (blocks(k), m.div_ceil(ROWS) as u32, 1),
        BLOCK,
        0,
        &[
            w.arg(),
            dy.arg(),
            dx.arg(),
            Arg::I32(ni),
            Arg::I32(ki),
            Arg::I32(mi),
        ],
    )
}

/// The block types [`kq_matmul`] reads: GGML type id, weights and bytes per block.
fn kq_layout(op: &'static str, dtype: GgmlDType) -> Result<(i32, usize, usize), GpuError> {
    match dtype {
        GgmlDType::Q4_0 => Ok((2, 32, 18)),
        GgmlDType::Q4K => Ok((12, 256, 144)),
        GgmlDType::Q5K => Ok((13, 256, 176)),
        GgmlDType::Q6K => Ok((14, 256, 210)),
        other => Err(GpuError::Shape {
            op,
            reason: format!("{other:?} weights (Q4_0, Q4_K, Q5_K and Q6_K are read)"),
        }),
    }
}

/// Whether [`kq_matmul`] reads weights of `dtype`.
pub fn kq_reads(dtype: GgmlDType) -> bool {
    kq_layout("kq_matmul", dtype).is_ok()
}

/// Checks a `dtype` weight `[n_out, k]` in GGUF bytes; the kernel's `type, n_out, k, m` arguments.
fn kq_args(
    op: &'static str,
    dtype: GgmlDType,
    w: &Buffer<u8>,
    (m, k, n_out): (usize, usize, usize),
) -> Result<[Arg; 4], GpuError> {
    let (id, qk, bytes) = kq_layout(op, dtype)?;
    if !k.is_multiple_of(qk) {
        return Err(GpuError::Shape {
            op,
            reason: format!("k = {k} is not a multiple of {qk} ({dtype:?} blocks)"),
        });
    }
    let (mi, ki, ni) = (dim(op, "m", m)?, dim(op, "k", k)?, dim(op, "n_out", n_out)?);
    need(op, "the weight", w, n_out * (k / qk) * bytes)?;
    Ok([Arg::I32(id), Arg::I32(ni), Arg::I32(ki), Arg::I32(mi)])
}

/// `y[r][o] = Σ_i x[r][i] · W[o][i]` for a Q4_0, Q4_K, Q5_K or Q6_K weight `[n_out, k]` in its GGUF bytes,
/// dequantized in the kernel; `x` `[m, k]` in f32, `y` `[m, n_out]`.
pub fn kq_matmul(
    gpu: &Gpu,
    dtype: GgmlDType,
    w: &Buffer<u8>,
    x: &Buffer<f32>,
    y: &Buffer<f32>,
    (m, k, n_out): (usize, usize, usize),
) -> Result<(), GpuError> {
    const OP: &str = "kq_matmul";
    let [t, n, kk, mm] = kq_args(OP, dtype, w, (m, k, n_out))?;
    need(OP, "x", x, m * k)?;
    need(OP, "y", y, m * n_out)?;
    gpu.launch(
        OP,
        (blocks(m * n_out), 1, 1),
        BLOCK,
        0,
        &[w.arg(), x.arg(), y.arg(), t, n, kk, mm],
    )
}

/// Training's product with such a weight's transpose: `dx[r][i] = Σ_o dy[r][o] · W[o][i]`.
pub fn kq_matmul_t(
    gpu: &Gpu,
    dtype: GgmlDType,
    w: &Buffer<u8>,
    dy: &Buffer<f32>,
    dx: &Buffer<f32>,
    (m, k, n_out): (usize, usize, usize),
) -> Result<(), GpuError> {
    const OP: &str = "kq_matmul_t";
    let [t, n, kk, mm] = kq_args(OP, dtype, w, (m, k, n_out))?;
    need(OP, "dy", dy, m * n_out)?;
    need(OP, "dx", dx, m * k)?;
    gpu.launch(
        OP,
        (blocks(m * k), 1, 1),
        BLOCK,
        0,
        &[w.arg(), dy.arg(), dx.arg(), t, n, kk, mm],
    )
}

/// RMSNorm of `rows` rows of `n`: `y = x / sqrt(mean(x²) + eps) · w`.
pub fn rms_norm(
    gpu: &Gpu,
    x: &Buffer<f32>,
    w: &Buffer<f32>,
    y: &Buffer<f32>,
    (rows, n): (usize, usize),
    eps: f32,
) -> Result<(), GpuError> {
    const OP: &str = "rms_norm";
    let ni = dim(OP, "n", n)?;
    dim(OP, "rows", rows)?;
    need(OP, "x", x, rows * n)?;
    need(OP, "w", w, n)?;
    need(OP, "y", y, rows * n)?;
    gpu.launch(
        OP,
        (rows as u32, 1, 1),
        BLOCK,
        0,
        &[x.arg(), w.arg(), y.arg(), Arg::I32(ni), Arg::F32(eps)],
    )
}

/// RMSNorm's backward: `dx` (`[rows, n]`) and the weight's gradient `dw` (`[n]`, summed over rows).
#[allow(clippy::too_many_arguments)]
pub fn rms_norm_backward(
    gpu: &Gpu,
    x: &Buffer<f32>,
    w: &Buffer<f32>,
    dy: &Buffer<f32>,
    dx: &Buffer<f32>,
    dw: &Buffer<f32>,
    (rows, n): (usize, usize),
    eps: f32,
) -> Result<(), GpuError> {
    const OP: &str = "rms_norm_backward";
    let ni = dim(OP, "n", n)?;
    let ri = dim(OP, "rows", rows)?;
    for (what, b, len) in [
        ("x", x, rows * n),
        ("dy", dy, rows * n),
        ("dx", dx, rows * n),
    ] {
        need(OP, what, b, len)?;
    }
    need(OP, "w", w, n)?;
    need(OP, "dw", dw, n)?;
    let rinv = gpu.zeros::<f32>(rows)?;
    gpu.launch(
        OP,
        (rows as u32, 1, 1),
        BLOCK,
        0,
        &[
            x.arg(),
            w.arg(),
            dy.arg(),
            dx.arg(),
            rinv.arg(),
            Arg::I32(ni),
            Arg::F32(eps),
        ],
    )?;
    gpu.launch(
        "rms_norm_backward_weight",
        (blocks(n), 1, 1),
        BLOCK,
        0,
        &[
            x.arg(),
            dy.arg(),
            rinv.arg(),
            dw.arg(),
            Arg::I32(ri),
            Arg::I32(ni),
        ],
    )?;
    // `rinv` is freed on return: wait for the kernels that read it.
    gpu.synchronize()
}

/// Which way [`rope`] turns.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Rotation {
    Forward,
    /// The inverse rotation: the embedding's backward.
    Inverse,
}

/// Rotary embedding in place on `x` `[rows, heads, hd]`, row `t` at position `pos[t]`; `cos`/`sin` are
/// `[positions, hd / 2]` tables. `interleaved` pairs `(2i, 2i+1)` (Llama GGUFs), otherwise `(i, i + hd/2)`.
/// Positions are device values (one captured decode graph replays at every step): each must be below the
/// tables' `positions`.
#[allow(clippy::too_many_arguments)]
pub fn rope(
    gpu: &Gpu,
    x: &Buffer<f32>,
    cos: &Buffer<f32>,
    sin: &Buffer<f32>,
    pos: &Buffer<i32>,
    (rows, heads, hd): (usize, usize, usize),
    interleaved: bool,
    rotation: Rotation,
) -> Result<(), GpuError> {
    const OP: &str = "rope";
    if !hd.is_multiple_of(2) {
        return Err(GpuError::Shape {
            op: OP,
            reason: format!("head dim {hd} is odd"),
        });
    }
    let (hi, di) = (dim(OP, "heads", heads)?, dim(OP, "hd", hd)?);
    dim(OP, "rows", rows)?;
    need(OP, "x", x, rows * heads * hd)?;
    need(OP, "pos", pos, rows)?;
    need(OP, "cos", cos, hd / 2)?;
    need(OP, "sin", sin, cos.len())?;
    let sign = match rotation {
        Rotation::Forward => 1.0,
        Rotation::Inverse => -1.0,
    };
    gpu.launch(
        OP,
        ((rows * heads) as u32, 1, 1),
        (hd as u32 / 2).next_multiple_of(64).min(BLOCK),
        0,
        &[
            x.arg(),
            cos.arg(),
            sin.arg(),
            pos.arg(),
            Arg::I32(hi),
            Arg::I32(di),
            Arg::I32(interleaved as i32),
            Arg::F32(sign),
        ],
    )
}

/// Attention shapes for one decode step.
#[derive(Debug, Clone, Copy)]
pub struct AttentionShape {
    pub heads: usize,
    pub kv_heads: usize,
    pub head_dim: usize,
    /// Positions the cache holds room for.
    pub capacity: usize,
}

/// New tokens' attention over the KV cache (`[kv_heads, capacity, head_dim]` each), grouped-query and causal:
/// query row `r` of `q` `[rows, heads, head_dim]` is the token at position `pos[0] + r` (a device value) and
/// reads positions `0..=pos[0] + r`, its own already appended:
/// `out[r][h] = softmax(q[r][h] · K[h / g]ᵀ · scale) · V[h / g]`. Decode is `rows = 1`.
#[allow(clippy::too_many_arguments)]
pub fn attention_decode(
    gpu: &Gpu,
    q: &Buffer<f32>,
    k_cache: &Buffer<f32>,
    v_cache: &Buffer<f32>,
    out: &Buffer<f32>,
    pos: &Buffer<i32>,
    rows: usize,
    s: AttentionShape,
    scale: f32,
) -> Result<(), GpuError> {
    const OP: &str = "attention_decode";
    let (hi, kvi, di, ci) = (
        dim(OP, "heads", s.heads)?,
        dim(OP, "kv_heads", s.kv_heads)?,
        dim(OP, "head_dim", s.head_dim)?,
        dim(OP, "capacity", s.capacity)?,
    );
    dim(OP, "rows", rows)?;
    if !s.heads.is_multiple_of(s.kv_heads) {
        return Err(GpuError::Shape {
            op: OP,
            reason: format!("{} heads over {} kv heads", s.heads, s.kv_heads),
        });
    }
    if s.capacity > ATTENTION_MAX_POSITIONS {
        return Err(GpuError::Shape {
            op: OP,
            reason: format!(
                "a cache of {} positions needs {} bytes of scores (limit {SHARED_LIMIT})",
                s.capacity,
                (32 + s.capacity) * 4
            ),
        });
    }
    need(OP, "q", q, rows * s.heads * s.head_dim)?;
    need(OP, "out", out, rows * s.heads * s.head_dim)?;
    let cache = s.kv_heads * s.capacity * s.head_dim;
    need(OP, "k_cache", k_cache, cache)?;
    need(OP, "v_cache", v_cache, cache)?;
    need(OP, "pos", pos, 1)?;
    gpu.launch(
        OP,
        (s.heads as u32, rows as u32, 1),
        BLOCK,
        ((32 + s.capacity) * 4) as u32,
        &[
            q.arg(),
            k_cache.arg(),
            v_cache.arg(),
            out.arg(),
            pos.arg(),
            Arg::I32(hi),
            Arg::I32(kvi),
            Arg::I32(di),
            Arg::I32(ci),
            Arg::F32(scale),
        ],
    )
}

/// Shapes of training's attention over one sequence: `q` `[len, heads, head_dim]`, `k` and `v`
/// `[len, kv_heads, head_dim]`, probabilities `[heads, len, len]`.
#[derive(Debug, Clone, Copy)]
pub struct SequenceShape {
    pub len: usize,
    pub heads: usize,
    pub kv_heads: usize,
    pub head_dim: usize,
}

impl SequenceShape {
    /// The kernels' `len, nh, nkv, hd` arguments, after checking the buffers hold the shape.
    fn args(
        &self,
        op: &'static str,
        queries: &[(&str, &Buffer<f32>)],
        keys: &[(&str, &Buffer<f32>)],
        scores: &[(&str, &Buffer<f32>)],
    ) -> Result<[Arg; 4], GpuError> {
        let (li, hi, kvi, di) = (
            dim(op, "len", self.len)?,
            dim(op, "heads", self.heads)?,
            dim(op, "kv_heads", self.kv_heads)?,
            dim(op, "head_dim", self.head_dim)?,
        );
        if !self.heads.is_multiple_of(self.kv_heads) {
            return Err(GpuError::Shape {
                op,
                reason: format!("{} heads over {} kv heads", self.heads, self.kv_heads),
            });
        }
        if self.heads * self.len * self.len > i32::MAX as usize {
            return Err(GpuError::Shape {
                op,
                reason: format!("{} heads of {}² scores", self.heads, self.len),
            });
        }
        for (what, b) in queries {
            need(op, what, b, self.len * self.heads * self.head_dim)?;
        }
        for (what, b) in keys {
            need(op, what, b, self.len * self.kv_heads * self.head_dim)?;
        }
        for (what, b) in scores {
            need(op, what, b, self.heads * self.len * self.len)?;
        }
        Ok([Arg::I32(li), Arg::I32(hi), Arg::I32(kvi), Arg::I32(di)])
    }

    fn queries(&self) -> usize {
        self.len * self.heads * self.head_dim
    }

    fn scores(&self) -> usize {
        self.heads * self.len * self.len
    }
}

/// Causal attention scores of one sequence, `s[h][i][j] = scale · q[i][h]·k[j][h / g]` for `j ≤ i` (zero
/// above); [`softmax_rows`] with `causal` over `(heads · len, len)` turns them into probabilities.
pub fn attention_scores(
    gpu: &Gpu,
    q: &Buffer<f32>,
    k: &Buffer<f32>,
    s: &Buffer<f32>,
    shape: SequenceShape,
    scale: f32,
) -> Result<(), GpuError> {
    const OP: &str = "attention_scores";
    let [l, h, kv, d] = shape.args(OP, &[("q", q)], &[("k", k)], &[("s", s)])?;
    gpu.launch(
        OP,
        (blocks(shape.scores()), 1, 1),
        BLOCK,
        0,
        &[q.arg(), k.arg(), s.arg(), l, h, kv, d, Arg::F32(scale)],
    )
}

/// The context `ctx[i][h] = Σ_j p[h][i][j] · v[j][h / g]` from causal probabilities `p`.
pub fn attention_context(
    gpu: &Gpu,
    p: &Buffer<f32>,
    v: &Buffer<f32>,
    ctx: &Buffer<f32>,
    shape: SequenceShape,
) -> Result<(), GpuError> {
    const OP: &str = "attention_context";
    let [l, h, kv, d] = shape.args(OP, &[("ctx", ctx)], &[("v", v)], &[("p", p)])?;
    gpu.launch(
        OP,
        (blocks(shape.queries()), 1, 1),
        BLOCK,
        0,
        &[p.arg(), v.arg(), ctx.arg(), l, h, kv, d],
    )
}

/// The probabilities' gradient `dp[h][i][j] = dctx[i][h]·v[j][h / g]` (`j ≤ i`); [`softmax_backward`] takes
/// it to the scores'.
pub fn attention_grad_probs(
    gpu: &Gpu,
    dctx: &Buffer<f32>,
    v: &Buffer<f32>,
    dp: &Buffer<f32>,
    shape: SequenceShape,
) -> Result<(), GpuError> {
    const OP: &str = "attention_grad_probs";
    let [l, h, kv, d] = shape.args(OP, &[("dctx", dctx)], &[("v", v)], &[("dp", dp)])?;
    gpu.launch(
        OP,
        (blocks(shape.scores()), 1, 1),
        BLOCK,
        0,
        &[dctx.arg(), v.arg(), dp.arg(), l, h, kv, d],
    )
}

/// The queries' gradient from the scores' `ds`: `dq[i][h] = scale · Σ_j ds[h][i][j] · k[j][h / g]`.
pub fn attention_grad_q(
    gpu: &Gpu,
    ds: &Buffer<f32>,
    k: &Buffer<f32>,
    dq: &Buffer<f32>,
    shape: SequenceShape,
    scale: f32,
) -> Result<(), GpuError> {
    const OP: &str = "attention_grad_q";
    let [l, h, kv, d] = shape.args(OP, &[("dq", dq)], &[("k", k)], &[("ds", ds)])?;
    gpu.launch(
        OP,
        (blocks(shape.queries()), 1, 1),
        BLOCK,
        0,
        &[ds.arg(), k.arg(), dq.arg(), l, h, kv, d, Arg::F32(scale)],
    )
}

/// The keys' and values' gradients, summed over each kv head's query heads:
/// `dk[j][c] = scale · Σ_h Σ_i ds[h][i][j] · q[i][h]`, `dv[j][c] = Σ_h Σ_i p[h][i][j] · dctx[i][h]`.
#[allow(clippy::too_many_arguments)]
pub fn attention_grad_kv(
    gpu: &Gpu,
    (ds, p): (&Buffer<f32>, &Buffer<f32>),
    (q, dctx): (&Buffer<f32>, &Buffer<f32>),
    (dk, dv): (&Buffer<f32>, &Buffer<f32>),
    shape: SequenceShape,
    scale: f32,
) -> Result<(), GpuError> {
    const OP: &str = "attention_grad_kv";
    let [l, h, kv, d] = shape.args(
        OP,
        &[("q", q), ("dctx", dctx)],
        &[("dk", dk), ("dv", dv)],
        &[("ds", ds), ("p", p)],
    )?;
    gpu.launch(
        OP,
        (blocks(shape.len * shape.kv_heads * shape.head_dim), 1, 1),
        BLOCK,
        0,
        &[
            ds.arg(),
            p.arg(),
            q.arg(),
            dctx.arg(),
            dk.arg(),
            dv.arg(),
            l,
            h,
            kv,
            d,
            Arg::F32(scale),
        ],
    )
}

/// Each scored row's targets on the device, as [`head_logps`] reads them: row `r`'s token ids and weights are
/// `ids[offsets[r]..offsets[r + 1]]`. Built from host values, whose ids are checked against the vocabulary.
pub struct HeadTargets {
    rows: usize,
    offsets: Buffer<i32>,
    ids: Buffer<i32>,
    weights: Buffer<f32>,
}

impl HeadTargets {
    /// `offsets` has one more entry than rows, ascending from 0 to `ids.len()`; `weights` pairs with `ids`.
    pub fn new(
        gpu: &Gpu,
        offsets: &[usize],
        ids: &[u32],
        weights: &[f32],
        vocab: usize,
    ) -> Result<Self, GpuError> {
        const OP: &str = "head_targets";
        let bad = |reason: String| GpuError::Shape { op: OP, reason };
        if offsets.first() != Some(&0)
            || offsets.last() != Some(&ids.len())
            || offsets.windows(2).any(|w| w[0] > w[1])
            || ids.len() != weights.len()
        {
            return Err(bad(format!(
                "{} offsets do not index {} ids and {} weights",
                offsets.len(),
                ids.len(),
                weights.len()
            )));
        }
        if let Some(t) = ids.iter().find(|&&t| t as usize >= vocab) {
            return Err(bad(format!(
                "target {t} is outside the vocabulary of {vocab}"
            )));
        }
        let as_i32 = |v: usize| {
            i32::try_from(v).map_err(|_| bad(format!("{v} does not fit a device index")))
        };
        let offsets = offsets
            .iter()
            .map(|&o| as_i32(o))
            .collect::<Result<Vec<_>, _>>()?;
        let ids = ids
            .iter()
            .map(|&t| as_i32(t as usize))
            .collect::<Result<Vec<_>, _>>()?;
        // Empty buffers are still allocations the kernels may be handed.
        let or_one = |v: Vec<i32>| if v.is_empty() { vec![0] } else { v };
        Ok(Self {
            rows: offsets.len() - 1,
            offsets: gpu.upload(&offsets)?,
            ids: gpu.upload(&or_one(ids))?,
            weights: gpu.upload(if weights.is_empty() {
                &[0.0f32][..]
            } else {
                weights
            })?,
        })
    }
}

/// Row `r`'s weighted log-probability of its targets, `lp[r] = Σ w·(logits[r][id] − logsumexp(logits[r]))`;
/// `logits` `[rows, vocab]` is left holding each row's softmax, which [`head_logps_backward`] reads.
pub fn head_logps(
    gpu: &Gpu,
    logits: &Buffer<f32>,
    targets: &HeadTargets,
    lp: &Buffer<f32>,
    vocab: usize,
) -> Result<(), GpuError> {
    head_launch(
        gpu,
        "head_logps",
        (logits, "logits"),
        targets,
        (lp, "lp"),
        vocab,
    )
}

/// The logits' gradient from each row's `dlp`, in place over [`head_logps`]'s probabilities `p`:
/// `dlp[r] · (Σ w·onehot(id) − Σw · p[r])`.
pub fn head_logps_backward(
    gpu: &Gpu,
    probs: &Buffer<f32>,
    targets: &HeadTargets,
    dlp: &Buffer<f32>,
    vocab: usize,
) -> Result<(), GpuError> {
    head_launch(
        gpu,
        "head_logps_backward",
        (probs, "probs"),
        targets,
        (dlp, "dlp"),
        vocab,
    )
}

/// Both head kernels: one block per row over `[rows, vocab]` values, the targets, and a value per row.
fn head_launch(
    gpu: &Gpu,
    op: &'static str,
    (rows_buf, rows_name): (&Buffer<f32>, &str),
    targets: &HeadTargets,
    (per_row, per_row_name): (&Buffer<f32>, &str),
    vocab: usize,
) -> Result<(), GpuError> {
    let rows = targets.rows;
    let vi = dim(op, "vocab", vocab)?;
    dim(op, "rows", rows)?;
    need(op, rows_name, rows_buf, rows * vocab)?;
    need(op, per_row_name, per_row, rows)?;
    gpu.launch(
        op,
        (rows as u32, 1, 1),
        BLOCK,
        0,
        &[
            rows_buf.arg(),
            targets.offsets.arg(),
            targets.ids.arg(),
            targets.weights.arg(),
            per_row.arg(),
            Arg::I32(vi),
        ],
    )
}

/// `out = silu(g) · u`, elementwise over `n` values.
pub fn silu_mul(
    gpu: &Gpu,
    g: &Buffer<f32>,
    u: &Buffer<f32>,
    out: &Buffer<f32>,
    n: usize,
) -> Result<(), GpuError> {
    gated(gpu, "silu_mul", (g, u, out), n)
}

/// `out = gelu(g) · u` (GELU's tanh approximation, as Gemma's MLP), elementwise over `n` values.
pub fn gelu_mul(
    gpu: &Gpu,
    g: &Buffer<f32>,
    u: &Buffer<f32>,
    out: &Buffer<f32>,
    n: usize,
) -> Result<(), GpuError> {
    gated(gpu, "gelu_mul", (g, u, out), n)
}

/// Either MLP gate kernel: `out = act(g) · u` over `n` values.
fn gated(
    gpu: &Gpu,
    op: &'static str,
    (g, u, out): (&Buffer<f32>, &Buffer<f32>, &Buffer<f32>),
    n: usize,
) -> Result<(), GpuError> {
    let ni = dim(op, "n", n)?;
    for (what, b) in [("g", g), ("u", u), ("out", out)] {
        need(op, what, b, n)?;
    }
    gpu.launch(
        op,
        (blocks(n), 1, 1),
        BLOCK,
        0,
        &[g.arg(), u.arg(), out.arg(), Arg::I32(ni)],
    )
}

/// The backward of [`silu_mul`]: `dg` and `du` from `dy`.
pub fn silu_mul_backward(
    gpu: &Gpu,
    g: &Buffer<f32>,
    u: &Buffer<f32>,
    dy: &Buffer<f32>,
    (dg, du): (&Buffer<f32>, &Buffer<f32>),
    n: usize,
) -> Result<(), GpuError> {
    gated_backward(gpu, "silu_mul_backward", (g, u, dy), (dg, du), n)
}

/// The backward of [`gelu_mul`]: `dg` and `du` from `dy`.
pub fn gelu_mul_backward(
    gpu: &Gpu,
    g: &Buffer<f32>,
    u: &Buffer<f32>,
    dy: &Buffer<f32>,
    (dg, du): (&Buffer<f32>, &Buffer<f32>),
    n: usize,
) -> Result<(), GpuError> {
    gated_backward(gpu, "gelu_mul_backward", (g, u, dy), (dg, du), n)
}

/// Either MLP gate's backward kernel.
fn gated_backward(
    gpu: &Gpu,
    op: &'static str,
    (g, u, dy): (&Buffer<f32>, &Buffer<f32>, &Buffer<f32>),
    (dg, du): (&Buffer<f32>, &Buffer<f32>),
    n: usize,
) -> Result<(), GpuError> {
    let ni = dim(op, "n", n)?;
    for (what, b) in [("g", g), ("u", u), ("dy", dy), ("dg", dg), ("du", du)] {
        need(op, what, b, n)?;
    }
    gpu.launch(
        op,
        (blocks(n), 1, 1),
        BLOCK,
        0,
        &[g.arg(), u.arg(), dy.arg(), dg.arg(), du.arg(), Arg::I32(ni)],
    )
}

/// Row softmax over `rows × cols`; `causal` masks square per-head blocks (row `r` keeps columns
/// `0..=r % cols`), as training's attention does.
pub fn softmax_rows(
    gpu: &Gpu,
    x: &Buffer<f32>,
    y: &Buffer<f32>,
    (rows, cols): (usize, usize),
    causal: bool,
) -> Result<(), GpuError> {
    const OP: &str = "softmax_rows";
    let ci = dim(OP, "cols", cols)?;
    dim(OP, "rows", rows)?;
    need(OP, "x", x, rows * cols)?;
    need(OP, "y", y, rows * cols)?;
    gpu.launch(
        OP,
        (rows as u32, 1, 1),
        BLOCK,
        0,
        &[x.arg(), y.arg(), Arg::I32(ci), Arg::I32(causal as i32)],
    )
}

/// Softmax's backward from its output `y`: `dx = y · (dy - Σ y·dy)` per row.
pub fn softmax_backward(
    gpu: &Gpu,
    y: &Buffer<f32>,
    dy: &Buffer<f32>,
    dx: &Buffer<f32>,
    (rows, cols): (usize, usize),
) -> Result<(), GpuError> {
    const OP: &str = "softmax_backward";
    let ci = dim(OP, "cols", cols)?;
    dim(OP, "rows", rows)?;
    for (what, b) in [("y", y), ("dy", dy), ("dx", dx)] {
        need(OP, what, b, rows * cols)?;
    }
    gpu.launch(
        OP,
        (rows as u32, 1, 1),
        BLOCK,
        0,
        &[y.arg(), dy.arg(), dx.arg(), Arg::I32(ci)],
    )
}

/// Strides of one operand of [`gemm`]: element `(i, l)` of `A` is at `i·row + l·col`.
#[derive(Clone, Copy)]
struct Strides {
    row: usize,
    col: usize,
}

/// `C = beta·C + alpha·A·B`, `C` row-major `[m, n]`, `A` `[m, k]` and `B` `[k, n]` given by strides.
#[allow(clippy::too_many_arguments)]
fn gemm(
    gpu: &Gpu,
    a: (&Buffer<f32>, Strides),
    b: (&Buffer<f32>, Strides),
    c: &Buffer<f32>,
    (m, n, k): (usize, usize, usize),
    alpha: f32,
    beta: f32,
) -> Result<(), GpuError> {
    let s = |v: usize| v as i32;
    gpu.launch(
        "lora_gemm",
        (blocks(m * n), 1, 1),
        BLOCK,
        0,
        &[
            a.0.arg(),
            b.0.arg(),
            c.arg(),
            Arg::I32(s(m)),
            Arg::I32(s(n)),
            Arg::I32(s(k)),
            Arg::I32(s(a.1.row)),
            Arg::I32(s(a.1.col)),
            Arg::I32(s(b.1.row)),
            Arg::I32(s(b.1.col)),
            Arg::F32(alpha),
            Arg::F32(beta),
        ],
    )
}

/// Shapes of a LoRA pair on a projection `[n, k]`: `A` `[r, k]`, `B` `[n, r]`, over `m` input rows.
#[derive(Debug, Clone, Copy)]
pub struct LoraShape {
    pub m: usize,
    pub k: usize,
    pub rank: usize,
    pub n: usize,
}

impl LoraShape {
    fn check(&self, op: &'static str) -> Result<(), GpuError> {
        for (what, v) in [
            ("m", self.m),
            ("k", self.k),
            ("rank", self.rank),
            ("n", self.n),
        ] {
            dim(op, what, v)?;
        }
        if self.m * self.k.max(self.n) > i32::MAX as usize {
            return Err(GpuError::Shape {
                op,
                reason: "more than 2^31 values".into(),
            });
        }
        Ok(())
    }
}

/// The unmerged LoRA delta added to a projection's output: `t = x·Aᵀ` (kept for the backward), then
/// `y += scale · t·Bᵀ`.
#[allow(clippy::too_many_arguments)]
pub fn lora_forward(
    gpu: &Gpu,
    x: &Buffer<f32>,
    a: &Buffer<f32>,
    b: &Buffer<f32>,
    t: &Buffer<f32>,
    y: &Buffer<f32>,
    s: LoraShape,
    scale: f32,
) -> Result<(), GpuError> {
    const OP: &str = "lora_forward";
    s.check(OP)?;
    let LoraShape { m, k, rank: r, n } = s;
    need(OP, "x", x, m * k)?;
    need(OP, "a", a, r * k)?;
    need(OP, "b", b, n * r)?;
    need(OP, "t", t, m * r)?;
    need(OP, "y", y, m * n)?;
    let st = |row, col| Strides { row, col };
    gemm(gpu, (x, st(k, 1)), (a, st(1, k)), t, (m, r, k), 1.0, 0.0)?;
    gemm(gpu, (t, st(r, 1)), (b, st(1, r)), y, (m, n, r), scale, 1.0)
}

/// Gradients of one LoRA pair.
pub struct LoraGrads<'a> {
    /// `[r, k]`, overwritten.
    pub da: &'a Buffer<f32>,
    /// `[n, r]`, overwritten.
    pub db: &'a Buffer<f32>,
    /// `[m, k]`, the delta's part added to the input gradient.
    pub dx: &'a Buffer<f32>,
}

/// The backward of [`lora_forward`] from `dy` `[m, n]` and the forward's `t`: with `u = scale · dy·B`,
/// `dB = scale · dyᵀ·t`, `dA = uᵀ·x`, `dx += u·A`.
#[allow(clippy::too_many_arguments)]
pub fn lora_backward(
    gpu: &Gpu,
    x: &Buffer<f32>,
    a: &Buffer<f32>,
    b: &Buffer<f32>,
    t: &Buffer<f32>,
    dy: &Buffer<f32>,
    grads: LoraGrads<'_>,
    s: LoraShape,
    scale: f32,
) -> Result<(), GpuError> {
    const OP: &str = "lora_backward";
    s.check(OP)?;
    let LoraShape { m, k, rank: r, n } = s;
    need(OP, "x", x, m * k)?;
    need(OP, "a", a, r * k)?;
    need(OP, "b", b, n * r)?;
    need(OP, "t", t, m * r)?;
    need(OP, "dy", dy, m * n)?;
    need(OP, "da", grads.da, r * k)?;
    need(OP, "db", grads.db, n * r)?;
    need(OP, "dx", grads.dx, m * k)?;
    let st = |row, col| Strides { row, col };
    let u = gpu.zeros::<f32>(m * r)?;
    gemm(
        gpu,
        (dy, st(n, 1)),
        (b, st(r, 1)),
        &u,
        (m, r, n),
        scale,
        0.0,
    )?;
    gemm(
        gpu,
        (dy, st(1, n)),
        (t, st(r, 1)),
        grads.db,
        (n, r, m),
        scale,
        0.0,
    )?;
    gemm(
        gpu,
        (&u, st(1, r)),
        (x, st(k, 1)),
        grads.da,
        (r, k, m),
        1.0,
        0.0,
    )?;
    gemm(
        gpu,
        (&u, st(r, 1)),
        (a, st(k, 1)),
        grads.dx,
        (m, k, r),
        1.0,
        1.0,
    )?;
    // `u` is freed on return: wait for the products that read it.
    gpu.synchronize()
}

/// `x += d` over `n` values (the residual add).
pub fn add_into(gpu: &Gpu, x: &Buffer<f32>, d: &Buffer<f32>, n: usize) -> Result<(), GpuError> {
    add_rows(gpu, x, d, (1, n))
}

/// `x[r] += d` for each of `rows` rows of `n` values (a bias on every row).
pub fn add_rows(
    gpu: &Gpu,
    x: &Buffer<f32>,
    d: &Buffer<f32>,
    (rows, n): (usize, usize),
) -> Result<(), GpuError> {
    const OP: &str = "add_into";
    let (ni, total) = (dim(OP, "n", n)?, dim(OP, "rows · n", rows * n)?);
    need(OP, "x", x, rows * n)?;
    need(OP, "d", d, n)?;
    gpu.launch(
        OP,
        (blocks(rows * n), 1, 1),
        BLOCK,
        0,
        &[x.arg(), d.arg(), Arg::I32(total), Arg::I32(ni)],
    )
}

/// `x[r] *= f` elementwise for each of `rows` rows of `n` values (DoRA's factor per output).
pub fn mul_rows(
    gpu: &Gpu,
    x: &Buffer<f32>,
    f: &Buffer<f32>,
    (rows, n): (usize, usize),
) -> Result<(), GpuError> {
    const OP: &str = "mul_rows";
    let (ni, total) = (dim(OP, "n", n)?, dim(OP, "rows · n", rows * n)?);
    need(OP, "x", x, rows * n)?;
    need(OP, "f", f, n)?;
    gpu.launch(
        OP,
        (blocks(rows * n), 1, 1),
        BLOCK,
        0,
        &[x.arg(), f.arg(), Arg::I32(total), Arg::I32(ni)],
    )
}

/// Which way [`move_rows`] moves rows of `n` values.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RowMove {
    /// `dst[r] = src[idx[r]]`.
    Gather,
    /// `dst[idx[r]] = src[r]`.
    Scatter,
}

/// Gathers or scatters `idx.len()` rows of `n` values between `src` and `dst`; the indices are checked here
/// against `dst`'s (scatter) or `src`'s (gather) rows.
pub fn move_rows(
    gpu: &Gpu,
    how: RowMove,
    src: &Buffer<f32>,
    idx: (&Buffer<i32>, &[usize]),
    dst: &Buffer<f32>,
    n: usize,
) -> Result<(), GpuError> {
    let op = match how {
        RowMove::Gather => "gather_rows",
        RowMove::Scatter => "scatter_rows",
    };
    let (buf, host) = idx;
    let rows = host.len();
    let (ri, ni) = (dim(op, "rows", rows)?, dim(op, "n", n)?);
    dim(op, "rows · n", rows * n)?;
    need(op, "idx", buf, rows)?;
    let (indexed, compact) = match how {
        RowMove::Gather => (src, dst),
        RowMove::Scatter => (dst, src),
    };
    need(op, "the compact rows", compact, rows * n)?;
    let bound = indexed.len() / n;
    if let Some(&bad) = host.iter().find(|&&i| i >= bound) {
        return Err(GpuError::Shape {
            op,
            reason: format!("row {bad} of {bound}"),
        });
    }
    gpu.launch(
        op,
        (blocks(rows * n), 1, 1),
        BLOCK,
        0,
        &[src.arg(), buf.arg(), dst.arg(), Arg::I32(ri), Arg::I32(ni)],
    )
}

/// Writes `rows` tokens' `src` `[rows, kv_heads, head_dim]` into `cache` `[kv_heads, capacity, head_dim]` at
/// positions `pos[0]..pos[0] + rows` (a device value; the caller keeps them below `capacity` and moves `pos` on
/// with [`advance`]).
pub fn kv_append(
    gpu: &Gpu,
    cache: &Buffer<f32>,
    src: &Buffer<f32>,
    pos: &Buffer<i32>,
    rows: usize,
    s: AttentionShape,
) -> Result<(), GpuError> {
    const OP: &str = "kv_append";
    let (ri, kvi, di, ci) = (
        dim(OP, "rows", rows)?,
        dim(OP, "kv_heads", s.kv_heads)?,
        dim(OP, "head_dim", s.head_dim)?,
        dim(OP, "capacity", s.capacity)?,
    );
    need(OP, "cache", cache, s.kv_heads * s.capacity * s.head_dim)?;
    need(OP, "src", src, rows * s.kv_heads * s.head_dim)?;
    need(OP, "pos", pos, 1)?;
    gpu.launch(
        OP,
        (blocks(rows * s.kv_heads * s.head_dim), 1, 1),
        BLOCK,
        0,
        &[
            cache.arg(),
            src.arg(),
            pos.arg(),
            Arg::I32(ri),
            Arg::I32(kvi),
            Arg::I32(ci),
            Arg::I32(di),
        ],
    )
}

/// `len[0] += by` on the device, after a step's cache writes.
pub fn advance(gpu: &Gpu, len: &Buffer<i32>, by: i32) -> Result<(), GpuError> {
    need("advance", "len", len, 1)?;
    gpu.launch("advance", (1, 1, 1), 64, 0, &[len.arg(), Arg::I32(by)])
}
