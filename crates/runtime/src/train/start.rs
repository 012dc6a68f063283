//! Before a job touches its state: what every rank checks (the engine can run it here, the
//! plan), the output directory made ready and the checkpoint to resume from, the pool, and the
//! weight syncs a plan runs, planned and agreed.

use std::path::{Path, PathBuf};

use nereus_core::config::{DataPlane as PlaneKind, DeviceChoice, Dtype, JobConfig, PolicyMode, ResumeFrom};

use nereus_core::plan::Plan;
use nereus_core::planner::{initial_plan, Planner};
use nereus_core::policy::controller::ControllerState;
use nereus_core::record::Event;
use nereus_core::transition::{global::Links, weight_syncs};
use nereus_core::units::format_bytes;
use nereus_exec::backend::check_data_plane;
use nereus_exec::comm::DataPlane;
use nereus_exec::emu::dag::agree_on_dag;
use nereus_exec::emu::{EmuSet, ShardMemory};
use nereus_exec::rl::{RlJob, StepSettings};

use super::metrics::MetricsLog;
use super::pool::PoolSource;
use super::TrainOptions;
use crate::checkpoint::{self, Checkpoints};
use crate::{io_error, RuntimeError, Session};

/// What every rank checks before touching anything: the engine can run this job here
/// ([`engine_checks`], room for the rollout), and the plan.
pub(super) fn job_checks(config: &JobConfig, world: i32) -> Result<(Plan, Planner, u32), RuntimeError> {
    engine_checks(config)?;
    let (sequences, seq_len) = (config.rl.sequences_per_step(), config.rl.prompt_len + config.rl.max_response_len);
    // Tokens, the five per-position arrays, the inference buffer and the assembled samples.
    let rollout = 11 * 4 * u64::from(sequences) * u64::from(seq_len);
    let capacity = config.cluster.device_memory_bytes();
    if rollout > capacity {
        return Err(RuntimeError::Usage(format!(
            "one step's rollout ({} sequences × {} tokens) needs {} on every rank, and a rank has {} (cluster.device_memory_gb); lower rl.prompts_per_step, rl.samples_per_prompt or rl.max_response_len",
            sequences,
            seq_len,
            format_bytes(rollout),
            format_bytes(capacity)
        )));
    }
    job_plan(config, world)
}

/// The engine the job names can train it: f32 models on the host reference engine over MPI;
/// bf16 models on a device (bf16 working weights, f32 master weights and moments), whose
/// tensors move over its vendor's library (NCCL for CUDA, RCCL for ROCm) or, emulated, over
/// MPI.
pub fn engine_checks(config: &JobConfig) -> Result<(), RuntimeError> {
    let device = config.cluster.train_device();
    let plane = config.cluster.data_plane;
    plane_check(device, plane)?;
    // The emulated device's collectives run over MPI, whichever plane the job names.
    if device != Some(DeviceChoice::Emulated) {
        check_data_plane(plane).map_err(RuntimeError::Backend)?;
    }
    let (want, why) = match device {
        None => (
            Dtype::F32,
            "the CPU reference engine computes in f32; set dtype = \"f32\", or train on a device (cluster.device, or --device cuda|rocm|emulated)",
        ),
        Some(_) => (
            Dtype::Bf16,
            "the device engine trains bf16 working weights with f32 master weights and moments; set dtype = \"bf16\"",
        ),
    };
    match config.models.roles().into_iter().find(|(_, s)| s.dtype != want) {
        Some((role, spec)) => {
            Err(RuntimeError::Usage(format!("models.{role}.dtype = \"{}\": {why}", spec.dtype.name())))
        }
        None => Ok(()),
    }
}

/// A vendor's device moves tensors with its vendor's library: CUDA with NCCL, ROCm with RCCL;
/// the emulated device (MPI underneath) with any; `auto` was resolved by the plane, and on MPI
/// has nothing to go by.
fn plane_check(device: Option<DeviceChoice>, plane: PlaneKind) -> Result<(), RuntimeError> {
    let (name, needs) = match device {
        None | Some(DeviceChoice::Emulated) => return Ok(()),
        Some(DeviceChoice::Cuda) => ("cuda", PlaneKind::Nccl),
        Some(DeviceChoice::Rocm) => ("rocm", PlaneKind::Rccl),
        Some(DeviceChoice::Auto) => {
            return Err(RuntimeError::Usage(
                "cluster.device = \"auto\" picks the device by the data plane: set cluster.data_plane = \"nccl\" (CUDA) or \"rccl\" (ROCm), or name the device (--device cuda|rocm|emulated)".into(),
            ))
        }
    };
    if needs == plane {
        return Ok(());
    }
    Err(RuntimeError::Usage(format!(
        "cluster.device = \"{name}\" moves tensors with {}: set cluster.data_plane = \"{}\" (or train on the emulated device: --device emulated)",
        plane_name(needs).to_uppercase(),
        plane_name(needs)
    )))
}

