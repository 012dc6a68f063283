//! The simulator's ground truth: what a step and a transition really take on the simulated
//! machine. It is not the cost model under test.
//!
//! The machine runs each operation class at its own efficiency. These efficiencies differ from
//! the ones the controller starts with, so the controller must learn them online. They also
//! deviate by plan shape, so no single calibration fits every plan. Step times and lengths
//! jitter from step to step, and transitions take their own time. The controller sees only its
//! model and what the steps measured (per phase and per operation class, as the live engine's
//! timers give them), and calibrates exactly as `nereus train` does.
//!
//! Each operation class `c` has a true efficiency on plan `S` of
//! `e_c · m_c · d_c(shape(S))`:
//! - `e_c` is the efficiency the controller starts with (the cost model's default, or
//!   `--calibration`);
//! - `m_c = exp(σ_cal · z)` is drawn once per seed and class: the machine's offset, which the
//!   running calibration learns;
//! - `d_c = exp(σ_op · z − σ_op²/2)` is drawn once per seed, class and plan shape (the model-stages'
//!   TP×PP layouts, micro-batches and recomputation; DP does not change a shape): the error no
//!   calibration removes.
//!
//! The step runs the plan's critical path under those efficiencies (the same roofline
//! structure, other speeds). Each phase then takes a factor `1 + σ_noise · z` per step, and the
//! lengths the step ran take `1 + σ_len · z`. A transition takes its uncalibrated predicted
//! seconds times `b · exp(σ_tran · z)`, where `b = exp(σ_tran · z)` is a bias drawn once per
//! seed (MPI planes here ran 30–60× faster than the model's set-up-dominated estimate).
//!
//! An asynchronous job's step (`rl.mode = "async"`) is `max(generation, inference + training) +
//! weight_sync` of the machine's own phases: generation on the generation ranks' plan, the rest
//! on the others, the weight sync at the machine's speeds for the plan (the planner's overlap
//! rule, [`overlapped_total`](crate::planner::overlapped_total), over the truth's phases, not the
//! model's).
//!
//! [`Truth::model`] is the old, exact truth (the cost model itself). There, greedy cannot lose
//! by construction, and it is kept only to reproduce earlier results. All draws are seeded, so a
//! run is reproducible.

use crate::cost::{Efficiencies, OpClass, OpSeconds};
use crate::plan::{PerPhase, Plan};
use crate::planner::{Planner, PlannerError, StepSeconds};
use crate::rng::mix;

/// How the simulated machine differs from the cost model.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Truth {
    /// `σ_cal`: log-spread of the machine's per-class efficiencies around the controller's
    /// starting calibration (what online calibration must learn).
    pub calibration_error: f64,
    /// `σ_op`: log-spread of each class's efficiency per plan shape (what it cannot learn).
    pub op_error: f64,
    /// `σ_noise`: relative step-to-step jitter of each phase's seconds.
    pub noise: f64,
    /// `σ_len`: relative step-to-step jitter of the lengths a step ran.
    pub length_noise: f64,
    /// `σ_tran`: log-spread of a transition's seconds around its uncalibrated prediction (and
    /// of the per-seed bias).
    pub transition_error: f64,
    /// Seed of every draw.
    pub seed: u64,
}

impl Default for Truth {
    /// [`Truth::machine`] with seed 1.
    fn default() -> Self {
        Truth::machine(1)
    }
}

/// Keeps the draws of different kinds apart.
const MACHINE: u64 = 0x6d61_6368_696e_6531;
const SHAPE: u64 = 0x7368_6170_6531_3233;
const STEP: u64 = 0x0123_4567_89ab_cdef;
const LENGTH: u64 = 0x6c65_6e67_7468_3435;
const TRANSITION: u64 = 0x7472_616e_7369_7436;

impl Truth {
    /// The default machine. `σ_cal = 0.3`: the CPU job's per-class ratios before calibration
    /// spread more than that (0.09–1.8, docs/cost-model.md), and a GPU cluster's classes sit
    /// closer to a tuned model's defaults. `σ_op = 0.15`: `bench calibration`'s held-out error
    /// after calibration by stage totals (8–13% MAPE on a quiet machine is σ ≈ 0.1–0.16; the
    /// per-class fit's 21–26% there is mostly the CPU ranks' scheduling). Step jitter is 3%,
    /// length jitter 3%, and transitions are off by `σ_tran = 0.3`.
    pub fn machine(seed: u64) -> Truth {
        Truth { calibration_error: 0.3, op_error: 0.15, noise: 0.03, length_noise: 0.03, transition_error: 0.3, seed }
    }

