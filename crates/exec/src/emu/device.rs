//! The device shard store: an EMU's shard on a rank is one device allocation, carved by the
//! catalogue's size table exactly as the host buffer is (same offsets, same sections), charged
//! to the same ledger, whose capacity the driver's total memory caps.
//!
//! [`DeviceMemory`] is the [`ShardMemory`]: allocations and frees are stream-ordered on the
//! device's current stream; local slices, packs and unpacks are the rectangle-copy kernels
//! (`crates/kernels/device/pack.cu`) or the copy engine; Merge with resident targets slices the
//! source in place. Host bytes cross only where a checkpoint, a digest or a test reads or writes
//! a shard, through the device's pinned staging buffer. The [`GpuPlane`] moves these buffers
//! between ranks over NCCL/RCCL ([`Exchange`]).

use std::borrow::Cow;
use std::rc::Rc;

use crate::backend::gpu::{Device, DevicePtr};
use crate::backend::BackendError;
use crate::comm::gpu_plane::GpuPlane;
use crate::comm::DeviceTransfer;
use crate::comm::{CommError, DataPlane};

use super::memory::{Buffers, Exchange, HostFill, Message, Place, RectCopy, ShardMemory};
use super::shard::ShardBuffer;
use super::{EmuError, LocalShard};

/// One device allocation; freed in stream order when dropped.
pub struct DeviceBuffer {
    ptr: DevicePtr,
    len: u64,
    device: Rc<Device>,
}

impl DeviceBuffer {
    /// Its device address.
    pub fn ptr(&self) -> DevicePtr {
        self.ptr
    }
}

impl std::fmt::Debug for DeviceBuffer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "DeviceBuffer({:#x}, {} bytes)", self.ptr.0, self.len)
    }
}

impl ShardBuffer for DeviceBuffer {
    fn byte_len(&self) -> u64 {
        self.len
    }
}

impl Drop for DeviceBuffer {
    fn drop(&mut self) {
        // SAFETY: our allocation; work enqueued before this free still sees it.
        unsafe { self.device.free(self.ptr) };
    }
}

/// Shards in one GPU's memory.
pub struct DeviceMemory {
    device: Rc<Device>,
}

impl Clone for DeviceMemory {
    fn clone(&self) -> Self {
        DeviceMemory { device: self.device.clone() }
    }
}

impl std::fmt::Debug for DeviceMemory {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "DeviceMemory({})", self.describe())
    }
}

impl DeviceMemory {
    /// Shards on `device` (the one the data plane drives).
    pub fn new(device: Rc<Device>) -> DeviceMemory {
        DeviceMemory { device }
    }

    /// The device the shards live on.
    pub fn device(&self) -> &Device {
        &self.device
    }

    /// The device, shared (to compute on while the store is borrowed).
    pub fn shared_device(&self) -> Rc<Device> {
        self.device.clone()
    }

    /// Checks that every row of `copies` lies inside buffers of `src` and `dst` bytes.
    fn check(copies: &[RectCopy], src: u64, dst: u64) -> Result<(), EmuError> {
        for c in copies.iter().filter(|c| c.rows > 0) {
            if c.src_row(c.rows - 1).end > src || c.dst_row(c.rows - 1).end > dst {
                let reason = format!("rectangle copy {c:?} outside its buffers ({src} and {dst} bytes)");
                return Err(BackendError::Driver { backend: "device store", reason }.into());
            }
        }
        Ok(())
    }
}

impl ShardMemory for DeviceMemory {
    type Buffer = DeviceBuffer;

    fn describe(&self) -> String {
        let d = self.device.runtime().device();
        format!("{} device {} ({})", self.device.runtime().backend(), d.ordinal, d.name)
    }

    fn device_capacity(&self) -> Option<u64> {
        Some(self.device.runtime().device().memory_bytes)
    }

    fn allocator_peak(&self) -> Option<u64> {
        Some(self.device.allocated_bytes().1)
    }

    fn times_operations(&self) -> bool {
        self.device.runtime().synchronous()
    }

    fn allocate(&self, bytes: u64) -> Result<DeviceBuffer, EmuError> {
        Ok(DeviceBuffer { ptr: self.device.alloc(bytes)?, len: bytes, device: self.device.clone() })
    }

