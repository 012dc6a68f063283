//! Executing a [`Movement`] on this rank: local slices, then every cross-rank message at once.
//!
//! [`RankPlan::new`] turns the movement into this rank's work, a pure function: both ends of a
//! rank pair walk the pair's segments in the same order — state section by section, then
//! segment by segment — so they agree on every message without telling each other. A
//! rectangle that is contiguous in a buffer (whole rows) is sent from, or received into, that
//! buffer directly; runs of such rectangles that are adjacent in both buffers are coalesced into
//! one message, so an Extend sends each shard as one contiguous buffer per rank pair. Only
//! non-contiguous rectangles (column blocks of row-parallel weights) are packed or unpacked
//! through scratch. [`move_sections`] runs the plan in any [`ShardMemory`]: host memory over
//! MPI, or device memory over NCCL/RCCL with the pack kernels of `crates/kernels/device/pack.cu`.

use std::collections::{BTreeMap, BTreeSet};
use std::ops::Range;

use nereus_core::model::Region;
use nereus_kernels::pack::in_place_schedule;

use super::memory::{Buffers, Exchange, Message, Place, RectCopy, ShardMemory};
use super::movement::{Movement, Segment, Stored};
use super::{EmuError, EmuId, LocalShard, Section};
use nereus_core::config::Dtype;

/// Byte offset of element `(row, col)` of `r` inside its stored piece, in section `s`.
fn byte_at(at: &Stored, r: &Region, row: u64, s_base: u64, eb: u64) -> u64 {
    let p = at.piece_region;
    s_base + (at.piece_offset + (r.row0 + row - p.row0) * p.cols + (r.col0 - p.col0)) * eb
}

/// Byte offset where section `s` starts in a shard of `elements` elements per section.
fn section_base(sections: &[Section], dtype: Dtype, s: usize, elements: u64) -> u64 {
    sections[..s].iter().map(|x| elements * x.element_bytes(dtype)).sum()
}

/// Where a rectangle sits in a buffer: its stored piece and the byte offset of the section.
#[derive(Clone, Copy)]
struct At<'a> {
    piece: &'a Stored,
    base: u64,
}

/// The copy of rectangle `r` between two stored pieces (or a packed buffer, `Stored` with the
/// rectangle itself as its piece).
fn rect(from: At, to: At, r: &Region, eb: u64) -> RectCopy {
    RectCopy {
        src_offset: byte_at(from.piece, r, 0, from.base, eb),
        src_pitch: from.piece.piece_region.cols * eb,
        dst_offset: byte_at(to.piece, r, 0, to.base, eb),
        dst_pitch: to.piece.piece_region.cols * eb,
        row_bytes: r.cols * eb,
        rows: r.rows,
    }
}

/// The rectangle as its own packed piece.
fn packed(r: &Region) -> Stored {
    Stored { piece_offset: 0, piece_region: *r, section_elements: r.elements() }
}

/// One message of a pair: a source and a target byte range when contiguous, else the segment
/// and section whose rectangle goes through scratch on that side.
struct Chunk {
    emus: (EmuId, EmuId),
    src: Result<Range<u64>, (usize, usize)>,
    dst: Result<Range<u64>, (usize, usize)>,
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
                        continue;
                    }
                }
            }
            out.push(Chunk { emus, src, dst });
        }
    }
    out
}

/// This rank's part of a movement over some state sections: identical on both ends of every
/// pair, and the same whatever memory the shards live in.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RankPlan {
    /// Local slices: a rectangle copied from a source shard into a target shard on this rank.
    pub local: Vec<(EmuId, EmuId, RectCopy)>,
    /// Pack buffer `i`: one rectangle of a source shard, packed contiguous (`dst_offset` 0).
    pub packs: Vec<(EmuId, RectCopy)>,
    /// The exchange: every send (by peer, in pair order), then every receive.
    pub messages: Vec<Message>,
    /// Unpack buffer `i`: received whole, then copied into one rectangle of a target shard.
    pub unpacks: Vec<(EmuId, RectCopy)>,
}

