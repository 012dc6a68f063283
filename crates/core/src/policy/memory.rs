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

    /// What the job's measurements say of `plan`'s shape when it did not run these lengths:
    /// the ratio its shape measured at the lengths it last ran, else the one its layouts last
    /// measured under another micro-batch or recomputation (the starting model prices what
    /// the lengths, micro-batch and recomputation change; the ratio carries how the layouts
    /// ran against it). `None` when the job never ran its layouts.
    pub fn carried(&self, plan: &Plan) -> Option<Carried> {
        if let Some(r) = self.ran.iter().find(|r| same_shape(&r.plan, plan)) {
            return Some(Carried { ratio: r.ratio, len: r.len, same_shape: true });
        }
        let latest = self.ran.iter().filter(|r| same_layouts(&r.plan, plan)).max_by_key(|r| r.step)?;
        Some(Carried { ratio: latest.ratio, len: latest.len, same_shape: false })
    }

    /// The last plan of every shape the job ran, the most recently run first.
    pub fn plans(&self) -> Vec<&Plan> {
        let mut ran: Vec<&Ran> = self.ran.iter().collect();
        ran.sort_by_key(|r| std::cmp::Reverse(r.step));
        ran.into_iter().map(|r| &r.plan).collect()
    }
}

/// A ratio carried to lengths, or a shape, it was not measured on ([`PlanMemory::carried`]).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Carried {
    /// Measured over the starting model's predicted step seconds.
    pub ratio: f64,
    /// The response length (p95) it was last measured at.
    pub len: f64,
    /// Measured on the plan's own shape (`false`: on its layouts under another shape).
    pub same_shape: bool,
}

/// Whether `a` and `b` have one shape: per model-stage the same layout, micro-batch and
/// recomputation (DP and ranks may differ).
pub fn same_shape(a: &Plan, b: &Plan) -> bool {
    same_parts(a, b, |c| (c.model_stage, c.layout, c.micro_batch, c.recompute))
}

/// Whether `a` and `b` run every model-stage on the same layout (TP × PP).
fn same_layouts(a: &Plan, b: &Plan) -> bool {
    same_parts(a, b, |c| (c.model_stage, c.layout))
}

/// Whether `a` and `b` place the same model-stages with equal `part`s of their candidates.
fn same_parts<T: PartialEq>(a: &Plan, b: &Plan, part: impl Fn(&crate::plan::Candidate) -> T) -> bool {
    a.placements.iter().map(|x| part(&x.candidate)).eq(b.placements.iter().map(|x| part(&x.candidate)))
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
        assert_eq!(m.plans()[0], &plan(39), "the most recently run first");
        assert_eq!(m.ratio(&plan(1), 200.0, 0.3), None, "the least recently run is forgotten");
    }

    #[test]
    fn a_ratio_carries_to_other_lengths_and_to_its_layouts_under_another_recomputation() {
        let mut m = PlanMemory::default();
        m.record(&plan(2), 1.5, 1000.0, 0, 0.3);
        m.record(&plan(2), 1.1, 1050.0, 1, 0.3);
        let smoothed = 0.3 * 1.1 + 0.7 * 1.5;
        assert_eq!(m.ratio(&plan(2), 3000.0, 0.3), None, "not at these lengths");
        let own = m.carried(&plan(2)).unwrap();
        assert!((own.ratio - smoothed).abs() < 1e-12 && own.len == 1050.0 && own.same_shape);
        let mut recomputed = plan(2);
        recomputed.placements[0].candidate.recompute = Recompute::Full;
        recomputed.placements[0].candidate.micro_batch = 4;
        let layouts = m.carried(&recomputed).unwrap();
        assert!((layouts.ratio - smoothed).abs() < 1e-12 && !layouts.same_shape, "its layouts' ratio");
        m.record(&recomputed, 0.9, 3000.0, 2, 0.3);
        assert_eq!(m.carried(&recomputed).map(|c| (c.ratio, c.same_shape)), Some((0.9, true)), "its own, once run");
        assert_eq!(m.carried(&plan(4)), None, "layouts never run");
    }
}
