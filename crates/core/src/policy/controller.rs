//! The controller's state and decision (paper §4), pure: after every step it is handed the
//! step's [`StepRecord`], feeds the monitor, replans when a trigger fires and admits or rejects
//! the target. The live runtime (`runtime::controller`, rank 0, broadcast to every rank), the
//! simulator and the benchmarks call this one code path.
//!
//! The response cap is the length the engine's buffers and the plan are sized for (the KV cache,
//! the training sequences): `rl.max_response_len` is the job's limit, the cap follows the
//! observed lengths within it. It grows by `δ_len` when the step's p95 reaches it (responses
//! were cut), and a replan sizes it to the observed p95 with `δ_len` of room. Growth that no
//! longer fits the current plan is a predicted memory violation: urgent.

use serde::{Deserialize, Serialize};

use super::memory::{same_shape, Carried, PlanMemory};
use super::trial::{self, Odds};
use super::{
    admit, Admission, Decision, Monitor, Observation, Proposal, Signal, Thresholds, TransitionKind, Trigger, Verdict,
};
use crate::config::{JobConfig, PolicyMode};
use crate::cost::{Efficiencies, OpSeconds, StageSample};
use crate::plan::{PerPhase, Plan};
#[cfg(test)]
use crate::planner::initial_plan;
use crate::planner::{Planner, PlannerError, StepSeconds};
use crate::transition::{cheaper_targets, choose, global::Links, toward, TargetChoice};
use crate::units::format_bytes;

/// Neighbours of the best plan whose trials are priced with their transitions (the rest only
/// by their expected improvement).
const TRIALS_PRICED: usize = 2;
/// Measured moves the prior `policy.plan_error` weighs as, in the model's error on plans (one
/// or two changes are not a spread).
const PRIOR_MOVES: usize = 3;

/// Cheaper targets tried after a rejection (each costs a DAG; the decision stays within
/// milliseconds at 1,024 GPUs).
const MAX_CHEAPER_TARGETS: usize = 2;

/// Steps after a move during which the plan it entered is compared with the plan it left
/// ([`Controller::remember`]): a window over which the entered plan's smoothed measurements
/// settle past one step's noise.
const REGRET_STEPS: u64 = 5;
/// Shapes the job ran, besides the plan in force's, that an urgent move weighs against the
/// planner's fastest when the plan in force did not run these lengths (the most recently run;
/// each costs a search on the pool now).
const KNOWN_SHAPES: usize = 8;

/// Transitions predicted shorter than this do not calibrate `L̂_tran` (agreement and digest
/// overheads, which the DAG's critical path leaves out, dominate them).
const MIN_CALIBRATING_TRANSITION_S: f64 = 0.01;

/// What the controller is shown after a step: the fields of the step's line it reads
/// ([`StepLine::observed`](crate::record::StepLine::observed) gives them from a recorded run,
/// so a `metrics.jsonl` replays through [`Controller::decide`] unchanged).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct StepRecord {
    /// The step just finished (0-based).
    pub step: u64,
    /// Mean response length (EOS included).
    pub response_len_mean: f64,
    /// 95th percentile of the response length.
    pub response_len_p95: f64,
    /// Measured wall seconds of the step.
    pub step_seconds: f64,
    /// Measured wall seconds per phase (`None` where nothing was measured).
    pub stage_seconds: Option<StepSeconds>,
    /// Measured seconds per phase and operation class, the slowest rank's (`None` where the
    /// engine did not time its operations).
    pub op_seconds: Option<PerPhase<OpSeconds>>,
    /// Ranks available from the next step on (`None`: unchanged): the first this many ranks
    /// of the world that are not lost.
    pub pool_size: Option<u32>,
    /// Ranks lost so far (sorted): their state is gone and they never rejoin.
    pub lost_ranks: Vec<u32>,
    /// The transition made at this step's boundary, as recorded (a replay feeds its measured
    /// seconds to [`Controller::transitioned`] as the live job did).
    pub transition: Option<TransitionSeconds>,
}

/// A transition's predicted and measured seconds (fields of the JSON lines' `transition`).
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct TransitionSeconds {
    /// The DAG's critical path, seconds.
    pub predicted_seconds: f64,
    /// Measured seconds (slowest rank).
    pub seconds: f64,
}

/// Ratio changes kept for the gain threshold, of moves and of steady steps each.
const TRUST_WINDOW: usize = 16;
/// Relative difference of two steps' mean and p95 response lengths under which their measured
/// over predicted ratios are compared.
const COMPARABLE_LENGTHS: f64 = 0.1;

/// A step's measured over predicted seconds and the lengths it ran.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
struct RatioAt {
    ratio: f64,
    mean_len: f64,
    p95_len: f64,
}

/// Stage samples kept for the running calibration (the last steps' stages).
const CALIBRATION_WINDOW: usize = 40;
/// Weight of the newest step in the smoothed measured-over-predicted ratio (one slow step on a
/// shared machine is noise, not drift).
const LATENCY_SMOOTHING: f64 = 0.3;

/// What every rank does at a step boundary (decided on rank 0, broadcast).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Action {
    /// The plan to move to, if a transition was admitted.
    pub target: Option<Plan>,
    /// The response cap from the next step on.
    pub cap: u32,
    /// Ranks in the pool from the next step on (the first `pool` ranks).
    pub pool: u32,
    /// The efficiencies the decision was made with (every rank plans the DAG with them).
    pub efficiencies: Efficiencies,
    /// The decision record for the JSON lines (`None` when no trigger fired).
    pub decision: Option<Decision>,
    /// Why the job must stop (after a checkpoint), when nothing fits.
    pub stop: Option<String>,
}

/// A plan better than the one in force that the controller knows of and has not taken (a
/// rejected or blocked target, or a fallback taken instead of the fastest): re-offered to
/// admission as a [`Trigger::StandingGap`] until it is taken or the plan in force is the best.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Gap {
    /// The step at whose boundary the gap was first seen.
    pub opened: u64,
    /// The first step at which it is offered again: when the standing horizon will cover the
    /// payback last priced, or, for a gain the model could not trust or a blocked move, after
    /// as many steps again as the gap has stood.
    pub due: u64,
}

/// Everything the controller learned while the job ran: checkpointed with the job (the
/// sidecar's `controller`), so a resumed run decides as the uninterrupted one would.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ControllerState {
    /// References and horizons of the drifting signals and the pool.
    monitor: Monitor,
    /// The running calibration.
    efficiencies: Efficiencies,
    /// Samples it was fitted to (the last [`CALIBRATION_WINDOW`]).
    samples: Vec<StageSample>,
    /// The response cap.
    cap: u32,
    /// Ranks in the pool (the planner's device count).
    gpus: u32,
    /// Ranks lost so far (sorted); the planner's ranks skip them.
    lost: Vec<u32>,
    /// The step after the last admitted switch (`every-k` counts from it).
    last_switch: u64,
    /// Smoothed measured over predicted step seconds.
    latency_ratio: Option<f64>,
    /// Predicted and measured seconds summed over the transitions made: calibrates `L̂_tran`.
    transition_seconds: (f64, f64),
    /// Whether the plan in force was entered by a transition and has not run a step yet.
    unseen_plan: bool,
    /// The last step's measured over predicted seconds at its lengths (see
    /// [`Controller::test_the_model`]).
    last_step: Option<RatioAt>,
    /// Relative changes of the measured-over-predicted ratio on the first steps of plans
    /// transitions entered, and on other steps (the last [`TRUST_WINDOW`] of each; see
    /// [`Controller::test_the_model`]): how far a predicted gain can be trusted.
    move_changes: Vec<f64>,
    steady_changes: Vec<f64>,
    /// The better plan under watch, if any.
    #[serde(default)]
    gap: Option<Gap>,
    /// What the plans the job ran measured (payback admission only).
    #[serde(default)]
    memory: PlanMemory,
    /// The plan the last move left, while the plan it entered is judged against it (until
    /// `left_until`, or a regret offers it back).
    #[serde(default)]
    left: Option<Plan>,
    /// The first step after the last move's judgement window ([`REGRET_STEPS`]).
    #[serde(default)]
    left_until: u64,
    /// The first step at which a trial of the best plan's neighbours is priced again.
    #[serde(default)]
    trial_due: u64,
}

impl ControllerState {
    /// The response cap the engine is sized for.
    pub fn cap(&self) -> u32 {
        self.cap
    }

    /// The running calibration.
    pub fn efficiencies(&self) -> Efficiencies {
        self.efficiencies
    }

    /// This state as a resumed run on a new allocation starts from: its engine sized for `cap`
    /// on a pool of `pool` ranks, none of them lost. The monitor keeps the pool it last saw, so
    /// a pool that differs is a pool change at the first boundary, as for a fresh start.
    pub fn resumed(self, cap: u32, pool: u32) -> ControllerState {
        ControllerState { cap, gpus: pool, lost: Vec::new(), ..self }
    }
}