    fn copy_rects(&self, src: &Self::Buffer, dst: &mut Self::Buffer, copies: &[RectCopy]) -> Result<(), EmuError> {
        Self::check(copies, src.len, dst.len)?;
        // SAFETY: every row lies inside the two allocations (checked), which are distinct.
        unsafe { self.device.copy_rects(src.ptr, dst.ptr, copies) }.map_err(EmuError::from)
    }

    fn slices_in_place(&self) -> bool {
        true
    }

    fn slice_in_place(&self, buffer: &mut Self::Buffer, copies: &[RectCopy]) -> Result<(), EmuError> {
        Self::check(copies, buffer.len, buffer.len)?;
        // SAFETY: rows inside the allocation (checked); the in-place schedule keeps each copy's
        // targets apart from its sources.
        unsafe { self.device.copy_rects(buffer.ptr, buffer.ptr, copies) }.map_err(EmuError::from)
    }

    fn read<'b>(&self, buffer: &'b Self::Buffer) -> Result<Cow<'b, [u8]>, EmuError> {
        let mut bytes = vec![0u8; buffer.len as usize];
        self.device.download(buffer.ptr, &mut bytes)?;
        Ok(Cow::Owned(bytes))
    }

    fn write(&self, bytes: &[u8], buffer: &mut Self::Buffer) -> Result<(), EmuError> {
        Ok(self.device.upload(&bytes[..bytes.len().min(buffer.len as usize)], buffer.ptr)?)
    }

    fn fill_from_host(&self, shard: &mut LocalShard<Self::Buffer>, fill: &mut HostFill<'_>) -> Result<(), String> {
        let mut host = shard.with_buffer(vec![0u8; shard.buffer.len as usize]);
        fill(&mut host)?;
        self.write(&host.buffer, &mut shard.buffer).map_err(|e| e.to_string())
    }
}

