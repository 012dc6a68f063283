//! Executing a [`Movement`] on this rank: local slices, then every cross-rank pair at once.
//!
//! Between two ranks all segments travel as one message per pair. When a pair's segments are a
//! whole source shard going to a target shard with the same size table (Extend), the message is
//! the source's flat buffer itself and lands directly in the target's; otherwise rectangles are
//! packed in segment order, every state section after the other, and unpacked on arrival.

use std::collections::BTreeMap;

use crate::comm::{DataPlane, Transfer};
use crate::model::Region;

use super::movement::{Movement, Segment};
use super::{EmuError, EmuId, LocalShard};

/// A rectangle stored row-major from a byte offset.
#[derive(Clone, Copy)]
struct Stored {
    byte_offset: u64,
    region: Region,
}

/// Copies rectangle `r` from `src` (stored as `sv`) to `dst` (stored as `dv`); `eb` bytes/element.
fn copy_region(src: &[u8], sv: Stored, dst: &mut [u8], dv: Stored, r: Region, eb: u64) {
    let at = |v: Stored, row: u64| -> usize {
        (v.byte_offset + ((r.row0 + row - v.region.row0) * v.region.cols + (r.col0 - v.region.col0)) * eb) as usize
    };
    if r.cols == sv.region.cols && r.cols == dv.region.cols {
        let (s, d, n) = (at(sv, 0), at(dv, 0), (r.elements() * eb) as usize);
        dst[d..d + n].copy_from_slice(&src[s..s + n]);
        return;
    }
    let n = (r.cols * eb) as usize;
    for row in 0..r.rows {
        let (s, d) = (at(sv, row), at(dv, row));
        dst[d..d + n].copy_from_slice(&src[s..s + n]);
    }
}

fn stored_in(shard: &LocalShard, seg: &Segment, eb: u64) -> Stored {
    let piece = shard.piece(seg.tensor).expect("movement only names tensors the shard holds");
    Stored { byte_offset: piece.offset * eb, region: piece.region }
}

/// Whether `segs` are exactly `src`'s whole shard going into `dst` laid out identically.
fn is_whole_shard(segs: &[&Segment], src: &LocalShard, dst_table_matches: bool) -> bool {
    dst_table_matches
        && segs.len() == src.table.pieces.len()
        && segs.iter().zip(&src.table.pieces).all(|(s, p)| s.tensor == p.tensor && s.region == p.region)
}

/// Bytes of packed messages this rank sends and receives for `movement` (for the memory check).
pub fn scratch_bytes(movement: &Movement, me: i32, element_bytes: &[u64]) -> u64 {
    let per_element: u64 = element_bytes.iter().sum();
    movement
        .segments
        .iter()
        .filter(|s| s.is_remote() && (s.src.1 == me || s.dst.1 == me))
        .map(|s| s.region.elements() * per_element)
        .sum()
}