impl RankPlan {
    /// The work of rank `me` in `movement` for `sections`.
    pub fn new(movement: &Movement, me: i32, sections: &[Section], dtype: Dtype) -> RankPlan {
        let mut plan = RankPlan::default();
        for seg in movement.segments.iter().filter(|s| !s.is_remote() && s.dst.1 == me) {
            for (s, section) in sections.iter().enumerate() {
                let eb = section.element_bytes(dtype);
                let from =
                    At { piece: &seg.src_at, base: section_base(sections, dtype, s, seg.src_at.section_elements) };
                let to = At { piece: &seg.dst_at, base: section_base(sections, dtype, s, seg.dst_at.section_elements) };
                plan.local.push((seg.src.0, seg.dst.0, rect(from, to, &seg.region, eb)));
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
        let scratch = |k: usize, s: usize, outward: bool| {
            let seg = &movement.segments[k];
            let eb = sections[s].element_bytes(dtype);
            let pack = packed(&seg.region);
            let flat = At { piece: &pack, base: 0 };
            if outward {
                let base = section_base(sections, dtype, s, seg.src_at.section_elements);
                (seg.src.0, rect(At { piece: &seg.src_at, base }, flat, &seg.region, eb))
            } else {
                let base = section_base(sections, dtype, s, seg.dst_at.section_elements);
                (seg.dst.0, rect(flat, At { piece: &seg.dst_at, base }, &seg.region, eb))
            }
        };
        for (&peer, segs) in &outgoing {
            for c in chunks(segs, sections, dtype) {
                let place = match c.src {
                    Ok(range) => Place::Source(c.emus.0, range),
                    Err((k, s)) => {
                        plan.packs.push(scratch(k, s, true));
                        Place::Packed(plan.packs.len() - 1)
                    }
                };
                plan.messages.push(Message { peer, place });
            }
        }
        for (&peer, segs) in &incoming {
            for c in chunks(segs, sections, dtype) {
                let place = match c.dst {
                    Ok(range) => Place::Target(c.emus.1, range),
                    Err((k, s)) => {
                        plan.unpacks.push(scratch(k, s, false));
                        Place::Unpacked(plan.unpacks.len() - 1)
                    }
                };
                plan.messages.push(Message { peer, place });
            }
        }
        plan
    }

    /// Bytes of each scratch buffer the plan needs: the pack buffers, then the unpack buffers.
    pub fn scratch_sizes(&self) -> Vec<u64> {
        self.packs.iter().chain(&self.unpacks).map(|(_, c)| c.bytes()).collect()
    }

    /// Bytes of pack and unpack buffers the plan needs.
    pub fn scratch_bytes(&self) -> u64 {
        self.packs.iter().chain(&self.unpacks).map(|(_, c)| c.bytes()).sum()
    }

    /// Targets this rank can build by slicing a consumed source shard in place (Merge with
    /// resident targets): every byte of the target is a local slice of one source shard that
    /// sends nothing and feeds no other target, and every row moves down (or stays), so the
    /// copies run front to back in the source's own buffer. Maps target to source.
    pub fn in_place(&self) -> BTreeMap<EmuId, EmuId> {
        let mut feeds: BTreeMap<EmuId, BTreeSet<EmuId>> = BTreeMap::new();
        let mut fed_by: BTreeMap<EmuId, BTreeSet<EmuId>> = BTreeMap::new();
        for (s, t, _) in &self.local {
            feeds.entry(*s).or_default().insert(*t);
            fed_by.entry(*t).or_default().insert(*s);
        }
        let sends = |s: EmuId| {
            self.packs.iter().any(|(e, _)| *e == s)
                || self.messages.iter().any(|m| matches!(&m.place, Place::Source(e, _) if *e == s))
        };
        let receives = |t: EmuId| {
            self.unpacks.iter().any(|(e, _)| *e == t)
                || self.messages.iter().any(|m| matches!(&m.place, Place::Target(e, _) if *e == t))
        };
        fed_by
            .into_iter()
            .filter_map(|(t, sources)| {
                let s = *sources.iter().next()?;
                let only = sources.len() == 1 && feeds[&s].len() == 1 && !sends(s) && !receives(t);
                (only && in_place_schedule(&self.local_into(t)).is_some()).then_some((t, s))
            })
            .collect()
    }

    /// The local copies into target `t`, in source order.
    fn local_into(&self, t: EmuId) -> Vec<RectCopy> {
        let mut copies: Vec<RectCopy> = self.local.iter().filter(|(_, d, _)| *d == t).map(|(_, _, c)| *c).collect();
        copies.sort_by_key(|c| c.src_offset);
        copies
    }
}

/// Runs `plan`, this rank's part of a movement ([`RankPlan::new`]), from `sources` into
/// `targets`. Targets in `in_place` already hold their source's buffer (see
/// [`RankPlan::in_place`]) and are sliced there; the others are written by copies, packs, one
/// exchange and unpacks. `scratch` holds the pack buffers, then the unpack buffers, sized as
/// [`RankPlan::scratch_sizes`] says (from the store's cache: see `ShardStore::take_buffers`).
pub fn move_sections<M: ShardMemory, P: Exchange<M>>(
    plane: &P,
    memory: &M,
    plan: &RankPlan,
    sources: &BTreeMap<EmuId, &LocalShard<M::Buffer>>,
    targets: &mut BTreeMap<EmuId, LocalShard<M::Buffer>>,
    in_place: &BTreeSet<EmuId>,
    scratch: &mut [M::Buffer],
) -> Result<(), EmuError> {
    debug_assert_eq!(scratch.len(), plan.packs.len() + plan.unpacks.len(), "one scratch buffer per pack and unpack");
    let (packs, unpacked) = scratch.split_at_mut(plan.packs.len());
    for &t in in_place {
        let schedule = in_place_schedule(&plan.local_into(t)).expect("in-place targets have a schedule");
        let target = targets.get_mut(&t).expect("in-place target present");
        memory.slice_in_place(&mut target.buffer, &schedule)?;
    }
    for (s, t, copy) in plan.local.iter().filter(|(_, t, _)| !in_place.contains(t)) {
        let target = targets.get_mut(t).expect("target allocated");
        memory.copy_rects(&sources[s].buffer, &mut target.buffer, std::slice::from_ref(copy))?;
    }
    for ((s, copy), buffer) in plan.packs.iter().zip(packs.iter_mut()) {
        memory.copy_rects(&sources[s].buffer, buffer, std::slice::from_ref(copy))?;
    }
    if !plan.messages.is_empty() {
        let buffers = Buffers { sources, targets: &mut *targets, packed: packs, unpacked: &mut *unpacked };
        plane.exchange_buffers(memory, &plan.messages, buffers)?;
    }
    for ((t, copy), buffer) in plan.unpacks.iter().zip(unpacked.iter()) {
        let target = targets.get_mut(t).expect("target allocated");
        memory.copy_rects(buffer, &mut target.buffer, std::slice::from_ref(copy))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::emu::movement::TargetEmu;
    use crate::emu::{split_ranks, Counters, Emu};
    use nereus_core::model::{Architecture, Catalogue, Layout};
    use nereus_core::plan::{ModelStage, Role, Stage};

    fn catalogue() -> Catalogue {
        Catalogue::new(Architecture {
            layers: 2,
            ffn: 32,
            qk_norm: false,
            ..crate::fixtures::tiny_architecture(Dtype::F32)
        })
    }

    fn emu(id: u64, layout: Layout, ranks: &[i32]) -> Emu {
        let model_stage = ModelStage::new(Role::Actor, Stage::Training);
        Emu { id: EmuId(id), model_stage, layout, ranks: ranks.to_vec(), counters: Counters::default() }
    }

    /// Every message a rank sends is received, in the same order and size, by its peer.
    #[test]
    fn both_ends_of_every_pair_agree_on_the_messages() {
        let c = catalogue();
        let whole = emu(0, Layout::new(2, 2), &[0, 1, 2, 3]);
        let targets: Vec<TargetEmu> = split_ranks(&whole, Layout::new(1, 1))
            .into_iter()
            .enumerate()
            .map(|(k, ranks)| TargetEmu { id: EmuId(1 + k as u64), layout: Layout::new(1, 1), ranks })
            .collect();
        let m = Movement::plan(&c, &[&whole], &targets);
        let sections = Section::of(true, Dtype::F32);
        let plans: Vec<RankPlan> = (0..4).map(|r| RankPlan::new(&m, r, &sections, Dtype::F32)).collect();
        let size = |p: &RankPlan, place: &Place| match place {
            Place::Source(_, r) | Place::Target(_, r) => r.end - r.start,
            Place::Packed(i) => p.packs[*i].1.bytes(),
            Place::Unpacked(i) => p.unpacks[*i].1.bytes(),
        };
        for a in 0..4 {
            for b in 0..4 {
                let sent: Vec<u64> = plans[a]
                    .messages
                    .iter()
                    .filter(|m| m.peer == b as i32 && matches!(m.place, Place::Source(..) | Place::Packed(_)))
                    .map(|m| size(&plans[a], &m.place))
                    .collect();
                let received: Vec<u64> = plans[b]
                    .messages
                    .iter()
                    .filter(|m| m.peer == a as i32 && matches!(m.place, Place::Target(..) | Place::Unpacked(_)))
                    .map(|m| size(&plans[b], &m.place))
                    .collect();
                assert_eq!(sent, received, "pair {a} -> {b}");
            }
        }
        let total: u64 =
            plans.iter().flat_map(|p| p.messages.iter().map(move |m| (p, m))).map(|(p, m)| size(p, &m.place)).sum();
        assert_eq!(total, 2 * m.bytes_sent(&sections, Dtype::F32), "each byte sent once and received once");
    }

    #[test]
    fn merge_with_resident_targets_slices_in_place_and_split_does_not() {
        let c = catalogue();
        let whole = emu(0, Layout::new(2, 1), &[0, 1]);
        let parts: Vec<Emu> = split_ranks(&whole, Layout::new(1, 1))
            .into_iter()
            .enumerate()
            .map(|(k, r)| emu(1 + k as u64, Layout::new(1, 1), &r))
            .collect();
        let refs: Vec<&Emu> = parts.iter().collect();
        let merged = TargetEmu { id: EmuId(9), layout: Layout::new(2, 1), ranks: vec![0, 1] };
        let m = Movement::plan(&c, &refs, &[merged]);
        let sections = Section::of(true, Dtype::F32);
        for r in 0..2 {
            let plan = RankPlan::new(&m, r, &sections, Dtype::F32);
            assert!(plan.messages.is_empty());
            assert_eq!(plan.in_place(), BTreeMap::from([(EmuId(9), EmuId(1 + r as u64))]), "rank {r}");
        }
        let targets: Vec<TargetEmu> = parts
            .iter()
            .map(|p| TargetEmu { id: EmuId(20 + p.id.0), layout: p.layout, ranks: p.ranks.clone() })
            .collect();
        let split = Movement::plan(&c, &[&whole], &targets);
        assert!(RankPlan::new(&split, 0, &sections, Dtype::F32).in_place().is_empty());
    }
}
