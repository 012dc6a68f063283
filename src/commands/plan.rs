//! `nereus plan [FILE] [--gpus N] [--seq-len L] [--from-seq-len L0] [--from-gpus N0] [--json]`:
//! the fastest memory-feasible plan, the config's fixed plan evaluated, or the what-if
//! transition between two points.

use serde::Serialize;
use std::collections::BTreeMap;
use std::io::Write;
use std::path::PathBuf;

use clap::Args;
use nereus_core::config::check::{MAX_DEVICES, MAX_TOKENS};
use nereus_core::config::JobConfig;
use nereus_core::cost::{Efficiencies, MemoryBreakdown};
use nereus_core::index_list::format_index_list;
use nereus_core::plan::Recompute;
use nereus_core::planner::{fixed_plan, PlannedJob, Planner, StepSeconds};
use nereus_core::transition::choose;
use nereus_core::transition::global::Links;

use super::OverrideArgs;
use crate::error::CommandError;
use crate::launch::{planner_command, Global};

/// One model-stage in `nereus plan --json`.
#[derive(Debug, Serialize)]
pub struct ModelStageOut {
    /// `role/stage`.
    pub model_stage: String,
    /// Tensor parallelism.
    pub tp: u32,
    /// Pipeline parallelism.
    pub pp: u32,
    /// Data parallelism.
    pub dp: u32,
    /// Activation recomputation.
    pub recompute: Recompute,
    /// Sequences per micro-batch.
    pub micro_batch: u32,
    /// World ranks, replica-major.
    pub ranks: Vec<i32>,
    /// Predicted latency per step, seconds.
    pub latency_s: f64,
    /// Predicted peak memory of the fullest rank this model-stage uses (everything that rank
    /// holds: the state of every EMU there and its largest transient), bytes.
    pub peak_memory_bytes: u64,
    /// Its parts.
    pub memory: MemoryBreakdown,
}

/// `nereus plan --json`.
#[derive(Debug, Serialize)]
pub struct PlanOut {
    /// Pool size.
    pub gpus: u32,
    /// Response length planned for.
    pub response_len: u64,
    /// Predicted step latency, seconds.
    pub step_latency_s: f64,
    /// Its parts: `generation`, `inference`, `training`, `weight_sync`.
    pub step_seconds: StepSeconds,
    /// Bytes a device may hold (`device_memory_gb` less the headroom).
    pub usable_memory_bytes: u64,
    /// Predicted peak memory of every rank of the pool.
    pub rank_peak_memory_bytes: Vec<u64>,
    /// Parameters per model (from the catalogue).
    pub parameters: BTreeMap<String, u64>,
    /// Per model-stage.
    pub model_stages: Vec<ModelStageOut>,
}

/// Builds the report of a planned job.
pub fn report(job: &PlannedJob, planner: &Planner, gpus: u32, response_len: u64) -> PlanOut {
    let ranks = &job.rank_peaks.ranks;
    PlanOut {
        gpus,
        response_len,
        step_latency_s: job.step_latency_s,
        step_seconds: job.step_seconds,
        usable_memory_bytes: planner.cost().hardware.usable_bytes(),
        rank_peak_memory_bytes: ranks.iter().map(|r| r.peak()).collect(),
        parameters: planner.parameters().into_iter().map(|(r, n)| (format!("{r:?}").to_lowercase(), n)).collect(),
        model_stages: job
            .model_stages
            .iter()
            .map(|m| {
                let c = m.placement.candidate;
                let fullest = m
                    .placement
                    .ranks
                    .iter()
                    .map(|&r| &ranks[r as usize])
                    .max_by_key(|r| r.peak())
                    .cloned()
                    .unwrap_or_default();
                ModelStageOut {
                    model_stage: c.model_stage.to_string(),
                    tp: c.layout.tp,
                    pp: c.layout.pp,
                    dp: c.dp,
                    recompute: c.recompute,
                    micro_batch: c.micro_batch,
                    ranks: m.placement.ranks.clone(),
                    latency_s: m.estimate.seconds,
                    peak_memory_bytes: fullest.peak(),
                    memory: fullest.at_peak(),
                }
            })
            .collect(),
    }
}

