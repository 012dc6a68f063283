//! The simulation loop: a job's controller driven by a trace on a simulated machine
//! ([`Truth`]). Each step runs the current plan at the trace's lengths (jittered, cut at the
//! response cap as the engine cuts them) at the machine's speeds; the step's record — seconds
//! per phase and per operation class, as the live engine's timers give them — goes to
//! [`Controller::decide`] (the live runtime's decision and calibration, unchanged) with the
//! next step's pool; an admitted target takes the machine's transition time, which the
//! controller is told as the live job tells it; a stop (nothing reachable fits) costs a
//! checkpoint and a restart ([`RestartModel`]) into the plan `nereus train --resume` would
//! start with on the new pool.

use serde::Serialize;

use super::trace::Point;
use super::truth::Truth;
use super::SimError;
use crate::config::{JobConfig, PolicyMode};
use crate::cost::Efficiencies;
use crate::model::{Layout, Position};
use crate::plan::{Plan, Stage};
use crate::planner::{initial_plan, Planner};
use crate::policy::controller::{Action, Controller, StepRecord};
use crate::policy::{Decision, TransitionKind};
use crate::transition::target::state_bytes;

/// A running job as the controller sees it: its plan and its controller state.
pub struct Job {
    /// The plan the next step runs under.
    pub plan: Plan,
    /// The live runtime's controller.
    pub controller: Controller,
    /// The planner the job started with (its pool and the calibration the controller began with).
    pub base: Planner,
}

impl Job {
    /// The job as `nereus train` starts it on `gpus` ranks ([`initial_plan`]), its controller
    /// knowing `efficiencies` (`None`: the cost model's defaults, as a live job starts).
    pub fn start(config: &JobConfig, gpus: u32, efficiencies: Option<Efficiencies>) -> Result<Job, SimError> {
        let (plan, planner, cap) = initial_plan(config, gpus)?;
        let base = match efficiencies {
            Some(e) => planner.replanned(gpus, planner.response_len(), e)?,
            None => planner,
        };
        let controller = Controller::new(config, base.clone(), cap);
        Ok(Job { plan, controller, base })
    }

    /// One step boundary, exactly as the live runtime's: the controller decides on `record`
    /// under the current plan, and an admitted target becomes the plan.
    pub fn boundary(&mut self, record: &StepRecord) -> Result<Action, SimError> {
        let action = self.controller.decide(record, &self.plan)?;
        if let Some(target) = &action.target {
            self.plan = target.clone();
        }
        Ok(action)
    }
}

/// The live controller's decisions on recorded steps: the job started on `gpus` ranks, every
/// record decided in order, admitted targets taken. Per record: the plan the step ran under and
/// the action (ends early at a stop, as the live job does).
pub fn replay(config: &JobConfig, gpus: u32, records: &[StepRecord]) -> Result<Vec<(Plan, Action)>, SimError> {
    let mut job = Job::start(config, gpus, None)?;
    let mut out = Vec::new();
    for record in records {
        let plan = job.plan.clone();
        let action = job.boundary(record)?;
        if let Some(t) = record.transition {
            job.controller.transitioned(t.predicted_seconds, t.seconds);
        }
        let stop = action.stop.is_some();
        out.push((plan, action));
        if stop {
            break;
        }
    }
    Ok(out)
}

/// What a stop costs: the job checkpoints, is restarted by the operator (or the batch
/// system's requeue) on the pool it now has, and loads the checkpoint.
///
/// `seconds = restart_s + (save_bytes + load_bytes) / fs_bytes_per_s`, where `save_bytes` is the
/// state of one replica of every trained model-stage (parameters and optimizer state, as the
/// cost model counts them) and `load_bytes` that plus one replica of every other model.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct RestartModel {
    /// Parallel file system bandwidth the job's checkpoint I/O gets, bytes/s.
    pub fs_bytes_per_s: f64,
    /// Fixed cost of a restart: requeue, launch, communicators, warm-up, seconds.
    pub restart_s: f64,
}

impl Default for RestartModel {
    /// 10 GB/s of file system bandwidth and 300 s of restart (a requeued job on a busy
    /// machine: minutes of queue and launch are typical).
    fn default() -> Self {
        RestartModel { fs_bytes_per_s: 10e9, restart_s: 300.0 }
    }
}

