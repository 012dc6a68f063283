//! NCCL's API emulated over MPI point-to-point on host memory: with the emulated device
//! (`backend::emulated`) it runs the whole GPU data plane — communicator creation from a unique
//! id broadcast over MPI, splits, grouped send/recv, collectives — on a CPU-only machine, which
//! is how `--device emulated` and the device-plane integration tests run. A test double: every
//! call completes before it returns (streams are synchronous there).

use std::cell::{Cell, RefCell};
use std::sync::Arc;

use mpi::topology::Communicator;
use mpi::traits::{Destination, Source};

use super::collectives::{
    sum_members, Aborter, CollectiveError, CollectiveLib, Elements, On, RawComm, UniqueId, SPLIT_NO_COLOR,
};
use super::World;
use crate::backend::gpu::DevicePtr;

/// Largest single MPI message (counts are 32-bit).
const MAX_MESSAGE_BYTES: usize = 1 << 30;

/// A communicator: its members' world ranks, this rank's index, and the MPI tag of its messages.
struct Comm {
    members: Vec<i32>,
    rank: usize,
    tag: i32,
}

/// One grouped point-to-point call.
enum Op {
    Send { buf: u64, bytes: usize, to: i32, tag: i32 },
    Recv { buf: u64, bytes: usize, from: i32, tag: i32 },
}

/// The emulation on one rank.
pub struct MpiCollectives<'w> {
    world: &'w World,
    serial: Cell<u64>,
    comms: RefCell<Vec<Comm>>,
    grouped: RefCell<Option<Vec<Op>>>,
}

