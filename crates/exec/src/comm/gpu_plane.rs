//! The GPU data plane: device-resident bytes over NCCL (NVIDIA) or RCCL (AMD), with MPI kept as
//! the control plane.
//!
//! One [`GpuPlane`] serves both libraries ([`CollectiveLib`]) and every device runtime
//! ([`GpuRuntime`]). Communicators are made from a unique id that the group's first rank draws
//! and broadcasts over the MPI group of the same ranks, cached per rank set; a world-collective
//! [`GpuPlane::device_groups`] makes a whole partition at once with `ncclCommSplit` when the
//! library has it. Point-to-point exchanges (what Split, Merge and Extend plan) run on the world
//! communicator inside one `ncclGroupStart/End`, so pairs proceed concurrently. Everything is
//! enqueued on the device's current stream (one per transition, ordered by events); waits poll
//! that stream under the watchdog, and a stall aborts every communicator (`ncclCommAbort`)
//! before the job ends with the watchdog's message and status.
//!
//! Host bytes (agreements, digests, the engine's host collectives) go through the control plane
//! unchanged: this plane implements [`DataPlane`] by delegating to it.

use std::cell::Cell;
use std::collections::HashMap;
use std::rc::Rc;
use std::sync::{Arc, Mutex};

use super::collectives::{CollectiveError, CollectiveLib, DataType, Elements, On, RawComm, UniqueId, SPLIT_NO_COLOR};
use super::{CommError, DataPlane, DeviceTransfer, GroupId, Transfer, Watchdog};
use crate::backend::gpu::{Device, DevicePtr};
use nereus_core::index_list::format_index_list;

/// A device communicator made by [`GpuPlane::device_group`] or [`GpuPlane::device_groups`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct DeviceGroup(usize);

/// How the plane made a communicator (for tests and logs).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Made {
    /// A unique id broadcast over the MPI group, then `ncclCommInitRank`.
    UniqueId,
    /// `ncclCommSplit` of the world communicator.
    Split,
}

/// The GPU data plane of one rank.
pub struct GpuPlane<'l, C: DataPlane> {
    control: C,
    lib: Box<dyn CollectiveLib + 'l>,
    device: Rc<Device>,
    watchdog: Watchdog,
    world_size: i32,
    comms: Vec<(Vec<i32>, RawComm, Made)>,
    index: HashMap<Vec<i32>, usize>,
    /// Every communicator, for the watchdog thread to abort.
    abortable: Arc<Mutex<Vec<RawComm>>>,
    context: Option<String>,
    sent: Cell<u64>,
}

