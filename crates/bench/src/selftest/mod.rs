//! `nereus selftest …`: randomized checks of the runtime's machinery on the job's own ranks,
//! whose verdicts depend on every rank.

mod device_groups;
mod engine;
pub mod kernels;
mod primitives;
mod transitions;

pub use engine::{engine, parity_arch, EngineSummary};
pub use primitives::{primitives, SelftestSummary};
pub(crate) use transitions::{changed_digests, materialize, materialize_in, missed_targets, state_bytes};
pub use transitions::{transitions, TransitionSummary};
