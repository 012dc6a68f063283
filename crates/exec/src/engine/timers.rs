//! Per-operation-class timers: the engine's measured side of the cost model's roofline classes
//! (GEMM, attention, decode, TP all-reduce, DP all-reduce, PP send/recv, resharding).
//!
//! Each rank runs its engine on one thread, so the totals are thread-local and cost two clock
//! reads per timed operation. Timing is exclusive: an operation timed inside another (a GEMM
//! inside a decode step) counts once, in its own class, and not again in the outer one.
//! Inside [`decoding`], GEMM and attention count as `decode`, the class the cost model prices
//! generation's memory-bound steps with.

use std::cell::RefCell;
use std::time::Instant;

use nereus_core::cost::{OpClass, OpSeconds};

#[derive(Default)]
struct Timers {
    totals: OpSeconds,
    /// Open operations: their start and the time their nested operations took.
    open: Vec<(Instant, f64)>,
    decoding: bool,
}

thread_local! {
    static TIMERS: RefCell<Timers> = RefCell::new(Timers::default());
}

/// Runs `f`, adding the time it took (less any timed operation inside it) to `class`.
pub fn timed<R>(class: OpClass, f: impl FnOnce() -> R) -> R {
    TIMERS.with(|t| t.borrow_mut().open.push((Instant::now(), 0.0)));
    let out = f();
    TIMERS.with(|t| {
        let mut t = t.borrow_mut();
        let (start, nested) = t.open.pop().expect("every timed operation was opened");
        let elapsed = start.elapsed().as_secs_f64();
        let class = match class {
            OpClass::Gemm | OpClass::Attention if t.decoding => OpClass::Decode,
            other => other,
        };
        t.totals[class] += (elapsed - nested).max(0.0);
        if let Some(parent) = t.open.last_mut() {
            parent.1 += elapsed;
        }
    });
    out
}

/// Runs `f` with GEMM and attention counted as decode (generation's token-by-token steps).
pub fn decoding<R>(f: impl FnOnce() -> R) -> R {
    let before = set_decoding(true);
    let out = f();
    set_decoding(before);
    out
}

/// Counts GEMM and attention as decode from now on (`on`) or not; returns the previous
/// setting (for loops whose iterations switch between prefill and decode).
pub fn set_decoding(on: bool) -> bool {
    TIMERS.with(|t| std::mem::replace(&mut t.borrow_mut().decoding, on))
}

/// The totals since the last call, and a fresh start.
pub fn take() -> OpSeconds {
    TIMERS.with(|t| std::mem::take(&mut t.borrow_mut().totals))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn nested_operations_count_once_in_their_own_class_and_decode_takes_gemm() {
        take();
        timed(OpClass::TpAllReduce, || {
            std::thread::sleep(Duration::from_millis(20));
            timed(OpClass::Gemm, || std::thread::sleep(Duration::from_millis(30)));
        });
        decoding(|| timed(OpClass::Gemm, || std::thread::sleep(Duration::from_millis(10))));
        let t = take();
        // Sleeps last at least as long as asked; the all-reduce's own 20 ms stay well below the
        // 50 ms it would show if the nested GEMM were counted in it too.
        assert!((0.020..0.045).contains(&t[OpClass::TpAllReduce]), "{t:?}");
        assert!(t[OpClass::Gemm] >= 0.030, "{t:?}");
        assert!(t[OpClass::Decode] >= 0.010 && t[OpClass::Gemm] < 0.040 + 0.030, "{t:?}");
        assert_eq!(take(), OpSeconds::default(), "take starts afresh");
    }
}
