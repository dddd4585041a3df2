//! The `emulated` device: every kernel entry point's semantics in plain Rust over host memory, behind the same
//! [`Runtime`] as the vendors' drivers. It runs the GPU path's host code (the shape checks and argument order in
//! `ops`, buffer management, graph capture and replay, and what a model builds over them) on a machine without
//! a GPU, so CI checks that code against the CPU model. It says nothing about the `.cu` sources themselves:
//! those are checked on a GPU against the same references (`tests/gpu`).
//!
//! Sums run in index order rather than in a block reduction's order, so results differ from a GPU's in the
//! last bits only.

use std::collections::HashMap;
use std::ffi::c_void;
use std::sync::Mutex;

use half::f16;

use super::{Func, GpuError, KERNELS, Runtime};
use crate::model::q8::{BLOCK_BYTES as Q8_BYTES, QK8_0 as QK};

/// One launch's grid and its arguments, each an 8-byte slot as the drivers receive it.
#[derive(Clone)]
struct Launch {
    entry: &'static str,
    grid: (u32, u32, u32),
    args: Vec<[u8; 8]>,
}

#[derive(Default)]
struct State {
    next: u64,
    memory: HashMap<u64, Vec<u8>>,
    /// Launches recorded since `begin_capture`, when capturing.
    capturing: Option<Vec<Launch>>,
    graphs: HashMap<usize, Vec<Launch>>,
    next_graph: usize,
}

pub(super) struct EmulatedRuntime {
    state: Mutex<State>,
}

impl EmulatedRuntime {
    pub(super) fn new() -> Self {
        Self {
            state: Mutex::new(State {
                // Non-zero, aligned addresses, so a null pointer is never a buffer.
                next: 0x1000,
                ..State::default()
            }),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }
}

fn fault(message: String) -> GpuError {
    GpuError::Driver {
        call: "emulated launch",
        message,
    }
}

impl Runtime for EmulatedRuntime {
    fn alloc(&self, bytes: usize) -> Result<u64, GpuError> {
        let mut s = self.lock();
        let ptr = s.next;
        s.next += (bytes as u64).div_ceil(256).max(1) * 256;
        s.memory.insert(ptr, vec![0u8; bytes]);
        Ok(ptr)
    }

    unsafe fn free(&self, ptr: u64) {
        self.lock().memory.remove(&ptr);
    }

    fn htod(&self, dst: u64, src: &[u8]) -> Result<(), GpuError> {
        let mut s = self.lock();
        let buf = s
            .memory
            .get_mut(&dst)
            .ok_or_else(|| fault(format!("copy to {dst:#x}, not a buffer")))?;
        let have = buf.len();
        buf.get_mut(..src.len())
            .ok_or_else(|| fault(format!("copy of {} bytes into {have}", src.len())))?
            .copy_from_slice(src);
        Ok(())
    }

    fn zero(&self, dst: u64, bytes: usize) -> Result<(), GpuError> {
        let mut s = self.lock();
        let buf = s
            .memory
            .get_mut(&dst)
            .ok_or_else(|| fault(format!("zeroing {dst:#x}, not a buffer")))?;
        let have = buf.len();
        buf.get_mut(..bytes)
            .ok_or_else(|| fault(format!("zeroing {bytes} bytes of {have}")))?
            .fill(0);
        Ok(())
    }

    fn dtoh(&self, src: u64, dst: &mut [u8]) -> Result<(), GpuError> {
        let s = self.lock();
        let buf = s
            .memory
            .get(&src)
            .ok_or_else(|| fault(format!("copy from {src:#x}, not a buffer")))?;
        let from = buf
            .get(..dst.len())
            .ok_or_else(|| fault(format!("copy of {} bytes from {}", dst.len(), buf.len())))?;
        dst.copy_from_slice(from);
        Ok(())
    }

    fn function(&self, entry: &'static str) -> Result<Func, GpuError> {
        let index = KERNELS
            .iter()
            .flat_map(|k| k.entries.iter())
            .position(|e| *e == entry)
            .ok_or_else(|| GpuError::Shape {
                op: "function",
                reason: format!("no kernel defines `{entry}`"),
            })?;
        Ok(Func(index))
    }

    unsafe fn launch(
        &self,
        f: Func,
        grid: (u32, u32, u32),
        _block: u32,
        _shared: u32,
        params: &mut [*mut c_void],
    ) -> Result<(), GpuError> {
        let entry = KERNELS
            .iter()
            .flat_map(|k| k.entries.iter())
            .nth(f.0)
            .copied()
            .ok_or_else(|| fault(format!("function {} was never loaded", f.0)))?;
        // SAFETY: the caller's contract: each parameter points at an 8-byte slot (`Gpu::launch`).
        let args = params
            .iter()
            .map(|p| unsafe { *(*p as *const [u8; 8]) })
            .collect();
        let launch = Launch { entry, grid, args };
        let mut s = self.lock();
        if let Some(recorded) = &mut s.capturing {
            recorded.push(launch);
            return Ok(());
        }
        run(&mut s.memory, &launch)
    }

