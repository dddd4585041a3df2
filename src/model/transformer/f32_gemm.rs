//! f32 matrix products through the `gemm` crate (candle's own GEMM), for hearth's fused training nodes:
//! they need to accumulate into an existing output and to run inside their own parallel tasks, neither of which
//! candle's `matmul` offers.

/// A row-major view of a matrix, or of its transpose (strides swapped).
#[derive(Clone, Copy)]
pub(super) struct Mat<'a> {
    data: &'a [f32],
    rows: usize,
    cols: usize,
    row_stride: usize,
    col_stride: usize,
}

impl<'a> Mat<'a> {
    pub(super) fn new(data: &'a [f32], rows: usize, cols: usize) -> Self {
        Self {
            data,
            rows,
            cols,
            row_stride: cols,
            col_stride: 1,
        }
    }

    pub(super) fn t(self) -> Self {
        Self {
            rows: self.cols,
            cols: self.rows,
            row_stride: self.col_stride,
            col_stride: self.row_stride,
            ..self
        }
    }

    /// Whether every element the strides reach lies inside `data`.
    fn in_bounds(&self) -> bool {
        self.rows == 0
            || self.cols == 0
            || (self.rows - 1) * self.row_stride + (self.cols - 1) * self.col_stride
                < self.data.len()
    }
}

/// `dst (rows(lhs) × cols(rhs), row-major) = alpha·lhs·rhs`, or `dst += alpha·lhs·rhs` with `accumulate`;
/// split across the current rayon pool when `parallel` (callers already inside a parallel task pass false).
pub(super) fn gemm(
    dst: &mut [f32],
    accumulate: bool,
    lhs: Mat,
    rhs: Mat,
    alpha: f32,
    parallel: bool,
) -> candle_core::Result<()> {
    let (m, k, n) = (lhs.rows, lhs.cols, rhs.cols);
    if rhs.rows != k || dst.len() != m * n || !lhs.in_bounds() || !rhs.in_bounds() {
        candle_core::bail!(
            "gemm of {m}x{k} by {}x{n} into {} values",
            rhs.rows,
            dst.len()
        );
    }
    if m == 0 || n == 0 {
        return Ok(());
    }
    let parallelism = match rayon::current_num_threads() {
        n if n == 1 || !parallel => gemm::Parallelism::None,
        n => gemm::Parallelism::Rayon(n),
    };
    // SAFETY: `dst` holds exactly m×n values written at row stride n, column stride 1, and the checks above
    // keep every element the strides of `lhs` (m×k) and `rhs` (k×n) reach inside their slices; the three do
    // not alias (`dst` is borrowed mutably).
    unsafe {
        gemm::gemm(
            m,
            n,
            k,
            dst.as_mut_ptr(),
            1,
            n as isize,
            accumulate,
            lhs.data.as_ptr(),
            lhs.col_stride as isize,
            lhs.row_stride as isize,
            rhs.data.as_ptr(),
            rhs.col_stride as isize,
            rhs.row_stride as isize,
            1.0,
            alpha,
            false,
            false,
            false,
            parallelism,
        );
    }
    Ok(())
}
