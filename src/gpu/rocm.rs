//! AMD: our own FFI over `libamdhip64` and `libhiprtc`, opened at run time with libloading. The ~30 entry
//! points the kernels need are stable C ABI across ROCm 5–7; `hip-sys` links HIP 5.4 at build time and has no
//! hiprtc, and `cubecl-hip-sys` only looks for unversioned or `.so.0/.1` names while ROCm 6/7 install
//! `.so.6`/`.so.7`.

use std::collections::HashMap;
use std::ffi::{CStr, CString, c_char, c_int, c_uint, c_void};
use std::sync::{Mutex, OnceLock};

use libloading::Library;

use super::{COMPILE_OPTIONS, Func, GpuError, Kernel, PRELUDE, Runtime, kernel_of};

type HipError = c_int;
type Prog = *mut c_void;

/// The names the libraries go by: unversioned where a development package made the link, otherwise the
/// versioned names ROCm 5–7 install, then `$ROCM_PATH/lib` and `/opt/rocm/lib`.
fn candidates(base: &str) -> Vec<String> {
    let mut names: Vec<String> = ["", ".7", ".6", ".5"]
        .iter()
        .map(|v| format!("{base}.so{v}"))
        .collect();
    let roots = [
        std::env::var("ROCM_PATH").ok(),
        Some("/opt/rocm".to_string()),
    ];
    for root in roots.into_iter().flatten() {
        names.push(format!("{root}/lib/{base}.so"));
    }
    names
}

fn open_lib(base: &str) -> Option<Library> {
    candidates(base)
        .into_iter()
        // SAFETY: opening a vendor library runs its initialisers, which is what using it means.
        .find_map(|n| unsafe { Library::new(n) }.ok())
}

macro_rules! api {
    ($name:ident { $($f:ident : fn($($a:ty),*) -> $r:ty;)* }) => {
        #[allow(non_snake_case)]
        struct $name {
            _lib: Library,
            $($f: unsafe extern "C" fn($($a),*) -> $r,)*
        }
        impl $name {
            #[allow(non_snake_case)]
            fn load(lib: Library) -> Result<Self, String> {
                // SAFETY: each symbol is declared with the C signature the HIP headers give it.
                unsafe {
                    $(let $f = *lib
                        .get::<unsafe extern "C" fn($($a),*) -> $r>(concat!(stringify!($f), "\0").as_bytes())
                        .map_err(|e| format!("{}: {e}", stringify!($f)))?;)*
                    Ok(Self { _lib: lib, $($f,)* })
                }
            }
        }
    };
}

api!(Hip {
    hipInit: fn(c_uint) -> HipError;
    hipGetDeviceCount: fn(*mut c_int) -> HipError;
    hipSetDevice: fn(c_int) -> HipError;
    hipDeviceGetName: fn(*mut c_char, c_int, c_int) -> HipError;
    hipMalloc: fn(*mut *mut c_void, usize) -> HipError;
    hipFree: fn(*mut c_void) -> HipError;
    hipMemcpyHtoD: fn(*mut c_void, *const c_void, usize) -> HipError;
    hipMemcpyDtoH: fn(*mut c_void, *mut c_void, usize) -> HipError;
    hipModuleLoadData: fn(*mut *mut c_void, *const c_void) -> HipError;
    hipModuleUnload: fn(*mut c_void) -> HipError;
    hipModuleGetFunction: fn(*mut *mut c_void, *mut c_void, *const c_char) -> HipError;
    hipModuleLaunchKernel: fn(
        *mut c_void, c_uint, c_uint, c_uint, c_uint, c_uint, c_uint, c_uint, *mut c_void,
        *mut *mut c_void, *mut *mut c_void
    ) -> HipError;
    hipGetErrorString: fn(HipError) -> *const c_char;
    hipStreamCreateWithFlags: fn(*mut *mut c_void, c_uint) -> HipError;
    hipMemsetAsync: fn(*mut c_void, c_int, usize, *mut c_void) -> HipError;
    hipStreamDestroy: fn(*mut c_void) -> HipError;
    hipStreamSynchronize: fn(*mut c_void) -> HipError;
    hipStreamBeginCapture: fn(*mut c_void, c_int) -> HipError;
    hipStreamEndCapture: fn(*mut c_void, *mut *mut c_void) -> HipError;
    hipGraphInstantiate: fn(*mut *mut c_void, *mut c_void, *mut *mut c_void, *mut c_char, usize) -> HipError;
    hipGraphLaunch: fn(*mut c_void, *mut c_void) -> HipError;
    hipGraphExecDestroy: fn(*mut c_void) -> HipError;
    hipGraphDestroy: fn(*mut c_void) -> HipError;
});