    /// The cost model as the truth: exact, no jitter.
    pub fn model(seed: u64) -> Truth {
        Truth { calibration_error: 0.0, op_error: 0.0, noise: 0.0, length_noise: 0.0, transition_error: 0.0, seed }
    }

    /// Whether this truth is the cost model itself.
    pub fn is_model(&self) -> bool {
        self.calibration_error == 0.0
            && self.op_error == 0.0
            && self.noise == 0.0
            && self.length_noise == 0.0
            && self.transition_error == 0.0
    }

    /// The machine's efficiencies on `plan`, around `start` (the controller's starting point).
    pub fn efficiencies(&self, start: &Efficiencies, plan: &Plan) -> Efficiencies {
        let shape = shape_bits(plan);
        Efficiencies(std::array::from_fn(|k| {
            let machine = (self.calibration_error * normal(&[self.seed, MACHINE, k as u64])).exp();
            let sigma = self.op_error;
            let deviation = (sigma * normal(&[self.seed, SHAPE, shape, k as u64]) - sigma * sigma / 2.0).exp();
            start.0[k] * machine * deviation
        }))
    }

    /// The factor that scales step `step`'s response lengths.
    pub fn length_factor(&self, step: u64) -> f64 {
        jitter(self.length_noise, normal(&[self.seed, LENGTH, step]))
    }

    /// What step `step` of `plan` takes on this machine, per phase and per operation class:
    /// `planner` (the pool and lengths of the step, any efficiencies) is re-run with the
    /// machine's efficiencies for the plan and the phases jittered.
    pub fn step(
        &self,
        planner: &Planner,
        start: &Efficiencies,
        plan: &Plan,
        step: u64,
    ) -> Result<MeasuredStep, PlannerError> {
        let e = self.efficiencies(start, plan);
        let machine = planner.replanned(planner.cost().hardware.devices, planner.response_len(), e)?;
        let parts = machine.stage_parts(plan);
        let parts = PerPhase::from_fn(|phase| {
            let (seconds, ideal) = parts.get(phase);
            let f = jitter(self.noise, normal(&[self.seed, STEP, step, phase as u64]));
            let timed = OpSeconds(std::array::from_fn(|k| f * ideal.0[k] / e.of(OpClass::ALL[k])));
            (f * seconds, timed)
        });
        let stages = parts.map(|(s, _)| *s);
        Ok(MeasuredStep { seconds: machine.step_total(&stages), stages, ops: parts.map(|(_, t)| *t) })
    }

    /// What a transition predicted (before calibration) at `predicted_s` takes, the `index`-th
    /// of a run.
    pub fn transition_seconds(&self, predicted_s: f64, index: u64) -> f64 {
        let sigma = self.transition_error;
        let bias = (sigma * normal(&[self.seed, TRANSITION])).exp();
        predicted_s * bias * (sigma * normal(&[self.seed, TRANSITION, index]) - sigma * sigma / 2.0).exp()
    }
}

/// A simulated step as the engine's timers would measure it.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct MeasuredStep {
    /// The step's seconds from its phases by the job's rule: their sum, or for an asynchronous
    /// job `max(generation, inference + training) + weight_sync`.
    pub seconds: f64,
    /// Seconds per phase.
    pub stages: StepSeconds,
    /// Seconds per phase and operation class.
    pub ops: PerPhase<OpSeconds>,
}

/// A relative jitter of standard deviation `sigma`, clipped so no step takes less than half.
fn jitter(sigma: f64, z: f64) -> f64 {
    (1.0 + sigma * z).max(0.5)
}

/// A plan's shape: its model-stages' layouts, micro-batches and recomputation (not DP, not
/// ranks), as 64 bits.
fn shape_bits(plan: &Plan) -> u64 {
    plan.placements.iter().fold(mix(0x5eed), |h, p| {
        let c = &p.candidate;
        let text = format!("{} {}x{} mb{} {:?}", c.model_stage, c.layout.tp, c.layout.pp, c.micro_batch, c.recompute);
        text.bytes().fold(h, |h, b| mix(h ^ u64::from(b)))
    })
}