    fn synchronize(&self) -> Result<(), GpuError> {
        Ok(())
    }

    fn describe(&self) -> String {
        "emulated (the kernels' semantics in Rust, on the CPU)".into()
    }

    fn begin_capture(&self) -> Result<(), GpuError> {
        let mut s = self.lock();
        if s.capturing.is_some() {
            return Err(fault("capture already begun".into()));
        }
        s.capturing = Some(Vec::new());
        Ok(())
    }

    fn end_capture(&self) -> Result<usize, GpuError> {
        let mut s = self.lock();
        let recorded = s
            .capturing
            .take()
            .ok_or_else(|| fault("no capture begun".into()))?;
        s.next_graph += 1;
        let handle = s.next_graph;
        s.graphs.insert(handle, recorded);
        Ok(handle)
    }

    fn replay(&self, graph: usize) -> Result<(), GpuError> {
        let mut s = self.lock();
        let launches = s
            .graphs
            .get(&graph)
            .cloned()
            .ok_or_else(|| fault(format!("graph {graph} does not exist")))?;
        launches.iter().try_for_each(|l| run(&mut s.memory, l))
    }

    unsafe fn release(&self, graph: usize) {
        self.lock().graphs.remove(&graph);
    }
}

/// A launch's arguments, read by position as the kernel's parameter list declares them.
struct Args<'a>(&'a [[u8; 8]]);

impl Args<'_> {
    fn slot(&self, i: usize) -> Result<[u8; 8], GpuError> {
        self.0
            .get(i)
            .copied()
            .ok_or_else(|| fault(format!("argument {i} missing")))
    }
    fn ptr(&self, i: usize) -> Result<u64, GpuError> {
        Ok(u64::from_ne_bytes(self.slot(i)?))
    }
    fn int(&self, i: usize) -> Result<usize, GpuError> {
        let b = self.slot(i)?;
        let v = i32::from_ne_bytes([b[0], b[1], b[2], b[3]]);
        usize::try_from(v).map_err(|_| fault(format!("argument {i} = {v} is negative")))
    }
    fn float(&self, i: usize) -> Result<f32, GpuError> {
        let b = self.slot(i)?;
        Ok(f32::from_ne_bytes([b[0], b[1], b[2], b[3]]))
    }
}

/// Device memory as the kernels see it: reads copy out, writes go through a closure over the buffer.
struct Memory<'a>(&'a mut HashMap<u64, Vec<u8>>);

impl Memory<'_> {
    fn bytes(&self, ptr: u64, n: usize) -> Result<&[u8], GpuError> {
        self.0
            .get(&ptr)
            .and_then(|b| b.get(..n))
            .ok_or_else(|| fault(format!("read of {n} bytes at {ptr:#x} out of bounds")))
    }

    fn f32s(&self, ptr: u64, n: usize) -> Result<Vec<f32>, GpuError> {
        Ok(self
            .bytes(ptr, n * 4)?
            .chunks_exact(4)
            .map(|c| f32::from_ne_bytes([c[0], c[1], c[2], c[3]]))
            .collect())
    }

    fn i32s(&self, ptr: u64, n: usize) -> Result<Vec<i32>, GpuError> {
        Ok(self
            .bytes(ptr, n * 4)?
            .chunks_exact(4)
            .map(|c| i32::from_ne_bytes([c[0], c[1], c[2], c[3]]))
            .collect())
    }

    /// Runs `f` over the first `n` f32 values at `ptr` and stores them back.
    fn write_f32(
        &mut self,
        ptr: u64,
        n: usize,
        f: impl FnOnce(&mut [f32]) -> Result<(), GpuError>,
    ) -> Result<(), GpuError> {
        let mut v = self.f32s(ptr, n)?;
        f(&mut v)?;
        let buf = self.0.get_mut(&ptr).expect("read above");
        for (dst, x) in buf.chunks_exact_mut(4).zip(&v) {
            dst.copy_from_slice(&x.to_ne_bytes());
        }
        Ok(())
    }

    fn write_bytes(&mut self, ptr: u64, data: &[u8]) -> Result<(), GpuError> {
        self.bytes(ptr, data.len())?;
        self.0.get_mut(&ptr).expect("read above")[..data.len()].copy_from_slice(data);
        Ok(())
    }

    fn write_i32(&mut self, ptr: u64, f: impl FnOnce(&mut i32)) -> Result<(), GpuError> {
        let mut v = self.i32s(ptr, 1)?[0];
        f(&mut v);
        self.0.get_mut(&ptr).expect("read above")[..4].copy_from_slice(&v.to_ne_bytes());
        Ok(())
    }
}

/// A device value used as an index (a position, a cache length), checked against its bound as the caller
/// promises it is.
fn index(v: i32, bound: usize, what: &str) -> Result<usize, GpuError> {
    usize::try_from(v)
        .ok()
        .filter(|&i| i <= bound)
        .ok_or_else(|| fault(format!("{what} = {v} outside 0..={bound}")))
}

