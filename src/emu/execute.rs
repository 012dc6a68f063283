//! Executing a [`Movement`] on this rank: local slices, then every cross-rank message at once.
//!
//! Both ends of a rank pair walk the pair's segments in the same order — state section by
//! section, then segment by segment — so they agree on every message without telling each
//! other. A rectangle that is contiguous in a buffer (whole rows) is sent from, or received
//! into, that buffer directly; runs of such rectangles that are adjacent in both buffers are
//! coalesced into one message, so an Extend sends each shard as one contiguous buffer per rank
//! pair. Only non-contiguous rectangles (column blocks of row-parallel weights) are packed or
//! unpacked through scratch.

use std::collections::BTreeMap;
use std::ops::Range;

use crate::comm::{DataPlane, Transfer};
use crate::model::Region;

use super::movement::{Movement, Segment, Stored};
use super::{EmuError, EmuId, LocalShard, Section};
use crate::config::Dtype;

/// Byte offset of element `(row, col)` of `r` inside its stored piece, in section `s`.
fn byte_at(at: &Stored, r: &Region, row: u64, s_base: u64, eb: u64) -> u64 {
    let p = at.piece_region;
    s_base + (at.piece_offset + (r.row0 + row - p.row0) * p.cols + (r.col0 - p.col0)) * eb
}

/// Byte offset where section `s` starts in a shard of `elements` elements per section.
fn section_base(sections: &[Section], dtype: Dtype, s: usize, elements: u64) -> u64 {
    sections[..s].iter().map(|x| elements * x.element_bytes(dtype)).sum()
}

/// One message of a pair: a source and a target byte range when contiguous, else the segment
/// and section whose rectangle goes through scratch on that side.
struct Chunk {
    emus: (EmuId, EmuId),
    src: Result<Range<u64>, (usize, usize)>,
    dst: Result<Range<u64>, (usize, usize)>,
    bytes: u64,
}

/// The messages between `src_rank` and `dst_rank`, identical on both ends.
fn chunks(segs: &[(usize, &Segment)], sections: &[Section], dtype: Dtype) -> Vec<Chunk> {
    let mut out: Vec<Chunk> = Vec::new();
    for (s, section) in sections.iter().enumerate() {
        let eb = section.element_bytes(dtype);
        for &(k, seg) in segs {
            let r = &seg.region;
            let bytes = r.elements() * eb;
            let range = |at: &Stored| {
                let contiguous = r.cols == at.piece_region.cols || r.rows == 1;
                let base = section_base(sections, dtype, s, at.section_elements);
                let start = byte_at(at, r, 0, base, eb);
                if contiguous {
                    Ok(start..start + bytes)
                } else {
                    Err((k, s))
                }
            };
            let (src, dst) = (range(&seg.src_at), range(&seg.dst_at));
            let emus = (seg.src.0, seg.dst.0);
            if let (Some(last), Ok(sr), Ok(dr)) = (out.last_mut(), &src, &dst) {
                if let (Ok(ls), Ok(ld)) = (&mut last.src, &mut last.dst) {
                    if last.emus == emus && ls.end == sr.start && ld.end == dr.start {
                        ls.end = sr.end;
                        ld.end = dr.end;
                        last.bytes += bytes;
                        continue;
                    }
                }
            }
            out.push(Chunk { emus, src, dst, bytes });
        }
    }
    out
}

/// What one message sends: a range of a source EMU's buffer in place, or a packed copy.
type SendItem = Result<(EmuId, Range<u64>), Vec<u8>>;

/// Where a rectangle sits in a buffer: its stored piece and the byte offset of the section.
#[derive(Clone, Copy)]
struct At<'a> {
    piece: &'a Stored,
    base: u64,
}

