//! Engine buffers charged to the rank's memory ledger before they are allocated, so running
//! past the configured capacity is an out-of-memory error at allocation time — which the
//! runtime catches at a safe boundary — rather than a crash. Every buffer is charged under the
//! [`MemoryItem`] the cost model predicts it under.

use crate::emu::MemoryLedger;
use nereus_core::cost::{MemoryBreakdown, MemoryItem};

use super::{EngineError, Real};

/// A stack of charges on one rank's ledger; everything still charged is released on drop.
pub struct Arena<'l> {
    ledger: &'l mut MemoryLedger,
    charged: MemoryBreakdown,
}

/// A position in an [`Arena`]'s stack of charges (see [`Arena::release_to`]).
#[derive(Debug, Clone, Copy)]
pub struct Mark(MemoryBreakdown);

impl<'l> Arena<'l> {
    /// An arena charging `ledger`.
    pub fn new(ledger: &'l mut MemoryLedger) -> Arena<'l> {
        Arena { ledger, charged: MemoryBreakdown::default() }
    }

    /// A zeroed buffer of `n` elements holding `item`, charged first.
    pub fn zeros<T: Real>(&mut self, item: MemoryItem, n: usize) -> Result<Vec<T>, EngineError> {
        self.charge(item, (n * std::mem::size_of::<T>()) as u64)?;
        Ok(vec![T::ZERO; n])
    }

    /// Charges `bytes` of `item` for a buffer allocated elsewhere (on a device).
    pub fn charge(&mut self, item: MemoryItem, bytes: u64) -> Result<(), EngineError> {
        self.ledger.charge(item, bytes)?;
        self.charged.add(item, bytes);
        Ok(())
    }

    /// The current position, to release back to once the buffers allocated after it are dropped.
    pub fn mark(&self) -> Mark {
        Mark(self.charged)
    }

    /// What this arena has charged and not released, per item.
    pub fn charged(&self) -> MemoryBreakdown {
        self.charged
    }

    /// Releases `charges` of this arena's (buffers the caller has dropped, e.g. one
    /// micro-batch's activations, which 1F1B frees first-in first-out).
    pub fn release(&mut self, charges: &MemoryBreakdown) {
        for item in MemoryItem::ALL {
            let bytes = charges.get(item).min(self.charged.get(item));
            self.ledger.release(item, bytes);
            self.charged.sub(item, bytes);
        }
    }

    /// Releases every charge made since `mark` (the caller has dropped those buffers).
    pub fn release_to(&mut self, mark: Mark) {
        let since = self.since(mark);
        self.release(&since);
    }

    /// The charges made since `mark`.
    pub fn since(&self, mark: Mark) -> MemoryBreakdown {
        let mut since = self.charged;
        for item in MemoryItem::ALL {
            since.sub(item, mark.0.get(item));
        }
        since
    }
}

impl Drop for Arena<'_> {
    fn drop(&mut self) {
        self.ledger.release_all(&self.charged);
    }
}
