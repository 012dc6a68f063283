//! The data plane: what primitives and the engine need to move tensors between ranks.
//!
//! Callers name groups by their world ranks (created only by their members, cached) and hand
//! the plane byte slices; nothing above this trait knows MPI. [`MpiPlane`] moves host memory.
//! The GPU plane (`comm::gpu_plane`) keeps these calls for host bytes (over its MPI control
//! plane) and moves device-resident shards over NCCL/RCCL: its groups are communicators made
//! from a unique id broadcast over MPI, its exchanges grouped `ncclSend`/`ncclRecv`.

use mpi::collective::SystemOperation;
use mpi::topology::{Communicator, SimpleCommunicator};
use mpi::traits::{CommunicatorCollectives, Destination, Group as _, Root, Source};
use std::collections::HashMap;

use super::collectives::DataType;
use super::{CommError, Watchdog, World};
use crate::backend::gpu::DevicePtr;

/// Largest single message; bigger transfers are cut into pieces (MPI counts are 32-bit).
const MAX_MESSAGE_BYTES: usize = 1 << 30;

/// Handle of a group created with [`DataPlane::group`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct GroupId(pub(crate) usize);

/// One device transfer of an exchange: bytes at a device address to or from a world rank.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DeviceTransfer {
    /// World rank of the other end.
    pub peer: i32,
    /// Device address of the bytes.
    pub data: DevicePtr,
    /// How many.
    pub bytes: u64,
}

/// One point-to-point transfer of an exchange: bytes to or from a world rank.
pub enum Transfer<'a> {
    /// Send these bytes to `peer`.
    Send {
        /// World rank of the receiver.
        peer: i32,
        /// The bytes.
        data: &'a [u8],
    },
    /// Receive exactly `data.len()` bytes from `peer`.
    Recv {
        /// World rank of the sender.
        peer: i32,
        /// Where they land.
        data: &'a mut [u8],
    },
}

/// Collectives and point-to-point transfers over groups of world ranks.
pub trait DataPlane {
    /// This rank in the world.
    fn rank(&self) -> i32;
    /// The group of `ranks` (sorted world ranks, including this one); called only by members,
    /// so disjoint groups form concurrently. Cached: the same set returns the same group.
    fn group(&mut self, ranks: &[i32]) -> Result<GroupId, CommError>;
    /// Concatenates every member's `send` (equal sizes) into `recv`, in group-rank order.
    fn all_gather(&self, group: GroupId, send: &[u8], recv: &mut [u8]) -> Result<(), CommError>;
    /// Copies `data` of the member with group index `root` to every member.
    fn broadcast(&self, group: GroupId, root: usize, data: &mut [u8]) -> Result<(), CommError>;
    /// Element-wise wrapping sum over the members.
    fn all_reduce_sum_u64(&self, group: GroupId, values: &mut [u64]) -> Result<(), CommError>;
    /// Element-wise sum over the members.
    fn all_reduce_sum_f32(&self, group: GroupId, values: &mut [f32]) -> Result<(), CommError>;
    /// Waits for every member.
    fn barrier(&self, group: GroupId) -> Result<(), CommError>;
    /// Runs all `transfers` concurrently and waits for all of them. Between a pair of ranks,
    /// sends and receives match in the order they are listed.
    fn exchange(&self, transfers: &mut [Transfer<'_>]) -> Result<(), CommError>;
    /// Names what the calls that follow are part of (e.g. a transition's primitive and ranks),
    /// so a watchdog abort says which step stalled; `None` clears it.
    fn set_context(&mut self, _context: Option<String>) {}
    /// A transition starts: a device plane orders its work on a fresh stream after all before.
    fn begin_transition(&mut self) -> Result<(), CommError> {
        Ok(())
    }
    /// A transition's nodes are all issued: a device plane waits for them (under the watchdog).
    fn end_transition(&mut self) -> Result<(), CommError> {
        Ok(())
    }
    /// Makes the device communicator of `ranks` (sorted world ranks, this one among them; every
    /// member calls it) for [`DataPlane::all_reduce_device`]; a plane without device
    /// collectives has nothing to make.
    fn prepare_device_sum(&mut self, _ranks: &[i32]) -> Result<(), CommError> {
        Ok(())
    }
    /// Sums `count` elements of type `ty` at `data`, in device memory, over `ranks` (prepared
    /// by [`DataPlane::prepare_device_sum`]), in place and in the device stream's order.
    /// `false` from a plane without device collectives: the caller sums through host memory.
    fn all_reduce_device(
        &self,
        _ranks: &[i32],
        _data: DevicePtr,
        _count: u64,
        _ty: DataType,
    ) -> Result<bool, CommError> {
        Ok(false)
    }
    /// Sends and receives device bytes to and from world ranks, all at once, in the device
    /// stream's order (a pipeline's activations and their gradients). `false` from a plane
    /// without device point-to-point: the caller exchanges through host memory.
    fn exchange_on_device(&self, _sends: &[DeviceTransfer], _recvs: &[DeviceTransfer]) -> Result<bool, CommError> {
        Ok(false)
    }
}

/// The MPI data plane over host memory.
pub struct MpiPlane<'w> {
    world: &'w World,
    watchdog: Watchdog,
    context: Option<String>,
    groups: Vec<(Vec<i32>, SimpleCommunicator)>,
    index: HashMap<Vec<i32>, usize>,
}

impl<'w> MpiPlane<'w> {
    /// A data plane on `world`, every blocking call under `watchdog`.
    pub fn new(world: &'w World, watchdog: Watchdog) -> MpiPlane<'w> {
        MpiPlane { world, watchdog, context: None, groups: Vec::new(), index: HashMap::new() }
    }

    fn comm(&self, group: GroupId) -> &SimpleCommunicator {
        &self.groups[group.0].1
    }

    fn describe(&self, group: GroupId) -> String {
        self.in_context(format!("group [{}]", nereus_core::index_list::format_index_list(&self.groups[group.0].0)))
    }

    fn in_context(&self, what: String) -> String {
        match &self.context {
            Some(c) => format!("{what} during {c}"),
            None => what,
        }
    }
}

impl DataPlane for MpiPlane<'_> {
    fn rank(&self) -> i32 {
        self.world.rank()
    }

