//! Every kernel against a CPU reference computed here in f64: forward kernels against the formula (the
//! quantized products against hearth's own Q8_0 dequantization), backward kernels against central finite
//! differences of the f64 forward, so a wrong derivation cannot agree with itself.

use half::f16;
use hearth::gpu::ops::{
    self, AttentionShape, HeadTargets, LoraGrads, LoraShape, Rotation, SequenceShape,
};
use hearth::gpu::{Buffer, Gpu};
use hearth::model::q8;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use super::devices;

fn random(n: usize, seed: u64) -> Vec<f32> {
    let mut rng = StdRng::seed_from_u64(seed);
    (0..n).map(|_| rng.random_range(-1.0f32..1.0)).collect()
}

fn f64s(v: &[f32]) -> Vec<f64> {
    v.iter().map(|&x| x as f64).collect()
}

/// Max |got - want| within `tol` of the reference's scale.
fn close(what: &str, got: &[f32], want: &[f64], tol: f64) {
    assert_eq!(got.len(), want.len(), "{what}: length");
    let scale = want.iter().fold(1.0f64, |m, v| m.max(v.abs()));
    let (i, err) = got
        .iter()
        .zip(want)
        .map(|(g, w)| (*g as f64 - w).abs())
        .enumerate()
        .fold((0, 0.0), |a, (i, e)| if e > a.1 { (i, e) } else { a });
    assert!(
        err <= tol * scale,
        "{what}: max error {err:.3e} at {i} (got {}, want {}), tolerance {:.1e}",
        got[i],
        want[i],
        tol * scale
    );
}

/// `d(Σ dy · f(x)) / dx` by central differences.
fn numeric_grad(x: &[f64], dy: &[f64], f: impl Fn(&[f64]) -> Vec<f64>) -> Vec<f64> {
    let h = 1e-6;
    (0..x.len())
        .map(|i| {
            let mut p = x.to_vec();
            p[i] += h;
            let up: f64 = f(&p).iter().zip(dy).map(|(a, b)| a * b).sum();
            p[i] -= 2.0 * h;
            let down: f64 = f(&p).iter().zip(dy).map(|(a, b)| a * b).sum();
            (up - down) / (2.0 * h)
        })
        .collect()
}

/// Q8_0 bytes of `[n, k]` values, quantized as GGUF does (scale amax / 127 as f16, round to nearest).
fn quantize(w: &[f32], k: usize) -> Vec<u8> {
    let mut out = Vec::new();
    for row in w.chunks(k) {
        for block in row.chunks(32) {
            let amax = block.iter().fold(0.0f32, |m, v| m.max(v.abs()));
            let d = f16::from_f32(amax / 127.0);
            let inv = if d.to_f32() == 0.0 {
                0.0
            } else {
                1.0 / d.to_f32()
            };
            out.extend_from_slice(&d.to_bits().to_le_bytes());
            out.extend(block.iter().map(|v| (v * inv).round() as i8 as u8));
        }
    }
    out
}

fn up<T: hearth::gpu::Pod>(gpu: &Gpu, v: &[T]) -> Buffer<T> {
    gpu.upload(v).unwrap()
}

fn down(gpu: &Gpu, b: &Buffer<f32>) -> Vec<f32> {
    gpu.download(b).unwrap()
}

#[test]
fn q8_matmul_matches_the_dequantized_product() {
    for gpu in devices("q8_matmul_matches_the_dequantized_product") {
        for (m, k, n) in [(1, 576, 96), (11, 1536, 40), (8, 64, 3)] {
            let bytes = quantize(&random(n * k, 1), k);
            let mut w = vec![0f32; n * k];
            q8::dequantize(&bytes, k, &mut w).unwrap();
            let x = random(m * k, 2);
            let want: Vec<f64> = (0..m * n)
                .map(|i| {
                    let (r, o) = (i / n, i % n);
                    (0..k)
                        .map(|j| x[r * k + j] as f64 * w[o * k + j] as f64)
                        .sum()
                })
                .collect();
            let (wb, xb, yb) = (up(&gpu, &bytes), up(&gpu, &x), gpu.zeros(m * n).unwrap());
            ops::q8_matmul(&gpu, &wb, &xb, &yb, (m, k, n)).unwrap();
            close(
                &format!("q8_matmul {m}x{k}x{n}"),
                &down(&gpu, &yb),
                &want,
                1e-5,
            );
        }
    }
}

