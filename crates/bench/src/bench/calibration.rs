//! `nereus bench calibration`: does the cost model, calibrated on this machine, predict plans it
//! has not seen?
//!
//! The tiny PPO job (the embedded default) runs on the cluster the start-up probes measure
//! (`configs/clusters/local-detect.toml`: GEMM peak, memory and MPI bandwidth, ranks sharing
//! cores) under fixed plans on 4 and 8 of the world's ranks — every model-stage data-parallel,
//! tensor-parallel, pipelined, or both — at two response lengths. Each plan trains a few steps;
//! the first (warm-up) is dropped and the median of the rest is its measurement per stage.
//! Plans alternate between a fitting half and a held-out half: `Efficiencies::fit_stages` fits
//! one efficiency per operation class to the fitting half's stages (roofline seconds along each
//! stage's critical path against wall seconds, re-fitted three times as the critical paths move),
//! and the planner with those efficiencies predicts the held-out plans, stage by stage.

use serde::Serialize;
use std::collections::BTreeMap;
use std::io::Write;
use std::path::{Path, PathBuf};

use super::{machine, BenchReport, Floor};
use nereus_core::config::{JobConfig, Overrides, PlanEntry};
use nereus_core::cost::{Efficiencies, OpClass, StageSample};
use nereus_core::plan::{model_stages, Plan};
use nereus_core::planner::{fixed_plan, Planner};
use nereus_runtime::train::{run_config, TrainOptions};
use nereus_runtime::{io_error, RuntimeError, Session};

/// The stages of a step as `stage_seconds` names them.
const STAGES: [&str; 4] = ["generation", "inference", "training", "weight_sync"];
/// Layouts every model-stage takes in one plan: `(name, tp, pp)`.
const LAYOUTS: [(&str, u32, u32); 4] = [("dp", 1, 1), ("tp2", 2, 1), ("pp2", 1, 2), ("tp2-pp2", 2, 2)];
/// Stages shorter than this share of the step are left out of the largest stage error (a
/// weight sync that moves nothing takes microseconds either way).
const STAGE_SHARE: f64 = 0.05;
/// Re-fits as the critical paths move with the efficiencies.
const FIT_ROUNDS: usize = 3;

/// One plan's measurement and predictions.
#[derive(Debug, Clone, Serialize)]
pub struct Row {
    /// `<layout>@<ranks>x<response tokens>`.
    pub plan: String,
    /// Ranks the plan uses.
    pub ranks: u32,
    /// Response length.
    pub response_len: u32,
    /// `fit` or `held-out`.
    pub set: &'static str,
    /// Measured seconds per stage (median over the measured steps).
    pub measured: BTreeMap<&'static str, f64>,
    /// Predicted seconds per stage with the default efficiencies.
    pub predicted_default: BTreeMap<&'static str, f64>,
    /// Predicted seconds per stage with the fitted efficiencies.
    pub predicted: BTreeMap<&'static str, f64>,
    /// `|predicted − measured| / measured` of the step, percent.
    pub step_error_pct: f64,
    /// The largest such error over the stages that take at least 5% of the step, percent.
    pub largest_stage_error_pct: f64,
}

/// One plan to run.
struct Case {
    name: String,
    ranks: u32,
    response_len: u32,
    config: JobConfig,
}

/// Runs the benchmark on every rank (8 ranks: `mpirun -n 8`).
pub fn run(
    session: &mut Session,
    cluster: &Path,
    steps: u32,
    out_dir: &Path,
    json: Option<&Path>,
) -> Result<(), RuntimeError> {
    let world = session.world().size();
    if world < 8 {
        return Err(RuntimeError::Usage("bench calibration needs 8 MPI ranks (mpirun -n 8 …)".into()));
    }
    let overrides = Overrides { cluster_file: Some(cluster.to_path_buf()), ..Overrides::default() };
    let base = session.load_config(None, &overrides)?;
    let steps = steps.max(2);
    let cases = cases(&base, world as u32, steps, out_dir)?;
    let mut measured = Vec::new();
    for case in &cases {
        if session.rank() == 0 {
            let _ = std::fs::remove_dir_all(&case.config.job.output_dir);
        }
        session.agree("calibration output", Ok(()))?;
        run_config(session, &case.config, &TrainOptions::default())?;
        measured.push(if session.rank() == 0 { median_stages(&case.config.job.output_dir)? } else { [0.0; 4] });
    }
    if session.rank() != 0 {
        return Ok(());
    }
    let plans: Vec<Plan> = cases
        .iter()
        .map(|c| fixed_plan(&c.config, world as u32).map(|p| p.expect("every case is a fixed plan")))
        .collect::<Result<_, _>>()
        .map_err(RuntimeError::Usage)?;
    let planner_of = |c: &Case, e: Efficiencies| Planner::new(&c.config, world as u32, None, e);
    // Every layout, pool and length lands in both halves: the halves alternate within a
    // pool-and-length group and swap from one group to the next.
    let fitting = |k: usize| (k + k / LAYOUTS.len()).is_multiple_of(2);
    let mut fitted = Efficiencies::default();
    for _ in 0..FIT_ROUNDS {
        let mut samples = Vec::new();
        for (k, case) in cases.iter().enumerate().filter(|(k, _)| fitting(*k)) {
            let parts = planner_of(case, fitted)?.stage_parts(&plans[k]);
            for (s, (_, ideal)) in parts.iter().enumerate() {
                samples.push(StageSample { ideal: ideal.0, measured: measured[k][s] });
            }
        }
        fitted.fit_stages(&samples);
    }
    let mut rows = Vec::new();
    for (k, case) in cases.iter().enumerate() {
        let by_stage = |e: Efficiencies| -> Result<[f64; 4], RuntimeError> {
            Ok(planner_of(case, e)?.stage_parts(&plans[k]).map(|(seconds, _)| seconds))
        };
        let (before, after) = (by_stage(Efficiencies::default())?, by_stage(fitted)?);
        let error = |p: f64, m: f64| 100.0 * (p - m).abs() / m.max(1e-9);
        let named = |v: [f64; 4]| STAGES.iter().copied().zip(v).collect::<BTreeMap<_, _>>();
        rows.push(Row {
            plan: case.name.clone(),
            ranks: case.ranks,
            response_len: case.response_len,
            set: if fitting(k) { "fit" } else { "held-out" },
            step_error_pct: error(after.iter().sum(), measured[k].iter().sum()),
            largest_stage_error_pct: (0..4)
                .filter(|&s| measured[k][s] >= STAGE_SHARE * measured[k].iter().sum::<f64>())
                .map(|s| error(after[s], measured[k][s]))
                .fold(0.0, f64::max),
            measured: named(measured[k]),
            predicted_default: named(before),
            predicted: named(after),
        });
    }
    print(&rows, &fitted)?;
    let held_out: Vec<&Row> = rows.iter().filter(|r| r.set == "held-out").collect();
    let mape = held_out.iter().map(|r| r.step_error_pct).sum::<f64>() / held_out.len().max(1) as f64;
    let worst = held_out.iter().map(|r| r.step_error_pct).fold(0.0, f64::max);
    let floors = vec![
        Floor::at_most("held_out_step_mape_pct", mape, 15.0, "%"),
        Floor::at_most("held_out_largest_step_error_pct", worst, 35.0, "%"),
    ];
    BenchReport { bench: "calibration".into(), machine: machine(session), rows, floors }.finish(json)
}

