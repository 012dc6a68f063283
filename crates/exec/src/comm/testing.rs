//! Test doubles for the data planes without MPI: ranks are threads of one process that talk
//! through a shared mailbox. [`LoopbackPlane`] is a host [`DataPlane`] (the control plane);
//! [`FakeLib`] is a [`CollectiveLib`] that records every call and moves emulated-device bytes
//! (host memory) through the same mailbox.

use std::collections::{HashMap, VecDeque};
use std::hash::{Hash, Hasher};
use std::sync::{Arc, Condvar, Mutex};

use super::collectives::{
    sum_members, Aborter, CollectiveError, CollectiveLib, Elements, On, RawComm, UniqueId, SPLIT_NO_COLOR,
};
use super::{CommError, DataPlane, GroupId, Transfer};
use crate::backend::gpu::DevicePtr;

/// Queued messages by (from, to, channel).
type Queues = HashMap<(i32, i32, u64), VecDeque<Vec<u8>>>;

/// Messages between threads, by (from, to, channel), in order.
#[derive(Default)]
pub struct Mailbox {
    queues: Mutex<Queues>,
    arrived: Condvar,
}

impl Mailbox {
    fn send(&self, from: i32, to: i32, channel: u64, bytes: &[u8]) {
        self.queues.lock().unwrap().entry((from, to, channel)).or_default().push_back(bytes.to_vec());
        self.arrived.notify_all();
    }

    fn recv(&self, from: i32, to: i32, channel: u64) -> Vec<u8> {
        let mut queues = self.queues.lock().unwrap();
        loop {
            if let Some(m) = queues.get_mut(&(from, to, channel)).and_then(VecDeque::pop_front) {
                return m;
            }
            queues = self.arrived.wait(queues).unwrap();
        }
    }
}

fn channel_of(ranks: &[i32], salt: u64) -> u64 {
    let mut h = std::collections::hash_map::DefaultHasher::new();
    (ranks, salt).hash(&mut h);
    h.finish()
}

/// Every member's `mine` (equal sizes), in member order, over `channel`.
fn gather(mail: &Mailbox, me: i32, members: &[i32], channel: u64, mine: &[u8]) -> Vec<Vec<u8>> {
    for &r in members.iter().filter(|&&r| r != me) {
        mail.send(me, r, channel, mine);
    }
    members.iter().map(|&r| if r == me { mine.to_vec() } else { mail.recv(r, me, channel) }).collect()
}

/// A host data plane for one thread-rank of an in-process world.
pub struct LoopbackPlane {
    rank: i32,
    mail: Arc<Mailbox>,
    groups: Vec<Vec<i32>>,
}

impl LoopbackPlane {
    /// Rank `rank` on `mail`.
    pub fn new(rank: i32, mail: Arc<Mailbox>) -> LoopbackPlane {
        LoopbackPlane { rank, mail, groups: Vec::new() }
    }

    fn gather(&self, group: GroupId, mine: &[u8]) -> Vec<Vec<u8>> {
        let members = &self.groups[group.0];
        gather(&self.mail, self.rank, members, channel_of(members, 1), mine)
    }
}

impl DataPlane for LoopbackPlane {
    fn rank(&self) -> i32 {
        self.rank
    }

    fn group(&mut self, ranks: &[i32]) -> Result<GroupId, CommError> {
        let i = self.groups.iter().position(|g| g == ranks).unwrap_or_else(|| {
            self.groups.push(ranks.to_vec());
            self.groups.len() - 1
        });
        Ok(GroupId(i))
    }

    fn all_gather(&self, group: GroupId, send: &[u8], recv: &mut [u8]) -> Result<(), CommError> {
        recv.copy_from_slice(&self.gather(group, send).concat());
        Ok(())
    }

    fn broadcast(&self, group: GroupId, root: usize, data: &mut [u8]) -> Result<(), CommError> {
        let all = self.gather(group, data);
        data.copy_from_slice(&all[root]);
        Ok(())
    }

