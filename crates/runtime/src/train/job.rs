//! The live job: everything a running `nereus train` holds between steps, and its steps.

use nereus_core::config::{JobConfig, OnNonFinite, PolicyMode, RlMode};
use nereus_core::plan::Plan;
use nereus_core::planner::Planner;
use nereus_core::policy::controller::{Controller, ControllerState};
use nereus_core::record::Event;
use nereus_exec::comm::max_over_ranks;
use nereus_exec::emu::{EmuSet, Exchange, HostMemory, ShardMemory};
use nereus_exec::engine::{EngineError, EngineMemory};
use nereus_exec::rl::{Ahead, RlJob, StepMetrics, StepSettings, Task, TextTask};

use super::console;
use super::fault::{rank_fault, RankFault};
use super::gather::{held_bytes, slowest_op_seconds};
use super::metrics::MetricsLog;
use super::outcome::{InForce, Predicted};
use super::pool::{PoolSignal, PoolSource};
use super::signals::{self, StopSignals};
use super::sources::{create_state, from_checkpoint, initial_sources};
use super::start::{
    agreed_pool, continued, fits_devices, job_checks, mark_resume, pool_source, resume_directory, rl_job,
};
use super::tensorboard::EventWriter;
use super::timeline::Timeline;
use super::TrainOptions;
use crate::checkpoint::{Checkpoints, PendingCheckpoint};
use crate::{RuntimeError, Session};

/// Consecutive steps with skipped updates after which `on_nonfinite = "skip-step"` gives up.
const MAX_SKIPPING_STEPS: u32 = 3;

/// A running `nereus train` on one rank: the plane, the EMUs, the RL job over them, the plan
/// and pool in force, the ranks lost, the controller (rank 0's), and the run's records.
///
/// The same job runs on the host reference engine (`P` an MPI plane, shards in [`HostMemory`])
/// and on a device (`P` the GPU plane, shards in device memory, which the device engine computes
/// on: [`EngineMemory`]): every method below is written once for both.
pub struct TrainJob<'s, P, M: ShardMemory = HostMemory> {
    pub(super) session: &'s Session,
    pub(super) config: &'s JobConfig,
    pub(super) options: &'s TrainOptions,
    pub(super) plane: &'s mut P,
    pub(super) set: EmuSet<M>,
    pub(super) rl: RlJob,
    pub(super) settings: StepSettings,
    pub(super) plan: Plan,
    pub(super) predicted: Predicted,
    /// Ranks in the pool: the first this many ranks of the world that are not lost.
    pub(super) pool: u32,
    pub(super) pools: PoolSource,
    pub(super) lost: Vec<u32>,
    pub(super) fault: Option<RankFault>,
    /// Whether the ranks the job uses can change (or did): once true, every later step line
    /// records its pool, even after the pool file is removed.
    pub(super) elastic: bool,
    pub(super) controller: Option<Controller>,
    pub(super) checkpoints: Checkpoints,
    pub(super) metrics: MetricsLog,
    /// Rank 0's TensorBoard event file.
    pub(super) tensorboard: Option<EventWriter>,
    pub(super) timeline: Timeline,
    first_step: u64,
    /// When the run started, and when it took its first step (the step line's elapsed time
    /// and ETA).
    pub(super) started: std::time::Instant,
    pub(super) stepping_since: Option<std::time::Instant>,
    /// The checkpoints this run continues from, oldest first (recorded in its checkpoints).
    pub(super) resumed_from: Vec<String>,
    skipping: u32,
    /// Asynchronous mode: the rollouts sampled during the last step for the next (never
    /// checkpointed: a resumed run samples its first step's again, docs/engine.md).
    ahead: Option<Ahead>,
    /// The checkpoint rank 0 is writing in the background, if any.
    pub(super) pending_checkpoint: Option<PendingCheckpoint>,
    signals: &'static StopSignals,
    _pool_signal: Option<PoolSignal>,
}

