//! A global allocator wrapper that counts live heap bytes and their peak, so benchmarks can
//! report the memory a computation needed (`nereus bench planner`). A bench build of the binary
//! installs it (`--features alloc-meter`); the counting costs one relaxed atomic operation per
//! allocation (and a load).

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicUsize, Ordering};

static LIVE: AtomicUsize = AtomicUsize::new(0);
static PEAK: AtomicUsize = AtomicUsize::new(0);

/// The system allocator, metered.
pub struct MeteredAllocator;

// SAFETY: every call is forwarded to the system allocator unchanged; only counters are added.
unsafe impl GlobalAlloc for MeteredAllocator {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        let p = unsafe { System.alloc(layout) };
        if !p.is_null() {
            count(0, layout.size());
        }
        p
    }

    /// Forwarded too: the default would allocate and then write every byte, touching every
    /// page of a large zeroed buffer (a new shard) at once instead of taking the kernel's
    /// already-zero pages.
    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        let p = unsafe { System.alloc_zeroed(layout) };
        if !p.is_null() {
            count(0, layout.size());
        }
        p
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        unsafe { System.dealloc(ptr, layout) };
        LIVE.fetch_sub(layout.size(), Ordering::Relaxed);
    }

    /// Forwarded too: the default would allocate, copy and free, where the system allocator
    /// may grow in place.
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        let p = unsafe { System.realloc(ptr, layout, new_size) };
        if !p.is_null() {
            count(layout.size(), new_size);
        }
        p
    }
}

/// Moves the live count from `old` to `new` bytes and raises the peak. One locked operation
/// per allocation where it can be: the peak is read first and updated only when passed, and
/// nothing is subtracted for a fresh allocation (the meter should not slow down what it
/// measures: a replan allocates about a thousand times).
fn count(old: usize, new: usize) {
    let live = LIVE.fetch_add(new, Ordering::Relaxed) + new;
    if live > PEAK.load(Ordering::Relaxed) {
        PEAK.fetch_max(live, Ordering::Relaxed);
    }
    if old > 0 {
        LIVE.fetch_sub(old, Ordering::Relaxed);
    }
}

/// Whether this process allocates through the meter (a binary built with `alloc-meter`): it
/// has counted something by the time anyone asks.
pub fn installed() -> bool {
    LIVE.load(Ordering::Relaxed) > 0 || PEAK.load(Ordering::Relaxed) > 0
}

/// Starts a measurement: the peak is reset to the bytes live now, which are returned.
pub fn start() -> usize {
    let live = LIVE.load(Ordering::Relaxed);
    PEAK.store(live, Ordering::Relaxed);
    live
}

/// Peak live bytes since [`start`] returned `baseline`, above that baseline (0 when the binary
/// did not install the allocator).
pub fn peak_above(baseline: usize) -> usize {
    PEAK.load(Ordering::Relaxed).saturating_sub(baseline)
}
