//! What one step leaves for its record: what was in force while it ran (the plan, what the
//! cost model predicted for it, the pool), and what the boundary after it did.

use nereus_core::cost::{OpSeconds, RankPeaks};
use nereus_core::plan::{PerPhase, Plan};
use nereus_core::planner::{Planner, StepSeconds};
use nereus_core::policy::Decision;
use nereus_core::record::{RankLossRecord, TransitionRecord};

use crate::RuntimeError;

/// What was in force during a step, recorded beside its measurements: the boundary after it
/// may change all of it.
pub struct InForce {
    /// The plan the step ran under.
    pub plan: Plan,
    /// What the cost model predicted for it.
    pub predicted: Predicted,
    /// Ranks in the pool.
    pub pool: u32,
    /// Ranks lost so far.
    pub lost: Vec<u32>,
    /// Bytes every rank's ledger held at the end of the step (when the pool can change).
    pub held: Vec<u64>,
    /// Per phase and operation class, the most seconds any rank's timers gave the step (the
    /// step line records them; the controller calibrates with them).
    pub slowest_ops: PerPhase<OpSeconds>,
}

/// What the cost model predicts for the plan the job runs, recorded beside every measurement.
#[derive(Clone)]
pub struct Predicted {
    /// Every rank's predicted peak memory.
    pub(super) peaks: RankPeaks,
    /// Predicted seconds per phase.
    pub(super) seconds: StepSeconds,
    /// Per phase, the seconds per operation class along its critical path.
    pub(super) op_seconds: PerPhase<OpSeconds>,
    /// The predicted step seconds: the phases' sum, or for an asynchronous job the slower
    /// pipeline plus the weight sync (`planner::overlap`).
    pub(super) step: f64,
}

impl Predicted {
    /// What `planner` predicts for `plan`.
    pub fn of(planner: &Planner, plan: &Plan) -> Predicted {
        let efficiencies = planner.cost().efficiencies;
        let op_seconds = planner.stage_parts(plan).map(|(_, ideal)| ideal.at(&efficiencies));
        let (peaks, seconds, step) = (planner.rank_peaks(plan), planner.step_seconds(plan), planner.predict(plan));
        Predicted { peaks, seconds, op_seconds, step }
    }

    /// The predicted step seconds.
    pub fn step_seconds(&self) -> f64 {
        self.step
    }
}

/// What a step boundary did, for the JSON lines and the log.
#[derive(Debug, Clone, Default)]
pub struct Boundary {
    /// The decision record (`None` when no trigger fired).
    pub decision: Option<Decision>,
    /// The transition record (`None` when nothing moved).
    pub transition: Option<TransitionRecord>,
    /// A rank lost at this boundary.
    pub rank_loss: Option<RankLossRecord>,
    /// The controller found nothing that fits and the job stops here (after the step's record).
    pub stop: Option<ControllerStop>,
}

/// Why the controller stopped the job, and the checkpoint it wrote first.
#[derive(Debug, Clone)]
pub struct ControllerStop {
    /// The step after which the job stops.
    pub(super) step: u64,
    /// Why nothing fits.
    pub(super) reason: String,
    /// The checkpoint written first.
    pub(super) checkpoint: std::path::PathBuf,
}

impl ControllerStop {
    /// The error the job ends with.
    pub fn into_error(self) -> RuntimeError {
        RuntimeError::ControllerStop { step: self.step, reason: self.reason, checkpoint: self.checkpoint }
    }
}