impl<'l, C: DataPlane> GpuPlane<'l, C> {
    /// The plane of this rank (every rank of the world calls it): makes the world communicator
    /// and hands the device's waits to the watchdog.
    pub fn new(
        control: C,
        lib: Box<dyn CollectiveLib + 'l>,
        device: Rc<Device>,
        watchdog: Watchdog,
        world_size: i32,
    ) -> Result<GpuPlane<'l, C>, CommError> {
        let mut plane = GpuPlane {
            control,
            lib,
            device,
            watchdog,
            world_size,
            comms: Vec::new(),
            index: HashMap::new(),
            abortable: Arc::new(Mutex::new(Vec::new())),
            context: None,
            sent: Cell::new(0),
        };
        let (abortable, abort, watchdog) = (plane.abortable.clone(), plane.lib.aborter(), plane.watchdog.clone());
        let rank = plane.control.rank();
        plane.device.on_stall(
            watchdog.timeout(),
            Box::new(move |node| {
                abort_all(&abortable, &abort);
                let at = node.map_or_else(String::new, |n| format!(" (first unfinished: {n})"));
                watchdog.expire("device stream wait", &format!("rank {rank}'s device stream{at}"));
            }),
        );
        plane.device_group(&(0..world_size).collect::<Vec<_>>())?;
        Ok(plane)
    }

    /// The device.
    pub fn device(&self) -> &Rc<Device> {
        &self.device
    }

    /// The control plane.
    pub fn control(&mut self) -> &mut C {
        &mut self.control
    }

    /// The collective library.
    pub fn lib(&self) -> &dyn CollectiveLib {
        self.lib.as_ref()
    }

    /// Bytes this rank has handed to `ncclSend` so far.
    pub fn bytes_sent(&self) -> u64 {
        self.sent.get()
    }

    /// How the communicator of `group` was made.
    pub fn made(&self, group: DeviceGroup) -> Made {
        self.comms[group.0].2
    }

    /// The world ranks of `group`.
    pub fn members(&self, group: DeviceGroup) -> &[i32] {
        &self.comms[group.0].0
    }

    fn describe(&self, ranks: &[i32]) -> String {
        let group = format!("ranks [{}]", format_index_list(ranks));
        match &self.context {
            Some(c) => format!("{group} during {c}"),
            None => group,
        }
    }

    fn failed(&self, op: &str, ranks: &[i32], reason: impl ToString) -> CommError {
        CommError::Collective {
            lib: self.lib.name(),
            op: op.into(),
            group: self.describe(ranks),
            rank: self.control.rank(),
            reason: reason.to_string(),
        }
    }

    fn remember(&mut self, ranks: &[i32], comm: RawComm, made: Made) -> DeviceGroup {
        self.abortable.lock().unwrap_or_else(|e| e.into_inner()).push(comm);
        self.comms.push((ranks.to_vec(), comm, made));
        self.index.insert(ranks.to_vec(), self.comms.len() - 1);
        DeviceGroup(self.comms.len() - 1)
    }

    /// Runs a blocking library call under the watchdog, aborting every communicator if it
    /// does not return in time.
    fn guarded<T>(
        &self,
        op: &str,
        ranks: &[i32],
        call: impl FnOnce() -> Result<T, CollectiveError>,
    ) -> Result<T, CommError> {
        let (abortable, abort) = (self.abortable.clone(), self.lib.aborter());
        let _guard =
            self.watchdog.guard_with(op, &self.describe(ranks), Box::new(move || abort_all(&abortable, &abort)));
        call().map_err(|reason| self.failed(op, ranks, reason))
    }

    /// The communicator of `ranks` (sorted world ranks, including this one), made by its
    /// members only: the first draws a unique id, the MPI group of the same ranks broadcasts it,
    /// all call `ncclCommInitRank`. Cached: the same set returns the same group.
    pub fn device_group(&mut self, ranks: &[i32]) -> Result<DeviceGroup, CommError> {
        if let Some(&i) = self.index.get(ranks) {
            return Ok(DeviceGroup(i));
        }
        let me = ranks
            .iter()
            .position(|&r| r == self.control.rank())
            .ok_or_else(|| self.failed("communicator creation", ranks, "this rank is not a member"))?;
        let control_group = self.control.group(ranks)?;
        let mut id = if me == 0 {
            self.lib.unique_id().map_err(|e| self.failed("ncclGetUniqueId", ranks, e))?
        } else {
            UniqueId([0; 128])
        };
        self.control.broadcast(control_group, 0, &mut id.0)?;
        // SAFETY: the device was made current on this thread when it was opened.
        let comm = self.guarded("ncclCommInitRank", ranks, || unsafe { self.lib.init_rank(&id, me as i32, ranks) })?;
        Ok(self.remember(ranks, comm, Made::UniqueId))
    }

    /// Communicators for a whole partition of the world at once (every rank calls it with the
    /// same disjoint groups): one `ncclCommSplit` of the world communicator when the library has
    /// it, else each group by unique id. Returns this rank's group, if it is in one.
    pub fn device_groups(&mut self, partition: &[Vec<i32>]) -> Result<Option<DeviceGroup>, CommError> {
        let me = self.control.rank();
        let mine = partition.iter().enumerate().find(|(_, g)| g.contains(&me));
        if !self.lib.has_split() {
            return mine.map(|(_, g)| self.device_group(g)).transpose();
        }
        let cached = mine.and_then(|(_, g)| self.index.get(g).copied());
        let (color, key) = match (mine, cached) {
            (Some((c, g)), None) => (c as i32, g.iter().position(|&r| r == me).expect("a member") as i32),
            _ => (SPLIT_NO_COLOR, me),
        };
        let world: Vec<i32> = (0..self.world_size).collect();
        let parent = self.comms[self.index[&world]].1;
        let members = mine.map_or(Vec::new(), |(_, g)| g.clone());
        // SAFETY: the world communicator is live; every rank of it makes this call.
        let made = self.guarded("ncclCommSplit", &world, || unsafe { self.lib.split(parent, color, key, &members) })?;
        Ok(match (made, cached) {
            (Some(comm), _) => Some(self.remember(&members, comm, Made::Split)),
            (None, Some(i)) => Some(DeviceGroup(i)),
            (None, None) => None,
        })
    }

    /// Concatenates every member's `bytes` at `send` into `recv`, in group order.
    pub fn all_gather(
        &self,
        group: DeviceGroup,
        send: DevicePtr,
        recv: DevicePtr,
        bytes: u64,
    ) -> Result<(), CommError> {
        let (ranks, comm, _) = &self.comms[group.0];
        let stream = self.device.stream();
        // SAFETY: the caller's buffers hold `bytes` and `bytes × members` bytes of device memory.
        let send = Elements { buf: send, count: bytes as usize, ty: DataType::U8 };
        unsafe { self.lib.all_gather(send, recv, On { comm: *comm, stream }) }
            .map_err(|e| self.failed("ncclAllGather", ranks, e))
    }

    /// Copies `bytes` at `data` on group member `root` to every member.
    pub fn broadcast(&self, group: DeviceGroup, root: usize, data: DevicePtr, bytes: u64) -> Result<(), CommError> {
        let (ranks, comm, _) = &self.comms[group.0];
        let stream = self.device.stream();
        // SAFETY: the caller's buffer holds `bytes` bytes of device memory.
        let data = Elements { buf: data, count: bytes as usize, ty: DataType::U8 };
        unsafe { self.lib.broadcast(data, root as i32, On { comm: *comm, stream }) }
            .map_err(|e| self.failed("ncclBroadcast", ranks, e))
    }

    /// Element-wise sum of `count` elements of type `ty` at `data` over the members, in place.
    pub fn all_reduce_sum(
        &self,
        group: DeviceGroup,
        data: DevicePtr,
        count: u64,
        ty: DataType,
    ) -> Result<(), CommError> {
        let (ranks, comm, _) = &self.comms[group.0];
        let stream = self.device.stream();
        // SAFETY: the caller's buffer holds `count` elements of `ty` in device memory.
        let data = Elements { buf: data, count: count as usize, ty };
        unsafe { self.lib.all_reduce_sum(data, On { comm: *comm, stream }) }
            .map_err(|e| self.failed("ncclAllReduce", ranks, e))
    }

    /// Every send and receive of this rank in one `ncclGroupStart/End` on the world
    /// communicator: pairs run concurrently; between two ranks, transfers match in order.
    pub fn exchange_device(&self, sends: &[DeviceTransfer], recvs: &[DeviceTransfer]) -> Result<(), CommError> {
        if sends.is_empty() && recvs.is_empty() {
            return Ok(());
        }
        let world: Vec<i32> = (0..self.world_size).collect();
        let comm = self.comms[self.index[&world]].1;
        let stream = self.device.stream();
        let fail = |op: &str, e: CollectiveError| self.failed(op, &world, e);
        self.lib.group_start().map_err(|e| fail("ncclGroupStart", e))?;
        for t in sends {
            // SAFETY: the caller keeps `bytes` of device memory at `data` until the stream passes.
            unsafe { self.lib.send(t.data, t.bytes as usize, t.peer, On { comm, stream }) }
                .map_err(|e| fail("ncclSend", e))?;
            self.sent.set(self.sent.get() + t.bytes);
        }
        for t in recvs {
            // SAFETY: as above.
            unsafe { self.lib.recv(t.data, t.bytes as usize, t.peer, On { comm, stream }) }
                .map_err(|e| fail("ncclRecv", e))?;
        }
        // Connections to new peers are set up here, blocking: under the watchdog.
        self.guarded("ncclGroupEnd (point-to-point exchange)", &world, || self.lib.group_end())
    }

    /// Waits for everything enqueued on the device (under the watchdog: see the module comment).
    pub fn synchronize(&self) -> Result<(), CommError> {
        self.watchdog.checkpoint("device stream wait");
        let world: Vec<i32> = (0..self.world_size).collect();
        self.device.synchronize().map_err(|e| self.failed("stream wait", &world, e.to_string()))
    }
}

