//! Nereus: a cost-aware runtime that keeps an LLM RL post-training job (PPO, GRPO, ReMax) on an
//! efficient, memory-feasible parallel plan while it runs.
//!
//! Layers, bottom-up (see `docs/architecture.md`): [`config`] → [`topology`] → [`comm`] →
//! [`runtime`]; [`backend`] holds the device backends behind the `cuda` and `rocm` features, and
//! `exact` the MILPs that the planner and the transition scheduler are checked against, behind
//! the `exact` feature.

pub mod backend;
pub mod comm;
pub mod config;
pub mod cost;
pub mod emu;
pub mod engine;
#[cfg(feature = "exact")]
pub mod exact;
pub mod model;
pub mod plan;
pub mod planner;
pub mod plot;
pub mod policy;
pub mod rl;
pub mod runtime;
pub mod sim;
pub mod topology;
pub mod transition;
pub mod units;
