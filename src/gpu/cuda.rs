//! NVIDIA: the driver API and NVRTC through cudarc's run-time loading (`fallback-dynamic-loading`), so neither
//! library is needed to build or start. cudarc panics when a library is missing, hence the presence checks
//! before any call.

use std::collections::HashMap;
use std::ffi::{CStr, CString, c_char, c_void};
use std::sync::Mutex;

use cudarc::driver::{result as drv, sys as dsys};
use cudarc::nvrtc::sys as nsys;

use super::{COMPILE_OPTIONS, Func, GpuError, Kernel, PRELUDE, Runtime, kernel_of};

pub(super) fn nvrtc_present() -> bool {
    // SAFETY: only tries to open the library.
    unsafe { nsys::is_culib_present() }
}

fn driver_present() -> bool {
    // SAFETY: only tries to open the library.
    unsafe { dsys::is_culib_present() }
}

fn drv_err(call: &'static str) -> impl FnOnce(drv::DriverError) -> GpuError {
    move |e| GpuError::Driver {
        call,
        message: format!("{e:?}"),
    }
}

fn nvrtc_check(call: &'static str, r: nsys::nvrtcResult) -> Result<(), GpuError> {
    if r == nsys::nvrtcResult::NVRTC_SUCCESS {
        Ok(())
    } else {
        Err(GpuError::Driver {
            call,
            message: format!("{r:?}"),
        })
    }
}

/// CUBIN for `sm_{major}{minor}`: machine code, so the driver never JITs PTX (nor refuses PTX newer than it).
pub(super) fn compile(kernel: &Kernel, major: i32, minor: i32) -> Result<Vec<u8>, GpuError> {
    if !nvrtc_present() {
        return Err(GpuError::LibraryMissing("libnvrtc.so (NVRTC)".into()));
    }
    let src = CString::new(kernel.source).map_err(|_| GpuError::Compile {
        kernel: kernel.name,
        options: String::new(),
        log: "source holds a NUL byte".into(),
    })?;
    let name = CString::new(format!("{}.cu", kernel.name)).expect("kernel names hold no NUL");
    let header = CString::new(PRELUDE).expect("the prelude holds no NUL");
    let header_name = c"prelude.h";
    let mut options: Vec<CString> = COMPILE_OPTIONS
        .iter()
        .map(|o| CString::new(*o).expect("options hold no NUL"))
        .collect();
    options.push(CString::new(format!("--gpu-architecture=sm_{major}{minor}")).expect("no NUL"));
    let option_ptrs: Vec<*const c_char> = options.iter().map(|o| o.as_ptr()).collect();
    let mut prog: nsys::nvrtcProgram = std::ptr::null_mut();
    // SAFETY: every pointer is a live NUL-terminated string for the duration of the calls; the program is
    // destroyed once below.
    unsafe {
        nvrtc_check(
            "nvrtcCreateProgram",
            nsys::nvrtcCreateProgram(
                &mut prog,
                src.as_ptr(),
                name.as_ptr(),
                1,
                &header.as_ptr(),
                &header_name.as_ptr(),
            ),
        )?;
        let compiled =
            nsys::nvrtcCompileProgram(prog, option_ptrs.len() as i32, option_ptrs.as_ptr());
        let out = if compiled == nsys::nvrtcResult::NVRTC_SUCCESS {
            let mut size = 0usize;
            nvrtc_check(
                "nvrtcGetCUBINSize",
                nsys::nvrtcGetCUBINSize(prog, &mut size),
            )
            .and_then(|()| {
                let mut code = vec![0u8; size];
                nvrtc_check(
                    "nvrtcGetCUBIN",
                    nsys::nvrtcGetCUBIN(prog, code.as_mut_ptr().cast()),
                )
                .map(|()| code)
            })
        } else {
            let mut size = 0usize;
            let mut log = vec![0u8; 1];
            if nsys::nvrtcGetProgramLogSize(prog, &mut size) == nsys::nvrtcResult::NVRTC_SUCCESS {
                log = vec![0u8; size.max(1)];
                nsys::nvrtcGetProgramLog(prog, log.as_mut_ptr().cast());
            }
            Err(GpuError::Compile {
                kernel: kernel.name,
                options: options
                    .iter()
                    .map(|o| o.to_string_lossy().into_owned())
                    .collect::<Vec<_>>()
                    .join(" "),
                log: CStr::from_bytes_until_nul(&log)
                    .map(|c| c.to_string_lossy().into_owned())
                    .unwrap_or_default(),
            })
        };
        nsys::nvrtcDestroyProgram(&mut prog);
        out
    }
}

