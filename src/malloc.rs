//! glibc allocator settings for a process that runs for days and trains in it.

/// Tunes glibc's malloc for hearth's main job; call first in `main`, before any other thread exists.
///
/// - Two arenas: glibc gives each thread that allocates its own heap arena and keeps freed memory there; with a
///   dozen actor, serving and compute threads the main job held 7.3 GB for a 135M model, 4.4 GB with two.
/// - Blocks up to 32 MiB (glibc's ceiling for the setting) come from the heap, and freed heap memory is kept
///   (trim threshold 1 GiB, 64 MiB padding per heap growth): a training step allocates and frees the same
///   multi-megabyte activations every step, and with glibc's defaults they were mapped, zeroed by the kernel
///   and unmapped again each time (page clearing and faults were ~17% of a SmolLM2 step's CPU time). Memory
///   then stays at the peak a step needs instead of returning to the system between steps.
///
/// Measured with glibc's environment equivalents (`MALLOC_MMAP_THRESHOLD_`, `MALLOC_TRIM_THRESHOLD_`, and a
/// 512 MiB `MALLOC_TOP_PAD_`) against the defaults, alternating runs of `cargo bench --bench train_throughput`:
/// tiny model 4.7-5.8 → 8.0-9.9 K tok/s, SmolLM2 rank 8 58-69 → 76-83 tok/s.
#[cfg(all(target_os = "linux", target_env = "gnu"))]
pub fn tune_for_long_runs() {
    // SAFETY: mallopt only changes the allocator's parameters; the caller runs it before other threads exist.
    unsafe {
        libc::mallopt(libc::M_ARENA_MAX, 2);
        libc::mallopt(libc::M_MMAP_THRESHOLD, 32 << 20);
        libc::mallopt(libc::M_TRIM_THRESHOLD, 1 << 30);
        libc::mallopt(libc::M_TOP_PAD, 64 << 20);
    }
}

/// Other allocators keep their own policies.
#[cfg(not(all(target_os = "linux", target_env = "gnu")))]
pub fn tune_for_long_runs() {}
