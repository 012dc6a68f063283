//! The groups one rank of an EMU talks to, and Megatron's communication ops as mirrored pairs:
//! entering a tensor-parallel region is identity forward and all-reduce backward; leaving a
//! row-parallel region is all-reduce forward and identity backward.
//!
//! Example: the actor's training model-stage with `(tp, pp, dp) = (2, 2, 2)` on ranks 0–7, EMU 0
//! on `[0, 1, 2, 3]` and EMU 1 on `[4, 5, 6, 7]`. Rank 5 holds position `(tp 1, pp 0)` of EMU 1:
//! its TP group is `[4, 5]`, its next pipeline stage is rank 7 (same TP index, stage 1), it has
//! no previous stage, and its DP group — the same position in every replica — is `[1, 5]`.

use crate::backend::gpu::DevicePtr;
use crate::comm::collectives::DataType;
use crate::comm::DeviceTransfer;
use crate::comm::{DataPlane, GroupId, Transfer};
use crate::emu::Emu;
use nereus_core::cost::OpClass;
use nereus_core::model::{Layout, Position};

use super::compute::{DeviceBytes, Neighbour, PipeLink};
use super::ops::TensorGroup;
use super::timers::timed;
use super::EngineError;

/// One rank's place in one EMU and the groups it communicates with.
#[derive(Debug, Clone)]
pub struct EmuGroups {
    /// The layout.
    pub layout: Layout,
    /// This rank's position.
    pub position: Position,
    /// This rank's TP group (`None` when `tp = 1`).
    pub tp: Option<GroupId>,
    /// Its ranks (sorted world ranks): a device plane sums activations over them in device
    /// memory.
    pub tp_ranks: Vec<i32>,
    /// Every rank of the EMU (`None` for one rank).
    pub emu: Option<GroupId>,
    /// Ranks at this position in every replica of the model-stage (`None` when `dp = 1`).
    pub dp: Option<GroupId>,
    /// Those ranks (sorted world ranks): a device plane sums gradients over them in device
    /// memory.
    pub dp_ranks: Vec<i32>,
    /// This replica's index among the model-stage's replicas, and how many there are.
    pub replica: (usize, usize),
    /// The previous pipeline stage's rank at this TP index.
    pub prev: Option<i32>,
    /// The next pipeline stage's rank at this TP index.
    pub next: Option<i32>,
    /// The EMU's ranks (TP-fastest).
    pub ranks: Vec<i32>,
}

fn sorted(mut ranks: Vec<i32>) -> Vec<i32> {
    ranks.sort_unstable();
    ranks
}

impl EmuGroups {
    /// The groups of this rank in `emu`, one of the model-stage's `replicas` (in replica order).
    /// Every rank of every replica calls this, in the same order for every EMU it belongs to.
    pub fn new<P: DataPlane>(plane: &mut P, emu: &Emu, replicas: &[&Emu]) -> Result<EmuGroups, EngineError> {
        let me = plane.rank();
        let position = emu
            .position_of(me)
            .ok_or_else(|| EngineError::Shape { what: format!("rank {me} is not in {}", emu.id) })?;
        let layout = emu.layout;
        let at = |tp: u32, pp: u32| emu.rank_at(Position { tp, pp });
        let tp_ranks = sorted((0..layout.tp).map(|i| at(i, position.pp)).collect());
        let dp_ranks = sorted(replicas.iter().map(|r| r.rank_at(position)).collect());
        let replica = (replicas.iter().position(|r| r.id == emu.id).unwrap_or(0), replicas.len());
        let tp = if layout.tp > 1 { Some(plane.group(&tp_ranks)?) } else { None };
        let dp = if replicas.len() > 1 { Some(plane.group(&dp_ranks)?) } else { None };
        // Every stage sums activations over TP; only training replicas sum gradients over DP
        // (a device communicator holds device memory).
        if tp.is_some() {
            plane.prepare_device_sum(&tp_ranks)?;
        }
        if dp.is_some() && emu.model_stage.trains() {
            plane.prepare_device_sum(&dp_ranks)?;
        }
        let emu_group = if layout.size() > 1 { Some(plane.group(&sorted(emu.ranks.clone()))?) } else { None };
        Ok(EmuGroups {
            layout,
            position,
            tp,
            tp_ranks,
            emu: emu_group,
            dp,
            dp_ranks,
            replica,
            prev: (position.pp > 0).then(|| at(position.tp, position.pp - 1)),
            next: (position.pp + 1 < layout.pp).then(|| at(position.tp, position.pp + 1)),
            ranks: emu.ranks.clone(),
        })
    }

    /// Whether this rank is position `(0, 0)`, which speaks for the replica (one holder of
    /// results every rank of the EMU has).
    pub fn is_leader(&self) -> bool {
        self.position == Position { tp: 0, pp: 0 }
    }

    /// Whether this rank speaks for the replica's outputs: `(tp 0, last stage)`, one rank per
    /// replica that holds the head's results.
    pub fn speaks_for_outputs(&self) -> bool {
        self.position == Position { tp: 0, pp: self.layout.pp - 1 }
    }

    /// The TP group as a reduction for the layers.
    pub fn tp_group<'a, P: DataPlane>(&'a self, plane: &'a P) -> TpGroup<'a, P> {
        TpGroup { plane, group: self.tp, ranks: &self.tp_ranks, size: self.layout.tp as usize }
    }