    fn group(&mut self, ranks: &[i32]) -> Result<GroupId, CommError> {
        if let Some(&i) = self.index.get(ranks) {
            return Ok(GroupId(i));
        }
        let not_member =
            || CommError::Init { reason: format!("rank {} asked for group {ranks:?} it is not in", self.world.rank()) };
        if !ranks.contains(&self.world.rank()) {
            return Err(not_member());
        }
        let comm = {
            let _guard = self.watchdog.guard("group creation", &self.in_context(format!("ranks {ranks:?}")));
            let group = self.world.comm().group().include(ranks);
            self.world.comm().split_by_subgroup(&group).ok_or_else(not_member)?
        };
        self.groups.push((ranks.to_vec(), comm));
        self.index.insert(ranks.to_vec(), self.groups.len() - 1);
        Ok(GroupId(self.groups.len() - 1))
    }

    fn all_gather(&self, group: GroupId, send: &[u8], recv: &mut [u8]) -> Result<(), CommError> {
        let _guard = self.watchdog.guard("all-gather", &self.describe(group));
        self.comm(group).all_gather_into(send, recv);
        Ok(())
    }

    fn broadcast(&self, group: GroupId, root: usize, data: &mut [u8]) -> Result<(), CommError> {
        let _guard = self.watchdog.guard("broadcast", &self.describe(group));
        for chunk in data.chunks_mut(MAX_MESSAGE_BYTES) {
            self.comm(group).process_at_rank(root as i32).broadcast_into(chunk);
        }
        Ok(())
    }

    fn all_reduce_sum_u64(&self, group: GroupId, values: &mut [u64]) -> Result<(), CommError> {
        let _guard = self.watchdog.guard("all-reduce", &self.describe(group));
        let send = values.to_vec();
        self.comm(group).all_reduce_into(&send[..], values, SystemOperation::sum());
        Ok(())
    }

    fn all_reduce_sum_f32(&self, group: GroupId, values: &mut [f32]) -> Result<(), CommError> {
        let _guard = self.watchdog.guard("all-reduce", &self.describe(group));
        let send = values.to_vec();
        self.comm(group).all_reduce_into(&send[..], values, SystemOperation::sum());
        Ok(())
    }

    fn barrier(&self, group: GroupId) -> Result<(), CommError> {
        let _guard = self.watchdog.guard("barrier", &self.describe(group));
        self.comm(group).barrier();
        Ok(())
    }

    fn set_context(&mut self, context: Option<String>) {
        self.context = context;
    }

    fn exchange(&self, transfers: &mut [Transfer<'_>]) -> Result<(), CommError> {
        let _guard = self.watchdog.guard("point-to-point exchange", &self.in_context(self.world.describe()));
        let world = self.world.comm();
        mpi::request::scope(|scope| {
            let mut requests = Vec::new();
            for t in transfers.iter_mut() {
                match t {
                    Transfer::Send { peer, data } => {
                        for chunk in data.chunks(MAX_MESSAGE_BYTES) {
                            requests.push(world.process_at_rank(*peer).immediate_send(scope, chunk));
                        }
                    }
                    Transfer::Recv { peer, data } => {
                        for chunk in data.chunks_mut(MAX_MESSAGE_BYTES) {
                            requests.push(world.process_at_rank(*peer).immediate_receive_into(scope, chunk));
                        }
                    }
                }
            }
            for r in requests {
                r.wait();
            }
        });
        Ok(())
    }
}
