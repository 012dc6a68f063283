//! `nereus bench simulate`: the simulator's own speed and the paper's claims on the shipped
//! length-growth trace (1,000 steps): all four policies at 1,024 and at 16,384 GPUs on one
//! simulated machine, timed on this machine; then Nereus against static, greedy and every-k at
//! 1,024 GPUs on five machines (the default [`Truth`], not the cost model), mean and spread;
//! the transitions' share of run time.

use serde::Serialize;
use std::path::{Path, PathBuf};
use std::time::Instant;

use super::{machine, BenchReport, Floor};
use nereus_core::config::{Overrides, PolicyMode};
use nereus_core::sim::{
    compare, read_trace, spread_table, spreads, table, Comparison, PolicySpread, RestartModel, RunSummary, SimOptions,
    Truth,
};
use nereus_runtime::{RuntimeError, Session};

/// Pool sizes simulated.
pub const SIZES: [u32; 2] = [1024, 16384];
/// Policies simulated.
pub const POLICIES: [PolicyMode; 4] = [PolicyMode::Nereus, PolicyMode::Static, PolicyMode::Greedy, PolicyMode::EveryK];

/// Machines (seeds) of the comparison.
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
#[derive(Debug, Clone)]
pub struct Options {
    /// The job to simulate (run from the repository root for the default).
    pub config: PathBuf,
    /// The trace (its available_gpus column, if any, is replaced by each size).
    pub trace: PathBuf,
    /// Also write the report as JSON.
    pub json: Option<PathBuf>,
}

/// Runs the benchmark on every rank with `args`.
pub fn run(session: &mut Session, args: &Options) -> Result<(), RuntimeError> {
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
        let comparison = comparison(gpus, POLICIES.to_vec(), config.policy.gamma, vec![SEEDS[0]]);
        let start = Instant::now();
        let runs = compare(&config, &trace, &comparison).map_err(sim_error)?;
        let wall = start.elapsed().as_secs_f64();
        println!("{gpus} GPUs, {} steps: {wall:.1} s for {} policies", trace.rows.len(), runs.len());
        print!("{}", table(&runs.iter().map(|r| r.0.clone()).collect::<Vec<_>>()));
        rows.extend(runs.into_iter().map(|(run, _)| Row { gpus, all_policies_wall_s: wall, run }));
    }
    let spreads = over_seeds(&config, &trace)?;
    let at = |gpus: u32, mode: PolicyMode| rows.iter().find(|r| r.gpus == gpus && r.run.policy == mode);
    let wall = |gpus: u32| at(gpus, PolicyMode::Nereus).map_or(f64::INFINITY, |r| r.all_policies_wall_s);
    let share = at(SIZES[0], PolicyMode::Nereus).map_or(f64::INFINITY, |r| 100.0 * r.run.transition_share);
    let steps = trace.rows.len();
    let mut floors = vec![
        Floor::at_most(&format!("wall_s_{steps}_steps_1024_gpus_4_policies"), wall(1024), 30.0, "s"),
        Floor::at_most(&format!("wall_s_{steps}_steps_16384_gpus_4_policies"), wall(16384), 300.0, "s"),
    ];
    for s in spreads.iter().filter(|s| s.policy != PolicyMode::Nereus) {
        // The other policy over Nereus, seed by seed: Nereus is no worse than 1.01× when this
        // mean is at least 1/1.01.
        let ratio = s.over_nereus.map_or(0.0, |r| r.mean);
        let name =
            format!("{}_over_nereus_mean_step_1024_gpus_{}_seeds", s.policy.name().replace('-', "_"), SEEDS.len());
        floors.push(Floor::at_least(&name, ratio, 1.0 / 1.01, "ratio"));
    }
    floors.push(Floor::at_most("nereus_transition_share_1024_gpus", share, 0.5, "%"));
    BenchReport { bench: "simulate".into(), machine: machine(session), rows, floors }.finish(json)
}

/// Every policy at 1,024 GPUs on the machines of [`SEEDS`]: mean and spread per policy, and
/// each against Nereus seed by seed.
fn over_seeds(
    config: &nereus_core::config::JobConfig,
    trace: &nereus_core::sim::Trace,
) -> Result<Vec<PolicySpread>, RuntimeError> {
    let comparison = comparison(SIZES[0], POLICIES.to_vec(), config.policy.gamma, SEEDS.to_vec());
    let runs = compare(config, trace, &comparison).map_err(sim_error)?;
    let spreads = spreads(&runs.iter().map(|r| r.0.clone()).collect::<Vec<_>>(), config.policy.gamma);
    println!("{} GPUs on {} machines:", SIZES[0], SEEDS.len());
    print!("{}", spread_table(&spreads));
    Ok(spreads)
}

/// A comparison of `policies` on `gpus` GPUs at `gamma` on the default machine of each of
/// `seeds`.
fn comparison(gpus: u32, policies: Vec<PolicyMode>, gamma: f64, seeds: Vec<u64>) -> Comparison {
    let options = SimOptions { efficiencies: None, restart: RestartModel::default(), truth: Truth::default() };
    Comparison { gpus: Some(gpus), policies, gammas: vec![gamma], options, seeds }
}

/// A simulation that cannot run is the user's to fix (a bad trace), as `nereus simulate` says.
fn sim_error(e: nereus_core::sim::SimError) -> RuntimeError {
    match e {
        nereus_core::sim::SimError::Io(e) => RuntimeError::Io(e),
        e => RuntimeError::Usage(e.to_string()),
    }
}