fn abort_all(comms: &Mutex<Vec<RawComm>>, abort: &super::collectives::Aborter) {
    for comm in comms.lock().unwrap_or_else(|e| e.into_inner()).iter() {
        abort(*comm);
    }
}

impl<C: DataPlane> Drop for GpuPlane<'_, C> {
    fn drop(&mut self) {
        if self.synchronize().is_ok() {
            for (_, comm, _) in &self.comms {
                // SAFETY: nothing is pending on the communicator any more.
                unsafe { self.lib.destroy(*comm) };
            }
        }
    }
}

impl<C: DataPlane> DataPlane for GpuPlane<'_, C> {
    fn rank(&self) -> i32 {
        self.control.rank()
    }

    fn group(&mut self, ranks: &[i32]) -> Result<GroupId, CommError> {
        self.control.group(ranks)
    }

    fn prepare_device_sum(&mut self, ranks: &[i32]) -> Result<(), CommError> {
        self.device_group(ranks).map(drop)
    }

    fn all_reduce_device(&self, ranks: &[i32], data: DevicePtr, count: u64, ty: DataType) -> Result<bool, CommError> {
        let group = self.index.get(ranks).copied().ok_or_else(|| {
            self.failed("ncclAllReduce", ranks, "no communicator for these ranks (prepare_device_sum)")
        })?;
        self.all_reduce_sum(DeviceGroup(group), data, count, ty).map(|()| true)
    }

    fn exchange_on_device(&self, sends: &[DeviceTransfer], recvs: &[DeviceTransfer]) -> Result<bool, CommError> {
        self.exchange_device(sends, recvs).map(|()| true)
    }

    fn all_gather(&self, group: GroupId, send: &[u8], recv: &mut [u8]) -> Result<(), CommError> {
        self.control.all_gather(group, send, recv)
    }

    fn broadcast(&self, group: GroupId, root: usize, data: &mut [u8]) -> Result<(), CommError> {
        self.control.broadcast(group, root, data)
    }

    fn all_reduce_sum_u64(&self, group: GroupId, values: &mut [u64]) -> Result<(), CommError> {
        self.control.all_reduce_sum_u64(group, values)
    }

    fn all_reduce_sum_f32(&self, group: GroupId, values: &mut [f32]) -> Result<(), CommError> {
        self.control.all_reduce_sum_f32(group, values)
    }

    fn barrier(&self, group: GroupId) -> Result<(), CommError> {
        self.control.barrier(group)
    }

    fn exchange(&self, transfers: &mut [Transfer<'_>]) -> Result<(), CommError> {
        self.control.exchange(transfers)
    }

    /// Marks the end of the node the previous context named on the device stream, so a stall
    /// report names the first node the device has not finished.
    fn set_context(&mut self, context: Option<String>) {
        if let Some(previous) = self.context.take() {
            let _ = self.device.mark(&previous);
        }
        self.control.set_context(context.clone());
        self.context = context;
    }

    fn begin_transition(&mut self) -> Result<(), CommError> {
        let world: Vec<i32> = (0..self.world_size).collect();
        self.device.begin_transition().map_err(|e| self.failed("stream creation", &world, e.to_string()))
    }

    fn end_transition(&mut self) -> Result<(), CommError> {
        self.set_context(None);
        self.synchronize()
    }
}

