//! `[policy]`: when the runtime replans and which transitions it admits.

use serde::{Deserialize, Serialize};

use super::{check, ConfigError};

/// The `[policy]` section (every key has a default).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct PolicySection {
    /// Payback factor γ: an opportunistic transition is admitted when
    /// `L_tran / ΔL <= γ · H_x`, i.e. it pays for itself within γ of the expected horizon.
    pub gamma: f64,
    /// Relative drift of a monitored signal (sequence length, memory, achieved efficiency) that
    /// triggers a replan, e.g. 0.1 = 10%.
    pub drift_threshold: f64,
    /// Smallest predicted relative step-latency gain worth a transition.
    pub min_gain: f64,
    /// Fraction of device memory a plan must leave free.
    pub memory_headroom: f64,
    /// RL steps between monitor evaluations.
    pub monitor_interval_steps: u32,
}

impl Default for PolicySection {
    fn default() -> Self {
        PolicySection {
            gamma: 0.5,
            drift_threshold: 0.1,
            min_gain: 0.05,
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
        check::positive("policy.drift_threshold", self.drift_threshold)?;
        check::within("policy.min_gain", self.min_gain, 0.0, 1.0)?;
        check::within("policy.memory_headroom", self.memory_headroom, 0.0, 0.9)?;
        check::at_least_one("policy.monitor_interval_steps", self.monitor_interval_steps)
    }
}