impl RestartModel {
    /// The seconds one checkpoint/restart of the job `planner` plans costs.
    pub fn seconds(&self, planner: &Planner) -> f64 {
        let bytes = state_bytes(planner);
        let one = |ms| bytes(ms, Layout::new(1, 1), Position { tp: 0, pp: 0 }) as f64;
        let save: f64 = planner.model_stages().iter().filter(|m| m.stage == Stage::Training).map(|&m| one(m)).sum();
        let frozen: f64 = planner
            .model_stages()
            .iter()
            .filter(|m| {
                m.stage == Stage::Inference
                    && !planner.model_stages().iter().any(|t| t.role == m.role && t.stage == Stage::Training)
            })
            .map(|&m| one(m))
            .sum();
        self.restart_s + (2.0 * save + frozen) / self.fs_bytes_per_s
    }
}

/// One policy to simulate.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct PolicyRun {
    /// `policy.mode` (not `off`).
    pub mode: PolicyMode,
    /// `policy.gamma`.
    pub gamma: f64,
}

/// How a simulation charges what the trace does not say.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct SimOptions {
    /// The efficiencies of the ground truth (and of the controller from the start); `None`: the
    /// cost model's defaults.
    pub efficiencies: Option<Efficiencies>,
    /// What a stop costs.
    pub restart: RestartModel,
    /// The simulated machine.
    pub truth: Truth,
}

/// One simulated step (a line of `--jsonl`).
#[derive(Debug, Clone, Serialize)]
pub struct SimStep {
    /// `nereus`, `static`, `greedy` or `every-k`.
    pub policy: PolicyMode,
    /// γ.
    pub gamma: f64,
    /// The machine's seed.
    pub seed: u64,
    /// The trace's step.
    pub step: u64,
    /// The trace's mean response length.
    pub seq_len_mean: f64,
    /// The trace's p95 response length.
    pub seq_len_p95: f64,
    /// GPUs available during the step.
    pub gpus: u32,
    /// The response cap the plan is sized for.
    pub cap: u32,
    /// Step seconds on the simulated machine ([`Truth::step`] at the trace's lengths, jittered
    /// and cut at the cap); 0 when the step could not run.
    pub step_s: f64,
    /// What the controller's calibrated cost model predicted for the step (0 when it could not
    /// run).
    pub predicted_step_s: f64,
    /// The plan, `role/stage tp×pp×dp, …` (empty when none runs).
    pub plan: String,
    /// The controller's decision record (as in the live JSON lines).
    pub decision: Option<Decision>,
    /// The transition after the step, if any.
    pub transition: Option<SimTransition>,
    /// Checkpoint/restart seconds charged after the step.
    pub restart_s: f64,
    /// Whether no plan could run this step (the pool fits none): the job waits.
    pub infeasible: bool,
}

/// A simulated transition: the seconds the machine took ([`Truth::transition_seconds`])
/// beside the calibrated `L̂_tran` the admission weighed.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct SimTransition {
    /// How it was admitted.
    pub kind: TransitionKind,
    /// Its seconds on the simulated machine.
    pub seconds: f64,
    /// `L̂_tran` as the controller predicted it.
    pub predicted_seconds: f64,
}

/// One policy's run over a trace (an element of `runs` in `--json`).
#[derive(Debug, Clone, Serialize)]
pub struct RunSummary {
    /// The policy.
    pub policy: PolicyMode,
    /// γ.
    pub gamma: f64,
    /// The machine's seed ([`Truth::seed`]).
    pub seed: u64,
    /// Steps of the trace.
    pub steps: u64,
    /// Seconds per step of the run: step, transition and restart seconds over the steps that
    /// ran (what a user waits per step, transitions amortized).
    pub mean_step_s: f64,
    /// Mean seconds of the steps alone (transitions and restarts left out).
    pub mean_compute_step_s: f64,
    /// Step, transition and restart seconds together.
    pub total_s: f64,
    /// Transitions taken.
    pub transitions: u64,
    /// Of them urgent.
    pub urgent: u64,
    /// Of them opportunistic.
    pub opportunistic: u64,
    /// Seconds of transitions.
    pub transition_s: f64,
    /// `transition_s / total_s`.
    pub transition_share: f64,
    /// Steps that could not run on their plan: a stop (checkpoint/restart charged) or a pool
    /// no plan fits (the job waits).
    pub infeasible_steps: u64,
    /// Checkpoint/restarts charged.
    pub restarts: u64,
    /// Their seconds.
    pub restart_s: f64,
    /// Wall seconds the simulation itself took (not part of the simulated time).
    pub wall_s: f64,
}

