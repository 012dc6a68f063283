//! The per-rank memory ledger: every buffer is charged against the device capacity before it
//! is allocated, so running out is an error raised before anything is allocated or moved.

use serde::{Deserialize, Serialize};

use super::EmuError;

/// Bytes charged on one rank against its capacity.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct MemoryLedger {
    rank: i32,
    capacity: u64,
    used: u64,
    peak: u64,
}

impl MemoryLedger {
    /// A ledger for `rank` with `capacity` bytes.
    pub fn new(rank: i32, capacity: u64) -> MemoryLedger {
        MemoryLedger { rank, capacity, used: 0, peak: 0 }
    }

    /// Whether `bytes` more would fit.
    pub fn fits(&self, bytes: u64) -> bool {
        self.used.checked_add(bytes).is_some_and(|total| total <= self.capacity)
    }

    /// Charges `bytes` for `what`, or fails without charging anything.
    pub fn charge(&mut self, what: &str, bytes: u64) -> Result<(), EmuError> {
        if !self.fits(bytes) {
            return Err(EmuError::OutOfMemory {
                rank: self.rank,
                what: what.to_string(),
                bytes,
                used: self.used,
                capacity: self.capacity,
            });
        }
        self.used += bytes;
        self.peak = self.peak.max(self.used);
        Ok(())
    }

    /// Returns `bytes` to the ledger.
    pub fn release(&mut self, bytes: u64) {
        self.used = self.used.saturating_sub(bytes);
    }

    /// Bytes charged now.
    pub fn used(&self) -> u64 {
        self.used
    }

    /// Highest `used` so far.
    pub fn peak(&self) -> u64 {
        self.peak
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
    fn over_capacity_fails_without_charging() {
        let mut l = MemoryLedger::new(3, 100);
        l.charge("a", 60).unwrap();
        let err = l.charge("b", 50).unwrap_err();
        assert!(err.to_string().contains("rank 3"), "{err}");
        assert_eq!(l.used(), 60);
        l.release(60);
        l.charge("b", 100).unwrap();
        assert_eq!(l.peak(), 100);
    }
}
