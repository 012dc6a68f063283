//! `nereus bench simulate`: the simulator's own speed and the paper's claims on the shipped
//! length-growth trace (1,000 steps): all four policies at 1,024 and at 16,384 GPUs, timed
//! on this machine; Nereus against static and greedy; the transitions' share of run time.

use serde::Serialize;
use std::path::Path;
use std::time::Instant;

use super::{machine, BenchReport, Floor};
use crate::config::{Overrides, PolicyMode};
use crate::runtime::simulate::{print_table, read_trace, run_all, SimulateRequest};
use crate::runtime::{RuntimeError, Session};
use crate::sim::{RestartModel, RunSummary};

/// Pool sizes simulated.
pub const SIZES: [u32; 2] = [1024, 16384];
/// Policies simulated.
pub const POLICIES: [PolicyMode; 4] = [PolicyMode::Nereus, PolicyMode::Static, PolicyMode::Greedy, PolicyMode::EveryK];

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
        let request = SimulateRequest {
            trace: trace_path.to_path_buf(),
            gpus: Some(gpus),
            policies: POLICIES.to_vec(),
            gammas: vec![config.policy.gamma],
            calibration: None,
            restart: RestartModel::default(),
            json: None,
            jsonl: None,
            plot: None,
        };
        let start = Instant::now();
        let runs = run_all(&config, &trace, &request)?;
        let wall = start.elapsed().as_secs_f64();
        println!("{gpus} GPUs, {} steps: {wall:.1} s for {} policies", trace.rows.len(), runs.len());
        print_table(&mut std::io::stdout().lock(), &runs.iter().map(|r| r.0.clone()).collect::<Vec<_>>())?;
        rows.extend(runs.into_iter().map(|(run, _)| Row { gpus, all_policies_wall_s: wall, run }));
    }
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
        Floor::at_most("nereus_transition_share_1024_gpus", share, 0.5, "%"),
    ];
    BenchReport { bench: "simulate".into(), machine: machine(session), rows, floors }.finish(json)
}
