//! Engine buffers charged to the rank's memory ledger before they are allocated, so running
//! past the configured capacity is an out-of-memory error at allocation time — which the
//! runtime catches at a safe boundary — rather than a crash.

use crate::emu::MemoryLedger;

use super::{EngineError, Real};

/// A stack of charges on one rank's ledger; everything still charged is released on drop.
pub struct Arena<'l> {
    ledger: &'l mut MemoryLedger,
    charged: u64,
}

/// A position in an [`Arena`]'s stack of charges (see [`Arena::release_to`]).
#[derive(Debug, Clone, Copy)]
pub struct Mark(u64);

impl<'l> Arena<'l> {
    /// An arena charging `ledger`.
    pub fn new(ledger: &'l mut MemoryLedger) -> Arena<'l> {
        Arena { ledger, charged: 0 }
    }

    /// A zeroed buffer of `n` elements for `what`, charged first.
    pub fn zeros<T: Real>(&mut self, what: &str, n: usize) -> Result<Vec<T>, EngineError> {
        let bytes = (n * std::mem::size_of::<T>()) as u64;
        self.ledger.charge(what, bytes)?;
        self.charged += bytes;
        Ok(vec![T::ZERO; n])
    }

    /// The current position, to release back to once the buffers allocated after it are dropped.
    pub fn mark(&self) -> Mark {
        Mark(self.charged)
    }

    /// Bytes this arena has charged and not released.
    pub fn charged(&self) -> u64 {
        self.charged
    }

    /// Releases `bytes` of this arena's charges (buffers the caller has dropped, e.g. one
    /// micro-batch's activations, which 1F1B frees first-in first-out).
    pub fn release(&mut self, bytes: u64) {
        let bytes = bytes.min(self.charged);
        self.ledger.release(bytes);
        self.charged -= bytes;
    }

    /// Releases every charge made since `mark` (the caller has dropped those buffers).
    pub fn release_to(&mut self, mark: Mark) {
        self.ledger.release(self.charged - mark.0);
        self.charged = mark.0;
    }
}

impl Drop for Arena<'_> {
    fn drop(&mut self) {
        self.ledger.release(self.charged);
    }
}
