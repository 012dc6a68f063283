//! `nereus bench simulate`: the simulator's own speed and the paper's claims on the shipped
//! length-growth trace (1,000 steps): all four policies at 1,024 and at 16,384 GPUs, timed
//! on this machine; Nereus against static and greedy (with the cost model as the ground truth,
//! and again with it wrong by the error `bench calibration` measured); the transitions' share
//! of run time.

use serde::Serialize;
use std::path::Path;
use std::time::Instant;

use super::{machine, BenchReport, Floor};
use nereus_core::config::{Overrides, PolicyMode};
use nereus_core::sim::{RestartModel, RunSummary, Truth};
use nereus_runtime::simulate::{print_table, read_trace, run_all, SimulateRequest};
use nereus_runtime::{RuntimeError, Session};

/// Pool sizes simulated.
pub const SIZES: [u32; 2] = [1024, 16384];
/// Policies simulated.
pub const POLICIES: [PolicyMode; 4] = [PolicyMode::Nereus, PolicyMode::Static, PolicyMode::Greedy, PolicyMode::EveryK];

/// σ of the cost model's error in the second comparison of Nereus with greedy (the low end of
/// what `bench calibration` measured: 7.9–12.6% held-out MAPE, σ ≈ 0.1–0.16).
pub const MODEL_ERROR: f64 = 0.1;
/// Seeds of that comparison (each draws every plan's error anew).
pub const SEEDS: [u64; 5] = [1, 2, 3, 4, 5];

/// One policy at one pool size.
#[derive(Debug, Clone, Serialize)]
pub struct Row {
    /// GPUs.
    pub gpus: u32,
    /// Wall seconds of all four policies at this size together.
    pub all_policies_wall_s: f64,
    /// The run's summary (with its own `wall_s`).
    #[serde(flatten)]
    pub run: RunSummary,
}

/// Runs the benchmark (rank 0 simulates).
pub fn run(
    session: &mut Session,
    config_path: &Path,
    trace_path: &Path,
    json: Option<&Path>,
) -> Result<(), RuntimeError> {
    let config = session.load_config(Some(config_path), &Overrides::default())?;
    if session.rank() != 0 {
        return Ok(());
    }
    let trace = read_trace(trace_path)?;
    let mut rows = Vec::new();
    for gpus in SIZES {
        let request = request(trace_path, gpus, POLICIES.to_vec(), config.policy.gamma, Truth::default());
        let start = Instant::now();
        let runs = run_all(&config, &trace, &request)?;
        let wall = start.elapsed().as_secs_f64();
        println!("{gpus} GPUs, {} steps: {wall:.1} s for {} policies", trace.rows.len(), runs.len());
        print_table(&mut std::io::stdout().lock(), &runs.iter().map(|r| r.0.clone()).collect::<Vec<_>>())?;
        rows.extend(runs.into_iter().map(|(run, _)| Row { gpus, all_policies_wall_s: wall, run }));
    }
    let (nereus_wrong, greedy_wrong) = under_model_error(&config, &trace, trace_path)?;
    let at = |gpus: u32, mode: PolicyMode| rows.iter().find(|r| r.gpus == gpus && r.run.policy == mode);
    let wall = |gpus: u32| at(gpus, PolicyMode::Nereus).map_or(f64::INFINITY, |r| r.all_policies_wall_s);
    let mean = |mode: PolicyMode| at(SIZES[0], mode).map_or(f64::INFINITY, |r| r.run.mean_step_s);
    let share = at(SIZES[0], PolicyMode::Nereus).map_or(f64::INFINITY, |r| 100.0 * r.run.transition_share);
    let steps = trace.rows.len();
    let floors = vec![
        Floor::at_most(&format!("wall_s_{steps}_steps_1024_gpus_4_policies"), wall(1024), 30.0, "s"),
        Floor::at_most(&format!("wall_s_{steps}_steps_16384_gpus_4_policies"), wall(16384), 300.0, "s"),
        Floor::at_most(
            "nereus_over_static_mean_step_1024_gpus",
            mean(PolicyMode::Nereus) / mean(PolicyMode::Static),
            1.0,
            "ratio",
        ),
        Floor::at_most(
            "nereus_over_greedy_mean_step_1024_gpus",
            mean(PolicyMode::Nereus) / mean(PolicyMode::Greedy),
            1.0,
            "ratio",
        ),
        Floor::at_most(
            &format!("nereus_over_greedy_mean_step_1024_gpus_model_error_{MODEL_ERROR}_{}_seeds", SEEDS.len()),
            nereus_wrong / greedy_wrong,
            1.0,
            "ratio",
        ),
        Floor::at_most("nereus_transition_share_1024_gpus", share, 0.5, "%"),
    ];
    BenchReport { bench: "simulate".into(), machine: machine(session), rows, floors }.finish(json)
}

/// Nereus and greedy at 1,024 GPUs when the cost model is wrong by [`MODEL_ERROR`] (the
/// simulator's [`Truth`]): mean step seconds of each, averaged over [`SEEDS`]. With an exact
/// model every predicted gain is real and greedy cannot lose; this is the comparison where
/// admission has something to decide.
fn under_model_error(
    config: &nereus_core::config::JobConfig,
    trace: &nereus_core::sim::Trace,
    trace_path: &Path,
) -> Result<(f64, f64), RuntimeError> {
    let (mut nereus, mut greedy) = (0.0, 0.0);
    println!("model error σ = {MODEL_ERROR} (per plan), 1024 GPUs:");
    for seed in SEEDS {
        let truth = Truth { model_error: MODEL_ERROR, noise: 0.0, seed };
        let policies = vec![PolicyMode::Nereus, PolicyMode::Greedy];
        let request = request(trace_path, SIZES[0], policies, config.policy.gamma, truth);
        let runs = run_all(config, trace, &request)?;
        let mean =
            |mode: PolicyMode| runs.iter().find(|r| r.0.policy == mode).map_or(f64::INFINITY, |r| r.0.mean_step_s);
        let (n, g) = (mean(PolicyMode::Nereus), mean(PolicyMode::Greedy));
        println!("  seed {seed}: nereus {n:.2} s/step, greedy {g:.2} s/step");
        nereus += n / SEEDS.len() as f64;
        greedy += g / SEEDS.len() as f64;
    }
    println!("  mean over {} seeds: nereus {nereus:.2}, greedy {greedy:.2}", SEEDS.len());
    Ok((nereus, greedy))
}

/// A simulation of the benchmark's trace on `gpus` GPUs (no files written).
fn request(trace_path: &Path, gpus: u32, policies: Vec<PolicyMode>, gamma: f64, truth: Truth) -> SimulateRequest {
    SimulateRequest {
        trace: trace_path.to_path_buf(),
        gpus: Some(gpus),
        policies,
        gammas: vec![gamma],
        calibration: None,
        restart: RestartModel::default(),
        truth,
        json: None,
        jsonl: None,
        plot: None,
    }
}
