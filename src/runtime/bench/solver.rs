//! `nereus bench solver`: the planner's plan selection (Eq. 1: per stage, frontiers and the
//! dynamic program over groupings and rank budgets) against an exact MILP over every fitting
//! candidate (`planner::exact`, `microlp` through `good_lp`; build with `--features exact`),
//! for Llama-3.1-8B PPO on 8–64 GPUs: the optimality gap and the time ratio.

use serde::Serialize;
use std::io::Write;
use std::path::Path;
use std::time::Instant;

use super::{machine, median, BenchReport, Floor};
use crate::config::Overrides;
use crate::cost::Efficiencies;
use crate::planner::Planner;
use crate::runtime::{RuntimeError, Session};

/// Pool sizes measured.
pub const SIZES: [u32; 4] = [8, 16, 32, 64];
/// Response lengths measured.
pub const LENGTHS: [u64; 2] = [1024, 4096];

/// One instance.
#[derive(Debug, Clone, Serialize)]
pub struct Row {
    /// GPUs.
    pub gpus: u32,
    /// Response length, tokens.
    pub response_len: u64,
    /// Candidates the MILP chooses among (every fitting one, all stages).
    pub candidates: usize,
    /// The DP's optimum: the sum of the stages' latencies, seconds.
    pub dp_seconds: f64,
    /// The MILP's optimum of the same, seconds.
    pub exact_seconds: f64,
    /// `(dp − exact) / exact`, percent.
    pub gap_pct: f64,
    /// The planner's whole plan (memory caps, rank assignment, weight-sync sweep): its stages'
    /// seconds (weight sync left out), against the same optimum, percent.
    pub plan_gap_pct: f64,
    /// Median seconds of the DP (candidates, frontiers, stage solves).
    pub dp_time_s: f64,
    /// Median seconds of the MILP (candidates, model, solve).
    pub exact_time_s: f64,
    /// `exact_time_s / dp_time_s`.
    pub time_ratio: f64,
}

/// The exact optimum, when the binary has the solver.
#[cfg(feature = "exact")]
fn exact(planner: &Planner) -> Result<Option<f64>, RuntimeError> {
    Ok(crate::planner::exact::plan_optimum(&planner.stage_candidates(), planner.cost().hardware.devices))
}

#[cfg(not(feature = "exact"))]
fn exact(_: &Planner) -> Result<Option<f64>, RuntimeError> {
    Err(RuntimeError::Usage(
        "nereus bench solver needs the exact solver: build with `cargo build --release --features exact`".into(),
    ))
}

/// One instance, timed over `reps` repetitions.
fn instance(planner: &Planner, reps: usize) -> Result<Option<Row>, RuntimeError> {
    let (mut dp_times, mut exact_times) = (Vec::new(), Vec::new());
    let (mut dp, mut best) = (None, None);
    for _ in 0..reps.max(1) {
        let start = Instant::now();
        dp = planner.stage_optima();
        dp_times.push(start.elapsed().as_secs_f64());
        let start = Instant::now();
        best = exact(planner)?;
        exact_times.push(start.elapsed().as_secs_f64());
    }
    let (Some(dp), Some(best)) = (dp, best) else { return Ok(None) };
    let plan = planner.search(None)?;
    let s = plan.step_seconds;
    let stages = s.generation + s.inference + s.training;
    let (dp_time_s, exact_time_s) = (median(dp_times), median(exact_times));
    Ok(Some(Row {
        gpus: planner.cost().hardware.devices,
        response_len: planner.response_len(),
        candidates: planner.stage_candidates().iter().flatten().map(Vec::len).sum(),
        dp_seconds: dp,
        exact_seconds: best,
        gap_pct: 100.0 * (dp - best) / best,
        plan_gap_pct: 100.0 * (stages - best) / best,
        dp_time_s,
        exact_time_s,
        time_ratio: exact_time_s / dp_time_s.max(1e-12),
    }))
}

/// Runs the benchmark (rank 0 solves).
pub fn run(session: &mut Session, config_path: &Path, reps: usize, json: Option<&Path>) -> Result<(), RuntimeError> {
    let config = session.load_config(Some(config_path), &Overrides::default())?;
    if session.rank() != 0 {
        return Ok(());
    }
    let mut rows = Vec::new();
    for gpus in SIZES {
        for len in LENGTHS {
            let planner = Planner::new(&config, gpus, Some(len), Efficiencies::default())?;
            rows.extend(instance(&planner, reps)?);
        }
    }
    let mut out = std::io::stdout().lock();
    let mut text = format!(
        "{:>5} {:>6} {:>6} {:>10} {:>10} {:>7} {:>8} {:>9} {:>10} {:>8}\n",
        "GPUs", "len", "cands", "DP s", "exact s", "gap %", "plan %", "DP ms", "exact ms", "ratio"
    );
    for r in &rows {
        text += &format!(
            "{:>5} {:>6} {:>6} {:>10.3} {:>10.3} {:>7.3} {:>8.3} {:>9.3} {:>10.2} {:>8.0}\n",
            r.gpus,
            r.response_len,
            r.candidates,
            r.dp_seconds,
            r.exact_seconds,
            r.gap_pct,
            r.plan_gap_pct,
            r.dp_time_s * 1e3,
            r.exact_time_s * 1e3,
            r.time_ratio
        );
    }
    out.write_all(text.as_bytes()).map_err(RuntimeError::Stdout)?;
    drop(out);
    let worst = rows.iter().map(|r| r.gap_pct).fold(f64::NEG_INFINITY, f64::max);
    let at_64 = rows.iter().filter(|r| r.gpus == 64).map(|r| r.time_ratio).fold(f64::INFINITY, f64::min);
    let floors = vec![
        Floor::at_most("gap_to_exact_pct_worst", worst, 5.0, "%"),
        Floor::at_least("exact_over_ours_time_at_64_gpus_min", at_64, 100.0, "ratio"),
    ];
    BenchReport { bench: "solver".into(), machine: machine(session), rows, floors }.finish(json)
}
