//! The simulator's ground truth: what a step really takes, given what the cost model predicts.
//!
//! With no error (the default) the truth *is* the cost model, so every gain the planner predicts
//! is real by construction and admitting every one (greedy) cannot lose. A real cost model is
//! wrong on plans the job has not run: `nereus bench calibration` measured held-out step errors
//! of 7.9–12.6% MAPE on this machine (docs/cost-model.md). [`Truth`] models that: each plan's
//! true step seconds are its prediction times a factor drawn once per plan (its layouts and
//! replica counts) from a log-normal of mean 1 — `exp(σ·z − σ²/2)`, whose MAPE is about
//! `0.8·σ` — plus optional per-step jitter. Draws are seeded: a run is reproducible.

use crate::plan::Plan;
use crate::rng::mix;

/// How wrong the cost model is about the simulated machine.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct Truth {
    /// `σ` of the log of each plan's true over predicted step seconds (0: the model is exact).
    pub model_error: f64,
    /// Relative standard deviation of step-to-step jitter (0: none).
    pub noise: f64,
    /// Seed of the draws.
    pub seed: u64,
}

impl Truth {
    /// True over predicted seconds of `plan`'s step `step`.
    pub fn factor(&self, plan: &Plan, step: u64) -> f64 {
        let mut factor = 1.0;
        if self.model_error > 0.0 {
            let plan_bits = plan.to_string().bytes().fold(mix(self.seed), |h, b| mix(h ^ u64::from(b)));
            let sigma = self.model_error;
            factor *= (sigma * standard_normal(plan_bits) - sigma * sigma / 2.0).exp();
        }
        if self.noise > 0.0 {
            let step_bits = mix(mix(self.seed ^ STEP_STREAM) ^ step);
            // Clipped so that no step takes less than half its time or a negative one.
            factor *= (1.0 + self.noise * standard_normal(step_bits)).max(0.5);
        }
        factor
    }
}

/// Keeps the per-step draws apart from the per-plan ones.
const STEP_STREAM: u64 = 0x0123_4567_89ab_cdef;

/// A standard normal value from 64 random bits (Box–Muller on two 32-bit uniforms).
fn standard_normal(bits: u64) -> f64 {
    let uniform = |b: u64| (b as f64 + 0.5) / 4_294_967_296.0;
    let (u1, u2) = (uniform(bits >> 32), uniform(bits & 0xffff_ffff));
    (-2.0 * u1.ln()).sqrt() * (std::f64::consts::TAU * u2).cos()
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
    fn an_exact_model_is_the_truth_and_errors_are_per_plan_seeded_and_of_mean_one() {
        assert_eq!(Truth::default().factor(&plan(2), 7), 1.0);
        let truth = Truth { model_error: 0.1, noise: 0.0, seed: 3 };
        assert_eq!(truth.factor(&plan(2), 1), truth.factor(&plan(2), 900), "one draw per plan");
        assert_ne!(truth.factor(&plan(2), 1), truth.factor(&plan(4), 1));
        assert_ne!(truth.factor(&plan(2), 1), Truth { seed: 4, ..truth }.factor(&plan(2), 1));
        // Over many seeds the factors have mean 1 and a log spread of σ.
        let logs: Vec<f64> = (0..4000).map(|seed| Truth { seed, ..truth }.factor(&plan(2), 0).ln()).collect();
        let mean_factor = logs.iter().map(|l| l.exp()).sum::<f64>() / logs.len() as f64;
        let mean_log = logs.iter().sum::<f64>() / logs.len() as f64;
        let sd = (logs.iter().map(|l| (l - mean_log).powi(2)).sum::<f64>() / logs.len() as f64).sqrt();
        assert!((mean_factor - 1.0).abs() < 0.01, "{mean_factor}");
        assert!((sd - 0.1).abs() < 0.005, "{sd}");
        let noisy = Truth { model_error: 0.0, noise: 0.05, seed: 3 };
        assert_ne!(noisy.factor(&plan(2), 1), noisy.factor(&plan(2), 2), "jitter moves from step to step");
    }
}
