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
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use super::{machine, BenchReport, Floor};
use nereus_core::config::{JobConfig, Overrides, PlanEntry};
use nereus_core::cost::{Efficiencies, OpClass, OpSeconds, StageSample};
use nereus_core::plan::{model_stages, PerPhase, Plan};
use nereus_core::planner::{fixed_plan, Planner, StepSeconds};
use nereus_core::record::StepLine;
use nereus_runtime::train::metrics::MetricsLog;
use nereus_runtime::train::{run_config, TrainOptions};
use nereus_runtime::{RuntimeError, Session};

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
    pub measured: StepSeconds,
    /// Predicted seconds per stage with the default efficiencies.
    pub predicted_default: StepSeconds,
    /// Predicted seconds per stage with the fitted efficiencies.
    pub predicted: StepSeconds,
    /// `|predicted − measured| / measured` of the step, percent.
    pub step_error_pct: f64,
    /// The largest such error over the stages that take at least 5% of the step, percent.
    pub largest_stage_error_pct: f64,
    /// Roofline seconds per stage and operation class along each stage's critical path at the
    /// fitted efficiencies (the last fit round divided those of the round before).
    pub roofline_ops: PerPhase<OpSeconds>,
    /// Measured seconds per stage and operation class (the slowest rank's timers, median).
    pub measured_ops: PerPhase<OpSeconds>,
}

/// One plan to run.
struct Case {
    name: String,
    ranks: u32,
    response_len: u32,
    config: JobConfig,
}

/// The cost model calibrated on this machine: the tiny PPO job under 16 fixed plans on 4 and
/// 8 ranks, efficiencies fitted on half, the other half predicted (mpirun -n 8).
#[derive(Debug, Clone)]
pub struct Options {
    /// Cluster file whose detected figures the start-up probes measure.
    pub cluster: PathBuf,
    /// Training steps per plan (the first is a warm-up and not measured).
    pub steps: u32,
    /// Where the plans' runs are written (replaced).
    pub out_dir: PathBuf,
    /// Also write the report as JSON.
    pub json: Option<PathBuf>,
    /// Busy threads rank 0 spins beside the measurement, standing in for other work on the
    /// node's cores (a loaded machine); 0, the default, measures a quiet one. The floors hold
    /// for a quiet machine only; a loaded run reports its errors without them.
    pub load: u32,
}

/// Runs the benchmark on every rank with `args`.
pub fn run(session: &mut Session, args: &Options) -> Result<(), RuntimeError> {
    let _load = (session.rank() == 0).then(|| Load::start(args.load));
    benchmark(session, &args.cluster, args.steps, &args.out_dir, args.json.as_deref(), args.load)
}

/// Threads that keep cores busy until dropped.
struct Load {
    stop: Arc<AtomicBool>,
    threads: Vec<std::thread::JoinHandle<()>>,
}

impl Load {
    fn start(threads: u32) -> Load {
        let stop = Arc::new(AtomicBool::new(false));
        let spin = |stop: Arc<AtomicBool>| {
            move || {
                let mut x = 0u64;
                while !stop.load(Ordering::Relaxed) {
                    x = std::hint::black_box(x.wrapping_mul(6364136223846793005).wrapping_add(1));
                }
            }
        };
        let threads = (0..threads).map(|_| std::thread::spawn(spin(stop.clone()))).collect();
        Load { stop, threads }
    }
}

impl Drop for Load {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }
}