fn plane_name(plane: PlaneKind) -> &'static str {
    match plane {
        PlaneKind::Mpi => "mpi",
        PlaneKind::Nccl => "nccl",
        PlaneKind::Rccl => "rccl",
    }
}

/// Whether `plan`'s predicted peak on this rank fits the memory its shards go to: on a device,
/// what the driver reports (the plan was made for `cluster.device_memory_gb`); on the host the
/// plan's own bound holds. Checked before anything is allocated, naming the rank, the need and
/// the capacity.
pub(super) fn fits_devices<M: ShardMemory>(
    rank: i32,
    planner: &Planner,
    plan: &Plan,
    memory: &M,
) -> Result<(), RuntimeError> {
    let Some(capacity) = memory.device_capacity() else { return Ok(()) };
    let need = planner.rank_peaks(plan).ranks.get(rank as usize).map_or(0, |m| m.peak());
    if need <= capacity {
        return Ok(());
    }
    Err(RuntimeError::Usage(format!(
        "plan {plan} needs {} on rank {rank} and its device ({}) has {}: lower cluster.device_memory_gb to what the devices have, or give the job more devices",
        format_bytes(need),
        memory.describe(),
        format_bytes(capacity)
    )))
}

/// A plan, the planner that predicts it and the response cap it is made for.
pub(super) type PlanAtCap = (Plan, Planner, u32);

/// The plan, planner and response cap a resumed run continues with, and the controller state
/// it continues from: the checkpoint's plan, and the controller's cap and calibration, where
/// the checkpoint records them and the plan still runs on `pool` ranks within memory; else the
/// fresh start's plan (`fresh`, from [`job_checks`]) with the saved state sized for it.
pub(super) fn continued(
    config: &JobConfig,
    pool: u32,
    fresh: PlanAtCap,
    saved: Option<(Plan, ControllerState)>,
) -> Result<(PlanAtCap, Option<ControllerState>), RuntimeError> {
    let Some((plan, state)) = saved.filter(|_| config.policy.mode != PolicyMode::Off) else {
        return Ok((fresh, None));
    };
    let planner = Planner::new(config, pool, Some(u64::from(state.cap())), state.efficiencies())?;
    let fits =
        plan.validate(pool).is_ok() && planner.rank_peaks(&plan).max().0 <= planner.cost().hardware.usable_bytes();
    if !fits {
        let cap = fresh.2;
        return Ok((fresh, Some(state.resumed(cap, pool))));
    }
    let cap = state.cap();
    Ok(((plan, planner, cap), Some(state.resumed(cap, pool))))
}

/// The plan the job starts with, the planner that predicts it and the response cap it is made
/// for ([`initial_plan`]: the one function `nereus simulate` starts from too).
fn job_plan(config: &JobConfig, world: i32) -> Result<(Plan, Planner, u32), RuntimeError> {
    Ok(initial_plan(config, world as u32)?)
}

/// Rank 0 makes the output directory ready — created, writable, the leftovers of an
/// interrupted save removed, a torn metrics line cut — and finds the checkpoint to resume
/// from; every rank learns the outcome and the directory.
pub(super) fn resume_directory(
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
    // What an interrupted save left goes first: on a full file system (blocks or inodes) it
    // may hold what the write probe needs.
    for stale in checkpoints.clean_stale()? {
        log::warn!("removed {} (left by an interrupted checkpoint)", stale.display());
    }
    let probe = out.join(".nereus-write-test");
    std::fs::write(&probe, b"").map_err(io_error("write into", out))?;
    std::fs::remove_file(&probe).map_err(io_error("remove", &probe))?;
    let torn = metrics.repair()?;
    if torn > 0 {
        log::warn!("cut a torn last line ({torn} bytes) off {}", metrics.path().display());
    }
    let dir = checkpoints.resolve(from)?;
    match (&dir, from) {
        (Some(_), _) => {}
        (None, None) => refuse_existing_run(out, checkpoints, metrics)?,
        (None, Some(_)) => fresh_start_marker(metrics)?,
    }
    Ok(dir)
}

/// A fresh start into a directory that already holds a run is refused: its records and
/// checkpoints would mix with the new run's (`--resume` continues it).
fn refuse_existing_run(out: &Path, checkpoints: &Checkpoints, metrics: &MetricsLog) -> Result<(), RuntimeError> {
    let mut found = Vec::new();
    if std::fs::metadata(metrics.path()).is_ok_and(|m| m.len() > 0) {
        found.push("metrics.jsonl".to_string());
    }
    if let Some((step, _)) = checkpoints.complete().last() {
        found.push(format!("checkpoints up to step {step}"));
    }
    if found.is_empty() {
        return Ok(());
    }
    Err(checkpoint::CheckpointError::ExistingRun { dir: out.into(), found: found.join(", ") }.into())
}