#[cfg(test)]
mod tests {
    use std::sync::{Arc, Mutex};
    use std::time::Duration;

    use super::*;
    use crate::backend::emulated::Emulated;
    use crate::comm::testing::{run_ranks, Calls, FakeLib, LoopbackPlane, Mailbox};

    type Plane = GpuPlane<'static, LoopbackPlane>;

    fn plane(rank: i32, n: i32, split: bool, mail: Arc<Mailbox>, calls: &Arc<Mutex<Calls>>) -> Plane {
        let device = Rc::new(Device::new(Emulated::new(rank as u32, 1 << 30)).unwrap());
        let lib = FakeLib::new(rank, split, mail.clone(), calls.clone());
        let watchdog = Watchdog::new(Duration::from_secs(30), rank, false);
        GpuPlane::new(LoopbackPlane::new(rank, mail), Box::new(lib), device, watchdog, n).unwrap()
    }

    #[test]
    fn communicators_are_cached_per_rank_set_and_made_from_one_broadcast_id() {
        let calls = Arc::new(Mutex::new(Calls::default()));
        let groups = run_ranks(4, |rank, mail| {
            let mut p = plane(rank, 4, false, mail, &calls);
            let pair: Vec<i32> = if rank < 2 { vec![0, 1] } else { vec![2, 3] };
            let (first, again) = (p.device_group(&pair).unwrap(), p.device_group(&pair).unwrap());
            assert_eq!(first, again, "the same rank set returns the cached communicator");
            assert_eq!((p.members(first), p.made(first)), (pair.as_slice(), Made::UniqueId));
            first
        });
        assert!(groups.iter().all(|g| *g == groups[0]));
        let calls = calls.lock().unwrap();
        // One id for the world (drawn by rank 0) and one per pair (by its first rank), no more.
        let mut drawers: Vec<i32> = calls.ids.iter().map(|(r, _)| *r).collect();
        drawers.sort_unstable();
        assert_eq!(drawers, [0, 0, 2]);
        assert_eq!(calls.inits.len(), 4 + 4, "each rank joins the world and its pair once");
        for (world_rank, id, comm_rank, members) in &calls.inits {
            let drawn = calls.ids.iter().find(|(_, i)| i == id).expect("an id that was drawn");
            assert_eq!(drawn.0, members[0], "the group's first rank drew the id every member got");
            assert_eq!(members[*comm_rank as usize], *world_rank, "comm rank = position in the set");
        }
    }