/// The serving product with int8 activations against the CPU path's own: each row quantized by
/// `q8::QuantizedRows` and multiplied by `q8::matvec_quantized_many`. Both round alike, so they differ in the
/// order of float additions only.
#[test]
fn q8_matmul_q8_matches_the_cpu_int8_product() {
    for gpu in devices("q8_matmul_q8_matches_the_cpu_int8_product") {
        for (m, k, n) in [(1, 576, 96), (11, 1536, 40), (8, 64, 3)] {
            let bytes = quantize(&random(n * k, 3), k);
            let mut x = random(m * k, 4);
            // A zero block and a large one: a zero scale, and values far from the rest.
            x[..32].iter_mut().for_each(|v| *v = 0.0);
            x[32..64].iter_mut().for_each(|v| *v *= 300.0);
            let mut want = Vec::with_capacity(m * n);
            for row in x.chunks(k) {
                let q = q8::QuantizedRows::new(row, k).unwrap();
                let mut y = vec![0f32; n];
                q8::matvec_quantized_many(&q, &mut [(&bytes[..], &mut y[..])]).unwrap();
                want.extend(y.iter().map(|&v| v as f64));
            }
            let (wb, xb, yb) = (up(&gpu, &bytes), up(&gpu, &x), gpu.zeros(m * n).unwrap());
            let (qb, db) = (
                gpu.zeros::<i8>(m * k).unwrap(),
                gpu.zeros::<f32>(m * k / 32).unwrap(),
            );
            ops::quantize_q8(&gpu, &xb, &qb, &db, (m, k)).unwrap();
            ops::q8_matmul_q8(&gpu, &wb, (&qb, &db), &yb, (m, k, n)).unwrap();
            close(
                &format!("q8_matmul_q8 {m}x{k}x{n}"),
                &down(&gpu, &yb),
                &want,
                1e-5,
            );
            // The int8 product is not the f32 one: an f32 kernel would fail the check above.
            let mut w = vec![0f32; n * k];
            q8::dequantize(&bytes, k, &mut w).unwrap();
            let scale = want.iter().fold(1f64, |a, v| a.max(v.abs()));
            let off = (0..m * n)
                .map(|i| {
                    let (r, o) = (i / n, i % n);
                    let f: f64 = (0..k)
                        .map(|j| x[r * k + j] as f64 * w[o * k + j] as f64)
                        .sum();
                    (f - want[i]).abs()
                })
                .fold(0f64, f64::max);
            assert!(off > 1e-5 * scale, "{m}x{k}x{n}: {off}");
        }
        let (qb, db) = (gpu.zeros::<i8>(64).unwrap(), gpu.zeros::<f32>(2).unwrap());
        let e = ops::quantize_q8(&gpu, &up(&gpu, &[0f32; 48]), &qb, &db, (1, 48)).unwrap_err();
        assert!(e.to_string().contains("multiple of 32"), "{e}");
    }
}

#[test]
fn q8_matmul_t_matches_the_dequantized_transpose_product() {
    for gpu in devices("q8_matmul_t_matches_the_dequantized_transpose_product") {
        for (m, k, n) in [(1, 576, 96), (13, 320, 50)] {
            let bytes = quantize(&random(n * k, 3), k);
            let mut w = vec![0f32; n * k];
            q8::dequantize(&bytes, k, &mut w).unwrap();
            let dy = random(m * n, 4);
            let want: Vec<f64> = (0..m * k)
                .map(|i| {
                    let (r, j) = (i / k, i % k);
                    (0..n)
                        .map(|o| dy[r * n + o] as f64 * w[o * k + j] as f64)
                        .sum()
                })
                .collect();
            let (wb, dyb, dxb) = (up(&gpu, &bytes), up(&gpu, &dy), gpu.zeros(m * k).unwrap());
            ops::q8_matmul_t(&gpu, &wb, &dyb, &dxb, (m, k, n)).unwrap();
            close(
                &format!("q8_matmul_t {m}x{k}x{n}"),
                &down(&gpu, &dxb),
                &want,
                1e-5,
            );
        }
    }
}

/// Each block type's products against the f64 products of candle's own dequantization of the same bytes (an
/// independent reading of the GGUF layouts).
#[test]
fn kquant_products_match_candles_dequantization() {
    use candle_core::quantized::{GgmlDType, QTensor};
    use candle_core::{Device, Tensor};
    for gpu in devices("kquant_products_match_candles_dequantization") {
        for dtype in super::decode::BLOCK_TYPES {
            let (m, k, n) = (3, 512, 24);
            // Rows of different ranges and offsets, so that scales and minimums differ across blocks.
            let w: Vec<f32> = random(n * k, 50)
                .iter()
                .enumerate()
                .map(|(i, v)| v * (1.0 + (i / 32 % 7) as f32) + ((i / 256) % 3) as f32 * 0.3)
                .collect();
            let t = Tensor::from_vec(w, (n, k), &Device::Cpu).unwrap();
            let q = QTensor::quantize(&t, dtype).unwrap();
            let bytes = q.data().unwrap().into_owned();
            let deq: Vec<f32> = q
                .dequantize(&Device::Cpu)
                .unwrap()
                .flatten_all()
                .unwrap()
                .to_vec1()
                .unwrap();
            let (x, dy) = (random(m * k, 51), random(m * n, 52));
            let y_want: Vec<f64> = (0..m * n)
                .map(|i| {
                    let (r, o) = (i / n, i % n);
                    (0..k)
                        .map(|j| x[r * k + j] as f64 * deq[o * k + j] as f64)
                        .sum()
                })
                .collect();
            let dx_want: Vec<f64> = (0..m * k)
                .map(|i| {
                    let (r, j) = (i / k, i % k);
                    (0..n)
                        .map(|o| dy[r * n + o] as f64 * deq[o * k + j] as f64)
                        .sum()
                })
                .collect();
            let wb = up(&gpu, &bytes);
            let (xb, yb) = (up(&gpu, &x), gpu.zeros(m * n).unwrap());
            ops::kq_matmul(&gpu, dtype, &wb, &xb, &yb, (m, k, n)).unwrap();
            close(
                &format!("kq_matmul {dtype:?}"),
                &down(&gpu, &yb),
                &y_want,
                1e-5,
            );
            let (dyb, dxb) = (up(&gpu, &dy), gpu.zeros(m * k).unwrap());
            ops::kq_matmul_t(&gpu, dtype, &wb, &dyb, &dxb, (m, k, n)).unwrap();
            close(
                &format!("kq_matmul_t {dtype:?}"),
                &down(&gpu, &dxb),
                &dx_want,
                1e-5,
            );
            // A short weight buffer, or rows that are not whole blocks, are refused before launching.
            let e = ops::kq_matmul(&gpu, dtype, &wb, &xb, &yb, (m, k, n + 1)).unwrap_err();
            assert!(e.to_string().contains("the weight"), "{e}");
            let e = ops::kq_matmul(&gpu, dtype, &wb, &xb, &yb, (m, k - 16, n)).unwrap_err();
            assert!(e.to_string().contains("multiple"), "{e}");
        }
        let e = ops::kq_matmul(
            &gpu,
            GgmlDType::Q8_1,
            &gpu.zeros::<u8>(64).unwrap(),
            &gpu.zeros::<f32>(32).unwrap(),
            &gpu.zeros::<f32>(1).unwrap(),
            (1, 32, 1),
        )
        .unwrap_err();
        assert!(e.to_string().contains("Q8_1"), "{e}");
    }
}

