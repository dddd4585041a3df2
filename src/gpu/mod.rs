//! GPU kernels for NVIDIA and AMD from one source (`kernels/*.cu` over `kernels/prelude.h`), compiled at run
//! time (NVRTC on NVIDIA, hiprtc on AMD) and launched through libraries opened at run time: a build with the
//! `cuda` or `rocm` feature needs no GPU toolchain, and the same binary still runs, on the CPU, where no GPU
//! library loads.
//!
//! [`Device`] is what a graph names (`cpu`, `cuda:0`, `rocm:0`, `auto`); [`Device::open`] turns it into a
//! [`Gpu`] or says, in [`Opened::Cpu`]'s notice, why it runs on the CPU. [`ops`] holds one host function per
//! kernel, each checking shapes before it launches.

use std::cell::Cell;
use std::ffi::c_void;
use std::fmt;
use std::str::FromStr;
use std::sync::{Arc, RwLock, RwLockReadGuard};

#[cfg(feature = "cuda")]
mod cuda;
mod emulated;
pub mod ops;
#[cfg(feature = "rocm")]
mod rocm;

/// Where a graph's model runs: `cpu`, `cuda:N`, `rocm:N` (`cuda`/`rocm` alone mean device 0), `auto` (the
/// first GPU that opens, else the CPU), or `emulated`: the GPU path with every kernel run by its reference in
/// Rust on the CPU (slow; for checking that path on a machine without a GPU, never chosen by `auto`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Device {
    #[default]
    Cpu,
    Cuda(usize),
    Rocm(usize),
    Auto,
    Emulated,
}

impl FromStr for Device {
    type Err = GpuError;

    fn from_str(s: &str) -> Result<Self, GpuError> {
        let bad = || GpuError::BadDevice(s.to_string());
        let (kind, index) = match s.split_once(':') {
            Some((kind, n)) => (kind, Some(n.parse::<usize>().map_err(|_| bad())?)),
            None => (s, None),
        };
        match (kind, index) {
            ("cpu", None) => Ok(Device::Cpu),
            ("auto", None) => Ok(Device::Auto),
            ("emulated", None) => Ok(Device::Emulated),
            ("cuda", n) => Ok(Device::Cuda(n.unwrap_or(0))),
            ("rocm", n) => Ok(Device::Rocm(n.unwrap_or(0))),
            _ => Err(bad()),
        }
    }
}

impl fmt::Display for Device {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Device::Cpu => f.write_str("cpu"),
            Device::Cuda(n) => write!(f, "cuda:{n}"),
            Device::Rocm(n) => write!(f, "rocm:{n}"),
            Device::Auto => f.write_str("auto"),
            Device::Emulated => f.write_str("emulated"),
        }
    }
}

impl<'de> serde::Deserialize<'de> for Device {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        s.parse().map_err(serde::de::Error::custom)
    }
}

