//! `nereus train`: a fixed-plan RL job on the reference engine. Every rank checks the job and
//! computes the same plan, rank 0 prepares the output directory, every rank creates the plan's
//! EMUs from the warm-up or a verified checkpoint, then steps; rank 0 prints one line per step
//! and appends the same as a JSON object to `<output_dir>/metrics.jsonl`.
//!
//! Every phase that ranks run on their own ends with an agreement ([`Session::agree`]), so a
//! failure on some ranks stops all of them at once with one message; a failure inside a step
//! (an out-of-memory on some ranks) aborts the job from the failing rank.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde_json::json;

use super::checkpoint::{
    self, fill_shard, open_weights, resume, Checkpoints, Expect, ModelToSave, ModelWeights, ResumeFrom, ResumeOptions,
    SaveOptions, Sidecar, TensorFile,
};
use super::controller::{decide, transition, Action, Boundary, Controller, StepRecord};
use super::fault::{pool_ranks, rank_fault, surviving};
use super::metrics::MetricsLog;
use super::pool::{PoolSignal, PoolSource};
use super::signals::{self, StopSignals};
use super::timeline::Timeline;
use super::{io_error, RuntimeError, Session};
use nereus_core::config::hf;
use nereus_core::config::{DataPlane as PlaneKind, Dtype, JobConfig, ModelSpec, OnNonFinite, Overrides, PolicyMode};
use nereus_core::cost::{MemoryBreakdown, MemoryItem, OpClass, RankPeaks};
use nereus_core::index_list::format_index_list;
use nereus_core::model::{Catalogue, Numerics, OutputHead};
use nereus_core::plan::{ModelStage, Placement, Plan, Role, Stage};
use nereus_core::planner::{catalogues, initial_plan, Planner, StepSeconds};
use nereus_core::units::format_bytes;
use nereus_exec::backend::check_data_plane;
use nereus_exec::comm::{max_over_ranks, DataPlane, MpiPlane};
use nereus_exec::emu::{Counters, EmuError, EmuSet, LocalShard};
use nereus_exec::engine::{init_piece, init_shard};
use nereus_exec::rl::{warm_up, RlJob, StepMetrics, StepSettings, Warmup, EOS};

/// How `nereus train` starts.
#[derive(Debug, Clone, Default)]
pub struct TrainOptions {
    /// `--resume DIR|latest|auto`.
    pub resume: Option<ResumeFrom>,
    /// `--resume-reset-optimizer`: resume without the optimizer state.
    pub reset_optimizer: bool,
    /// `--pool`: the ranks the job may use at the start.
    pub pool: Option<String>,
    /// `--fail-rank`: a rank declared lost (with `fail_at_step`).
    pub fail_rank: Option<u32>,
    /// `--at-step`: the step at whose start `fail_rank` is lost.
    pub fail_at_step: Option<u64>,
}

/// Consecutive steps with skipped updates after which `on_nonfinite = "skip-step"` gives up.
const MAX_SKIPPING_STEPS: u32 = 3;

/// One model's initial state: parameters (a tensor absent there starts fresh: a value head
/// on a causal LM), and the moments of a resumed checkpoint.
struct Source {
    params: ModelWeights,
    optimizer: Option<ModelWeights>,
}

/// Where each model's initial weights come from (a model without one is initialized by the
/// engine).
struct Sources {
    files: BTreeMap<Role, Source>,
    counters: BTreeMap<String, Counters>,
    start_step: u64,
}

/// Runs `nereus train` on every rank.
pub fn run(
    session: &mut Session,
    path: Option<&Path>,
    overrides: &Overrides,
    options: &TrainOptions,
) -> Result<(), RuntimeError> {
    let config = session.load_config(path, overrides)?;
    run_config(session, &config, options)
}

