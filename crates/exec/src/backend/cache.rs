//! Device blocks kept for reuse: the caching half of [`super::gpu::Device`]'s allocator.
//!
//! A training step allocates the same buffers in the same sizes every time (activations,
//! workspaces, gradients), so a block freed by one step is exactly the size the next step asks
//! for. Blocks are kept by exact size and handed out again without a driver call, as PyTorch's
//! caching allocator does (Paszke et al., 2019, §5.3). Every block in the cache was freed on the
//! device's current stream, so a block handed out again is ordered after every use before its
//! free; the device returns the whole cache to the runtime when the stream changes (a
//! transition: the layouts, and so the sizes, change) and when the runtime refuses an
//! allocation.

use std::collections::HashMap;

use nereus_kernels::DevicePtr;

/// Freed device blocks by exact size, and the bytes they hold.
#[derive(Debug, Default)]
pub(super) struct BlockCache {
    by_size: HashMap<u64, Vec<DevicePtr>>,
    bytes: u64,
}

impl BlockCache {
    /// A cached block of exactly `size` bytes, if there is one.
    pub(super) fn take(&mut self, size: u64) -> Option<DevicePtr> {
        let ptr = self.by_size.get_mut(&size)?.pop()?;
        self.bytes -= size;
        Some(ptr)
    }

    /// Keeps `ptr`, a block of `size` bytes nothing enqueued later uses, for reuse.
    pub(super) fn put(&mut self, size: u64, ptr: DevicePtr) {
        self.by_size.entry(size).or_default().push(ptr);
        self.bytes += size;
    }

    /// Bytes held in cached blocks.
    pub(super) fn bytes(&self) -> u64 {
        self.bytes
    }

    /// Every cached block, leaving the cache empty.
    pub(super) fn drain(&mut self) -> Vec<DevicePtr> {
        self.bytes = 0;
        self.by_size.drain().flat_map(|(_, blocks)| blocks).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn blocks_come_back_by_exact_size_and_the_bytes_follow() {
        let mut cache = BlockCache::default();
        cache.put(256, DevicePtr(1));
        cache.put(256, DevicePtr(2));
        cache.put(512, DevicePtr(3));
        assert_eq!(cache.bytes(), 1024);
        assert_eq!(cache.take(128), None, "no block of another size is split or rounded");
        assert_eq!(cache.take(256), Some(DevicePtr(2)), "the most recently freed first");
        assert_eq!(cache.bytes(), 768);
        let mut rest = cache.drain();
        rest.sort_by_key(|p| p.0);
        assert_eq!(rest, [DevicePtr(1), DevicePtr(3)]);
        assert_eq!((cache.bytes(), cache.take(256)), (0, None));
    }
}
