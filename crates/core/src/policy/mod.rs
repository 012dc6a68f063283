//! The controller's decisions, pure (paper §4): what the monitor saw, which triggers fire, and
//! whether a replanned target is admitted. No MPI, no clocks: the runtime gathers the
//! observations at a step boundary and acts on the [`Decision`].
//!
//! - [`Monitor`]: per drifting signal a reference (reset after every replan, admitted or not)
//!   and a horizon `H_x`, the exponential moving average of the steps between threshold
//!   crossings (updated at crossings only; 1 before the first interval).
//! - Triggers (docs/operations.md, "The controller", says where each comes from): a pool that
//!   shrinks (a rank lost) and a predicted memory violation are urgent; a pool that grows, a
//!   signal whose relative drift from its reference passes its threshold, and a standing gap (the
//!   plan in force is not the planner's best, kept under watch by the controller) are
//!   opportunistic. Under payback admission, a response length that jumps past its threshold
//!   from one observation to the next (a burst) fires only when the next observation confirms
//!   it (hysteresis).
//! - [`admit`]: urgent targets are taken (profitability waived); opportunistic ones when
//!   `ΔL > 0` and `L_tran / ΔL ≤ γ · H` (the smallest `H` of the triggers that fired), by mode.

use serde::{Deserialize, Serialize};

use crate::config::PolicyMode;

pub mod controller;
mod decision;
pub mod memory;
pub mod trial;

pub use decision::{Admission, Decision, TransitionKind};

/// Weight of the newest interval in a horizon's moving average.
const HORIZON_SMOOTHING: f64 = 0.5;

/// A signal the monitor watches for drift.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Signal {
    /// Mean response length of the step.
    ResponseLength,
    /// Measured step seconds against the current plan's prediction (calibration drift).
    StepLatency,
}

impl Signal {
    /// Every drifting signal.
    pub const ALL: [Signal; 2] = [Signal::ResponseLength, Signal::StepLatency];
}

/// Why a replan happened.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Trigger {
    /// The pool shrank, or a rank was lost: the plan's ranks are not all there any more.
    PoolShrink,
    /// The next step is predicted not to fit under the current plan.
    MemoryViolation,
    /// The pool grew: faster plans may now exist (the GPU pool's horizon prices them).
    PoolGrowth,
    /// A signal drifted past its threshold.
    Drift(Signal),
    /// The plan in force has stayed short of the planner's best (a rejected target, a fallback,
    /// a blocked transition): offered again, priced with the standing horizon.
    StandingGap,
    /// The plan an opportunistic move entered measured slower than the plan it left: going back
    /// is offered, priced on both plans' measurements ([`memory`]).
    Regret,
    /// A plan shape the job ran at other lengths, its measurement carried to the lengths now
    /// ([`memory::PlanMemory::carried`]), is expected faster than the plan in force measured
    /// by more than the model is trusted on plans: going back to it is offered.
    Revisit,
    /// The plan in force has held and a plan one layout away, which the model ranks a little
    /// slower, is expected to run faster by more than a trial costs ([`trial`]).
    Trial,
    /// `every-k`: the k-th step since the last switch.
    Schedule,
}

impl Trigger {
    /// Whether the current plan cannot go on (profitability waived).
    pub fn is_urgent(self) -> bool {
        matches!(self, Trigger::PoolShrink | Trigger::MemoryViolation)
    }
}

/// What one step boundary showed (rank 0's view, gathered from every rank).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Observation {
    /// The step just finished (0-based).
    pub step: u64,
    /// Its mean response length.
    pub response_len: f64,
    /// Its measured seconds.
    pub step_seconds: f64,
    /// The current plan's predicted seconds for it.
    pub predicted_seconds: f64,
    /// Ranks available now.
    pub pool: u32,
    /// Whether the next step, at the length trend, is predicted to pass some rank's memory.
    pub memory_violation: bool,
}

impl Observation {
    fn value(&self, signal: Signal) -> f64 {
        match signal {
            Signal::ResponseLength => self.response_len,
            // The ratio of measured to predicted: its reference is what calibration last saw.
            Signal::StepLatency => self.step_seconds / self.predicted_seconds.max(1e-12),
        }
    }
}

/// Drift thresholds per signal.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Thresholds {
    /// Relative change of the mean response length (`δ_len`).
    pub response_length: f64,
    /// Relative change of measured over predicted step seconds.
    pub step_latency: f64,
}

impl Thresholds {
    fn of(&self, signal: Signal) -> f64 {
        match signal {
            Signal::ResponseLength => self.response_length,
            Signal::StepLatency => self.step_latency,
        }
    }
}

/// One signal's reference and horizon.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Track {
    /// The value at the last replan (or the first observation).
    pub reference: Option<f64>,
    /// Step of the last threshold crossing.
    pub last_crossing: Option<u64>,
    /// Step whose observation set the reference (the first one, or the last replan's).
    pub reference_step: Option<u64>,
    /// `H_x`: moving average of the steps between crossings.
    pub horizon: f64,
    /// The value at the last observation (what a jump is measured from).
    #[serde(default)]
    pub last: Option<f64>,
    /// Whether the last observation crossed by a jump that waits for the next to confirm it
    /// (hysteresis on bursts, response length only).
    #[serde(default)]
    pub pending: bool,
}