#[test]
fn q8_products_refuse_short_buffers() {
    for gpu in devices("q8_products_refuse_short_buffers") {
        let (w, x, y) = (
            gpu.zeros::<u8>(34).unwrap(),
            gpu.zeros::<f32>(64).unwrap(),
            gpu.zeros::<f32>(2).unwrap(),
        );
        let e = ops::q8_matmul(&gpu, &w, &x, &y, (1, 64, 2)).unwrap_err();
        assert!(e.to_string().contains("the weight holds 34"), "{e}");
        let e = ops::q8_matmul(&gpu, &w, &x, &y, (1, 48, 1)).unwrap_err();
        assert!(e.to_string().contains("not a multiple of 32"), "{e}");
    }
}

fn rms_norm_ref(x: &[f64], w: &[f64], n: usize, eps: f64) -> Vec<f64> {
    x.chunks(n)
        .flat_map(|r| {
            let m = (r.iter().map(|v| v * v).sum::<f64>() / n as f64 + eps).sqrt();
            r.iter().zip(w).map(move |(v, w)| v / m * w)
        })
        .collect()
}

#[test]
fn rms_norm_and_its_backward_match_the_reference() {
    for gpu in devices("rms_norm_and_its_backward_match_the_reference") {
        let (rows, n, eps) = (3, 576, 1e-5f32);
        let (x, w, dy) = (random(rows * n, 5), random(n, 6), random(rows * n, 7));
        let (xd, wd, dyd) = (f64s(&x), f64s(&w), f64s(&dy));
        let (xb, wb, dyb) = (up(&gpu, &x), up(&gpu, &w), up(&gpu, &dy));
        let yb = gpu.zeros(rows * n).unwrap();
        ops::rms_norm(&gpu, &xb, &wb, &yb, (rows, n), eps).unwrap();
        close(
            "rms_norm",
            &down(&gpu, &yb),
            &rms_norm_ref(&xd, &wd, n, eps as f64),
            1e-5,
        );

        let (dxb, dwb) = (gpu.zeros(rows * n).unwrap(), gpu.zeros(n).unwrap());
        ops::rms_norm_backward(&gpu, &xb, &wb, &dyb, &dxb, &dwb, (rows, n), eps).unwrap();
        let dx = numeric_grad(&xd, &dyd, |x| rms_norm_ref(x, &wd, n, eps as f64));
        let dw = numeric_grad(&wd, &dyd, |w| rms_norm_ref(&xd, w, n, eps as f64));
        close("rms_norm_backward dx", &down(&gpu, &dxb), &dx, 1e-4);
        close("rms_norm_backward dw", &down(&gpu, &dwb), &dw, 1e-4);
    }
}

fn rope_ref(
    x: &[f64],
    cos: &[f64],
    sin: &[f64],
    pos: &[i32],
    hd: usize,
    interleaved: bool,
) -> Vec<f64> {
    let half = hd / 2;
    let heads_per_row = x.len() / pos.len() / hd;
    let mut out = x.to_vec();
    for (h, head) in out.chunks_mut(hd).enumerate() {
        let p = pos[h / heads_per_row] as usize;
        for i in 0..half {
            let (a, b) = if interleaved {
                (2 * i, 2 * i + 1)
            } else {
                (i, i + half)
            };
            let (c, s) = (cos[p * half + i], sin[p * half + i]);
            let (xa, xb) = (head[a], head[b]);
            head[a] = xa * c - xb * s;
            head[b] = xa * s + xb * c;
        }
    }
    out
}

