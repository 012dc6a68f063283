//! `nereus simulate`: a job at cluster scale, driven by a trace, on one process. Pure: a
//! seeded machine that is not the cost model is the ground truth ([`truth`]), and every
//! decision and calibration is the live runtime's — the same
//! [`initial_plan`](crate::planner::initial_plan), [`Controller`](crate::policy::controller::Controller)
//! (monitor, triggers, replan with the planner, executable target with the transition DAG,
//! admission) — so what the simulator says a policy does is what `nereus train` would do.
//!
//! - [`trace`]: the CSV traces (`step`, `seq_len_mean`, `seq_len_p95`, `available_gpus`).
//! - [`synth`]: traces shaped like the paper's (length growth, spot pools, both, its 26 steps,
//!   published curves, elastic pools, and mixed: noisy growth while the pool moves).
//! - [`compare`]: several policies (and γ values) over one trace, as a table.
//! - [`run`]: the loop, its step records and run summaries, and [`run::replay`] of recorded
//!   steps through the controller.
//! - [`truth`]: what a step and a transition really take on the simulated machine.
//! - [`plot`]: step latency per policy over the run, transitions marked, length and pool on a
//!   second axis (SVG).

pub mod compare;
pub mod plot;
pub mod run;
pub mod synth;
pub mod trace;
pub mod truth;

use thiserror::Error;

pub use compare::{
    compare, read_calibration, read_trace, run_name, spread_table, spreads, table, Comparison, PolicySpread, Spread,
};
pub use run::{replay, simulate, Job, PolicyRun, RestartModel, RunSummary, SimOptions, SimStep};
pub use trace::{Point, Trace, TraceRow};
pub use truth::Truth;

/// Why a simulation could not run.
#[derive(Debug, Error)]
pub enum SimError {
    /// The trace is malformed.
    #[error("trace `{name}`, line {line}: {message}")]
    Trace {
        /// The trace's file name.
        name: String,
        /// 1-based line.
        line: usize,
        /// What is wrong.
        message: String,
    },
    /// The trace has no rows.
    #[error("the trace has no rows")]
    EmptyTrace,
    /// The request makes no sense (a policy with nothing to simulate, a bad calibration).
    #[error("{0}")]
    Request(String),
    /// A trace or calibration file could not be read.
    #[error("{0}")]
    Io(#[from] crate::file_error::FileError),
    /// The planner failed where a plan had to exist.
    #[error("{0}")]
    Planner(#[from] crate::planner::PlannerError),
}
