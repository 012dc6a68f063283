//! Where bytes must move to build target EMUs from source EMUs — a pure function of the
//! catalogue and the EMUs, computed identically on every rank.
//!
//! Each target position needs, per tensor, one rectangle. Every rectangle of a source position
//! that overlaps it contributes the overlap, taken from one holder: the target rank itself when
//! it holds a source replica of that rectangle (a local slice, no byte sent), otherwise a
//! holder chosen by rotation so that concurrent targets spread over the source replicas
//! (for Extend, this is the rank at the same position: one rank-aligned copy).

use serde::{Deserialize, Serialize};

use nereus_core::model::{Catalogue, Layout, Position, Region, ShardTable};

use super::{Emu, EmuId, Section};
use nereus_core::config::Dtype;

/// Where a rectangle lives inside a shard: the stored piece it belongs to, and the shard's
/// elements per state section (so both ends of a transfer can compute both byte ranges).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Stored {
    /// Element offset of the piece within a section.
    pub piece_offset: u64,
    /// The rectangle the piece holds.
    pub piece_region: Region,
    /// Elements per section of the whole shard.
    pub section_elements: u64,
}

/// One rectangle of one tensor moving from a source shard to a target shard.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Segment {
    /// Catalogue index of the tensor.
    pub tensor: usize,
    /// The rectangle (tensor coordinates).
    pub region: Region,
    /// Source EMU and the rank holding the rectangle there.
    pub src: (EmuId, i32),
    /// Target EMU and the rank that needs it.
    pub dst: (EmuId, i32),
    /// Where it lives in the source shard.
    pub src_at: Stored,
    /// Where it goes in the target shard.
    pub dst_at: Stored,
}

impl Segment {
    /// Whether the segment crosses ranks.
    pub fn is_remote(&self) -> bool {
        self.src.1 != self.dst.1
    }
}

/// A target EMU before it exists: layout and ordered ranks.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TargetEmu {
    /// Identifier it will have.
    pub id: EmuId,
    /// Layout.
    pub layout: Layout,
    /// Ordered ranks.
    pub ranks: Vec<i32>,
}

/// Every segment of a redistribution, in one global order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Movement {
    /// The segments, ordered by target EMU, target position, then tensor.
    pub segments: Vec<Segment>,
}

impl Movement {
    /// Plans the segments that build `targets` from `sources` (replicas sharing one layout).
    pub fn plan(catalogue: &Catalogue, sources: &[&Emu], targets: &[TargetEmu]) -> Movement {
        let src_layout = sources[0].layout;
        let src_tables: Vec<ShardTable> = src_layout.positions().map(|p| catalogue.shard(src_layout, p)).collect();
        let mut segments = Vec::new();
        for (t_index, target) in targets.iter().enumerate() {
            for (k, &dst_rank) in target.ranks.iter().enumerate() {
                let table = catalogue.shard(target.layout, target.layout.position(k));
                for piece in &table.pieces {
                    let src_stage = catalogue.stage_of(piece.tensor, src_layout.pp);
                    let mut seen: Vec<Region> = Vec::new();
                    for i in 0..src_layout.tp {
                        let held = catalogue.region(piece.tensor, src_layout.tp, i);
                        let Some(overlap) = held.intersect(&piece.region) else { continue };
                        if seen.contains(&overlap) {
                            continue; // a replicated tensor: one copy suffices
                        }
                        seen.push(overlap);
                        let holders: Vec<(EmuId, i32)> = (0..src_layout.tp)
                            .filter(|&h| catalogue.region(piece.tensor, src_layout.tp, h) == held)
                            .flat_map(|h| {
                                sources.iter().map(move |s| (s.id, s.rank_at(Position { tp: h, pp: src_stage })))
                            })
                            .collect();
                        let src = holders
                            .iter()
                            .copied()
                            .find(|&(_, r)| r == dst_rank)
                            .unwrap_or(holders[(k + t_index) % holders.len()]);
                        let src_table = &src_tables[src_layout.index(Position { tp: i, pp: src_stage })];
                        let src_piece = src_table
                            .pieces
                            .iter()
                            .find(|p| p.tensor == piece.tensor)
                            .expect("the holder's table lists the tensor");
                        segments.push(Segment {
                            tensor: piece.tensor,
                            region: overlap,
                            src,
                            dst: (target.id, dst_rank),
                            src_at: Stored {
                                piece_offset: src_piece.offset,
                                piece_region: src_piece.region,
                                section_elements: src_table.elements,
                            },
                            dst_at: Stored {
                                piece_offset: piece.offset,
                                piece_region: piece.region,
                                section_elements: table.elements,
                            },
                        });
                    }
                }
            }
        }
        Movement { segments }
    }

    /// Bytes that cross ranks, over all state sections.
    pub fn bytes_sent(&self, sections: &[Section], dtype: Dtype) -> u64 {
        let per_element: u64 = sections.iter().map(|s| s.element_bytes(dtype)).sum();
        self.segments.iter().filter(|s| s.is_remote()).map(|s| s.region.elements() * per_element).sum()
    }

    /// Bytes sliced locally (no communication).
    pub fn bytes_local(&self, sections: &[Section], dtype: Dtype) -> u64 {
        let per_element: u64 = sections.iter().map(|s| s.element_bytes(dtype)).sum();
        self.segments.iter().filter(|s| !s.is_remote()).map(|s| s.region.elements() * per_element).sum()
    }
}