/// `nereus plan`: find the fastest memory-feasible TP/PP/DP plan for a job (per model-stage).
#[derive(Args, Debug, Clone)]
pub struct PlanArgs {
    /// Job file (TOML); the embedded default when omitted.
    pub file: Option<PathBuf>,
    /// GPUs in the pool (default: the cluster's nodes x devices per node).
    #[arg(long, allow_negative_numbers = true)]
    pub gpus: Option<u32>,
    /// Response length in tokens to plan for (default: rl.max_response_len).
    #[arg(long, value_name = "TOKENS", allow_negative_numbers = true)]
    pub seq_len: Option<u64>,
    /// What-if: the response length the current plan was made for; prints the transition
    /// from that plan to the one for --seq-len (ΔL, L_tran, whether it can run).
    #[arg(long, value_name = "TOKENS", allow_negative_numbers = true)]
    pub from_seq_len: Option<u64>,
    /// What-if: the pool the current plan was made for (default: --gpus).
    #[arg(long, value_name = "N", allow_negative_numbers = true)]
    pub from_gpus: Option<u32>,
    /// Print JSON.
    #[arg(long)]
    pub json: bool,
    #[command(flatten)]
    pub overrides: OverrideArgs,
}

/// `nereus plan --from-seq-len/--from-gpus --json`: the what-if transition.
#[derive(Debug, Serialize)]
pub struct WhatIfOut {
    /// The plan for the starting point (`--from-gpus`, `--from-seq-len`).
    pub current: PlanOut,
    /// The plan the job would move to (the current one when it keeps).
    pub target: PlanOut,
    /// `ΔL`: the current plan's predicted step seconds at the new point less the target's
    /// (infinite, written `null` in JSON, when the current plan no longer fits).
    pub delta_l_s: f64,
    /// `L_tran`: the transition DAG's critical path.
    pub l_tran_s: f64,
    /// Whether the target can be reached (or nothing needs to move).
    pub executable: bool,
    /// Whether the job keeps its current plan (nothing better, or nothing better reachable).
    pub keep: bool,
    /// Why the fastest target cannot be reached, if it cannot.
    pub blocked_reason: Option<String>,
    /// 0 when the fastest plan was taken, `k` for the `k`-th slower fallback.
    pub fallback_rank: usize,
    /// Bytes staged through host memory.
    pub staged_bytes: u64,
    /// Primitives of the DAG.
    pub dag_nodes: usize,
    /// Release-before-acquire edges between model-stages.
    pub resource_edges: usize,
}

/// Runs `nereus plan`: every rank agrees on the config; rank 0 plans and prints.
pub fn exec(args: PlanArgs, global: &Global) -> u8 {
    planner_command(global, args.file.as_deref(), &args.overrides.clone().into(), |config, _| plan(config, &args))
}

/// Plans (or evaluates the config's fixed plan, or the what-if transition) and prints.
fn plan(config: &JobConfig, request: &PlanArgs) -> Result<(), CommandError> {
    let gpus = request.gpus.unwrap_or(config.cluster.devices());
    let response_len = request.seq_len.unwrap_or(config.rl.max_response_len.into());
    check_point("", gpus, response_len)?;
    let planner = Planner::new(config, gpus, Some(response_len), Efficiencies::default())?;
    let fixed = fixed_plan(config, gpus).map_err(CommandError::Usage)?;
    let mut w = std::io::stdout().lock();
    if request.from_seq_len.is_some() || request.from_gpus.is_some() {
        let out = what_if(config, request, &planner, fixed.as_ref(), (gpus, response_len))?;
        return if request.json { print_json(&mut w, &out) } else { print_what_if(&mut w, &out) };
    }
    let job = match &fixed {
        Some(plan) => planner.evaluate(plan),
        None => planner.search(None)?,
    };
    let out = report(&job, &planner, gpus, response_len);
    if request.json {
        return print_json(&mut w, &out);
    }
    let source = if fixed.is_some() { "the fixed plan of" } else { "plan for" };
    writeln!(
        w,
        "{source} {} on {gpus} GPUs of {} at {} + {response_len} tokens",
        config.job.name, config.cluster.name, config.rl.prompt_len
    )
    .map_err(CommandError::Stdout)?;
    print_table(&mut w, &out)
}

/// The transition from the plan for `--from-gpus`/`--from-seq-len` to the plan for `to`.
fn what_if(
    config: &JobConfig,
    request: &PlanArgs,
    planner: &Planner,
    fixed: Option<&nereus_core::plan::Plan>,
    (gpus, response_len): (u32, u64),
) -> Result<WhatIfOut, CommandError> {
    let (from_gpus, from_len) = (request.from_gpus.unwrap_or(gpus), request.from_seq_len.unwrap_or(response_len));
    check_point("from-", from_gpus, from_len)?;
    let start = planner.replanned(from_gpus, from_len, Efficiencies::default())?;
    let current = match fixed {
        Some(plan) => start.evaluate(plan),
        None => start.search(None)?,
    };
    let host = Some(config.cluster.host_link_gbps * 1e9);
    let links = Links::of(&planner.cost().hardware, host);
    let choice = choose(planner, &current.plan(), &links)?;
    Ok(WhatIfOut {
        current: report(&current, &start, from_gpus, from_len),
        target: report(&choice.target, planner, gpus, response_len),
        delta_l_s: choice.delta_l_s,
        l_tran_s: choice.l_tran_s,
        executable: choice.blocked_reason.is_none(),
        keep: choice.keep,
        blocked_reason: choice.blocked_reason.clone(),
        fallback_rank: choice.fallback_rank,
        staged_bytes: choice.staged_bytes,
        dag_nodes: choice.counts().nodes,
        resource_edges: choice.counts().resource_edges,
    })
}