/// The controller between steps (on rank 0 in a live job): the job's settings and planners,
/// and its [`ControllerState`].
pub struct Controller {
    mode: PolicyMode,
    gamma: f64,
    min_gain: f64,
    /// `policy.plan_error`: the model's error on an unmeasured plan before moves measured it.
    plan_error: f64,
    every_k: u64,
    /// Steps between monitor evaluations (`policy.monitor_interval_steps`).
    monitor_interval: u64,
    /// The job's steps (`job.steps`): a trial's gain ends with the job.
    steps: u64,
    length_drift: f64,
    max_len: u32,
    host_bytes_per_s: f64,
    base: Planner,
    /// The static baseline's planner: the layouts it started with, DP following the pool.
    fixed: Option<Planner>,
    /// The response length (p95) the step being decided on ran: where the plan memory's
    /// measurements of this decision are looked up (set from the step's record, never saved).
    ran: u32,
    state: ControllerState,
}

impl Controller {
    /// A controller for `config` starting at response cap `cap`; `base` is the job's planner.
    pub fn new(config: &JobConfig, base: Planner, cap: u32) -> Controller {
        let p = &config.policy;
        let mut monitor = Monitor::new(Thresholds { response_length: p.length_drift, step_latency: p.latency_drift });
        if p.mode == PolicyMode::Nereus {
            monitor = monitor.with_hysteresis();
        }
        // The initial plan was made for responses of `cap` tokens: the first step's lengths
        // are compared with that, so a job that starts short is replanned for what it does.
        monitor.set_reference(Signal::ResponseLength, f64::from(cap));
        // ... and for the pool it was planned on: a pool that differs at the first boundary of
        // a run, fresh or resumed, is a pool change like any later one.
        monitor.set_pool(base.cost().hardware.devices);
        Controller {
            mode: p.mode,
            gamma: p.gamma,
            min_gain: p.min_gain,
            plan_error: p.plan_error,
            every_k: u64::from(p.every_k),
            monitor_interval: u64::from(p.monitor_interval_steps.max(1)),
            steps: u64::from(config.job.steps),
            length_drift: p.length_drift,
            max_len: config.rl.max_response_len,
            host_bytes_per_s: config.cluster.host_link_gbps * 1e9,
            state: ControllerState {
                monitor,
                efficiencies: base.cost().efficiencies,
                gpus: base.cost().hardware.devices,
                lost: Vec::new(),
                samples: Vec::new(),
                cap,
                last_switch: 0,
                latency_ratio: None,
                transition_seconds: (0.0, 0.0),
                unseen_plan: false,
                last_step: None,
                move_changes: Vec::new(),
                steady_changes: Vec::new(),
                gap: None,
                memory: PlanMemory::default(),
                left: None,
                left_until: 0,
                trial_due: 0,
            },
            base,
            fixed: None,
            ran: cap,
        }
    }

    /// What the controller has learned so far (saved with a checkpoint).
    pub fn state(&self) -> &ControllerState {
        &self.state
    }

    /// Continues from `state`, saved by a run of the same job: references, horizons,
    /// calibration, cap, pool and the watched gap all as they were.
    pub fn restore(&mut self, state: ControllerState) {
        self.state = state;
    }

    /// The smallest relative gain admitted: `policy.min_gain`, raised to the cost model's
    /// measured error on the moves it predicted — how much more its measured-over-predicted
    /// ratio changed on the first step of a plan a transition entered than it changes from one
    /// step to the next on one plan (means over the last [`TRUST_WINDOW`] of each). A gain the
    /// model cannot resolve is noise: an exact model earns every gain that pays back, a model
    /// 10% off on new plans needs gains above 10%.
    pub fn gain_threshold(&self) -> f64 {
        self.min_gain.max(self.move_error())
    }

    /// The cost model's measured error on moves: the mean change of its measured-over-predicted
    /// ratio on the first steps of plans transitions entered, less the mean change on other
    /// steps (0 before a move was measured).
    fn move_error(&self) -> f64 {
        if self.state.move_changes.is_empty() {
            0.0
        } else {
            (mean(&self.state.move_changes) - mean(&self.state.steady_changes)).max(0.0)
        }
    }

    /// Tests the cost model on the moves it predicted. Every step's measured over predicted
    /// seconds is taken at the step's length (p95, as the engine pads to its longest responses)
    /// with the calibration in force before it, and compared with the step before when both
    /// ran responses of about the same lengths (within [`COMPARABLE_LENGTHS`]; across a length
    /// change the comparison would test the model's length scaling instead). On the first step
    /// of a plan a transition entered, the change is the model's error on the move (what a
    /// predicted gain is), with whatever bias it has on both plans cancelled out; on other
    /// steps it is what noise changes anyway.
    fn test_the_model(&mut self, current: &Plan, m: &StepRecord) -> Result<(), PlannerError> {
        let predicted = self.planner(self.ran)?.predict(current);
        let now = Some(m.step_seconds / predicted).filter(|r| r.is_finite() && *r > 0.0);
        let moved = std::mem::take(&mut self.state.unseen_plan);
        let near = |a: f64, b: f64| (a / b - 1.0).abs() <= COMPARABLE_LENGTHS;
        if let (Some(before), Some(now)) = (&self.state.last_step, now) {
            if near(m.response_len_mean, before.mean_len) && near(m.response_len_p95, before.p95_len) {
                let changes = if moved { &mut self.state.move_changes } else { &mut self.state.steady_changes };
                changes.push((now / before.ratio - 1.0).abs());
                let excess = changes.len().saturating_sub(TRUST_WINDOW);
                changes.drain(..excess);
            }
        }
        self.state.last_step =
            now.map(|ratio| RatioAt { ratio, mean_len: m.response_len_mean, p95_len: m.response_len_p95 });
        Ok(())
    }

    /// The response length step `m` ran (its p95, as the engine pads to its longest responses).
    fn ran_len(&self, m: &StepRecord) -> u32 {
        m.response_len_p95.ceil().clamp(1.0, f64::from(self.max_len)) as u32
    }

    /// The planner for the pool at response cap `len` with the current calibration.
    fn planner(&self, len: u32) -> Result<Planner, PlannerError> {
        self.fixed.as_ref().unwrap_or(&self.base).replanned(self.state.gpus, u64::from(len), self.state.efficiencies)
    }

    /// A transition predicted at `predicted_s` took `measured_s`: later `L̂_tran` estimates are
    /// scaled by measured over predicted seconds summed over the job's transitions (so large
    /// transitions weigh by their size; one predicted under 10 ms is mostly fixed overhead
    /// the model leaves out, and teaches nothing about the proportional error).
    pub fn transitioned(&mut self, predicted_s: f64, measured_s: f64) {
        if predicted_s.is_finite()
            && measured_s.is_finite()
            && predicted_s >= MIN_CALIBRATING_TRANSITION_S
            && measured_s >= 0.0
        {
            self.state.transition_seconds.0 += predicted_s;
            self.state.transition_seconds.1 += measured_s;
        }
    }

    /// Measured over predicted transition seconds so far (1 before any prediction was tested).
    fn transition_ratio(&self) -> f64 {
        let (predicted, measured) = self.state.transition_seconds;
        if predicted > 0.0 {
            measured / predicted
        } else {
            1.0
        }
    }

    /// `plan` on the world's ranks as the planner sees it: the ranks that are not lost,
    /// renumbered `0, 1, …` in order (the identity while no rank is lost).
    fn to_virtual(&self, plan: &Plan) -> Plan {
        plan.map_ranks(|r| r - self.state.lost.iter().filter(|&&l| (l as i32) < r).count() as i32)
    }

    /// The inverse of [`Controller::to_virtual`]: the planner's rank `v` is the `v`-th rank
    /// that is not lost.
    fn to_physical(&self, plan: &Plan) -> Plan {
        plan.map_ranks(|v| {
            let mut r = v;
            for &l in &self.state.lost {
                if (l as i32) <= r {
                    r += 1;
                }
            }
            r
        })
    }

    /// The response cap the engine is sized for now.
    pub fn cap(&self) -> u32 {
        self.state.cap
    }

    /// The efficiencies the cost model runs with now (the running calibration).
    pub fn efficiencies(&self) -> Efficiencies {
        self.state.efficiencies
    }

