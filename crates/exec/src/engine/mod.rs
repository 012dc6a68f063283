//! The reference engine: a Llama-style decoder on CPUs in f32 with hand-written forward and
//! backward passes (llm.c style), tensor, pipeline and data parallelism over the `comm` data
//! plane, AdamW, and KV-cache generation.
//!
//! Parameters and Adam moments are the EMU shard store's flat buffers, read in place through
//! the catalogue's size table ([`weights`]); gradients, activations, logits and the KV cache
//! are charged to the same rank's memory ledger ([`arena`]) before they are allocated.

pub mod arena;
pub mod compute;
pub mod decode;
pub mod generate;
pub mod init;
pub mod objective;
pub mod ops;
pub mod optimizer;
mod output;
pub mod parallel;
pub mod passes;
pub mod sampling;
pub mod stage;
pub mod timers;
pub mod train;
pub mod weights;

pub use crate::backend::linalg::{matmul, Op, Real};
pub use arena::Arena;
pub use decode::{DecodeShape, Generated, HostDecoding};
pub use init::{init_piece, init_shard};
pub use objective::{CrossEntropy, DeviceObjective, Objective};
pub use optimizer::AdamW;
pub use parallel::EmuGroups;
pub use passes::{optimize, train_step, with_device_params, with_params, EngineMemory, StepInputs, Wave};
pub use sampling::{draw_uniform, sample_token, SampleBuffers, Sampling, StopIds};
pub use stage::{KvCache, Rows, StageModel};
pub use train::{share, Batch, StepReport};
pub use weights::StageWeights;

use thiserror::Error;

use crate::comm::{CommError, DataPlane};
use crate::emu::{EmuError, EmuId, EmuSet, LocalShard, ShardMemory};
use nereus_core::config::Dtype;
use nereus_core::model::Section;

/// Why the engine stopped.
#[derive(Debug, Error)]
pub enum EngineError {
    /// A buffer would pass the rank's memory capacity (raised before allocating).
    #[error(transparent)]
    OutOfMemory(#[from] EmuError),
    /// A collective or transfer failed.
    #[error(transparent)]
    Comm(#[from] CommError),
    /// A loss or gradient stopped being finite where the caller cannot skip the update.
    #[error("training diverged in {what}; lower the learning rate")]
    Diverged {
        /// Where and which value.
        what: String,
    },
    /// A device refused an allocation, a launch or a copy.
    #[error(transparent)]
    Device(#[from] crate::backend::BackendError),
    /// Inputs whose shapes do not fit the model.
    #[error("shape mismatch: {what}")]
    Shape {
        /// What did not fit.
        what: String,
    },
    /// The task's reward could not be computed (a scorer command that crashed, hung or
    /// answered garbage, a response the tokenizer cannot decode); nothing of the step changed.
    #[error("step {step}: the reward failed: {what}")]
    Reward {
        /// The step (0-based).
        step: u64,
        /// What failed, naming the line.
        what: String,
    },
    /// The tensor-parallel ranks of a one-stage replica, each drawing from the same summed
    /// logits, drew different tokens: the plane's sums were not bit-identical on every rank.
    #[error(
        "decode step {step}: the tensor-parallel ranks drew different tokens (each draws from the summed logits, which must be bit-identical on every rank; the data plane's all-reduce was not)"
    )]
    TokensDisagree {
        /// The decode step (0 is the prefill) at whose check they differed.
        step: usize,
    },
    /// DAPO's dynamic sampling ran out of rounds before enough groups had unequal rewards.
    #[error(
        "step {step}: dynamic sampling kept {kept} of {needed} groups (rewards not all equal) in {rounds} rounds; raise rl.max_sampling_rounds ({rounds}), or set rl.dynamic_sampling = false"
    )]
    SamplingExhausted {
        /// The step (0-based).
        step: u64,
        /// Groups kept.
        kept: usize,
        /// Groups the step trains on (`rl.prompts_per_step`).
        needed: usize,
        /// Rounds taken (`rl.max_sampling_rounds`).
        rounds: usize,
    },
}

impl From<crate::emu::dag::DagError> for EngineError {
    fn from(e: crate::emu::dag::DagError) -> EngineError {
        use crate::emu::dag::DagError;
        match e {
            DagError::Emu(e) => EngineError::OutOfMemory(e),
            DagError::Comm(e) => EngineError::Comm(e),
            DagError::Mismatch(what) => EngineError::Shape { what },
        }
    }
}

