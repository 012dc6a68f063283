//! Trials (beyond the paper): a priced step on a plan the model ranks just below the best, for
//! the error the model makes between plans (a prior, then what the job's moves measured).
//!
//! The calibrated model is right on the plans it was fitted to. On a plan of another shape it
//! can be off by as much as it was off on the job's own moves (what the trusted gain measures),
//! and no per-class calibration learns that from the plans the job ran: a plan ranked a few
//! percent slower may run faster. So when the plan in force has held for a while and nothing
//! else is to be done, the controller looks at the best plan's *neighbours* (the fastest plan
//! with one model-stage on another of its fastest layouts) that the job has not measured at
//! these lengths, and prices a trial of each by its expected improvement (Jones, Schonlau and
//! Welch, "Efficient global optimization of expensive black-box functions", J. Global Optim.
//! 13, 1998): against the plan in force's predicted `c` seconds, the neighbour's step seconds
//! are taken as `T ~ N(μ, (σμ)²)`, with `μ` its prediction (a bias common to both plans
//! cancels) and `σ` the model's error on plans: the prior `policy.plan_error`, shrunk toward the
//! error measured on the job's moves as they come. A trial costs the transition there,
//! the way back (when it measures slower) and the step run on it; it is taken when
//! `E[max(0, c − T)]`, gained on every step of the standing horizon, pays that back within
//! `γ · H`. A neighbour that measures slower is left at the next boundary by `Regret`, and the
//! plan memory keeps a plan of its candidates from being tried again until the lengths move.
//! (`Regret` goes back only when the trial is slower by more than step-to-step noise, so the
//! price overstates the way back by the chance of a slowdown within noise, which it then keeps.)

use crate::model::Layout;
use crate::plan::Plan;
use crate::planner::Planner;

/// Other layouts tried per model-stage (the fastest first).
pub const LAYOUTS_PER_STAGE: usize = 2;

/// What a trial of a plan whose step seconds are `T ~ N(μ, s²)` may bring against `c` seconds.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Odds {
    /// `E[max(0, c − T)]`: the expected improvement per step, seconds.
    pub gain: f64,
    /// `E[max(0, T − c)]`: the expected loss of the one step run on it, seconds.
    pub loss: f64,
    /// `P(T > c)`: the chance of going back.
    pub worse: f64,
}

impl Odds {
    /// The odds of a plan predicted at `mu` seconds, off by a relative `sigma`, against the `c`
    /// seconds of the plan in force.
    pub fn of(c: f64, mu: f64, sigma: f64) -> Odds {
        let s = sigma * mu;
        if !(s > 0.0 && s.is_finite()) {
            return Odds { gain: (c - mu).max(0.0), loss: (mu - c).max(0.0), worse: f64::from(u8::from(mu > c)) };
        }
        let z = (c - mu) / s;
        let density = (-0.5 * z * z).exp() / (2.0 * std::f64::consts::PI).sqrt();
        let gain = (c - mu) * normal_cdf(z) + s * density;
        Odds { gain, loss: gain - (c - mu), worse: normal_cdf(-z) }
    }

    /// Seconds a trial costs: the transition there (`l_tran_s`), the same back with the chance
    /// of going back, and the expected loss of the step run on it.
    pub fn cost(&self, l_tran_s: f64) -> f64 {
        l_tran_s * (1.0 + self.worse) + self.loss
    }
}

/// `Φ(z)`, the standard normal's distribution function, from `erfc` by Abramowitz and Stegun
/// 7.1.26 (absolute error under 1.5·10⁻⁷, far below what a trial's pricing resolves).
pub fn normal_cdf(z: f64) -> f64 {
    let x = z.abs() / std::f64::consts::SQRT_2;
    let t = 1.0 / (1.0 + 0.327_591_1 * x);
    let poly =
        t * (0.254_829_592 + t * (-0.284_496_736 + t * (1.421_413_741 + t * (-1.453_152_027 + t * 1.061_405_429))));
    let tail = 0.5 * poly * (-x * x).exp();
    if z >= 0.0 {
        1.0 - tail
    } else {
        tail
    }
}

/// The planner's best plan with one model-stage held to another layout, for each model-stage
/// and each of its [`LAYOUTS_PER_STAGE`] fastest other layouts (by their fastest candidate):
/// the plans one layout away from `best` (deduplicated, `best` left out, only those that fit).
pub fn neighbours(planner: &Planner, best: &Plan) -> Vec<Plan> {
    let mut found: Vec<Plan> = Vec::new();
    for placement in &best.placements {
        let ms = placement.candidate.model_stage;
        let layouts = planner.layouts_by_speed(ms).into_iter().map(|(layout, _)| layout);
        let others: Vec<Layout> =
            layouts.filter(|l| *l != placement.candidate.layout).take(LAYOUTS_PER_STAGE).collect();
        for layout in others {
            let Ok(job) = planner.holding_layout(ms, layout).search(None) else { continue };
            let plan = job.plan();
            if plan != *best && !found.contains(&plan) {
                found.push(plan);
            }
        }
    }
    found
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_normal_distribution_function_matches_its_tables() {
        // Φ(0), Φ(1), Φ(1.96), Φ(−2.5) from the standard tables.
        for (z, phi) in [(0.0, 0.5), (1.0, 0.841_344_746), (1.96, 0.975_002_105), (-2.5, 0.006_209_665)] {
            assert!((normal_cdf(z) - phi).abs() < 2e-7, "Φ({z}) = {} not {phi}", normal_cdf(z));
        }
    }

    #[test]
    fn expected_improvement_is_the_normal_partial_expectation() {
        // At μ = c the gain and the loss are both s·φ(0), and going back is even odds.
        let o = Odds::of(10.0, 10.0, 0.1);
        let s_phi0 = 1.0 * 0.398_942_280;
        assert!((o.gain - s_phi0).abs() < 1e-6 && (o.loss - s_phi0).abs() < 1e-6, "{o:?}");
        assert!((o.worse - 0.5).abs() < 1e-7);
        // μ one s above c: gain = s·(φ(1) − Φ(−1)·1) = s·(0.241971 − 0.158655).
        let o = Odds::of(10.0, 10.0 / 0.9, 0.1);
        let s = 0.1 * 10.0 / 0.9;
        let want = s * (0.241_970_725 - 0.158_655_254);
        assert!((o.gain - want).abs() < 1e-6, "{} vs {want}", o.gain);
        assert!((o.worse - 0.841_344_746).abs() < 2e-7, "P(T > c) = Φ(1), not Φ(−1): {}", o.worse);
        // A model with no measured error expects nothing from a plan it ranks slower.
        let exact = Odds::of(10.0, 11.0, 0.0);
        assert_eq!((exact.gain, exact.loss, exact.worse), (0.0, 1.0, 1.0));
        assert!((exact.cost(2.0) - 5.0).abs() < 1e-12, "there, back and one step 1 s slower");
    }
}