impl<C: DataPlane> Exchange<DeviceMemory> for GpuPlane<'_, C> {
    fn exchange_buffers(
        &self,
        _memory: &DeviceMemory,
        messages: &[Message],
        buffers: Buffers<'_, '_, DeviceBuffer>,
    ) -> Result<(), CommError> {
        let (mut sends, mut recvs) = (Vec::new(), Vec::new());
        for m in messages {
            let (list, data, bytes) = match &m.place {
                Place::Source(emu, r) => (&mut sends, buffers.sources[emu].buffer.ptr.offset(r.start), r.end - r.start),
                Place::Packed(i) => (&mut sends, buffers.packed[*i].ptr, buffers.packed[*i].len),
                Place::Target(emu, r) => (&mut recvs, buffers.targets[emu].buffer.ptr.offset(r.start), r.end - r.start),
                Place::Unpacked(i) => (&mut recvs, buffers.unpacked[*i].ptr, buffers.unpacked[*i].len),
            };
            list.push(DeviceTransfer { peer: m.peer, data, bytes });
        }
        self.exchange_device(&sends, &recvs)
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;
    use std::sync::{Arc, Mutex};
    use std::time::Duration;

    use super::*;
    use crate::backend::emulated::Emulated;
    use crate::comm::testing::{run_ranks, Calls, FakeLib, LoopbackPlane};
    use crate::comm::Watchdog;
    use crate::emu::{Counters, Digest, EmuId, EmuSet, PrimitiveOptions};
    use nereus_core::config::Dtype;
    use nereus_core::model::{Catalogue, Layout};
    use nereus_core::plan::{ModelStage, Role, Stage};

    fn catalogue(dtype: Dtype) -> Catalogue {
        Catalogue::new(crate::fixtures::tiny_architecture(dtype))
    }

    /// What one rank saw: digests after each step, bytes the plan reported and the plane sent,
    /// the ledger against the shards held, and whether the merged shard kept its source's
    /// (larger) allocation — which Merge must not do, since the DAG prices each target at its
    /// own size.
    type Trace = (Vec<BTreeMap<EmuId, Digest>>, u64, u64, bool, bool);

    /// Split, Merge and Extend on 4 thread-ranks, the same sequence in host and device memory.
    fn primitives<M: ShardMemory, P: Exchange<M>>(
        plane: &mut P,
        set: &mut EmuSet<M>,
        sent: impl Fn(&P) -> u64,
    ) -> Trace {
        let training = ModelStage::new(Role::Actor, Stage::Training);
        let counters = Counters { seed: 7, ..Counters::default() };
        let whole = set.create_synthetic(plane, training, Layout::new(2, 2), &[3, 1, 0, 2], counters).unwrap();
        let mut digests = vec![set.digests(plane).unwrap()];
        let split = set.split(plane, whole, Layout::new(1, 2), PrimitiveOptions::default()).unwrap();
        digests.push(set.digests(plane).unwrap());
        let merged = set.merge(plane, &split.created, Layout::new(2, 2), PrimitiveOptions::default()).unwrap();
        digests.push(set.digests(plane).unwrap());
        let shard = set.store().get(merged.created[0]).unwrap();
        let in_place = shard.bytes() > shard.table_bytes();
        let tp1 = set.split(plane, merged.created[0], Layout::new(1, 1), PrimitiveOptions::default()).unwrap();
        let victim = tp1.created[3];
        let free_rank = set.emu(victim).unwrap().ranks[0];
        set.destroy(victim).unwrap();
        let extended = set.extend(plane, tp1.created[0], &[free_rank], PrimitiveOptions::default()).unwrap();
        assert_eq!(merged.bytes_sent, 0, "Merge of split parts finds its targets resident");
        let reported = [split.bytes_sent, tp1.bytes_sent, extended.bytes_sent];
        digests.push(set.digests(plane).unwrap());
        let held: u64 = set.store().shards().map(|s| s.bytes()).sum();
        (digests, reported.iter().sum(), sent(plane), held == set.store().ledger().used(), in_place)
    }

    #[test]
    fn device_primitives_keep_the_host_planes_state_and_bytes() {
        for dtype in [Dtype::F32, Dtype::Bf16] {
            let c = catalogue(dtype);
            let calls = Arc::new(Mutex::new(Calls::default()));
            let traces = run_ranks(4, |rank, mail| {
                let catalogues = BTreeMap::from([(Role::Actor, c.clone())]);
                let mut host_plane = LoopbackPlane::new(rank, mail.clone());
                let mut host = EmuSet::new(rank, 4, 1 << 30, catalogues.clone());
                let host_trace = primitives(&mut host_plane, &mut host, |_| 0);
                let device = Rc::new(Device::new(Emulated::new(rank as u32, 1 << 28)).unwrap());
                let lib = FakeLib::new(rank, true, mail.clone(), calls.clone());
                let watchdog = Watchdog::new(Duration::from_secs(30), rank, false);
                let control = LoopbackPlane::new(rank, mail);
                let mut plane = GpuPlane::new(control, Box::new(lib), device.clone(), watchdog, 4).unwrap();
                let memory = DeviceMemory::new(device.clone());
                let mut on_device = EmuSet::in_memory(rank, 4, 1 << 30, catalogues, memory);
                assert_eq!(on_device.store().ledger().capacity(), 1 << 28, "capped at the device's capacity");
                let device_trace = primitives(&mut plane, &mut on_device, |p| p.bytes_sent());
                drop(on_device);
                plane.synchronize().unwrap();
                let leaked = device.allocated_bytes().0;
                (host_trace, device_trace, leaked)
            });
            let sent: u64 = traces.iter().map(|(_, d, _)| d.2).sum();
            for (rank, (host, device, leaked)) in traces.iter().enumerate() {
                assert_eq!(host.0, device.0, "{dtype:?} rank {rank}: the same digests after every step");
                assert_eq!(host.1, device.1, "the same bytes planned");
                assert!(host.3 && device.3, "ledgers charge exactly the shards held");
                assert!(!host.4 && !device.4, "a merged shard smaller than its source holds only its own bytes");
                assert_eq!(*leaked, 0, "every device buffer freed");
            }
            assert_eq!(sent, traces[0].1 .1, "{dtype:?}: bytes handed to ncclSend = bytes the plan reports");
            let merged = &traces[0].0 .0[2];
            assert!(merged.values().all(|d| *d == traces[0].0 .0[0].values().next().copied().unwrap()));
        }
    }
}
