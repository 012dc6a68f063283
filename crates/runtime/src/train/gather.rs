//! Measurements that need every rank, gathered in one collective each: the slowest rank's
//! seconds per operation class, every rank's held bytes.

use nereus_core::cost::{OpClass, OpSeconds};
use nereus_core::plan::{PerPhase, Phase};
use nereus_exec::comm::DataPlane;
use nereus_exec::emu::{EmuSet, ShardMemory};

use crate::RuntimeError;

/// Per phase and operation class, the most seconds any rank spent (one all-gather).
pub fn slowest_op_seconds<P: DataPlane>(
    plane: &mut P,
    world: i32,
    mine: &PerPhase<OpSeconds>,
) -> Result<PerPhase<OpSeconds>, RuntimeError> {
    let local: Vec<f64> = mine.iter().flat_map(|(_, s)| s.0).collect();
    let group = plane.group(&(0..world).collect::<Vec<_>>())?;
    let mut all = vec![0u8; local.len() * 8 * world as usize];
    plane.all_gather(group, bytemuck::cast_slice(&local), &mut all)?;
    let classes = OpClass::ALL.len();
    let mut out = PerPhase::<OpSeconds>::default();
    for rank in bytemuck::cast_slice::<u8, f64>(&all).chunks_exact(local.len()) {
        // This rank's values, phase after phase in step order, class after class.
        for (k, phase) in Phase::ALL.into_iter().enumerate() {
            let theirs = OpSeconds(std::array::from_fn(|c| rank[k * classes + c]));
            *out.get_mut(phase) = out.get(phase).max(&theirs);
        }
    }
    Ok(out)
}

/// Bytes each rank's ledger holds now (all-gathered): zero on ranks outside the pool.
pub fn held_bytes<M: ShardMemory, P: DataPlane>(plane: &mut P, set: &EmuSet<M>) -> Result<Vec<u64>, RuntimeError> {
    gather_u64s(plane, set.world_size(), &[set.store().ledger().used()])
}

/// Every rank's `local` values, rank after rank (one all-gather over the world).
pub(super) fn gather_u64s<P: DataPlane>(plane: &mut P, world: i32, local: &[u64]) -> Result<Vec<u64>, RuntimeError> {
    let group = plane.group(&(0..world).collect::<Vec<_>>())?;
    let mut all = vec![0u8; 8 * local.len() * world as usize];
    plane.all_gather(group, bytemuck::cast_slice(local), &mut all)?;
    Ok(all.chunks_exact(8).map(|b| u64::from_le_bytes(b.try_into().unwrap_or([0; 8]))).collect())
}
