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

use super::{admit, Admission, Decision, Monitor, Observation, Proposal, Signal, Thresholds, Trigger, Verdict};
use crate::config::{JobConfig, PolicyMode};
use crate::cost::{Efficiencies, StageSample};
use crate::plan::Plan;
#[cfg(test)]
use crate::planner::initial_plan;
use crate::planner::{Planner, PlannerError, StepSeconds};
use crate::transition::{cheaper_targets, choose, global::Links, TargetChoice};
use crate::units::format_bytes;

/// Cheaper targets tried after a rejection (each costs a DAG; the decision stays within
/// milliseconds at 1,024 GPUs).
const MAX_CHEAPER_TARGETS: usize = 2;

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
    /// Measured wall seconds per phase (`None` where nothing was measured: a simulated step).
    pub stage_seconds: Option<StepSeconds>,
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
#[derive(Debug, Clone, Copy)]
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

/// The controller's state between steps (on rank 0 in a live job).
pub struct Controller {
    mode: PolicyMode,
    gamma: f64,
    min_gain: f64,
    every_k: u64,
    /// Steps between monitor evaluations (`policy.monitor_interval_steps`).
    monitor_interval: u64,
    length_drift: f64,
    max_len: u32,
    host_bytes_per_s: f64,
    monitor: Monitor,
    base: Planner,
    /// The static baseline's planner: the layouts it started with, DP following the pool.
    fixed: Option<Planner>,
    efficiencies: Efficiencies,
    samples: Vec<StageSample>,
    cap: u32,
    /// Ranks in the pool (the planner's device count).
    gpus: u32,
    /// Ranks lost so far (sorted); the planner's ranks skip them.
    lost: Vec<u32>,
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
}