/// `hipStreamNonBlocking`: the stream does not wait on the null stream (ours is the only one we use).
const STREAM_NON_BLOCKING: c_uint = 1;
/// `hipStreamCaptureModeRelaxed`: other threads may use the runtime while a stream captures.
const CAPTURE_RELAXED: c_int = 2;

api!(Hiprtc {
    hiprtcCreateProgram: fn(
        *mut Prog, *const c_char, *const c_char, c_int, *const *const c_char, *const *const c_char
    ) -> c_int;
    hiprtcCompileProgram: fn(Prog, c_int, *const *const c_char) -> c_int;
    hiprtcGetProgramLogSize: fn(Prog, *mut usize) -> c_int;
    hiprtcGetProgramLog: fn(Prog, *mut c_char) -> c_int;
    hiprtcGetCodeSize: fn(Prog, *mut usize) -> c_int;
    hiprtcGetCode: fn(Prog, *mut c_char) -> c_int;
    hiprtcDestroyProgram: fn(*mut Prog) -> c_int;
});

fn hiprtc() -> Result<&'static Hiprtc, GpuError> {
    static LIB: OnceLock<Result<Hiprtc, String>> = OnceLock::new();
    LIB.get_or_init(|| match open_lib("libhiprtc") {
        Some(lib) => Hiprtc::load(lib),
        None => Err(String::new()),
    })
    .as_ref()
    .map_err(|e| {
        GpuError::LibraryMissing(if e.is_empty() {
            "libhiprtc.so (ROCm)".into()
        } else {
            format!("libhiprtc.so ({e})")
        })
    })
}

fn hip() -> Result<&'static Hip, GpuError> {
    static LIB: OnceLock<Result<Hip, String>> = OnceLock::new();
    LIB.get_or_init(|| match open_lib("libamdhip64") {
        Some(lib) => Hip::load(lib),
        None => Err(String::new()),
    })
    .as_ref()
    .map_err(|e| {
        GpuError::LibraryMissing(if e.is_empty() {
            "libamdhip64.so (ROCm)".into()
        } else {
            format!("libamdhip64.so ({e})")
        })
    })
}

pub(super) fn hiprtc_present() -> bool {
    hiprtc().is_ok()
}

fn check(hip: &Hip, call: &'static str, e: HipError) -> Result<(), GpuError> {
    if e == 0 {
        return Ok(());
    }
    // SAFETY: hipGetErrorString returns a static string for any code.
    let message = unsafe { CStr::from_ptr((hip.hipGetErrorString)(e)) }
        .to_string_lossy()
        .into_owned();
    Err(GpuError::Driver {
        call,
        message: format!("{message} ({e})"),
    })
}

/// A code object for `arch` (`gfx1100`, …); `None` lets hiprtc take the current device's.
pub(super) fn compile(kernel: &Kernel, arch: &str) -> Result<Vec<u8>, GpuError> {
    compile_for(kernel, Some(arch))
}

