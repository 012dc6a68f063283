//! The engine's three passes over a replica — one optimizer step, one inference pass, one
//! generation loop — written once over [`Compute`] and [`Optimize`], for every memory the shards
//! can live in: host memory (the f32 reference engine, computed by [`Host`]) or the shard store
//! of a device (the bf16 engine with f32 master weights, computed by [`OnDevice`] on CUDA, ROCm
//! or the grid emulator). What a memory supplies ([`EngineMemory`]) is only how this rank's
//! shard is opened: its sections, a gradient buffer, and the compute over them.

use super::arena::Arena;
use super::compute::{Compute, Host, HostShard, MixedShard, OnDevice, Optimize};
use super::decode::Generated;
use super::objective::Objective;
use super::sampling::Sampling;
use super::train::{Batch, StepReport};
use super::{f32_sections, AdamW, EngineError, Replica};
use crate::backend::gpu::{DeviceArray, DeviceView};
use crate::comm::DataPlane;
use crate::emu::{DeviceBuffer, DeviceMemory, EmuId, EmuSet, HostMemory, LocalShard, MemoryLedger, ShardMemory};
use nereus_core::config::Dtype;
use nereus_core::cost::MemoryItem;
use nereus_core::model::Section;

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

/// What one optimizer step is given besides the replica and its shard.
#[derive(Clone, Copy)]
pub struct StepInputs<'b> {
    /// The model-stage's global batch.
    pub batch: &'b Batch<'b>,
    /// Sequences per micro-batch.
    pub micro_batch: usize,
    /// The loss.
    pub objective: &'b dyn Objective,
    /// The optimizer's hyper-parameters.
    pub opt: &'b AdamW,
    /// The update's number (from 1): the EMU's updates so far plus one.
    pub update: u64,
}

/// Shard memory the engine computes on: how this rank's shard of a replica is opened for each
/// pass (every rank of the replica calls each pass). The passes themselves are [`optimize`],
/// [`Replica::infer_on`] and [`Replica::generate_on`], the same for every memory.
pub trait EngineMemory: ShardMemory + Sized {
    /// The parameters' dtype this engine computes with.
    const DTYPE: Dtype;

    /// [`optimize`] on this rank's open training shard of `replica` (the EMU's counters are the
    /// caller's: [`train_step`]).
    fn optimize_shard<P: DataPlane>(
        plane: &P,
        set: &mut EmuSet<Self>,
        replica: &Replica,
        step: &StepInputs,
    ) -> Result<StepReport, EngineError>;

    /// The head's outputs over `batch`, forward only (see [`Replica::infer_on`]).
    fn infer<P: DataPlane>(
        plane: &P,
        set: &mut EmuSet<Self>,
        replica: &Replica,
        batch: &Batch,
        micro_batch: usize,
    ) -> Result<Vec<f32>, EngineError>;

    /// Responses to every wave, wave after wave, concatenated (see [`Replica::generate_on`]).
    fn generate<P: DataPlane>(
        plane: &P,
        set: &mut EmuSet<Self>,
        replica: &Replica,
        waves: &[Wave],
        s: &Sampling,
    ) -> Result<Generated, EngineError>;
}

/// One optimizer step of replica `replica` of a training model-stage on `batch` (every rank of
/// every replica of the model-stage calls it): forward, backward, the data-parallel sum,
/// clipping and AdamW on the EMU's own buffers ([`optimize`]), then `updates += 1` in its
/// counters on this rank (ranks outside the model-stage learn the new counters from the caller,
/// in lockstep).
///
/// An update whose loss or gradient norm is not finite is never applied: every rank of the
/// model-stage sees the same all-reduced values, so all of them skip it, and the caller decides
/// whether the job stops or goes on (`train.on_nonfinite`).
#[allow(clippy::too_many_arguments)]
pub fn train_step<M: EngineMemory, P: DataPlane>(
    plane: &P,
    set: &mut EmuSet<M>,
    replica: &Replica,
    batch: &Batch,
    micro_batch: usize,
    objective: &dyn Objective,
    opt: &AdamW,
) -> Result<StepReport, EngineError> {
    let id = replica.emu;
    let mut counters = set.emu(id).ok_or_else(|| EngineError::Shape { what: format!("{id} does not exist") })?.counters;
    let step = StepInputs { batch, micro_batch, objective, opt, update: counters.updates + 1 };
    let report = M::optimize_shard(plane, set, replica, &step)?;
    if !report.skipped {
        counters.updates += 1;
        counters.model_version += 1;
        set.set_counters(id, counters);
    }
    Ok(report)
}