/// Trains the job `config` describes (already agreed by every rank).
pub fn run_config(session: &Session, config: &JobConfig, options: &TrainOptions) -> Result<(), RuntimeError> {
    let world = session.world().size();
    let out = config.job.output_dir.clone();
    let checkpoints = Checkpoints::of(&out);
    let metrics = MetricsLog::of(&out);
    let resume_dir = resume_directory(session, &out, &checkpoints, &metrics, options.resume.as_ref())?;
    let pools = session.agree("pool", pool_source(config, options, world as u32))?;
    let first_step = resume_dir.as_deref().map_or(0, checkpoint_step);
    let mut pool = agreed_pool(session, &pools, first_step)?;
    let (mut plan, planner, cap) = session.agree("job checks", job_checks(config, pool as i32))?;
    let mut predicted = Predicted::of(&planner, &plan);
    let signals = StopSignals::install(config.job.checkpoint_on_signal.as_deref())?;
    // SIGUSR1 re-reads the pool file at once, unless it asks for a checkpoint and stop.
    let follows_pool = config.policy.mode != PolicyMode::Off;
    let _pool_signal = (follows_pool && config.job.checkpoint_on_signal.as_deref() != Some("SIGUSR1"))
        .then(|| PoolSignal::install(&pools, session.rank()))
        .transpose()?;
    let mut settings = StepSettings::new(config);
    settings.sampling.max_new_tokens = cap as usize;
    let mut controller = (config.policy.mode != PolicyMode::Off && session.rank() == 0)
        .then(|| Controller::new(config, planner.clone(), cap));
    let mut plane = MpiPlane::new(session.world(), session.watchdog().clone());
    let sources = match &resume_dir {
        Some(dir) => from_checkpoint(session, dir, config, options)?,
        None => initial_sources(session, &mut plane, config, &settings, &out.join("warmup"))?,
    };
    let mut set = create_state(&mut plane, config, &plan, &sources, world)?;
    let mut job = RlJob::new(&mut plane, &set, plan.clone(), settings.clone())?;
    if session.rank() == 0 {
        print_plan(&plan);
    }
    if let Some(dir) = &resume_dir {
        let marker = (session.rank() == 0).then(|| resume_marker(&metrics, dir, sources.start_step));
        session.agree("metrics", marker.unwrap_or(Ok(())))?;
    }
    let mut skipping = 0;
    let mut timeline = Timeline::default();
    let fault = session.agree("faults", rank_fault(config, (options.fail_rank, options.fail_at_step), world as u32))?;
    let mut lost: Vec<u32> = Vec::new();
    for step in sources.start_step..u64::from(config.job.steps) {
        let m = job.step(&mut plane, &mut set, step)?;
        let elastic = pools.is_elastic() || fault.is_some();
        // Ledgers at the end of the step, before a boundary moves anything (recorded when the
        // pool can change).
        let held = if elastic { held_bytes(&mut plane, &set)? } else { Vec::new() };
        let before = (plan.clone(), predicted.clone(), pool, lost.clone());
        let boundary = if config.policy.mode == PolicyMode::Off {
            Boundary::default()
        } else {
            let mut live =
                Live { plane: &mut plane, set: &mut set, job: &mut job, plan: &mut plan, settings: &mut settings };
            let loss = match fault.filter(|f| f.at_step == step + 1) {
                Some(f) => Some(lose_rank(session, config, options, &mut live, &mut lost, f.rank)?),
                None => None,
            };
            let survivors = world as u32 - lost.len() as u32;
            let next_pool = (session.rank() == 0).then(|| next_pool(&pools, step + 1, pool).min(survivors));
            let action = decide(session, controller.as_mut(), &step_record(step, &m, next_pool, &lost), live.plan)?;
            pool = action.pool;
            let mut b = act(session, config, &action, &mut live, &mut predicted)?;
            if let Some(loss) = loss {
                if action.target.is_none() {
                    *live.job = RlJob::new(live.plane, live.set, live.plan.clone(), live.settings.clone())?;
                }
                b.rank_loss = loss;
            }
            if let (Some(c), Some(measured)) = (controller.as_mut(), b.transition.get("seconds")) {
                c.transitioned(
                    b.transition["predicted_seconds"].as_f64().unwrap_or(0.0),
                    measured.as_f64().unwrap_or(0.0),
                );
            }
            if let Some(reason) = &action.stop {
                let saved = save(&mut plane, &set, &job, config, step + 1, &checkpoints);
                let dir = session.agree("checkpoint", saved)?;
                return Err(RuntimeError::ControllerStop { step, reason: reason.clone(), checkpoint: dir });
            }
            b
        };
        let mut record = record(&mut plane, &set, &before.0, &before.1, step, &m, &boundary)?;
        if elastic {
            record["pool"] = json!(format_index_list(&pool_ranks(before.2, &before.3)));
            record["held_bytes"] = json!(held);
            record["lost_ranks"] = json!(before.3);
            record["rank_loss"] = boundary.rank_loss.clone();
        }
        if session.rank() == 0 {
            print_step(step, &m, &before.0);
            print_boundary(&boundary);
            timeline.push(
                step,
                (m.step_seconds, before.1.seconds.total()),
                m.response_len_mean,
                m.generated_tokens,
                before.2,
                &boundary.transition,
            );
        }
        session.agree("metrics", if session.rank() == 0 { metrics.append(&record) } else { Ok(()) })?;
        skipping = check_finite(config, step, &m, skipping)?;
        let signal = signals::name(max_over_ranks(
            session.world(),
            session.watchdog(),
            "stop-signal check",
            signals.received().map_or(0, signal_number),
        ) as i32);
        let every = u64::from(config.train.checkpoint_every);
        let done = step + 1;
        if signal.is_some() || done == u64::from(config.job.steps) || (every > 0 && done % every == 0) {
            let saved = save(&mut plane, &set, &job, config, done, &checkpoints);
            let dir = session.agree("checkpoint", saved)?;
            if session.rank() == 0 {
                log::info!("checkpoint of step {done} written to {}", dir.display());
            }
            if let Some(signal) = signal {
                return Err(RuntimeError::Preempted { signal, step: done, checkpoint: dir });
            }
        }
    }
    if session.rank() == 0 && config.policy.mode != PolicyMode::Off {
        println!("{}", timeline.summary());
        match timeline.write(&out, "timeline") {
            Ok(()) => log::info!("timeline written to {}", out.join("timeline.{svg,png}").display()),
            Err(e) => log::warn!("could not write the timeline to {}: {e}", out.display()),
        }
    }
    Ok(())
}

/// What the controller is shown of step `step` (the same fields its JSON line carries), with
/// the pool of the next step.
fn step_record(step: u64, m: &StepMetrics, pool_size: Option<u32>, lost_ranks: &[u32]) -> StepRecord {
    StepRecord {
        step,
        response_len_mean: m.response_len_mean,
        response_len_p95: m.response_len_p95,
        step_seconds: m.step_seconds,
        stage_seconds: m.stage_seconds.clone(),
        pool_size,
        lost_ranks: lost_ranks.to_vec(),
        transition: None,
    }
}

/// Bytes each rank's ledger holds now (all-gathered): zero on ranks outside the pool.
fn held_bytes(plane: &mut MpiPlane, set: &EmuSet) -> Result<Vec<u64>, RuntimeError> {
    gather_u64s(plane, set.world_size(), &[set.store().ledger().used()])
}

/// Every rank's `local` values, rank after rank (one all-gather over the world).
fn gather_u64s(plane: &mut MpiPlane, world: i32, local: &[u64]) -> Result<Vec<u64>, RuntimeError> {
    let group = plane.group(&(0..world).collect::<Vec<_>>())?;
    let mut all = vec![0u8; 8 * local.len() * world as usize];
    plane.all_gather(group, bytemuck::cast_slice(local), &mut all)?;
    Ok(all.chunks_exact(8).map(|b| u64::from_le_bytes(b.try_into().unwrap_or([0; 8]))).collect())
}

