//! Work that may not take unbounded memory or time (a user's chat template renders whatever its
//! loops and string operations compute), run on a thread of its own under a byte budget and a
//! deadline.
//!
//! The budget is enforced by [`ThreadBudget`], a global allocator wrapper the `nereus` binary
//! installs: it meters the allocations of a thread that [`run_bounded`] started and, past the
//! budget, stalls that thread before the allocation is made (an allocator cannot fail an
//! allocation without aborting the process). [`run_bounded`] sees the stall and returns
//! [`Overrun::Memory`]; the stalled thread holds at most the budget until the process exits.
//! Every other thread pays one thread-local read per allocation. Without the wrapper installed
//! (a library's own tests) the deadline still holds, the budget does not.

use std::alloc::{GlobalAlloc, Layout};
use std::cell::Cell;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::RecvTimeoutError;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// A metered thread's live bytes, its budget, and where to say it went over.
#[derive(Clone, Copy)]
struct Meter {
    live: usize,
    budget: usize,
    over: *const AtomicBool,
}

thread_local! {
    // `const` and without a destructor: reading it never allocates, so the allocator may.
    static METER: Cell<Option<Meter>> = const { Cell::new(None) };
}

/// Why bounded work gave no result.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Overrun {
    /// Its live allocations passed the budget (bytes).
    Memory(usize),
    /// It ran past the deadline.
    Time(Duration),
    /// Its thread could not start, or panicked.
    Lost,
}

/// This thread metered while the value lives.
struct Metered;

impl Metered {
    fn start(budget: usize, over: &Arc<AtomicBool>) -> Metered {
        METER.with(|m| m.set(Some(Meter { live: 0, budget, over: Arc::as_ptr(over) })));
        Metered
    }
}

impl Drop for Metered {
    fn drop(&mut self) {
        let _ = METER.try_with(|m| m.set(None));
    }
}

/// The system allocator `A` with the per-thread budgets of [`run_bounded`] enforced.
pub struct ThreadBudget<A>(pub A);

/// Counts `grow` more bytes (or `shrink` fewer) against this thread's budget, if it has one;
/// past the budget, marks the overrun and never returns.
fn charge(grow: usize, shrink: usize) {
    let _ = METER.try_with(|cell| {
        let Some(mut meter) = cell.get() else { return };
        meter.live = (meter.live + grow).saturating_sub(shrink);
        // Never while unwinding: the panic hook allocates while it holds stderr's lock, which
        // the caller then needs to report the panic.
        if meter.live > meter.budget && !std::thread::panicking() {
            cell.set(None);
            // SAFETY: `over` points into an `Arc` the metered thread's closure owns until it
            // returns, and this thread is that thread.
            unsafe { &*meter.over }.store(true, Ordering::Release);
            loop {
                // Sleeping allocates nothing; the waiting caller has already given up on us.
                std::thread::sleep(Duration::from_secs(3600));
            }
        }
        cell.set(Some(meter));
    });
}

// SAFETY: every call is forwarded to `A` unchanged; `charge` only reads and writes a
// thread-local counter (or stalls the calling thread before the call).
unsafe impl<A: GlobalAlloc> GlobalAlloc for ThreadBudget<A> {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        charge(layout.size(), 0);
        unsafe { self.0.alloc(layout) }
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        charge(layout.size(), 0);
        unsafe { self.0.alloc_zeroed(layout) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        unsafe { self.0.dealloc(ptr, layout) };
        charge(0, layout.size());
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        charge(new_size.saturating_sub(layout.size()), layout.size().saturating_sub(new_size));
        unsafe { self.0.realloc(ptr, layout, new_size) }
    }
}

/// `work` run on a thread of its own, whose live allocations may not pass `budget` bytes (where
/// [`ThreadBudget`] is the global allocator) and which must finish within `deadline`. Past
/// either, the thread is abandoned (stalled, or left to finish unobserved) and the overrun
/// returned.
pub fn run_bounded<T: Send + 'static>(
    budget: usize,
    deadline: Duration,
    work: impl FnOnce() -> T + Send + 'static,
) -> Result<T, Overrun> {
    let over = Arc::new(AtomicBool::new(false));
    let flag = Arc::clone(&over);
    let (send, receive) = std::sync::mpsc::sync_channel(1);
    let thread = std::thread::Builder::new().name("bounded".into()).spawn(move || {
        // A local: unset before `flag`, a capture, is dropped, even when `work` panics.
        let _metered = Metered::start(budget, &flag);
        let _ = send.send(work());
    });
    if thread.is_err() {
        return Err(Overrun::Lost);
    }
    let start = Instant::now();
    loop {
        match receive.recv_timeout(Duration::from_millis(20)) {
            Ok(out) => return Ok(out),
            Err(RecvTimeoutError::Disconnected) => return Err(Overrun::Lost),
            Err(RecvTimeoutError::Timeout) if over.load(Ordering::Acquire) => return Err(Overrun::Memory(budget)),
            Err(RecvTimeoutError::Timeout) if start.elapsed() >= deadline => return Err(Overrun::Time(deadline)),
            Err(RecvTimeoutError::Timeout) => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[global_allocator]
    static ALLOCATOR: ThreadBudget<std::alloc::System> = ThreadBudget(std::alloc::System);

    #[test]
    fn work_within_its_budget_returns_and_work_past_it_is_abandoned() {
        let small = run_bounded(1 << 20, Duration::from_secs(10), || vec![7u8; 1000].len());
        assert_eq!(small, Ok(1000));
        let doubling = run_bounded(1 << 20, Duration::from_secs(10), || {
            let mut s = String::from("x");
            for _ in 0..40 {
                s = format!("{s}{s}");
            }
            s.len()
        });
        assert_eq!(doubling, Err(Overrun::Memory(1 << 20)));
        let slow = run_bounded(1 << 20, Duration::from_millis(50), || std::thread::sleep(Duration::from_secs(5)));
        assert_eq!(slow, Err(Overrun::Time(Duration::from_millis(50))));
        // A panic's hook may allocate past the budget (a backtrace): it is not stalled.
        let panics = run_bounded(1, Duration::from_secs(10), || -> u8 { panic!("inside") });
        assert_eq!(panics, Err(Overrun::Lost));
    }
}
