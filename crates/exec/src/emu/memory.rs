//! The store's memory seam: where an EMU's flat buffers live, how rectangles are copied inside
//! that memory, and how a data plane exchanges its buffers between ranks.
//!
//! [`HostMemory`] keeps buffers in `Vec<u8>` and moves them over any host [`DataPlane`] (MPI).
//! The device store (`emu::device`) keeps them in one device allocation per shard and moves them
//! over NCCL/RCCL. Both run the same plan ([`super::execute`]): local slices, packed sends,
//! one concurrent exchange, unpacks.

use std::borrow::Cow;
use std::collections::BTreeMap;
use std::ops::Range;

use crate::comm::{CommError, DataPlane, Transfer};
pub use nereus_kernels::pack::RectCopy;

use super::shard::{LocalShard, ShardBuffer};
use super::{EmuError, EmuId};

/// Where shard buffers live and how rectangles are copied there.
pub trait ShardMemory {
    /// A flat buffer of this memory.
    type Buffer: ShardBuffer;
    /// `host`, `CUDA device 0 (NVIDIA H200)`, … for messages.
    fn describe(&self) -> String;
    /// The device's real capacity as its driver reports it; `None` for host memory, whose
    /// capacity is the job's `cluster.device_memory_gb`.
    fn device_capacity(&self) -> Option<u64>;
    /// The most bytes the device's allocator has held for this process, by its own count (the
    /// ledger is checked against it); `None` for host memory, which only the ledger counts.
    fn allocator_peak(&self) -> Option<u64> {
        None
    }
    /// Whether the engine's per-operation timers measure how long work on this memory ran
    /// (host memory: each operation has finished when it returns); on a GPU they measure its
    /// issue, and calibration must go by stage totals.
    fn times_operations(&self) -> bool {
        true
    }
    /// A buffer of `bytes` bytes with unspecified contents.
    fn allocate(&self, bytes: u64) -> Result<Self::Buffer, EmuError>;
    /// Copies rectangles from `src` into `dst` (two distinct buffers).
    fn copy_rects(&self, src: &Self::Buffer, dst: &mut Self::Buffer, copies: &[RectCopy]) -> Result<(), EmuError>;
    /// Whether Merge may slice a resident shard in place (see [`ShardMemory::slice_in_place`]).
    fn slices_in_place(&self) -> bool {
        false
    }
    /// Rewrites `buffer` in place: `copies`, in order, each run as one parallel launch whose
    /// target rows overlap none of its own source rows (`kernels::in_place_schedule` makes them).
    fn slice_in_place(&self, buffer: &mut Self::Buffer, copies: &[RectCopy]) -> Result<(), EmuError>;
    /// The bytes of `buffer` in host memory (digests, gathers, checkpoints), after every pending
    /// write to it.
    fn read<'b>(&self, buffer: &'b Self::Buffer) -> Result<Cow<'b, [u8]>, EmuError>;
    /// Overwrites `buffer` with `bytes` (same length) from host memory.
    fn write(&self, bytes: &[u8], buffer: &mut Self::Buffer) -> Result<(), EmuError>;
    /// Runs `fill` on a host view of `shard` and leaves what it wrote in the shard: in place
    /// for host memory, through one host copy for a device (initial weights, checkpoints).
    fn fill_from_host(&self, shard: &mut LocalShard<Self::Buffer>, fill: &mut HostFill<'_>) -> Result<(), String>;
}

/// Writes a host shard (an initializer or a checkpoint reader); `Err` says why it could not.
pub type HostFill<'f> = dyn FnMut(&mut LocalShard) -> Result<(), String> + 'f;

/// Shards in host memory (`Vec<u8>`), moved over a host data plane.
#[derive(Debug, Clone, Copy, Default)]
pub struct HostMemory;

impl ShardMemory for HostMemory {
    type Buffer = Vec<u8>;

    fn describe(&self) -> String {
        "host memory".into()
    }

    fn device_capacity(&self) -> Option<u64> {
        None
    }

    fn allocate(&self, bytes: u64) -> Result<Vec<u8>, EmuError> {
        Ok(vec![0u8; bytes as usize])
    }

    fn copy_rects(&self, src: &Vec<u8>, dst: &mut Vec<u8>, copies: &[RectCopy]) -> Result<(), EmuError> {
        copies.iter().for_each(|c| c.copy_on_host(src, dst));
        Ok(())
    }

    fn slice_in_place(&self, buffer: &mut Vec<u8>, copies: &[RectCopy]) -> Result<(), EmuError> {
        for c in copies {
            for row in 0..c.rows {
                let (s, d) = (c.src_row(row), c.dst_row(row));
                buffer.copy_within(s.start as usize..s.end as usize, d.start as usize);
            }
        }
        Ok(())
    }

    fn read<'b>(&self, buffer: &'b Vec<u8>) -> Result<Cow<'b, [u8]>, EmuError> {
        Ok(Cow::Borrowed(buffer))
    }

    fn write(&self, bytes: &[u8], buffer: &mut Vec<u8>) -> Result<(), EmuError> {
        buffer.copy_from_slice(bytes);
        Ok(())
    }

    fn fill_from_host(&self, shard: &mut LocalShard, fill: &mut HostFill<'_>) -> Result<(), String> {
        fill(shard)
    }
}