    fn all_reduce_sum_u64(&self, group: GroupId, values: &mut [u64]) -> Result<(), CommError> {
        let all = self.gather(group, bytemuck::cast_slice(values));
        for (i, v) in values.iter_mut().enumerate() {
            *v = all
                .iter()
                .map(|m| bytemuck::pod_read_unaligned::<u64>(&m[8 * i..8 * i + 8]))
                .fold(0, u64::wrapping_add);
        }
        Ok(())
    }

    fn all_reduce_sum_f32(&self, group: GroupId, values: &mut [f32]) -> Result<(), CommError> {
        let all = self.gather(group, bytemuck::cast_slice(values));
        for (i, v) in values.iter_mut().enumerate() {
            *v = all.iter().map(|m| bytemuck::pod_read_unaligned::<f32>(&m[4 * i..4 * i + 4])).sum();
        }
        Ok(())
    }

    fn barrier(&self, group: GroupId) -> Result<(), CommError> {
        self.gather(group, &[]);
        Ok(())
    }

    fn exchange(&self, transfers: &mut [Transfer<'_>]) -> Result<(), CommError> {
        for t in transfers.iter() {
            if let Transfer::Send { peer, data } = t {
                self.mail.send(self.rank, *peer, 0, data);
            }
        }
        for t in transfers.iter_mut() {
            if let Transfer::Recv { peer, data } = t {
                data.copy_from_slice(&self.mail.recv(*peer, self.rank, 0));
            }
        }
        Ok(())
    }
}

/// What a [`FakeLib`] was asked to do, shared by every thread-rank.
#[derive(Debug, Default)]
pub struct Calls {
    /// `(drawing rank, id)` per `ncclGetUniqueId`.
    pub ids: Vec<(i32, UniqueId)>,
    /// `(world rank, id, comm rank, members)` per `ncclCommInitRank`.
    pub inits: Vec<(i32, UniqueId, i32, Vec<i32>)>,
    /// `(world rank, color, key)` per `ncclCommSplit`.
    pub splits: Vec<(i32, i32, i32)>,
    /// `(world rank, call)` in order: `start`, `send→peer`, `recv←peer`, `end`, …
    pub log: Vec<(i32, String)>,
}

/// A collective library over the mailbox, for thread-ranks on emulated devices.
#[derive(Clone)]
pub struct FakeLib {
    rank: i32,
    split: bool,
    mail: Arc<Mailbox>,
    calls: Arc<Mutex<Calls>>,
    comms: Arc<Mutex<Vec<Vec<i32>>>>,
}

impl FakeLib {
    /// The library of thread-rank `rank`; `split` says whether it offers `ncclCommSplit`.
    pub fn new(rank: i32, split: bool, mail: Arc<Mailbox>, calls: Arc<Mutex<Calls>>) -> FakeLib {
        FakeLib { rank, split, mail, calls, comms: Arc::new(Mutex::new(Vec::new())) }
    }

    fn log(&self, what: String) {
        self.calls.lock().unwrap().log.push((self.rank, what));
    }

    fn members(&self, c: RawComm) -> Vec<i32> {
        self.comms.lock().unwrap()[c.0 as usize - 1].clone()
    }

    fn add(&self, members: &[i32]) -> RawComm {
        let mut comms = self.comms.lock().unwrap();
        comms.push(members.to_vec());
        RawComm(comms.len() as *mut std::ffi::c_void)
    }
}

impl CollectiveLib for FakeLib {
    fn name(&self) -> &'static str {
        "fake"
    }

    fn version(&self) -> Result<i32, CollectiveError> {
        Ok(if self.split { 21_800 } else { 21_700 })
    }

    fn has_split(&self) -> bool {
        self.split
    }

    fn unique_id(&self) -> Result<UniqueId, CollectiveError> {
        let mut calls = self.calls.lock().unwrap();
        let mut id = [0u8; 128];
        id[0] = calls.ids.len() as u8 + 1;
        calls.ids.push((self.rank, UniqueId(id)));
        Ok(UniqueId(id))
    }

