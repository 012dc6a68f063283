//! The execution layers of Nereus, over the pure core: where ranks, bytes and devices are.
//!
//! Bottom-up (see `docs/architecture.md`): [`topology`] (nodes, devices, binding) → [`comm`]
//! (the data-plane trait: MPI always, NCCL and RCCL behind the `cuda` and `rocm` features) →
//! [`backend`] (host and device memory) → [`emu`] (EMUs, the shard store and the four
//! primitives) → [`engine`] (the model on a device) → [`rl`] (PPO, GRPO, ReMax).

pub mod backend;
pub mod comm;
pub mod emu;
pub mod engine;
#[cfg(test)]
mod fixtures;
pub mod rl;
pub mod topology;
