//! `nereus bench planner`: replan time and peak memory of the plan search from 8 to 16,384 GPUs.
//!
//! A replan is what the controller does on rank 0 when the response length doubles: re-target
//! the planner, search (frontiers, per-stage layouts, rank assignment, the placement-exact
//! memory check) and choose an executable target (the transition DAG from the plan for half the
//! length, its fallbacks). Rank 0 runs it; the job is Llama-3.1-8B PPO by default
//! (`configs/llama3.1-8b-ppo.toml`, H200).

use serde::Serialize;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::Instant;

use crate::alloc_meter;
use nereus_core::config::Overrides;
use nereus_core::cost::Efficiencies;
use nereus_core::planner::Planner;
use nereus_core::transition::{choose, global::Links};
use nereus_runtime::{RuntimeError, Session};

use super::{machine, median, BenchReport, Floor};

/// One pool size.
#[derive(Debug, Clone, Serialize)]
pub struct Row {
    /// GPUs in the pool.
    pub gpus: u32,
    /// Response length planned for.
    pub response_len: u64,
    /// Median replan time, seconds: re-targeting the planner (pool, lengths, calibration), the
    /// whole search and the executable-target choice from the plan for half the length.
    pub replan_seconds: f64,
    /// Median one-time setup, seconds: building the planner from the config (catalogues of
    /// every model), done once per job.
    pub setup_seconds: f64,
    /// Peak heap bytes of one replan (`null` unless the binary meters its heap:
    /// `--features alloc-meter`).
    pub peak_memory_bytes: Option<u64>,
    /// Predicted step latency of the plan found, seconds.
    pub step_latency_s: f64,
}

/// The links a replan's transition is planned over: the cluster's, staging through host memory
/// at the configured host link.
fn links(planner: &Planner, host_gbps: f64) -> Links {
    Links::of(&planner.cost().hardware, Some(host_gbps * 1e9))
}

/// Pool sizes measured.
pub const SIZES: [u32; 12] = [8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384];

/// Replan time and peak memory of the plan search from 8 to 16,384 GPUs.
#[derive(Debug, Clone)]
pub struct Options {
    /// The job to plan (run from the repository root for the default).
    pub config: PathBuf,
    /// Response length in tokens to plan for.
    pub seq_len: u64,
    /// Repetitions per size (the median is reported).
    pub reps: usize,
    /// Also write the report as JSON.
    pub json: Option<PathBuf>,
}

/// Runs the benchmark on every rank with `args`.
pub fn run(session: &mut Session, args: &Options) -> Result<(), RuntimeError> {
    benchmark(session, &args.config, args.seq_len, args.reps, args.json.as_deref())
}

/// Runs the benchmark (rank 0 plans; other ranks only agree on the config).
fn benchmark(
    session: &mut Session,
    config_path: &Path,
    seq_len: u64,
    reps: usize,
    json: Option<&Path>,
) -> Result<(), RuntimeError> {
    let config = session.load_config(Some(config_path), &Overrides::default())?;
    if session.rank() != 0 {
        return Ok(());
    }
    let mut rows = Vec::new();
    for gpus in SIZES {
        let (mut setups, mut replans) = (Vec::new(), Vec::new());
        let mut peak = 0;
        let mut latency = 0.0;
        for _ in 0..reps.max(1) {
            let baseline = alloc_meter::start();
            let start = Instant::now();
            let planner = Planner::new(&config, gpus, Some(seq_len), Efficiencies::default())?;
            setups.push(start.elapsed().as_secs_f64());
            let current = planner.replanned(gpus, (seq_len / 2).max(1), Efficiencies::default())?.search(None)?.plan();
            let start = Instant::now();
            let target = planner.replanned(gpus, seq_len, Efficiencies::default())?;
            let choice = choose(&target, &current, &links(&target, config.cluster.host_link_gbps))?;
            replans.push(start.elapsed().as_secs_f64());
            let job = choice.target;
            peak = peak.max(alloc_meter::peak_above(baseline) as u64);
            latency = job.step_latency_s;
        }
        rows.push(Row {
            gpus,
            response_len: seq_len,
            replan_seconds: median(replans),
            setup_seconds: median(setups),
            peak_memory_bytes: alloc_meter::installed().then_some(peak),
            step_latency_s: latency,
        });
    }
    let mut out = std::io::stdout().lock();
    writeln!(out, "{:>7} {:>12} {:>10} {:>10} {:>10}", "GPUs", "replan ms", "setup ms", "peak MB", "step s")
        .map_err(RuntimeError::Stdout)?;
    for r in &rows {
        writeln!(
            out,
            "{:>7} {:>12.3} {:>10.3} {:>10.2} {:>10.2}",
            r.gpus,
            r.replan_seconds * 1e3,
            r.setup_seconds * 1e3,
            r.peak_memory_bytes.map_or(f64::NAN, |b| b as f64 / 1e6),
            r.step_latency_s
        )
        .map_err(RuntimeError::Stdout)?;
    }
    drop(out);
    let at = |g: u32| rows.iter().find(|r| r.gpus == g).map_or(f64::INFINITY, |r| r.replan_seconds * 1e3);
    let mut floors = vec![
        Floor::at_most("replan_ms_at_32_gpus", at(32), 0.15, "ms"),
        Floor::at_most("replan_ms_at_1024_gpus", at(1024), 5.0, "ms"),
        Floor::at_most("replan_ms_at_16384_gpus", at(16384), 50.0, "ms"),
    ];
    match rows.iter().filter_map(|r| r.peak_memory_bytes).max() {
        Some(peak) => floors.push(Floor::at_most("peak_memory_mb", peak as f64 / 1e6, 100.0, "MB")),
        None => println!("peak heap not measured: this binary does not meter its heap (cargo build --release --features alloc-meter)"),
    }
    BenchReport { bench: "planner".into(), machine: machine(session), rows, floors }.finish(json)
}