    /// Decides after the step `m` records, under the `current` plan.
    pub fn decide(&mut self, m: &StepRecord, current: &Plan) -> Result<Action, PlannerError> {
        if self.mode == PolicyMode::Static && self.fixed.is_none() {
            // The static baseline keeps the layouts it started with; DP follows the pool.
            self.fixed = Some(self.base.keeping_layouts(current));
        }
        let step = m.step;
        self.ran = self.ran_len(m);
        let lost_now = m.lost_ranks != self.state.lost;
        self.state.lost.clone_from(&m.lost_ranks);
        let current = &self.to_virtual(current);
        self.test_the_model(current, m)?;
        // The step ran responses of its own lengths (the engine pads to the longest, about the
        // p95), not the cap's: its stages are compared with the model at those lengths.
        self.calibrate(&self.planner(self.ran)?, current, m);
        let regret = self.remember(current, m)?;
        let now = self.planner(self.state.cap)?;
        let predicted = now.predict(current);
        // Responses reached the cap: it must grow, by δ_len, within the job's limit.
        let cut = m.response_len_p95 >= f64::from(self.state.cap) && self.state.cap < self.max_len;
        let grown = if cut { self.grow(self.state.cap) } else { self.state.cap };
        let usable = now.cost().hardware.usable_bytes();
        let violation = grown > self.state.cap && self.planner(grown)?.rank_peaks(current).max().0 > usable;
        let ratio = m.step_seconds / predicted.max(1e-12);
        let smoothed =
            self.state.latency_ratio.map_or(ratio, |r| LATENCY_SMOOTHING * ratio + (1.0 - LATENCY_SMOOTHING) * r);
        self.state.latency_ratio = Some(smoothed);
        let pool = m.pool_size.unwrap_or(self.state.gpus);
        // Between monitor evaluations only what cannot wait is looked at: memory and the pool.
        let waits = regret.is_none() && !violation && pool == self.state.gpus && !lost_now;
        if !(step + 1).is_multiple_of(self.monitor_interval) && waits {
            self.state.cap = grown;
            return Ok(self.action(None, None, None));
        }
        let observation = Observation {
            step,
            response_len: m.response_len_mean,
            step_seconds: smoothed * predicted,
            predicted_seconds: predicted,
            pool,
            memory_violation: violation,
        };
        let mut triggers = self.state.monitor.observe(&observation);
        self.state.gpus = observation.pool;
        if lost_now && !triggers.contains(&Trigger::PoolShrink) {
            // Ranks were lost: the same count may now name other ranks.
            triggers.insert(0, Trigger::PoolShrink);
        }
        if self.mode == PolicyMode::EveryK && (step + 1 - self.state.last_switch).is_multiple_of(self.every_k) {
            triggers.push(Trigger::Schedule);
        }
        // A regret is offered beside the other triggers (a drift or a growth at the same boundary
        // must not hide a move that did not pay), only not when the plan cannot go on: then the
        // urgent path weighs the measured plans itself ([`Controller::measured_instead`]).
        let mut revert = if triggers.iter().any(|t| t.is_urgent()) { None } else { regret };
        if revert.is_some() {
            triggers.push(Trigger::Regret);
        } else if triggers.is_empty() && self.state.left.is_none() {
            revert = self.revisit(current);
            if revert.is_some() {
                triggers.push(Trigger::Revisit);
            }
        }
        if triggers.is_empty() && self.state.gap.is_some_and(|g| step >= g.due) {
            triggers.push(Trigger::StandingGap);
        }
        let looks_around = triggers.is_empty() && self.looks_around(step);
        if looks_around && !self.is_best(current, grown) {
            // What calibration learned since the last replan ranks another plan first.
            triggers.push(Trigger::StandingGap);
        }
        if triggers.is_empty() {
            // Nothing to replan; a cap that grows within the current plan's memory just grows.
            self.state.cap = grown;
            let trial = if looks_around { self.trial(step, current) } else { None };
            return Ok(trial.unwrap_or_else(|| self.action(None, None, None)));
        }
        let len = self.grow(self.state.cap).min(self.sized(m.response_len_p95)).max(grown);
        self.replan(step, &triggers, &observation, current, len, revert)
    }

    /// Records what step `m` measured on `current` against the starting model (payback
    /// admission only) and, within [`REGRET_STEPS`] steps of a move, returns the plan the move
    /// left (its layouts on the pool now, [`Controller::on_pool`]) when that plan's shape, by
    /// what it measured, would run this step's lengths faster than the plan in force's shape
    /// by what it measured since (smoothed) by more than noise: a regret. Both sides are
    /// measured ratios times the starting model at this step's lengths and pool, so the
    /// comparison holds across a pool change.
    fn remember(&mut self, current: &Plan, m: &StepRecord) -> Result<Option<Plan>, PlannerError> {
        if self.mode != PolicyMode::Nereus {
            self.state.left = None;
            return Ok(None);
        }
        if m.step >= self.state.left_until {
            self.state.left = None;
        }
        let len = f64::from(self.ran);
        let reference = self.reference(self.ran)?;
        let ratio = m.step_seconds / reference.predict(current);
        self.state.memory.record(current, ratio, len, m.step, self.length_drift);
        let Some(left) = self.state.left.clone().and_then(|p| self.on_pool(&self.planner(self.state.cap).ok()?, &p))
        else {
            return Ok(None);
        };
        let memory = &self.state.memory;
        let (Some(theirs), Some(mine)) =
            (memory.ratio(&left, len, self.length_drift), memory.ratio(current, len, self.length_drift))
        else {
            return Ok(None);
        };
        let (expected, realized) = (theirs * reference.predict(&left), mine * reference.predict(current));
        let regret = expected * (1.0 + self.noise().max(self.min_gain)) < realized;
        if regret {
            self.state.left = None;
        }
        Ok(regret.then_some(left))
    }

    /// A plan shape the job ran only at other lengths (among the [`KNOWN_SHAPES`] most
    /// recently run) that, on the pool now and by its measurement carried to this step's
    /// lengths ([`PlanMemory::carried`]), runs faster than the plan in force measured here by
    /// more than the model is trusted on plans; the fastest such, or `None`. The model ranked
    /// the plan in force first at these lengths, but it was fitted where that plan ran: a
    /// shape that measured better elsewhere is worth measuring here (a move back that measures
    /// slower is undone by `regret`, and the shape, measured here, is not revisited until the
    /// lengths move on).
    fn revisit(&self, current: &Plan) -> Option<Plan> {
        if self.mode != PolicyMode::Nereus {
            return None;
        }
        let at = f64::from(self.ran);
        let (planner, reference) = (self.planner(self.state.cap).ok()?, self.reference(self.ran).ok()?);
        let memory = &self.state.memory;
        let realized = memory.ratio(current, at, self.length_drift)? * reference.predict(current);
        let trusted = self.trusted_gain();
        let elsewhere =
            memory.plans().into_iter().take(KNOWN_SHAPES).filter(|p| memory.ratio(p, at, self.length_drift).is_none());
        self.carried_on_pool(&planner, &reference, elsewhere)
            .filter(|(seconds, p, _)| !same_shape(p, current) && seconds * (1.0 + trusted) < realized)
            .min_by(|a, b| a.0.total_cmp(&b.0))
            .map(|(_, p, _)| p)
    }

