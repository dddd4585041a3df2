//! glibc allocator settings for a process that runs for days and trains in it.

/// Tunes glibc's malloc for hearth's main job; call first in `main`, before any other thread exists.
///
/// - Two arenas: glibc gives each thread that allocates its own heap arena and keeps freed memory there; with a
///   dozen actor, serving and compute threads the main job would hold far more memory than its model needs.
/// - Blocks up to 32 MiB (glibc's ceiling for the setting) come from the heap, and freed heap memory is kept
///   (trim threshold 1 GiB, 64 MiB padding per heap growth): a training step allocates and frees the same
///   multi-megabyte activations every step, and with glibc's defaults they are mapped, zeroed by the kernel
///   and unmapped again each time, page faults and clearing that slow training down. Memory then stays at the
///   peak a step needs instead of returning to the system between steps.
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

/// Returns the heap's free memory to the system. The settings above keep a training step's peak between
/// steps on purpose; once a cycle or a verdict is done that peak is idle until the next one, and with two
/// arenas and a 1 GiB trim threshold it would otherwise stay resident, growing with each cycle's pattern.
#[cfg(all(target_os = "linux", target_env = "gnu"))]
pub fn release_free_memory() {
    // SAFETY: malloc_trim only returns free pages; it is safe to call from any thread at any time.
    unsafe {
        libc::malloc_trim(0);
    }
}

/// Other allocators return memory by their own policies.
#[cfg(not(all(target_os = "linux", target_env = "gnu")))]
pub fn release_free_memory() {}