impl<'s, P, M> TrainJob<'s, P, M>
where
    P: Exchange<M>,
    M: EngineMemory + Clone,
{
    /// Checks the job, prepares the output directory, finds the resume point, plans, and
    /// creates the plan's EMUs (in `memory`, computed by its engine) from the model directories,
    /// warm-ups or the checkpoint.
    pub fn start(
        session: &'s Session,
        config: &'s JobConfig,
        options: &'s TrainOptions,
        plane: &'s mut P,
        memory: M,
    ) -> Result<Self, RuntimeError> {
        let started = std::time::Instant::now();
        let world = session.world().size();
        let out = config.job.output_dir.clone();
        let checkpoints = Checkpoints::of(&out);
        let metrics = MetricsLog::of(&out);
        let resume_dir = resume_directory(session, &out, &checkpoints, &metrics, options.resume.as_ref())?;
        let pools = session.agree("pool", pool_source(config, options, world as u32))?;
        let first_step = resume_dir.as_deref().map_or(0, checkpoint_step);
        let pool = agreed_pool(session, &pools, first_step)?;
        let fresh = session.agree("job checks", job_checks(config, pool as i32))?;
        // Before warm-ups or any shard: the plan a fresh start takes must fit this device (a
        // resumed plan is checked again below).
        session.agree("device memory", fits_devices(session.rank(), &fresh.1, &fresh.0, &memory))?;
        let signals = signals::install()?;
        // SIGHUP re-reads the pool file at once (rank 0 says what the next boundary will do).
        let follows_pool = config.policy.mode != PolicyMode::Off;
        let pool_signal = (follows_pool && session.rank() == 0).then(|| PoolSignal::install(&pools)).transpose()?;
        let task = session.agree("data", job_task(config))?;
        if let (0, Task::Text(text)) = (session.rank(), &task) {
            log::info!("{}", loaded_prompts(text));
        }
        let mut settings = StepSettings::new(config, task);
        settings.sampling.max_new_tokens = fresh.2 as usize;
        let mut sources = match &resume_dir {
            Some(dir) => from_checkpoint(session, dir, config, options)?,
            None => initial_sources(session, plane, config, &settings, &out.join("warmup"))?,
        };
        let base = fresh.1.clone();
        let ((plan, planner, cap), state) = continued(config, pool, fresh, sources.saved_control.take())?;
        settings.sampling.max_new_tokens = cap as usize;
        let predicted = Predicted::of(&planner, &plan);
        let controller = (session.rank() == 0).then(|| controller(config, base, cap, state, &plan)).flatten();
        session.agree("device memory", fits_devices(session.rank(), &planner, &plan, &memory))?;
        let set = create_state(plane, config, &plan, &sources, world, &memory)?;
        let rl = rl_job(session, plane, &set, (&plan, &settings), &planner)?;
        if session.rank() == 0 {
            console::print_plan(&plan);
        }
        mark_resume(session, &metrics, &checkpoints, resume_dir.as_deref(), sources.start_step)?;
        let fault =
            session.agree("faults", rank_fault(config, (options.fail_rank, options.fail_at_step), world as u32))?;
        let events = (session.rank() == 0).then(|| EventWriter::create(&out.join("tensorboard"))).transpose();
        let tensorboard = session.agree("tensorboard", events)?;
        Ok(TrainJob {
            session,
            config,
            options,
            plane,
            set,
            rl,
            settings,
            plan,
            predicted,
            pool,
            pools,
            lost: Vec::new(),
            // The pool's part is agreed at the first step (`in_force`).
            elastic: fault.is_some(),
            fault,
            controller,
            checkpoints,
            metrics,
            tensorboard,
            timeline: Timeline::default(),
            first_step: sources.start_step,
            started,
            stepping_since: None,
            resumed_from: sources.resumed_from,
            skipping: 0,
            ahead: None,
            pending_checkpoint: None,
            signals,
            _pool_signal: pool_signal,
        })
    }

    /// The first step this run takes (0, or the step of the checkpoint it resumed from).
    pub fn first_step(&self) -> u64 {
        self.first_step
    }

    /// Runs RL step `step` on every rank.
    pub fn step(&mut self, step: u64) -> Result<StepMetrics, RuntimeError> {
        self.stepping_since.get_or_insert_with(std::time::Instant::now);
        let (plane, set) = (&mut *self.plane, &mut self.set);
        match self.config.rl.mode {
            RlMode::Sync => Ok(self.rl.step(plane, set, step)?),
            RlMode::Async => Ok(self.rl.step_async(plane, set, step, &mut self.ahead)?),
        }
    }

    /// What is in force at the end of step `m`, before its boundary moves anything.
    pub fn in_force(&mut self, m: &StepMetrics) -> Result<InForce, RuntimeError> {
        // Ledgers at the end of the step (recorded when the pool can change). A pool file that
        // appears makes the job elastic from then on; one that goes away does not undo it.
        // Ranks may see the shared file at different moments, and the gather below needs
        // every rank or none: they agree (an all-reduce of the flag).
        if !self.elastic {
            let (world, watchdog) = (self.session.world(), self.session.watchdog());
            self.elastic = max_over_ranks(world, watchdog, "pool check", u64::from(self.pools.is_elastic())) > 0;
        }
        let held = if self.elastic { held_bytes(&mut *self.plane, &self.set)? } else { Vec::new() };
        let slowest_ops = slowest_op_seconds(&mut *self.plane, self.set.world_size(), &m.op_seconds)?;
        Ok(InForce {
            plan: self.plan.clone(),
            predicted: self.predicted.clone(),
            pool: self.pool,
            lost: self.lost.clone(),
            held,
            slowest_ops,
        })
    }

    /// Stops on a non-finite update (`on_nonfinite = "stop"`), or counts steps with skipped
    /// updates and stops after [`MAX_SKIPPING_STEPS`] in a row. Every rank holds the same
    /// metrics, so every rank decides alike.
    pub fn check_finite(&mut self, step: u64, m: &StepMetrics) -> Result<(), RuntimeError> {
        let Some(nf) = m.non_finite else {
            self.skipping = 0;
            return Ok(());
        };
        let diverged = RuntimeError::Diverged {
            step,
            model_stage: nf.model_stage.to_string(),
            quantity: nf.quantity,
            value: nf.value,
        };
        match self.config.train.on_nonfinite {
            OnNonFinite::Stop => Err(diverged),
            OnNonFinite::SkipStep if self.skipping + 1 >= MAX_SKIPPING_STEPS => Err(diverged),
            OnNonFinite::SkipStep => {
                log::warn!(
                    "step {step}: {} update(s) skipped ({} of {} is {})",
                    m.stats.skipped_updates,
                    nf.quantity,
                    nf.model_stage,
                    nf.value
                );
                self.skipping += 1;
                Ok(())
            }
        }
    }

    /// After `done` steps: a checkpoint when one is due (every `train.checkpoint_every`, the
    /// last step, a stop signal on any rank); a signal then stops the job (exit 75). One due
    /// only by `checkpoint_every` before the last step is written in the background when
    /// `train.checkpoint_async` says so; the others are on disk when this returns.
    pub fn checkpoint_if_due(&mut self, done: u64) -> Result<(), RuntimeError> {
        let received = self.signals.received().map_or(0, signals::number);
        let signal =
            signals::name(
                max_over_ranks(self.session.world(), self.session.watchdog(), "stop-signal check", received) as i32
            );
        let every = u64::from(self.config.train.checkpoint_every);
        let last = done == u64::from(self.config.job.steps) && self.config.train.checkpoint_at_end;
        if signal.is_none() && !last && !(every > 0 && done.is_multiple_of(every)) {
            return Ok(());
        }
        let end = done == u64::from(self.config.job.steps);
        if signal.is_none() && !end && self.config.train.checkpoint_async {
            return self.checkpoint_in_background(done);
        }
        let dir = self.checkpoint(done)?;
        if self.session.rank() == 0 {
            log::info!("checkpoint of step {done} written to {}", dir.display());
        }
        match signal {
            Some(signal) => Err(RuntimeError::Preempted { signal, last_step: done - 1, checkpoint: dir }),
            None => Ok(()),
        }
    }

    /// Evaluates on the held-out prompts when due after `done` RL steps (before the first, every
    /// `data.eval_every`, after the last); rank 0 prints and records the result.
    pub fn evaluate_if_due(&mut self, done: u64) -> Result<(), RuntimeError> {
        let Some(data) = &self.config.data else { return Ok(()) };
        let every = u64::from(data.eval_every);
        let last = done == u64::from(self.config.job.steps);
        if !(done == 0 || last || (every > 0 && done.is_multiple_of(every))) {
            return Ok(());
        }
        let evaluated = self.rl.evaluate(&mut *self.plane, &mut self.set, data.eval_count as usize, done);
        let e = match evaluated {
            // A scorer that fails on the held-out prompts stops the job as a step's would.
            Err(EngineError::Reward { what, .. }) => {
                return Err(self.stop_for_reward(done, format!("evaluating the held-out prompts: {what}")))
            }
            Ok(None) => return Ok(()),
            other => other?.expect("None returned above"),
        };
        let root = self.session.rank() == 0;
        if root {
            console::print_eval(done, &e);
        }
        let record = Event::Eval { step: done, result: e.clone() };
        let written = match (root, self.tensorboard.as_mut()) {
            (true, Some(events)) => self.metrics.append(&record).and_then(|()| events.record(done, "eval", &e)),
            (true, None) => self.metrics.append(&record),
            (false, _) => Ok(()),
        };
        self.session.agree("metrics", written)
    }

    /// After a failed reward at step `step` (nothing of it applied), or in the evaluation after
    /// `step` steps: checkpoints the `step` completed steps and returns the error that stops
    /// the job.
    pub fn stop_for_reward(&mut self, step: u64, what: String) -> RuntimeError {
        match self.checkpoint(step) {
            Ok(checkpoint) => RuntimeError::RewardFailed { step, what, checkpoint },
            Err(e) => e,
        }
    }

    /// The end of the run: rank 0 prints the summary and writes the timeline.
    pub fn finish(&self) {
        if self.session.rank() != 0 || self.config.policy.mode == PolicyMode::Off {
            return;
        }
        let out = &self.config.job.output_dir;
        println!("{}", self.timeline.summary());
        match self.timeline.write(out, "timeline") {
            Ok(()) => log::info!("timeline written to {}", out.join("timeline.{svg,png}").display()),
            Err(e) => log::warn!("could not write the timeline to {}: {e}", out.display()),
        }
    }
}

