//! `[policy]`: when the runtime replans and which transitions it admits.

use serde::{Deserialize, Serialize};

use super::{check, ConfigError};

/// Which transitions the controller makes (`[policy] mode`, `--policy`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum PolicyMode {
    /// One plan from start to finish; no controller.
    Off,
    /// The paper's controller: triggers, replans, admission by payback.
    Nereus,
    /// The initial TP/PP layouts throughout; only DP follows the pool.
    Static,
    /// Switch to the planner's target every `policy.every_k` steps, no payback check.
    EveryK,
    /// DynaRL-style: admit whenever the target is predicted faster.
    Greedy,
}

crate::named_enum!(PolicyMode {
    Off => "off",
    Nereus => "nereus",
    Static => "static",
    EveryK => "every-k",
    Greedy => "greedy",
});

/// `policy.plan_error`'s default: the low end of `bench calibration`'s held-out error on plans
/// the calibration was not fitted to, fitted by stage totals on a quiet machine (8–13% MAPE,
/// σ ≈ 0.10–0.16; docs/cost-model.md). The per-class fit reads 26% on the 2-core VM, most of it
/// 8 ranks sharing 2 cores, which a GPU cluster does not do.
pub const PLAN_ERROR: f64 = 0.1;

/// The `[policy]` section (every key has a default).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct PolicySection {
    /// Which transitions the controller makes.
    pub mode: PolicyMode,
    /// Payback factor γ: an opportunistic transition is admitted when
    /// `L_tran / ΔL <= γ · H_x`, i.e. it pays for itself within γ of the expected horizon.
    pub gamma: f64,
    /// `δ_len`: relative drift of the mean response length from its reference that triggers a
    /// replan (0.3 = 30%).
    #[serde(alias = "drift_threshold")]
    pub length_drift: f64,
    /// Relative drift of measured over predicted step seconds that triggers a replan with the
    /// recalibrated cost model.
    pub latency_drift: f64,
    /// Steps between switches under `mode = "every-k"`.
    pub every_k: u32,
    /// Under a controller, the response cap the first plan is made for (0: `rl.max_response_len`);
    /// the cap then follows the observed lengths up to `rl.max_response_len`.
    pub initial_response_len: u32,
    /// Smallest predicted relative step-latency gain worth a transition; the controller raises
    /// it to the cost model's measured error on the plans transitions entered.
    pub min_gain: f64,
    /// The calibrated cost model's expected relative error on a plan the job has not run (a
    /// prior, weighed as three measured moves beside those the job measured); it prices trials
    /// of plans ranked just below the best. 0: no trial before a move's error was measured.
    pub plan_error: f64,
    /// Fraction of device memory a plan must leave free.
    pub memory_headroom: f64,
    /// RL steps between monitor evaluations.
    pub monitor_interval_steps: u32,
}

impl Default for PolicySection {
    fn default() -> Self {
        PolicySection {
            mode: PolicyMode::Off,
            gamma: 0.5,
            length_drift: 0.3,
            latency_drift: 0.3,
            every_k: 3,
            initial_response_len: 0,
            min_gain: 0.0,
            plan_error: PLAN_ERROR,
            memory_headroom: 0.1,
            monitor_interval_steps: 1,
        }
    }
}

impl PolicySection {
    /// Checks ranges; errors name the key under `policy.`.
    pub fn validate(&self) -> Result<(), ConfigError> {
        // γ = 0 is the paper's "urgent transitions only".
        check::within("policy.gamma", self.gamma, 0.0, 1.0)?;
        check::positive("policy.length_drift", self.length_drift)?;
        check::positive("policy.latency_drift", self.latency_drift)?;
        check::at_least_one("policy.every_k", self.every_k)?;
        check::within("policy.min_gain", self.min_gain, 0.0, 1.0)?;
        check::within("policy.plan_error", self.plan_error, 0.0, 1.0)?;
        check::within("policy.memory_headroom", self.memory_headroom, 0.0, 0.9)?;
        check::at_least_one("policy.monitor_interval_steps", self.monitor_interval_steps)
    }
}