impl Default for Track {
    fn default() -> Self {
        Track { reference: None, last_crossing: None, reference_step: None, horizon: 1.0, last: None, pending: false }
    }
}

/// References and horizons of every signal, and the pool last seen with its own horizon.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Monitor {
    thresholds: Thresholds,
    tracks: [Track; 2],
    pool: Option<u32>,
    /// When the pool changed (`last_crossing`) and `H_pool`, the moving average of the steps
    /// between changes (the GPU pool's horizon, paper §4).
    #[serde(default)]
    pool_track: Track,
    /// Whether a response length's jump waits for the next observation ([`Monitor::with_hysteresis`]).
    #[serde(default)]
    hysteresis: bool,
}

impl Monitor {
    /// A monitor with no reference yet (the first observation sets them).
    pub fn new(thresholds: Thresholds) -> Monitor {
        Monitor {
            thresholds,
            tracks: [Track::default(); 2],
            pool: None,
            pool_track: Track::default(),
            hysteresis: false,
        }
    }

    /// This monitor with hysteresis on response-length bursts: a length that jumps past its
    /// threshold from one observation to the next fires only when the next observation still
    /// crosses (payback admission's monitor; the baselines fire on every crossing, as built).
    pub fn with_hysteresis(self) -> Monitor {
        Monitor { hysteresis: true, ..self }
    }

    /// A signal's reference and horizon.
    pub fn track(&self, signal: Signal) -> Track {
        self.tracks[signal as usize]
    }

    /// Looks at one step: which triggers fire (urgent ones first). A crossing updates its
    /// signal's horizon; references stay until [`Monitor::replanned`].
    pub fn observe(&mut self, o: &Observation) -> Vec<Trigger> {
        let mut fired = Vec::new();
        match self.pool {
            Some(p) if o.pool < p => fired.push(Trigger::PoolShrink),
            Some(p) if o.pool > p => fired.push(Trigger::PoolGrowth),
            _ => {}
        }
        if self.pool.is_some_and(|p| p != o.pool) {
            let track = &mut self.pool_track;
            let since = track.last_crossing.or(track.reference_step).filter(|&s| s < o.step);
            if let Some(since) = since {
                track.horizon = HORIZON_SMOOTHING * (o.step - since) as f64 + (1.0 - HORIZON_SMOOTHING) * track.horizon;
            }
            track.last_crossing = Some(o.step);
        }
        self.pool_track.reference_step.get_or_insert(o.step);
        self.pool = Some(o.pool);
        if o.memory_violation {
            fired.push(Trigger::MemoryViolation);
        }
        for signal in Signal::ALL {
            let threshold = self.thresholds.of(signal);
            let value = o.value(signal);
            let track = &mut self.tracks[signal as usize];
            track.reference_step.get_or_insert(o.step);
            let last = track.last.replace(value);
            let Some(reference) = track.reference else {
                track.reference = Some(value);
                continue;
            };
            if (value - reference).abs() / reference.abs().max(1e-12) <= threshold {
                track.pending = false;
                continue;
            }
            // Hysteresis: a length that jumped past the threshold from the last observation at
            // once (a burst of long responses does, a trend does not) fires only when the next
            // observation still crosses; a burst that passes fires nothing.
            let jump = last.is_some_and(|l| (value - l).abs() / l.abs().max(1e-12) > threshold);
            if self.hysteresis && signal == Signal::ResponseLength && jump && !track.pending {
                track.pending = true;
                continue;
            }
            track.pending = false;
            // Steps the signal stayed within its threshold: since the last crossing, or, before
            // the first, since the reference was observed — the first crossing already says how
            // long a plan lasts, and without it the first admission would have a horizon of 1.
            let since = track.last_crossing.or(track.reference_step).filter(|&s| s < o.step);
            if let Some(since) = since {
                let interval = (o.step - since) as f64;
                track.horizon = HORIZON_SMOOTHING * interval + (1.0 - HORIZON_SMOOTHING) * track.horizon;
            }
            track.last_crossing = Some(o.step);
            fired.push(Trigger::Drift(signal));
        }
        fired
    }

    /// Sets the pool the current plan was made for (before any observation), so that a pool
    /// that differs at the first boundary is a change like any later one.
    pub fn set_pool(&mut self, pool: u32) {
        self.pool = Some(pool);
    }

    /// Sets `signal`'s reference: what the current plan was made for (before any observation).
    pub fn set_reference(&mut self, signal: Signal, value: f64) {
        self.tracks[signal as usize].reference = Some(value);
    }

    /// After a replan (admitted or not): every reference becomes the current value.
    pub fn replanned(&mut self, o: &Observation) {
        for signal in Signal::ALL {
            let track = &mut self.tracks[signal as usize];
            track.reference = Some(o.value(signal));
            track.reference_step = Some(o.step);
        }
    }