/// Rank 0's controller (none with `policy.mode = "off"`), from the checkpoint's state when the
/// run resumed with one.
fn controller(
    config: &JobConfig,
    base: Planner,
    cap: u32,
    state: Option<ControllerState>,
    plan: &Plan,
) -> Option<Controller> {
    if config.policy.mode == PolicyMode::Off {
        return None;
    }
    let mut c = Controller::new(config, base, cap);
    if let Some(state) = state {
        log::info!("the controller continues from the checkpoint's state: plan {plan}, response cap {cap}");
        c.restore(state);
    }
    Some(c)
}

/// The job's task: the text task its `[data]` section describes (prompts read, rendered and
/// tokenized on every rank, which then agree), or the arithmetic task.
fn job_task(config: &JobConfig) -> Result<Task, RuntimeError> {
    if config.data.is_none() {
        return Ok(StepSettings::arithmetic_task(config));
    }
    let task = TextTask::load(config).map_err(RuntimeError::Usage)?;
    Ok(Task::Text(std::sync::Arc::new(task)))
}

/// What a text task loaded, for the log: its prompts, those left out, and the stop ids.
fn loaded_prompts(task: &TextTask) -> String {
    let dropped = task.train.dropped();
    let left_out = match dropped.len() {
        0 => String::new(),
        n => format!(" ({n} longer than rl.prompt_len = {} left out, first at line {})", task.prompt_len, dropped[0]),
    };
    let (count, path, eos) = (task.train.len(), task.train.path.display(), &task.text.special().eos_ids);
    format!("{count} training prompts from {path}{left_out}; responses stop at ids {eos:?}")
}

/// The step a checkpoint directory `step-N` continues from.
fn checkpoint_step(dir: &std::path::Path) -> u64 {
    dir.file_name()
        .and_then(|n| n.to_str())
        .and_then(|n| n.strip_prefix("step-"))
        .and_then(|n| n.parse().ok())
        .unwrap_or(0)
}