/// A standard normal value drawn from `keys` (Box–Muller on two 32-bit uniforms of their hash).
fn normal(keys: &[u64]) -> f64 {
    let bits = keys.iter().fold(0x9e37_79b9_7f4a_7c15, |h, &k| mix(h ^ k));
    let uniform = |b: u64| (b as f64 + 0.5) / 4_294_967_296.0;
    let (u1, u2) = (uniform(bits >> 32), uniform(bits & 0xffff_ffff));
    (-2.0 * u1.ln()).sqrt() * (std::f64::consts::TAU * u2).cos()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::Layout;
    use crate::plan::{Candidate, ModelStage, Placement, Recompute, Role, Stage};

    fn plan(tp: u32, dp: u32) -> Plan {
        let model_stage = ModelStage::new(Role::Actor, Stage::Training);
        let candidate =
            Candidate { model_stage, layout: Layout::new(tp, 1), dp, recompute: Recompute::None, micro_batch: 1 };
        Plan { placements: vec![Placement { candidate, ranks: (0..(tp * dp) as i32).collect() }] }
    }

    #[test]
    fn the_model_truth_is_exact_and_the_machine_deviates_per_shape_and_seed() {
        let start = Efficiencies::default();
        assert_eq!(Truth::model(3).efficiencies(&start, &plan(2, 1)), start);
        assert!(Truth::model(3).is_model() && !Truth::machine(3).is_model());
        let truth = Truth::machine(3);
        let e = |t: &Truth, tp, dp| t.efficiencies(&start, &plan(tp, dp));
        assert_eq!(e(&truth, 2, 1), e(&truth, 2, 4), "DP does not change a plan's shape");
        assert_ne!(e(&truth, 2, 1), e(&truth, 4, 1), "TP does");
        assert_ne!(e(&truth, 2, 1), e(&Truth::machine(4), 2, 1), "every seed is another machine");
        // Over many shapes the per-shape deviations of a class have mean 1 around the machine's
        // offset, and a log-spread of σ_op.
        let shape_logs: Vec<f64> = (1..3000)
            .map(|tp| {
                let ratio = e(&truth, tp, 1).of(OpClass::Gemm) / start.of(OpClass::Gemm);
                ratio.ln()
            })
            .collect();
        let mean = shape_logs.iter().sum::<f64>() / shape_logs.len() as f64;
        let sd = (shape_logs.iter().map(|l| (l - mean).powi(2)).sum::<f64>() / shape_logs.len() as f64).sqrt();
        assert!((sd - truth.op_error).abs() < 0.01, "{sd}");
    }

    #[test]
    fn an_async_step_overlaps_the_machines_own_phases() {
        use crate::config::{ConfigSource, Overrides, RawJobConfig, RlMode};
        use crate::planner::overlapped_total;
        let source = ConfigSource::embedded_default();
        let mut config = RawJobConfig::parse(&source)
            .unwrap()
            .resolve(&source, &Overrides::default(), &mut || unreachable!())
            .unwrap();
        config.rl.mode = RlMode::Async;
        let start = Efficiencies::default();
        let planner = Planner::new(&config, 8, None, start).unwrap();
        let plan = planner.search(None).unwrap().plan();
        let truth = Truth::machine(2);
        let measured = truth.step(&planner, &start, &plan, 4).unwrap();
        assert_eq!(measured.seconds, overlapped_total(&measured.stages));
        assert!(measured.seconds < measured.stages.total(), "{:?}", measured.stages);
        assert!(measured.stages.weight_sync > 0.0);
        // The machine's phases, not the model's.
        assert_ne!(measured.stages, planner.step_seconds(&plan));
        // A synchronous job's step is the sum of its phases.
        config.rl.mode = RlMode::Sync;
        let planner = Planner::new(&config, 8, None, start).unwrap();
        let plan = planner.search(None).unwrap().plan();
        let measured = truth.step(&planner, &start, &plan, 4).unwrap();
        assert_eq!(measured.seconds, measured.stages.total());
    }

    #[test]
    fn transitions_scatter_around_a_per_seed_bias() {
        let truth = Truth::machine(5);
        let a = truth.transition_seconds(2.0, 0);
        assert_ne!(a, truth.transition_seconds(2.0, 1));
        assert_eq!(a, truth.transition_seconds(2.0, 0), "seeded");
        assert_eq!(Truth::model(5).transition_seconds(2.0, 7), 2.0);
        assert!(Truth::machine(5).length_factor(3) != 1.0 && Truth::model(5).length_factor(3) == 1.0);
    }
}