/// Adam's first and second moments of a shard.
pub type Moments<'a> = (&'a mut [f32], &'a mut [f32]);

/// This rank's view of the flat buffer of an f32 shard: parameters, and Adam's `(m, v)` when
/// the EMU trains.
pub fn f32_sections(shard: &mut LocalShard) -> Result<(&mut [f32], Option<Moments<'_>>), EngineError> {
    let what = |reason: &str| EngineError::Shape { what: format!("{} shard: {reason}", shard.emu) };
    if shard.dtype != Dtype::F32 {
        return Err(what(&format!("the CPU engine computes in f32, the model is {:?}", shard.dtype)));
    }
    let per = shard.table.elements as usize * 4;
    let (params, rest) = shard.buffer.split_at_mut(per);
    let params: &mut [f32] =
        bytemuck::try_cast_slice_mut(params).map_err(|e| what(&format!("buffer not f32-aligned ({e:?})")))?;
    match shard.sections.as_slice() {
        [Section::Params] => Ok((params, None)),
        [Section::Params, Section::AdamM, Section::AdamV] => {
            let (m, v) = rest.split_at_mut(per);
            let cast = |b| bytemuck::try_cast_slice_mut::<u8, f32>(b);
            match (cast(m), cast(v)) {
                (Ok(m), Ok(v)) => Ok((params, Some((m, v)))),
                _ => Err(EngineError::Shape { what: "moment buffers not f32-aligned".into() }),
            }
        }
        other => Err(EngineError::Shape { what: format!("unexpected state sections {other:?}") }),
    }
}

/// Adam's first and second moments and the f32 master copy of a mixed-precision shard.
pub type MixedState<'a> = (&'a mut [f32], &'a mut [f32], &'a mut [f32]);

/// This rank's view of the flat buffer of a bf16 shard (host bytes, e.g. while it is filled):
/// the bf16 parameters the engine computes with, and, when the EMU trains, Adam's `(m, v)` and
/// the f32 master copy the optimizer updates.
pub fn bf16_sections(shard: &mut LocalShard) -> Result<(&mut [u16], Option<MixedState<'_>>), EngineError> {
    let what = |reason: String| EngineError::Shape { what: format!("{} shard: {reason}", shard.emu) };
    if shard.dtype != Dtype::Bf16 {
        return Err(what(format!("expected a bf16 shard, the model is {:?}", shard.dtype)));
    }
    let sections = shard.sections.clone();
    let per = shard.table.elements as usize;
    let (params, rest) = shard.buffer.split_at_mut(2 * per);
    let aligned = |e| what(format!("buffer not aligned ({e:?})"));
    let params: &mut [u16] = bytemuck::try_cast_slice_mut(params).map_err(aligned)?;
    match sections.as_slice() {
        [Section::Params] => Ok((params, None)),
        [Section::Params, Section::AdamM, Section::AdamV, Section::Master] => {
            let state: &mut [f32] = bytemuck::try_cast_slice_mut(&mut rest[..12 * per]).map_err(aligned)?;
            let (m, rest) = state.split_at_mut(per);
            let (v, master) = rest.split_at_mut(per);
            Ok((params, Some((m, v, master))))
        }
        other => Err(what(format!("unexpected state sections {other:?}"))),
    }
}

/// This rank's part of one EMU, ready to compute: its stage of the model and its groups.
pub struct Replica {
    /// The EMU.
    pub emu: EmuId,
    /// The stage this rank holds.
    pub model: StageModel,
    /// Its TP, PP and DP peers.
    pub groups: EmuGroups,
}

impl Replica {
    /// This rank's part of replica `id` of `set`, for sequences of up to `max_positions` tokens.
    /// Every rank of every replica of the model-stage calls it (groups are created here).
    pub fn new<P: DataPlane, M: ShardMemory>(
        plane: &mut P,
        set: &EmuSet<M>,
        id: EmuId,
        max_positions: usize,
    ) -> Result<Replica, EngineError> {
        let emu = set.emu(id).ok_or_else(|| EngineError::Shape { what: format!("{id} does not exist") })?;
        let replicas = set.replicas(emu.model_stage);
        let groups = EmuGroups::new(plane, emu, &replicas)?;
        let catalogue = set.catalogue(emu.model_stage.role);
        let table = catalogue.shard(emu.layout, groups.position);
        let weights = StageWeights::new(catalogue, emu.layout, groups.position, &table)?;
        Ok(Replica { emu: id, model: StageModel::new(catalogue, weights, max_positions), groups })
    }
}