#[test]
fn rope_rotates_both_layouts_and_inverts() {
    for gpu in devices("rope_rotates_both_layouts_and_inverts") {
        let (rows, heads, hd, positions) = (4, 3, 64, 50);
        let half = hd / 2;
        let angle = |p: usize, i: usize| p as f64 / 10000f64.powf(2.0 * i as f64 / hd as f64);
        let cos: Vec<f32> = (0..positions * half)
            .map(|j| angle(j / half, j % half).cos() as f32)
            .collect();
        let sin: Vec<f32> = (0..positions * half)
            .map(|j| angle(j / half, j % half).sin() as f32)
            .collect();
        let pos = vec![0i32, 7, 31, 49];
        let x = random(rows * heads * hd, 8);
        let (cb, sb, pb) = (up(&gpu, &cos), up(&gpu, &sin), up(&gpu, &pos));
        for interleaved in [true, false] {
            let xb = up(&gpu, &x);
            let shape = (rows, heads, hd);
            ops::rope(
                &gpu,
                &xb,
                &cb,
                &sb,
                &pb,
                shape,
                interleaved,
                Rotation::Forward,
            )
            .unwrap();
            let want = rope_ref(&f64s(&x), &f64s(&cos), &f64s(&sin), &pos, hd, interleaved);
            close(
                &format!("rope interleaved={interleaved}"),
                &down(&gpu, &xb),
                &want,
                1e-5,
            );
            ops::rope(
                &gpu,
                &xb,
                &cb,
                &sb,
                &pb,
                shape,
                interleaved,
                Rotation::Inverse,
            )
            .unwrap();
            close("rope inverse", &down(&gpu, &xb), &f64s(&x), 1e-5);
        }
    }
}

/// Causal attention of `rows` queries at positions `start..start + rows` over the cache, in f64.
#[allow(clippy::too_many_arguments)]
fn attention_ref(
    q: &[f32],
    kc: &[f32],
    vc: &[f32],
    s: AttentionShape,
    start: usize,
    rows: usize,
    scale: f64,
) -> Vec<f64> {
    let hd = s.head_dim;
    let mut want = vec![0f64; rows * s.heads * hd];
    for r in 0..rows {
        let n = start + r + 1;
        for h in 0..s.heads {
            let kvh = h / (s.heads / s.kv_heads);
            let base = kvh * s.capacity * hd;
            let qh = &q[(r * s.heads + h) * hd..][..hd];
            let scores: Vec<f64> = (0..n)
                .map(|t| {
                    (0..hd)
                        .map(|d| qh[d] as f64 * kc[base + t * hd + d] as f64)
                        .sum::<f64>()
                        * scale
                })
                .collect();
            let mx = scores.iter().cloned().fold(f64::MIN, f64::max);
            let e: Vec<f64> = scores.iter().map(|v| (v - mx).exp()).collect();
            let sum: f64 = e.iter().sum();
            for d in 0..hd {
                want[(r * s.heads + h) * hd + d] = (0..n)
                    .map(|t| e[t] * vc[base + t * hd + d] as f64)
                    .sum::<f64>()
                    / sum;
            }
        }
    }
    want
}

#[test]
fn attention_decode_matches_the_reference() {
    for gpu in devices("attention_decode_matches_the_reference") {
        let s = AttentionShape {
            heads: 9,
            kv_heads: 3,
            head_dim: 64,
            capacity: 40,
        };
        let hd = s.head_dim;
        let scale = 1.0 / (hd as f32).sqrt();
        let kc = random(s.kv_heads * s.capacity * hd, 10);
        let vc = random(s.kv_heads * s.capacity * hd, 11);
        let (kb, vb) = (up(&gpu, &kc), up(&gpu, &vc));
        // One decode row at position 28 (29 positions read), then a prefill of 7 rows from position 20.
        for (start, rows) in [(28usize, 1usize), (20, 7)] {
            let q = random(rows * s.heads * hd, 9 + rows as u64);
            let want = attention_ref(&q, &kc, &vc, s, start, rows, scale as f64);
            let qb = up(&gpu, &q);
            let (ob, pb) = (
                gpu.zeros(rows * s.heads * hd).unwrap(),
                up(&gpu, &[start as i32]),
            );
            ops::attention_decode(&gpu, &qb, &kb, &vb, &ob, &pb, rows, s, scale).unwrap();
            close(
                &format!("attention_decode rows={rows}"),
                &down(&gpu, &ob),
                &want,
                1e-5,
            );
            // The position is read on the device: an earlier one changes the result without a new launch shape.
            gpu.write(&pb, &[5]).unwrap();
            ops::attention_decode(&gpu, &qb, &kb, &vb, &ob, &pb, rows, s, scale).unwrap();
            close(
                &format!("attention_decode rows={rows} at 5"),
                &down(&gpu, &ob),
                &attention_ref(&q, &kc, &vc, s, 5, rows, scale as f64),
                1e-5,
            );
        }
        // Rows past the cache are refused before launching, not read out of bounds.
        let big = AttentionShape {
            capacity: ops::ATTENTION_MAX_POSITIONS + 1,
            ..s
        };
        let (qb, ob, pb) = (
            gpu.zeros::<f32>(s.heads * hd).unwrap(),
            gpu.zeros::<f32>(s.heads * hd).unwrap(),
            up(&gpu, &[0i32]),
        );
        let e = ops::attention_decode(&gpu, &qb, &kb, &vb, &ob, &pb, 1, big, scale).unwrap_err();
        assert!(e.to_string().contains("positions"), "{e}");
    }
}

fn silu_mul_ref(g: &[f64], u: &[f64]) -> Vec<f64> {
    g.iter()
        .zip(u)
        .map(|(g, u)| g / (1.0 + (-g).exp()) * u)
        .collect()
}