    #[test]
    fn a_partition_splits_the_world_communicator_when_the_library_can() {
        for split in [true, false] {
            let calls = Arc::new(Mutex::new(Calls::default()));
            let made = run_ranks(4, |rank, mail| {
                let mut p = plane(rank, 4, split, mail, &calls);
                let partition = vec![vec![0, 2], vec![1, 3]];
                let g = p.device_groups(&partition).unwrap().expect("every rank is in a group");
                let again = p.device_groups(&partition).unwrap().unwrap();
                (p.made(g), p.members(g).to_vec(), p.members(again).to_vec())
            });
            let calls = calls.lock().unwrap();
            for (rank, (how, members, again)) in made.iter().enumerate() {
                assert_eq!(*how, if split { Made::Split } else { Made::UniqueId });
                assert!(members.contains(&(rank as i32)) && members == again);
            }
            if split {
                // Each rank's first call splits (color = its group, key = its position); the
                // second finds the group cached and joins the split with no color.
                for (rank, (color, key)) in [(0, (0, 0)), (1, (1, 0)), (2, (0, 1)), (3, (1, 1))] {
                    let mine: Vec<(i32, i32)> =
                        calls.splits.iter().filter(|s| s.0 == rank).map(|s| (s.1, s.2)).collect();
                    assert_eq!(mine.len(), 2);
                    assert_eq!((mine[0], mine[1].0), ((color, key), SPLIT_NO_COLOR), "rank {rank}");
                }
            } else {
                assert!(calls.splits.is_empty());
            }
        }
    }