/// Weight `[n_out, k]` in Q8_0 GGUF bytes, dequantized.
fn q8_weight(m: &Memory, ptr: u64, n_out: usize, k: usize) -> Result<Vec<f32>, GpuError> {
    let bytes = m.bytes(ptr, n_out * k / QK * Q8_BYTES)?;
    let mut w = Vec::with_capacity(n_out * k);
    for blk in bytes.chunks_exact(Q8_BYTES) {
        let d = f16::from_bits(u16::from_le_bytes([blk[0], blk[1]])).to_f32();
        w.extend(blk[2..].iter().map(|&q| d * (q as i8) as f32));
    }
    Ok(w)
}

/// Weights and bytes per block of the GGML type id `kq_matmul` takes.
fn kq_layout(id: usize) -> Result<(usize, usize), GpuError> {
    match id {
        2 => Ok((32, 18)),
        12 => Ok((256, 144)),
        13 => Ok((256, 176)),
        14 => Ok((256, 210)),
        other => Err(fault(format!("GGML type {other} is not read by kq_matmul"))),
    }
}

fn f16_at(b: &[u8]) -> f32 {
    f16::from_bits(u16::from_le_bytes([b[0], b[1]])).to_f32()
}

/// Weight `i` of a block of GGML type `id`, as `kernels/kquant.cu` reads it.
fn kq_weight(id: usize, b: &[u8], i: usize) -> f32 {
    match id {
        2 => {
            let q = if i < 16 {
                b[2 + i] & 0xF
            } else {
                b[2 + i - 16] >> 4
            };
            f16_at(b) * (q as f32 - 8.0)
        }
        14 => {
            let (half, quarter, l) = (i / 128, i % 128 / 32, i % 32);
            let (ql, qh) = (&b[64 * half..], &b[128 + 32 * half..]);
            let sc = b[192 + 8 * half + l / 16 + 2 * quarter] as i8;
            let lo = if quarter % 2 == 0 { ql[l] } else { ql[l + 32] };
            let nib = if quarter < 2 { lo & 0xF } else { lo >> 4 };
            let q = (nib | (((qh[l] >> (2 * quarter)) & 3) << 4)) as i32 - 32;
            f16_at(&b[208..]) * sc as f32 * q as f32
        }
        _ => {
            let (j, l) = (i / 32, i % 32);
            let s = &b[4..16];
            let (sc, m) = if j < 4 {
                (s[j] & 63, s[j + 4] & 63)
            } else {
                (
                    (s[j + 4] & 0xF) | ((s[j - 4] >> 6) << 4),
                    (s[j + 4] >> 4) | ((s[j] >> 6) << 4),
                )
            };
            let qs = &b[if id == 13 { 48 } else { 16 }..];
            let byte = qs[(j / 2) * 32 + l];
            let mut q = if j % 2 == 0 { byte & 0xF } else { byte >> 4 };
            if id == 13 {
                q += ((b[16 + l] >> j) & 1) << 4;
            }
            f16_at(b) * sc as f32 * q as f32 - f16_at(&b[2..]) * m as f32
        }
    }
}

/// A `[n_out, k]` weight of GGML type `id` in GGUF bytes, dequantized.
fn kq_weights(
    m: &Memory,
    ptr: u64,
    id: usize,
    n_out: usize,
    k: usize,
) -> Result<Vec<f32>, GpuError> {
    let (qk, bb) = kq_layout(id)?;
    let bytes = m.bytes(ptr, n_out * (k / qk) * bb)?;
    Ok(bytes
        .chunks_exact(bb)
        .flat_map(|b| (0..qk).map(move |i| kq_weight(id, b, i)))
        .collect())
}

fn rms(x: &[f32], eps: f32) -> f32 {
    (x.iter().map(|v| v * v).sum::<f32>() / x.len() as f32 + eps).sqrt()
}

fn sigmoid(x: f32) -> f32 {
    1.0 / (1.0 + (-x).exp())
}

