//! The controller's record of a step boundary where a trigger fired (`decision` in the step
//! line, the simulator's steps and the broadcast [`Action`](super::controller::Action)).

use serde::{Deserialize, Serialize};

use super::Trigger;
use crate::config::PolicyMode;

/// Why a transition was taken: the current plan could not go on, or a faster one pays back.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum TransitionKind {
    /// Profitability waived: the current plan cannot continue.
    Urgent,
    /// Admitted because it pays for itself within the horizon.
    Opportunistic,
}

impl TransitionKind {
    /// `urgent` or `opportunistic`.
    pub fn name(self) -> &'static str {
        match self {
            TransitionKind::Urgent => "urgent",
            TransitionKind::Opportunistic => "opportunistic",
        }
    }
}

/// A decision at a step boundary.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Decision {
    /// The triggers that fired (urgent ones first).
    pub trigger: Vec<Trigger>,
    /// Whether the target was taken.
    pub admitted: bool,
    /// How, when taken.
    pub kind: Option<TransitionKind>,
    /// Why, in words.
    pub reason: String,
    /// What the admission weighed; absent when the controller stopped before weighing
    /// anything (no plan fits).
    #[serde(flatten, default, skip_serializing_if = "Option::is_none")]
    pub admission: Option<Admission>,
}

/// The numbers an admission weighed.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Admission {
    /// `ΔL`, seconds per step (`null` when not finite: the current plan no longer fits).
    pub delta_l_s: Option<f64>,
    /// Whether `ΔL` comes from the job's measurements of both plans (`false`: the cost model).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub measured: bool,
    /// `L̂_tran` as calibrated, seconds (`null` when not finite).
    pub l_tran_s: Option<f64>,
    /// Measured over predicted transition seconds so far, the factor `L̂_tran` carries.
    pub l_tran_calibration: f64,
    /// `H_x` of the triggers.
    pub h_x: f64,
    /// The payback factor γ.
    pub gamma: f64,
    /// The smallest relative gain trusted.
    pub gain_threshold: f64,
    /// A trial's expected improvement per step, seconds (`policy::trial`; absent otherwise).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expected_gain_s: Option<f64>,
    /// The policy.
    pub mode: PolicyMode,
}