/// Simulates `run` over `points` (the trace) for `config`'s job.
pub fn simulate(
    config: &JobConfig,
    points: &[Point],
    run: PolicyRun,
    options: &SimOptions,
) -> Result<(RunSummary, Vec<SimStep>), SimError> {
    let wall = std::time::Instant::now();
    let mut config = config.clone();
    config.policy.mode = run.mode;
    config.policy.gamma = run.gamma;
    // The job runs the trace's steps (the controller's trials are priced within them).
    config.job.steps = u32::try_from(points.len()).unwrap_or(u32::MAX);
    let start = points.first().ok_or(SimError::EmptyTrace)?;
    if config.policy.initial_response_len == 0 {
        // The job starts sized for the trace's first step (a live job would be told so by
        // policy.initial_response_len; without it, the plan is made for rl.max_response_len).
        config.policy.initial_response_len = (start.seq_len_p95.ceil() as u32).clamp(1, config.rl.max_response_len);
    }
    let mut sim = Sim { config, run, options, job: None, transitions: 0 };
    let mut steps = Vec::with_capacity(points.len());
    for (i, p) in points.iter().enumerate() {
        let next_pool = points.get(i + 1).map_or(p.gpus, |n| n.gpus);
        steps.push(sim.step(p, next_pool)?);
    }
    let mut summary = summarize(run, &steps);
    summary.wall_s = wall.elapsed().as_secs_f64();
    Ok((summary, steps))
}

/// One policy's simulation in progress.
struct Sim<'o> {
    /// The job's config, with the policy's mode and γ (and, after a stop, the length reached).
    config: JobConfig,
    run: PolicyRun,
    options: &'o SimOptions,
    /// The running job; `None` after a stop or while no plan fits the pool.
    job: Option<Job>,
    /// Transitions made so far (each draws its own time).
    transitions: u64,
}

impl Sim<'_> {
    /// Step `p` on the current plan, then the boundary with `next_pool` announced.
    fn step(&mut self, p: &Point, next_pool: u32) -> Result<SimStep, SimError> {
        if self.job.is_none() {
            // The start, or the restart after a stop (charged at the stop) or a wait, on this
            // step's pool.
            self.job = Job::start(&self.config, p.gpus, self.options.efficiencies).ok();
        }
        let start_efficiencies = self.options.efficiencies.unwrap_or_default();
        let Some(running) = self.job.as_mut() else {
            return Ok(waiting(self.run, self.options.truth.seed, p));
        };
        let truth = &self.options.truth;
        let cap = running.controller.cap();
        let (record, predicted_step_s) = measured_step(running, truth, p, next_pool, start_efficiencies)?;
        let plan = running.plan.to_string();
        let action = running.boundary(&record)?;
        let transition = action.target.as_ref().map(|_| {
            self.transitions += 1;
            transition_taken(&action, truth, self.transitions, &mut running.controller)
        });
        let stopped = action.stop.is_some() || !fits(running, next_pool, start_efficiencies)?;
        let restart_s = if stopped { self.options.restart.seconds(&running.base) } else { 0.0 };
        if stopped {
            // The operator restarts the job (`nereus train --resume latest`) told the length it
            // needs: policy.initial_response_len = the cap the controller would size for it.
            let needed = running.controller.sized(record.response_len_p95).max(running.controller.cap());
            self.config.policy.initial_response_len = needed;
            self.job = None;
        }
        Ok(SimStep {
            policy: self.run.mode,
            gamma: self.run.gamma,
            seed: self.options.truth.seed,
            step: p.step,
            seq_len_mean: p.seq_len_mean,
            seq_len_p95: p.seq_len_p95,
            gpus: p.gpus,
            cap,
            step_s: record.step_seconds,
            predicted_step_s,
            plan,
            decision: action.decision,
            transition,
            restart_s,
            infeasible: stopped,
        })
    }
}