/// Where the job's pool comes from; a pool other than the world needs a controller to follow it.
fn pool_source(config: &JobConfig, options: &TrainOptions, world: u32) -> Result<PoolSource, RuntimeError> {
    let pools = PoolSource::new(config.pool.trace.as_deref(), &config.job.output_dir, options.pool.as_deref(), world)?;
    if pools.is_elastic() && config.policy.mode == PolicyMode::Off {
        return Err(RuntimeError::Usage(
            "[pool] trace, --pool or <output_dir>/pool change the ranks a job may use, and policy.mode = \"off\" never moves it: set policy.mode (or --policy) to nereus, static, greedy or every-k".into(),
        ));
    }
    Ok(pools)
}

/// The pool of `step` at a boundary of a running job, as rank 0 reads it. A pool file it cannot
/// use keeps the pool in force, with a warning each step until the file is fixed: an
/// operator's typo must not stop a job that is running fine.
fn next_pool(pools: &PoolSource, step: u64, in_force: u32) -> u32 {
    pools.at(step).unwrap_or_else(|e| {
        log::warn!("{e}; keeping the pool of {in_force} ranks");
        in_force
    })
}

/// The pool of `step` as rank 0 reads it (the operator's file may change at any time).
fn agreed_pool(session: &Session, pools: &PoolSource, step: u64) -> Result<u32, RuntimeError> {
    let local = if session.rank() == 0 { pools.at(step).map(|n| n.to_le_bytes().to_vec()) } else { Ok(Vec::new()) };
    let agreed = session.from_root("pool", local)?;
    Ok(u32::from_le_bytes(agreed.try_into().unwrap_or([0; 4])))
}

/// The step a checkpoint directory `step-N` continues from.
fn checkpoint_step(dir: &Path) -> u64 {
    dir.file_name()
        .and_then(|n| n.to_str())
        .and_then(|n| n.strip_prefix("step-"))
        .and_then(|n| n.parse().ok())
        .unwrap_or(0)
}

/// Rank `gone` is lost at this boundary: on every rank the replicas that had a shard there are
/// dropped (freed, never read), and each model-stage left without a replica is restored from the
/// latest complete checkpoint (`fault::surviving` says where). The live plan becomes what
/// remains; returns the record of the loss.
fn lose_rank(
    session: &Session,
    config: &JobConfig,
    options: &TrainOptions,
    live: &mut Live,
    lost: &mut Vec<u32>,
    gone: u32,
) -> Result<serde_json::Value, RuntimeError> {
    lost.push(gone);
    lost.sort_unstable();
    let world = session.world().size() as u32;
    let (mut plan, restore) = session.agree("rank loss", surviving(live.plan, gone as i32, lost, world))?;
    let dropped: Vec<_> =
        live.set.emus().filter(|e| e.ranks.contains(&(gone as i32))).map(|e| e.id).collect::<Vec<_>>();
    for id in &dropped {
        live.set.lose(*id);
    }
    let mut checkpoint = None;
    if !restore.is_empty() {
        let latest = Checkpoints::of(&config.job.output_dir).latest().ok_or_else(|| {
            RuntimeError::Usage(format!(
                "rank {gone} was lost with the last replica of {} and there is no complete checkpoint to restore it from (train.checkpoint_every)",
                restore[0].candidate.model_stage
            ))
        });
        let dir = session.agree("rank loss", latest)?;
        let sources = from_checkpoint(session, &dir, config, options)?;
        for p in &restore {
            create_replica(live.plane, live.set, config, &sources, p, &p.ranks)?;
        }
        checkpoint = Some(dir);
    }
    plan.placements.extend(restore.iter().cloned());
    let order: Vec<_> = live.plan.placements.iter().map(|p| p.candidate.model_stage).collect();
    plan.placements.sort_by_key(|p| order.iter().position(|m| *m == p.candidate.model_stage));
    *live.plan = plan;
    if session.rank() == 0 {
        log::warn!(
            "rank {gone} lost: {} replicas dropped, {} restored from {}",
            dropped.len(),
            restore.len(),
            checkpoint.as_ref().map_or("no checkpoint".into(), |d| d.display().to_string())
        );
    }
    Ok(json!({
        "rank": gone,
        "replicas_dropped": dropped.len(),
        "restored": restore.iter().map(|p| p.candidate.model_stage.to_string()).collect::<Vec<_>>(),
        "checkpoint": checkpoint,
    }))
}

/// The live job a step boundary may reshape.
struct Live<'a, 'p> {
    plane: &'a mut MpiPlane<'p>,
    set: &'a mut EmuSet,
    job: &'a mut RlJob,
    plan: &'a mut Plan,
    settings: &'a mut StepSettings,
}

/// Carries out the controller's `action` on every rank: the transition to its target (if
/// any), then the RL job rebuilt over the EMUs for the new plan and response cap — the same
/// parameters, moments, counters, data position and seeds, the same global batch.
fn act(
    session: &Session,
    config: &JobConfig,
    action: &Action,
    live: &mut Live,
    predicted: &mut Predicted,
) -> Result<Boundary, RuntimeError> {
    let world = session.world().size() as u32;
    let cap = action.cap;
    let planner = Planner::new(config, world, Some(u64::from(cap)), action.efficiencies)?;
    let mut boundary = Boundary { decision: action.decision.clone(), ..Boundary::default() };
    let kind = action.decision.get("kind").and_then(|k| k.as_str());
    if let Some(target) = &action.target {
        let host = config.cluster.host_link_gbps * 1e9;
        boundary.transition = transition(session, live.plane, live.set, &planner, host, (live.plan, target), kind)?;
        *live.plan = target.clone();
    }
    if action.target.is_some() || live.settings.sampling.max_new_tokens != cap as usize {
        live.settings.sampling.max_new_tokens = cap as usize;
        *live.job = RlJob::new(live.plane, live.set, live.plan.clone(), live.settings.clone())?;
    }
    *predicted = Predicted::of(&planner, live.plan);
    Ok(boundary)
}

