//! Communication: the MPI control plane (bring-up, agreement, gathers, watchdog).
//!
//! MPI is always the control plane: rank 0 plans, every rank agrees on what it received before
//! acting. The tensor data plane (MPI over host memory here; NCCL/RCCL behind the `cuda` and
//! `rocm` features) builds on the same world and watchdog.

mod control;
pub mod data_plane;
mod error;
mod watchdog;
mod world;

pub use control::{
    agree, agree_outcome, all_gather_bytes, broadcast_bytes, gather_bytes_to_root, max_over_ranks, Agreement,
    PhaseFailure,
};
pub use data_plane::{DataPlane, GroupId, MpiPlane, Transfer};
pub use error::CommError;
pub use watchdog::{FaultInjection, Watchdog};
pub use world::World;