/// Copies rectangle `r` between two stored pieces (or a packed buffer, `Stored` with the
/// rectangle itself as its piece).
fn copy_rect(src: &[u8], from: At, dst: &mut [u8], to: At, r: &Region, eb: u64) {
    let (sa, s_base, da, d_base) = (from.piece, from.base, to.piece, to.base);
    if r.cols == sa.piece_region.cols && r.cols == da.piece_region.cols {
        let (s, d, n) = (
            byte_at(sa, r, 0, s_base, eb) as usize,
            byte_at(da, r, 0, d_base, eb) as usize,
            (r.elements() * eb) as usize,
        );
        dst[d..d + n].copy_from_slice(&src[s..s + n]);
        return;
    }
    let n = (r.cols * eb) as usize;
    for row in 0..r.rows {
        let (s, d) = (byte_at(sa, r, row, s_base, eb) as usize, byte_at(da, r, row, d_base, eb) as usize);
        dst[d..d + n].copy_from_slice(&src[s..s + n]);
    }
}

/// The rectangle as its own packed piece.
fn packed(r: &Region) -> Stored {
    Stored { piece_offset: 0, piece_region: *r, section_elements: r.elements() }
}

/// Bytes of pack and unpack buffers this rank needs for `movement`: exactly the messages
/// [`move_bytes`] cannot send from, or receive into, a buffer directly.
pub fn scratch_bytes(movement: &Movement, me: i32, sections: &[Section], dtype: Dtype) -> u64 {
    let mut pairs: BTreeMap<(i32, i32), Vec<(usize, &Segment)>> = BTreeMap::new();
    for (k, seg) in
        movement.segments.iter().enumerate().filter(|(_, s)| s.is_remote() && (s.src.1 == me || s.dst.1 == me))
    {
        pairs.entry((seg.src.1, seg.dst.1)).or_default().push((k, seg));
    }
    pairs
        .iter()
        .flat_map(|(&(src, _), segs)| chunks(segs, sections, dtype).into_iter().map(move |c| (src, c)))
        .filter(|(src, c)| if *src == me { c.src.is_err() } else { c.dst.is_err() })
        .map(|(_, c)| c.bytes)
        .sum()
}