/// `--resume auto` with no complete checkpoint yet (a crash before the first one): the job
/// starts fresh, and the records of the run that crashed stay in the file, marked as abandoned.
fn fresh_start_marker(metrics: &MetricsLog) -> Result<(), RuntimeError> {
    let abandoned = metrics.steps_from(0).len();
    log::warn!(
        "--resume auto: no complete checkpoint yet; starting fresh{}",
        if abandoned > 0 {
            format!(" ({abandoned} step records of the run before stay in the metrics, marked abandoned)")
        } else {
            String::new()
        }
    );
    if abandoned == 0 {
        return Ok(());
    }
    metrics.append(&Event::FreshStart { abandoned_records: abandoned })
}

/// On every rank, when the run resumes from `dir`: rank 0 marks the resume in the metrics
/// ([`resume_marker`]) and the ranks agree that it was written. A fresh start marks nothing.
pub(super) fn mark_resume(
    session: &Session,
    metrics: &MetricsLog,
    checkpoints: &Checkpoints,
    dir: Option<&Path>,
    from_step: u64,
) -> Result<(), RuntimeError> {
    let Some(dir) = dir else { return Ok(()) };
    let marker = (session.rank() == 0).then(|| resume_marker(metrics, checkpoints, dir, from_step));
    session.agree("metrics", marker.unwrap_or(Ok(())))
}

/// Marks a resume in the metrics: from which step and checkpoint, how many step records it
/// supersedes (a run resumed from an earlier checkpoint runs those steps again), and whether
/// it branches off: a checkpoint other than the newest continues an older line, and what the
/// newest line did after it is abandoned (its records stay, superseded).
fn resume_marker(
    metrics: &MetricsLog,
    checkpoints: &Checkpoints,
    dir: &Path,
    from_step: u64,
) -> Result<(), RuntimeError> {
    let superseded = metrics.steps_from(from_step).len();
    let same = |a: &Path, b: &Path| a.canonicalize().ok().zip(b.canonicalize().ok()).is_some_and(|(a, b)| a == b);
    let newest = checkpoints.latest();
    let branch = newest.as_deref().is_some_and(|n| !same(n, dir));
    if branch {
        let newest = newest.map(|n| n.display().to_string()).unwrap_or_default();
        log::warn!(
            "resuming from {} (step {from_step}), not the newest checkpoint {newest}: this run branches off, and what was trained after step {from_step} is abandoned",
            dir.display()
        );
    }
    if superseded > 0 {
        log::warn!(
            "resuming at step {from_step}: {superseded} step records already in {} are superseded",
            metrics.path().display()
        );
    }
    let checkpoint = dir.to_path_buf();
    metrics.append(&Event::Resume { from_step, checkpoint, superseded_records: superseded, branch })
}

/// Where the job's pool comes from; a pool other than the world needs a controller to follow it.
pub(super) fn pool_source(config: &JobConfig, options: &TrainOptions, world: u32) -> Result<PoolSource, RuntimeError> {
    let pools = PoolSource::new(config.pool.trace.as_deref(), &config.job.output_dir, options.pool.as_deref(), world)?;
    if pools.is_elastic() && config.policy.mode == PolicyMode::Off {
        return Err(RuntimeError::Usage(
            "[pool] trace, --pool or <output_dir>/pool change the ranks a job may use, and policy.mode = \"off\" never moves it: set policy.mode (or --policy) to nereus, static, greedy or every-k".into(),
        ));
    }
    Ok(pools)
}

/// The pool of `step` as rank 0 reads it (the operator's file may change at any time).
pub(super) fn agreed_pool(session: &Session, pools: &PoolSource, step: u64) -> Result<u32, RuntimeError> {
    let local = if session.rank() == 0 { pools.at(step).map(|n| n.to_le_bytes().to_vec()) } else { Ok(Vec::new()) };
    let agreed = session.from_root("pool", local)?;
    Ok(u32::from_le_bytes(agreed.try_into().unwrap_or([0; 4])))
}

/// The pool of `step` at a boundary of a running job, as rank 0 reads it. A pool file it cannot
/// use keeps the pool in force, with a warning each step until the file is fixed: an
/// operator's typo must not stop a job that is running fine.
pub(super) fn next_pool(pools: &PoolSource, step: u64, in_force: u32) -> u32 {
    pools.at(step).unwrap_or_else(|e| {
        log::warn!("{e}; keeping the pool of {in_force} ranks");
        in_force
    })
}

/// The RL job over `set` for `plan` and `settings`, with `plan`'s weight syncs as transitions
/// of Syncs ([`weight_syncs`]), planned with `planner`'s state bytes and links and agreed by
/// hash on every rank before any runs.
pub(super) fn rl_job<M: ShardMemory, P: DataPlane>(
    session: &Session,
    plane: &mut P,
    set: &EmuSet<M>,
    (plan, settings): (&Plan, &StepSettings),
    planner: &Planner,
) -> Result<RlJob, RuntimeError> {
    let links = Links::of(&planner.cost().hardware, None);
    let syncs = weight_syncs(planner, plan, &links)?;
    for dag in syncs.values() {
        agree_on_dag(session.world(), session.watchdog(), dag)?;
    }
    Ok(RlJob::new(plane, set, plan.clone(), settings.clone(), syncs)?)
}
