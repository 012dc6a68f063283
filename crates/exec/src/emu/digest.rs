//! Layout-independent digests of logical state, and a deterministic synthetic fill.
//!
//! A digest is a wrapping sum, over every element of every tensor and state section (each
//! element counted once, whatever the layout), of a 64-bit hash of (tensor, section, global
//! element index, value bits), in two independent lanes, plus a hash of the counters. Sums
//! commute, so every rank hashes what it holds and one all-reduce combines them: the result is
//! the same for any layout and any replica holding the same state.

use serde::{Deserialize, Serialize};
use std::fmt;

use nereus_core::model::{Catalogue, Section, Sharding};

use super::{Counters, LocalShard};
use nereus_core::rng::mix;

/// A 128-bit digest of one replica's logical state.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Digest(pub [u64; 2]);

impl fmt::Display for Digest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:016x}{:016x}", self.0[0], self.0[1])
    }
}

const LANES: [u64; 2] = [0x243f_6a88_85a3_08d3, 0x1319_8a2e_0370_7344];

fn read_element(bytes: &[u8]) -> u64 {
    let mut v = [0u8; 8];
    v[..bytes.len()].copy_from_slice(bytes);
    u64::from_le_bytes(v)
}

/// Visits every element this shard owns for digest purposes (replicated tensors only at TP
/// index 0): `(tensor, section, global index, bytes)`.
fn for_each_owned_element<B>(
    shard: &LocalShard<B>,
    bytes: &[u8],
    catalogue: &Catalogue,
    mut visit: impl FnMut(usize, usize, u64, &[u8]),
) {
    for piece in &shard.table.pieces {
        let spec = &catalogue.tensors[piece.tensor];
        if spec.sharding == Sharding::Replicated && shard.position.tp != 0 {
            continue;
        }
        let r = piece.region;
        for (s, section) in shard.sections.iter().enumerate() {
            let eb = section.element_bytes(shard.dtype) as usize;
            let data = &bytes[shard.section_range(s)];
            let base = piece.offset as usize * eb;
            for row in 0..r.rows {
                let global_row = (r.row0 + row) * spec.cols + r.col0;
                let start = base + (row * r.cols) as usize * eb;
                for (c, value) in data[start..start + r.cols as usize * eb].chunks_exact(eb).enumerate() {
                    visit(piece.tensor, s, global_row + c as u64, value);
                }
            }
        }
    }
}

/// This shard's contribution to its EMU's digest, from `bytes`, a host copy of its buffer.
pub fn shard_digest<B>(shard: &LocalShard<B>, bytes: &[u8], catalogue: &Catalogue) -> [u64; 2] {
    digest_where(shard, bytes, catalogue, |_| true)
}

/// This shard's contribution to its EMU's parameter digest (θ alone: equal between a training
/// EMU and the generation EMU a weight sync filled from it, whatever their layouts).
pub fn params_digest<B>(shard: &LocalShard<B>, bytes: &[u8], catalogue: &Catalogue) -> [u64; 2] {
    digest_where(shard, bytes, catalogue, |s| s == Section::Params)
}

/// The digest of the sections `keep` accepts.
fn digest_where<B>(
    shard: &LocalShard<B>,
    bytes: &[u8],
    catalogue: &Catalogue,
    keep: impl Fn(Section) -> bool,
) -> [u64; 2] {
    let mut sums = [0u64; 2];
    let mut bases = [0u64; 2];
    let mut current = (usize::MAX, usize::MAX);
    for_each_owned_element(shard, bytes, catalogue, |tensor, section, index, value| {
        if !keep(shard.sections[section]) {
            return;
        }
        if current != (tensor, section) {
            current = (tensor, section);
            for lane in 0..2 {
                bases[lane] = mix(LANES[lane] ^ mix(tensor as u64) ^ ((section as u64) << 56));
            }
        }
        let v = read_element(value);
        for lane in 0..2 {
            sums[lane] = sums[lane].wrapping_add(mix(mix(bases[lane] ^ index) ^ v));
        }
    });
    sums
}

/// The counters' contribution (added once per EMU).
pub fn counters_digest(c: &Counters) -> [u64; 2] {
    let fields = [c.updates, c.model_version, c.policy_version, c.data_position, c.seed];
    let mut out = [0u64; 2];
    for lane in 0..2 {
        out[lane] = fields
            .iter()
            .enumerate()
            .fold(mix(LANES[lane] ^ 0xc0), |acc, (i, f)| mix(acc ^ mix(*f ^ (i as u64) << 60)));
    }
    out
}

/// Fills a shard with deterministic bytes that depend only on (seed, tensor, section, global
/// element index) — so every layout of the same seed holds the same logical state. For tests
/// and benchmarks of data movement; the engine initializes real weights itself.
pub fn synthetic_fill(shard: &mut LocalShard, catalogue: &Catalogue, seed: u64) {
    for s in 0..shard.sections.len() {
        let eb = shard.sections[s].element_bytes(shard.dtype) as usize;
        let range = shard.section_range(s);
        for piece in shard.table.pieces.clone() {
            let spec = &catalogue.tensors[piece.tensor];
            let base = mix(seed ^ mix(piece.tensor as u64 + 1) ^ ((s as u64) << 56));
            let r = piece.region;
            let data = &mut shard.buffer[range.clone()];
            for row in 0..r.rows {
                let start = (piece.offset + row * r.cols) as usize * eb;
                let global_row = (r.row0 + row) * spec.cols + r.col0;
                for (c, value) in data[start..start + r.cols as usize * eb].chunks_exact_mut(eb).enumerate() {
                    value.copy_from_slice(&mix(base ^ (global_row + c as u64)).to_le_bytes()[..eb]);
                }
            }
        }
    }
}
