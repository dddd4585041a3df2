//! Every kernel compiles for every vendor this machine has a compiler for, without a GPU: NVRTC (the
//! `cuda` feature, libnvrtc on the library path: `scripts/gpu_compile_check.sh` installs it from PyPI) and
//! clang-19 in HIP device-only mode for RDNA 3 / 3.5 (gfx1100, gfx1151; wave32).

use std::path::Path;
use std::process::Command;

use hearth::gpu::{KERNELS, Target, compile, compiler_present};

/// The NVIDIA architectures compiled: the lent H100/H200 (sm_90) and the two before and after it that
/// current drivers run.
const SM: &[(i32, i32)] = &[(8, 0), (8, 9), (9, 0), (12, 0)];

#[test]
fn nvrtc_compiles_every_kernel() {
    let target = Target::Nvidia { major: 9, minor: 0 };
    if !compiler_present(target) {
        eprintln!(
            "nvrtc_compiles_every_kernel: skipped, {}",
            if cfg!(feature = "cuda") {
                "libnvrtc.so did not load (scripts/gpu_compile_check.sh installs it)"
            } else {
                "built without the `cuda` feature"
            }
        );
        return;
    }
    for &(major, minor) in SM {
        for k in KERNELS {
            let cubin = compile(k, Target::Nvidia { major, minor })
                .unwrap_or_else(|e| panic!("sm_{major}{minor}: {e}"));
            assert_eq!(&cubin[..4], b"\x7fELF", "{}: not a CUBIN", k.name);
            for e in k.entries {
                assert!(
                    cubin.windows(e.len()).any(|w| w == e.as_bytes()),
                    "{}: no `{e}` in the CUBIN",
                    k.name
                );
            }
        }
    }
}

#[test]
fn hiprtc_compiles_every_kernel() {
    let target = Target::Amd("gfx1100");
    if !compiler_present(target) {
        eprintln!(
            "hiprtc_compiles_every_kernel: skipped, libhiprtc.so did not load (or no `rocm` feature)"
        );
        return;
    }
    for arch in ["gfx1100", "gfx1151"] {
        for k in KERNELS {
            let code = compile(k, Target::Amd(arch)).unwrap_or_else(|e| panic!("{arch}: {e}"));
            assert!(!code.is_empty(), "{}: empty code object", k.name);
        }
    }
}

/// `HEARTH_CLANG`, else `clang-19` on the path.
fn clang() -> Option<String> {
    let name = std::env::var("HEARTH_CLANG").unwrap_or_else(|_| "clang-19".into());
    let ok = Command::new(&name)
        .arg("--version")
        .output()
        .map(|o| o.status.success())
        .unwrap_or(false);
    ok.then_some(name)
}

#[test]
fn clang_compiles_every_kernel_for_rdna() {
    let Some(clang) = clang() else {
        eprintln!(
            "clang_compiles_every_kernel_for_rdna: skipped, clang-19 not found (apt-get install clang-19)"
        );
        return;
    };
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("kernels");
    let out = tempfile::tempdir().unwrap();
    for arch in ["gfx1100", "gfx1151"] {
        for k in KERNELS {
            let asm = out.path().join(format!("{}-{arch}.s", k.name));
            // Device-only assembly: the whole compiler back end runs, with no ROCm install and no linker.
            let o = Command::new(&clang)
                .args(["-x", "hip", "--cuda-device-only", "-nogpulib", "-nogpuinc"])
                .arg(format!("--offload-arch={arch}"))
                .args(["-O2", "-std=c++17", "-Werror", "-S"])
                .arg("-I")
                .arg(&dir)
                .arg(dir.join(format!("{}.cu", k.name)))
                .arg("-o")
                .arg(&asm)
                .output()
                .unwrap();
            assert!(
                o.status.success(),
                "{} for {arch}:\n{}",
                k.name,
                String::from_utf8_lossy(&o.stderr)
            );
            let text = std::fs::read_to_string(&asm).unwrap();
            for e in k.entries {
                assert!(
                    text.contains(&format!("{e}:")),
                    "{}: no `{e}` for {arch}",
                    k.name
                );
            }
            assert!(
                text.contains(&format!("\"{arch}\"")) || text.contains(arch),
                "{arch}"
            );
        }
    }
}

/// The table the runtime compiles from names every `.cu` file in `kernels/` (a new file cannot be forgotten)
/// and every `extern "C" __global__` entry each file defines.
#[test]
fn kernel_table_matches_the_kernels_folder() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("kernels");
    let mut files: Vec<String> = std::fs::read_dir(&dir)
        .unwrap()
        .filter_map(|e| {
            let name = e.unwrap().file_name().into_string().unwrap();
            name.strip_suffix(".cu").map(str::to_string)
        })
        .collect();
    files.sort();
    let mut table: Vec<String> = KERNELS.iter().map(|k| k.name.to_string()).collect();
    table.sort();
    assert_eq!(files, table);
    for k in KERNELS {
        let defined: Vec<&str> = k
            .source
            .split("extern \"C\" __global__ void ")
            .skip(1)
            .map(|s| s.split('(').next().unwrap())
            .collect();
        assert_eq!(defined, k.entries, "{}", k.name);
    }
}
