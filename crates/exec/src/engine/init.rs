//! Layout-independent initialization: every element's initial value is a function of the seed,
//! the tensor and the element's coordinates in the whole tensor, so a model initialized under
//! any `(tp, pp)` holds the same logical weights.

use crate::emu::LocalShard;
use nereus_core::model::{Catalogue, Piece};
use nereus_core::rng::mix;

use super::{bf16_sections, f32_sections, EngineError};
use nereus_core::config::Dtype;
use nereus_core::half::f32_to_bf16;

/// Standard deviation of weight matrices (GPT-2's 0.02); residual output projections are
/// further scaled by `1/√(2L)` (GPT-2), norms start at one.
const INIT_STD: f64 = 0.02;

/// A uniform value in `[-1, 1)` from counters.
pub fn uniform(seed: u64, stream: u64, index: u64) -> f64 {
    let bits = mix(mix(seed ^ mix(stream)) ^ index);
    (bits >> 11) as f64 / (1u64 << 52) as f64 - 1.0
}

/// Writes initial parameters (and zero Adam moments) into `shard`: f32 as they are; bf16 as
/// the f32 master copy (when the EMU trains) and its bf16 rounding, the working copy.
pub fn init_shard(shard: &mut LocalShard, catalogue: &Catalogue, seed: u64) -> Result<(), EngineError> {
    let table = shard.table.clone();
    let fill = |params: &mut [f32]| {
        for piece in &table.pieces {
            let out = &mut params[piece.offset as usize..(piece.offset + piece.region.elements()) as usize];
            init_piece(out, catalogue, piece, seed);
        }
    };
    if shard.dtype == Dtype::Bf16 {
        let mut values = vec![0f32; table.elements as usize];
        fill(&mut values);
        let (params, state) = bf16_sections(shard)?;
        params.iter_mut().zip(&values).for_each(|(p, &v)| *p = f32_to_bf16(v));
        if let Some((m, v, master)) = state {
            m.fill(0.0);
            v.fill(0.0);
            master.copy_from_slice(&values);
        }
        return Ok(());
    }
    let (params, moments) = f32_sections(shard)?;
    if let Some((m, v)) = moments {
        m.fill(0.0);
        v.fill(0.0);
    }
    fill(params);
    Ok(())
}

/// Writes the initial values of one piece (its rectangle of one tensor) into `out`: norm gains
/// one, matrices uniform with GPT-2's standard deviation (residual projections scaled down).
/// A function of the seed, the tensor and the coordinates in the whole tensor only, so any
/// layout gets the same logical weights — and a single tensor can be initialized alone (a
/// value head added to a model loaded from a causal LM).
pub fn init_piece(out: &mut [f32], catalogue: &Catalogue, piece: &Piece, seed: u64) {
    let spec = &catalogue.tensors[piece.tensor];
    if spec.vector {
        out.fill(1.0); // RMSNorm gains
        return;
    }
    let layers = catalogue.arch.layers as f64;
    let residual = spec.name.ends_with("o_proj.weight") || spec.name.ends_with("down_proj.weight");
    let std = if residual { INIT_STD / (2.0 * layers).sqrt() } else { INIT_STD };
    let r = piece.region;
    for row in 0..r.rows {
        for col in 0..r.cols {
            let global = (r.row0 + row) * spec.cols + r.col0 + col;
            // Uniform on [-a, a) has standard deviation a/√3.
            out[(row * r.cols + col) as usize] =
                (uniform(seed, piece.tensor as u64, global) * std * 3f64.sqrt()) as f32;
        }
    }
}
