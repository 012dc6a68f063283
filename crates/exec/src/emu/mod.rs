//! Elastic Model Units: sharded parameter and optimizer state on MPI ranks, and the four
//! primitives that reshape it — `Split`, `Merge`, `Extend`, `Destroy` — moving real bytes.
//!
//! Metadata (which EMUs exist, their layouts and ranks) is replicated: every rank applies every
//! primitive to its [`EmuSet`] in the same order, and moves the bytes it takes part in. See
//! `docs/emu.md` for a worked 8-rank example.

pub mod dag;
mod device;
mod digest;
mod execute;
mod ledger;
mod memory;
mod movement;
mod set;
mod shard;
mod store;
mod unit;

pub use device::{DeviceBuffer, DeviceMemory};
pub use digest::{synthetic_fill, Digest};
pub use execute::RankPlan;
pub use ledger::MemoryLedger;
pub use memory::{Buffers, Exchange, HostFill, HostMemory, Message, Place, RectCopy, ShardMemory};
pub use movement::{Movement, Segment, TargetEmu};
pub use set::{merge_ranks, split_ranks, EmuSet, PrimitiveOptions, PrimitiveReport, Route};
pub use shard::{shard_charges, LocalShard, ShardBuffer};
pub use store::ShardStore;
pub use unit::{Counters, Emu, EmuId};

use nereus_core::model::Section;

use thiserror::Error;

use crate::backend::BackendError;
use crate::comm::CommError;
use nereus_core::model::LayoutError;

/// Why an EMU operation was refused or failed. Refusals happen before any byte moves.
#[derive(Debug, Error)]
pub enum EmuError {
    /// A buffer does not fit in the rank's device memory.
    #[error("out of memory on rank {rank}: {what} needs {bytes} bytes, {used} of {capacity} already in use")]
    OutOfMemory {
        /// The rank.
        rank: i32,
        /// The buffer.
        what: String,
        /// Its size.
        bytes: u64,
        /// Bytes already charged.
        used: u64,
        /// The rank's capacity.
        capacity: u64,
    },
    /// Some ranks lack room for a primitive's new shards; nothing was allocated or moved.
    #[error("{primitive} refused: not enough device memory on rank(s) {ranks}; no state was changed")]
    NoRoom {
        /// The primitive, e.g. `Extend emu#3 -> ranks [4, 5]`.
        primitive: String,
        /// The ranks without room.
        ranks: String,
    },
    /// The last replica of a model-stage cannot be destroyed.
    #[error("Destroy {emu} refused: it is the last replica of {model_stage}; its state would be lost")]
    LastReplica {
        /// The EMU.
        emu: EmuId,
        /// Its model-stage.
        model_stage: String,
    },
    /// The requested layout cannot hold the model.
    #[error("{0}")]
    Layout(#[from] LayoutError),
    /// A primitive's arguments do not make sense (unknown EMU, incompatible layouts, ranks taken).
    #[error("{primitive} refused: {reason}")]
    Invalid {
        /// The primitive.
        primitive: String,
        /// What is wrong.
        reason: String,
    },
    /// Communication failed.
    #[error("{0}")]
    Comm(#[from] CommError),
    /// The device holding the shards failed (allocation, copy, kernel).
    #[error("{0}")]
    Device(#[from] BackendError),
}

#[cfg(test)]
mod tests;