/// One launch, as the kernel of the same name computes it (see its source in `kernels/`).
fn run(memory: &mut HashMap<u64, Vec<u8>>, l: &Launch) -> Result<(), GpuError> {
    let a = Args(&l.args);
    let mut m = Memory(memory);
    let blocks = l.grid.0 as usize;
    match l.entry {
        "q8_matmul" => {
            let (n_out, k, rows) = (a.int(3)?, a.int(4)?, a.int(5)?);
            let w = q8_weight(&m, a.ptr(0)?, n_out, k)?;
            let x = m.f32s(a.ptr(1)?, rows * k)?;
            m.write_f32(a.ptr(2)?, rows * n_out, |y| {
                for (xr, yr) in x.chunks_exact(k).zip(y.chunks_exact_mut(n_out)) {
                    for (wr, y) in w.chunks_exact(k).zip(yr) {
                        *y = wr.iter().zip(xr).map(|(w, x)| w * x).sum();
                    }
                }
                Ok(())
            })
        }
        "quantize_q8" => {
            let nb = a.int(3)?;
            let x = m.f32s(a.ptr(0)?, nb * QK)?;
            let (mut q, mut d) = (vec![0u8; nb * QK], vec![0f32; nb]);
            for ((xb, qb), d) in x.chunks_exact(QK).zip(q.chunks_exact_mut(QK)).zip(&mut d) {
                let amax = xb.iter().fold(0f32, |m, v| m.max(v.abs()));
                let scale = amax / 127.0;
                let inv = if scale != 0.0 { 1.0 / scale } else { 0.0 };
                for (q, v) in qb.iter_mut().zip(xb) {
                    *q = (v * inv).round() as i8 as u8;
                }
                *d = f16::from_f32(scale).to_f32();
            }
            m.write_bytes(a.ptr(1)?, &q)?;
            m.write_f32(a.ptr(2)?, nb, |out| {
                out.copy_from_slice(&d);
                Ok(())
            })
        }
        "q8_matmul_q8" => {
            let (n_out, k, rows) = (a.int(4)?, a.int(5)?, a.int(6)?);
            let nb = k / QK;
            let w = m.bytes(a.ptr(0)?, n_out * nb * Q8_BYTES)?.to_vec();
            let q = m.bytes(a.ptr(1)?, rows * k)?.to_vec();
            let d = m.f32s(a.ptr(2)?, rows * nb)?;
            m.write_f32(a.ptr(3)?, rows * n_out, |y| {
                for r in 0..rows {
                    for o in 0..n_out {
                        let mut acc = 0f32;
                        for b in 0..nb {
                            let blk = &w[(o * nb + b) * Q8_BYTES..][..Q8_BYTES];
                            let dw = f16::from_bits(u16::from_le_bytes([blk[0], blk[1]])).to_f32();
                            let xq = &q[r * k + b * QK..][..QK];
                            let isum: i32 = blk[2..]
                                .iter()
                                .zip(xq)
                                .map(|(&w, &x)| (w as i8) as i32 * (x as i8) as i32)
                                .sum();
                            acc += isum as f32 * (dw * d[r * nb + b]);
                        }
                        y[r * n_out + o] = acc;
                    }
                }
                Ok(())
            })
        }
        "q8_matmul_t" => {
            let (n_out, k, rows) = (a.int(3)?, a.int(4)?, a.int(5)?);
            let w = q8_weight(&m, a.ptr(0)?, n_out, k)?;
            let dy = m.f32s(a.ptr(1)?, rows * n_out)?;
            m.write_f32(a.ptr(2)?, rows * k, |dx| {
                for (dyr, dxr) in dy.chunks_exact(n_out).zip(dx.chunks_exact_mut(k)) {
                    for (i, d) in dxr.iter_mut().enumerate() {
                        *d = (0..n_out).map(|o| w[o * k + i] * dyr[o]).sum();
                    }
                }
                Ok(())
            })
        }
        "kq_matmul" | "kq_matmul_t" => {
            let (id, n_out, k, rows) = (a.int(3)?, a.int(4)?, a.int(5)?, a.int(6)?);
            let w = kq_weights(&m, a.ptr(0)?, id, n_out, k)?;
            if l.entry == "kq_matmul" {
                let x = m.f32s(a.ptr(1)?, rows * k)?;
                m.write_f32(a.ptr(2)?, rows * n_out, |y| {
                    for (xr, yr) in x.chunks_exact(k).zip(y.chunks_exact_mut(n_out)) {
                        for (wr, y) in w.chunks_exact(k).zip(yr) {
                            *y = wr.iter().zip(xr).map(|(w, x)| w * x).sum();
                        }
                    }
                    Ok(())
                })
            } else {
                let dy = m.f32s(a.ptr(1)?, rows * n_out)?;
                m.write_f32(a.ptr(2)?, rows * k, |dx| {
                    for (dyr, dxr) in dy.chunks_exact(n_out).zip(dx.chunks_exact_mut(k)) {
                        for (i, d) in dxr.iter_mut().enumerate() {
                            *d = (0..n_out).map(|o| w[o * k + i] * dyr[o]).sum();
                        }
                    }
                    Ok(())
                })
            }
        }
        "rms_norm" => {
            let (n, eps) = (a.int(3)?, a.float(4)?);
            let x = m.f32s(a.ptr(0)?, blocks * n)?;
            let w = m.f32s(a.ptr(1)?, n)?;
            m.write_f32(a.ptr(2)?, blocks * n, |y| {
                for (xr, yr) in x.chunks_exact(n).zip(y.chunks_exact_mut(n)) {
                    let r = rms(xr, eps);
                    for ((y, x), w) in yr.iter_mut().zip(xr).zip(&w) {
                        *y = x / r * w;
                    }
                }
                Ok(())
            })
        }
        "rms_norm_backward" => {
            let (n, eps) = (a.int(5)?, a.float(6)?);
            let x = m.f32s(a.ptr(0)?, blocks * n)?;
            let w = m.f32s(a.ptr(1)?, n)?;
            let dy = m.f32s(a.ptr(2)?, blocks * n)?;
            let rinv: Vec<f32> = x.chunks_exact(n).map(|xr| 1.0 / rms(xr, eps)).collect();
            m.write_f32(a.ptr(3)?, blocks * n, |dx| {
                for (row, dxr) in dx.chunks_exact_mut(n).enumerate() {
                    let (xr, dyr, r) = (&x[row * n..][..n], &dy[row * n..][..n], rinv[row]);
                    let dot: f32 = (0..n).map(|i| dyr[i] * w[i] * xr[i]).sum();
                    let c = r * r * r * dot / n as f32;
                    for (i, d) in dxr.iter_mut().enumerate() {
                        *d = r * w[i] * dyr[i] - c * xr[i];
                    }
                }
                Ok(())
            })?;
            m.write_f32(a.ptr(4)?, blocks, |out| {
                out.copy_from_slice(&rinv);
                Ok(())
            })
        }
        "rms_norm_backward_weight" => {
            let (rows, n) = (a.int(4)?, a.int(5)?);
            let x = m.f32s(a.ptr(0)?, rows * n)?;
            let dy = m.f32s(a.ptr(1)?, rows * n)?;
            let rinv = m.f32s(a.ptr(2)?, rows)?;
            m.write_f32(a.ptr(3)?, n, |dw| {
                for (j, d) in dw.iter_mut().enumerate() {
                    *d = (0..rows)
                        .map(|r| dy[r * n + j] * x[r * n + j] * rinv[r])
                        .sum();
                }
                Ok(())
            })
        }
        "rope" => {
            let (heads, hd, interleaved, sign) = (a.int(4)?, a.int(5)?, a.int(6)?, a.float(7)?);
            let (half, rows) = (hd / 2, blocks / heads.max(1));
            let pos = m.i32s(a.ptr(3)?, rows)?;
            // Tables are as long as the buffers are; each position must lie inside them.
            let table_len = m.0.get(&a.ptr(1)?).map_or(0, |b| b.len() / 4);
            let positions = table_len / half.max(1);
            let cos = m.f32s(a.ptr(1)?, table_len)?;
            let sin = m.f32s(a.ptr(2)?, table_len)?;
            m.write_f32(a.ptr(0)?, blocks * hd, |x| {
                for (b, h) in x.chunks_exact_mut(hd).enumerate() {
                    let p = index(pos[b / heads], positions, "position")?;
                    if p == positions {
                        return Err(fault(format!("position {p} past a table of {positions}")));
                    }
                    for i in 0..half {
                        let (ia, ib) = if interleaved != 0 {
                            (2 * i, 2 * i + 1)
                        } else {
                            (i, i + half)
                        };
                        let (c, s) = (cos[p * half + i], sign * sin[p * half + i]);
                        let (xa, xb) = (h[ia], h[ib]);
                        h[ia] = xa * c - xb * s;
                        h[ib] = xa * s + xb * c;
                    }
                }
                Ok(())
            })
        }
        "attention_decode" => {
            let (nh, nkv, hd, cap, scale) =
                (a.int(5)?, a.int(6)?, a.int(7)?, a.int(8)?, a.float(9)?);
            let rows = l.grid.1 as usize;
            let start = index(m.i32s(a.ptr(4)?, 1)?[0], cap, "position")?;
            let last = start + rows;
            if last > cap {
                return Err(fault(format!(
                    "rows up to position {last} past a cache of {cap}"
                )));
            }
            let q = m.f32s(a.ptr(0)?, rows * nh * hd)?;
            let kc = m.f32s(a.ptr(1)?, nkv * cap * hd)?;
            let vc = m.f32s(a.ptr(2)?, nkv * cap * hd)?;
            let group = (nh / nkv.max(1)).max(1);
            m.write_f32(a.ptr(3)?, rows * nh * hd, |out| {
                for (i, oh) in out.chunks_exact_mut(hd).enumerate() {
                    let (row, h) = (i / nh, i % nh);
                    let n = start + row + 1;
                    let qh = &q[i * hd..][..hd];
                    let base = (h / group) * cap * hd;
                    let scores: Vec<f32> = (0..n)
                        .map(|t| {
                            let kt = &kc[base + t * hd..][..hd];
                            qh.iter().zip(kt).map(|(q, k)| q * k).sum::<f32>() * scale
                        })
                        .collect();
                    let mx = scores.iter().fold(-3.0e38f32, |a, &b| a.max(b));
                    let e: Vec<f32> = scores.iter().map(|s| (s - mx).exp()).collect();
                    let sum: f32 = e.iter().sum();
                    for (d, o) in oh.iter_mut().enumerate() {
                        let acc: f32 = (0..n).map(|t| e[t] * vc[base + t * hd + d]).sum();
                        *o = acc / sum;
                    }
                }
                Ok(())
            })
        }
        "attention_scores" | "attention_grad_probs" => {
            let (len, nh, nkv, hd) = (a.int(3)?, a.int(4)?, a.int(5)?, a.int(6)?);
            // scores: q·k scaled; the probabilities' gradient: dctx·v unscaled.
            let scale = if l.entry == "attention_scores" {
                a.float(7)?
            } else {
                1.0
            };
            let x = m.f32s(a.ptr(0)?, len * nh * hd)?;
            let y = m.f32s(a.ptr(1)?, len * nkv * hd)?;
            let group = (nh / nkv.max(1)).max(1);
            m.write_f32(a.ptr(2)?, nh * len * len, |s| {
                for h in 0..nh {
                    for i in 0..len {
                        for j in 0..len {
                            s[(h * len + i) * len + j] = if j > i {
                                0.0
                            } else {
                                let xr = &x[(i * nh + h) * hd..][..hd];
                                let yr = &y[(j * nkv + h / group) * hd..][..hd];
                                xr.iter().zip(yr).map(|(a, b)| a * b).sum::<f32>() * scale
                            };
                        }
                    }
                }
                Ok(())
            })
        }
        "attention_context" | "attention_grad_q" => {
            let (len, nh, nkv, hd) = (a.int(3)?, a.int(4)?, a.int(5)?, a.int(6)?);
            let scale = if l.entry == "attention_grad_q" {
                a.float(7)?
            } else {
                1.0
            };
            let p = m.f32s(a.ptr(0)?, nh * len * len)?;
            let y = m.f32s(a.ptr(1)?, len * nkv * hd)?;
            let group = (nh / nkv.max(1)).max(1);
            m.write_f32(a.ptr(2)?, len * nh * hd, |out| {
                for i in 0..len {
                    for h in 0..nh {
                        for d in 0..hd {
                            let acc: f32 = (0..=i)
                                .map(|j| {
                                    p[(h * len + i) * len + j] * y[(j * nkv + h / group) * hd + d]
                                })
                                .sum();
                            out[(i * nh + h) * hd + d] = acc * scale;
                        }
                    }
                }
                Ok(())
            })
        }
        "attention_grad_kv" => {
            let (len, nh, nkv, hd, scale) =
                (a.int(6)?, a.int(7)?, a.int(8)?, a.int(9)?, a.float(10)?);
            let ds = m.f32s(a.ptr(0)?, nh * len * len)?;
            let p = m.f32s(a.ptr(1)?, nh * len * len)?;
            let q = m.f32s(a.ptr(2)?, len * nh * hd)?;
            let dctx = m.f32s(a.ptr(3)?, len * nh * hd)?;
            let group = (nh / nkv.max(1)).max(1);
            let (mut dk, mut dv) = (vec![0f32; len * nkv * hd], vec![0f32; len * nkv * hd]);
            for j in 0..len {
                for c in 0..nkv {
                    for d in 0..hd {
                        let (mut ak, mut av) = (0f32, 0f32);
                        for h in c * group..(c + 1) * group {
                            for i in j..len {
                                let at = (h * len + i) * len + j;
                                let row = (i * nh + h) * hd + d;
                                ak += ds[at] * q[row];
                                av += p[at] * dctx[row];
                            }
                        }
                        dk[(j * nkv + c) * hd + d] = ak * scale;
                        dv[(j * nkv + c) * hd + d] = av;
                    }
                }
            }
            m.write_f32(a.ptr(4)?, dk.len(), |out| {
                out.copy_from_slice(&dk);
                Ok(())
            })?;
            m.write_f32(a.ptr(5)?, dv.len(), |out| {
                out.copy_from_slice(&dv);
                Ok(())
            })
        }
        "head_logps" | "head_logps_backward" => {
            let (rows, vocab) = (blocks, a.int(5)?);
            let offsets = m.i32s(a.ptr(1)?, rows + 1)?;
            let pairs = index(offsets[rows], i32::MAX as usize, "offset")?;
            let ids = m.i32s(a.ptr(2)?, pairs)?;
            let weights = m.f32s(a.ptr(3)?, pairs)?;
            let row_targets = |r: usize| -> Result<Vec<(usize, f32)>, GpuError> {
                let (s, e) = (
                    index(offsets[r], pairs, "offset")?,
                    index(offsets[r + 1], pairs, "offset")?,
                );
                (s..e)
                    .map(|t| {
                        let id = index(ids[t], vocab, "target")?;
                        if id == vocab {
                            return Err(fault(format!("target {id} past a vocabulary of {vocab}")));
                        }
                        Ok((id, weights[t]))
                    })
                    .collect()
            };
            if l.entry == "head_logps" {
                let mut lp = vec![0f32; rows];
                m.write_f32(a.ptr(0)?, rows * vocab, |x| {
                    for (r, xr) in x.chunks_exact_mut(vocab).enumerate() {
                        let mx = xr.iter().fold(-3.0e38f32, |a, &b| a.max(b));
                        let lse = mx + xr.iter().map(|v| (v - mx).exp()).sum::<f32>().ln();
                        lp[r] = row_targets(r)?
                            .iter()
                            .map(|&(id, w)| w * (xr[id] - lse))
                            .sum();
                        xr.iter_mut().for_each(|v| *v = (*v - lse).exp());
                    }
                    Ok(())
                })?;
                m.write_f32(a.ptr(4)?, rows, |out| {
                    out.copy_from_slice(&lp);
                    Ok(())
                })
            } else {
                let dlp = m.f32s(a.ptr(4)?, rows)?;
                m.write_f32(a.ptr(0)?, rows * vocab, |p| {
                    for (r, pr) in p.chunks_exact_mut(vocab).enumerate() {
                        let t = row_targets(r)?;
                        let wsum: f32 = t.iter().map(|x| x.1).sum();
                        let mut onehot = vec![0f32; vocab];
                        t.iter().for_each(|&(id, w)| onehot[id] += w);
                        for (v, o) in pr.iter_mut().zip(&onehot) {
                            *v = dlp[r] * (o - wsum * *v);
                        }
                    }
                    Ok(())
                })
            }
        }
        "silu_mul" => {
            let n = a.int(3)?;
            let g = m.f32s(a.ptr(0)?, n)?;
            let u = m.f32s(a.ptr(1)?, n)?;
            m.write_f32(a.ptr(2)?, n, |out| {
                for i in 0..n {
                    out[i] = g[i] * sigmoid(g[i]) * u[i];
                }
                Ok(())
            })
        }
        "gelu_mul" => {
            let n = a.int(3)?;
            let g = m.f32s(a.ptr(0)?, n)?;
            let u = m.f32s(a.ptr(1)?, n)?;
            m.write_f32(a.ptr(2)?, n, |out| {
                for i in 0..n {
                    let x = g[i];
                    let y = 0.797_884_6 * x * (1.0 + 0.044715 * x * x);
                    out[i] = 0.5 * x * (1.0 + y.tanh()) * u[i];
                }
                Ok(())
            })
        }
        "gelu_mul_backward" => {
            let n = a.int(5)?;
            let g = m.f32s(a.ptr(0)?, n)?;
            let u = m.f32s(a.ptr(1)?, n)?;
            let dy = m.f32s(a.ptr(2)?, n)?;
            let parts = |x: f32| {
                let t = (0.797_884_6 * x * (1.0 + 0.044715 * x * x)).tanh();
                let dt = 0.797_884_6 * (1.0 + 3.0 * 0.044715 * x * x);
                (
                    0.5 * x * (1.0 + t),
                    0.5 * (1.0 + t) + 0.5 * x * (1.0 - t * t) * dt,
                )
            };
            m.write_f32(a.ptr(3)?, n, |dg| {
                for i in 0..n {
                    dg[i] = dy[i] * u[i] * parts(g[i]).1;
                }
                Ok(())
            })?;
            m.write_f32(a.ptr(4)?, n, |du| {
                for i in 0..n {
                    du[i] = dy[i] * parts(g[i]).0;
                }
                Ok(())
            })
        }
        "silu_mul_backward" => {
            let n = a.int(5)?;
            let g = m.f32s(a.ptr(0)?, n)?;
            let u = m.f32s(a.ptr(1)?, n)?;
            let dy = m.f32s(a.ptr(2)?, n)?;
            m.write_f32(a.ptr(3)?, n, |dg| {
                for i in 0..n {
                    let s = sigmoid(g[i]);
                    dg[i] = dy[i] * u[i] * s * (1.0 + g[i] * (1.0 - s));
                }
                Ok(())
            })?;
            m.write_f32(a.ptr(4)?, n, |du| {
                for i in 0..n {
                    du[i] = dy[i] * g[i] * sigmoid(g[i]);
                }
                Ok(())
            })
        }
        "softmax_rows" => {
            let (cols, causal) = (a.int(2)?, a.int(3)? != 0);
            let x = m.f32s(a.ptr(0)?, blocks * cols)?;
            m.write_f32(a.ptr(1)?, blocks * cols, |y| {
                for (r, (xr, yr)) in x
                    .chunks_exact(cols)
                    .zip(y.chunks_exact_mut(cols))
                    .enumerate()
                {
                    let valid = if causal { r % cols + 1 } else { cols };
                    let mx = xr[..valid].iter().fold(-3.0e38f32, |a, &b| a.max(b));
                    let sum: f32 = xr[..valid].iter().map(|v| (v - mx).exp()).sum();
                    for (j, y) in yr.iter_mut().enumerate() {
                        *y = if j < valid {
                            (xr[j] - mx).exp() / sum
                        } else {
                            0.0
                        };
                    }
                }
                Ok(())
            })
        }
        "softmax_backward" => {
            let cols = a.int(3)?;
            let y = m.f32s(a.ptr(0)?, blocks * cols)?;
            let dy = m.f32s(a.ptr(1)?, blocks * cols)?;
            m.write_f32(a.ptr(2)?, blocks * cols, |dx| {
                for (r, dxr) in dx.chunks_exact_mut(cols).enumerate() {
                    let (yr, dyr) = (&y[r * cols..][..cols], &dy[r * cols..][..cols]);
                    let dot: f32 = yr.iter().zip(dyr).map(|(y, d)| y * d).sum();
                    for j in 0..cols {
                        dxr[j] = yr[j] * (dyr[j] - dot);
                    }
                }
                Ok(())
            })
        }
        "lora_gemm" => {
            let (mm, nn, kk) = (a.int(3)?, a.int(4)?, a.int(5)?);
            let (a_i, a_l, b_l, b_j) = (a.int(6)?, a.int(7)?, a.int(8)?, a.int(9)?);
            let (alpha, beta) = (a.float(10)?, a.float(11)?);
            // The furthest element each operand's strides reach.
            let last = |n0: usize, s0: usize, n1: usize, s1: usize| {
                n0.saturating_sub(1) * s0 + n1.saturating_sub(1) * s1 + 1
            };
            let av = m.f32s(a.ptr(0)?, last(mm, a_i, kk, a_l))?;
            let bv = m.f32s(a.ptr(1)?, last(kk, b_l, nn, b_j))?;
            m.write_f32(a.ptr(2)?, mm * nn, |c| {
                for i in 0..mm {
                    for j in 0..nn {
                        let acc: f32 = (0..kk)
                            .map(|l| av[i * a_i + l * a_l] * bv[l * b_l + j * b_j])
                            .sum();
                        let c0 = if beta == 0.0 {
                            0.0
                        } else {
                            beta * c[i * nn + j]
                        };
                        c[i * nn + j] = c0 + alpha * acc;
                    }
                }
                Ok(())
            })
        }
        "add_into" => {
            let (n, period) = (a.int(2)?, a.int(3)?.max(1));
            let d = m.f32s(a.ptr(1)?, period)?;
            m.write_f32(a.ptr(0)?, n, |x| {
                x.iter_mut()
                    .enumerate()
                    .for_each(|(i, x)| *x += d[i % period]);
                Ok(())
            })
        }
        "mul_rows" => {
            let (n, period) = (a.int(2)?, a.int(3)?.max(1));
            let f = m.f32s(a.ptr(1)?, period)?;
            m.write_f32(a.ptr(0)?, n, |x| {
                x.iter_mut()
                    .enumerate()
                    .for_each(|(i, x)| *x *= f[i % period]);
                Ok(())
            })
        }
        "gather_rows" | "scatter_rows" => {
            let (rows, n) = (a.int(3)?, a.int(4)?);
            let idx = m.i32s(a.ptr(1)?, rows)?;
            let gather = l.entry == "gather_rows";
            // The indexed side is as long as its buffer is; each index must lie inside it.
            let indexed = if gather { a.ptr(0)? } else { a.ptr(2)? };
            let bound = m.0.get(&indexed).map_or(0, |b| b.len() / 4) / n.max(1);
            let idx = idx
                .iter()
                .map(|&i| {
                    index(i, bound, "row").and_then(|i| {
                        if i < bound {
                            Ok(i)
                        } else {
                            Err(fault(format!("row {i} of {bound}")))
                        }
                    })
                })
                .collect::<Result<Vec<_>, _>>()?;
            let src_len = if gather { bound * n } else { rows * n };
            let src = m.f32s(a.ptr(0)?, src_len)?;
            let dst_len = if gather { rows * n } else { bound * n };
            m.write_f32(a.ptr(2)?, dst_len, |dst| {
                for (r, &i) in idx.iter().enumerate() {
                    let (from, to) = if gather { (i, r) } else { (r, i) };
                    dst[to * n..][..n].copy_from_slice(&src[from * n..][..n]);
                }
                Ok(())
            })
        }
        "kv_append" => {
            let (rows, kv_heads, cap, hd) = (a.int(3)?, a.int(4)?, a.int(5)?, a.int(6)?);
            let first = index(m.i32s(a.ptr(2)?, 1)?[0], cap, "position")?;
            if first + rows > cap {
                return Err(fault(format!(
                    "rows up to position {} past a cache of {cap}",
                    first + rows
                )));
            }
            let src = m.f32s(a.ptr(1)?, rows * kv_heads * hd)?;
            m.write_f32(a.ptr(0)?, kv_heads * cap * hd, |cache| {
                for r in 0..rows {
                    for h in 0..kv_heads {
                        cache[(h * cap + first + r) * hd..][..hd]
                            .copy_from_slice(&src[(r * kv_heads + h) * hd..][..hd]);
                    }
                }
                Ok(())
            })
        }
        "advance" => {
            let b = a.slot(1)?;
            let by = i32::from_ne_bytes([b[0], b[1], b[2], b[3]]);
            m.write_i32(a.ptr(0)?, |len| *len += by)
        }
        other => Err(fault(format!("`{other}` has no emulation"))),
    }
}
