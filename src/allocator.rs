//! The C allocator's policy for this process (glibc's malloc, which Rust's system allocator
//! calls).
//!
//! glibc serves an allocation above its mmap threshold (128 KiB at start, raised by frees up to
//! 32 MiB) with a fresh `mmap`, and gives a heap top above its trim threshold back to the kernel.
//! The reference engine allocates and frees its activations and gradients in every op, so under
//! those defaults each step faulted every page of them in again, zeroed by the kernel: a
//! one-rank run of `configs/tiny-ppo.toml`'s warm-ups took 2.8–4.2 million page faults and
//! 27–34 s of CPU, 14 thousand and 17 s with the thresholds below (docs/engine.md, "The
//! allocator").

/// Allocations below this come from the heap, not from their own `mmap`.
const MMAP_THRESHOLD: i32 = 64 << 20;
/// The most an older glibc accepts: half its heap size on 64-bit.
const MMAP_THRESHOLD_OLD_GLIBC: i32 = 32 << 20;
/// The most freed heap top kept before it is given back to the kernel.
const TRIM_THRESHOLD: i32 = 128 << 20;

/// Keeps freed buffers of up to 64 MiB in the process's heap for the next op, unless the user
/// set glibc's malloc tunables (`GLIBC_TUNABLES`, `MALLOC_*_`), whose choice is kept. Call it
/// first thing in `main`.
pub fn keep_freed_buffers() {
    let user_chose = std::env::var("GLIBC_TUNABLES").is_ok_and(|t| t.contains("glibc.malloc."))
        || std::env::vars_os().any(|(name, _)| name.to_string_lossy().starts_with("MALLOC_"));
    if user_chose {
        return;
    }
    set_thresholds();
}

#[cfg(all(target_os = "linux", target_env = "gnu"))]
fn set_thresholds() {
    // SAFETY: mallopt only changes two of malloc's tuning parameters, which is sound at any
    // time; a refused value leaves the old one in place.
    unsafe {
        if libc::mallopt(libc::M_MMAP_THRESHOLD, MMAP_THRESHOLD) == 0 {
            libc::mallopt(libc::M_MMAP_THRESHOLD, MMAP_THRESHOLD_OLD_GLIBC);
        }
        libc::mallopt(libc::M_TRIM_THRESHOLD, TRIM_THRESHOLD);
    }
}

/// Other C libraries (musl, macOS) have no such thresholds to set.
#[cfg(not(all(target_os = "linux", target_env = "gnu")))]
fn set_thresholds() {}