    #[test]
    fn a_prepared_device_sum_adds_every_members_f32_in_device_memory() {
        let calls = Arc::new(Mutex::new(Calls::default()));
        let sums = run_ranks(4, |rank, mail| {
            let mut p = plane(rank, 4, false, mail.clone(), &calls);
            // Data-parallel pairs, as EmuGroups prepares them: ranks 0 and 2, ranks 1 and 3.
            let pair: Vec<i32> = if rank % 2 == 0 { vec![0, 2] } else { vec![1, 3] };
            p.prepare_device_sum(&pair).unwrap();
            let device = p.device().clone();
            let data = device.alloc(8).unwrap();
            device.upload(bytemuck::cast_slice(&[rank as f32 + 0.5, 10.0 * rank as f32]), data).unwrap();
            assert!(p.all_reduce_device(&pair, data, 2, DataType::F32).unwrap(), "the GPU plane sums in device memory");
            assert!(p.all_reduce_device(&[rank], data, 2, DataType::F32).is_err(), "an unprepared set is refused");
            p.synchronize().unwrap();
            let host = LoopbackPlane::new(rank, mail);
            assert!(!host.all_reduce_device(&pair, data, 2, DataType::F32).unwrap(), "a host plane has no device sum");
            let mut got = [0u8; 8];
            device.download(data, &mut got).unwrap();
            bytemuck::cast::<[u8; 8], [f32; 2]>(got)
        });
        assert_eq!(sums, [[3.0, 20.0], [5.0, 40.0], [3.0, 20.0], [5.0, 40.0]]);
    }

    #[test]
    fn exchanges_move_device_bytes_in_one_group_and_collectives_combine_every_member() {
        let calls = Arc::new(Mutex::new(Calls::default()));
        let results = run_ranks(3, |rank, mail| {
            let p = plane(rank, 3, true, mail, &calls);
            let device = p.device().clone();
            let (out, inbox) = (device.alloc(8).unwrap(), device.alloc(16).unwrap());
            device.upload(&[rank as u8; 8], out).unwrap();
            // A ring: send to the next rank, receive from the previous one, both at once.
            let (next, prev) = ((rank + 1) % 3, (rank + 2) % 3);
            let send = [DeviceTransfer { peer: next, data: out, bytes: 8 }];
            let recv = [DeviceTransfer { peer: prev, data: inbox, bytes: 8 }];
            p.exchange_device(&send, &recv).unwrap();
            let world = DeviceGroup(0);
            let gathered = device.alloc(24).unwrap();
            p.all_gather(world, out, gathered, 8).unwrap();
            p.synchronize().unwrap();
            let (mut got, mut all) = (vec![0u8; 8], vec![0u8; 24]);
            device.download(inbox, &mut got).unwrap();
            device.download(gathered, &mut all).unwrap();
            (got, all, p.bytes_sent())
        });
        for (rank, (got, all, sent)) in results.iter().enumerate() {
            assert_eq!(*got, vec![((rank + 2) % 3) as u8; 8], "rank {rank} received its predecessor's bytes");
            assert_eq!(*all, [[0u8; 8], [1; 8], [2; 8]].concat());
            assert_eq!(*sent, 8);
        }
        let calls = calls.lock().unwrap();
        for rank in 0..3 {
            let log: Vec<&str> = calls.log.iter().filter(|(r, _)| *r == rank).map(|(_, c)| c.as_str()).collect();
            assert_eq!(log.first(), Some(&"start"));
            assert_eq!(log.last(), Some(&"end"), "sends and receives inside one group: {log:?}");
        }
    }
}