#[test]
fn silu_mul_and_its_backward_match_the_reference() {
    for gpu in devices("silu_mul_and_its_backward_match_the_reference") {
        let n = 1000;
        let (g, u, dy) = (random(n, 12), random(n, 13), random(n, 14));
        let (gd, ud, dyd) = (f64s(&g), f64s(&u), f64s(&dy));
        let (gb, ub, dyb) = (up(&gpu, &g), up(&gpu, &u), up(&gpu, &dy));
        let ob = gpu.zeros(n).unwrap();
        ops::silu_mul(&gpu, &gb, &ub, &ob, n).unwrap();
        close("silu_mul", &down(&gpu, &ob), &silu_mul_ref(&gd, &ud), 1e-6);
        let (dgb, dub) = (gpu.zeros(n).unwrap(), gpu.zeros(n).unwrap());
        ops::silu_mul_backward(&gpu, &gb, &ub, &dyb, (&dgb, &dub), n).unwrap();
        // Elementwise: the finite difference of each element alone.
        let dg = numeric_grad(&gd, &dyd, |g| silu_mul_ref(g, &ud));
        let du = numeric_grad(&ud, &dyd, |u| silu_mul_ref(&gd, u));
        close("silu_mul_backward dg", &down(&gpu, &dgb), &dg, 1e-5);
        close("silu_mul_backward du", &down(&gpu, &dub), &du, 1e-5);
        // Gemma's gate over a wider range (the tanh saturates both ways).
        let g3: Vec<f32> = g.iter().map(|x| x * 6.0).collect();
        let want: Vec<f64> = g3
            .iter()
            .zip(&u)
            .map(|(&x, &u)| {
                let x = x as f64;
                let t = (0.797_884_560_802_865_4 * (x + 0.044715 * x * x * x)).tanh();
                0.5 * x * (1.0 + t) * u as f64
            })
            .collect();
        let gb3 = up(&gpu, &g3);
        ops::gelu_mul(&gpu, &gb3, &ub, &ob, n).unwrap();
        close("gelu_mul", &down(&gpu, &ob), &want, 1e-6);
        let gelu_ref = |g: &[f64], u: &[f64]| -> Vec<f64> {
            g.iter()
                .zip(u)
                .map(|(&x, &u)| {
                    0.5 * x
                        * (1.0 + (0.797_884_560_802_865_4 * (x + 0.044715 * x * x * x)).tanh())
                        * u
                })
                .collect()
        };
        let g3d = f64s(&g3);
        ops::gelu_mul_backward(&gpu, &gb3, &ub, &dyb, (&dgb, &dub), n).unwrap();
        let dg = numeric_grad(&g3d, &dyd, |g| gelu_ref(g, &ud));
        let du = numeric_grad(&ud, &dyd, |u| gelu_ref(&g3d, u));
        close("gelu_mul_backward dg", &down(&gpu, &dgb), &dg, 1e-5);
        close("gelu_mul_backward du", &down(&gpu, &dub), &du, 1e-5);
    }
}

fn softmax_ref(x: &[f64], cols: usize, causal: bool) -> Vec<f64> {
    x.chunks(cols)
        .enumerate()
        .flat_map(|(r, row)| {
            let valid = if causal { r % cols + 1 } else { cols };
            let mx = row[..valid].iter().cloned().fold(f64::MIN, f64::max);
            let sum: f64 = row[..valid].iter().map(|v| (v - mx).exp()).sum();
            (0..cols).map(move |j| {
                if j < valid {
                    (row[j] - mx).exp() / sum
                } else {
                    0.0
                }
            })
        })
        .collect()
}

#[test]
fn softmax_and_its_backward_match_the_reference() {
    for gpu in devices("softmax_and_its_backward_match_the_reference") {
        let (rows, cols) = (2 * 24, 24);
        let x = random(rows * cols, 15)
            .iter()
            .map(|v| v * 8.0)
            .collect::<Vec<_>>();
        let dy = random(rows * cols, 16);
        let (xd, dyd) = (f64s(&x), f64s(&dy));
        let xb = up(&gpu, &x);
        for causal in [false, true] {
            let yb = gpu.zeros(rows * cols).unwrap();
            ops::softmax_rows(&gpu, &xb, &yb, (rows, cols), causal).unwrap();
            let y = down(&gpu, &yb);
            close(
                &format!("softmax causal={causal}"),
                &y,
                &softmax_ref(&xd, cols, causal),
                1e-6,
            );
            let (dyb, dxb) = (up(&gpu, &dy), gpu.zeros(rows * cols).unwrap());
            ops::softmax_backward(&gpu, &yb, &dyb, &dxb, (rows, cols)).unwrap();
            let dx = numeric_grad(&xd, &dyd, |x| softmax_ref(x, cols, causal));
            close(
                &format!("softmax_backward causal={causal}"),
                &down(&gpu, &dxb),
                &dx,
                1e-5,
            );
        }
    }
}