/// Every replica of the plan, filled from `sources` (or the engine's initialization). Room is
/// checked by one all-reduce per replica, so a plan that does not fit fails on every rank at
/// the same replica, before anything is filled.
fn create_state(
    plane: &mut MpiPlane,
    config: &JobConfig,
    plan: &Plan,
    sources: &Sources,
    world: i32,
) -> Result<EmuSet, RuntimeError> {
    let mut set = EmuSet::new(plane.rank(), world, device_memory(config), job_catalogues(config));
    for p in &plan.placements {
        for r in 0..p.candidate.dp as usize {
            create_replica(plane, &mut set, config, sources, p, p.replica(r))?;
        }
    }
    Ok(set)
}

/// One replica of `placement`'s model-stage on `ranks`, filled from `sources` (or the engine's
/// initialization), with the sources' counters.
fn create_replica(
    plane: &mut MpiPlane,
    set: &mut EmuSet,
    config: &JobConfig,
    sources: &Sources,
    placement: &Placement,
    ranks: &[i32],
) -> Result<(), RuntimeError> {
    let ms = placement.candidate.model_stage;
    let counters = sources
        .counters
        .get(&ms.to_string())
        .copied()
        .unwrap_or(Counters { seed: config.job.seed, ..Counters::default() });
    let seed = config.job.seed ^ ms.role as u64;
    let fill = |shard: &mut LocalShard, catalogue: &Catalogue| match sources.files.get(&ms.role) {
        Some(source) => {
            let mut fresh = |piece: &_, out: &mut [f32]| {
                init_piece(out, catalogue, piece, seed);
                Ok(())
            };
            fill_shard(shard, catalogue, &source.params, source.optimizer.as_ref(), &mut fresh)
        }
        None => init_shard(shard, catalogue, seed).map_err(|e| e.to_string()),
    };
    set.create(plane, ms, placement.candidate.layout, ranks, counters, fill).map_err(|e| match e {
        EmuError::NoRoom { .. } => RuntimeError::everywhere("state creation", e.into()),
        e => e.into(),
    })?;
    Ok(())
}

/// The memory the ranks' ledgers allow: the configured device memory, or less under the test
/// hook `NEREUS_FAULT_MEMORY_BYTES` (a device whose memory another process took; the plan is
/// still made for the configured size, so the engine meets the shortage at allocation time).
fn device_memory(config: &JobConfig) -> u64 {
    let configured = config.cluster.device_memory_bytes();
    std::env::var("NEREUS_FAULT_MEMORY_BYTES")
        .ok()
        .and_then(|v| v.parse().ok())
        .map_or(configured, |v: u64| v.min(configured))
}

fn signal_number(name: &str) -> u64 {
    (1..64).find(|&s| signals::name(s) == Some(name)).map_or(0, |s| s as u64)
}

/// What every rank checks before touching anything: the engine can run this job here (f32
/// models, the MPI data plane, room for the rollout), and the plan.
fn job_checks(config: &JobConfig, world: i32) -> Result<(Plan, Planner, u32), RuntimeError> {
    for (role, spec) in config.models.roles() {
        if spec.dtype != Dtype::F32 {
            return Err(RuntimeError::Usage(format!(
                "models.{role}.dtype = {:?}: the CPU reference engine computes in f32 (bf16 and f16 models are planned with `nereus plan`, and trained by the GPU engines)",
                format!("{:?}", spec.dtype).to_lowercase()
            )));
        }
    }
    check_data_plane(config.cluster.data_plane).map_err(RuntimeError::Backend)?;
    if config.cluster.data_plane != PlaneKind::Mpi {
        return Err(RuntimeError::Usage(format!(
            "cluster.data_plane = \"{}\": the CPU reference engine moves tensors over MPI; set data_plane = \"mpi\"",
            serde_json::to_value(config.cluster.data_plane)
                .ok()
                .and_then(|v| v.as_str().map(String::from))
                .unwrap_or_default()
        )));
    }
    let s = StepSettings::new(config);
    // Tokens, the five per-position arrays, the inference buffer and the assembled samples.
    let rollout = 11 * 4 * s.sequences() as u64 * s.seq_len() as u64;
    let capacity = config.cluster.device_memory_bytes();
    if rollout > capacity {
        return Err(RuntimeError::Usage(format!(
            "one step's rollout ({} sequences × {} tokens) needs {} on every rank, and a rank has {} (cluster.device_memory_gb); lower rl.prompts_per_step, rl.samples_per_prompt or rl.max_response_len",
            s.sequences(),
            s.seq_len(),
            format_bytes(rollout),
            format_bytes(capacity)
        )));
    }
    job_plan(config, world)
}

/// The plan the job starts with, the planner that predicts it and the response cap it is made
/// for ([`initial_plan`]: the one function `nereus simulate` starts from too).
fn job_plan(config: &JobConfig, world: i32) -> Result<(Plan, Planner, u32), RuntimeError> {
    Ok(initial_plan(config, world as u32)?)
}

