//! The pure core of Nereus: everything that decides, and nothing that touches a rank. Functions
//! of (topology, shapes, measurements), unit tested without MPI, hwloc or a GPU.
//!
//! Layers, bottom-up (see `docs/architecture.md`): [`config`] → [`model`] → [`plan`] → [`cost`]
//! → [`planner`] → [`transition`] (planning) → [`policy`] → [`sim`]; [`plot`], [`units`],
//! [`rng`], [`index_list`], [`named`], [`file_error`] and [`thread_budget`] are shared helpers
//! below every layer, and `exact` (feature `exact`) holds the MILPs the planner and the
//! transition scheduler are checked against.
//! The user's data (prompt files, tokenizers, rewards) lives in the `nereus-data` crate.

pub mod config;
pub mod cost;
#[cfg(feature = "exact")]
pub mod exact;
pub mod exit;
pub mod file_error;
pub mod half;
pub mod index_list;
pub mod model;
pub mod named;
pub mod plan;
pub mod planner;
pub mod plot;
pub mod policy;
pub mod record;
pub mod rng;
pub mod sim;
pub mod thread_budget;
pub mod transition;
pub mod units;