/// The step every engine runs on an open training shard: 1F1B forward and backward
/// ([`Replica::forward_backward_on`]) into the zeroed `grads`, their data-parallel sum and the
/// global norm, then — when both the loss and the norm are finite — AdamW with global-norm
/// clipping on the shard's own buffers.
pub fn optimize<C: Optimize, P: DataPlane>(
    c: &mut C,
    plane: &P,
    replica: &Replica,
    shard: &mut C::Trainable<'_>,
    grads: &mut C::Grads,
    step: &StepInputs,
) -> Result<StepReport, EngineError> {
    let (batch, objective) = (step.batch, step.objective);
    let params = C::params(shard);
    let loss = replica.forward_backward_on(c, plane, params, grads, batch, step.micro_batch, objective)?;
    let (grad_norm, loss) = c.reduce_gradients(replica, plane, grads, loss)?;
    if !(grad_norm.is_finite() && loss.is_finite()) {
        return Ok(StepReport { loss, grad_norm, skipped: true });
    }
    let clip = step.opt.clip_scale(grad_norm);
    c.adamw(shard, grads, &replica.model.weights.tensors, step.opt, step.update, clip)?;
    Ok(StepReport { loss, grad_norm, skipped: false })
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

/// This rank's shard of EMU `id` and the ledger its buffers are charged to.
fn open<M: ShardMemory>(
    set: &mut EmuSet<M>,
    id: EmuId,
) -> Result<(&mut LocalShard<M::Buffer>, &mut MemoryLedger), EngineError> {
    set.store_mut()
        .shard_and_ledger(id)
        .ok_or_else(|| EngineError::Shape { what: format!("this rank holds no shard of {id}") })
}

/// Runs `f` on the parameters of this rank's f32 shard of EMU `id`, with an arena charging the
/// rank's ledger (released when `f` returns).
pub fn with_params<T, E: From<EngineError>>(
    set: &mut EmuSet,
    id: EmuId,
    f: impl FnOnce(&[f32], &mut Arena) -> Result<T, E>,
) -> Result<T, E> {
    let (shard, ledger) = open(set, id)?;
    let mut arena = Arena::new(ledger);
    let (params, _) = f32_sections(shard)?;
    f(params, &mut arena)
}

/// The host f32 reference engine.
impl EngineMemory for HostMemory {
    const DTYPE: Dtype = Dtype::F32;

    fn optimize_shard<P: DataPlane>(
        plane: &P,
        set: &mut EmuSet,
        replica: &Replica,
        step: &StepInputs,
    ) -> Result<StepReport, EngineError> {
        let id = replica.emu;
        let (shard, ledger) = open(set, id)?;
        let mut arena = Arena::new(ledger);
        let (params, moments) = f32_sections(shard)?;
        let (m, v) = moments.ok_or_else(|| EngineError::Shape { what: format!("{id} keeps no optimizer state") })?;
        let mut grads = arena.zeros::<f32>(MemoryItem::Gradients, params.len())?;
        let mut shard = HostShard { params, m, v };
        let mut host = Host::new(&mut arena, replica.model.rope());
        optimize(&mut host, plane, replica, &mut shard, &mut grads, step)
    }

    fn infer<P: DataPlane>(
        plane: &P,
        set: &mut EmuSet,
        replica: &Replica,
        batch: &Batch,
        micro_batch: usize,
    ) -> Result<Vec<f32>, EngineError> {
        with_params(set, replica.emu, |params, arena| {
            replica.infer_on(&mut Host::new(arena, replica.model.rope()), plane, params, batch, micro_batch)
        })
    }

    fn generate<P: DataPlane>(
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

/// The sections of a training bf16 shard on a device.
fn mixed_shard(shard: &LocalShard<DeviceBuffer>) -> Result<MixedShard, EngineError> {
    let expected = [Section::Params, Section::AdamM, Section::AdamV, Section::Master];
    if shard.dtype != Dtype::Bf16 || shard.sections != expected {
        let found = format!("{:?} with sections {:?}", shard.dtype, shard.sections);
        let what = format!(
            "{} shard on the device: the device engine trains bf16 shards with Adam and a master copy, found {found}",
            shard.emu
        );
        return Err(EngineError::Shape { what });
    }
    let n = shard.table.elements as usize;
    let at = |s: usize| shard.buffer.ptr().offset(shard.section_range(s).start as u64);
    Ok(MixedShard {
        params: device_params(shard)?,
        m: DeviceView::new(at(1), n),
        v: DeviceView::new(at(2), n),
        master: DeviceView::new(at(3), n),
    })
}

/// This rank's bf16 parameters of a shard on a device (any stage: θ is the first section).
fn device_params(shard: &LocalShard<DeviceBuffer>) -> Result<DeviceView<u16>, EngineError> {
    if shard.dtype != Dtype::Bf16 {
        let what =
            format!("{} shard on the device is {:?}; the device engine computes in bf16", shard.emu, shard.dtype);
        return Err(EngineError::Shape { what });
    }
    Ok(DeviceView::new(shard.buffer.ptr(), shard.table.elements as usize))
}

/// Runs `f` with a device compute over this rank's shard of `replica` and its bf16 parameters,
/// buffers charged to the rank's ledger (released when `f` returns): the device counterpart of
/// [`with_params`], for generation and inference.
pub fn with_device_params<T>(
    set: &mut EmuSet<DeviceMemory>,
    replica: &Replica,
    f: impl FnOnce(&mut OnDevice<'_, '_, '_>, &DeviceView<u16>) -> Result<T, EngineError>,
) -> Result<T, EngineError> {
    let device = set.store().memory().shared_device();
    let (shard, ledger) = open(set, replica.emu)?;
    let params = device_params(shard)?;
    let mut arena = Arena::new(ledger);
    let mut compute = OnDevice::new(&device, &mut arena, replica.model.rope())?;
    let out = f(&mut compute, &params)?;
    device.synchronize()?;
    Ok(out)
}

/// The bf16 engine on the device that holds the shard store (a GPU, or the grid emulator): θ
/// and ω never leave the device, so a transition moves exactly what the optimizer wrote.
impl EngineMemory for DeviceMemory {
    const DTYPE: Dtype = Dtype::Bf16;

    fn optimize_shard<P: DataPlane>(
        plane: &P,
        set: &mut EmuSet<DeviceMemory>,
        replica: &Replica,
        step: &StepInputs,
    ) -> Result<StepReport, EngineError> {
        let device = set.store().memory().shared_device();
        let (shard, ledger) = open(set, replica.emu)?;
        let mut shard = mixed_shard(shard)?;
        let mut arena = Arena::new(ledger);
        arena.charge(MemoryItem::Gradients, 4 * shard.master.len() as u64)?;
        let grads = DeviceArray::<f32>::zeros(&device, shard.master.len())?;
        // The loss and the norm's sums, read back together once (a few bytes, not charged).
        let scalars = DeviceArray::<f32>::zeros(&device, 1 + replica.counted_runs().len())?;
        let mut c = OnDevice::new(&device, &mut arena, replica.model.rope())?.with_step_scalars(scalars.view());
        let report = optimize(&mut c, plane, replica, &mut shard, &mut grads.view(), step)?;
        device.synchronize()?;
        Ok(report)
    }

    fn infer<P: DataPlane>(
        plane: &P,
        set: &mut EmuSet<DeviceMemory>,
        replica: &Replica,
        batch: &Batch,
        micro_batch: usize,
    ) -> Result<Vec<f32>, EngineError> {
        with_device_params(set, replica, |c, params| replica.infer_on(c, plane, params, batch, micro_batch))
    }

    fn generate<P: DataPlane>(
        plane: &P,
        set: &mut EmuSet<DeviceMemory>,
        replica: &Replica,
        waves: &[Wave],
        s: &Sampling,
    ) -> Result<Generated, EngineError> {
        with_device_params(set, replica, |c, params| generate_waves(replica, c, plane, params, waves, s))
    }
}

#[cfg(test)]
mod tests;
