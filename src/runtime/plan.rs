//! `nereus plan CONFIG --gpus N [--seq-len L] [--json]`: the fastest memory-feasible plan.

use serde::Serialize;
use std::collections::BTreeMap;
use std::io::Write;
use std::path::Path;

use crate::config::check::{MAX_DEVICES, MAX_TOKENS};
use crate::config::Overrides;
use crate::cost::{Efficiencies, MemoryBreakdown};
use crate::plan::Recompute;
use crate::planner::{PlannedJob, Planner, StepSeconds};
use crate::topology::format_index_list;

use super::{RuntimeError, Session};

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

/// Every rank agrees on the config; rank 0 plans and prints.
pub fn run(
    session: &mut Session,
    path: Option<&Path>,
    overrides: &Overrides,
    gpus: Option<u32>,
    seq_len: Option<u64>,
    json: bool,
) -> Result<(), RuntimeError> {
    let config = session.load_config(path, overrides)?;
    if session.rank() != 0 {
        return Ok(());
    }
    let gpus = gpus.unwrap_or(config.cluster.devices());
    let response_len = seq_len.unwrap_or(config.rl.max_response_len.into());
    check_what_if(gpus, response_len)?;
    let planner = Planner::new(&config, gpus, Some(response_len), Efficiencies::default())?;
    let job = planner.search(None)?;
    let out = report(&job, &planner, gpus, response_len);
    let mut w = std::io::stdout().lock();
    if json {
        writeln!(w, "{}", serde_json::to_string_pretty(&out).expect("plans serialize"))
            .map_err(RuntimeError::Stdout)?;
        return Ok(());
    }
    writeln!(
        w,
        "plan for {} on {gpus} GPUs of {} at {} + {response_len} tokens",
        config.job.name, config.cluster.name, config.rl.prompt_len
    )
    .map_err(RuntimeError::Stdout)?;
    writeln!(
        w,
        "{:<22} {:>3} {:>3} {:>4} {:>9} {:>5} {:>11} {:>10}  ranks",
        "model-stage", "tp", "pp", "dp", "recompute", "micro", "latency s", "peak GB"
    )
    .map_err(RuntimeError::Stdout)?;
    for m in &out.model_stages {
        writeln!(
            w,
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
        )
        .map_err(RuntimeError::Stdout)?;
    }
    writeln!(w, "predicted step latency: {:.3} s", out.step_latency_s).map_err(RuntimeError::Stdout)?;
    Ok(())
}

/// Bounds `--gpus` and `--seq-len` like the config's own keys (a plan for 2^32 GPUs or
/// 2^64 tokens is a typo, and would allocate tables that size).
fn check_what_if(gpus: u32, response_len: u64) -> Result<(), RuntimeError> {
    if gpus == 0 || gpus > MAX_DEVICES {
        return Err(RuntimeError::Usage(format!("--gpus {gpus}: must be between 1 and {MAX_DEVICES}")));
    }
    if response_len == 0 || response_len > u64::from(MAX_TOKENS) {
        return Err(RuntimeError::Usage(format!(
            "--seq-len {response_len}: must be between 1 and {MAX_TOKENS} tokens"
        )));
    }
    Ok(())
}
