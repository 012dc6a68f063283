//! `nereus bench simulate`: the simulator's own speed and the paper's claims on the shipped
//! length-growth trace (1,000 steps): all four policies at 1,024 and at 16,384 GPUs, timed
//! on this machine; Nereus against static and greedy (with the cost model as the ground truth,
//! and again with it wrong by the error `bench calibration` measured); the transitions' share
//! of run time.

use serde::Serialize;
use std::path::{Path, PathBuf};
use std::time::Instant;

use super::{machine, BenchReport, Floor};
use nereus_core::config::{Overrides, PolicyMode};
use nereus_core::sim::{compare, read_trace, table, Comparison, RestartModel, RunSummary, SimOptions, Truth};
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

/// The simulator: a 1,000-step length-growth trace, four policies, at 1,024 and 16,384 GPUs.
#[derive(Debug, Clone, clap::Args)]
pub struct Args {
    /// The job to simulate (run from the repository root for the default).
    #[arg(long, default_value = "configs/llama3.1-8b-ppo.toml")]
    pub config: PathBuf,
    /// The trace (its available_gpus column, if any, is replaced by each size).
    #[arg(long, default_value = "configs/traces/growth-1000.csv")]
    pub trace: PathBuf,
    /// Also write the report as JSON.
    #[arg(long, value_name = "PATH")]
    pub json: Option<PathBuf>,
}

/// Runs the benchmark on every rank with `args`.
pub fn run(session: &mut Session, args: &Args) -> Result<(), RuntimeError> {
    benchmark(session, &args.config, &args.trace, args.json.as_deref())
}

/// Runs the benchmark (rank 0 simulates).
fn benchmark(
    session: &mut Session,
    config_path: &Path,
    trace_path: &Path,
    json: Option<&Path>,
) -> Result<(), RuntimeError> {
    let config = session.load_config(Some(config_path), &Overrides::default())?;
    if session.rank() != 0 {
        return Ok(());
    }
    let trace = read_trace(trace_path).map_err(sim_error)?;
    let mut rows = Vec::new();
    for gpus in SIZES {
        let comparison = comparison(gpus, POLICIES.to_vec(), config.policy.gamma, Truth::default());
        let start = Instant::now();
        let runs = compare(&config, &trace, &comparison).map_err(sim_error)?;
        let wall = start.elapsed().as_secs_f64();
        println!("{gpus} GPUs, {} steps: {wall:.1} s for {} policies", trace.rows.len(), runs.len());
        print!("{}", table(&runs.iter().map(|r| r.0.clone()).collect::<Vec<_>>()));
        rows.extend(runs.into_iter().map(|(run, _)| Row { gpus, all_policies_wall_s: wall, run }));
    }
    let (nereus_wrong, greedy_wrong) = under_model_error(&config, &trace)?;
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
) -> Result<(f64, f64), RuntimeError> {
    let (mut nereus, mut greedy) = (0.0, 0.0);
    println!("model error σ = {MODEL_ERROR} (per plan), 1024 GPUs:");
    for seed in SEEDS {
        let truth = Truth { model_error: MODEL_ERROR, noise: 0.0, seed };
        let policies = vec![PolicyMode::Nereus, PolicyMode::Greedy];
        let comparison = comparison(SIZES[0], policies, config.policy.gamma, truth);
        let runs = compare(config, trace, &comparison).map_err(sim_error)?;
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

/// A comparison of `policies` on `gpus` GPUs at `gamma` against `truth`.
fn comparison(gpus: u32, policies: Vec<PolicyMode>, gamma: f64, truth: Truth) -> Comparison {
    let options = SimOptions { efficiencies: None, restart: RestartModel::default(), truth };
    Comparison { gpus: Some(gpus), policies, gammas: vec![gamma], options }
}

/// A simulation that cannot run is the user's to fix (a bad trace), as `nereus simulate` says.
fn sim_error(e: nereus_core::sim::SimError) -> RuntimeError {
    match e {
        nereus_core::sim::SimError::Io(e) => RuntimeError::Io(e),
        e => RuntimeError::Usage(e.to_string()),
    }
}