/// Every plan: 4 layouts × {4, 8} ranks × {16, 24} response tokens, grouped by pool and
/// length.
fn cases(base: &JobConfig, world: u32, steps: u32, out_dir: &Path) -> Result<Vec<Case>, RuntimeError> {
    let mut out = Vec::new();
    for ranks in [4u32, 8] {
        for response_len in [16u32, 24] {
            for (layout, tp, pp) in LAYOUTS {
                let name = format!("{layout}@{ranks}x{response_len}");
                let mut config = base.clone();
                config.job.steps = steps;
                config.job.output_dir = out_dir.join(&name);
                config.train.warmup_actor_steps = 0;
                config.train.warmup_reward_steps = 0;
                config.train.checkpoint_every = 0;
                config.rl.max_response_len = response_len;
                config.train.reward_cap = config.train.reward_cap.min(response_len);
                let dp = ranks / (tp * pp);
                let entry = PlanEntry { tp, pp, dp, ranks: (0..ranks as i32).collect() };
                config.plan =
                    model_stages(config.rl.algorithm).iter().map(|ms| (ms.to_string(), entry.clone())).collect();
                config.validate().map_err(|e| RuntimeError::Usage(format!("calibration plan {name}: {e}")))?;
                fixed_plan(&config, world).map_err(RuntimeError::Usage)?;
                out.push(Case { name, ranks, response_len, config });
            }
        }
    }
    Ok(out)
}

/// The median seconds per stage over a run's steps after the first.
fn median_stages(dir: &Path) -> Result<[f64; 4], RuntimeError> {
    let path: PathBuf = dir.join("metrics.jsonl");
    let text = std::fs::read_to_string(&path).map_err(io_error("read", &path))?;
    let records: Vec<serde_json::Value> = text
        .lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .filter(|r| r["step"].as_u64().is_some_and(|s| s >= 1))
        .collect();
    let mut out = [0.0; 4];
    for (s, name) in STAGES.iter().enumerate() {
        let mut xs: Vec<f64> = records.iter().filter_map(|r| r["stage_seconds"][name].as_f64()).collect();
        xs.sort_by(f64::total_cmp);
        out[s] = xs.get(xs.len() / 2).copied().unwrap_or(0.0);
    }
    Ok(out)
}

fn print(rows: &[Row], fitted: &Efficiencies) -> Result<(), RuntimeError> {
    let mut out = std::io::stdout().lock();
    let line = |out: &mut dyn Write, text: String| writeln!(out, "{text}").map_err(RuntimeError::Stdout);
    line(
        &mut out,
        format!(
            "{:<18} {:>8} {:>10} {:>12} {:>12} {:>8} {:>10}",
            "plan", "set", "step s", "default s", "fitted s", "err %", "stage err%"
        ),
    )?;
    for r in rows {
        let total = |m: &BTreeMap<&str, f64>| m.values().sum::<f64>();
        line(
            &mut out,
            format!(
                "{:<18} {:>8} {:>10.4} {:>12.4} {:>12.4} {:>8.1} {:>10.1}",
                r.plan,
                r.set,
                total(&r.measured),
                total(&r.predicted_default),
                total(&r.predicted),
                r.step_error_pct,
                r.largest_stage_error_pct
            ),
        )?;
    }
    let fitted: Vec<String> = OpClass::ALL.iter().map(|c| format!("{} {:.4}", c.name(), fitted.of(*c))).collect();
    line(&mut out, format!("fitted efficiencies: {}", fitted.join(", ")))
}