/// Runs the benchmark on every rank (8 ranks: `mpirun -n 8`).
fn benchmark(
    session: &mut Session,
    cluster: &Path,
    steps: u32,
    out_dir: &Path,
    json: Option<&Path>,
    load: u32,
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
        let root = session.rank() == 0;
        if root {
            measured.push(medians(&case.config.job.output_dir)?);
        }
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
            for (phase, (_, ideal)) in parts.iter() {
                let timed = Some(*measured[k].ops.get(phase));
                samples.push(StageSample { ideal: *ideal, measured: *measured[k].stages.get(phase), timed });
            }
        }
        fitted.fit_stages(&samples);
    }
    let mut rows = Vec::new();
    for (k, case) in cases.iter().enumerate() {
        let before = planner_of(case, Efficiencies::default())?.step_seconds(&plans[k]);
        let after = planner_of(case, fitted)?.stage_parts(&plans[k]);
        let set = if fitting(k) { "fit" } else { "held-out" };
        rows.push(row(case, set, measured[k], before, &after));
    }
    print(&rows, &fitted)?;
    let floors = floors(&rows, load);
    BenchReport { bench: "calibration".into(), machine: machine(session), rows, floors }.finish(json)
}

/// `case`'s row: what it measured against the default efficiencies' prediction (`before`)
/// and the fitted ones' seconds and roofline per stage (`after`).
fn row(
    case: &Case,
    set: &'static str,
    measured: Medians,
    before: StepSeconds,
    after: &PerPhase<(f64, OpSeconds)>,
) -> Row {
    let predicted = after.map(|(seconds, _)| *seconds);
    let error = |p: f64, m: f64| 100.0 * (p - m).abs() / m.max(1e-9);
    let Medians { stages, ops } = measured;
    Row {
        plan: case.name.clone(),
        ranks: case.ranks,
        response_len: case.response_len,
        set,
        step_error_pct: error(predicted.total(), stages.total()),
        largest_stage_error_pct: stages
            .iter()
            .filter(|(_, &m)| m >= STAGE_SHARE * stages.total())
            .map(|(phase, &m)| error(*predicted.get(phase), m))
            .fold(0.0, f64::max),
        measured: stages,
        predicted_default: before,
        predicted,
        roofline_ops: after.map(|(_, ideal)| *ideal),
        measured_ops: ops,
    }
}

/// Issue 29's floors on the held-out plans' step errors, for a quiet machine; a loaded run
/// prints the same figures and has no floors.
fn floors(rows: &[Row], load: u32) -> Vec<Floor> {
    let held_out: Vec<&Row> = rows.iter().filter(|r| r.set == "held-out").collect();
    let mape = held_out.iter().map(|r| r.step_error_pct).sum::<f64>() / held_out.len().max(1) as f64;
    let worst = held_out.iter().map(|r| r.step_error_pct).fold(0.0, f64::max);
    if load > 0 {
        println!("loaded by {load} busy threads: held-out MAPE {mape:.1}%, largest error {worst:.1}% (no floors)");
        return Vec::new();
    }
    vec![
        Floor::at_most("held_out_step_mape_pct", mape, 10.0, "%"),
        Floor::at_most("held_out_largest_step_error_pct", worst, 25.0, "%"),
    ]
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

/// A run's measurements: the median seconds per phase, and per phase and operation class
/// (the slowest rank's timers), over its steps after the first.
#[derive(Clone, Copy)]
struct Medians {
    stages: StepSeconds,
    ops: PerPhase<OpSeconds>,
}

fn medians(dir: &Path) -> Result<Medians, RuntimeError> {
    let lines: Vec<StepLine> = MetricsLog::of(dir).step_lines()?.into_iter().filter(|l| l.step >= 1).collect();
    let median = |mut xs: Vec<f64>| {
        xs.sort_by(f64::total_cmp);
        xs.get(xs.len() / 2).copied().unwrap_or(0.0)
    };
    Ok(Medians {
        stages: StepSeconds::from_fn(|phase| median(lines.iter().map(|l| *l.stage_seconds.get(phase)).collect())),
        ops: PerPhase::from_fn(|phase| {
            OpSeconds(std::array::from_fn(|k| {
                median(lines.iter().map(|l| l.op_seconds.measured.get(phase).0[k]).collect())
            }))
        }),
    })
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
        let total = |m: &StepSeconds| m.total();
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
