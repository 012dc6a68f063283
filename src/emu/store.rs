//! The shard store: on each rank, one flat buffer per EMU it belongs to, carved per tensor by
//! the position's size table and per state section (θ, then ω), every byte charged to the ledger.

use std::collections::BTreeMap;
use std::ops::Range;

use crate::config::Dtype;
use crate::cost::{MemoryBreakdown, MemoryItem};
use crate::model::{Piece, Position, ShardTable};

use super::{EmuError, EmuId, MemoryLedger, Section};

/// This rank's shard of one EMU: `sections.len()` back-to-back copies of the size table's
/// layout, section `s` holding `table.elements` elements of `s.element_bytes(dtype)` bytes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LocalShard {
    /// The EMU.
    pub emu: EmuId,
    /// This rank's position in it.
    pub position: Position,
    /// Which rectangles of which tensors, in buffer order.
    pub table: ShardTable,
    /// State sections, in buffer order.
    pub sections: Vec<Section>,
    /// Parameter dtype.
    pub dtype: Dtype,
    /// The flat buffer.
    pub buffer: Vec<u8>,
}

/// Bytes of a shard with `table` and `sections`.
pub fn shard_bytes(table: &ShardTable, sections: &[Section], dtype: Dtype) -> u64 {
    sections.iter().map(|s| table.elements * s.element_bytes(dtype)).sum()
}

/// A shard's bytes as the ledger charges them: the parameters under `params`, the moments and
/// the master copy under `optimizer`.
pub fn shard_charges(table: &ShardTable, sections: &[Section], dtype: Dtype) -> MemoryBreakdown {
    let mut m = MemoryBreakdown::default();
    for s in sections {
        let item = if *s == Section::Params { MemoryItem::Params } else { MemoryItem::Optimizer };
        m.add(item, table.elements * s.element_bytes(dtype));
    }
    m
}

impl LocalShard {
    /// A zero-filled shard (the caller has charged its bytes).
    pub fn zeroed(
        emu: EmuId,
        position: Position,
        table: ShardTable,
        sections: Vec<Section>,
        dtype: Dtype,
    ) -> LocalShard {
        let bytes = shard_bytes(&table, &sections, dtype) as usize;
        LocalShard { emu, position, table, sections, dtype, buffer: vec![0u8; bytes] }
    }

    /// Byte range of section `s` in the buffer.
    pub fn section_range(&self, s: usize) -> Range<usize> {
        let start: u64 = self.sections[..s].iter().map(|x| self.table.elements * x.element_bytes(self.dtype)).sum();
        let len = self.table.elements * self.sections[s].element_bytes(self.dtype);
        start as usize..(start + len) as usize
    }

    /// The piece of tensor `tensor`, if this shard holds part of it.
    pub fn piece(&self, tensor: usize) -> Option<&Piece> {
        self.table.pieces.iter().find(|p| p.tensor == tensor)
    }

    /// Bytes in the buffer.
    pub fn bytes(&self) -> u64 {
        self.buffer.len() as u64
    }

    /// Its bytes as the ledger charges them.
    pub fn charges(&self) -> MemoryBreakdown {
        shard_charges(&self.table, &self.sections, self.dtype)
    }
}

/// Every shard this rank holds, its ledger, and a cache of freed buffers.
///
/// Freed shard buffers are kept (like a GPU caching allocator) and handed out again for shards
/// of the same size, already paged in; they are dropped whenever live shards plus the cache
/// would exceed the capacity, so real memory never passes it. The ledger charges live bytes.
#[derive(Debug)]
pub struct ShardStore {
    ledger: MemoryLedger,
    shards: BTreeMap<EmuId, LocalShard>,
    cache: Vec<Vec<u8>>,
}

impl ShardStore {
    /// An empty store for `rank` with `capacity` bytes of device memory.
    pub fn new(rank: i32, capacity: u64) -> ShardStore {
        ShardStore { ledger: MemoryLedger::new(rank, capacity), shards: BTreeMap::new(), cache: Vec::new() }
    }

    /// The ledger.
    pub fn ledger(&self) -> &MemoryLedger {
        &self.ledger
    }

    /// The ledger, for charging buffers other than shards (activations, KV cache).
    pub fn ledger_mut(&mut self) -> &mut MemoryLedger {
        &mut self.ledger
    }

    /// Bytes held in the cache of freed buffers.
    pub fn cached_bytes(&self) -> u64 {
        self.cache.iter().map(|b| b.len() as u64).sum()
    }

    /// Charges a new shard and builds it on a cached buffer of the right size if there is one.
    /// Its contents are unspecified (a redistribution overwrites every byte).
    pub fn new_shard(
        &mut self,
        emu: EmuId,
        position: Position,
        table: ShardTable,
        sections: Vec<Section>,
        dtype: Dtype,
    ) -> Result<LocalShard, EmuError> {
        let bytes = shard_bytes(&table, &sections, dtype);
        let charges = shard_charges(&table, &sections, dtype);
        if !self.ledger.fits(bytes) {
            // One message for the whole shard, under the item of its largest part.
            self.ledger.charge(MemoryItem::Params, bytes)?;
        }
        for item in MemoryItem::ALL {
            self.ledger.charge(item, charges.get(item))?;
        }
        let buffer = match self.cache.iter().position(|b| b.len() as u64 == bytes) {
            Some(i) => self.cache.swap_remove(i),
            None => {
                while self.ledger.used() + self.cached_bytes() > self.ledger.capacity() && !self.cache.is_empty() {
                    self.cache.remove(0);
                }
                vec![0u8; bytes as usize]
            }
        };
        Ok(LocalShard { emu, position, table, sections, dtype, buffer })
    }

    /// Takes in a shard whose bytes the caller has already charged to this store's ledger.
    pub fn adopt(&mut self, shard: LocalShard) {
        self.shards.insert(shard.emu, shard);
    }

    /// Frees a shard: its bytes return to the ledger and its buffer to the cache.
    pub fn free(&mut self, emu: EmuId) {
        if let Some(shard) = self.shards.remove(&emu) {
            self.ledger.release_all(&shard.charges());
            self.cache.push(shard.buffer);
        }
    }

    /// Removes a shard for a moment without returning its bytes to the ledger (it stays
    /// charged); hand it back with [`ShardStore::put`].
    pub fn take(&mut self, emu: EmuId) -> Option<LocalShard> {
        self.shards.remove(&emu)
    }

    /// Returns a shard taken with [`ShardStore::take`].
    pub fn put(&mut self, shard: LocalShard) {
        self.shards.insert(shard.emu, shard);
    }

    /// The shard of `emu` and the ledger at once, so the engine can read parameters in place
    /// while charging its activations.
    pub fn shard_and_ledger(&mut self, emu: EmuId) -> Option<(&mut LocalShard, &mut MemoryLedger)> {
        self.shards.get_mut(&emu).map(|s| (s, &mut self.ledger))
    }

    /// The shard of `emu`, if this rank holds one.
    pub fn get(&self, emu: EmuId) -> Option<&LocalShard> {
        self.shards.get(&emu)
    }

    /// Mutable access to the shard of `emu`.
    pub fn get_mut(&mut self, emu: EmuId) -> Option<&mut LocalShard> {
        self.shards.get_mut(&emu)
    }

    /// Every shard held.
    pub fn shards(&self) -> impl Iterator<Item = &LocalShard> {
        self.shards.values()
    }
}
