//! `nereus bench controller`: the time of one controller decision — monitor → triggers →
//! replan → executable target (transition DAG and its fallbacks) → admission — through the
//! same `policy::controller` code the live runtime runs on rank 0.
//!
//! Two sources of monitor records:
//! - the tiny PPO job on 8 devices, replaying the recorded run `docs/runs/tiny-ppo.metrics.jsonl`
//!   (measured step and stage seconds, response lengths);
//! - Llama-3.1-8B PPO (`configs/llama3.1-8b-ppo.toml`) at 1,024 and 16,384 GPUs, from monitor
//!   records the cost model writes: responses growing from 1,024 toward 8,192 tokens (a 30%
//!   crossing about every five steps) and measured seconds that are the prediction of the
//!   current plan with a deterministic ±8% wobble. No such machine is here; what is timed is
//!   the decision, which depends only on the records and the plans.

use serde::Serialize;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::Instant;

use nereus_core::config::{JobConfig, Overrides, PolicyMode};
use nereus_core::plan::Plan;
use nereus_core::planner::initial_plan;
use nereus_core::policy::controller::{Controller, StepRecord};
use nereus_core::record::StepLine;
use nereus_runtime::{RuntimeError, Session};

use super::{machine, median, BenchReport, Floor};

/// The recorded tiny run the first case replays.
pub const TINY_RECORDS: &str = "docs/runs/tiny-ppo.metrics.jsonl";
/// The tiny job (its recorded run).
pub const TINY_CONFIG: &str = "configs/tiny-ppo.toml";
/// GPU counts of the Llama cases.
pub const LLAMA_GPUS: [u32; 2] = [1024, 16384];
/// Response tokens (p95) of the Llama cases' first step.
const LLAMA_FIRST_LEN: f64 = 1024.0;
/// Steps of the Llama cases' monitor records.
const LLAMA_STEPS: u64 = 40;

/// One job and pool: the decisions over its monitor records.
#[derive(Debug, Clone, Serialize)]
pub struct Row {
    /// Which job and records.
    pub case: String,
    /// Devices in the pool.
    pub gpus: u32,
    /// Decisions taken (one per record).
    pub decisions: usize,
    /// Decisions in which a trigger fired (the full path: replan, DAG, admission).
    pub replans: usize,
    /// Of those, transitions admitted.
    pub admitted: usize,
    /// Median seconds of a decision with a replan.
    pub replan_median_s: f64,
    /// Slowest decision with a replan, seconds.
    pub replan_max_s: f64,
    /// Median seconds of a quiet decision (monitor and calibration only).
    pub quiet_median_s: f64,
}

/// The time of one controller decision: the tiny job's recorded run, and Llama-3.1-8B PPO
/// at 1,024 and 16,384 GPUs from modelled monitor records.
#[derive(Debug, Clone)]
pub struct Options {
    /// The large job (run from the repository root for the defaults).
    pub config: PathBuf,
    /// Also write the report as JSON.
    pub json: Option<PathBuf>,
}

/// Runs the benchmark on every rank with `args`.
pub fn run(session: &mut Session, args: &Options) -> Result<(), RuntimeError> {
    benchmark(session, &args.config, args.json.as_deref())
}

/// Runs the benchmark on rank 0 (pure; other ranks return at once).
fn benchmark(session: &mut Session, llama: &Path, json: Option<&Path>) -> Result<(), RuntimeError> {
    let tiny = session.load_config(Some(Path::new(TINY_CONFIG)), &Overrides::default())?;
    let llama = session.load_config(Some(llama), &Overrides::default())?;
    if session.rank() != 0 {
        return Ok(());
    }
    let records = recorded(Path::new(TINY_RECORDS))?;
    let replay = |_: &JobConfig, _: u32, step: u64, _: &Plan| records.get(step as usize).cloned();
    let mut rows = vec![time_decisions("tiny PPO, recorded run", &tiny, 8, replay)?];
    let mut llama = llama;
    // The controller plans the first step for the lengths it starts with, not for the limit.
    llama.policy.initial_response_len = LLAMA_FIRST_LEN as u32;
    for gpus in LLAMA_GPUS {
        rows.push(time_decisions("Llama-3.1-8B PPO, modelled records", &llama, gpus, llama_record)?);
    }
    print(&rows)?;
    let at = |g: u32| {
        rows.iter().find(|r| r.gpus == g && r.case.starts_with("Llama")).map_or(f64::INFINITY, |r| r.replan_max_s * 1e3)
    };
    let floors = vec![
        Floor::at_most("decision_ms_at_1024_gpus (slowest)", at(1024), 20.0, "ms"),
        Floor::at_most("decision_ms_at_16384_gpus (slowest)", at(16384), 200.0, "ms"),
    ];
    BenchReport { bench: "controller".into(), machine: machine(session), rows, floors }.finish(json)
}

