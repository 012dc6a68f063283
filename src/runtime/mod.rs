//! The SPMD runtime: bring-up, config agreement, and the commands every rank executes.
//!
//! `main.rs` parses the command line into a [`Command`] and calls [`run`]; everything else,
//! including which rank prints what and the exit status, is decided here.

pub mod alloc_meter;
pub mod bench;
pub mod checkpoint;
pub mod controller;
pub mod device;
pub mod fault;
mod inspect;
pub mod logging;
pub mod logprobs;
pub mod metrics;
pub mod plan;
pub mod pool;
pub mod probe;
mod rng;
pub mod selftest;
mod session;
pub mod signals;
pub mod simulate;
pub mod timeline;
pub mod train;
pub mod transition;

pub use device::DeviceChoice;
pub use logging::LogOptions;
pub use rng::Rng;
pub use session::{Session, SessionOptions};

use std::path::PathBuf;
use thiserror::Error;

use crate::backend::BackendError;
use crate::comm::{CommError, PhaseFailure};
use crate::config::{ConfigError, Overrides};
use crate::topology::TopologyError;

/// Exit status for usage and configuration errors.
pub const EXIT_USAGE: u8 = 2;
/// Exit status for runtime failures (MPI, hwloc, drivers).
pub const EXIT_FAILURE: u8 = 1;
/// Exit status of a job stopped by a signal after checkpointing (sysexits' `EX_TEMPFAIL`: the
/// batch scripts requeue the job, which resumes from the checkpoint).
pub const EXIT_PREEMPTED: u8 = 75;

/// A command as every rank executes it.
#[derive(Debug, Clone)]
pub enum Command {
    /// Load, resolve, validate and agree on a job config; rank 0 prints it.
    InspectConfig {
        /// The job file; `None` for the embedded default.
        config: Option<PathBuf>,
        /// CLI overrides.
        overrides: Overrides,
    },
    /// Discover every rank's node, binding and device; rank 0 prints them.
    InspectTopology {
        /// Print JSON instead of a table.
        json: bool,
    },
    /// Find the fastest memory-feasible plan for a job (or evaluate its fixed plan, or a
    /// what-if transition).
    Plan {
        /// The job file; `None` for the embedded default.
        config: Option<PathBuf>,
        /// CLI overrides.
        overrides: Overrides,
        /// Pool, length, what-if and output.
        request: plan::PlanRequest,
    },
    /// Benchmark the EMU primitives against MPI point-to-point bandwidth.
    BenchPrimitives {
        /// Unit sizes in MiB.
        sizes_mib: Vec<u64>,
        /// Repetitions per size.
        reps: usize,
        /// Where to write the JSON report.
        json: Option<PathBuf>,
        /// Device-resident shards over the GPU data plane (`--device`), or host memory over MPI.
        device: Option<DeviceChoice>,
    },
    /// Simulate a job over a trace under several policies (rank 0; one process is enough).
    Simulate {
        /// The job file; `None` for the embedded default.
        config: Option<PathBuf>,
        /// CLI overrides (`--cluster`).
        overrides: Overrides,
        /// The trace, policies and outputs.
        request: simulate::SimulateRequest,
    },
    /// Write a synthetic trace.
    TraceSynth {
        /// Its shape and size.
        spec: crate::sim::synth::SynthSpec,
        /// The CSV file to write.
        out: PathBuf,
    },
    /// Benchmark the simulator: 1,000 steps at 1,024 and 16,384 GPUs, four policies.
    BenchSimulate {
        /// The job to simulate.
        config: PathBuf,
        /// The length-growth trace.
        trace: PathBuf,
        /// Where to write the JSON report.
        json: Option<PathBuf>,
    },
    /// Benchmark plan selection and transition scheduling against exact MILPs.
    BenchSolver {
        /// The job to plan.
        config: PathBuf,
        /// Repetitions per instance.
        reps: usize,
        /// Seconds each DAG-scheduling MILP may run.
        time_limit_s: f64,
        /// Where to write the JSON report.
        json: Option<PathBuf>,
    },
    /// Scale a PPO job's training state with the transition DAG, checkpoint/restart and
    /// per-tensor resharding, against the point-to-point bandwidth.
    BenchScaling(bench::scaling::ScalingOptions),
    /// The restarted job of `bench scaling`'s checkpoint/restart method: load the checkpoint in
    /// the directory and report when every rank holds its state.
    BenchScalingRestore {
        /// The checkpoint directory (`restart.json` and the rank-local files).
        dir: PathBuf,
    },
    /// Benchmark replan time and memory from 8 to 16,384 GPUs.
    BenchPlanner {
        /// The job to plan.
        config: PathBuf,
        /// Response length to plan for.
        seq_len: u64,
        /// Repetitions per size.
        reps: usize,
        /// Where to write the JSON report.
        json: Option<PathBuf>,
    },
    /// Benchmark the time of one controller decision (tiny job, Llama at 1,024 and 16,384 GPUs).
    BenchController {
        /// The large job whose modelled monitor records are decided on.
        config: PathBuf,
        /// Where to write the JSON report.
        json: Option<PathBuf>,
    },
    /// Benchmark building the global transition DAG from 32 to 16,384 ranks.
    BenchTransitionPlanning {
        /// The job whose plans change.
        config: PathBuf,
        /// Pool sizes.
        ranks: Vec<u32>,
        /// Repetitions per size.
        reps: usize,
        /// Where to write the JSON report.
        json: Option<PathBuf>,
    },
    /// Forward/backward/decode throughput of the CPU engine against the GEMM crate.
    BenchEngine {
        /// Measured repetitions (the median is reported).
        reps: usize,
        /// Where to write the JSON report.
        json: Option<PathBuf>,
    },
    /// The cost model calibrated on this machine, predicting held-out plans of the tiny job.
    BenchCalibration {
        /// Cluster file measured at start (`configs/clusters/local-detect.toml`).
        cluster: PathBuf,
        /// Steps per plan (the first is a warm-up).
        steps: u32,
        /// Where the plans' runs go (replaced).
        out_dir: PathBuf,
        /// Where to write the JSON report.
        json: Option<PathBuf>,
    },
    /// The paper's three overlap types, Nereus vs the per-component baseline.
    BenchCoordination {
        /// Trials per overlap type.
        trials: u32,
        /// Seed of the placements and delays.
        seed: u64,
        /// Where to write the JSON report.
        json: Option<PathBuf>,
    },
    /// Random plan pairs executed as global transition DAGs, state checked.
    SelftestTransitions {
        /// Random cases.
        cases: u32,
        /// Seed of the decisions.
        seed: u64,
        /// Device-resident state over the GPU data plane (`--device`), or host memory over MPI.
        device: Option<DeviceChoice>,
    },
    /// A fixed-plan RL job on the reference engine.
    Train {
        /// The job file; `None` for the embedded default.
        config: Option<PathBuf>,
        /// CLI overrides.
        overrides: Overrides,
        /// Where to resume from, and what a resume may change.
        options: train::TrainOptions,
    },
    /// Every (tp, pp, dp) layout of a tiny model trains one step; parity with (1, 1, 1).
    SelftestEngine,
    /// Per-token log-probabilities (or values) of token sequences under a model directory.
    Logprobs(logprobs::LogprobsOptions),
    /// Random EMU primitive sequences with state checks after every step.
    SelftestPrimitives {
        /// Random cases.
        cases: u32,
        /// Seed of the decisions.
        seed: u64,
        /// Device-resident state over the GPU data plane (`--device`), or host memory over MPI.
        device: Option<DeviceChoice>,
    },
}