fn compile_for(kernel: &Kernel, arch: Option<&str>) -> Result<Vec<u8>, GpuError> {
    let rtc = hiprtc()?;
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
    if let Some(arch) = arch {
        options.push(CString::new(format!("--offload-arch={arch}")).map_err(|_| {
            GpuError::Shape {
                op: "compile",
                reason: "architecture holds a NUL byte".into(),
            }
        })?);
    }
    let ptrs: Vec<*const c_char> = options.iter().map(|o| o.as_ptr()).collect();
    let rtc_err = |call: &'static str, r: c_int| GpuError::Driver {
        call,
        message: format!("hiprtc error {r}"),
    };
    let mut prog: Prog = std::ptr::null_mut();
    // SAFETY: all pointers are live NUL-terminated strings during the calls; the program is destroyed once.
    unsafe {
        let r = (rtc.hiprtcCreateProgram)(
            &mut prog,
            src.as_ptr(),
            name.as_ptr(),
            1,
            &header.as_ptr(),
            &header_name.as_ptr(),
        );
        if r != 0 {
            return Err(rtc_err("hiprtcCreateProgram", r));
        }
        let r = (rtc.hiprtcCompileProgram)(prog, ptrs.len() as c_int, ptrs.as_ptr());
        let out = if r == 0 {
            let mut size = 0usize;
            let r = (rtc.hiprtcGetCodeSize)(prog, &mut size);
            let mut code = vec![0u8; size];
            match r {
                0 => match (rtc.hiprtcGetCode)(prog, code.as_mut_ptr().cast()) {
                    0 => Ok(code),
                    r => Err(rtc_err("hiprtcGetCode", r)),
                },
                r => Err(rtc_err("hiprtcGetCodeSize", r)),
            }
        } else {
            let mut size = 0usize;
            let mut log = vec![0u8; 1];
            if (rtc.hiprtcGetProgramLogSize)(prog, &mut size) == 0 {
                log = vec![0u8; size.max(1)];
                (rtc.hiprtcGetProgramLog)(prog, log.as_mut_ptr().cast());
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
        (rtc.hiprtcDestroyProgram)(&mut prog);
        out
    }
}

struct State {
    modules: HashMap<&'static str, usize>,
    functions: HashMap<&'static str, Func>,
}

pub(super) struct RocmRuntime {
    hip: &'static Hip,
    device: c_int,
    name: String,
    /// Our own stream: kernels launch on it and a decode step is captured from it (the null stream cannot be
    /// captured).
    stream: usize,
    state: Mutex<State>,
}

impl RocmRuntime {
    pub(super) fn open(ordinal: usize) -> Result<RocmRuntime, GpuError> {
        let hip = hip()?;
        hiprtc()?;
        // SAFETY: plain HIP calls with valid out-pointers.
        unsafe {
            check(hip, "hipInit", (hip.hipInit)(0))?;
            let mut count = 0;
            check(
                hip,
                "hipGetDeviceCount",
                (hip.hipGetDeviceCount)(&mut count),
            )?;
            if ordinal >= count.max(0) as usize {
                return Err(GpuError::Driver {
                    call: "hipSetDevice",
                    message: format!("no ROCm device {ordinal} ({count} present)"),
                });
            }
            let device = ordinal as c_int;
            check(hip, "hipSetDevice", (hip.hipSetDevice)(device))?;
            let mut name = [0 as c_char; 256];
            check(
                hip,
                "hipDeviceGetName",
                (hip.hipDeviceGetName)(name.as_mut_ptr(), name.len() as c_int, device),
            )?;
            let mut stream = std::ptr::null_mut();
            check(
                hip,
                "hipStreamCreateWithFlags",
                (hip.hipStreamCreateWithFlags)(&mut stream, STREAM_NON_BLOCKING),
            )?;
            Ok(RocmRuntime {
                hip,
                device,
                name: CStr::from_ptr(name.as_ptr()).to_string_lossy().into_owned(),
                stream: stream as usize,
                state: Mutex::new(State {
                    modules: HashMap::new(),
                    functions: HashMap::new(),
                }),
            })
        }
    }

    fn current(&self) -> Result<(), GpuError> {
        // SAFETY: a valid device index, checked at open.
        check(self.hip, "hipSetDevice", unsafe {
            (self.hip.hipSetDevice)(self.device)
        })
    }

    /// Waits for the kernels launched on our stream, which a synchronous copy does not wait for.
    fn wait(&self) -> Result<(), GpuError> {
        // SAFETY: our own stream.
        check(self.hip, "hipStreamSynchronize", unsafe {
            (self.hip.hipStreamSynchronize)(self.stream as *mut c_void)
        })
    }
}

impl Drop for RocmRuntime {
    fn drop(&mut self) {
        let state = self.state.get_mut().unwrap_or_else(|e| e.into_inner());
        for m in state.modules.values() {
            // SAFETY: loaded by `function`, unloaded once.
            unsafe { (self.hip.hipModuleUnload)(*m as *mut c_void) };
        }
        // SAFETY: created at open, destroyed once.
        unsafe { (self.hip.hipStreamDestroy)(self.stream as *mut c_void) };
    }
}

impl Runtime for RocmRuntime {
    fn alloc(&self, bytes: usize) -> Result<u64, GpuError> {
        self.current()?;
        let mut p = std::ptr::null_mut();
        // SAFETY: a plain allocation into a valid out-pointer.
        check(self.hip, "hipMalloc", unsafe {
            (self.hip.hipMalloc)(&mut p, bytes)
        })?;
        Ok(p as u64)
    }

    unsafe fn free(&self, ptr: u64) {
        if self.current().is_ok() {
            // SAFETY: the caller's contract.
            unsafe { (self.hip.hipFree)(ptr as *mut c_void) };
        }
    }

    fn htod(&self, dst: u64, src: &[u8]) -> Result<(), GpuError> {
        self.current()?;
        self.wait()?;
        // SAFETY: `dst` holds at least `src.len()` bytes (Buffer checks lengths); the copy is synchronous.
        check(self.hip, "hipMemcpyHtoD", unsafe {
            (self.hip.hipMemcpyHtoD)(dst as *mut c_void, src.as_ptr().cast(), src.len())
        })
    }

    fn zero(&self, dst: u64, bytes: usize) -> Result<(), GpuError> {
        self.current()?;
        // SAFETY: `dst` holds at least `bytes` bytes (Buffer's own size); our stream.
        check(self.hip, "hipMemsetAsync", unsafe {
            (self.hip.hipMemsetAsync)(dst as *mut c_void, 0, bytes, self.stream as *mut c_void)
        })
    }

    fn dtoh(&self, src: u64, dst: &mut [u8]) -> Result<(), GpuError> {
        self.current()?;
        self.wait()?;
        // SAFETY: `src` holds at least `dst.len()` bytes.
        check(self.hip, "hipMemcpyDtoH", unsafe {
            (self.hip.hipMemcpyDtoH)(dst.as_mut_ptr().cast(), src as *mut c_void, dst.len())
        })
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
                let code = compile_for(kernel, None)?;
                let mut m = std::ptr::null_mut();
                // SAFETY: `code` is a code object hiprtc built for the current device.
                check(self.hip, "hipModuleLoadData", unsafe {
                    (self.hip.hipModuleLoadData)(&mut m, code.as_ptr().cast())
                })?;
                state.modules.insert(kernel.name, m as usize);
                m as usize
            }
        };
        let name = CString::new(entry).expect("entry names hold no NUL");
        let mut f = std::ptr::null_mut();
        // SAFETY: `module` is loaded; `name` is one of its entry points.
        check(self.hip, "hipModuleGetFunction", unsafe {
            (self.hip.hipModuleGetFunction)(&mut f, module as *mut c_void, name.as_ptr())
        })?;
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
        check(self.hip, "hipModuleLaunchKernel", unsafe {
            (self.hip.hipModuleLaunchKernel)(
                f.0 as *mut c_void,
                grid.0,
                grid.1,
                grid.2,
                block,
                1,
                1,
                shared,
                self.stream as *mut c_void,
                params.as_mut_ptr(),
                std::ptr::null_mut(),
            )
        })
    }

    fn synchronize(&self) -> Result<(), GpuError> {
        self.current()?;
        self.wait()
    }

    fn describe(&self) -> String {
        format!("{} (ROCm device {})", self.name, self.device)
    }

    fn begin_capture(&self) -> Result<(), GpuError> {
        self.current()?;
        // SAFETY: our own stream, not capturing (Gpu::capture pairs begin and end).
        check(self.hip, "hipStreamBeginCapture", unsafe {
            (self.hip.hipStreamBeginCapture)(self.stream as *mut c_void, CAPTURE_RELAXED)
        })
    }

    fn end_capture(&self) -> Result<usize, GpuError> {
        self.current()?;
        let mut graph = std::ptr::null_mut();
        // SAFETY: the stream is capturing (begin_capture succeeded).
        check(self.hip, "hipStreamEndCapture", unsafe {
            (self.hip.hipStreamEndCapture)(self.stream as *mut c_void, &mut graph)
        })?;
        let mut exec = std::ptr::null_mut();
        // SAFETY: `graph` was just captured; the executable keeps what it needs, so the graph is destroyed.
        let r = unsafe {
            (self.hip.hipGraphInstantiate)(
                &mut exec,
                graph,
                std::ptr::null_mut(),
                std::ptr::null_mut(),
                0,
            )
        };
        // SAFETY: as above.
        unsafe { (self.hip.hipGraphDestroy)(graph) };
        check(self.hip, "hipGraphInstantiate", r)?;
        Ok(exec as usize)
    }

    fn replay(&self, graph: usize) -> Result<(), GpuError> {
        self.current()?;
        // SAFETY: `graph` is an executable graph from `end_capture`.
        check(self.hip, "hipGraphLaunch", unsafe {
            (self.hip.hipGraphLaunch)(graph as *mut c_void, self.stream as *mut c_void)
        })
    }

    unsafe fn release(&self, graph: usize) {
        if self.current().is_ok() {
            // SAFETY: the caller's contract.
            unsafe { (self.hip.hipGraphExecDestroy)(graph as *mut c_void) };
        }
    }
}

// SAFETY: the function pointers and handles are process-wide; module loading is serialised by the mutex and
// every call selects the device first.
unsafe impl Send for RocmRuntime {}
unsafe impl Sync for RocmRuntime {}