impl serde::Serialize for Device {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

/// What [`Device::open`] gave: a GPU, or the CPU with the reason when a GPU was asked for.
pub enum Opened {
    Gpu(Gpu),
    /// `None` when the CPU was asked for.
    Cpu(Option<String>),
}

impl Device {
    /// Opens the device, falling back to the CPU (with the reason) when the library, the device or a kernel
    /// compile fails: serving on the CPU beats not serving.
    pub fn open(self) -> Opened {
        match self {
            Device::Cpu => Opened::Cpu(None),
            Device::Auto => {
                let mut reasons = Vec::new();
                for d in [Device::Cuda(0), Device::Rocm(0)] {
                    match Gpu::open(d) {
                        Ok(g) => return Opened::Gpu(g),
                        Err(e) => reasons.push(format!("{d}: {e}")),
                    }
                }
                Opened::Cpu(Some(format!(
                    "device auto: no GPU opened ({}); running on the CPU",
                    reasons.join("; ")
                )))
            }
            d => match Gpu::open(d) {
                Ok(g) => Opened::Gpu(g),
                Err(e) => Opened::Cpu(Some(format!("device {d}: {e}; running on the CPU"))),
            },
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum GpuError {
    #[error("`{0}` is not a device (expected cpu, auto, cuda, cuda:N, rocm, rocm:N or emulated)")]
    BadDevice(String),
    #[error("this build has no `{0}` feature")]
    NotBuilt(&'static str),
    #[error("{0} did not load (not installed, or not on the library path)")]
    LibraryMissing(String),
    #[error("{call}: {message}")]
    Driver { call: &'static str, message: String },
    #[error("kernel {kernel} did not compile ({options}):\n{log}")]
    Compile {
        kernel: &'static str,
        options: String,
        log: String,
    },
    #[error("{op}: {reason}")]
    Shape { op: &'static str, reason: String },
}

/// One kernel source: a file of `kernels/` and the entry points it defines.
#[derive(Debug, Clone, Copy)]
pub struct Kernel {
    pub name: &'static str,
    pub source: &'static str,
    pub entries: &'static [&'static str],
}

/// `kernels/prelude.h`, given to the runtime compilers as the header the sources include.
pub const PRELUDE: &str = include_str!("../../kernels/prelude.h");

macro_rules! kernel {
    ($name:literal, [$($e:literal),+]) => {
        Kernel {
            name: $name,
            source: include_str!(concat!("../../kernels/", $name, ".cu")),
            entries: &[$($e),+],
        }
    };
}

/// Every kernel source, in the order `ops` names them.
pub const KERNELS: &[Kernel] = &[
    kernel!("q8_matmul", ["q8_matmul"]),
    kernel!("q8_matmul_q8", ["quantize_q8", "q8_matmul_q8"]),
    kernel!("q8_matmul_t", ["q8_matmul_t"]),
    kernel!("kquant", ["kq_matmul", "kq_matmul_t"]),
    kernel!(
        "rms_norm",
        ["rms_norm", "rms_norm_backward", "rms_norm_backward_weight"]
    ),
    kernel!("rope", ["rope"]),
    kernel!("attention_decode", ["attention_decode"]),
    kernel!(
        "attention_train",
        [
            "attention_scores",
            "attention_context",
            "attention_grad_probs",
            "attention_grad_q",
            "attention_grad_kv"
        ]
    ),
    kernel!("head", ["head_logps", "head_logps_backward"]),
    kernel!(
        "silu_mul",
        [
            "silu_mul",
            "silu_mul_backward",
            "gelu_mul",
            "gelu_mul_backward"
        ]
    ),
    kernel!("softmax", ["softmax_rows", "softmax_backward"]),
    kernel!("lora", ["lora_gemm"]),
    kernel!(
        "elementwise",
        [
            "add_into",
            "mul_rows",
            "gather_rows",
            "scatter_rows",
            "kv_append",
            "advance"
        ]
    ),
];

/// The kernel source that defines `entry`.
pub fn kernel_of(entry: &str) -> Option<&'static Kernel> {
    KERNELS.iter().find(|k| k.entries.contains(&entry))
}

/// Which runtime compiler to compile for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Target {
    /// NVRTC to PTX for `compute_XY`.
    Nvidia { major: i32, minor: i32 },
    /// hiprtc to a code object for `gfxNNNN`.
    Amd(&'static str),
}

/// Compiles one kernel with the vendor's runtime compiler, as [`Gpu`] does before loading it: PTX text for
/// NVIDIA, a code object for AMD. Useful without a GPU: NVRTC and hiprtc need no device.
pub fn compile(kernel: &Kernel, target: Target) -> Result<Vec<u8>, GpuError> {
    match target {
        #[cfg(feature = "cuda")]
        Target::Nvidia { major, minor } => cuda::compile(kernel, major, minor),
        #[cfg(not(feature = "cuda"))]
        Target::Nvidia { .. } => {
            let _ = kernel;
            Err(GpuError::NotBuilt("cuda"))
        }
        #[cfg(feature = "rocm")]
        Target::Amd(arch) => rocm::compile(kernel, arch),
        #[cfg(not(feature = "rocm"))]
        Target::Amd(_) => Err(GpuError::NotBuilt("rocm")),
    }
}

/// Whether the runtime compiler for `target` loads here (NVRTC or hiprtc).
pub fn compiler_present(target: Target) -> bool {
    match target {
        #[cfg(feature = "cuda")]
        Target::Nvidia { .. } => cuda::nvrtc_present(),
        #[cfg(feature = "rocm")]
        Target::Amd(_) => rocm::hiprtc_present(),
        #[allow(unreachable_patterns)]
        _ => false,
    }
}

/// A loaded kernel entry point (a `CUfunction` or `hipFunction_t`).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Func(pub(crate) usize);

/// The few driver calls the kernels need, over device pointers as integers so both vendors look alike.
pub(crate) trait Runtime: Send + Sync {
    fn alloc(&self, bytes: usize) -> Result<u64, GpuError>;
    /// # Safety
    /// `ptr` came from `alloc` on this runtime and is freed once.
    unsafe fn free(&self, ptr: u64);
    fn htod(&self, dst: u64, src: &[u8]) -> Result<(), GpuError>;
    /// Zeroes `bytes` at `dst` in stream order (after the kernels launched so far, before those after).
    fn zero(&self, dst: u64, bytes: usize) -> Result<(), GpuError> {
        self.htod(dst, &vec![0u8; bytes])
    }
    fn dtoh(&self, src: u64, dst: &mut [u8]) -> Result<(), GpuError>;
    fn function(&self, entry: &'static str) -> Result<Func, GpuError>;
    /// # Safety
    /// `params` point at values matching the kernel's parameters, device pointers valid for what it touches.
    unsafe fn launch(
        &self,
        f: Func,
        grid: (u32, u32, u32),
        block: u32,
        shared: u32,
        params: &mut [*mut c_void],
    ) -> Result<(), GpuError>;
    fn synchronize(&self) -> Result<(), GpuError>;
    fn describe(&self) -> String;
    /// Starts recording launches instead of running them.
    fn begin_capture(&self) -> Result<(), GpuError> {
        Err(GpuError::NotBuilt("graph capture on this vendor"))
    }
    /// Ends recording; the handle replays what was recorded.
    fn end_capture(&self) -> Result<usize, GpuError> {
        Err(GpuError::NotBuilt("graph capture on this vendor"))
    }
    fn replay(&self, _graph: usize) -> Result<(), GpuError> {
        Err(GpuError::NotBuilt("graph capture on this vendor"))
    }
    /// # Safety
    /// `graph` came from `end_capture` and is released once.
    unsafe fn release(&self, _graph: usize) {}
}

/// Launches recorded once and replayed as one submission (a CUDA graph): a decode step costs one launch
/// instead of hundreds. Buffers the recorded kernels touch must outlive it.
pub struct Graph {
    rt: Arc<dyn Runtime>,
    handle: usize,
    gate: Arc<RwLock<()>>,
}

impl Graph {
    pub fn replay(&self) -> Result<(), GpuError> {
        let _g = shared(&self.gate);
        self.rt.replay(self.handle)
    }
}

thread_local! {
    /// Whether this thread is recording a [`Graph`]: its own launches then go to the stream it holds alone.
    static RECORDING: Cell<bool> = const { Cell::new(false) };
}

/// A hold on a device's stream for one call: none while this thread records (it holds the stream alone), and
/// otherwise one that waits while another thread records. A stream that records takes every launch made to it,
/// from any thread, and refuses a synchronisation: another sequence's step would go into the graph unrun.
fn shared(gate: &RwLock<()>) -> Option<RwLockReadGuard<'_, ()>> {
    if RECORDING.with(Cell::get) {
        None
    } else {
        Some(gate.read().unwrap_or_else(|e| e.into_inner()))
    }
}

/// Clears [`RECORDING`] when a recording ends, also by a panic.
struct Recording;

impl Drop for Recording {
    fn drop(&mut self) {
        RECORDING.with(|r| r.set(false));
    }
}

impl Drop for Graph {
    fn drop(&mut self) {
        // SAFETY: the handle came from this runtime's `end_capture` and only this graph owns it.
        unsafe { self.rt.release(self.handle) }
    }
}

/// An opened GPU: its context, with kernels compiled and loaded on first use.
#[derive(Clone)]
pub struct Gpu {
    rt: Arc<dyn Runtime>,
    device: Device,
    /// Held shared by each launch, copy and synchronisation, and alone while a graph records (see [`shared`]).
    gate: Arc<RwLock<()>>,
}

impl fmt::Debug for Gpu {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Gpu({})", self.rt.describe())
    }
}

impl Gpu {
    /// Opens `cuda:N` or `rocm:N`; an error names what is missing (feature, library, device).
    #[cfg_attr(
        not(any(feature = "cuda", feature = "rocm")),
        allow(unreachable_code, unused_variables)
    )]
    pub fn open(device: Device) -> Result<Gpu, GpuError> {
        let rt: Arc<dyn Runtime> = match device {
            #[cfg(feature = "cuda")]
            Device::Cuda(n) => Arc::new(cuda::CudaRuntime::open(n)?),
            #[cfg(not(feature = "cuda"))]
            Device::Cuda(_) => return Err(GpuError::NotBuilt("cuda")),
            #[cfg(feature = "rocm")]
            Device::Rocm(n) => Arc::new(rocm::RocmRuntime::open(n)?),
            #[cfg(not(feature = "rocm"))]
            Device::Rocm(_) => return Err(GpuError::NotBuilt("rocm")),
            Device::Emulated => Arc::new(emulated::EmulatedRuntime::new()),
            Device::Cpu | Device::Auto => return Err(GpuError::BadDevice(device.to_string())),
        };
        Ok(Gpu {
            rt,
            device,
            gate: Arc::default(),
        })
    }

    pub fn device(&self) -> Device {
        self.device
    }

    /// The device's name and architecture, for logs.
    pub fn describe(&self) -> String {
        self.rt.describe()
    }

    /// Waits for every launched kernel.
    pub fn synchronize(&self) -> Result<(), GpuError> {
        let _g = shared(&self.gate);
        self.rt.synchronize()
    }

    /// Compiles and loads every kernel now, rather than on first use.
    pub fn load_all(&self) -> Result<(), GpuError> {
        for k in KERNELS {
            for e in k.entries {
                self.rt.function(e)?;
            }
        }
        Ok(())
    }

    /// Records the launches `record` makes into a [`Graph`] (NVIDIA; other vendors return an error). `record`
    /// must only launch kernels: copies and synchronisation are not recorded. Other threads' calls on this
    /// device wait until the recording ends.
    pub fn capture(
        &self,
        record: impl FnOnce(&Gpu) -> Result<(), GpuError>,
    ) -> Result<Graph, GpuError> {
        let _alone = self.gate.write().unwrap_or_else(|e| e.into_inner());
        RECORDING.with(|r| r.set(true));
        let _recording = Recording;
        self.rt.begin_capture()?;
        let recorded = record(self);
        let handle = self.rt.end_capture()?;
        let graph = Graph {
            rt: self.rt.clone(),
            handle,
            gate: self.gate.clone(),
        };
        recorded.map(|()| graph)
    }

    /// A device buffer holding `data`.
    pub fn upload<T: Pod>(&self, data: &[T]) -> Result<Buffer<T>, GpuError> {
        let buf = self.alloc::<T>(data.len())?;
        let _g = shared(&self.gate);
        self.rt.htod(buf.ptr, T::as_bytes(data))?;
        Ok(buf)
    }

    /// A device buffer of `len` zeroed elements (zeroed on the device, in stream order).
    pub fn zeros<T: Pod>(&self, len: usize) -> Result<Buffer<T>, GpuError> {
        let buf = self.alloc::<T>(len)?;
        let _g = shared(&self.gate);
        self.rt.zero(buf.ptr, buf.bytes())?;
        Ok(buf)
    }

    fn alloc<T: Pod>(&self, len: usize) -> Result<Buffer<T>, GpuError> {
        // One element at least: a zero-byte allocation is an error on some drivers.
        let ptr = self.rt.alloc(len.max(1) * std::mem::size_of::<T>())?;
        Ok(Buffer {
            rt: self.rt.clone(),
            ptr,
            len,
            _t: std::marker::PhantomData,
        })
    }

    /// Copies `data` into `buf` (same length).
    pub fn write<T: Pod>(&self, buf: &Buffer<T>, data: &[T]) -> Result<(), GpuError> {
        if data.len() != buf.len {
            return Err(GpuError::Shape {
                op: "write",
                reason: format!("{} values into a buffer of {}", data.len(), buf.len),
            });
        }
        let _g = shared(&self.gate);
        self.rt.htod(buf.ptr, T::as_bytes(data))
    }

    /// The buffer's contents, after the kernels launched so far finish.
    pub fn download<T: Pod>(&self, buf: &Buffer<T>) -> Result<Vec<T>, GpuError> {
        let _g = shared(&self.gate);
        self.rt.synchronize()?;
        let mut out = vec![T::default(); buf.len];
        self.rt.dtoh(buf.ptr, T::as_bytes_mut(&mut out))?;
        Ok(out)
    }

    pub(crate) fn launch(
        &self,
        entry: &'static str,
        grid: (u32, u32, u32),
        block: u32,
        shared_bytes: u32,
        args: &[Arg],
    ) -> Result<(), GpuError> {
        let f = self.rt.function(entry)?;
        let mut values: Vec<[u8; 8]> = args.iter().map(Arg::bytes).collect();
        let mut params: Vec<*mut c_void> = values
            .iter_mut()
            .map(|v| v.as_mut_ptr() as *mut c_void)
            .collect();
        let _g = shared(&self.gate);
        // SAFETY: `ops` passes arguments in each kernel's parameter order and types (8-byte pointers, 4-byte
        // ints and floats, read from the start of their slot), with buffers sized for the launch.
        unsafe { self.rt.launch(f, grid, block, shared_bytes, &mut params) }
    }
}

/// A kernel argument: a device pointer or a 32-bit scalar.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Arg {
    Ptr(u64),
    I32(i32),
    F32(f32),
}

impl Arg {
    fn bytes(&self) -> [u8; 8] {
        let mut b = [0u8; 8];
        match self {
            Arg::Ptr(p) => b = p.to_ne_bytes(),
            Arg::I32(v) => b[..4].copy_from_slice(&v.to_ne_bytes()),
            Arg::F32(v) => b[..4].copy_from_slice(&v.to_ne_bytes()),
        }
        b
    }
}

/// Element types a [`Buffer`] holds: plain numbers, copied as bytes.
pub trait Pod: Copy + Default + 'static {
    fn as_bytes(v: &[Self]) -> &[u8];
    fn as_bytes_mut(v: &mut [Self]) -> &mut [u8];
}

