//! GPU kernels: every kernel compiles for every target this machine can compile for (NVRTC when
//! libnvrtc loads, clang-19 for gfx1100/gfx1151 when it is installed), and on a GPU every kernel matches a
//! CPU reference computed here. Each check skips with a printed notice when its library or device is absent.
//! The `emulated` device runs the same checks everywhere: its Rust kernels against the same references, and
//! the host code over them (the shape checks, the decode step) against the CPU model.

mod compile;
mod decode;
mod device;
mod kernels;
mod throughput;
mod train;

use hearth::gpu::{Device, Gpu};

/// The GPUs this machine opens (cuda:0, rocm:0), and why each other did not.
fn open_gpus() -> (Vec<Gpu>, Vec<String>) {
    let mut out = Vec::new();
    let mut why = Vec::new();
    for d in [Device::Cuda(0), Device::Rocm(0)] {
        match Gpu::open(d) {
            Ok(g) => out.push(g),
            Err(e) => why.push(format!("{d}: {e}")),
        }
    }
    (out, why)
}

/// The GPUs this machine opens; prints why when none does.
pub fn gpus(test: &str) -> Vec<Gpu> {
    let (out, why) = open_gpus();
    if out.is_empty() {
        eprintln!("{test}: skipped, no GPU opened ({})", why.join("; "));
    }
    out
}

/// The GPUs this machine opens, then the emulated device, which every machine has.
pub fn devices(test: &str) -> Vec<Gpu> {
    let (mut out, why) = open_gpus();
    if out.is_empty() {
        eprintln!(
            "{test}: on the emulated device only, no GPU opened ({})",
            why.join("; ")
        );
    }
    out.push(Gpu::open(Device::Emulated).expect("the emulated device always opens"));
    out
}