    /// `plans` on `planner`'s pool now ([`Controller::on_pool`]), each with the seconds its
    /// measurement carried to these lengths gives it ([`PlanMemory::carried`] times
    /// `reference`, the starting model here) and that measurement; plans the job never ran
    /// the layouts of are left out.
    fn carried_on_pool<'p>(
        &'p self,
        planner: &'p Planner,
        reference: &'p Planner,
        plans: impl Iterator<Item = &'p Plan> + 'p,
    ) -> impl Iterator<Item = (f64, Plan, Carried)> + 'p {
        plans.filter_map(move |p| {
            let on_pool = self.on_pool(planner, p)?;
            let c = self.state.memory.carried(&on_pool)?;
            Some((c.ratio * reference.predict(&on_pool), on_pool, c))
        })
    }

    /// The smallest gain a prediction on a plan never measured here is trusted with: the
    /// trusted gain, or the model's error on plans when larger.
    fn trusted_gain(&self) -> f64 {
        self.gain_threshold().max(self.model_error_sd())
    }

    /// A move from `current` at `step`: the plan it leaves is judged against for
    /// [`REGRET_STEPS`] steps.
    fn leave(&mut self, step: u64, current: &Plan) {
        self.state.left = Some(current.clone());
        self.state.left_until = step + 1 + REGRET_STEPS;
    }

    /// `plan` as `planner`'s pool and cap can run it: the fastest plan with its layouts (DP
    /// following the pool) when that keeps its shape, else `plan` itself when it is valid there
    /// and fits every rank, else that fastest plan (micro-batches or recomputation as the
    /// memory needs); `None` when none fits.
    fn on_pool(&self, planner: &Planner, plan: &Plan) -> Option<Plan> {
        let fastest = planner.keeping_layouts(plan).search_from(plan).ok().map(|(job, _)| job.plan());
        if fastest.as_ref().is_some_and(|f| same_shape(f, plan)) {
            return fastest;
        }
        let usable = planner.cost().hardware.usable_bytes();
        let runs = plan.validate(planner.cost().hardware.devices).is_ok() && planner.rank_peaks(plan).max().0 <= usable;
        if runs {
            Some(plan.clone())
        } else {
            fastest
        }
    }

    /// The starting model (never recalibrated) for the pool at response length `len`: what
    /// the plan memory's ratios are taken against.
    fn reference(&self, len: u32) -> Result<Planner, PlannerError> {
        self.base.replanned(self.state.gpus, u64::from(len), self.base.cost().efficiencies)
    }

    /// How much a step's measured-over-predicted ratio changes from one step to the next on
    /// one plan (the mean of the last steady changes): what a measurement cannot resolve.
    fn noise(&self) -> f64 {
        mean(&self.state.steady_changes)
    }

    /// `ΔL` of moving from `current` to `target` at response length `len` from what the job
    /// measured on both (`None` unless both ran responses comparable to the last step's), and
    /// the length the target's ratio was carried from when `carry` lets it be measured at
    /// other lengths ([`PlanMemory::carried`], a [`Trigger::Revisit`]).
    fn measured_delta(&self, current: &Plan, target: &Plan, len: u32, carry: bool) -> Option<(f64, Option<f64>)> {
        // The ratios are looked up where they were measured (the cap is sized with room above).
        let at = f64::from(self.ran);
        let memory = &self.state.memory;
        let mine = memory.ratio(current, at, self.length_drift)?;
        let (theirs, carried_from) = match memory.ratio(target, at, self.length_drift) {
            Some(r) => (r, None),
            None if carry => memory.carried(target).map(|c| (c.ratio, Some(c.len)))?,
            None => return None,
        };
        let reference = self.reference(len).ok()?;
        Some((mine * reference.predict(current) - theirs * reference.predict(target), carried_from))
    }

    /// Replans at response cap `len` and admits or rejects the target.
    fn replan(
        &mut self,
        step: u64,
        triggers: &[Trigger],
        observation: &Observation,
        current: &Plan,
        len: u32,
        revert: Option<Plan>,
    ) -> Result<Action, PlannerError> {
        if ![[Trigger::StandingGap], [Trigger::Regret], [Trigger::Revisit]].iter().any(|only| triggers == only) {
            // The plan is remade for what the signals read now. (A standing gap's offer changes
            // no condition: the references and the intervals between crossings stay.)
            self.state.monitor.replanned(observation);
        }
        let planner = match self.planner(len) {
            Ok(p) => p,
            Err(e) => return Ok(self.stopping(triggers, format!("no plan fits the next steps: {e}"))),
        };
        let links = Links::of(&planner.cost().hardware, Some(self.host_bytes_per_s));
        let back = revert.and_then(|plan| toward(&planner, current, &self.on_pool(&planner, &plan)?, &links));
        let choice = match back.map_or_else(|| choose(&planner, current, &links), Ok) {
            Ok(c) => c,
            Err(e) => return Ok(self.no_plan(triggers, current, len, e)),
        };
        let current_fits = choice.current_seconds.is_finite();
        let urgent = triggers.iter().any(|t| t.is_urgent()) || !current_fits;
        // After a rank loss the planner's ranks are renumbered around the lost ones, and the
        // layouts a plan ran cannot be taken over as they were placed: the fastest stays.
        let measured = match urgent && self.state.lost.is_empty() {
            true => self.measured_instead(&planner, current, &choice, &links),
            false => None,
        };
        let (choice, kept) = measured.map_or((choice, None), |(c, why)| (c, Some(why)));
        let (mut proposal, mut verdict) = self.judge(&choice, current, triggers, urgent, (step, len));
        if let Some(why) = kept.filter(|_| verdict.admitted) {
            verdict.reason = format!("{}; {why}", verdict.reason);
        }
        let fastest = (choice.clone(), proposal, verdict.clone());
        let mut choice = choice;
        if !verdict.admitted && !choice.keep && !triggers.contains(&Trigger::StandingGap) {
            // A rejected target falls back to slower ones with cheaper transitions first. (Not
            // when a standing gap is offered: it comes back when the fastest target's payback
            // is due, and settling for less just before would keep the job short of it.)
            let alternatives: Vec<TargetChoice> =
                cheaper_targets(&planner, current, &choice, &links).take(MAX_CHEAPER_TARGETS).collect();
            for alternative in alternatives {
                let (p, mut v) = self.judge(&alternative, current, triggers, urgent, (step, len));
                if v.admitted {
                    v.reason = format!(
                        "fallback {} keeping the heaviest moves in place: {} (the fastest target: {})",
                        alternative.fallback_rank, v.reason, verdict.reason
                    );
                    (choice, proposal, verdict) = (alternative, p, v);
                    break;
                }
            }
        }
        if !verdict.admitted && !current_fits {
            // The current plan cannot go on and nothing reachable is admitted: stop.
            verdict.reason = self.why_it_cannot_go_on(&planner, current, len, &choice, &verdict);
            let decision = self.record(triggers, &proposal, &verdict);
            return Ok(self.action(None, decision, Some(verdict.reason.clone())));
        }
        let decision = self.record(triggers, &proposal, &verdict);
        // The gap closes when the fastest target is taken, or when the plan in force is the
        // fastest — by the model, or by what the job measured on both.
        let measured_slower = fastest.1.measured && fastest.1.delta_l_s <= 0.0;
        let taken = (verdict.admitted || choice.keep) && choice.fallback_rank == 0 && choice.blocked_reason.is_none();
        let closed = taken || measured_slower;
        self.watch(step, if closed { None } else { Some(&fastest) });
        if verdict.admitted {
            self.state.cap = len;
            self.state.last_switch = step + 1;
            let target = (choice.target.plan() != *current).then(|| self.to_physical(&choice.target.plan()));
            self.state.unseen_plan = target.is_some();
            if target.is_some() && self.mode == PolicyMode::Nereus {
                // Urgent moves too: a target chosen without a measurement may not pay.
                self.leave(step, current);
            }
            return Ok(self.action(target, decision, None));
        }
        // Rejected, and the current plan fits the new cap: keep the plan, size the cap.
        self.state.cap = len;
        Ok(self.action(None, decision, None))
    }

    /// The urgent target chosen with what the job measured: when the plan in force must move,
    /// its layouts on the pool now ([`Controller::on_pool`], the shape the calibration was fitted
    /// to and the plan memory measured) are taken instead of the planner's fastest `choice`
    /// unless that one is faster by more than the model can be trusted on a plan: measured
    /// faster when its shape ran at these lengths, else predicted faster by more than the
    /// trusted gain and the model's error on plans ([`Controller::model_error_sd`]). When those
    /// layouts did not run these lengths, the plan the job ran that its measurements, carried
    /// to them, say runs fastest is weighed the same way ([`Controller::a_plan_it_ran`]). The
    /// move and why (payback admission only; `None`: the fastest stays).
    fn measured_instead(
        &self,
        planner: &Planner,
        current: &Plan,
        choice: &TargetChoice,
        links: &Links,
    ) -> Option<(TargetChoice, String)> {
        if self.mode != PolicyMode::Nereus || choice.keep {
            return None;
        }
        let fastest = choice.target.plan();
        let at = f64::from(self.ran);
        let reference = self.reference(planner.response_len() as u32).ok()?;
        let kept = self.on_pool(planner, current);
        if kept.as_ref() == Some(&fastest) {
            // The plan in force's layouts are the fastest: nothing to weigh.
            return None;
        }
        let measured = kept.as_ref().and_then(|k| Some((k, self.state.memory.ratio(k, at, self.length_drift)?)));
        let (target, why) = match measured {
            Some((kept, ratio)) => {
                let kept_s = ratio * reference.predict(kept);
                let seconds = (kept_s, planner.predict(kept), 0.0);
                let why = self.outweighs("kept the layouts it ran", seconds, &fastest, (planner, &reference))?;
                (kept.clone(), why)
            }
            None => self.a_plan_it_ran((planner, &reference), current, &fastest)?,
        };
        let choice = toward(planner, current, &target, links)?;
        Some((choice, why))
    }

    /// The plan the job ran (the plan in force's and the most recently run [`KNOWN_SHAPES`]
    /// shapes, each on the pool now) that its measurement carried to these lengths
    /// ([`PlanMemory::carried`]: its shape's at other lengths, or its layouts' under another
    /// recomputation) says runs fastest now, when it outweighs the never-run `fastest`
    /// ([`Controller::outweighs`]). The model ranked these shapes at lengths where it may be
    /// wrong; a measurement there, scaled by the model, is the better guess.
    fn a_plan_it_ran(
        &self,
        (planner, reference): (&Planner, &Planner),
        current: &Plan,
        fastest: &Plan,
    ) -> Option<(Plan, String)> {
        let memory = &self.state.memory;
        let known = std::iter::once(current).chain(memory.plans()).take(1 + KNOWN_SHAPES);
        let (known_s, known, carried) = self
            .carried_on_pool(planner, reference, known)
            .filter(|(_, p, _)| p != fastest)
            .min_by(|a, b| a.0.total_cmp(&b.0))?;
        let source = if carried.same_shape { "its shape" } else { "its layouts under another shape" };
        let what = format!("took a plan it ran ({source} measured at {:.0} tokens)", carried.len);
        // A measurement carried from other lengths or another shape beats a measurement here
        // only by more than the model is trusted (as a revisit must).
        let here = carried.same_shape && memory.ratio(&known, f64::from(self.ran), self.length_drift).is_some();
        let margin = if here { 0.0 } else { self.trusted_gain() };
        let why = self.outweighs(&what, (known_s, known_s, margin), fastest, (planner, reference))?;
        Some((known, why))
    }

    /// Why a plan the job ran is taken instead of the planner's `fastest`, given its seconds
    /// `(known_s, compared_s, margin)`: `known_s` by its measurement, beside which `fastest`,
    /// when its shape ran at these lengths, measured slower by more than the relative `margin`;
    /// else `fastest` is predicted faster than `compared_s` (the calibrated model's seconds
    /// where it was fitted to the plan, else `known_s`) by less than the model is trusted on
    /// plans. `planner` is the calibrated model at the new cap, `reference` the starting one.
    /// `None`: the fastest is taken.
    fn outweighs(
        &self,
        what: &str,
        seconds: (f64, f64, f64),
        fastest: &Plan,
        (planner, reference): (&Planner, &Planner),
    ) -> Option<String> {
        let (known_s, compared_s, margin) = seconds;
        let at = f64::from(self.ran);
        match self.state.memory.ratio(fastest, at, self.length_drift) {
            Some(ratio) => {
                let f = ratio * reference.predict(fastest);
                (f >= known_s * (1.0 + margin)).then(|| format!("{what}: measured {known_s:.4} s against {f:.4} s"))
            }
            None => {
                let gain = 1.0 - planner.predict(fastest) / compared_s;
                let trusted = self.trusted_gain();
                (gain < trusted).then(|| {
                    format!(
                        "{what}: the fastest plan, never run, is predicted {:.1}% faster, within the {:.1}% the \
                         model is trusted on plans",
                        100.0 * gain,
                        100.0 * trusted
                    )
                })
            }
        }
    }

    /// Keeps the gap between the plan in force and the planner's `fastest` target under watch
    /// (`None`: there is none). Under payback admission the gap is offered again once the
    /// standing horizon (which grows by a step per step while no signal crosses) will cover
    /// the payback last priced; a gain the model could not trust, or a blocked move, is
    /// offered again after as many steps as the gap has stood. The baselines do not watch.
    fn watch(&mut self, step: u64, fastest: Option<&(TargetChoice, Proposal, Verdict)>) {
        let Some((_, p, _)) = fastest.filter(|_| self.mode == PolicyMode::Nereus) else {
            self.state.gap = None;
            return;
        };
        let opened = self.state.gap.map_or(step, |g| g.opened);
        let payback = p.l_tran_s / p.delta_l_s;
        let due = if p.delta_l_s > 0.0 && payback.is_finite() && p.delta_l_s >= self.gain_threshold() * p.current_s {
            step + self.steps_until_covered(payback, self.state.monitor.standing_horizon(step))
        } else {
            step + (step - opened).max(self.monitor_interval)
        };
        self.state.gap = Some(Gap { opened, due });
    }

    /// Whether the controller, with nothing to do at this boundary, looks again at the plan in
    /// force: payback admission only, no gap watched, and the plan run for two monitor
    /// intervals at least (`regret` has judged its first step). The next look is due after as
    /// many steps again as the plan has held, or sooner when a trial priced now will pay back.
    fn looks_around(&mut self, step: u64) -> bool {
        let held = (step + 1).saturating_sub(self.state.last_switch);
        let quiet = held >= 2 * self.monitor_interval && step >= self.state.trial_due;
        if self.mode != PolicyMode::Nereus || self.gamma <= 0.0 || self.state.gap.is_some() || !quiet {
            return false;
        }
        self.state.trial_due = step + held;
        true
    }

    /// Whether `current` is still the planner's best at response cap `cap` with the running
    /// calibration (a plan that no longer fits is, for this question, the best).
    fn is_best(&self, current: &Plan, cap: u32) -> bool {
        let best = self.planner(cap).and_then(|p| p.search_from(current));
        best.map_or(true, |(job, _)| job.plan() == *current)
    }

    /// Offers a trial of one of the best plan's neighbours ([`trial`]), priced with the model's
    /// error on plans ([`Controller::model_error_sd`], [`Controller::as_trial`]); when none pays
    /// back yet, looks again when the standing horizon will cover the cheapest.
    fn trial(&mut self, step: u64, current: &Plan) -> Option<Action> {
        let sigma = self.model_error_sd();
        // A planner that cannot be made here is the next trigger's to report, not a look's.
        let planner = self.planner(self.state.cap).ok().filter(|_| sigma > 0.0)?;
        let horizon = self.state.monitor.horizon(&[Trigger::Trial], step);
        let (payback, choice) = self.cheapest_trial(&planner, current, sigma)?;
        let mut proposal = self.proposal(&choice, current, horizon);
        let Some((verdict, gain)) = self.as_trial(&proposal, step) else {
            let covered = step + self.steps_until_covered(payback, horizon);
            self.state.trial_due = self.state.trial_due.min(covered);
            return None;
        };
        proposal.trial_gain_s = Some(gain);
        let decision = self.record(&[Trigger::Trial], &proposal, &verdict);
        self.state.last_switch = step + 1;
        self.state.unseen_plan = true;
        self.leave(step, current);
        Some(self.action(Some(self.to_physical(&choice.target.plan())), decision, None))
    }

    /// Steps from now until the standing horizon, `horizon` now and growing by one a step,
    /// covers a payback of `payback` steps at γ (at least one monitor interval).
    fn steps_until_covered(&self, payback: f64, horizon: f64) -> u64 {
        let wait = (payback / self.gamma.max(1e-9) - horizon).ceil().clamp(0.0, 1e9) as u64;
        wait.max(self.monitor_interval)
    }

    /// The best plan's neighbours not measured at the lengths the last step ran, priced: the
    /// one whose trial pays back soonest (with its payback, steps) and its move.
    fn cheapest_trial(&self, planner: &Planner, current: &Plan, sigma: f64) -> Option<(f64, TargetChoice)> {
        let c = planner.predict(current);
        let mut priced: Vec<(Odds, Plan)> = trial::neighbours(planner, current)
            .into_iter()
            .filter(|p| !self.state.memory.ran_alike(p, f64::from(self.ran), self.length_drift))
            .map(|p| (Odds::of(c, planner.predict(&p), sigma), p))
            .filter(|(odds, _)| odds.gain > 0.0)
            .collect();
        // Each costs a DAG: only the most promising are priced with their transitions.
        priced.sort_by(|a, b| b.0.gain.total_cmp(&a.0.gain));
        let links = Links::of(&planner.cost().hardware, Some(self.host_bytes_per_s));
        priced
            .into_iter()
            .take(TRIALS_PRICED)
            .filter_map(|(odds, plan)| {
                let choice = toward(planner, current, &plan, &links)?;
                Some((odds.cost(choice.l_tran_s * self.transition_ratio()) / odds.gain, choice))
            })
            .min_by(|a, b| a.0.total_cmp(&b.0))
    }

    /// `proposal` priced as a trial ([`trial`]): the target's step seconds taken as normal
    /// around the prediction, with the model's error on plans ([`Controller::model_error_sd`]);
    /// taken when the expected improvement, gained on every step of `γ · H` (`H` at most the
    /// job's steps left after `step`), pays back the transition there, the way back when it
    /// measures slower and the step run on it, and is at least `min_gain`. The verdict and the
    /// expected improvement per step, or `None` when it does not pay back (or that error is 0).
    fn as_trial(&self, p: &Proposal, step: u64) -> Option<(Verdict, f64)> {
        let sigma = self.model_error_sd();
        if self.mode != PolicyMode::Nereus || sigma <= 0.0 || self.gamma <= 0.0 {
            return None;
        }
        let odds = Odds::of(p.current_s, p.current_s - p.delta_l_s, sigma);
        let payback = odds.cost(p.l_tran_s) / odds.gain;
        // What a trial finds is collected until the job ends at the latest.
        let steps_left = self.steps.saturating_sub(step + 1) as f64;
        let budget = self.gamma * p.horizon.min(steps_left);
        let reason = format!(
            "a trial: predicted {:+.1}% with the model's error on plans σ = {:.1}% (prior {:.1}%, {} moves \
             measured), {:.4} s/step expected better, pays back its cost (there, back and one step) in \
             {payback:.2} steps ≤ γ·H = {budget:.2}",
            100.0 * p.delta_l_s / p.current_s,
            100.0 * sigma,
            100.0 * self.plan_error,
            self.state.move_changes.len(),
            odds.gain
        );
        (odds.gain > 0.0 && odds.gain >= self.min_gain * p.current_s && payback <= budget)
            .then_some((Verdict { admitted: true, kind: Some(TransitionKind::Opportunistic), reason }, odds.gain))
    }

    /// The model's error on plans as a relative standard deviation: the moves' (the mean
    /// absolute change, [`Controller::move_error`], of a normal error is `σ·√(2/π)`) shrunk
    /// toward the prior `policy.plan_error` weighed as [`PRIOR_MOVES`] moves: one or two
    /// changes are not a spread, and a job that has moved little still errs on the plans it has
    /// not run. The moves kept are at most [`TRUST_WINDOW`], so the prior never weighs less
    /// than `3/(3 + TRUST_WINDOW)`; with a prior of 0, `σ` is the moves' shrunk toward 0.
    fn model_error_sd(&self) -> f64 {
        let moves = self.state.move_changes.len() as f64;
        let measured = self.move_error() * (std::f64::consts::PI / 2.0).sqrt();
        let prior = PRIOR_MOVES as f64;
        (prior * self.plan_error + moves * measured) / (prior + moves)
    }

    /// Why the current plan cannot go on, for a stop: the pool no longer holds its ranks, or a
    /// rank would run out of memory at the new cap; with the plan that would fit.
    fn why_it_cannot_go_on(
        &self,
        planner: &Planner,
        current: &Plan,
        len: u32,
        choice: &TargetChoice,
        verdict: &Verdict,
    ) -> String {
        let target = choice.target.plan();
        let advice = format!("a plan that fits: {target}; restart with that plan and `nereus train --resume latest`");
        if let Err(e) = current.validate(self.state.gpus) {
            return format!(
                "{}; the pool of {} ranks no longer holds the current plan ({e}); {advice}",
                verdict.reason, self.state.gpus
            );
        }
        let peaks = planner.rank_peaks(current);
        let (need, rank) = peaks.max();
        let capacity = planner.cost().hardware.memory_bytes;
        format!(
            "{}; out of memory ahead: at {len} response tokens rank {rank} would need {} of {} ({}); {advice} (or more memory)",
            verdict.reason,
            format_bytes(need),
            format_bytes(capacity),
            peaks.ranks[rank as usize].busiest.map_or(String::new(), |ms| format!("while {ms} runs")),
        )
    }

    /// The admission's question about the move `choice` from `current` over `horizon`, as the
    /// model predicts it (not urgent, no pool growth, nothing measured, not a trial).
    fn proposal(&self, choice: &TargetChoice, current: &Plan, horizon: f64) -> Proposal {
        let changes_layout = choice.target.plan().placements.iter().zip(&current.placements).any(|(a, b)| {
            (a.candidate.layout, a.candidate.model_stage) != (b.candidate.layout, b.candidate.model_stage)
        });
        Proposal {
            urgent: false,
            delta_l_s: choice.delta_l_s,
            l_tran_s: choice.l_tran_s * self.transition_ratio(),
            current_s: choice.current_seconds,
            horizon,
            changes_layout,
            pool_growth: false,
            measured: false,
            trial_gain_s: None,
        }
    }

    /// The admission's question about `choice` and its answer.
    fn judge(
        &self,
        choice: &TargetChoice,
        current: &Plan,
        triggers: &[Trigger],
        urgent: bool,
        (step, len): (u64, u32),
    ) -> (Proposal, Verdict) {
        let target = choice.target.plan();
        let carry = triggers.contains(&Trigger::Revisit);
        let (measured, carried_from) = (self.mode == PolicyMode::Nereus && !choice.keep)
            .then(|| self.measured_delta(current, &target, len, carry))
            .flatten()
            .map_or((None, None), |(delta, from)| (Some(delta), from));
        let mut proposal = Proposal {
            urgent,
            delta_l_s: measured.unwrap_or(choice.delta_l_s),
            pool_growth: triggers.contains(&Trigger::PoolGrowth),
            measured: measured.is_some(),
            ..self.proposal(choice, current, self.state.monitor.horizon(triggers, step))
        };
        let verdict = if choice.keep {
            Verdict {
                admitted: false,
                kind: None,
                reason: choice.blocked_reason.clone().unwrap_or_else(|| "the current plan is still the fastest".into()),
            }
        } else {
            // A gain measured on both plans is not the model's to doubt: only noise, which
            // min_gain covers, stands between it and the truth.
            let threshold = if measured.is_some() { self.min_gain } else { self.gain_threshold() };
            let mut verdict = admit(self.mode, &proposal, self.gamma, threshold);
            if let Some(from) = carried_from {
                verdict.reason =
                    format!("measured on both plans (the target's at {from:.0} tokens): {}", verdict.reason);
            } else if measured.is_some() {
                verdict.reason = format!("measured on both plans: {}", verdict.reason);
            }
            // A gain positive but within the model's error: not trusted as a prediction, but
            // worth a trial when what it may bring pays back what it costs.
            let unresolved = proposal.delta_l_s > 0.0 && proposal.delta_l_s < self.move_error() * proposal.current_s;
            let trial = (!verdict.admitted && !urgent && measured.is_none() && unresolved)
                .then(|| self.as_trial(&proposal, step))
                .flatten();
            match trial {
                Some((trial, gain)) => {
                    proposal.trial_gain_s = Some(gain);
                    trial
                }
                None => verdict,
            }
        };
        (proposal, verdict)
    }

    /// Folds the step's measured stages into the running calibration.
    fn calibrate(&mut self, planner: &Planner, current: &Plan, m: &StepRecord) {
        if let Some(measured) = &m.stage_seconds {
            for (phase, (_, ideal)) in planner.stage_parts(current).iter() {
                let timed = m.op_seconds.as_ref().map(|ops| *ops.get(phase));
                self.state.samples.push(StageSample { ideal: *ideal, measured: *measured.get(phase), timed });
            }
        }
        let excess = self.state.samples.len().saturating_sub(CALIBRATION_WINDOW);
        self.state.samples.drain(..excess);
        let mut e = self.state.efficiencies;
        e.fit_stages(&self.state.samples);
        self.state.efficiencies = e;
    }

    /// `cap` grown by `δ_len`, at least one token, within the job's limit.
    fn grow(&self, cap: u32) -> u32 {
        ((f64::from(cap) * (1.0 + self.length_drift)).ceil() as u32).max(cap + 1).min(self.max_len)
    }

    /// A cap for responses whose p95 is `p95`: `δ_len` of room, within the job's limit.
    pub fn sized(&self, p95: f64) -> u32 {
        ((p95 * (1.0 + self.length_drift)).ceil() as u32).clamp(1, self.max_len)
    }

    /// Nothing reachable fits responses of `len` tokens: a stop. The static baseline, which
    /// searched its own layouts only, says which plan would fit with others.
    fn no_plan(&self, triggers: &[Trigger], current: &Plan, len: u32, e: impl std::fmt::Display) -> Action {
        let reason = format!("no plan fits responses of {len} tokens: {e}");
        let free = (self.mode == PolicyMode::Static)
            .then(|| self.base.replanned(self.state.gpus, u64::from(len), self.state.efficiencies).ok())
            .flatten();
        let links = Links::of(&self.base.cost().hardware, Some(self.host_bytes_per_s));
        let Some((free, choice)) = free.and_then(|p| choose(&p, current, &links).ok().map(|c| (p, c))) else {
            return self.stopping(triggers, reason);
        };
        let verdict =
            Verdict { admitted: false, kind: None, reason: "static policy: the TP/PP layouts never change".into() };
        let reason = self.why_it_cannot_go_on(&free, current, len, &choice, &verdict);
        self.stopping(triggers, reason)
    }

    fn stopping(&self, triggers: &[Trigger], reason: String) -> Action {
        let decision = Decision {
            trigger: triggers.to_vec(),
            admitted: false,
            kind: None,
            reason: reason.clone(),
            admission: None,
        };
        self.action(None, Some(decision), Some(reason))
    }

    fn record(&self, triggers: &[Trigger], p: &Proposal, verdict: &Verdict) -> Option<Decision> {
        let finite = |x: f64| x.is_finite().then_some(x);
        Some(Decision {
            trigger: triggers.to_vec(),
            admitted: verdict.admitted,
            kind: verdict.kind,
            reason: verdict.reason.clone(),
            admission: Some(Admission {
                delta_l_s: finite(p.delta_l_s),
                measured: p.measured,
                l_tran_s: finite(p.l_tran_s),
                l_tran_calibration: self.transition_ratio(),
                h_x: p.horizon,
                gamma: self.gamma,
                gain_threshold: self.gain_threshold(),
                expected_gain_s: p.trial_gain_s,
                mode: self.mode,
            }),
        })
    }

    fn action(&self, target: Option<Plan>, decision: Option<Decision>, stop: Option<String>) -> Action {
        Action {
            target,
            cap: self.state.cap,
            pool: self.state.gpus,
            efficiencies: self.state.efficiencies,
            decision,
            stop,
        }
    }
}

