//! The shard store: on each rank, one flat buffer per EMU it belongs to, carved per tensor by
//! the position's size table and per state section (θ, then ω), every byte charged to the ledger.
//!
//! The buffers live in a [`ShardMemory`]: host memory by default, or one device allocation per
//! shard (`emu::device`) charged against the device's capacity as its driver reports it.

use std::collections::BTreeMap;

use nereus_core::config::Dtype;
use nereus_core::cost::{MemoryBreakdown, MemoryItem};
use nereus_core::model::{shard_bytes, Position, ShardTable};

use super::memory::{HostMemory, ShardMemory};
use super::shard::{shard_charges, LocalShard, ShardBuffer};
use super::{EmuError, EmuId, MemoryLedger, Section};

/// Every shard this rank holds, its ledger, its memory, and a cache of freed buffers.
///
/// Freed shard buffers are kept (like a GPU caching allocator) and handed out again for shards
/// of the same size, already paged in; they are dropped whenever live shards plus the cache
/// would exceed the capacity, so real memory never passes it. The ledger charges live bytes.
#[derive(Debug)]
pub struct ShardStore<M: ShardMemory = HostMemory> {
    ledger: MemoryLedger,
    memory: M,
    shards: BTreeMap<EmuId, LocalShard<M::Buffer>>,
    cache: Vec<M::Buffer>,
}

impl ShardStore {
    /// An empty host store for `rank` with `capacity` bytes of device memory.
    pub fn new(rank: i32, capacity: u64) -> ShardStore {
        ShardStore::in_memory(rank, capacity, HostMemory)
    }
}

impl<M: ShardMemory> ShardStore<M> {
    /// An empty store for `rank` in `memory`: `capacity` bytes, or the device's real capacity
    /// when the driver reports less.
    pub fn in_memory(rank: i32, capacity: u64, memory: M) -> ShardStore<M> {
        let capacity = memory.device_capacity().map_or(capacity, |device| device.min(capacity));
        ShardStore { ledger: MemoryLedger::new(rank, capacity), memory, shards: BTreeMap::new(), cache: Vec::new() }
    }

    /// The ledger.
    pub fn ledger(&self) -> &MemoryLedger {
        &self.ledger
    }

    /// The ledger, for charging buffers other than shards (activations, KV cache).
    pub fn ledger_mut(&mut self) -> &mut MemoryLedger {
        &mut self.ledger
    }

    /// The memory the shards live in.
    pub fn memory(&self) -> &M {
        &self.memory
    }

    /// Bytes held in the cache of freed buffers.
    pub fn cached_bytes(&self) -> u64 {
        self.cache.iter().map(|b| b.byte_len()).sum()
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
    ) -> Result<LocalShard<M::Buffer>, EmuError> {
        let bytes = shard_bytes(&table, &sections, dtype);
        let charges = shard_charges(&table, &sections, dtype);
        if !self.ledger.fits(bytes) {
            // One message for the whole shard, under the item of its largest part.
            self.ledger.charge(MemoryItem::Params, bytes)?;
        }
        for item in MemoryItem::ALL {
            self.ledger.charge(item, charges.get(item))?;
        }
        let buffer = match self.buffer(bytes) {
            Ok(buffer) => buffer,
            Err(e) => {
                self.ledger.release_all(&charges);
                return Err(e);
            }
        };
        Ok(LocalShard { emu, position, table, sections, dtype, buffer })
    }

    /// A buffer of `bytes` with unspecified contents: a cached one of that size, or a new one
    /// once the cache has dropped what live shards leave no room for.
    fn buffer(&mut self, bytes: u64) -> Result<M::Buffer, EmuError> {
        if let Some(i) = self.cache.iter().position(|b| b.byte_len() == bytes) {
            return Ok(self.cache.swap_remove(i));
        }
        while self.ledger.used() + self.cached_bytes() > self.ledger.capacity() && !self.cache.is_empty() {
            self.cache.remove(0);
        }
        self.memory.allocate(bytes)
    }

    /// Scratch buffers of `sizes` bytes (a redistribution's pack and unpack buffers), from the
    /// cache where it has them: a transition that ran before finds its scratch paged in, as a
    /// GPU caching allocator hands it back. The caller charges them to the ledger and returns
    /// them with [`ShardStore::keep_buffers`].
    pub fn take_buffers(&mut self, sizes: &[u64]) -> Result<Vec<M::Buffer>, EmuError> {
        sizes.iter().map(|&bytes| self.buffer(bytes)).collect()
    }