impl<'w> MpiCollectives<'w> {
    /// The emulation over `world`.
    pub fn new(world: &'w World) -> MpiCollectives<'w> {
        MpiCollectives { world, serial: Cell::new(0), comms: RefCell::new(Vec::new()), grouped: RefCell::new(None) }
    }

    fn add(&self, members: &[i32], tag: i32) -> RawComm {
        let me = self.world.rank();
        let rank = members.iter().position(|&r| r == me).expect("a member creates its communicator");
        let mut comms = self.comms.borrow_mut();
        comms.push(Comm { members: members.to_vec(), rank, tag });
        RawComm(comms.len() as *mut std::ffi::c_void)
    }

    fn with<T>(&self, c: RawComm, f: impl FnOnce(&Comm) -> T) -> T {
        f(&self.comms.borrow()[c.0 as usize - 1])
    }

    /// Runs point-to-point calls concurrently and waits for all of them.
    fn run(&self, ops: &[Op]) {
        let world = self.world.comm();
        mpi::request::scope(|scope| {
            let mut requests = Vec::new();
            for op in ops {
                match *op {
                    Op::Send { buf, bytes, to, tag } => {
                        // SAFETY: emulated device memory is host memory, live until the plane waits.
                        let data = unsafe { std::slice::from_raw_parts(buf as *const u8, bytes) };
                        for chunk in data.chunks(MAX_MESSAGE_BYTES) {
                            requests.push(world.process_at_rank(to).immediate_send_with_tag(scope, chunk, tag));
                        }
                    }
                    Op::Recv { buf, bytes, from, tag } => {
                        // SAFETY: as above; receives land in disjoint ranges.
                        let data = unsafe { std::slice::from_raw_parts_mut(buf as *mut u8, bytes) };
                        for chunk in data.chunks_mut(MAX_MESSAGE_BYTES) {
                            requests
                                .push(world.process_at_rank(from).immediate_receive_into_with_tag(scope, chunk, tag));
                        }
                    }
                }
            }
            for r in requests {
                r.wait();
            }
        });
    }

    /// Queues `op` inside a group, or runs it now.
    fn submit(&self, op: Op) {
        if let Some(ops) = self.grouped.borrow_mut().as_mut() {
            ops.push(op);
            return;
        }
        self.run(&[op]);
    }

    /// Every member's `bytes` at `send`, in member order.
    fn gather(&self, c: &Comm, send: u64, bytes: usize) -> Vec<u8> {
        let mut all = vec![0u8; bytes * c.members.len()];
        let base = all.as_mut_ptr() as u64;
        let mut ops = Vec::new();
        for (j, &peer) in c.members.iter().enumerate().filter(|(j, _)| *j != c.rank) {
            ops.push(Op::Send { buf: send, bytes, to: peer, tag: c.tag });
            ops.push(Op::Recv { buf: base + (j * bytes) as u64, bytes, from: peer, tag: c.tag });
        }
        // SAFETY: `send` holds `bytes` bytes of host memory.
        all[c.rank * bytes..(c.rank + 1) * bytes]
            .copy_from_slice(unsafe { std::slice::from_raw_parts(send as *const u8, bytes) });
        self.run(&ops);
        all
    }
}

/// An MPI tag for a communicator, the same on every member (from its unique id).
fn tag_of(id: &UniqueId) -> i32 {
    let h = id.0.iter().fold(0u32, |h, &b| h.wrapping_mul(31).wrapping_add(u32::from(b)));
    1_000 + (h % 30_000) as i32
}

impl CollectiveLib for MpiCollectives<'_> {
    fn name(&self) -> &'static str {
        "emulated"
    }

    fn version(&self) -> Result<i32, CollectiveError> {
        Ok(0)
    }

    fn has_split(&self) -> bool {
        true
    }

    fn unique_id(&self) -> Result<UniqueId, CollectiveError> {
        self.serial.set(self.serial.get() + 1);
        let mut id = [0u8; 128];
        id[..4].copy_from_slice(&self.world.rank().to_le_bytes());
        id[4..12].copy_from_slice(&self.serial.get().to_le_bytes());
        Ok(UniqueId(id))
    }

    unsafe fn init_rank(&self, id: &UniqueId, _rank: i32, members: &[i32]) -> Result<RawComm, CollectiveError> {
        Ok(self.add(members, tag_of(id)))
    }

    unsafe fn split(
        &self,
        comm: RawComm,
        color: i32,
        _key: i32,
        members: &[i32],
    ) -> Result<Option<RawComm>, CollectiveError> {
        if color == SPLIT_NO_COLOR {
            return Ok(None);
        }
        let tag = self.with(comm, |c| c.tag) + 1 + color;
        Ok(Some(self.add(members, tag)))
    }

    unsafe fn all_gather(&self, send: Elements, recv: DevicePtr, on: On) -> Result<(), CollectiveError> {
        let all = self.with(on.comm, |c| self.gather(c, send.buf.0, send.bytes()));
        std::ptr::copy_nonoverlapping(all.as_ptr(), recv.0 as *mut u8, all.len());
        Ok(())
    }

    unsafe fn broadcast(&self, data: Elements, root: i32, on: On) -> Result<(), CollectiveError> {
        let (buf, bytes) = (data.buf.0, data.bytes());
        let ops: Vec<Op> = self.with(on.comm, |c| {
            let from = c.members[root as usize];
            if c.rank == root as usize {
                c.members.iter().filter(|&&r| r != from).map(|&to| Op::Send { buf, bytes, to, tag: c.tag }).collect()
            } else {
                vec![Op::Recv { buf, bytes, from, tag: c.tag }]
            }
        });
        self.run(&ops);
        Ok(())
    }

    unsafe fn all_reduce_sum(&self, data: Elements, on: On) -> Result<(), CollectiveError> {
        let bytes = data.bytes();
        let all = self.with(on.comm, |c| self.gather(c, data.buf.0, bytes));
        let out = std::slice::from_raw_parts_mut(data.buf.0 as *mut u8, bytes);
        let parts: Vec<&[u8]> = all.chunks_exact(bytes).collect();
        sum_members(data.ty, &parts, out);
        Ok(())
    }

    unsafe fn send(&self, buf: DevicePtr, bytes: usize, peer: i32, on: On) -> Result<(), CollectiveError> {
        let (to, tag) = self.with(on.comm, |c| (c.members[peer as usize], c.tag));
        self.submit(Op::Send { buf: buf.0, bytes, to, tag });
        Ok(())
    }

    unsafe fn recv(&self, buf: DevicePtr, bytes: usize, peer: i32, on: On) -> Result<(), CollectiveError> {
        let (from, tag) = self.with(on.comm, |c| (c.members[peer as usize], c.tag));
        self.submit(Op::Recv { buf: buf.0, bytes, from, tag });
        Ok(())
    }

    fn group_start(&self) -> Result<(), CollectiveError> {
        let mut grouped = self.grouped.borrow_mut();
        if grouped.is_some() {
            return Err(CollectiveError::Unsupported("nested groups are not emulated"));
        }
        *grouped = Some(Vec::new());
        Ok(())
    }

    fn group_end(&self) -> Result<(), CollectiveError> {
        let ops = self
            .grouped
            .borrow_mut()
            .take()
            .ok_or(CollectiveError::Unsupported("ncclGroupEnd without ncclGroupStart"))?;
        self.run(&ops);
        Ok(())
    }

    fn aborter(&self) -> Aborter {
        Arc::new(|_| {})
    }

    unsafe fn destroy(&self, _comm: RawComm) {}
}
