//! The SPMD runtime: bring-up, config agreement, and the commands every rank executes.
//!
//! The binary's commands hand [`run`] what every rank executes; which rank prints what and the
//! exit status are decided here.

pub mod checkpoint;
pub mod device;
pub mod inspect;
pub mod logprobs;
pub mod probe;
mod session;
pub mod train;

pub use session::{Session, SessionOptions};

use std::path::PathBuf;
use thiserror::Error;

use nereus_core::config::ConfigError;
use nereus_core::file_error::FileError;
use nereus_exec::backend::BackendError;
use nereus_exec::comm::{CommError, PhaseFailure};
use nereus_topology::TopologyError;

use nereus_core::exit::{EXIT_FAILURE, EXIT_PREEMPTED, EXIT_USAGE};

/// Why a command failed.
#[derive(Debug, Error)]
pub enum RuntimeError {
    /// The job config is broken on this rank.
    #[error("{0}")]
    Config(Box<ConfigError>),
    /// A collective or MPI bring-up failed.
    #[error("{0}")]
    Comm(#[from] CommError),
    /// hwloc failed.
    #[error("{0}")]
    Topology(#[from] TopologyError),
    /// A device backend is missing or failed.
    #[error("{0}")]
    Backend(#[from] BackendError),
    /// A transition cannot be planned.
    #[error("{0}")]
    Transition(#[from] nereus_core::transition::TransitionError),
    /// No plan fits.
    #[error("{0}")]
    Planner(#[from] nereus_core::planner::PlannerError),
    /// A command was used wrongly (e.g. too few ranks).
    #[error("{0}")]
    Usage(String),
    /// Out of memory outside a step's engine error (a supervised warm-up): exit 1, as every
    /// out-of-memory is (docs/operations.md, "Exit statuses").
    #[error("{0}")]
    OutOfMemory(String),
    /// An EMU primitive failed.
    #[error("{0}")]
    Emu(#[from] nereus_exec::emu::EmuError),
    /// The engine failed (out of memory, shapes, communication).
    #[error("{0}")]
    Engine(#[from] nereus_exec::engine::EngineError),
    /// A self-test found state that was lost or changed.
    #[error("selftest failed: {0}")]
    SelftestFailed(String),
    /// A file or directory could not be read or written.
    #[error("{0}")]
    Io(#[from] FileError),
    /// Printing to standard output failed.
    #[error("cannot write to standard output: {0}")]
    Stdout(std::io::Error),
    /// A checkpoint was refused (damaged, or not this job's) or could not be written.
    #[error("{0}")]
    Checkpoint(Box<checkpoint::CheckpointError>),
    /// A phase failed on some ranks; every rank stopped at its end (rank 0 holds the report).
    #[error("{}", .0.report)]
    Phase(PhaseFailure),
    /// A loss, gradient norm or parameter stopped being finite (every rank detects it alike).
    #[error("training diverged at step {step}: {quantity} of {model_stage} is {value}; the job stops before the state is checkpointed (the last checkpoint is intact; lower the learning rate, or set train.on_nonfinite = \"skip-step\")")]
    Diverged {
        /// The RL step.
        step: u64,
        /// The model-stage.
        model_stage: String,
        /// `loss`, `gradient norm`, …
        quantity: &'static str,
        /// The value (NaN or ±inf).
        value: f64,
    },
    /// A signal asked the job to stop; it checkpointed at the step boundary (not a failure of
    /// the job: the batch scripts requeue it). Steps are named as the step lines name them
    /// (from 0); the checkpoint `step-N` holds N completed steps.
    #[error("{signal} received: stopped after step {last_step} with a checkpoint of the {} completed steps in `{}`; continue with `--resume latest`", last_step + 1, checkpoint.display())]
    Preempted {
        /// The signal's name.
        signal: &'static str,
        /// The last step completed (0-based, as the step lines count).
        last_step: u64,
        /// The checkpoint written.
        checkpoint: PathBuf,
    },
    /// The reward failed during a step (a scorer command that crashed, hung or answered
    /// garbage): every rank checkpointed the completed steps, untouched by the failed one.
    #[error("step {step}: the reward failed: {what}; the {step} completed steps are checkpointed in `{}` (fix the scorer, then `--resume latest`)", checkpoint.display())]
    RewardFailed {
        /// The step that failed (0-based), which is also the number of completed steps.
        step: u64,
        /// What failed, naming the line.
        what: String,
        /// The checkpoint written.
        checkpoint: PathBuf,
    },
    /// The controller found no plan for the next steps; every rank checkpointed and stops.
    #[error("the controller stopped the job after step {step}: {reason} (checkpoint of the {} completed steps: {})", step + 1, checkpoint.display())]
    ControllerStop {
        /// The last step completed (0-based).
        step: u64,
        /// Why, with the plan that would fit and how to continue.
        reason: String,
        /// The checkpoint written.
        checkpoint: PathBuf,
    },
}

// Boxed: the two largest errors would make every `Result` of the runtime carry their size.
impl From<ConfigError> for RuntimeError {
    fn from(e: ConfigError) -> RuntimeError {
        RuntimeError::Config(Box::new(e))
    }
}

impl From<checkpoint::CheckpointError> for RuntimeError {
    fn from(e: checkpoint::CheckpointError) -> RuntimeError {
        RuntimeError::Checkpoint(Box::new(e))
    }
}

impl From<nereus_data::model_files::ModelFileError> for RuntimeError {
    fn from(e: nereus_data::model_files::ModelFileError) -> RuntimeError {
        checkpoint::CheckpointError::from(e).into()
    }
}

impl From<nereus_exec::emu::dag::DagError> for RuntimeError {
    fn from(e: nereus_exec::emu::dag::DagError) -> RuntimeError {
        use nereus_exec::emu::dag::DagError;
        match e {
            DagError::Emu(e) => RuntimeError::Emu(e),
            DagError::Comm(e) => RuntimeError::Comm(e),
            DagError::Mismatch(what) => RuntimeError::Usage(what),
        }
    }
}

/// The error-mapping closure for a failed file operation on `path`.
pub fn io_error(action: &'static str, path: &std::path::Path) -> impl FnOnce(std::io::Error) -> RuntimeError {
    let to_file_error = FileError::on(action, path);
    move |source| RuntimeError::Io(to_file_error(source))
}

impl RuntimeError {
    /// An error every rank raised at the same point of the program (from a world-wide
    /// collective, or computed from replicated values): rank 0 alone reports it.
    pub fn everywhere(op: &str, e: RuntimeError) -> RuntimeError {
        RuntimeError::Phase(PhaseFailure { op: op.into(), status: e.exit_code(), report: e.to_string() })
    }

    /// The process exit status: 2 for anything the user can fix in the config or command line.
    pub fn exit_code(&self) -> u8 {
        match self {
            RuntimeError::Config(_) | RuntimeError::Usage(_) | RuntimeError::Planner(_) => EXIT_USAGE,
            RuntimeError::Comm(CommError::Disagreement { .. }) => EXIT_USAGE,
            RuntimeError::Checkpoint(e) => e.exit_code(),
            RuntimeError::Backend(e) if e.is_usage() => EXIT_USAGE,
            RuntimeError::Phase(failure) => failure.status,
            RuntimeError::Preempted { .. } => EXIT_PREEMPTED,
            RuntimeError::ControllerStop { .. } => EXIT_USAGE,
            RuntimeError::OutOfMemory(_) => EXIT_FAILURE,
            _ => EXIT_FAILURE,
        }
    }

    /// Whether every rank holds this error at the same point of the program (an agreement, or
    /// a verdict every rank computes from the same replicated values), so rank 0 alone reports
    /// it and nobody needs to abort the others.
    pub(crate) fn reported_by_root(&self) -> bool {
        matches!(
            self,
            RuntimeError::Comm(CommError::Disagreement { .. })
                | RuntimeError::Phase(_)
                | RuntimeError::Diverged { .. }
                | RuntimeError::Engine(nereus_exec::engine::EngineError::Diverged { .. })
                | RuntimeError::Engine(nereus_exec::engine::EngineError::SamplingExhausted { .. })
                | RuntimeError::Preempted { .. }
                | RuntimeError::ControllerStop { .. }
                | RuntimeError::RewardFailed { .. }
        )
    }
}

/// Starts the SPMD session, runs `command` on every rank, reports errors, and returns the exit
/// status. MPI is finalized before this returns.
pub fn run(options: SessionOptions, command: impl FnOnce(&mut Session) -> Result<(), RuntimeError>) -> u8 {
    let mut session = match Session::start(options) {
        Ok(session) => session,
        Err(e) => {
            eprintln!("nereus: error: {e}");
            return e.exit_code();
        }
    };
    match command(&mut session) {
        Ok(()) => 0,
        // `nereus inspect config | head`: the reader left; nothing is wrong with the job.
        Err(RuntimeError::Stdout(e)) if e.kind() == std::io::ErrorKind::BrokenPipe => 0,
        Err(e) if e.reported_by_root() => {
            if session.rank() == 0 {
                let label = if matches!(e, RuntimeError::Preempted { .. }) { "stopped" } else { "error" };
                eprintln!("[r0] nereus: {label}: {e}");
            }
            e.exit_code()
        }
        Err(e) => {
            // Only this rank knows: the others may be waiting for it in a collective, so the
            // whole job ends now, with this rank's status and message, rather than at the
            // watchdog's timeout.
            eprintln!("[r{}] nereus: error: {e}", session.rank());
            if session.world().size() > 1 {
                session.world().abort(e.exit_code());
            }
            e.exit_code()
        }
    }
}

/// Prints a selftest's JSON summary on rank 0; any failed check fails the command.
pub fn report_selftest<S: serde::Serialize>(
    session: &Session,
    summary: &S,
    failures: &[String],
) -> Result<(), RuntimeError> {
    if session.rank() == 0 {
        println!("{}", serde_json::to_string(summary).expect("summaries serialize"));
    }
    match failures.first() {
        None => Ok(()),
        Some(first) => Err(RuntimeError::SelftestFailed(format!("{} failed checks; first: {first}", failures.len()))),
    }
}