/// Rank 0 makes the output directory ready — created, writable, the leftovers of an
/// interrupted save removed, a torn metrics line cut — and finds the checkpoint to resume
/// from; every rank learns the outcome and the directory.
fn resume_directory(
    session: &Session,
    out: &Path,
    checkpoints: &Checkpoints,
    metrics: &MetricsLog,
    from: Option<&ResumeFrom>,
) -> Result<Option<PathBuf>, RuntimeError> {
    let local = if session.rank() == 0 { prepare_output(out, checkpoints, metrics, from) } else { Ok(None) };
    let path = |dir: Option<PathBuf>| dir.map(|d| d.to_string_lossy().into_owned().into_bytes()).unwrap_or_default();
    let bytes = session.from_root("output directory", local.map(path))?;
    Ok((!bytes.is_empty()).then(|| PathBuf::from(String::from_utf8_lossy(&bytes).into_owned())))
}

fn prepare_output(
    out: &Path,
    checkpoints: &Checkpoints,
    metrics: &MetricsLog,
    from: Option<&ResumeFrom>,
) -> Result<Option<PathBuf>, RuntimeError> {
    std::fs::create_dir_all(out).map_err(io_error("create directory", out))?;
    let probe = out.join(".nereus-write-test");
    std::fs::write(&probe, b"").map_err(io_error("write into", out))?;
    std::fs::remove_file(&probe).map_err(io_error("remove", &probe))?;
    for stale in checkpoints.clean_stale()? {
        log::warn!("removed {} (left by an interrupted checkpoint)", stale.display());
    }
    let torn = metrics.repair()?;
    if torn > 0 {
        log::warn!("cut a torn last line ({torn} bytes) off {}", metrics.path().display());
    }
    let dir = checkpoints.resolve(from)?;
    if dir.is_none() {
        let mut found = Vec::new();
        if std::fs::metadata(metrics.path()).is_ok_and(|m| m.len() > 0) {
            found.push("metrics.jsonl".to_string());
        }
        if let Some((step, _)) = checkpoints.complete().last() {
            found.push(format!("checkpoints up to step {step}"));
        }
        if !found.is_empty() {
            return Err(checkpoint::CheckpointError::ExistingRun { dir: out.into(), found: found.join(", ") }.into());
        }
    }
    Ok(dir)
}

/// Every model, its optimizer state and its counters from checkpoint `dir`, verified against
/// the job: every rank checks the sidecar and the files' structure, rank 0 also every byte.
fn from_checkpoint(
    session: &Session,
    dir: &Path,
    config: &JobConfig,
    options: &TrainOptions,
) -> Result<Sources, RuntimeError> {
    let resume_options = ResumeOptions { reset_optimizer: options.reset_optimizer };
    let opened = resume::open(dir, config, &job_catalogues(config), resume_options, session.rank() == 0);
    let resumed = session.agree("checkpoint verification", opened.map_err(RuntimeError::from))?;
    let mut counters = resumed.sidecar.counters.clone();
    if options.reset_optimizer {
        for (name, c) in counters.iter_mut().filter(|(name, _)| name.ends_with("/training")) {
            if session.rank() == 0 {
                log::warn!(
                    "--resume-reset-optimizer: {name} restarts AdamW from zero moments (update count {} -> 0)",
                    c.updates
                );
            }
            c.updates = 0;
        }
    }
    if session.rank() == 0 {
        log::info!("resuming from {} (step {}, verified)", dir.display(), resumed.sidecar.step);
    }
    let files = resumed
        .models
        .into_iter()
        .map(|(role, m)| (role, Source { params: m.params, optimizer: m.optimizer }))
        .collect();
    Ok(Sources { files, counters, start_step: resumed.sidecar.step })
}

/// Marks a resume in the metrics: from which step and checkpoint, and how many step records it
/// supersedes (a run resumed from an earlier checkpoint runs those steps again).
fn resume_marker(metrics: &MetricsLog, dir: &Path, from_step: u64) -> Result<(), RuntimeError> {
    let superseded = metrics.steps_from(from_step).len();
    if superseded > 0 {
        log::warn!(
            "resuming at step {from_step}: {superseded} step records already in {} are superseded",
            metrics.path().display()
        );
    }
    metrics.append(
        &json!({"event": "resume", "from_step": from_step, "checkpoint": dir, "superseded_records": superseded}),
    )
}

/// The catalogues of the job's models, each computing with its model's RoPE and RMSNorm
/// numbers (the planner's catalogues describe shapes only).
fn job_catalogues(config: &JobConfig) -> BTreeMap<Role, Catalogue> {
    catalogues(config)
        .into_iter()
        .map(|(role, c)| (role, c.with_numerics(Numerics::from_spec(spec(config, role)))))
        .collect()
}

fn spec(config: &JobConfig, role: Role) -> &ModelSpec {
    let roles = config.models.roles();
    roles.into_iter().find(|(name, _)| *name == role.name()).map_or(&config.models.actor, |(_, s)| s)
}

/// Where a model of a fresh job starts.
#[derive(Debug, Clone, PartialEq)]
enum Origin {
    /// A Hugging Face model directory.
    Dir(PathBuf),
    /// The supervised warm-up of this model.
    WarmUp(Role),
    /// The engine's initialization.
    Engine,
}

/// Where `role` starts: its own `path`; else the actor's and the reward model's warm-ups; the
/// reference starts as the actor does, and the critic as the reward model when their
/// architectures match (InstructGPT's choice).
fn origin(config: &JobConfig, role: Role) -> Origin {
    if let Some(dir) = &spec(config, role).path {
        return Origin::Dir(dir.clone());
    }
    let t = &config.train;
    let reward = config.models.reward.architecture_map();
    match role {
        Role::Actor if t.warmup_actor_steps > 0 => Origin::WarmUp(Role::Actor),
        Role::Reward if t.warmup_reward_steps > 0 => Origin::WarmUp(Role::Reward),
        Role::Reference => origin(config, Role::Actor),
        Role::Critic if spec(config, Role::Critic).architecture_map() == reward => origin(config, Role::Reward),
        _ => Origin::Engine,
    }
}