    unsafe fn init_rank(&self, id: &UniqueId, rank: i32, members: &[i32]) -> Result<RawComm, CollectiveError> {
        self.calls.lock().unwrap().inits.push((self.rank, *id, rank, members.to_vec()));
        Ok(self.add(members))
    }

    unsafe fn split(
        &self,
        _comm: RawComm,
        color: i32,
        key: i32,
        members: &[i32],
    ) -> Result<Option<RawComm>, CollectiveError> {
        self.calls.lock().unwrap().splits.push((self.rank, color, key));
        Ok((color != SPLIT_NO_COLOR).then(|| self.add(members)))
    }

    unsafe fn all_gather(&self, send: Elements, recv: DevicePtr, on: On) -> Result<(), CollectiveError> {
        let members = self.members(on.comm);
        let mine = std::slice::from_raw_parts(send.buf.0 as *const u8, send.bytes());
        let all = gather(&self.mail, self.rank, &members, channel_of(&members, 2), mine).concat();
        std::ptr::copy_nonoverlapping(all.as_ptr(), recv.0 as *mut u8, all.len());
        Ok(())
    }

    unsafe fn broadcast(&self, data: Elements, root: i32, on: On) -> Result<(), CollectiveError> {
        let members = self.members(on.comm);
        let bytes = std::slice::from_raw_parts_mut(data.buf.0 as *mut u8, data.bytes());
        let all = gather(&self.mail, self.rank, &members, channel_of(&members, 3), bytes);
        bytes.copy_from_slice(&all[root as usize]);
        Ok(())
    }

    unsafe fn all_reduce_sum(&self, data: Elements, on: On) -> Result<(), CollectiveError> {
        let members = self.members(on.comm);
        let bytes = std::slice::from_raw_parts_mut(data.buf.0 as *mut u8, data.bytes());
        self.log(format!("all_reduce {:?} ×{}", data.ty, data.count));
        let all = gather(&self.mail, self.rank, &members, channel_of(&members, 4), bytes);
        let parts: Vec<&[u8]> = all.iter().map(Vec::as_slice).collect();
        sum_members(data.ty, &parts, bytes);
        Ok(())
    }

    unsafe fn send(&self, buf: DevicePtr, bytes: usize, peer: i32, on: On) -> Result<(), CollectiveError> {
        let to = self.members(on.comm)[peer as usize];
        self.log(format!("send→{to}"));
        self.mail.send(self.rank, to, 9, std::slice::from_raw_parts(buf.0 as *const u8, bytes));
        Ok(())
    }

    unsafe fn recv(&self, buf: DevicePtr, bytes: usize, peer: i32, on: On) -> Result<(), CollectiveError> {
        let from = self.members(on.comm)[peer as usize];
        self.log(format!("recv←{from}"));
        let data = self.mail.recv(from, self.rank, 9);
        assert_eq!(data.len(), bytes, "a receive matches its send's size");
        std::ptr::copy_nonoverlapping(data.as_ptr(), buf.0 as *mut u8, bytes);
        Ok(())
    }

    fn group_start(&self) -> Result<(), CollectiveError> {
        self.log("start".into());
        Ok(())
    }

    fn group_end(&self) -> Result<(), CollectiveError> {
        self.log("end".into());
        Ok(())
    }

    fn aborter(&self) -> Aborter {
        Arc::new(|_| {})
    }

    unsafe fn destroy(&self, _comm: RawComm) {}
}

/// Runs `body(rank, mailbox)` on `n` thread-ranks and returns their results in rank order.
pub fn run_ranks<T: Send>(n: i32, body: impl Fn(i32, Arc<Mailbox>) -> T + Sync) -> Vec<T> {
    let mail = Arc::new(Mailbox::default());
    std::thread::scope(|s| {
        let handles: Vec<_> = (0..n)
            .map(|r| {
                let (mail, body) = (mail.clone(), &body);
                s.spawn(move || body(r, mail))
            })
            .collect();
        handles.into_iter().map(|h| h.join().expect("a rank panicked")).collect()
    })
}