/// Step `p` as the machine ran it on `job`'s plan (the trace's lengths, jittered, cut at the
/// controller's cap as the engine cuts them, timed by the truth), with the pool announced for
/// the next step; and the controller's calibrated prediction of the same step.
fn measured_step(
    job: &Job,
    truth: &Truth,
    p: &Point,
    next_pool: u32,
    start_efficiencies: Efficiencies,
) -> Result<(StepRecord, f64), SimError> {
    let cap = f64::from(job.controller.cap());
    let lengths = truth.length_factor(p.step);
    let len = (p.seq_len_p95 * lengths).min(cap);
    let at_len = job.base.replanned(p.gpus, len.ceil() as u64, start_efficiencies)?;
    let measured = truth.step(&at_len, &start_efficiencies, &job.plan, p.step)?;
    let calibrated = at_len.replanned(p.gpus, at_len.response_len(), job.controller.efficiencies())?;
    let record = StepRecord {
        step: p.step,
        response_len_mean: (p.seq_len_mean * lengths).min(cap),
        response_len_p95: len,
        step_seconds: measured.seconds,
        stage_seconds: Some(measured.stages),
        op_seconds: Some(measured.ops),
        pool_size: Some(next_pool),
        lost_ranks: Vec::new(),
        transition: None,
    };
    Ok((record, calibrated.predict(&job.plan)))
}

/// The `nth` transition the controller took with `action`: the machine's seconds for it,
/// scattered by the truth around the DAG's critical path before the controller's transition
/// calibration (what the controller then learns from).
fn transition_taken(action: &Action, truth: &Truth, nth: u64, controller: &mut Controller) -> SimTransition {
    let decision = action.decision.as_ref();
    let admission = decision.and_then(|d| d.admission);
    let predicted = admission.and_then(|a| a.l_tran_s.map(|l| l / a.l_tran_calibration)).unwrap_or(0.0);
    let seconds = truth.transition_seconds(predicted, nth);
    controller.transitioned(predicted, seconds);
    SimTransition {
        kind: decision.and_then(|d| d.kind).unwrap_or(TransitionKind::Urgent),
        seconds,
        predicted_seconds: admission.and_then(|a| a.l_tran_s).unwrap_or(0.0),
    }
}

/// Whether the job's plan can run the next step: valid on the next pool, every rank within
/// memory at the controller's cap.
fn fits(job: &Job, pool: u32, efficiencies: Efficiencies) -> Result<bool, SimError> {
    if job.plan.validate(pool).is_err() {
        return Ok(false);
    }
    let at_cap = job.base.replanned(pool, u64::from(job.controller.cap()), efficiencies)?;
    Ok(at_cap.rank_peaks(&job.plan).max().0 <= at_cap.cost().hardware.usable_bytes())
}

/// A step no plan fits: the job waits.
fn waiting(run: PolicyRun, seed: u64, p: &Point) -> SimStep {
    SimStep {
        policy: run.mode,
        gamma: run.gamma,
        seed,
        step: p.step,
        seq_len_mean: p.seq_len_mean,
        seq_len_p95: p.seq_len_p95,
        gpus: p.gpus,
        cap: 0,
        step_s: 0.0,
        predicted_step_s: 0.0,
        plan: String::new(),
        decision: None,
        transition: None,
        restart_s: 0.0,
        infeasible: true,
    }
}

/// The run's totals.
pub fn summarize(run: PolicyRun, steps: &[SimStep]) -> RunSummary {
    let ran: Vec<f64> = steps.iter().filter(|s| s.step_s > 0.0).map(|s| s.step_s).collect();
    let kind = |k: TransitionKind| steps.iter().filter(|s| s.transition.is_some_and(|t| t.kind == k)).count() as u64;
    // (An empty float sum is -0.0; adding 0.0 makes it 0.)
    let transition_s = 0.0 + steps.iter().filter_map(|s| s.transition.map(|t| t.seconds)).sum::<f64>();
    let restart_s = 0.0 + steps.iter().map(|s| s.restart_s).sum::<f64>();
    let step_total = 0.0 + ran.iter().sum::<f64>();
    let total_s = step_total + transition_s + restart_s;
    let (urgent, opportunistic) = (kind(TransitionKind::Urgent), kind(TransitionKind::Opportunistic));
    RunSummary {
        policy: run.mode,
        gamma: run.gamma,
        seed: steps.first().map_or(0, |s| s.seed),
        steps: steps.len() as u64,
        mean_step_s: if ran.is_empty() { 0.0 } else { total_s / ran.len() as f64 },
        mean_compute_step_s: if ran.is_empty() { 0.0 } else { step_total / ran.len() as f64 },
        total_s,
        transitions: urgent + opportunistic,
        urgent,
        opportunistic,
        transition_s,
        transition_share: if total_s > 0.0 { transition_s / total_s } else { 0.0 },
        infeasible_steps: steps.iter().filter(|s| s.infeasible).count() as u64,
        restarts: steps.iter().filter(|s| s.restart_s > 0.0).count() as u64,
        restart_s,
        wall_s: 0.0,
    }
}