/// The initial weights of a fresh job: model directories (opened and checked on every rank),
/// then the supervised warm-ups the config asks for, for models without a directory.
fn initial_sources(
    session: &Session,
    plane: &mut MpiPlane,
    config: &JobConfig,
    settings: &StepSettings,
    dir: &Path,
) -> Result<Sources, RuntimeError> {
    let cats = job_catalogues(config);
    let opened = open_model_dirs(config, &cats, session.rank() == 0);
    let mut files = session.agree("model directories", opened)?;
    let t = &config.train;
    for (role, kind, steps) in
        [(Role::Actor, Warmup::Actor, t.warmup_actor_steps), (Role::Reward, Warmup::RewardModel, t.warmup_reward_steps)]
    {
        if steps == 0 || !cats.contains_key(&role) {
            continue;
        }
        if let Origin::Dir(from) = origin(config, role) {
            if session.rank() == 0 {
                log::warn!(
                    "the {} model starts from {}: its {steps} warm-up steps are skipped",
                    role.name(),
                    from.display()
                );
            }
            continue;
        }
        let path = warm_up_path(dir, role);
        run_warm_up(session, plane, config, settings, role, kind, steps, &path)?;
    }
    for &role in cats.keys() {
        if let Origin::WarmUp(from) = origin(config, role) {
            let params = ModelWeights::single(TensorFile::open(&warm_up_path(dir, from))?)?;
            files.insert(role, Source { params, optimizer: None });
        }
    }
    Ok(Sources { files, counters: BTreeMap::new(), start_step: 0 })
}

/// Opens the model directory of every model that starts from one, and checks its tensors
/// against the model's catalogue (every rank maps the files; only headers are read here). A
/// value model starting from a causal LM gets a fresh `score.weight`, logged by rank 0.
fn open_model_dirs(
    config: &JobConfig,
    cats: &BTreeMap<Role, Catalogue>,
    log: bool,
) -> Result<BTreeMap<Role, Source>, RuntimeError> {
    let mut out = BTreeMap::new();
    for (&role, catalogue) in cats {
        let Origin::Dir(dir) = origin(config, role) else { continue };
        let found = hf::read_model_config(&dir).map_err(|reason| {
            RuntimeError::Usage(format!("models.{}.path = `{}`: {reason}", role.name(), dir.display()))
        })?;
        let value = catalogue.arch.head == OutputHead::Value;
        if found.value_head && !value {
            return Err(RuntimeError::Usage(format!(
                "models.{}.path = `{}` holds a sequence classifier ({}); the {} model needs a causal LM",
                role.name(),
                dir.display(),
                found.json["architectures"],
                role.name()
            )));
        }
        let fresh: &[&str] = if value && !found.value_head { &["score.weight"] } else { &[] };
        let params = open_weights(&dir)?;
        let absent = params.check(catalogue, &[""], Expect::Pretrained { fresh })?;
        if log && !absent.is_empty() {
            log::info!(
                "the {} model starts from the causal LM in {}: its value head score.weight [1, {}] is new, initialized from the seed",
                role.name(),
                dir.display(),
                catalogue.arch.hidden
            );
        }
        out.insert(role, Source { params, optimizer: None });
    }
    Ok(out)
}

/// Runs one supervised warm-up (every rank) and saves its output at `path`.
#[allow(clippy::too_many_arguments)]
fn run_warm_up(
    session: &Session,
    plane: &mut MpiPlane,
    config: &JobConfig,
    settings: &StepSettings,
    role: Role,
    kind: Warmup,
    steps: u32,
    path: &Path,
) -> Result<(), RuntimeError> {
    let world = session.world().size();
    let memory = match config.train.warmup_memory_gb {
        gb if gb > 0.0 => (gb * 1e9) as u64,
        _ => config.cluster.device_memory_bytes(),
    };
    let mut set = EmuSet::new(plane.rank(), world, memory, job_catalogues(config));
    let ms = ModelStage::new(role, Stage::Training);
    let (id, loss) = warm_up(
        plane,
        &mut set,
        ms,
        kind,
        &settings.task,
        config.job.seed,
        steps,
        settings.sequences(),
        // The task's full length, whatever cap a controller starts the RL job with.
        config.rl.max_response_len as usize,
        config.train.warmup_lr,
    )?;
    let saved = checkpoint::save_params_file(plane, &set, role, id, path);
    session.agree("warm-up output", saved.map_err(RuntimeError::from))?;
    if plane.rank() == 0 {
        log::info!("warm-up of the {} model: {steps} steps, final loss {loss:.4}", role.name());
    }
    Ok(())
}

fn warm_up_path(dir: &Path, role: Role) -> PathBuf {
    dir.join(checkpoint::params_file(role.name()))
}

/// Stops on a non-finite update (`on_nonfinite = "stop"`), or counts steps with skipped updates
/// and stops after [`MAX_SKIPPING_STEPS`] in a row; returns the new count. Every rank holds the
/// same metrics, so every rank decides alike.
fn check_finite(config: &JobConfig, step: u64, m: &StepMetrics, skipping: u32) -> Result<u32, RuntimeError> {
    let Some(nf) = m.non_finite else { return Ok(0) };
    let diverged = RuntimeError::Diverged {
        step,
        model_stage: nf.model_stage.to_string(),
        quantity: nf.quantity,
        value: nf.value,
    };
    match config.train.on_nonfinite {
        OnNonFinite::Stop => Err(diverged),
        OnNonFinite::SkipStep if skipping + 1 >= MAX_SKIPPING_STEPS => Err(diverged),
        OnNonFinite::SkipStep => {
            log::warn!(
                "step {step}: {} update(s) skipped ({} of {} is {})",
                m.skipped_updates,
                nf.quantity,
                nf.model_stage,
                nf.value
            );
            Ok(skipping + 1)
        }
    }
}