/// Training's causal attention over one sequence in f64: `q` `[len, heads, hd]`, `k`, `v` `[len, kv, hd]`.
fn train_attention_ref(q: &[f64], k: &[f64], v: &[f64], s: SequenceShape, scale: f64) -> Vec<f64> {
    let (len, nh, nkv, hd) = (s.len, s.heads, s.kv_heads, s.head_dim);
    let mut ctx = vec![0f64; len * nh * hd];
    for h in 0..nh {
        let c = h / (nh / nkv);
        for i in 0..len {
            let scores: Vec<f64> = (0..=i)
                .map(|j| {
                    (0..hd)
                        .map(|d| q[(i * nh + h) * hd + d] * k[(j * nkv + c) * hd + d])
                        .sum::<f64>()
                        * scale
                })
                .collect();
            let mx = scores.iter().cloned().fold(f64::MIN, f64::max);
            let e: Vec<f64> = scores.iter().map(|x| (x - mx).exp()).collect();
            let sum: f64 = e.iter().sum();
            for d in 0..hd {
                ctx[(i * nh + h) * hd + d] = (0..=i)
                    .map(|j| e[j] / sum * v[(j * nkv + c) * hd + d])
                    .sum();
            }
        }
    }
    ctx
}

#[test]
fn training_attention_and_its_backward_match_the_reference() {
    for gpu in devices("training_attention_and_its_backward_match_the_reference") {
        let s = SequenceShape {
            len: 7,
            heads: 6,
            kv_heads: 2,
            head_dim: 8,
        };
        let scale = 1.0 / (s.head_dim as f32).sqrt();
        let (nq, nk, ns) = (
            s.len * s.heads * s.head_dim,
            s.len * s.kv_heads * s.head_dim,
            s.heads * s.len * s.len,
        );
        let (q, k, v, dctx) = (
            random(nq, 40).iter().map(|x| x * 3.0).collect::<Vec<_>>(),
            random(nk, 41).iter().map(|x| x * 3.0).collect::<Vec<_>>(),
            random(nk, 42),
            random(nq, 43),
        );
        let (qd, kd, vd, gd) = (f64s(&q), f64s(&k), f64s(&v), f64s(&dctx));
        let (qb, kb, vb, gb) = (up(&gpu, &q), up(&gpu, &k), up(&gpu, &v), up(&gpu, &dctx));
        let zeros = |n: usize| gpu.zeros::<f32>(n).unwrap();
        let (sb, pb, ctxb) = (zeros(ns), zeros(ns), zeros(nq));
        ops::attention_scores(&gpu, &qb, &kb, &sb, s, scale).unwrap();
        ops::softmax_rows(&gpu, &sb, &pb, (s.heads * s.len, s.len), true).unwrap();
        ops::attention_context(&gpu, &pb, &vb, &ctxb, s).unwrap();
        let sc = scale as f64;
        close(
            "attention_context",
            &down(&gpu, &ctxb),
            &train_attention_ref(&qd, &kd, &vd, s, sc),
            1e-5,
        );
        let (dpb, dsb, dqb, dkb, dvb) = (zeros(ns), zeros(ns), zeros(nq), zeros(nk), zeros(nk));
        ops::attention_grad_probs(&gpu, &gb, &vb, &dpb, s).unwrap();
        ops::softmax_backward(&gpu, &pb, &dpb, &dsb, (s.heads * s.len, s.len)).unwrap();
        ops::attention_grad_q(&gpu, &dsb, &kb, &dqb, s, scale).unwrap();
        ops::attention_grad_kv(&gpu, (&dsb, &pb), (&qb, &gb), (&dkb, &dvb), s, scale).unwrap();
        let dq = numeric_grad(&qd, &gd, |x| train_attention_ref(x, &kd, &vd, s, sc));
        let dk = numeric_grad(&kd, &gd, |x| train_attention_ref(&qd, x, &vd, s, sc));
        let dv = numeric_grad(&vd, &gd, |x| train_attention_ref(&qd, &kd, x, s, sc));
        close("attention_grad_q", &down(&gpu, &dqb), &dq, 1e-5);
        close("attention_grad_kv: keys", &down(&gpu, &dkb), &dk, 1e-5);
        close("attention_grad_kv: values", &down(&gpu, &dvb), &dv, 1e-5);
        // A sequence the probabilities buffer cannot hold is refused before launching.
        let long = SequenceShape { len: 8, ..s };
        let e = ops::attention_scores(&gpu, &qb, &kb, &sb, long, scale).unwrap_err();
        assert!(e.to_string().contains("holds"), "{e}");
    }
}

/// Each row's weighted target log-probability, as `head_logps` defines it, in f64.
fn head_ref(logits: &[f64], vocab: usize, targets: &[Vec<(u32, f32)>]) -> Vec<f64> {
    logits
        .chunks(vocab)
        .zip(targets)
        .map(|(row, t)| {
            let mx = row.iter().cloned().fold(f64::MIN, f64::max);
            let lse = mx + row.iter().map(|x| (x - mx).exp()).sum::<f64>().ln();
            t.iter()
                .map(|&(id, w)| w as f64 * (row[id as usize] - lse))
                .sum()
        })
        .collect()
}