fn print_json(w: &mut impl Write, out: &impl Serialize) -> Result<(), CommandError> {
    writeln!(w, "{}", serde_json::to_string_pretty(out).expect("plans serialize")).map_err(CommandError::Stdout)
}

fn print_table(w: &mut impl Write, out: &PlanOut) -> Result<(), CommandError> {
    let line = |w: &mut dyn Write, text: String| writeln!(w, "{text}").map_err(CommandError::Stdout);
    line(
        w,
        format!(
            "{:<22} {:>3} {:>3} {:>4} {:>9} {:>5} {:>11} {:>10}  ranks",
            "model-stage", "tp", "pp", "dp", "recompute", "micro", "latency s", "peak GB"
        ),
    )?;
    for m in &out.model_stages {
        line(
            w,
            format!(
                "{:<22} {:>3} {:>3} {:>4} {:>9} {:>5} {:>11.3} {:>10.2}  {}",
                m.model_stage,
                m.tp,
                m.pp,
                m.dp,
                format!("{:?}", m.recompute).to_lowercase(),
                m.micro_batch,
                m.latency_s,
                m.peak_memory_bytes as f64 / 1e9,
                format_index_list(&m.ranks)
            ),
        )?;
    }
    let worst = out.rank_peak_memory_bytes.iter().copied().max().unwrap_or(0);
    line(
        w,
        format!(
            "predicted step latency: {:.3} s; fullest rank {:.2} GB of {:.2} GB usable{}",
            out.step_latency_s,
            worst as f64 / 1e9,
            out.usable_memory_bytes as f64 / 1e9,
            if worst > out.usable_memory_bytes { " (DOES NOT FIT)" } else { "" }
        ),
    )
}

fn print_what_if(w: &mut impl Write, out: &WhatIfOut) -> Result<(), CommandError> {
    let say = |w: &mut dyn Write, text: String| writeln!(w, "{text}").map_err(CommandError::Stdout);
    say(w, format!("current: {} GPUs at {} response tokens", out.current.gpus, out.current.response_len))?;
    print_table(w, &out.current)?;
    say(w, format!("target: {} GPUs at {} response tokens", out.target.gpus, out.target.response_len))?;
    print_table(w, &out.target)?;
    let verdict = match (&out.blocked_reason, out.keep, out.dag_nodes) {
        (Some(reason), _, _) => format!("keep the current plan: {reason}"),
        (None, true, _) => "keep the current plan: it is still the fastest".to_string(),
        (None, false, 0) => "executable: only micro-batch sizes or recomputation change, no state moves".to_string(),
        (None, false, _) if out.fallback_rank > 0 => format!("executable (fallback {})", out.fallback_rank),
        (None, false, _) => "executable".to_string(),
    };
    let delta = if out.delta_l_s.is_finite() {
        format!("ΔL {:.3} s/step", out.delta_l_s)
    } else {
        "ΔL unbounded (the current plan does not fit the new point)".to_string()
    };
    say(
        w,
        format!(
            "{delta}, L_tran {:.3} s, {} primitives, {} resource edges, {} bytes staged through host memory: {verdict}",
            out.l_tran_s, out.dag_nodes, out.resource_edges, out.staged_bytes
        ),
    )
}

/// Bounds `--gpus` and `--seq-len` (with `prefix`, `--from-gpus` and `--from-seq-len`) like the
/// config's own keys (a plan for 2^32 GPUs or 2^64 tokens is a typo, and would allocate tables
/// that size).
fn check_point(prefix: &str, gpus: u32, response_len: u64) -> Result<(), CommandError> {
    if gpus == 0 || gpus > MAX_DEVICES {
        return Err(CommandError::Usage(format!("--{prefix}gpus {gpus}: must be between 1 and {MAX_DEVICES}")));
    }
    if response_len == 0 || response_len > u64::from(MAX_TOKENS) {
        return Err(CommandError::Usage(format!(
            "--{prefix}seq-len {response_len}: must be between 1 and {MAX_TOKENS} tokens"
        )));
    }
    Ok(())
}
