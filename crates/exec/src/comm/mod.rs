//! Communication: the MPI control plane (bring-up, agreement, gathers, watchdog) and the data
//! planes.
//!
//! MPI is always the control plane: rank 0 plans, every rank agrees on what it received before
//! acting. The tensor data plane is MPI over host memory ([`MpiPlane`]) or, for device-resident
//! shards, [`gpu_plane::GpuPlane`] over NCCL (`cuda` feature) or RCCL (`rocm` feature), one binding
//! of their common C API (`nccl_api.rs`) — or over MPI with an emulated device (`emulated_collectives.rs`) for tests
//! without a GPU — built on the same world and watchdog.

pub mod collectives;
mod control;
pub mod data_plane;
pub mod emulated_collectives;
mod error;
pub mod gpu_plane;
#[cfg(any(feature = "cuda", feature = "rocm"))]
pub mod nccl_api;
#[cfg(test)]
pub(crate) mod testing;
mod watchdog;
mod world;

pub use control::{
    agree, agree_outcome, all_gather_bytes, broadcast_bytes, calm_barrier, gather_bytes_to_root, max_over_ranks,
    Agreement, PhaseFailure,
};
pub use data_plane::{DataPlane, DeviceTransfer, GroupId, MpiPlane, Transfer};
pub use error::CommError;
pub use watchdog::{FaultInjection, Watchdog};
pub use world::World;