/// Saves every model (its first training replica, or first replica) as checkpoint `step`
/// (every rank calls it; see [`checkpoint::save`]).
fn save(
    plane: &mut MpiPlane,
    set: &EmuSet,
    job: &RlJob,
    config: &JobConfig,
    step: u64,
    checkpoints: &Checkpoints,
) -> Result<PathBuf, RuntimeError> {
    let origins: BTreeMap<Role, Origin> = job.replicas.keys().map(|ms| (ms.role, origin(config, ms.role))).collect();
    let mut models: Vec<ModelToSave> = Vec::new();
    for (ms, ids) in &job.replicas {
        let role = ms.role;
        let training = ModelStage::new(role, Stage::Training);
        // A model that trains is saved from its training replica (with Adam's moments).
        if models.iter().any(|m| m.role == role) || (!ms.trains() && job.replicas.contains_key(&training)) {
            continue;
        }
        let source = match &origins[&role] {
            Origin::Dir(dir) => Some(dir.as_path()),
            _ => None,
        };
        let value_head = matches!(role, Role::Critic | Role::Reward);
        models.push(ModelToSave { role, emu: ids[0], architecture: spec(config, role), value_head, source });
    }
    let counters =
        job.replicas.iter().filter_map(|(ms, ids)| set.emu(ids[0]).map(|e| (ms.to_string(), e.counters))).collect();
    let sidecar = Sidecar {
        format: checkpoint::FORMAT,
        job: config.job.name.clone(),
        algorithm: config.rl.algorithm.name().into(),
        seed: config.job.seed,
        step,
        prompts_per_step: config.rl.prompts_per_step,
        data_position: step * u64::from(config.rl.prompts_per_step),
        counters,
        models: BTreeMap::new(),
        rng: "counter-based: draws are functions of (seed, sequence id, position)".into(),
        sha256: String::new(),
    };
    let settings = StepSettings::new(config);
    let options = SaveOptions {
        max_shard_bytes: config.train.checkpoint_shard_bytes(),
        max_position_embeddings: settings.seq_len() as u64,
        eos_token_id: Some(EOS),
        temperature: config.train.temperature,
        top_p: config.train.top_p,
    };
    Ok(checkpoint::save(plane, set, &models, sidecar, checkpoints, &options)?)
}

/// What the cost model predicts for the plan the job runs, recorded beside every measurement.
#[derive(Clone)]
struct Predicted {
    peaks: RankPeaks,
    seconds: StepSeconds,
    /// Per stage, the seconds per operation class along its critical path.
    op_seconds: [[f64; 8]; 4],
}

impl Predicted {
    /// What `planner` predicts for `plan`.
    fn of(planner: &Planner, plan: &Plan) -> Predicted {
        let efficiencies = planner.cost().efficiencies;
        let op_seconds = planner.stage_parts(plan).map(|(_, ideal)| {
            let mut per_class = ideal.0;
            for c in OpClass::ALL {
                per_class[c.index()] /= efficiencies.of(c);
            }
            per_class
        });
        Predicted { peaks: planner.rank_peaks(plan), seconds: planner.step_seconds(plan), op_seconds }
    }
}

/// The step's JSON-lines record (docs/operations.md); digests and peak memory need every rank.
fn record(
    plane: &mut MpiPlane,
    set: &EmuSet,
    plan: &Plan,
    predicted: &Predicted,
    step: u64,
    m: &StepMetrics,
    boundary: &Boundary,
) -> Result<serde_json::Value, RuntimeError> {
    let digests = set.digests(plane)?;
    let mut state_digest = serde_json::Map::new();
    let mut counters = serde_json::Map::new();
    for emu in set.emus() {
        state_digest.entry(emu.model_stage.to_string()).or_insert_with(|| json!(digests[&emu.id].to_string()));
        let c = emu.counters;
        counters.entry(emu.model_stage.to_string()).or_insert_with(
            || json!({"updates": c.updates, "policy_version": c.policy_version, "data_position": c.data_position}),
        );
    }
    let measured = measured_peaks(plane, set)?;
    let ops = slowest_op_seconds(plane, set.world_size(), &m.op_seconds)?;
    let op_json = |per_stage: &[[f64; 8]; 4]| -> serde_json::Value {
        STAGE_NAMES.iter().zip(per_stage).map(|(name, s)| (name.to_string(), json!(OpClass::named(s)))).collect()
    };
    let worst = (0..measured.len()).max_by_key(|&r| measured[r].total()).unwrap_or(0);
    let (predicted_peak, predicted_worst) = predicted.peaks.max();
    let plan_json: serde_json::Map<String, serde_json::Value> = plan
        .placements
        .iter()
        .map(|p| (p.candidate.model_stage.to_string(), json!({"tp": p.candidate.layout.tp, "pp": p.candidate.layout.pp, "dp": p.candidate.dp, "ranks": p.ranks})))
        .collect();
    let predicted_stages: serde_json::Map<String, serde_json::Value> =
        predicted.seconds.by_name().iter().map(|(k, v)| (k.to_string(), json!(v))).collect();
    Ok(json!({
        "step": step,
        "reward_mean": m.reward_mean,
        "rm_score_mean": m.rm_score_mean,
        "response_len_mean": m.response_len_mean,
        "response_len_p95": m.response_len_p95,
        "kl": m.kl,
        "actor_loss": m.actor_loss,
        "critic_loss": m.critic_loss,
        "actor_grad_norm": m.actor_grad_norm,
        "critic_grad_norm": m.critic_grad_norm,
        "skipped_updates": m.skipped_updates,
        "step_seconds": m.step_seconds,
        "predicted_step_seconds": predicted.seconds.total(),
        "stage_seconds": m.stage_seconds,
        "predicted_stage_seconds": predicted_stages,
        "op_seconds": {"measured": op_json(&ops), "predicted": op_json(&predicted.op_seconds)},
        "tokens_per_second": m.generated_tokens as f64 / m.step_seconds.max(1e-9),
        "plan": plan_json,
        "decision": boundary.decision,
        "transition": boundary.transition,
        "peak_memory_bytes": measured[worst].total(),
        "predicted_peak_memory_bytes": predicted_peak,
        "peak_memory": {
            "measured": {"rank": worst, "items": measured[worst]},
            "predicted": {"rank": predicted_worst, "items": predicted.peaks.ranks[predicted_worst as usize].at_peak()},
        },
        "rank_peak_memory_bytes": {
            "measured": measured.iter().map(|b| b.total()).collect::<Vec<_>>(),
            "predicted": predicted.peaks.ranks.iter().map(|r| r.peak()).collect::<Vec<_>>(),
        },
        "state_digest": state_digest,
        "counters": counters,
    }))
}