/// Why a command failed.
#[derive(Debug, Error)]
pub enum RuntimeError {
    /// The job config is broken on this rank.
    #[error("{0}")]
    Config(#[from] ConfigError),
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
    Transition(#[from] crate::transition::TransitionError),
    /// No plan fits.
    #[error("{0}")]
    Planner(#[from] crate::planner::PlannerError),
    /// A command was used wrongly (e.g. too few ranks).
    #[error("{0}")]
    Usage(String),
    /// An EMU primitive failed.
    #[error("{0}")]
    Emu(#[from] crate::emu::EmuError),
    /// The engine failed (out of memory, shapes, communication).
    #[error("{0}")]
    Engine(#[from] crate::engine::EngineError),
    /// A self-test found state that was lost or changed.
    #[error("selftest failed: {0}")]
    SelftestFailed(String),
    /// A file or directory could not be read or written.
    #[error("cannot {action} `{}`: {source}", path.display())]
    Io {
        /// What was attempted: `read`, `write`, `create directory`, …
        action: &'static str,
        /// The file or directory.
        path: PathBuf,
        /// The operating system's error.
        source: std::io::Error,
    },
    /// Printing to standard output failed.
    #[error("cannot write to standard output: {0}")]
    Stdout(std::io::Error),
    /// A checkpoint was refused (damaged, or not this job's) or could not be written.
    #[error("{0}")]
    Checkpoint(#[from] checkpoint::CheckpointError),
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
    /// the job: the batch scripts requeue it).
    #[error("{signal} received: stopped after step {step} with a checkpoint in `{}`; continue with `--resume latest`", checkpoint.display())]
    Preempted {
        /// The signal's name.
        signal: &'static str,
        /// Steps completed.
        step: u64,
        /// The checkpoint written.
        checkpoint: PathBuf,
    },
    /// The controller found no plan for the next steps; every rank checkpointed and stops.
    #[error("the controller stopped the job after step {step}: {reason} (checkpoint {})", checkpoint.display())]
    ControllerStop {
        /// The last step completed (0-based).
        step: u64,
        /// Why, with the plan that would fit and how to continue.
        reason: String,
        /// The checkpoint written.
        checkpoint: PathBuf,
    },
}

/// The error-mapping closure for a failed file operation on `path`.
pub(crate) fn io_error(action: &'static str, path: &std::path::Path) -> impl FnOnce(std::io::Error) -> RuntimeError {
    let path = path.to_path_buf();
    move |source| RuntimeError::Io { action, path, source }
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
            _ => EXIT_FAILURE,
        }
    }

    /// Whether every rank holds this error at the same point of the program (an agreement, or
    /// a verdict every rank computes from the same replicated values), so rank 0 alone reports
    /// it and nobody needs to abort the others.
    fn reported_by_root(&self) -> bool {
        matches!(
            self,
            RuntimeError::Comm(CommError::Disagreement { .. })
                | RuntimeError::Phase(_)
                | RuntimeError::Diverged { .. }
                | RuntimeError::Engine(crate::engine::EngineError::Diverged { .. })
                | RuntimeError::Preempted { .. }
                | RuntimeError::ControllerStop { .. }
        )
    }
}

/// Starts the SPMD session, runs `command` on every rank, reports errors, and returns the exit
/// status. MPI is finalized before this returns.
pub fn run(options: SessionOptions, command: Command) -> u8 {
    let mut session = match Session::start(options) {
        Ok(session) => session,
        Err(e) => {
            eprintln!("nereus: error: {e}");
            return e.exit_code();
        }
    };
    let outcome = match &command {
        Command::InspectConfig { config, overrides } => inspect::config(&mut session, config.as_deref(), overrides),
        Command::InspectTopology { json } => inspect::topology(&session, *json),
        Command::Plan { config, overrides, request } => plan::run(&mut session, config.as_deref(), overrides, request),
        Command::BenchPrimitives { sizes_mib, reps, json, device } => {
            bench::primitives::run(&session, sizes_mib, *reps, json.as_deref(), *device)
        }
        Command::Simulate { config, overrides, request } => {
            simulate::run(&mut session, config.as_deref(), overrides, request)
        }
        Command::TraceSynth { spec, out } => simulate::synth(&session, spec, out),
        Command::BenchSimulate { config, trace, json } => {
            bench::simulate::run(&mut session, config, trace, json.as_deref())
        }
        Command::BenchSolver { config, reps, time_limit_s, json } => {
            bench::solver::run(&mut session, config, *reps, *time_limit_s, json.as_deref())
        }
        Command::BenchScaling(options) => bench::scaling::run(&session, options),
        Command::BenchScalingRestore { dir } => bench::scaling::restore(&session, dir),
        Command::BenchPlanner { config, seq_len, reps, json } => {
            bench::planner::run(&mut session, config, *seq_len, *reps, json.as_deref())
        }
        Command::BenchController { config, json } => bench::controller::run(&mut session, config, json.as_deref()),
        Command::BenchTransitionPlanning { config, ranks, reps, json } => {
            bench::transition::run(&mut session, config, ranks, *reps, json.as_deref())
        }
        Command::BenchEngine { reps, json } => bench::engine::run(&session, *reps, json.as_deref()),
        Command::BenchCalibration { cluster, steps, out_dir, json } => {
            bench::calibration::run(&mut session, cluster, *steps, out_dir, json.as_deref())
        }
        Command::BenchCoordination { trials, seed, json } => {
            bench::coordination::run(&session, *trials, *seed, json.as_deref())
        }
        Command::SelftestPrimitives { cases, seed, device } => selftest::primitives(&session, *cases, *seed, *device)
            .and_then(|s| report_selftest(&session, &s, &s.failures)),
        Command::Train { config, overrides, options } => {
            train::run(&mut session, config.as_deref(), overrides, options)
        }
        Command::SelftestEngine => selftest::engine(&session).and_then(|s| report_selftest(&session, &s, &s.failures)),
        Command::Logprobs(options) => logprobs::run(&session, options),
        Command::SelftestTransitions { cases, seed, device } => selftest::transitions(&session, *cases, *seed, *device)
            .and_then(|s| report_selftest(&session, &s, &s.failures)),
    };
    match outcome {
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
fn report_selftest<S: serde::Serialize>(
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