/// Moves this rank's part of `movement` from `sources` into `targets`.
pub fn move_bytes<P: DataPlane>(
    plane: &P,
    movement: &Movement,
    sources: &BTreeMap<EmuId, &LocalShard>,
    targets: &mut BTreeMap<EmuId, LocalShard>,
) -> Result<(), EmuError> {
    let me = plane.rank();
    let sections_of = |shard: &LocalShard| shard.sections.len();
    // Local slices.
    for seg in movement.segments.iter().filter(|s| !s.is_remote() && s.dst.1 == me) {
        let src = sources[&seg.src.0];
        let dst = targets.get_mut(&seg.dst.0).expect("target allocated");
        for s in 0..sections_of(src) {
            let eb = src.sections[s].element_bytes(src.dtype);
            let (sv, dv) = (stored_in(src, seg, eb), stored_in(dst, seg, eb));
            let (sr, dr) = (src.section_range(s), dst.section_range(s));
            copy_region(&src.buffer[sr], sv, &mut dst.buffer[dr], dv, seg.region, eb);
        }
    }
    // Group remote segments by peer, keeping the global order within each pair.
    let mut outgoing: BTreeMap<i32, Vec<&Segment>> = BTreeMap::new();
    let mut incoming: BTreeMap<i32, Vec<&Segment>> = BTreeMap::new();
    for seg in movement.segments.iter().filter(|s| s.is_remote()) {
        if seg.src.1 == me {
            outgoing.entry(seg.dst.1).or_default().push(seg);
        }
        if seg.dst.1 == me {
            incoming.entry(seg.src.1).or_default().push(seg);
        }
    }
    // Pack what cannot go as a whole buffer.
    let mut packed_out: BTreeMap<i32, Vec<u8>> = BTreeMap::new();
    let mut direct_out: BTreeMap<i32, EmuId> = BTreeMap::new();
    for (&peer, segs) in &outgoing {
        let src = sources[&segs[0].src.0];
        let same_src = segs.iter().all(|s| s.src.0 == segs[0].src.0 && s.dst.0 == segs[0].dst.0);
        if same_src && is_whole_shard(segs, src, true) {
            direct_out.insert(peer, src.emu);
            continue;
        }
        packed_out.insert(peer, pack(segs, sources));
    }
    // Receive directly into a target shard when the sender sends its whole shard.
    let mut direct_in: BTreeMap<i32, EmuId> = BTreeMap::new();
    let mut packed_in: BTreeMap<i32, Vec<u8>> = BTreeMap::new();
    for (&peer, segs) in &incoming {
        let dst = &targets[&segs[0].dst.0];
        let same = segs.iter().all(|s| s.src.0 == segs[0].src.0 && s.dst.0 == segs[0].dst.0);
        if same && is_whole_shard(segs, dst, true) {
            direct_in.insert(peer, dst.emu);
        } else {
            let per_element: u64 = dst.sections.iter().map(|s| s.element_bytes(dst.dtype)).sum();
            let bytes: u64 = segs.iter().map(|s| s.region.elements() * per_element).sum();
            packed_in.insert(peer, vec![0u8; bytes as usize]);
        }
    }
    {
        let mut transfers: Vec<Transfer<'_>> = Vec::new();
        for (&peer, emu) in &direct_out {
            transfers.push(Transfer::Send { peer, data: &sources[emu].buffer });
        }
        for (&peer, data) in &packed_out {
            transfers.push(Transfer::Send { peer, data });
        }
        let mut by_emu: BTreeMap<EmuId, &mut LocalShard> = targets.iter_mut().map(|(k, v)| (*k, v)).collect();
        for (&peer, emu) in &direct_in {
            let shard = by_emu.remove(emu).expect("one whole-shard sender per target");
            transfers.push(Transfer::Recv { peer, data: &mut shard.buffer });
        }
        for (&peer, data) in packed_in.iter_mut() {
            transfers.push(Transfer::Recv { peer, data });
        }
        plane.exchange(&mut transfers)?;
    }
    for (peer, data) in &packed_in {
        unpack(&incoming[peer], data, targets);
    }
    Ok(())
}

/// Concatenates, section by section, the rectangles of `segs` from their source shards.
fn pack(segs: &[&Segment], sources: &BTreeMap<EmuId, &LocalShard>) -> Vec<u8> {
    let first = sources[&segs[0].src.0];
    let per_element: u64 = first.sections.iter().map(|s| s.element_bytes(first.dtype)).sum();
    let mut out = vec![0u8; segs.iter().map(|s| s.region.elements() * per_element).sum::<u64>() as usize];
    let mut cursor = 0u64; // bytes
    for s in 0..first.sections.len() {
        for seg in segs {
            let src = sources[&seg.src.0];
            let eb = src.sections[s].element_bytes(src.dtype);
            let dv = Stored { byte_offset: cursor, region: seg.region };
            copy_region(&src.buffer[src.section_range(s)], stored_in(src, seg, eb), &mut out, dv, seg.region, eb);
            cursor += seg.region.elements() * eb;
        }
    }
    out
}

/// Inverse of [`pack`] on the receiving side.
fn unpack(segs: &[&Segment], data: &[u8], targets: &mut BTreeMap<EmuId, LocalShard>) {
    let sections = targets[&segs[0].dst.0].sections.len();
    let mut cursor = 0u64;
    for s in 0..sections {
        for seg in segs {
            let dst = targets.get_mut(&seg.dst.0).expect("target allocated");
            let eb = dst.sections[s].element_bytes(dst.dtype);
            let sv = Stored { byte_offset: cursor, region: seg.region };
            let dv = stored_in(dst, seg, eb);
            let range = dst.section_range(s);
            copy_region(data, sv, &mut dst.buffer[range], dv, seg.region, eb);
            cursor += seg.region.elements() * eb;
        }
    }
}