struct State {
    modules: HashMap<&'static str, dsys::CUmodule>,
    functions: HashMap<&'static str, Func>,
}

pub(super) struct CudaRuntime {
    ctx: dsys::CUcontext,
    device: dsys::CUdevice,
    stream: dsys::CUstream,
    cc: (i32, i32),
    name: String,
    state: Mutex<State>,
}

// SAFETY: the context and stream are process-wide driver handles; every call makes the context current on the
// calling thread first, and module loading is serialised by the mutex.
unsafe impl Send for CudaRuntime {}
unsafe impl Sync for CudaRuntime {}

impl CudaRuntime {
    pub(super) fn open(ordinal: usize) -> Result<CudaRuntime, GpuError> {
        if !driver_present() {
            return Err(GpuError::LibraryMissing(
                "libcuda.so (the NVIDIA driver)".into(),
            ));
        }
        if !nvrtc_present() {
            return Err(GpuError::LibraryMissing("libnvrtc.so (NVRTC)".into()));
        }
        drv::init().map_err(drv_err("cuInit"))?;
        let count = drv::device::get_count().map_err(drv_err("cuDeviceGetCount"))?;
        if ordinal >= count.max(0) as usize {
            return Err(GpuError::Driver {
                call: "cuDeviceGet",
                message: format!("no CUDA device {ordinal} ({count} present)"),
            });
        }
        let device = drv::device::get(ordinal as i32).map_err(drv_err("cuDeviceGet"))?;
        // SAFETY: `device` is valid; the primary context is retained for the process's life.
        let ctx = unsafe { drv::primary_ctx::retain(device) }
            .map_err(drv_err("cuDevicePrimaryCtxRetain"))?;
        // SAFETY: `ctx` was just retained.
        unsafe { drv::ctx::set_current(ctx) }.map_err(drv_err("cuCtxSetCurrent"))?;
        // A stream of its own: graph capture cannot use the legacy default stream.
        let stream = drv::stream::create(drv::stream::StreamKind::NonBlocking)
            .map_err(drv_err("cuStreamCreate"))?;
        let attr = |a| {
            // SAFETY: `device` is valid.
            unsafe { drv::device::get_attribute(device, a) }
                .map_err(drv_err("cuDeviceGetAttribute"))
        };
        let cc = (
            attr(dsys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR)?,
            attr(dsys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR)?,
        );
        let name = drv::device::get_name(device).map_err(drv_err("cuDeviceGetName"))?;
        Ok(CudaRuntime {
            ctx,
            device,
            stream,
            cc,
            name,
            state: Mutex::new(State {
                modules: HashMap::new(),
                functions: HashMap::new(),
            }),
        })
    }

    fn current(&self) -> Result<(), GpuError> {
        // SAFETY: the context lives as long as the runtime.
        unsafe { drv::ctx::set_current(self.ctx) }.map_err(drv_err("cuCtxSetCurrent"))
    }
}

impl Drop for CudaRuntime {
    fn drop(&mut self) {
        let _ = self.current();
        // SAFETY: the handles were created by `open` and are released once.
        unsafe {
            let state = self.state.get_mut().unwrap_or_else(|e| e.into_inner());
            for m in state.modules.values() {
                let _ = drv::module::unload(*m);
            }
            let _ = drv::stream::destroy(self.stream);
            let _ = drv::primary_ctx::release(self.device);
        }
    }
}

impl Runtime for CudaRuntime {
    fn alloc(&self, bytes: usize) -> Result<u64, GpuError> {
        self.current()?;
        // SAFETY: a plain allocation.
        unsafe { drv::malloc_sync(bytes) }.map_err(drv_err("cuMemAlloc"))
    }

    unsafe fn free(&self, ptr: u64) {
        if self.current().is_ok() {
            // SAFETY: the caller's contract.
            let _ = unsafe { drv::free_sync(ptr) };
        }
    }

    fn htod(&self, dst: u64, src: &[u8]) -> Result<(), GpuError> {
        self.current()?;
        // Kernels run on our own non-blocking stream, which a synchronous copy does not wait for.
        // SAFETY: the stream is ours.
        unsafe { drv::stream::synchronize(self.stream) }.map_err(drv_err("cuStreamSynchronize"))?;
        // SAFETY: `dst` is a device allocation of at least `src.len()` bytes (Buffer checks lengths).
        unsafe { drv::memcpy_htod_sync(dst, src) }.map_err(drv_err("cuMemcpyHtoD"))
    }

