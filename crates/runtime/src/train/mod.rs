//! `nereus train`: an RL job on the host reference engine or on a device, as a type
//! ([`TrainJob`], written once for both) and the short driver over it ([`run_config`]).
//!
//! Every rank checks the job and computes the same plan, rank 0 prepares the output directory,
//! every rank creates the plan's EMUs from the warm-up or a verified checkpoint, then steps;
//! at each step boundary the controller may reshape the job, rank 0 prints one line per step
//! and appends the same as a JSON object to `<output_dir>/metrics.jsonl`.
//!
//! Every phase that ranks run on their own ends with an agreement ([`Session::agree`]), so a
//! failure on some ranks stops all of them at once with one message; a failure inside a step
//! (an out-of-memory on some ranks) aborts the job from the failing rank.
//!
//! - [`job`]: the live job — its state and its methods for one step, the boundary, the record
//!   and checkpoints;
//! - `start`: start-up checks, the output directory and the resume point;
//! - `sources`: where every model's initial state comes from (directories, warm-ups,
//!   checkpoints) and the EMUs made from it;
//! - `boundary`: decisions, transitions, pool changes and rank loss;
//! - `outcome`: what a step leaves for its record (what was in force, what the boundary did);
//! - `gather`: measurements that need every rank;
//! - `record`: the step line, predictions beside measurements;
//! - `console`: what rank 0 prints;
//! - [`pool`], [`fault`], [`signals`], [`metrics`], [`tensorboard`], [`timeline`]: the machinery
//!   the job uses.

mod boundary;
mod console;
pub mod fault;
mod gather;
pub mod job;
pub mod metrics;
mod outcome;
pub mod pool;
mod record;
mod save;
pub mod signals;
mod sources;
mod start;
pub mod tensorboard;
pub mod timeline;

pub use job::TrainJob;

use std::path::Path;

use nereus_core::config::{JobConfig, Overrides, ResumeFrom};
use nereus_exec::emu::{Exchange, HostMemory};
use nereus_exec::engine::{EngineError, EngineMemory};

use crate::device::open_device;
use crate::{RuntimeError, Session};

/// How `nereus train` starts, beside its job file.
#[derive(Debug, Clone, Default)]
pub struct TrainOptions {
    /// Resume from a checkpoint (any layout): a `step-N` directory, `latest` (the newest
    /// complete checkpoint of the output directory), or `auto` (that, or a fresh start when
    /// there is none: for batch scripts that requeue).
    pub resume: Option<ResumeFrom>,
    /// Resume without the optimizer state: AdamW restarts from zero moments.
    pub reset_optimizer: bool,
    /// The ranks the job may use at the start: a count N or the index list of the first N
    /// ranks (`0-5`); `[pool] trace` and `<output_dir>/pool` take over when present.
    pub pool: Option<String>,
    /// Declare this rank lost without warning at the start of `--at-step` (its state is
    /// gone; the controller replans around it, a checkpoint restores what had no replica).
    pub fail_rank: Option<u32>,
    /// The step at whose start `--fail-rank` is lost.
    pub fail_at_step: Option<u64>,
}

/// Runs `nereus train` on every rank.
pub fn run(
    session: &mut Session,
    path: Option<&Path>,
    overrides: &Overrides,
    options: &TrainOptions,
) -> Result<(), RuntimeError> {
    let config = session.load_config(path, overrides)?;
    run_config(session, &config, options)
}

/// Trains the job `config` describes (already agreed by every rank) on the engine it names:
/// the host reference engine over MPI, or each rank's device over the GPU data plane.
pub fn run_config(session: &Session, config: &JobConfig, options: &TrainOptions) -> Result<(), RuntimeError> {
    // The job is planned for the engine it runs on (`EngineKind::of`): `cluster.device` (or
    // `--device`), else the data plane's device.
    let config = &config.as_trained();
    session.agree("engine checks", start::engine_checks(config))?;
    match config.cluster.device {
        None => {
            let mut plane = session.control_plane();
            train(TrainJob::start(session, config, options, &mut plane, HostMemory)?)
        }
        Some(choice) => {
            let (mut plane, memory) = open_device(session, choice)?;
            train(TrainJob::start(session, config, options, &mut plane, memory)?)
        }
    }
}

/// Steps the started `job` to the end: each step followed by its boundary, its record and,
/// when due, an evaluation and a checkpoint.
fn train<P, M>(mut job: TrainJob<'_, P, M>) -> Result<(), RuntimeError>
where
    P: Exchange<M>,
    M: EngineMemory + Clone,
{
    let steps = u64::from(job.config.job.steps);
    if job.first_step() == 0 {
        job.evaluate_if_due(0)?;
    }
    for step in job.first_step()..steps {
        let metrics = match job.step(step) {
            Err(RuntimeError::Engine(EngineError::Reward { step, what })) => {
                return Err(job.stop_for_reward(step, what))
            }
            other => other?,
        };
        let in_force = job.in_force(&metrics)?;
        let boundary = match job.boundary(step, &metrics, &in_force) {
            Ok(boundary) => boundary,
            Err(e) => return Err(job.record_before_failing(step, &metrics, &in_force, e)),
        };
        job.record(step, &metrics, &in_force, &boundary)?;
        if let Some(stop) = boundary.stop {
            return Err(stop.into_error());
        }
        job.check_finite(step, &metrics)?;
        job.evaluate_if_due(step + 1)?;
        job.checkpoint_if_due(step + 1)?;
    }
    // A run that ends without its own checkpoint (`checkpoint_at_end = false`) may still be
    // writing an earlier one.
    job.finish_checkpoint()?;
    job.finish();
    Ok(())
}