/// The mean of `v` (0 when empty).
fn mean(v: &[f64]) -> f64 {
    if v.is_empty() {
        0.0
    } else {
        v.iter().sum::<f64>() / v.len() as f64
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::{ConfigSource, Overrides, RawJobConfig};
    use crate::plan::Placement;

    /// The embedded tiny PPO job under the controller, responses planned for 8 tokens.
    fn controller(interval: u32) -> (Controller, Plan) {
        controller_with(interval, |_| {})
    }

    /// [`controller`] with the policy settings `edit` makes.
    fn controller_with(interval: u32, edit: impl FnOnce(&mut crate::config::PolicySection)) -> (Controller, Plan) {
        let source = ConfigSource::embedded_default();
        let raw = RawJobConfig::parse(&source).unwrap();
        let mut config = raw.resolve(&source, &Overrides::default(), &mut || unreachable!()).unwrap();
        config.policy.mode = PolicyMode::Nereus;
        config.policy.initial_response_len = 8;
        config.policy.monitor_interval_steps = interval;
        edit(&mut config.policy);
        let (plan, planner, cap) = initial_plan(&config, 8).unwrap();
        assert_eq!(cap, 8);
        (Controller::new(&config, planner, cap), plan)
    }

    /// A step whose responses are `len` tokens long and whose seconds are `seconds`.
    fn record(step: u64, len: f64, seconds: f64) -> StepRecord {
        StepRecord { step, response_len_mean: len, response_len_p95: len, step_seconds: seconds, ..Default::default() }
    }

    #[test]
    fn a_drift_is_looked_at_only_on_monitor_steps() {
        let (mut c, plan) = controller(2);
        let seconds = c.planner(8).unwrap().predict(&plan);
        // Step 0 (the first of every two) is not evaluated: 4-token responses pass unseen.
        assert!(c.decide(&record(0, 4.0, seconds), &plan).unwrap().decision.is_none());
        // Step 1 is: half the length the plan was made for is a drift past δ_len = 0.3.
        let d = c.decide(&record(1, 4.0, seconds), &plan).unwrap().decision.unwrap();
        assert_eq!(d.trigger, vec![Trigger::Drift(Signal::ResponseLength)], "{d:?}");
        let written = serde_json::to_value(&d).unwrap();
        assert_eq!(written["trigger"], serde_json::json!([{"drift": "response-length"}]), "{written}");
    }

    #[test]
    fn responses_that_reach_the_cap_grow_it_by_delta_len() {
        let (mut c, plan) = controller(1);
        let seconds = c.planner(8).unwrap().predict(&plan);
        // p95 at the cap: responses were cut, the cap grows to ceil(8 · 1.3) = 11 and the
        // mean (8 → 8) has not drifted, so no replan.
        let a = c.decide(&record(0, 8.0, seconds), &plan).unwrap();
        assert!(a.decision.is_none(), "{:?}", a.decision);
        assert_eq!(a.cap, 11);
    }

    #[test]
    fn measured_transitions_calibrate_l_tran_by_their_summed_seconds() {
        let (mut c, _) = controller(1);
        assert_eq!(c.transition_ratio(), 1.0);
        c.transitioned(0.0, 0.5); // nothing was predicted to move: no information
        c.transitioned(0.001, 0.5); // overhead, not the model's error
        assert_eq!(c.transition_ratio(), 1.0);
        c.transitioned(1.0, 0.1);
        assert!((c.transition_ratio() - 0.1).abs() < 1e-12);
        c.transitioned(2.0, 0.4);
        assert!((c.transition_ratio() - 0.5 / 3.0).abs() < 1e-12);
    }

    #[test]
    fn the_gain_threshold_rises_to_the_error_measured_on_the_moves() {
        let (mut c, plan) = controller(1);
        let floor = c.min_gain;
        assert_eq!(c.gain_threshold(), floor);
        let predicted = |c: &Controller| c.planner(7).unwrap().predict(&plan);
        let close =
            |c: &Controller, want: f64| assert!((c.gain_threshold() - want).abs() < 1e-9, "{}", c.gain_threshold());
        // 30% slower than predicted on the plan the job started with: a bias, not an error on
        // a move (gains compare two plans under the same model).
        c.decide(&record(0, 7.0, 1.3 * predicted(&c)), &plan).unwrap();
        close(&c, floor);
        // The first step of a plan a transition entered ran 25% slower than that bias says...
        c.state.unseen_plan = true;
        c.decide(&record(1, 7.0, 1.25 * 1.3 * predicted(&c)), &plan).unwrap();
        close(&c, 0.25);
        // ... less what steps on one plan change anyway (10% here) ...
        c.decide(&record(2, 7.0, 1.1 * 1.25 * 1.3 * predicted(&c)), &plan).unwrap();
        close(&c, 0.25 - 0.1);
        // ... and the next move's as predicted: the mean of the moves' changes (12.5%) less
        // the steady steps' (10%), never below min_gain.
        c.state.unseen_plan = true;
        c.decide(&record(3, 7.0, 1.1 * 1.25 * 1.3 * predicted(&c)), &plan).unwrap();
        close(&c, floor.max(0.125 - 0.1));
        // A move across a length change (7 to 14 tokens) tests the length scaling, not the move.
        c.state.unseen_plan = true;
        c.decide(&record(4, 14.0, 5.0 * predicted(&c)), &plan).unwrap();
        close(&c, floor.max(0.125 - 0.1));
        assert!(!c.state.unseen_plan);
    }

    #[test]
    fn plans_skip_lost_ranks_and_come_back_unchanged() {
        let (mut c, plan) = controller(1);
        c.state.lost = vec![2, 5];
        let physical = c.to_physical(&plan);
        let used: Vec<i32> = physical.placements.iter().flat_map(|p| p.ranks.clone()).collect();
        assert!(!used.contains(&2) && !used.contains(&5), "{used:?}");
        // Planner rank 2 is world rank 3, planner rank 4 is world rank 6.
        let map = |v: i32| Plan { placements: vec![Placement { ranks: vec![v], ..plan.placements[0].clone() }] };
        assert_eq!(c.to_physical(&map(2)), map(3));
        assert_eq!(c.to_physical(&map(4)), map(6));
        assert_eq!(c.to_virtual(&physical), plan);
    }

    /// The plan `initial_plan` makes for the tiny job on 4 of the controller's 8 ranks: valid
    /// on the pool, and slower than the planner's best on all 8.
    fn half_pool_plan() -> Plan {
        let source = ConfigSource::embedded_default();
        let raw = RawJobConfig::parse(&source).unwrap();
        let mut config = raw.resolve(&source, &Overrides::default(), &mut || unreachable!()).unwrap();
        config.policy.initial_response_len = 8;
        initial_plan(&config, 4).unwrap().0
    }

    #[test]
    fn a_rejected_gain_stands_under_watch_and_is_taken_when_the_horizon_covers_its_payback() {
        let (mut probe, _) = controller(1);
        let current = half_pool_plan();
        let seconds = probe.planner(8).unwrap().predict(&current);
        // What the drift's replan would weigh: ΔL and L_tran of the fastest target.
        let first = probe.decide(&record(0, 4.0, seconds), &current).unwrap().decision.unwrap();
        let a = first.admission.unwrap();
        let payback = a.l_tran_s.unwrap() / a.delta_l_s.unwrap();
        assert!(payback > 0.0 && a.delta_l_s.unwrap() > 0.0, "{first:?}");
        // γ such that the payback needs a horizon of 6 steps: the drift's (1) does not cover it.
        let (mut c, _) = controller(1);
        c.gamma = payback / 6.0;
        c.min_gain = 0.0;
        let d = c.decide(&record(0, 4.0, seconds), &current).unwrap().decision.unwrap();
        assert_eq!(d.trigger, vec![Trigger::Drift(Signal::ResponseLength)]);
        assert!(!d.admitted, "{d:?}");
        let gap = c.state.gap.expect("the rejected target is watched");
        assert_eq!(gap.opened, 0);
        // Quiet steps at the new length: nothing is offered until the standing horizon (steps
        // since the signals last moved) reaches 6; then the gap is, and taken.
        let mut taken = None;
        for step in 1..=10 {
            let action = c.decide(&record(step, 4.0, seconds), &current).unwrap();
            if let Some(d) = action.decision {
                assert_eq!(d.trigger, vec![Trigger::StandingGap], "step {step}: {d:?}");
                if d.admitted {
                    assert_eq!(d.kind, Some(super::super::TransitionKind::Opportunistic));
                    assert!(action.target.is_some());
                    taken = Some(step);
                    break;
                }
            }
        }
        let taken = taken.expect("the gap was taken within 10 steps");
        assert!((5..=7).contains(&taken), "taken at step {taken}, gap due at {}", gap.due);
        assert_eq!(c.state.gap, None, "the fastest plan was taken: nothing left to watch");
    }

    #[test]
    fn a_gain_within_the_models_error_is_taken_as_a_trial_and_left_when_it_measures_slower() {
        // Latency drift out of the way: the trial's slow step must be judged by Regret alone.
        let (mut c, _) = controller_with(1, |p| p.latency_drift = 100.0);
        let current = half_pool_plan();
        let seconds = c.planner(8).unwrap().predict(&current);
        let (mut probe, _) = controller(1);
        let first = probe.decide(&record(0, 4.0, seconds), &current).unwrap().decision.unwrap();
        let gain = first.admission.unwrap().delta_l_s.unwrap();
        // The current plan's seconds the replan weighed the gain against (at the new cap).
        let current_s = probe.planner(probe.cap()).unwrap().predict(&current);
        // The model was measured 1.5× the predicted gain off on the job's moves: the gain is
        // not trusted as a prediction...
        let error = 1.5 * gain / current_s;
        c.state.move_changes = vec![error; 4];
        c.state.steady_changes = vec![0.0; 4];
        c.gamma = 1e3;
        let action = c.decide(&record(0, 4.0, seconds), &current).unwrap();
        let d = action.decision.clone().unwrap();
        // ... but worth a trial, priced as the normal partial expectation with σ = error·√(π/2)
        // from the four moves, shrunk toward the prior weighed as three.
        assert!(d.admitted && d.reason.contains("a trial"), "{d:?}");
        let p = d.admission.unwrap();
        let sigma = (3.0 * c.plan_error + 4.0 * error * (std::f64::consts::PI / 2.0).sqrt()) / 7.0;
        assert_eq!(p.delta_l_s, Some(gain), "the fastest target, as the probe saw it");
        let want = Odds::of(current_s, current_s - gain, sigma).gain;
        assert!((p.expected_gain_s.unwrap() - want).abs() < 1e-9 * want, "{p:?} vs {want}");
        let target = action.target.expect("the trial moves");
        // The trial's plan runs half again as long as the plan it left did: back at once, on
        // what the job measured on both (looked up at the lengths they ran, not the cap).
        let back = c.decide(&record(1, 4.0, 1.5 * seconds), &target).unwrap();
        let d = back.decision.unwrap();
        assert_eq!(d.trigger, vec![Trigger::Regret], "{d:?}");
        assert!(d.admitted && d.reason.starts_with("measured on both plans"), "{d:?}");
        assert_eq!(back.target, Some(current));
    }

    #[test]
    fn a_move_that_does_not_pay_is_undone_across_a_pool_change() {
        let (mut c, eight) = controller_with(1, |p| p.latency_drift = 100.0);
        c.gamma = 1e3;
        // The plan of the whole pool ran as the starting model predicts: its shape is measured.
        let reference = c.reference(7).unwrap();
        c.decide(&record(0, 7.0, reference.predict(&eight)), &eight).unwrap();
        // The pool shrank to 6 ranks and the job moved to a plan of another shape there.
        let moved = half_pool_plan();
        assert!(!same_shape(&moved, &eight), "the move changed the shape");
        c.state.gpus = 6;
        c.state.monitor.set_pool(6);
        c.state.unseen_plan = true;
        c.leave(0, &eight);
        // The plan left cannot run on 6 ranks; its layouts can, and what its shape measured says
        // they would run this step's lengths faster by half than the plan moved to does.
        let back = c.on_pool(&c.planner(c.cap()).unwrap(), &eight).expect("its layouts fit 6 ranks");
        assert!(eight.validate(6).is_err() && back.validate(6).is_ok());
        let expected = c.reference(7).unwrap().predict(&back);
        let step = StepRecord { pool_size: Some(6), ..record(1, 7.0, 1.5 * expected) };
        let action = c.decide(&step, &moved).unwrap();
        let d = action.decision.unwrap();
        assert_eq!(d.trigger, vec![Trigger::Regret], "{d:?}");
        assert!(d.admitted && d.reason.starts_with("measured on both plans"), "{d:?}");
        assert_eq!(action.target, Some(back), "back to the layouts it left, on the pool now");
    }

    #[test]
    fn a_shape_that_measured_faster_at_other_lengths_is_revisited_on_its_carried_measurement() {
        for (ratio, revisited) in [(0.3, true), (1.0, false)] {
            let (mut c, eight) = controller_with(1, |p| p.latency_drift = 100.0);
            // Another shape on the same layouts (the generation's micro-batch) ran 4-token
            // responses at `ratio` times the starting model's seconds.
            let mut other = eight.clone();
            other.placements[0].candidate.micro_batch = 4;
            assert!(!same_shape(&other, &eight));
            c.state.memory.record(&other, ratio, 4.0, 0, c.length_drift);
            // The plan in force runs 7-token responses (past δ_len from 4) as predicted.
            let seconds = c.reference(7).unwrap().predict(&eight);
            let action = c.decide(&record(1, 7.0, seconds), &eight).unwrap();
            if !revisited {
                assert!(action.target.is_none() && action.decision.is_none(), "ratio {ratio}: {:?}", action.decision);
                continue;
            }
            let d = action.decision.expect("a revisit");
            assert_eq!(d.trigger, vec![Trigger::Revisit], "{d:?}");
            assert!(d.admitted && d.reason.starts_with("measured on both plans (the target's at 4 tokens)"), "{d:?}");
            assert_eq!(action.target, Some(other), "the shape it ran, on the pool now");
        }
    }

    #[test]
    fn a_quiet_best_plan_is_tried_against_each_neighbour_once_and_kept_when_they_run_slower() {
        let (mut c, best) = controller_with(1, |p| p.latency_drift = 100.0);
        let seconds = c.planner(8).unwrap().predict(&best);
        // The model was measured 30% off on moves: its ranking of near plans is not to be trusted.
        c.state.move_changes = vec![0.3; 4];
        c.state.steady_changes = vec![0.0; 4];
        let candidates = |p: &Plan| p.placements.iter().map(|x| x.candidate).collect::<Vec<_>>();
        let (mut current, mut tried, mut trial_at) = (best.clone(), Vec::new(), None);
        for step in 0..60 {
            // Every neighbour runs half again as long as the best plan.
            let slower = if current == best { 1.0 } else { 1.5 };
            let action = c.decide(&record(step, 7.0, slower * seconds), &current).unwrap();
            match action.decision.as_ref().map(|d| (d.trigger.as_slice(), d.admitted)) {
                Some(([Trigger::Trial], true)) => {
                    assert_eq!(current, best, "step {step}: tried from the best plan only");
                    assert!(trial_at.is_none_or(|t| step >= t + 3), "step {step}: the plan held two steps");
                    let target = action.target.clone().unwrap();
                    assert!(!tried.contains(&candidates(&target)), "step {step}: tried twice");
                    tried.push(candidates(&target));
                    trial_at = Some(step);
                }
                Some(([Trigger::Regret], true)) => {
                    assert_eq!(trial_at, Some(step - 1), "left on the trial's first step");
                    assert_eq!(action.target.as_ref(), Some(&best));
                }
                other => assert!(other.is_none(), "step {step}: {:?}", action.decision),
            }
            if let Some(target) = action.target {
                current = target;
            }
        }
        assert!(!tried.is_empty(), "no neighbour was tried");
        assert!(trial_at.unwrap() < 50, "the neighbours ran out: the best plan stays");
        assert_eq!(current, best);
    }

    #[test]
    fn before_any_move_is_measured_the_prior_prices_trials_and_a_prior_of_zero_prices_none() {
        for (prior, expected) in [(0.0, false), (0.3, true)] {
            let (mut c, best) = controller_with(1, |p| {
                p.latency_drift = 100.0;
                p.plan_error = prior;
            });
            let seconds = c.planner(8).unwrap().predict(&best);
            let (mut current, mut first_trial) = (best.clone(), None);
            for step in 0..30 {
                let slower = if current == best { 1.0 } else { 1.5 };
                let moves_before = c.state.move_changes.len();
                let action = c.decide(&record(step, 7.0, slower * seconds), &current).unwrap();
                if let Some(d) = action.decision.as_ref().filter(|d| d.admitted && d.trigger == [Trigger::Trial]) {
                    first_trial.get_or_insert((moves_before, d.reason.clone()));
                }
                if let Some(target) = action.target {
                    current = target;
                }
            }
            assert_eq!(first_trial.is_some(), expected, "prior {prior}: {first_trial:?}");
            if let Some((moves, reason)) = first_trial {
                assert_eq!(moves, 0, "the first trial came before any move was measured");
                assert!(reason.contains("σ = 30.0% (prior 30.0%, 0 moves measured)"), "{reason}");
            }
        }
    }

    #[test]
    fn a_controller_restored_from_its_saved_state_decides_as_the_uninterrupted_one() {
        // Lengths that drift, a pool that shrinks and grows back, step times off the model.
        let steps: Vec<(f64, u32, f64)> = (0..24)
            .map(|k| {
                let len = [4.0, 6.0, 9.0, 12.0, 16.0][(k / 5) as usize % 5];
                let pool = if (8..14).contains(&k) { 6 } else { 8 };
                (len, pool, 1.0 + 0.2 * ((k * 7) % 5) as f64)
            })
            .collect();
        let run = |c: &mut Controller, plan: &mut Plan, from: usize, to: usize| -> Vec<Option<Decision>> {
            (from..to)
                .map(|k| {
                    let (len, pool, wobble) = steps[k];
                    let seconds = c.planner(c.cap()).unwrap().predict(plan) * wobble;
                    let m = StepRecord { pool_size: Some(pool), ..record(k as u64, len, seconds) };
                    let a = c.decide(&m, plan).unwrap();
                    if let Some(t) = a.target {
                        *plan = t;
                        c.transitioned(0.5, 0.4);
                    }
                    a.decision
                })
                .collect()
        };
        let (mut whole, start) = controller(1);
        let mut plan = start.clone();
        let uninterrupted = run(&mut whole, &mut plan, 0, 24);
        assert!(uninterrupted.iter().flatten().count() >= 3, "{uninterrupted:?}");
        let (mut first, _) = controller(1);
        let mut plan = start;
        let mut resumed = run(&mut first, &mut plan, 0, 11);
        // The checkpoint: the state as JSON, read back into a new controller.
        let saved: ControllerState = serde_json::from_str(&serde_json::to_string(first.state()).unwrap()).unwrap();
        assert_eq!(&saved, first.state());
        let at_checkpoint = plan.clone();
        let (mut second, _) = controller(1);
        second.restore(saved);
        resumed.extend(run(&mut second, &mut plan, 11, 24));
        assert_eq!(resumed, uninterrupted);
        // A controller starting afresh at the checkpoint decides otherwise.
        let (mut fresh, _) = controller(1);
        let mut plan = at_checkpoint;
        assert_ne!(run(&mut fresh, &mut plan, 11, 24), uninterrupted[11..]);
    }
}
