//! The engine's passes over a replica whose shards live in one kind of memory: [`HostEngine`]
//! (f32 shards in host memory, computed by [`Host`]) or [`DeviceEngine`] (bf16 shards with f32
//! master weights and moments in the device shard store, computed by [`OnDevice`]). The RL step
//! and the self-tests call the passes through [`EngineOn`], so nothing above them is written
//! twice; below them, the model itself is written once over [`crate::engine::compute::Compute`].

use super::compute::{Compute, Host};
use super::device_train::{train_step_on_device, with_device_params};
use super::generate::{Generated, Sampling};
use super::train::{train_step, Batch, Objective, StepReport};
use super::{with_params, AdamW, EngineError, Replica};
use crate::comm::DataPlane;
use crate::emu::{DeviceMemory, EmuSet, HostMemory, ShardMemory};
use nereus_core::config::Dtype;

/// One wave of sequences generated together (its own KV cache, released before the next wave).
#[derive(Debug, Clone)]
pub struct Wave {
    /// Prompts `[B, P]`, left-padded.
    pub prompts: Vec<u32>,
    /// Where each sequence's prompt begins (empty when none is padded).
    pub starts: Vec<usize>,
    /// Sequence ids, which seed the draws.
    pub ids: Vec<u64>,
}

/// The engine's passes over a replica whose shards live in memory `M` (every rank of the
/// replica calls each pass).
pub trait EngineOn<M: ShardMemory> {
    /// The parameters' dtype this engine computes with.
    const DTYPE: Dtype;

    /// One optimizer step of `replica` on `batch` (see [`train_step`]).
    #[allow(clippy::too_many_arguments)]
    fn train_step<P: DataPlane>(
        &self,
        plane: &P,
        set: &mut EmuSet<M>,
        replica: &Replica,
        batch: &Batch,
        micro_batch: usize,
        objective: &dyn Objective,
        opt: &AdamW,
    ) -> Result<StepReport, EngineError>;

    /// The head's outputs over `batch`, forward only (see [`Replica::infer_on`]).
    fn infer<P: DataPlane>(
        &self,
        plane: &P,
        set: &mut EmuSet<M>,
        replica: &Replica,
        batch: &Batch,
        micro_batch: usize,
    ) -> Result<Vec<f32>, EngineError>;

    /// Responses to every wave, wave after wave, concatenated (see [`Replica::generate_on`]).
    fn generate<P: DataPlane>(
        &self,
        plane: &P,
        set: &mut EmuSet<M>,
        replica: &Replica,
        waves: &[Wave],
        s: &Sampling,
    ) -> Result<Generated, EngineError>;
}

/// Generates `waves` in order on `c`, releasing each wave's buffers before the next.
fn generate_waves<C: Compute, P: DataPlane>(
    replica: &Replica,
    c: &mut C,
    plane: &P,
    params: &C::Params,
    waves: &[Wave],
    s: &Sampling,
) -> Result<Generated, EngineError> {
    let mut out = Generated { tokens: Vec::new(), lengths: Vec::new() };
    for w in waves {
        let mark = c.mark();
        let done = replica.generate_on(c, plane, params, &w.prompts, &w.starts, &w.ids, s)?;
        let charged = c.since(mark);
        c.release(&charged);
        out.tokens.extend(done.tokens);
        out.lengths.extend(done.lengths);
    }
    Ok(out)
}

/// The host f32 reference engine.
#[derive(Debug, Clone, Copy, Default)]
pub struct HostEngine;

impl EngineOn<HostMemory> for HostEngine {
    const DTYPE: Dtype = Dtype::F32;

    fn train_step<P: DataPlane>(
        &self,
        plane: &P,
        set: &mut EmuSet,
        replica: &Replica,
        batch: &Batch,
        micro_batch: usize,
        objective: &dyn Objective,
        opt: &AdamW,
    ) -> Result<StepReport, EngineError> {
        train_step(plane, set, replica, batch, micro_batch, objective, opt)
    }

    fn infer<P: DataPlane>(
        &self,
        plane: &P,
        set: &mut EmuSet,
        replica: &Replica,
        batch: &Batch,
        micro_batch: usize,
    ) -> Result<Vec<f32>, EngineError> {
        with_params(set, replica.emu, |params, arena| replica.infer(plane, params, batch, micro_batch, arena))
    }

    fn generate<P: DataPlane>(
        &self,
        plane: &P,
        set: &mut EmuSet,
        replica: &Replica,
        waves: &[Wave],
        s: &Sampling,
    ) -> Result<Generated, EngineError> {
        with_params(set, replica.emu, |params, arena| {
            generate_waves(replica, &mut Host::new(arena, replica.model.rope()), plane, params, waves, s)
        })
    }
}

/// The bf16 engine on the device that holds the shard store (a GPU, or the grid emulator).
#[derive(Debug, Clone, Copy, Default)]
pub struct DeviceEngine;

impl EngineOn<DeviceMemory> for DeviceEngine {
    const DTYPE: Dtype = Dtype::Bf16;

    fn train_step<P: DataPlane>(
        &self,
        plane: &P,
        set: &mut EmuSet<DeviceMemory>,
        replica: &Replica,
        batch: &Batch,
        micro_batch: usize,
        objective: &dyn Objective,
        opt: &AdamW,
    ) -> Result<StepReport, EngineError> {
        train_step_on_device(plane, set, replica, batch, micro_batch, objective, opt)
    }

    fn infer<P: DataPlane>(
        &self,
        plane: &P,
        set: &mut EmuSet<DeviceMemory>,
        replica: &Replica,
        batch: &Batch,
        micro_batch: usize,
    ) -> Result<Vec<f32>, EngineError> {
        with_device_params(set, replica, |c, params| replica.infer_on(c, plane, params, batch, micro_batch))
    }

    fn generate<P: DataPlane>(
        &self,
        plane: &P,
        set: &mut EmuSet<DeviceMemory>,
        replica: &Replica,
        waves: &[Wave],
        s: &Sampling,
    ) -> Result<Generated, EngineError> {
        with_device_params(set, replica, |c, params| generate_waves(replica, c, plane, params, waves, s))
    }
}