/// Splits `buffer` into disjoint mutable slices for `ranges` (sorted, non-overlapping).
fn carve<'a>(mut buffer: &'a mut [u8], ranges: &[(usize, Range<u64>)]) -> Vec<(usize, &'a mut [u8])> {
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

/// Moves this rank's part of `movement` from `sources` into `targets`, every state section.
pub fn move_bytes<P: DataPlane>(
    plane: &P,
    movement: &Movement,
    sources: &BTreeMap<EmuId, &LocalShard>,
    targets: &mut BTreeMap<EmuId, LocalShard>,
) -> Result<(), EmuError> {
    let Some((sections, dtype)) = sources
        .values()
        .next()
        .map(|s| (s.sections.clone(), s.dtype))
        .or_else(|| targets.values().next().map(|t| (t.sections.clone(), t.dtype)))
    else {
        return Ok(()); // this rank takes no part
    };
    move_sections(plane, movement, sources, targets, &sections, dtype)
}

/// Moves this rank's part of `movement` for the leading `sections` of every shard only (e.g.
/// parameters alone, from a training replica to a generation replica that keeps no moments).
pub fn move_sections<P: DataPlane>(
    plane: &P,
    movement: &Movement,
    sources: &BTreeMap<EmuId, &LocalShard>,
    targets: &mut BTreeMap<EmuId, LocalShard>,
    sections: &[Section],
    dtype: Dtype,
) -> Result<(), EmuError> {
    let me = plane.rank();
    let sections = sections.to_vec();
    for seg in movement.segments.iter().filter(|s| !s.is_remote() && s.dst.1 == me) {
        let src = sources[&seg.src.0];
        let dst = targets.get_mut(&seg.dst.0).expect("target allocated");
        for (s, section) in sections.iter().enumerate() {
            let eb = section.element_bytes(dtype);
            let (sb, db) = (
                section_base(&sections, dtype, s, seg.src_at.section_elements),
                section_base(&sections, dtype, s, seg.dst_at.section_elements),
            );
            copy_rect(
                &src.buffer,
                At { piece: &seg.src_at, base: sb },
                &mut dst.buffer,
                At { piece: &seg.dst_at, base: db },
                &seg.region,
                eb,
            );
        }
    }
    let mut outgoing: BTreeMap<i32, Vec<(usize, &Segment)>> = BTreeMap::new();
    let mut incoming: BTreeMap<i32, Vec<(usize, &Segment)>> = BTreeMap::new();
    for (k, seg) in movement.segments.iter().enumerate().filter(|(_, s)| s.is_remote()) {
        if seg.src.1 == me {
            outgoing.entry(seg.dst.1).or_default().push((k, seg));
        }
        if seg.dst.1 == me {
            incoming.entry(seg.src.1).or_default().push((k, seg));
        }
    }
    let segment = |k: usize| &movement.segments[k];
    // Sends: direct slices of source buffers, or packed rectangles.
    let mut send_plan: Vec<(i32, SendItem)> = Vec::new();
    for (&peer, segs) in &outgoing {
        for c in chunks(segs, &sections, dtype) {
            let item = match c.src {
                Ok(range) => Ok((c.emus.0, range)),
                Err((k, s)) => {
                    let seg = segment(k);
                    let eb = sections[s].element_bytes(dtype);
                    let mut out = vec![0u8; c.bytes as usize];
                    let sb = section_base(&sections, dtype, s, seg.src_at.section_elements);
                    let (from, to) = (At { piece: &seg.src_at, base: sb }, At { piece: &packed(&seg.region), base: 0 });
                    copy_rect(&sources[&seg.src.0].buffer, from, &mut out, to, &seg.region, eb);
                    Err(out)
                }
            };
            send_plan.push((peer, item));
        }
    }
    // Receives: direct ranges of target buffers, or scratch to unpack afterwards.
    let mut direct: BTreeMap<EmuId, Vec<(usize, Range<u64>)>> = BTreeMap::new();
    let mut scratch: Vec<(usize, (usize, usize), Vec<u8>)> = Vec::new();
    let mut recv_order: Vec<(i32, Result<usize, usize>)> = Vec::new();
    for (&peer, segs) in &incoming {
        for c in chunks(segs, &sections, dtype) {
            match c.dst {
                Ok(range) => {
                    let slot = recv_order.len();
                    direct.entry(c.emus.1).or_default().push((slot, range));
                    recv_order.push((peer, Ok(slot)));
                }
                Err(ks) => {
                    scratch.push((recv_order.len(), ks, vec![0u8; c.bytes as usize]));
                    recv_order.push((peer, Err(scratch.len() - 1)));
                }
            }
        }
    }
    {
        let mut transfers: Vec<Transfer<'_>> = Vec::new();
        for (peer, item) in &send_plan {
            let data: &[u8] = match item {
                Ok((emu, r)) => &sources[emu].buffer[r.start as usize..r.end as usize],
                Err(packed) => packed,
            };
            transfers.push(Transfer::Send { peer: *peer, data });
        }
        let mut slices: BTreeMap<usize, &mut [u8]> = BTreeMap::new();
        for (emu, shard) in targets.iter_mut() {
            if let Some(ranges) = direct.get_mut(emu) {
                ranges.sort_by_key(|(_, r)| r.start);
                slices.extend(carve(&mut shard.buffer, ranges));
            }
        }
        let mut scratch_slices: Vec<Option<&mut [u8]>> =
            scratch.iter_mut().map(|(_, _, b)| Some(b.as_mut_slice())).collect();
        for (peer, which) in &recv_order {
            let data = match which {
                Ok(slot) => slices.remove(slot).expect("each direct range carved once"),
                Err(i) => scratch_slices[*i].take().expect("each scratch buffer received once"),
            };
            transfers.push(Transfer::Recv { peer: *peer, data });
        }
        plane.exchange(&mut transfers)?;
    }
    for (_, (k, s), data) in &scratch {
        let seg = segment(*k);
        let eb = sections[*s].element_bytes(dtype);
        let db = section_base(&sections, dtype, *s, seg.dst_at.section_elements);
        let dst = targets.get_mut(&seg.dst.0).expect("target allocated");
        copy_rect(
            data,
            At { piece: &packed(&seg.region), base: 0 },
            &mut dst.buffer,
            At { piece: &seg.dst_at, base: db },
            &seg.region,
            eb,
        );
    }
    Ok(())
}