/// Where one message's bytes sit on this rank.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Place {
    /// A byte range of a source shard, sent in place.
    Source(EmuId, Range<u64>),
    /// A byte range of a target shard, received in place.
    Target(EmuId, Range<u64>),
    /// Pack buffer `i` (sent whole).
    Packed(usize),
    /// Unpack buffer `i` (received whole).
    Unpacked(usize),
}

/// One message of an exchange.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Message {
    /// World rank of the other end.
    pub peer: i32,
    /// Where the bytes are (sources and pack buffers are sent, targets and unpack buffers received).
    pub place: Place,
}

/// The buffers an exchange reads and writes.
pub struct Buffers<'s, 't, B> {
    /// Source shards on this rank.
    pub sources: &'s BTreeMap<EmuId, &'s LocalShard<B>>,
    /// Target shards on this rank.
    pub targets: &'t mut BTreeMap<EmuId, LocalShard<B>>,
    /// Pack buffers, filled before the exchange.
    pub packed: &'s [B],
    /// Unpack buffers, filled by the exchange.
    pub unpacked: &'t mut [B],
}

/// A data plane that moves buffers of memory `M` between ranks.
pub trait Exchange<M: ShardMemory>: DataPlane {
    /// Runs every message at once and waits for them (in stream order, on a device). Between a
    /// pair of ranks, messages match in the order they are listed.
    fn exchange_buffers(
        &self,
        memory: &M,
        messages: &[Message],
        buffers: Buffers<'_, '_, M::Buffer>,
    ) -> Result<(), CommError>;
}

/// Splits `buffer` into disjoint mutable slices for `ranges` (sorted by start, non-overlapping).
fn carve<'a, K: Copy>(mut buffer: &'a mut [u8], ranges: &[(K, Range<u64>)]) -> Vec<(K, &'a mut [u8])> {
    let mut out = Vec::with_capacity(ranges.len());
    let mut consumed = 0u64;
    for (key, range) in ranges {
        let (_, rest) = std::mem::take(&mut buffer).split_at_mut((range.start - consumed) as usize);
        let (piece, rest) = rest.split_at_mut((range.end - range.start) as usize);
        out.push((*key, piece));
        buffer = rest;
        consumed = range.end;
    }
    out
}

impl<P: DataPlane> Exchange<HostMemory> for P {
    fn exchange_buffers(
        &self,
        _memory: &HostMemory,
        messages: &[Message],
        buffers: Buffers<'_, '_, Vec<u8>>,
    ) -> Result<(), CommError> {
        // Receives into target shards: carve each shard once into the ranges its messages name.
        let mut ranges: BTreeMap<EmuId, Vec<(usize, Range<u64>)>> = BTreeMap::new();
        for (k, m) in messages.iter().enumerate() {
            if let Place::Target(emu, range) = &m.place {
                ranges.entry(*emu).or_default().push((k, range.clone()));
            }
        }
        let mut slices: BTreeMap<usize, &mut [u8]> = BTreeMap::new();
        for (emu, shard) in buffers.targets.iter_mut() {
            if let Some(list) = ranges.get_mut(emu) {
                list.sort_by_key(|(_, r)| r.start);
                slices.extend(carve(&mut shard.buffer, list));
            }
        }
        let mut unpacked: Vec<Option<&mut [u8]>> =
            buffers.unpacked.iter_mut().map(|b| Some(b.as_mut_slice())).collect();
        let mut transfers: Vec<Transfer<'_>> = Vec::with_capacity(messages.len());
        for (k, m) in messages.iter().enumerate() {
            let peer = m.peer;
            transfers.push(match &m.place {
                Place::Source(emu, r) => {
                    Transfer::Send { peer, data: &buffers.sources[emu].buffer[r.start as usize..r.end as usize] }
                }
                Place::Packed(i) => Transfer::Send { peer, data: &buffers.packed[*i] },
                Place::Target(..) => Transfer::Recv { peer, data: slices.remove(&k).expect("each range carved once") },
                Place::Unpacked(i) => {
                    Transfer::Recv { peer, data: unpacked[*i].take().expect("each unpack buffer received once") }
                }
            });
        }
        self.exchange(&mut transfers)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rectangles_copy_row_by_row_and_contiguous_runs_at_once() {
        let src: Vec<u8> = (0..32).collect();
        let mut dst = vec![0u8; 8];
        // Two rows of 4 bytes from a pitch-8 source, packed.
        let c = RectCopy { src_offset: 2, src_pitch: 8, dst_offset: 0, dst_pitch: 4, row_bytes: 4, rows: 2 };
        assert!(!c.is_contiguous());
        c.copy_on_host(&src, &mut dst);
        assert_eq!(dst, [2, 3, 4, 5, 10, 11, 12, 13]);
        let whole = RectCopy { src_offset: 8, src_pitch: 4, dst_offset: 0, dst_pitch: 4, row_bytes: 4, rows: 2 };
        assert!(whole.is_contiguous());
        whole.copy_on_host(&src, &mut dst);
        assert_eq!(dst, (8..16).collect::<Vec<u8>>());
    }

    #[test]
    fn carving_gives_disjoint_slices_in_range_order() {
        let mut buffer = vec![0u8; 10];
        let pieces = carve(&mut buffer, &[(7usize, 1..3), (9usize, 5..9)]);
        assert_eq!(pieces.iter().map(|(k, s)| (*k, s.len())).collect::<Vec<_>>(), [(7, 2), (9, 4)]);
    }
}