impl Controller {
    /// A controller for `config` starting at response cap `cap`; `base` is the job's planner.
    pub fn new(config: &JobConfig, base: Planner, cap: u32) -> Controller {
        let p = &config.policy;
        let mut monitor = Monitor::new(Thresholds { response_length: p.length_drift, step_latency: p.latency_drift });
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
            every_k: u64::from(p.every_k),
            monitor_interval: u64::from(p.monitor_interval_steps.max(1)),
            length_drift: p.length_drift,
            max_len: config.rl.max_response_len,
            host_bytes_per_s: config.cluster.host_link_gbps * 1e9,
            monitor,
            efficiencies: base.cost().efficiencies,
            gpus: base.cost().hardware.devices,
            lost: Vec::new(),
            base,
            fixed: None,
            samples: Vec::new(),
            cap,
            last_switch: 0,
            latency_ratio: None,
            transition_seconds: (0.0, 0.0),
            unseen_plan: false,
            last_step: None,
            move_changes: Vec::new(),
            steady_changes: Vec::new(),
        }
    }

    /// The smallest relative gain admitted: `policy.min_gain`, raised to the cost model's
    /// measured error on the moves it predicted — how much more its measured-over-predicted
    /// ratio changed on the first step of a plan a transition entered than it changes from one
    /// step to the next on one plan (means over the last [`TRUST_WINDOW`] of each). A gain the
    /// model cannot resolve is noise: an exact model earns every gain that pays back, a model
    /// 10% off on new plans needs gains above 10%.
    pub fn gain_threshold(&self) -> f64 {
        let mean = |v: &[f64]| if v.is_empty() { 0.0 } else { v.iter().sum::<f64>() / v.len() as f64 };
        let measured = if self.move_changes.is_empty() {
            0.0
        } else {
            (mean(&self.move_changes) - mean(&self.steady_changes)).max(0.0)
        };
        self.min_gain.max(measured)
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
        let len = m.response_len_p95.ceil().clamp(1.0, f64::from(self.max_len)) as u32;
        let predicted = self.planner(len)?.predict(current);
        let now = Some(m.step_seconds / predicted).filter(|r| r.is_finite() && *r > 0.0);
        let moved = std::mem::take(&mut self.unseen_plan);
        let near = |a: f64, b: f64| (a / b - 1.0).abs() <= COMPARABLE_LENGTHS;
        if let (Some(before), Some(now)) = (&self.last_step, now) {
            if near(m.response_len_mean, before.mean_len) && near(m.response_len_p95, before.p95_len) {
                let changes = if moved { &mut self.move_changes } else { &mut self.steady_changes };
                changes.push((now / before.ratio - 1.0).abs());
                let excess = changes.len().saturating_sub(TRUST_WINDOW);
                changes.drain(..excess);
            }
        }
        self.last_step = now.map(|ratio| RatioAt { ratio, mean_len: m.response_len_mean, p95_len: m.response_len_p95 });
        Ok(())
    }

    /// The planner for the pool at response cap `len` with the current calibration.
    fn planner(&self, len: u32) -> Result<Planner, PlannerError> {
        self.fixed.as_ref().unwrap_or(&self.base).replanned(self.gpus, u64::from(len), self.efficiencies)
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
            self.transition_seconds.0 += predicted_s;
            self.transition_seconds.1 += measured_s;
        }
    }

    /// Measured over predicted transition seconds so far (1 before any prediction was tested).
    fn transition_ratio(&self) -> f64 {
        let (predicted, measured) = self.transition_seconds;
        if predicted > 0.0 {
            measured / predicted
        } else {
            1.0
        }
    }

    /// `plan` on the world's ranks as the planner sees it: the ranks that are not lost,
    /// renumbered `0, 1, …` in order (the identity while no rank is lost).
    fn to_virtual(&self, plan: &Plan) -> Plan {
        plan.map_ranks(|r| r - self.lost.iter().filter(|&&l| (l as i32) < r).count() as i32)
    }

    /// The inverse of [`Controller::to_virtual`]: the planner's rank `v` is the `v`-th rank
    /// that is not lost.
    fn to_physical(&self, plan: &Plan) -> Plan {
        plan.map_ranks(|v| {
            let mut r = v;
            for &l in &self.lost {
                if (l as i32) <= r {
                    r += 1;
                }
            }
            r
        })
    }

    /// The response cap the engine is sized for now.
    pub fn cap(&self) -> u32 {
        self.cap
    }

    /// The efficiencies the cost model runs with now (the running calibration).
    pub fn efficiencies(&self) -> Efficiencies {
        self.efficiencies
    }

    /// Decides after the step `m` records, under the `current` plan.
    pub fn decide(&mut self, m: &StepRecord, current: &Plan) -> Result<Action, PlannerError> {
        if self.mode == PolicyMode::Static && self.fixed.is_none() {
            // The static baseline keeps the layouts it started with; DP follows the pool.
            self.fixed = Some(self.base.keeping_layouts(current));
        }
        let step = m.step;
        let lost_now = m.lost_ranks != self.lost;
        self.lost.clone_from(&m.lost_ranks);
        let current = &self.to_virtual(current);
        self.test_the_model(current, m)?;
        let now = self.planner(self.cap)?;
        self.calibrate(&now, current, m);
        let now = self.planner(self.cap)?;
        let predicted = now.predict(current);
        // Responses reached the cap: it must grow, by δ_len, within the job's limit.
        let cut = m.response_len_p95 >= f64::from(self.cap) && self.cap < self.max_len;
        let grown = if cut { self.grow(self.cap) } else { self.cap };
        let usable = now.cost().hardware.usable_bytes();
        let violation = grown > self.cap && self.planner(grown)?.rank_peaks(current).max().0 > usable;
        let ratio = m.step_seconds / predicted.max(1e-12);
        let smoothed = self.latency_ratio.map_or(ratio, |r| LATENCY_SMOOTHING * ratio + (1.0 - LATENCY_SMOOTHING) * r);
        self.latency_ratio = Some(smoothed);
        let pool = m.pool_size.unwrap_or(self.gpus);
        // Between monitor evaluations only what cannot wait is looked at: memory and the pool.
        if !(step + 1).is_multiple_of(self.monitor_interval) && !violation && pool == self.gpus && !lost_now {
            self.cap = grown;
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
        let mut triggers = self.monitor.observe(&observation);
        self.gpus = observation.pool;
        if lost_now && !triggers.contains(&Trigger::PoolChange) {
            // Ranks were lost: the same count may now name other ranks.
            triggers.insert(0, Trigger::PoolChange);
        }
        if self.mode == PolicyMode::EveryK && (step + 1 - self.last_switch).is_multiple_of(self.every_k) {
            triggers.push(Trigger::Schedule);
        }
        if triggers.is_empty() {
            // Nothing to replan; a cap that grows within the current plan's memory just grows.
            self.cap = grown;
            return Ok(self.action(None, None, None));
        }
        let len = self.grow(self.cap).min(self.sized(m.response_len_p95)).max(grown);
        self.replan(step, &triggers, &observation, current, len)
    }

    /// Replans at response cap `len` and admits or rejects the target.
    fn replan(
        &mut self,
        step: u64,
        triggers: &[Trigger],
        observation: &Observation,
        current: &Plan,
        len: u32,
    ) -> Result<Action, PlannerError> {
        self.monitor.replanned(observation);
        let planner = match self.planner(len) {
            Ok(p) => p,
            Err(e) => return Ok(self.stopping(triggers, format!("no plan fits the next steps: {e}"))),
        };
        let links = Links::of(&planner.cost().hardware, Some(self.host_bytes_per_s));
        let choice = match choose(&planner, current, &links) {
            Ok(c) => c,
            Err(e) => return Ok(self.no_plan(triggers, current, len, e)),
        };
        let current_fits = choice.current_seconds.is_finite();
        let urgent = triggers.iter().any(|t| t.is_urgent()) || !current_fits;
        let (mut proposal, mut verdict) = self.judge(&choice, current, triggers, urgent);
        let mut choice = choice;
        if !verdict.admitted && !choice.keep {
            // A rejected target falls back to slower ones with cheaper transitions first.
            let alternatives: Vec<TargetChoice> =
                cheaper_targets(&planner, current, &choice, &links).take(MAX_CHEAPER_TARGETS).collect();
            for alternative in alternatives {
                let (p, mut v) = self.judge(&alternative, current, triggers, urgent);
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
        if verdict.admitted {
            self.cap = len;
            self.last_switch = step + 1;
            let target = (choice.target.plan() != *current).then(|| self.to_physical(&choice.target.plan()));
            self.unseen_plan = target.is_some();
            return Ok(self.action(target, decision, None));
        }
        // Rejected, and the current plan fits the new cap: keep the plan, size the cap.
        self.cap = len;
        Ok(self.action(None, decision, None))
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
        if let Err(e) = current.validate(self.gpus) {
            return format!(
                "{}; the pool of {} ranks no longer holds the current plan ({e}); {advice}",
                verdict.reason, self.gpus
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

    /// The admission's question about `choice` and its answer.
    fn judge(&self, choice: &TargetChoice, current: &Plan, triggers: &[Trigger], urgent: bool) -> (Proposal, Verdict) {
        let changes_layout = choice.target.plan().placements.iter().zip(&current.placements).any(|(a, b)| {
            (a.candidate.layout, a.candidate.model_stage) != (b.candidate.layout, b.candidate.model_stage)
        });
        let proposal = Proposal {
            urgent,
            delta_l_s: choice.delta_l_s,
            l_tran_s: choice.l_tran_s * self.transition_ratio(),
            current_s: choice.current_seconds,
            horizon: self.monitor.horizon(triggers),
            changes_layout,
        };
        let verdict = if choice.keep {
            Verdict {
                admitted: false,
                kind: None,
                reason: choice.blocked_reason.clone().unwrap_or_else(|| "the current plan is still the fastest".into()),
            }
        } else {
            admit(self.mode, &proposal, self.gamma, self.gain_threshold())
        };
        (proposal, verdict)
    }

    /// Folds the step's measured stages into the running calibration.
    fn calibrate(&mut self, planner: &Planner, current: &Plan, m: &StepRecord) {
        if let Some(measured) = &m.stage_seconds {
            for (phase, (_, ideal)) in planner.stage_parts(current).iter() {
                self.samples.push(StageSample { ideal: *ideal, measured: *measured.get(phase) });
            }
        }
        let excess = self.samples.len().saturating_sub(CALIBRATION_WINDOW);
        self.samples.drain(..excess);
        let mut e = self.efficiencies;
        e.fit_stages(&self.samples);
        self.efficiencies = e;
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
            .then(|| self.base.replanned(self.gpus, u64::from(len), self.efficiencies).ok())
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
                l_tran_s: finite(p.l_tran_s),
                l_tran_calibration: self.transition_ratio(),
                h_x: p.horizon,
                gamma: self.gamma,
                gain_threshold: self.gain_threshold(),
                mode: self.mode,
            }),
        })
    }

    fn action(&self, target: Option<Plan>, decision: Option<Decision>, stop: Option<String>) -> Action {
        Action { target, cap: self.cap, pool: self.gpus, efficiencies: self.efficiencies, decision, stop }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::{ConfigSource, Overrides, RawJobConfig};
    use crate::plan::Placement;

    /// The embedded tiny PPO job under the controller, responses planned for 8 tokens.
    fn controller(interval: u32) -> (Controller, Plan) {
        let source = ConfigSource::embedded_default();
        let raw = RawJobConfig::parse(&source).unwrap();
        let mut config = raw.resolve(&source, &Overrides::default(), &mut || unreachable!()).unwrap();
        config.policy.mode = PolicyMode::Nereus;
        config.policy.initial_response_len = 8;
        config.policy.monitor_interval_steps = interval;
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
        c.unseen_plan = true;
        c.decide(&record(1, 7.0, 1.25 * 1.3 * predicted(&c)), &plan).unwrap();
        close(&c, 0.25);
        // ... less what steps on one plan change anyway (10% here) ...
        c.decide(&record(2, 7.0, 1.1 * 1.25 * 1.3 * predicted(&c)), &plan).unwrap();
        close(&c, 0.25 - 0.1);
        // ... and the next move's as predicted: the mean of the moves' changes (12.5%) less
        // the steady steps' (10%), never below min_gain.
        c.unseen_plan = true;
        c.decide(&record(3, 7.0, 1.1 * 1.25 * 1.3 * predicted(&c)), &plan).unwrap();
        close(&c, floor.max(0.125 - 0.1));
        // A move across a length change (7 to 14 tokens) tests the length scaling, not the move.
        c.unseen_plan = true;
        c.decide(&record(4, 14.0, 5.0 * predicted(&c)), &plan).unwrap();
        close(&c, floor.max(0.125 - 0.1));
        assert!(!c.unseen_plan);
    }

    #[test]
    fn plans_skip_lost_ranks_and_come_back_unchanged() {
        let (mut c, plan) = controller(1);
        c.lost = vec![2, 5];
        let physical = c.to_physical(&plan);
        let used: Vec<i32> = physical.placements.iter().flat_map(|p| p.ranks.clone()).collect();
        assert!(!used.contains(&2) && !used.contains(&5), "{used:?}");
        // Planner rank 2 is world rank 3, planner rank 4 is world rank 6.
        let map = |v: i32| Plan { placements: vec![Placement { ranks: vec![v], ..plan.placements[0].clone() }] };
        assert_eq!(c.to_physical(&map(2)), map(3));
        assert_eq!(c.to_physical(&map(4)), map(6));
        assert_eq!(c.to_virtual(&physical), plan);
    }
}