macro_rules! pod {
    ($($t:ty),*) => {$(
        impl Pod for $t {
            fn as_bytes(v: &[Self]) -> &[u8] {
                // SAFETY: a plain number type: every byte is initialised and any alignment of u8 is fine.
                unsafe { std::slice::from_raw_parts(v.as_ptr().cast(), std::mem::size_of_val(v)) }
            }
            fn as_bytes_mut(v: &mut [Self]) -> &mut [u8] {
                // SAFETY: as above; every byte pattern is a valid value of the type.
                unsafe { std::slice::from_raw_parts_mut(v.as_mut_ptr().cast(), std::mem::size_of_val(v)) }
            }
        }
    )*};
}
pod!(u8, i8, i32, f32);

/// Device memory of `len` values, freed on drop.
pub struct Buffer<T: Pod> {
    rt: Arc<dyn Runtime>,
    ptr: u64,
    len: usize,
    _t: std::marker::PhantomData<T>,
}

impl<T: Pod> Buffer<T> {
    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    fn bytes(&self) -> usize {
        self.len.max(1) * std::mem::size_of::<T>()
    }

    pub(crate) fn arg(&self) -> Arg {
        Arg::Ptr(self.ptr)
    }
}

impl<T: Pod> Drop for Buffer<T> {
    fn drop(&mut self) {
        // SAFETY: `ptr` came from this runtime's `alloc` and only this buffer owns it.
        unsafe { self.rt.free(self.ptr) }
    }
}

/// Options both runtime compilers take, besides the architecture.
#[cfg(any(feature = "cuda", feature = "rocm"))]
pub(crate) const COMPILE_OPTIONS: &[&str] = &["-std=c++17"];
