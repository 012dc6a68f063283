//! What the job measured on the plans it ran: the check on the cost model where it has been
//! wrong (beyond the paper).
//!
//! The calibrated model is right on the plan it was fitted to. On other plans it can be wrong
//! in ways no per-class calibration removes: a shape whose kernels or collectives run worse
//! than its class averages. So for every plan *shape* the job has run (the model-stages'
//! layouts, micro-batches and recomputation: not DP, not ranks, which the pool decides), the
//! controller keeps the step seconds it measured over what the *starting* model predicts at the
//! step's length and pool. The starting model is never recalibrated, so the ratio means the
//! same thing at every step, and it carries across pool changes: the same shape on more or
//! fewer replicas keeps what it measured. A proposal between two shapes the job has both run,
//! at comparable lengths, is priced on these measurements instead of the model. After a move,
//! the plan left behind (its layouts on the pool now) is offered back if the new plan measured
//! slower than the left shape's measurement says it would have run
//! ([`super::Trigger::Regret`]).

use serde::{Deserialize, Serialize};

use crate::plan::Plan;

/// Plans remembered (the least recently run are forgotten first).
const CAPACITY: usize = 32;
/// Weight of the newest step in a plan's ratio (as the controller smooths step latency).
const SMOOTHING: f64 = 0.3;

/// One plan shape the job ran.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
struct Ran {
    /// The last plan of the shape the job ran (the planner's ranks).
    plan: Plan,
    /// Measured over the starting model's predicted step seconds (smoothed).
    ratio: f64,
    /// The response length (p95) of its last step.
    len: f64,
    /// Its last step.
    step: u64,
}

/// The plan shapes the job ran and what they measured.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct PlanMemory {
    ran: Vec<Ran>,
}

impl PlanMemory {
    /// Step `step` of `plan` ran responses of `len` tokens (p95) at `ratio` times the starting
    /// model's seconds. Folded into its shape's ratio when the shape's last step ran a length
    /// within `tolerance` (relative) of this one; otherwise it replaces it.
    pub fn record(&mut self, plan: &Plan, ratio: f64, len: f64, step: u64, tolerance: f64) {
        if !(ratio.is_finite() && ratio > 0.0) {
            return;
        }
        match self.ran.iter_mut().find(|r| same_shape(&r.plan, plan)) {
            Some(r) if comparable(r.len, len, tolerance) => {
                *r = Ran { ratio: SMOOTHING * ratio + (1.0 - SMOOTHING) * r.ratio, len, step, plan: plan.clone() }
            }
            Some(r) => *r = Ran { plan: plan.clone(), ratio, len, step },
            None => {
                if self.ran.len() == CAPACITY {
                    let oldest = (0..self.ran.len()).min_by_key(|&k| self.ran[k].step).unwrap_or(0);
                    self.ran.swap_remove(oldest);
                }
                self.ran.push(Ran { plan: plan.clone(), ratio, len, step });
            }
        }
    }

    /// Whether a plan of `plan`'s shape, on whatever ranks and replicas, ran responses within
    /// `tolerance` of `len` tokens (what a trial would measure is known already).
    pub fn ran_alike(&self, plan: &Plan, len: f64, tolerance: f64) -> bool {
        self.ratio(plan, len, tolerance).is_some()
    }

    /// The measured ratio of `plan`'s shape, when it ran responses within `tolerance` of `len`
    /// tokens.
    pub fn ratio(&self, plan: &Plan, len: f64, tolerance: f64) -> Option<f64> {
        self.ran.iter().find(|r| same_shape(&r.plan, plan) && comparable(r.len, len, tolerance)).map(|r| r.ratio)
    }
}

/// Whether `a` and `b` have one shape: per model-stage the same layout, micro-batch and
/// recomputation (DP and ranks may differ).
pub fn same_shape(a: &Plan, b: &Plan) -> bool {
    let part = |x: &crate::plan::Placement| {
        let c = &x.candidate;
        (c.model_stage, c.layout, c.micro_batch, c.recompute)
    };
    a.placements.len() == b.placements.len() && a.placements.iter().map(part).eq(b.placements.iter().map(part))
}

fn comparable(a: f64, b: f64, tolerance: f64) -> bool {
    (a / b - 1.0).abs() <= tolerance
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::Layout;
    use crate::plan::{Candidate, ModelStage, Placement, Recompute, Role, Stage};

    fn plan(tp: u32) -> Plan {
        let model_stage = ModelStage::new(Role::Actor, Stage::Training);
        let candidate =
            Candidate { model_stage, layout: Layout::new(tp, 1), dp: 1, recompute: Recompute::None, micro_batch: 1 };
        Plan { placements: vec![Placement { candidate, ranks: (0..tp as i32).collect() }] }
    }

    #[test]
    fn ratios_are_smoothed_at_comparable_lengths_and_replaced_across_a_length_change() {
        let mut m = PlanMemory::default();
        m.record(&plan(1), 2.0, 100.0, 0, 0.3);
        m.record(&plan(1), 1.0, 110.0, 1, 0.3);
        assert!((m.ratio(&plan(1), 110.0, 0.3).unwrap() - (0.3 * 1.0 + 0.7 * 2.0)).abs() < 1e-12);
        assert_eq!(m.ratio(&plan(2), 110.0, 0.3), None, "never ran");
        assert_eq!(m.ratio(&plan(1), 200.0, 0.3), None, "ran shorter responses");
        m.record(&plan(1), 3.0, 200.0, 2, 0.3);
        assert_eq!(m.ratio(&plan(1), 200.0, 0.3), Some(3.0));
        m.record(&plan(1), f64::NAN, 200.0, 3, 0.3);
        assert_eq!(m.ratio(&plan(1), 200.0, 0.3), Some(3.0), "a NaN teaches nothing");
        let mut wider = plan(1);
        wider.placements[0].candidate.dp = 4;
        wider.placements[0].ranks = (0..4).collect();
        assert_eq!(m.ratio(&wider, 200.0, 0.3), Some(3.0), "DP does not change a shape: the ratio carries");
        for tp in 2..40 {
            m.record(&plan(tp), 1.0, 200.0, 10 + u64::from(tp), 0.3);
        }
        assert_eq!(m.ran.len(), CAPACITY);
        assert_eq!(m.ratio(&plan(1), 200.0, 0.3), None, "the least recently run is forgotten");
    }
}
