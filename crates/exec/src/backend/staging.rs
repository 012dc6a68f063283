//! Pinned host memory that uploads pass through without waiting for the device.
//!
//! An upload copies its bytes into a ring of page-locked memory, enqueues the copy to the device
//! and records an event after it: the caller's bytes are free again at once and the stream never
//! stops. The ring's room is taken in order; a region is reused only once its event has
//! happened, and the host waits only when the ring has wrapped onto a copy the device has not
//! reached yet (counted: a step that uploads less than the ring holds never waits).

use std::collections::VecDeque;

use super::runtime::{GpuRuntime, RawHandle};
use super::BackendError;
use nereus_kernels::DevicePtr;

/// Bytes of pinned memory in the ring.
pub const UPLOAD_RING_BYTES: usize = 64 << 20;

/// Regions start on this boundary (the copy engines' preferred alignment).
const ALIGN: usize = 256;

/// Where a region of the ring whose copy to the device is enqueued starts, and the event
/// after the copy (the newest region ends at the ring's head).
struct Region {
    start: usize,
    event: RawHandle,
}

/// The ring (see the module comment).
pub(super) struct UploadRing {
    base: *mut u8,
    capacity: usize,
    /// Where the next region starts if it fits before the end.
    head: usize,
    /// Regions whose copies may not have run, oldest first.
    pending: VecDeque<Region>,
}

impl UploadRing {
    /// A ring of `capacity` pinned bytes.
    pub(super) fn new(runtime: &dyn GpuRuntime, capacity: usize) -> Result<UploadRing, BackendError> {
        let base = runtime.alloc_pinned(capacity)?;
        Ok(UploadRing { base, capacity, head: 0, pending: VecDeque::new() })
    }

    /// The most one copy takes of the ring (a larger upload goes in pieces, so the host fills
    /// one piece while the device copies the one before).
    pub(super) fn piece(&self) -> usize {
        self.capacity / 4
    }

    /// Copies `chunk` (at most [`UploadRing::piece`] bytes) into the ring and enqueues its copy
    /// to `dst` on `stream`. `wait` blocks until an event has happened; it is called only for a
    /// region the device has not copied yet, and the number of such waits is returned.
    ///
    /// # Safety
    /// `dst` has room for `chunk` until the stream passes the copy; `stream` is live.
    pub(super) unsafe fn upload(
        &mut self,
        runtime: &dyn GpuRuntime,
        chunk: &[u8],
        dst: DevicePtr,
        stream: RawHandle,
        wait: &dyn Fn(RawHandle) -> Result<(), BackendError>,
    ) -> Result<u64, BackendError> {
        let len = chunk.len().max(1).next_multiple_of(ALIGN);
        debug_assert!(len <= self.piece(), "a chunk of {len} bytes in a ring of {}", self.capacity);
        let mut waits = 0;
        self.reclaim(runtime)?;
        let start = loop {
            if let Some(start) = self.room(len) {
                break start;
            }
            let oldest = self.pending.pop_front().expect("a full ring has a pending region");
            waits += 1;
            let waited = wait(oldest.event);
            runtime.destroy_event(oldest.event);
            waited?;
            if self.pending.is_empty() {
                self.head = 0;
            }
        };
        let at = self.base.add(start);
        std::ptr::copy_nonoverlapping(chunk.as_ptr(), at, chunk.len());
        runtime.copy_h2d(dst, at, chunk.len() as u64, stream)?;
        let event = runtime.create_event()?;
        runtime.record(event, stream)?;
        self.pending.push_back(Region { start, event });
        self.head = start + len;
        Ok(waits)
    }

    /// Frees the regions whose copies have run, oldest first, without waiting.
    ///
    /// # Safety
    /// The pending events are live.
    unsafe fn reclaim(&mut self, runtime: &dyn GpuRuntime) -> Result<(), BackendError> {
        while let Some(oldest) = self.pending.front() {
            if !runtime.event_done(oldest.event)? {
                break;
            }
            runtime.destroy_event(oldest.event);
            self.pending.pop_front();
        }
        if self.pending.is_empty() {
            self.head = 0;
        }
        Ok(())
    }

    /// Where `len` bytes fit without touching a pending region: after the newest region, or
    /// from the start of the ring when that is free up to the oldest.
    fn room(&self, len: usize) -> Option<usize> {
        let Some(oldest) = self.pending.front() else {
            return (len <= self.capacity).then_some(0);
        };
        let tail = oldest.start;
        // Regions are taken in order, so the newest ends after the oldest starts unless the ring
        // has wrapped.
        if self.head > tail {
            // Not wrapped: free from head to the end, and from the start to the oldest.
            if self.head + len <= self.capacity {
                Some(self.head)
            } else {
                (len <= tail).then_some(0)
            }
        } else {
            // Wrapped: free from head to the oldest.
            (self.head + len <= tail).then_some(self.head)
        }
    }

    /// Returns the ring's memory to the runtime.
    ///
    /// # Safety
    /// Every copy out of the ring has run (the stream was synchronized).
    pub(super) unsafe fn release(mut self, runtime: &dyn GpuRuntime) {
        for region in self.pending.drain(..) {
            runtime.destroy_event(region.event);
        }
        runtime.free_pinned(self.base);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A ring of 4 KiB with `regions` pending (no memory behind it: only the room is asked).
    fn ring(regions: &[(usize, usize)]) -> UploadRing {
        let pending: VecDeque<Region> =
            regions.iter().map(|&(start, _)| Region { start, event: RawHandle(std::ptr::null_mut()) }).collect();
        let head = regions.last().map_or(0, |&(_, end)| end);
        UploadRing { base: std::ptr::null_mut(), capacity: 4096, head, pending }
    }

    #[test]
    fn room_is_taken_after_the_newest_region_and_wraps_only_below_the_oldest() {
        assert_eq!(ring(&[]).room(4096), Some(0));
        assert_eq!(ring(&[]).room(4097), None);
        let after_one = ring(&[(0, 1024)]);
        assert_eq!((after_one.room(3072), after_one.room(3328)), (Some(1024), None), "no wrap onto the oldest");
        let middle = ring(&[(2048, 3584)]);
        assert_eq!((middle.room(512), middle.room(1536), middle.room(2304)), (Some(3584), Some(0), None));
        let wrapped = ring(&[(2048, 3584), (0, 512)]);
        assert_eq!((wrapped.room(1536), wrapped.room(1792)), (Some(512), None), "wrapped: only up to the oldest");
        let full = ring(&[(2048, 3584), (0, 2048)]);
        assert_eq!(full.room(256), None);
    }
}
