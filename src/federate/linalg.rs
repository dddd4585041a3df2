//! Small dense linear algebra in f64 for re-factoring aggregated LoRA updates: Gram-Schmidt QR (twice, for
//! stability), one-sided Jacobi SVD, and a randomized range finder with subspace iteration for truncated SVD of
//! a dense matrix. Matrices here are at most a few thousand by a few dozen, so clarity beats blocking.

use rand::SeedableRng;
use rand_distr::{Distribution, StandardNormal};

/// Row-major dense matrix.
#[derive(Debug, Clone, PartialEq)]
pub struct Mat {
    pub rows: usize,
    pub cols: usize,
    pub data: Vec<f64>,
}

impl Mat {
    pub fn zeros(rows: usize, cols: usize) -> Mat {
        Mat {
            rows,
            cols,
            data: vec![0.0; rows * cols],
        }
    }

    pub fn from_f32(rows: usize, cols: usize, d: &[f32]) -> Mat {
        Mat {
            rows,
            cols,
            data: d.iter().map(|&x| x as f64).collect(),
        }
    }

    #[inline]
    pub fn at(&self, r: usize, c: usize) -> f64 {
        self.data[r * self.cols + c]
    }

    #[inline]
    pub fn set(&mut self, r: usize, c: usize, v: f64) {
        self.data[r * self.cols + c] = v;
    }

    pub fn transpose(&self) -> Mat {
        let mut t = Mat::zeros(self.cols, self.rows);
        for r in 0..self.rows {
            for c in 0..self.cols {
                t.data[c * self.rows + r] = self.data[r * self.cols + c];
            }
        }
        t
    }

    /// `self · b`, i-k-j loop order so the inner loop streams rows.
    pub fn matmul(&self, b: &Mat) -> Mat {
        assert_eq!(self.cols, b.rows, "matmul shapes");
        let mut out = Mat::zeros(self.rows, b.cols);
        for i in 0..self.rows {
            let orow = &mut out.data[i * b.cols..(i + 1) * b.cols];
            for k in 0..self.cols {
                let a = self.data[i * self.cols + k];
                if a == 0.0 {
                    continue;
                }
                for (o, &bv) in orow.iter_mut().zip(&b.data[k * b.cols..(k + 1) * b.cols]) {
                    *o += a * bv;
                }
            }
        }
        out
    }

    pub fn frob2(&self) -> f64 {
        self.data.iter().map(|x| x * x).sum()
    }

    fn col(&self, c: usize) -> Vec<f64> {
        (0..self.rows).map(|r| self.at(r, c)).collect()
    }
}

fn dot(a: &[f64], b: &[f64]) -> f64 {
    a.iter().zip(b).map(|(x, y)| x * y).sum()
}

/// Thin QR of an m×n matrix by modified Gram-Schmidt applied twice. Columns that are numerically dependent come
/// out as zero columns of Q (and zero rows of R), which keeps `Q·R = A` and is harmless downstream.
pub fn qr(a: &Mat) -> (Mat, Mat) {
    let (m, n) = (a.rows, a.cols);
    let mut q: Vec<Vec<f64>> = (0..n).map(|c| a.col(c)).collect();
    let mut r = Mat::zeros(n, n);
    let scale = a.frob2().sqrt().max(f64::MIN_POSITIVE);
    for j in 0..n {
        for _pass in 0..2 {
            for i in 0..j {
                let (qi, qj) = {
                    let (lo, hi) = q.split_at_mut(j);
                    (&lo[i], &mut hi[0])
                };
                let p = dot(qi, qj);
                for (x, y) in qj.iter_mut().zip(qi) {
                    *x -= p * y;
                }
                r.set(i, j, r.at(i, j) + p);
            }
        }
        let nrm = dot(&q[j], &q[j]).sqrt();
        if nrm > 1e-12 * scale {
            r.set(j, j, nrm);
            q[j].iter_mut().for_each(|x| *x /= nrm);
        } else {
            r.set(j, j, 0.0);
            q[j].iter_mut().for_each(|x| *x = 0.0);
        }
    }
    let mut qm = Mat::zeros(m, n);
    for (c, col) in q.iter().enumerate() {
        for (rr, &v) in col.iter().enumerate() {
            qm.set(rr, c, v);
        }
    }
    (qm, r)
}