/// The stages of a step, in the order of [`StepSeconds::by_name`].
const STAGE_NAMES: [&str; 4] = ["generation", "inference", "training", "weight_sync"];

/// Per stage and operation class, the most seconds any rank spent (one all-reduce of maxima).
fn slowest_op_seconds(
    plane: &mut MpiPlane,
    world: i32,
    mine: &BTreeMap<String, [f64; 8]>,
) -> Result<[[f64; 8]; 4], RuntimeError> {
    let local: Vec<f64> = STAGE_NAMES.iter().flat_map(|s| mine.get(*s).copied().unwrap_or_default()).collect();
    let group = plane.group(&(0..world).collect::<Vec<_>>())?;
    let mut all = vec![0u8; local.len() * 8 * world as usize];
    plane.all_gather(group, bytemuck::cast_slice(&local), &mut all)?;
    let mut out = [[0.0f64; 8]; 4];
    for rank in bytemuck::cast_slice::<u8, f64>(&all).chunks_exact(local.len()) {
        for (k, v) in rank.iter().enumerate() {
            out[k / 8][k % 8] = out[k / 8][k % 8].max(*v);
        }
    }
    Ok(out)
}

/// Every rank's ledger peak, item by item (one all-gather).
fn measured_peaks(plane: &mut MpiPlane, set: &EmuSet) -> Result<Vec<MemoryBreakdown>, RuntimeError> {
    let mine = set.store().ledger().peak_breakdown();
    let local: Vec<u64> = MemoryItem::ALL.iter().map(|&i| mine.get(i)).collect();
    let all = gather_u64s(plane, set.world_size(), &local)?;
    Ok(all
        .chunks_exact(local.len())
        .map(|rank| {
            let mut b = MemoryBreakdown::default();
            for (item, bytes) in MemoryItem::ALL.iter().zip(rank) {
                b.add(*item, *bytes);
            }
            b
        })
        .collect())
}

fn print_plan(plan: &Plan) {
    for p in &plan.placements {
        let c = &p.candidate;
        println!(
            "plan {:<22} tp {} pp {} dp {} ranks {}",
            c.model_stage.to_string(),
            c.layout.tp,
            c.layout.pp,
            c.dp,
            format_index_list(&p.ranks)
        );
    }
}

/// A decision and a transition, in one block under the step line.
fn print_boundary(b: &Boundary) {
    if b.decision.is_null() {
        return;
    }
    let d = &b.decision;
    let num = |k: &str| d.get(k).and_then(|v| v.as_f64()).map_or("-".to_string(), |x| format!("{x:.4}"));
    println!(
        "  decision: trigger {}  ΔL {} s  L_tran {} s  H {}  γ {}  → {} ({})",
        d["trigger"],
        num("delta_l_s"),
        num("l_tran_s"),
        num("h_x"),
        num("gamma"),
        if d["admitted"] == true { d["kind"].as_str().unwrap_or("admitted") } else { "rejected" },
        d["reason"].as_str().unwrap_or("")
    );
    if !b.transition.is_null() {
        let t = &b.transition;
        println!(
            "  transition: {:.3} s (predicted {:.3} s), {} bytes, {} primitives: {}  →  {}",
            t["seconds"].as_f64().unwrap_or(0.0),
            t["predicted_seconds"].as_f64().unwrap_or(0.0),
            t["bytes"],
            t["primitives"],
            t["from"].as_str().unwrap_or(""),
            t["to"].as_str().unwrap_or("")
        );
    }
}

fn print_step(step: u64, m: &StepMetrics, plan: &Plan) {
    let stage = |k: &str| m.stage_seconds.get(k).copied().unwrap_or(0.0);
    let skipped =
        if m.skipped_updates > 0 { format!("  SKIPPED {} update(s)", m.skipped_updates) } else { String::new() };
    println!(
        "step {step:>4}  reward {:.3}  len {:>5.2} (p95 {:>2})  kl {:+.4}  gen {:.2}s  inf {:.2}s  train {:.2}s  sync {:.3}s  tok/s {:.0}  plan {}{skipped}",
        m.reward_mean,
        m.response_len_mean,
        m.response_len_p95,
        m.kl,
        stage("generation"),
        stage("inference"),
        stage("training"),
        stage("weight_sync"),
        m.generated_tokens as f64 / m.step_seconds.max(1e-9),
        short_plan(plan)
    );
}

/// The plan in a few characters: each model-stage's `tp·pp·dp`, in plan order.
fn short_plan(plan: &Plan) -> String {
    plan.placements
        .iter()
        .map(|p| format!("{}{}{}", p.candidate.layout.tp, p.candidate.layout.pp, p.candidate.dp))
        .collect::<Vec<_>>()
        .join("/")
}