#[test]
fn head_logps_and_its_backward_match_the_reference() {
    for gpu in devices("head_logps_and_its_backward_match_the_reference") {
        let vocab = 300;
        // A token, nothing, a teacher's three tokens, a token again.
        let targets: Vec<Vec<(u32, f32)>> = vec![
            vec![(7, 1.0)],
            vec![],
            vec![(299, 0.5), (0, 0.3), (7, 0.2)],
            vec![(150, 1.0)],
        ];
        let rows = targets.len();
        let mut offsets = vec![0usize];
        let (mut ids, mut weights) = (Vec::new(), Vec::new());
        for t in &targets {
            ids.extend(t.iter().map(|p| p.0));
            weights.extend(t.iter().map(|p| p.1));
            offsets.push(ids.len());
        }
        let ht = HeadTargets::new(&gpu, &offsets, &ids, &weights, vocab).unwrap();
        let logits = random(rows * vocab, 44)
            .iter()
            .map(|x| x * 6.0)
            .collect::<Vec<_>>();
        let dlp = random(rows, 45);
        let (lb, lpb, dlpb) = (
            up(&gpu, &logits),
            gpu.zeros::<f32>(rows).unwrap(),
            up(&gpu, &dlp),
        );
        ops::head_logps(&gpu, &lb, &ht, &lpb, vocab).unwrap();
        let ld = f64s(&logits);
        let lp = down(&gpu, &lpb);
        close("head_logps", &lp, &head_ref(&ld, vocab, &targets), 1e-6);
        assert_eq!(lp[1], 0.0, "a row without targets scores 0");
        ops::head_logps_backward(&gpu, &lb, &ht, &dlpb, vocab).unwrap();
        let want = numeric_grad(&ld, &f64s(&dlp), |x| head_ref(x, vocab, &targets));
        close("head_logps_backward", &down(&gpu, &lb), &want, 1e-6);
        // Targets outside the vocabulary never reach the device.
        let e = HeadTargets::new(&gpu, &[0, 1], &[300], &[1.0], vocab)
            .err()
            .expect("a target past the vocabulary is refused");
        assert!(e.to_string().contains("outside the vocabulary"), "{e}");
    }
}

/// `y + scale · (x·Aᵀ)·Bᵀ`.
fn lora_ref(x: &[f64], a: &[f64], b: &[f64], y: &[f64], s: LoraShape, scale: f64) -> Vec<f64> {
    let LoraShape { m, k, rank: r, n } = s;
    let t: Vec<f64> = (0..m * r)
        .map(|i| (0..k).map(|l| x[i / r * k + l] * a[i % r * k + l]).sum())
        .collect();
    (0..m * n)
        .map(|i| {
            y[i] + scale
                * (0..r)
                    .map(|l| t[i / n * r + l] * b[i % n * r + l])
                    .sum::<f64>()
        })
        .collect()
}

#[test]
fn lora_forward_and_backward_match_the_reference() {
    for gpu in devices("lora_forward_and_backward_match_the_reference") {
        let s = LoraShape {
            m: 5,
            k: 96,
            rank: 8,
            n: 40,
        };
        let scale = 2.0f32;
        let LoraShape { m, k, rank: r, n } = s;
        let (x, a, b, y, dy) = (
            random(m * k, 17),
            random(r * k, 18),
            random(n * r, 19),
            random(m * n, 20),
            random(m * n, 21),
        );
        let (xd, ad, bd, yd, dyd) = (f64s(&x), f64s(&a), f64s(&b), f64s(&y), f64s(&dy));
        let (xb, ab, bb, yb) = (up(&gpu, &x), up(&gpu, &a), up(&gpu, &b), up(&gpu, &y));
        let tb = gpu.zeros(m * r).unwrap();
        ops::lora_forward(&gpu, &xb, &ab, &bb, &tb, &yb, s, scale).unwrap();
        let sd = scale as f64;
        close(
            "lora_forward",
            &down(&gpu, &yb),
            &lora_ref(&xd, &ad, &bd, &yd, s, sd),
            1e-5,
        );

        let dx0 = random(m * k, 22);
        let (dab, dbb, dxb) = (
            gpu.zeros(r * k).unwrap(),
            gpu.zeros(n * r).unwrap(),
            up(&gpu, &dx0),
        );
        let grads = LoraGrads {
            da: &dab,
            db: &dbb,
            dx: &dxb,
        };
        let dyb = up(&gpu, &dy);
        ops::lora_backward(&gpu, &xb, &ab, &bb, &tb, &dyb, grads, s, scale).unwrap();
        let da = numeric_grad(&ad, &dyd, |a| lora_ref(&xd, a, &bd, &yd, s, sd));
        let db = numeric_grad(&bd, &dyd, |b| lora_ref(&xd, &ad, b, &yd, s, sd));
        let dx: Vec<f64> = numeric_grad(&xd, &dyd, |x| lora_ref(x, &ad, &bd, &yd, s, sd))
            .iter()
            .zip(&dx0)
            .map(|(g, d)| g + *d as f64)
            .collect();
        close("lora_backward da", &down(&gpu, &dab), &da, 1e-4);
        close("lora_backward db", &down(&gpu, &dbb), &db, 1e-4);
        close(
            "lora_backward dx (accumulated)",
            &down(&gpu, &dxb),
            &dx,
            1e-4,
        );
    }
}

