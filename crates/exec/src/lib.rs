//! The execution layers of Nereus, over the pure core: where ranks, bytes and devices are.
//!
//! Bottom-up (see `docs/architecture.md`): [`backend`] (devices: the CUDA, ROCm and emulated
//! runtimes behind one seam, the vendor GEMMs; the kernels are the `nereus-kernels` crate's) →
//! [`comm`] (the data-plane trait: MPI always, NCCL and RCCL behind the `cuda` and `rocm`
//! features) → [`emu`] (EMUs, the shard store and the four primitives) → [`engine`] (the model
//! on a host or a device) → [`rl`] (the RL step over model-stages). Where ranks run is the
//! `nereus-topology` crate's.

pub mod backend;
pub mod comm;
pub mod emu;
pub mod engine;
#[cfg(test)]
mod fixtures;
pub mod rl;