/// Thin SVD `A = U·diag(s)·Vᵀ` of an m×n matrix with m ≥ n by one-sided (Hestenes) Jacobi rotations of the
/// columns. Singular values come out sorted descending.
pub fn jacobi_svd(a: &Mat) -> (Mat, Vec<f64>, Mat) {
    let (m, n) = (a.rows, a.cols);
    assert!(m >= n, "jacobi_svd needs rows >= cols");
    let mut cols: Vec<Vec<f64>> = (0..n).map(|c| a.col(c)).collect();
    let mut v: Vec<Vec<f64>> = (0..n)
        .map(|c| (0..n).map(|r| if r == c { 1.0 } else { 0.0 }).collect())
        .collect();
    let eps = 1e-15;
    for _sweep in 0..60 {
        let mut rotated = false;
        for p in 0..n {
            for q in p + 1..n {
                let alpha = dot(&cols[p], &cols[p]);
                let beta = dot(&cols[q], &cols[q]);
                let gamma = dot(&cols[p], &cols[q]);
                if gamma.abs() <= eps * (alpha * beta).sqrt() || gamma == 0.0 {
                    continue;
                }
                rotated = true;
                let zeta = (beta - alpha) / (2.0 * gamma);
                let t = zeta.signum() / (zeta.abs() + (1.0 + zeta * zeta).sqrt());
                let c = 1.0 / (1.0 + t * t).sqrt();
                let s = c * t;
                for vecs in [&mut cols, &mut v] {
                    let (lo, hi) = vecs.split_at_mut(q);
                    for (x, y) in lo[p].iter_mut().zip(hi[0].iter_mut()) {
                        let (xp, yq) = (*x, *y);
                        *x = c * xp - s * yq;
                        *y = s * xp + c * yq;
                    }
                }
            }
        }
        if !rotated {
            break;
        }
    }
    let mut order: Vec<(f64, usize)> = cols
        .iter()
        .enumerate()
        .map(|(i, c)| (dot(c, c).sqrt(), i))
        .collect();
    order.sort_by(|x, y| y.0.total_cmp(&x.0));
    let mut u = Mat::zeros(m, n);
    let mut vm = Mat::zeros(n, n);
    let mut s = Vec::with_capacity(n);
    for (k, &(sv, i)) in order.iter().enumerate() {
        s.push(sv);
        for (r, &x) in cols[i].iter().enumerate() {
            u.set(r, k, if sv > 0.0 { x / sv } else { 0.0 });
        }
        for (r, &x) in v[i].iter().enumerate() {
            vm.set(r, k, x);
        }
    }
    (u, s, vm)
}

/// Truncated SVD of a dense matrix by randomized range finding (Halko–Martinsson–Tropp) with `power` subspace
/// iterations, then a small Jacobi SVD. Returns (left m×l, s, right n×l) with l = min(rank + oversample, m, n).
pub fn randomized_svd(
    a: &Mat,
    rank: usize,
    oversample: usize,
    power: usize,
    seed: u64,
) -> (Mat, Vec<f64>, Mat) {
    let l = (rank + oversample).min(a.rows).min(a.cols).max(1);
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let mut omega = Mat::zeros(a.cols, l);
    for x in omega.data.iter_mut() {
        *x = StandardNormal.sample(&mut rng);
    }
    let at = a.transpose();
    let (mut q, _) = qr(&a.matmul(&omega));
    for _ in 0..power {
        let (qz, _) = qr(&at.matmul(&q));
        q = qr(&a.matmul(&qz)).0;
    }
    // B = Qᵀ A (l×n); SVD of Bᵀ (n×l, tall) = U Σ Vᵀ gives A ≈ (Q V) Σ Uᵀ.
    let bt = at.matmul(&q);
    let (u, s, v) = jacobi_svd(&bt);
    (q.matmul(&v), s, u)
}