/// A fresh adapter (B = 0, as PEFT and hearth initialise it) leaves the base output bitwise unchanged.
#[test]
fn a_fresh_adapter_is_bitwise_the_base() {
    for gpu in devices("a_fresh_adapter_is_bitwise_the_base") {
        let s = LoraShape {
            m: 3,
            k: 64,
            rank: 4,
            n: 32,
        };
        let y = random(s.m * s.n, 23);
        let (xb, ab) = (
            up(&gpu, &random(s.m * s.k, 24)),
            up(&gpu, &random(s.rank * s.k, 25)),
        );
        let (bb, tb, yb) = (
            gpu.zeros(s.n * s.rank).unwrap(),
            gpu.zeros(s.m * s.rank).unwrap(),
            up(&gpu, &y),
        );
        ops::lora_forward(&gpu, &xb, &ab, &bb, &tb, &yb, s, 2.0).unwrap();
        let got = down(&gpu, &yb);
        assert!(got.iter().zip(&y).all(|(g, w)| g.to_bits() == w.to_bits()));
    }
}

#[test]
fn add_kv_append_and_advance_write_what_they_name() {
    for gpu in devices("add_kv_append_and_advance_write_what_they_name") {
        let (x, d) = (random(300, 26), random(300, 27));
        let (xb, db) = (up(&gpu, &x), up(&gpu, &d));
        ops::add_into(&gpu, &xb, &db, 300).unwrap();
        let want: Vec<f64> = x
            .iter()
            .zip(&d)
            .map(|(a, b)| *a as f64 + *b as f64)
            .collect();
        close("add_into", &down(&gpu, &xb), &want, 1e-7);
        // Three rows of 100 scaled by one factor per column.
        let f = random(100, 28);
        let (yb, fb) = (up(&gpu, &x), up(&gpu, &f));
        ops::mul_rows(&gpu, &yb, &fb, (3, 100)).unwrap();
        let want: Vec<f64> = x
            .iter()
            .enumerate()
            .map(|(i, a)| *a as f64 * f[i % 100] as f64)
            .collect();
        close("mul_rows", &down(&gpu, &yb), &want, 1e-7);
        // Rows 2 and 0 of three gathered, then scattered back into rows 1 and 2 of a zeroed three.
        let idx = [2usize, 0];
        let ib = up(&gpu, &[2i32, 0]);
        let gb = gpu.zeros::<f32>(200).unwrap();
        ops::move_rows(&gpu, ops::RowMove::Gather, &xb, (&ib, &idx), &gb, 100).unwrap();
        let added: Vec<f32> = down(&gpu, &xb);
        let want: Vec<f64> = [&added[200..300], &added[..100]]
            .concat()
            .iter()
            .map(|v| *v as f64)
            .collect();
        close("gather_rows", &down(&gpu, &gb), &want, 0.0);
        let (sb, ib2) = (gpu.zeros::<f32>(300).unwrap(), up(&gpu, &[1i32, 2]));
        ops::move_rows(&gpu, ops::RowMove::Scatter, &gb, (&ib2, &[1, 2]), &sb, 100).unwrap();
        let mut want = vec![0f64; 100];
        want.extend(
            [&added[200..300], &added[..100]]
                .concat()
                .iter()
                .map(|v| *v as f64),
        );
        close("scatter_rows", &down(&gpu, &sb), &want, 0.0);
        // An index past the indexed buffer's rows is refused before launching.
        let e =
            ops::move_rows(&gpu, ops::RowMove::Gather, &xb, (&ib, &[3, 0]), &gb, 100).unwrap_err();
        assert!(e.to_string().contains("row 3 of 3"), "{e}");

        let s = AttentionShape {
            heads: 4,
            kv_heads: 2,
            head_dim: 8,
            capacity: 5,
        };
        let cache = gpu.zeros::<f32>(2 * 5 * 8).unwrap();
        let len = up(&gpu, &[0i32]);
        for step in 0..2 {
            let src: Vec<f32> = (0..16).map(|i| (step * 100 + i) as f32).collect();
            ops::kv_append(&gpu, &cache, &up(&gpu, &src), &len, 1, s).unwrap();
            ops::advance(&gpu, &len, 1).unwrap();
        }
        // Two rows at once (a prefill chunk) at positions 2 and 3.
        let src: Vec<f32> = (0..32).map(|i| (1000 + i) as f32).collect();
        ops::kv_append(&gpu, &cache, &up(&gpu, &src), &len, 2, s).unwrap();
        ops::advance(&gpu, &len, 2).unwrap();
        assert_eq!(gpu.download(&len).unwrap(), vec![4]);
        let c = down(&gpu, &cache);
        // Head 1, position 1, dim 3 holds step 1's value for index 1·8 + 3.
        assert_eq!(c[(5 + 1) * 8 + 3], 111.0);
        // Head 1, position 3 (the chunk's second row), dim 3: row 1's index 16 + 1·8 + 3.
        assert_eq!(c[(5 + 3) * 8 + 3], 1027.0);
        assert_eq!(c[4 * 8], 0.0, "position 4 is not written yet");

        // A bias on every row: x[r] += d.
        let (x, d) = (random(12, 28), random(4, 29));
        let xb = up(&gpu, &x);
        ops::add_rows(&gpu, &xb, &up(&gpu, &d), (3, 4)).unwrap();
        let want: Vec<f64> = (0..12).map(|i| x[i] as f64 + d[i % 4] as f64).collect();
        close("add_rows", &down(&gpu, &xb), &want, 1e-7);
    }
}