/// Feeds the monitor records `record(config, gpus, step, plan in force)` gives (until `None`)
/// to a fresh `nereus` controller for `config` on `gpus` devices, applying its targets as the
/// live runtime does, and times every decision.
fn time_decisions(
    case: &str,
    config: &JobConfig,
    gpus: u32,
    record: impl Fn(&JobConfig, u32, u64, &Plan) -> Option<StepRecord>,
) -> Result<Row, RuntimeError> {
    let mut config = config.clone();
    config.policy.mode = PolicyMode::Nereus;
    let (mut plan, planner, cap) = initial_plan(&config, gpus)?;
    let mut controller = Controller::new(&config, planner, cap);
    let (mut replans, mut quiet, mut admitted) = (Vec::new(), Vec::new(), 0);
    for step in 0.. {
        let Some(record) = record(&config, gpus, step, &plan) else { break };
        let start = Instant::now();
        let action = controller.decide(&record, &plan)?;
        let seconds = start.elapsed().as_secs_f64();
        if action.decision.is_none() {
            quiet.push(seconds);
            continue;
        }
        replans.push(seconds);
        if let Some(target) = action.target {
            plan = target;
            admitted += 1;
        }
    }
    Ok(Row {
        case: case.into(),
        gpus,
        decisions: replans.len() + quiet.len(),
        replans: replans.len(),
        admitted,
        replan_max_s: replans.iter().copied().fold(0.0, f64::max),
        replan_median_s: median(replans),
        quiet_median_s: median(quiet),
    })
}

/// What the controller was shown of every step of a recorded `metrics.jsonl`.
fn recorded(path: &Path) -> Result<Vec<StepRecord>, RuntimeError> {
    let text = nereus_core::file_error::read_regular_string(path).map_err(|e| {
        RuntimeError::Usage(format!("cannot read {} (run from the repository root): {}", path.display(), e.source))
    })?;
    text.lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| {
            let line: StepLine =
                serde_json::from_str(l).map_err(|e| RuntimeError::Usage(format!("{}: {e}", path.display())))?;
            Ok(line.observed())
        })
        .collect()
}

/// A modelled monitor record for a large job: lengths growing 5.5% a step from 1,024 tokens;
/// seconds the cost model's prediction of the plan in force at that length, ±8%.
fn llama_record(config: &JobConfig, gpus: u32, step: u64, plan: &Plan) -> Option<StepRecord> {
    let max = f64::from(config.rl.max_response_len);
    (step < LLAMA_STEPS).then(|| {
        let len = (LLAMA_FIRST_LEN * 1.055f64.powi(step as i32)).min(max);
        let wobble = 1.0 + 0.08 * ((step as f64) * 2.39996).sin();
        let seconds = nereus_core::planner::Planner::new(config, gpus, Some(len as u64), Default::default())
            .map(|p| p.step_seconds(plan))
            .ok();
        let stage_seconds = seconds.map(|s| s.map(|v| v * wobble)).filter(|s| s.total().is_finite());
        StepRecord {
            step,
            response_len_mean: len * 0.8,
            response_len_p95: len,
            step_seconds: seconds.map_or(0.0, |s| s.total() * wobble),
            stage_seconds,
            ..StepRecord::default()
        }
    })
}

fn print(rows: &[Row]) -> Result<(), RuntimeError> {
    let mut out = std::io::stdout().lock();
    writeln!(
        out,
        "{:<36} {:>6} {:>9} {:>7} {:>8} {:>14} {:>12} {:>12}",
        "case", "GPUs", "decisions", "replans", "admitted", "replan med ms", "replan max ms", "quiet med ms"
    )
    .map_err(RuntimeError::Stdout)?;
    for r in rows {
        writeln!(
            out,
            "{:<36} {:>6} {:>9} {:>7} {:>8} {:>14.3} {:>12.3} {:>12.3}",
            r.case,
            r.gpus,
            r.decisions,
            r.replans,
            r.admitted,
            r.replan_median_s * 1e3,
            r.replan_max_s * 1e3,
            r.quiet_median_s * 1e3
        )
        .map_err(RuntimeError::Stdout)?;
    }
    Ok(())
}