    /// Puts buffers no shard uses into the cache.
    pub fn keep_buffers(&mut self, buffers: Vec<M::Buffer>) {
        self.cache.extend(buffers);
    }

    /// Every buffer of the store, live shards' and cached, for another store to reuse
    /// ([`ShardStore::keep_buffers`]): the memory of one process across benchmark repetitions.
    pub fn into_buffers(self) -> Vec<M::Buffer> {
        self.shards.into_values().map(|s| s.buffer).chain(self.cache).collect()
    }

    /// Takes in a shard whose bytes the caller has already charged to this store's ledger.
    pub fn adopt(&mut self, shard: LocalShard<M::Buffer>) {
        self.shards.insert(shard.emu, shard);
    }

    /// Frees a shard: its bytes return to the ledger and its buffer to the cache.
    pub fn free(&mut self, emu: EmuId) {
        if let Some(shard) = self.shards.remove(&emu) {
            self.ledger.release_all(&shard.held());
            self.cache.push(shard.buffer);
        }
    }

    /// Re-labels what a source shard held (`source`, see [`LocalShard::held`]) as `target`,
    /// which now lives in its buffer (a Merge sliced in place, the source taken out of the
    /// store). The total stays what the buffer holds.
    pub fn recharge_in_place(&mut self, source: &MemoryBreakdown, target: &LocalShard<M::Buffer>) {
        self.ledger.release_all(source);
        self.ledger.charge_within(&target.held());
    }

    /// Removes a shard for a moment without returning its bytes to the ledger (it stays
    /// charged); hand it back with [`ShardStore::put`].
    pub fn take(&mut self, emu: EmuId) -> Option<LocalShard<M::Buffer>> {
        self.shards.remove(&emu)
    }

    /// Returns a shard taken with [`ShardStore::take`].
    pub fn put(&mut self, shard: LocalShard<M::Buffer>) {
        self.shards.insert(shard.emu, shard);
    }

    /// The shard of `emu` and the ledger at once, so the engine can read parameters in place
    /// while charging its activations.
    pub fn shard_and_ledger(&mut self, emu: EmuId) -> Option<(&mut LocalShard<M::Buffer>, &mut MemoryLedger)> {
        self.shards.get_mut(&emu).map(|s| (s, &mut self.ledger))
    }

    /// The shard of `emu`, if this rank holds one.
    pub fn get(&self, emu: EmuId) -> Option<&LocalShard<M::Buffer>> {
        self.shards.get(&emu)
    }

    /// Mutable access to the shard of `emu`.
    pub fn get_mut(&mut self, emu: EmuId) -> Option<&mut LocalShard<M::Buffer>> {
        self.shards.get_mut(&emu)
    }

    /// Every shard held.
    pub fn shards(&self) -> impl Iterator<Item = &LocalShard<M::Buffer>> {
        self.shards.values()
    }

    /// A host copy of the shard of `emu`, after every pending write to it.
    pub fn read_shard(&self, emu: EmuId) -> Result<Option<LocalShard>, EmuError> {
        let Some(shard) = self.shards.get(&emu) else { return Ok(None) };
        let bytes = self.memory.read(&shard.buffer)?.into_owned();
        Ok(Some(shard.with_buffer(bytes)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Scratch comes back from the cache by size (the same allocation, already paged in), and a
    /// store hands every buffer it has, live or cached, to the next one.
    #[test]
    fn scratch_is_reused_by_size_and_a_store_passes_every_buffer_on() {
        let mut store = ShardStore::new(0, 1 << 20);
        let first = store.take_buffers(&[64, 128]).unwrap();
        let addresses: Vec<*const u8> = first.iter().map(|b| b.as_ptr()).collect();
        store.keep_buffers(first);
        assert_eq!(store.cached_bytes(), 192);
        let again = store.take_buffers(&[128, 64, 32]).unwrap();
        assert_eq!(again[0].as_ptr(), addresses[1], "the 128-byte buffer is the cached one");
        assert_eq!(again[1].as_ptr(), addresses[0], "the 64-byte buffer is the cached one");
        assert_eq!((again[2].len(), store.cached_bytes()), (32, 0), "a size the cache lacks is allocated");
        store.keep_buffers(again);
        let mut sizes: Vec<usize> = store.into_buffers().iter().map(Vec::len).collect();
        sizes.sort_unstable();
        assert_eq!(sizes, [32, 64, 128]);
    }
}