    /// The horizon the admission uses for `triggers` at `step`: the smallest `H_x` of the
    /// signals that fired, `H_pool` for a pool's growth, and the standing horizon for a standing
    /// gap; 1 when none of these.
    pub fn horizon(&self, triggers: &[Trigger], step: u64) -> f64 {
        triggers
            .iter()
            .filter_map(|t| match t {
                Trigger::Drift(s) => Some(self.tracks[*s as usize].horizon),
                Trigger::PoolGrowth => Some(self.pool_track.horizon),
                Trigger::StandingGap | Trigger::Regret | Trigger::Revisit | Trigger::Trial => {
                    Some(self.standing_horizon(step))
                }
                _ => None,
            })
            .fold(None, |best: Option<f64>, h| Some(best.map_or(h, |b| b.min(h))))
            .unwrap_or(1.0)
    }

    /// How long the conditions a plan is made for are expected to hold from `step` on: per
    /// signal and for the pool, the larger of its horizon and the steps since it last crossed
    /// (a signal quiet for longer than its average interval has shown it lasts longer), the
    /// smallest of these. It grows by one a step while nothing crosses.
    pub fn standing_horizon(&self, step: u64) -> f64 {
        self.tracks
            .iter()
            .chain(std::iter::once(&self.pool_track))
            .map(|t| {
                let quiet = t.last_crossing.or(t.reference_step).map_or(0, |s| step.saturating_sub(s));
                t.horizon.max(quiet as f64)
            })
            .fold(f64::INFINITY, f64::min)
            .max(1.0)
    }
}

/// What the admission was asked.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Proposal {
    /// Whether a trigger was urgent.
    pub urgent: bool,
    /// `ΔL = L̂(S) − L̂(S*)`, seconds per step (infinite when the current plan no longer fits).
    pub delta_l_s: f64,
    /// `L̂_tran`, seconds.
    pub l_tran_s: f64,
    /// The current plan's predicted step seconds.
    pub current_s: f64,
    /// `H` of the triggers.
    pub horizon: f64,
    /// Whether the target changes a model-stage's TP/PP layout (static mode refuses those).
    pub changes_layout: bool,
    /// Whether the pool grew (static mode follows it with DP).
    pub pool_growth: bool,
    /// Whether `ΔL` comes from the job's measurements of both plans rather than the model.
    pub measured: bool,
    /// When the move was priced as a trial ([`trial`]): its expected improvement per step.
    pub trial_gain_s: Option<f64>,
}

/// The verdict.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Verdict {
    /// Whether the target is taken.
    pub admitted: bool,
    /// How, when admitted.
    pub kind: Option<TransitionKind>,
    /// Why, in words.
    pub reason: String,
}

/// Admission under `mode` with payback factor `gamma` and the smallest relative gain trusted,
/// `gain_threshold` (see `Controller::gain_threshold`).
pub fn admit(mode: PolicyMode, p: &Proposal, gamma: f64, gain_threshold: f64) -> Verdict {
    let yes = |kind: TransitionKind, reason: String| Verdict { admitted: true, kind: Some(kind), reason };
    let no = |reason: String| Verdict { admitted: false, kind: None, reason };
    if mode == PolicyMode::Static && p.changes_layout {
        return no("static policy: the TP/PP layouts never change".into());
    }
    if p.urgent {
        return yes(TransitionKind::Urgent, "the current plan cannot continue".into());
    }
    // NaN (nothing comparable) counts as no gain.
    if p.delta_l_s.partial_cmp(&0.0) != Some(std::cmp::Ordering::Greater) {
        return no(format!("no gain: ΔL = {:.4} s", p.delta_l_s));
    }
    match mode {
        PolicyMode::Off => no("policy off".into()),
        PolicyMode::Greedy | PolicyMode::EveryK => {
            yes(TransitionKind::Opportunistic, format!("ΔL = {:.4} s > 0", p.delta_l_s))
        }
        // The baseline's DP follows the pool (a shrink is urgent, a growth taken as it comes)
        // and nothing else moves it.
        PolicyMode::Static if p.pool_growth => {
            yes(TransitionKind::Opportunistic, "static policy: DP follows the pool".into())
        }
        PolicyMode::Static => no("static policy: only a pool change moves DP".into()),
        PolicyMode::Nereus => {
            if gamma == 0.0 {
                return no("γ = 0 admits urgent transitions only".into());
            }
            if p.delta_l_s < gain_threshold * p.current_s {
                return no(format!(
                    "gain {:.1}% below the trusted gain {:.1}%",
                    100.0 * p.delta_l_s / p.current_s,
                    100.0 * gain_threshold
                ));
            }
            let payback = p.l_tran_s / p.delta_l_s;
            let budget = gamma * p.horizon;
            if payback <= budget {
                yes(TransitionKind::Opportunistic, format!("pays back in {payback:.2} steps ≤ γ·H = {budget:.2}"))
            } else {
                no(format!("pays back in {payback:.2} steps > γ·H = {budget:.2}"))
            }
        }
    }
}

#[cfg(test)]
mod tests;