    /// This rank's pipeline neighbours over `plane`, for [`crate::engine::compute::Compute::pipe`].
    pub fn link<'a, P: DataPlane>(&'a self, plane: &'a P) -> StageLink<'a, P> {
        StageLink { plane, groups: self }
    }

    /// Copies `data` from the rank at `(tp 0, last stage)` to every rank of the EMU (the
    /// sampled tokens, which the first stage embeds next).
    pub fn broadcast_from_last<P: DataPlane>(&self, plane: &P, data: &mut [u8]) -> Result<(), EngineError> {
        let Some(group) = self.emu else { return Ok(()) };
        let root = self.ranks[self.layout.index(Position { tp: 0, pp: self.layout.pp - 1 })];
        let index = sorted(self.ranks.clone()).iter().position(|&r| r == root).unwrap_or(0);
        plane.broadcast(group, index, data)?;
        Ok(())
    }
}

/// One rank's pipeline neighbours over a data plane: activations go to the next stage and their
/// gradients come back, through host memory or, where the plane has device point-to-point
/// (NCCL, RCCL), as device bytes.
pub struct StageLink<'a, P> {
    plane: &'a P,
    groups: &'a EmuGroups,
}

impl<P> StageLink<'_, P> {
    fn peer(&self, neighbour: Neighbour) -> Result<i32, EngineError> {
        let (peer, which) = match neighbour {
            Neighbour::Next => (self.groups.next, "next"),
            Neighbour::Prev => (self.groups.prev, "previous"),
        };
        peer.ok_or_else(|| EngineError::Shape { what: format!("a pipeline transfer with no {which} stage") })
    }
}

impl<P: DataPlane> PipeLink for StageLink<'_, P> {
    fn exchange(
        &self,
        send: Option<(Neighbour, &[f32])>,
        recv: Option<(Neighbour, &mut [f32])>,
    ) -> Result<(), EngineError> {
        let mut transfers = Vec::with_capacity(2);
        if let Some((to, data)) = send {
            transfers.push(Transfer::Send { peer: self.peer(to)?, data: bytemuck::cast_slice(data) });
        }
        if let Some((from, data)) = recv {
            transfers.push(Transfer::Recv { peer: self.peer(from)?, data: bytemuck::cast_slice_mut(data) });
        }
        // Both posted at once, so neither side of a two-way exchange waits on the other.
        timed(OpClass::PpP2pIntra, || self.plane.exchange(&mut transfers))?;
        Ok(())
    }

    fn exchange_on_device(&self, send: Option<DeviceBytes>, recv: Option<DeviceBytes>) -> Result<bool, EngineError> {
        let transfer =
            |(n, data, bytes): DeviceBytes| Ok::<_, EngineError>(DeviceTransfer { peer: self.peer(n)?, data, bytes });
        let sends: Vec<DeviceTransfer> = send.map(transfer).transpose()?.into_iter().collect();
        let recvs: Vec<DeviceTransfer> = recv.map(transfer).transpose()?.into_iter().collect();
        Ok(timed(OpClass::PpP2pIntra, || self.plane.exchange_on_device(&sends, &recvs))?)
    }
}

/// A TP group seen by the layers: sums and maxima over the data plane.
pub struct TpGroup<'a, P> {
    plane: &'a P,
    group: Option<GroupId>,
    ranks: &'a [i32],
    size: usize,
}

impl<P: DataPlane> TensorGroup<f32> for TpGroup<'_, P> {
    fn sum(&self, values: &mut [f32]) -> Result<(), EngineError> {
        if let Some(g) = self.group {
            timed(OpClass::TpAllReduce, || self.plane.all_reduce_sum_f32(g, values))?;
        }
        Ok(())
    }

    fn is_single(&self) -> bool {
        self.group.is_none()
    }

    fn sum_bf16_on_device(&self, data: DevicePtr, count: usize) -> Result<bool, EngineError> {
        let ranks = self.ranks;
        Ok(timed(OpClass::TpAllReduce, || self.plane.all_reduce_device(ranks, data, count as u64, DataType::Bf16))?)
    }

    fn max(&self, values: &mut [f32]) -> Result<(), EngineError> {
        let Some(g) = self.group else { return Ok(()) };
        let mut all = vec![0f32; values.len() * self.size];
        self.plane.all_gather(g, bytemuck::cast_slice(values), bytemuck::cast_slice_mut(&mut all))?;
        let n = values.len();
        for (i, v) in values.iter_mut().enumerate() {
            *v = (0..self.size).map(|r| all[r * n + i]).fold(f32::NEG_INFINITY, f32::max);
        }
        Ok(())
    }
}

/// Assembles a global `[rows × width]` array on every rank of `world` (a group of every rank)
/// from the rows each holder contributes: holders pass `Some((first_row, values))`, everyone
/// else `None`, and one sum over the group completes it. Rows must have exactly one holder.
pub fn assemble_rows<P: DataPlane>(
    plane: &P,
    world: GroupId,
    rows: usize,
    width: usize,
    mine: Option<(usize, &[f32])>,
) -> Result<Vec<f32>, EngineError> {
    let mut all = vec![0f32; rows * width];
    if let Some((first, values)) = mine {
        all[first * width..first * width + values.len()].copy_from_slice(values);
    }
    plane.all_reduce_sum_f32(world, &mut all)?;
    Ok(all)
}
