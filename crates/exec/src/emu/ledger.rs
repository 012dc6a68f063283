//! The per-rank memory ledger: every buffer is charged against the device capacity before it
//! is allocated, so running out is an error raised before anything is allocated or moved.
//! Charges are kept per [`MemoryItem`], the names the cost model predicts under, and the
//! breakdown at the highest total is remembered, so a measured peak can be compared with a
//! predicted one item by item.

use serde::Serialize;

use super::EmuError;
use nereus_core::cost::{MemoryBreakdown, MemoryItem};

/// Bytes charged on one rank against its capacity.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct MemoryLedger {
    rank: i32,
    capacity: u64,
    used: MemoryBreakdown,
    at_peak: MemoryBreakdown,
    /// Each item's own highest charge, whenever it came.
    highs: MemoryBreakdown,
}

impl MemoryLedger {
    /// A ledger for `rank` with `capacity` bytes.
    pub fn new(rank: i32, capacity: u64) -> MemoryLedger {
        let none = MemoryBreakdown::default();
        MemoryLedger { rank, capacity, used: none, at_peak: none, highs: none }
    }

    /// Whether `bytes` more would fit.
    pub fn fits(&self, bytes: u64) -> bool {
        self.used.total().checked_add(bytes).is_some_and(|total| total <= self.capacity)
    }

    /// Charges `bytes` for `item`, or fails without charging anything.
    pub fn charge(&mut self, item: MemoryItem, bytes: u64) -> Result<(), EmuError> {
        if !self.fits(bytes) {
            return Err(EmuError::OutOfMemory {
                rank: self.rank,
                what: item.name().replace('_', " "),
                bytes,
                used: self.used.total(),
                capacity: self.capacity,
            });
        }
        self.used.add(item, bytes);
        self.note_peaks();
        Ok(())
    }

    /// Remembers the breakdown at a new highest total, and each item's new highs.
    fn note_peaks(&mut self) {
        if self.used.total() > self.at_peak.total() {
            self.at_peak = self.used;
        }
        for item in MemoryItem::ALL {
            let (now, high) = (self.used.get(item), self.highs.get(item));
            if now > high {
                self.highs.add(item, now - high);
            }
        }
    }

    /// Charges `charges` without a capacity check: bytes that are already held under other
    /// items (a buffer re-labelled), so the total cannot grow past what it was.
    pub fn charge_within(&mut self, charges: &MemoryBreakdown) {
        self.used = self.used.plus(charges);
        self.note_peaks();
    }

    /// Returns `bytes` of `item` to the ledger.
    pub fn release(&mut self, item: MemoryItem, bytes: u64) {
        self.used.sub(item, bytes);
    }

    /// Returns every charge of `charges` to the ledger.
    pub fn release_all(&mut self, charges: &MemoryBreakdown) {
        for item in MemoryItem::ALL {
            self.release(item, charges.get(item));
        }
    }

    /// Bytes charged now.
    pub fn used(&self) -> u64 {
        self.used.total()
    }

    /// Bytes charged now, per item.
    pub fn used_breakdown(&self) -> MemoryBreakdown {
        self.used
    }

    /// Highest `used` since the start (or the last [`MemoryLedger::reset_peak`]).
    pub fn peak(&self) -> u64 {
        self.at_peak.total()
    }

    /// What was charged, item by item, when `used` was highest.
    pub fn peak_breakdown(&self) -> MemoryBreakdown {
        self.at_peak
    }

    /// Each item's highest charge since the start (or the last [`MemoryLedger::reset_peak`]),
    /// whether or not it came at the highest total: what bounds one kind of buffer.
    pub fn item_highs(&self) -> MemoryBreakdown {
        self.highs
    }

    /// Starts a new peak, and new item highs, from what is charged now (e.g. after a plan changed).
    pub fn reset_peak(&mut self) {
        self.at_peak = self.used;
        self.highs = self.used;
    }

    /// Capacity in bytes.
    pub fn capacity(&self) -> u64 {
        self.capacity
    }

    /// Changes the capacity (tests and memory-pressure drills); charged bytes stay charged.
    pub fn set_capacity(&mut self, capacity: u64) {
        self.capacity = capacity;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn over_capacity_fails_without_charging_and_the_peak_keeps_its_breakdown() {
        let mut l = MemoryLedger::new(3, 100);
        l.charge(MemoryItem::Params, 60).unwrap();
        let err = l.charge(MemoryItem::Activations, 50).unwrap_err();
        assert!(err.to_string().contains("rank 3") && err.to_string().contains("activations"), "{err}");
        assert_eq!(l.used(), 60);
        l.charge(MemoryItem::KvCache, 40).unwrap();
        l.release(MemoryItem::KvCache, 40);
        l.charge(MemoryItem::Activations, 30).unwrap();
        assert_eq!((l.peak(), l.peak_breakdown().get(MemoryItem::KvCache)), (100, 40));
        l.reset_peak();
        assert_eq!(l.peak(), 90);
    }
}