    fn zero(&self, dst: u64, bytes: usize) -> Result<(), GpuError> {
        self.current()?;
        // SAFETY: `dst` is a device allocation of at least `bytes` bytes (Buffer's own size); our stream.
        unsafe { drv::memset_d8_async(dst, 0, bytes, self.stream) }
            .map_err(drv_err("cuMemsetD8Async"))
    }

    fn dtoh(&self, src: u64, dst: &mut [u8]) -> Result<(), GpuError> {
        self.current()?;
        // SAFETY: the stream is ours.
        unsafe { drv::stream::synchronize(self.stream) }.map_err(drv_err("cuStreamSynchronize"))?;
        // SAFETY: `src` is a device allocation of at least `dst.len()` bytes.
        unsafe { drv::memcpy_dtoh_sync(dst, src) }.map_err(drv_err("cuMemcpyDtoH"))
    }

    fn function(&self, entry: &'static str) -> Result<Func, GpuError> {
        let mut state = self.state.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(f) = state.functions.get(entry) {
            return Ok(*f);
        }
        let kernel = kernel_of(entry).ok_or(GpuError::Shape {
            op: "function",
            reason: format!("no kernel defines `{entry}`"),
        })?;
        self.current()?;
        let module = match state.modules.get(kernel.name) {
            Some(m) => *m,
            None => {
                let code = compile(kernel, self.cc.0, self.cc.1)?;
                // SAFETY: `code` is a CUBIN image NVRTC produced for this device's architecture.
                let m = unsafe { drv::module::load_data(code.as_ptr() as *const c_void) }
                    .map_err(drv_err("cuModuleLoadData"))?;
                state.modules.insert(kernel.name, m);
                m
            }
        };
        // SAFETY: `module` is loaded; the name is one of its entry points.
        let f = unsafe { drv::module::get_function(module, CString::new(entry).expect("no NUL")) }
            .map_err(drv_err("cuModuleGetFunction"))?;
        let f = Func(f as usize);
        state.functions.insert(entry, f);
        Ok(f)
    }

    unsafe fn launch(
        &self,
        f: Func,
        grid: (u32, u32, u32),
        block: u32,
        shared: u32,
        params: &mut [*mut c_void],
    ) -> Result<(), GpuError> {
        self.current()?;
        // SAFETY: the caller's contract; `f` came from `function`.
        unsafe {
            drv::launch_kernel(
                f.0 as dsys::CUfunction,
                grid,
                (block, 1, 1),
                shared,
                self.stream,
                params,
            )
        }
        .map_err(drv_err("cuLaunchKernel"))
    }

    fn synchronize(&self) -> Result<(), GpuError> {
        self.current()?;
        // SAFETY: the stream is ours.
        unsafe { drv::stream::synchronize(self.stream) }.map_err(drv_err("cuStreamSynchronize"))
    }

    fn describe(&self) -> String {
        format!("{} (sm_{}{})", self.name, self.cc.0, self.cc.1)
    }

    fn begin_capture(&self) -> Result<(), GpuError> {
        self.current()?;
        // SAFETY: our own stream; relaxed mode lets other threads use the driver meanwhile.
        unsafe {
            drv::stream::begin_capture(
                self.stream,
                dsys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_RELAXED,
            )
        }
        .map_err(drv_err("cuStreamBeginCapture"))
    }

    fn end_capture(&self) -> Result<usize, GpuError> {
        self.current()?;
        // SAFETY: the stream is capturing (begin_capture succeeded).
        let graph = unsafe { drv::stream::end_capture(self.stream) }
            .map_err(drv_err("cuStreamEndCapture"))?;
        // SAFETY: `graph` was just captured; the executable keeps what it needs, so the graph is destroyed.
        let exec = unsafe { drv::graph::instantiate(graph, dsys::CUgraphInstantiate_flags(0)) };
        // SAFETY: as above.
        unsafe {
            let _ = drv::graph::destroy(graph);
        }
        Ok(exec.map_err(drv_err("cuGraphInstantiate"))? as usize)
    }

    fn replay(&self, graph: usize) -> Result<(), GpuError> {
        self.current()?;
        // SAFETY: `graph` is an executable graph from `end_capture`.
        unsafe { drv::graph::launch(graph as dsys::CUgraphExec, self.stream) }
            .map_err(drv_err("cuGraphLaunch"))
    }

    unsafe fn release(&self, graph: usize) {
        if self.current().is_ok() {
            // SAFETY: the caller's contract.
            let _ = unsafe { drv::graph::exec_destroy(graph as dsys::CUgraphExec) };
        }
    }
}
