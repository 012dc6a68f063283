//! `nereus train`: a fixed-plan RL job on the reference engine. Rank 0 plans (or the planner's
//! answer is recomputed identically everywhere: the planner is pure), every rank creates the
//! plan's EMUs from the warm-up or a checkpoint, then steps; rank 0 prints one line per step
//! and appends the same as a JSON object to `<output_dir>/metrics.jsonl`.

use std::collections::BTreeMap;
use std::io::Write;
use std::path::{Path, PathBuf};

use serde_json::json;

use super::checkpoint::{self, fill_shard, Sidecar, TensorFile};
use super::{RuntimeError, Session};
use crate::comm::{DataPlane, MpiPlane};
use crate::config::{JobConfig, Overrides};
use crate::cost::Efficiencies;
use crate::emu::{Counters, EmuSet};
use crate::engine::init_shard;
use crate::model::Layout;
use crate::plan::{model_stages, Candidate, ModelStage, Placement, Plan, Recompute, Role, Stage};
use crate::planner::{catalogues, Planner};
use crate::rl::{warm_up, RlJob, StepMetrics, StepSettings, Warmup};
use crate::topology::format_index_list;

/// Where each model's initial weights come from.
struct Sources {
    files: BTreeMap<Role, (TensorFile, Option<TensorFile>)>,
    counters: BTreeMap<String, Counters>,
    start_step: u64,
}

/// Runs `nereus train` on every rank.
pub fn run(
    session: &mut Session,
    path: Option<&Path>,
    overrides: &Overrides,
    resume: Option<&Path>,
) -> Result<(), RuntimeError> {
    let config = session.load_config(path, overrides)?;
    let world = session.world().size();
    let plan = job_plan(&config, world)?;
    let settings = StepSettings::new(&config);
    let mut plane = MpiPlane::new(session.world(), session.watchdog().clone());
    let out = config.job.output_dir.clone();
    let sources = match resume {
        Some(dir) => from_checkpoint(dir)?,
        None => warm_up_models(&mut plane, world, &config, &settings, &out.join("warmup"))?,
    };
    if let Some(dir) = resume {
        for p in plan.placements.iter().filter(|p| !sources.files.contains_key(&p.candidate.model_stage.role)) {
            log::warn!(
                "checkpoint {} has no {} model; {} starts from fresh weights",
                dir.display(),
                p.candidate.model_stage.role.name(),
                p.candidate.model_stage
            );
        }
    }
    let mut set = EmuSet::new(plane.rank(), world, config.cluster.device_memory_bytes(), catalogues(&config));
    for p in &plan.placements {
        let ms = p.candidate.model_stage;
        let counters = sources
            .counters
            .get(&ms.to_string())
            .copied()
            .unwrap_or(Counters { seed: config.job.seed, ..Counters::default() });
        for r in 0..p.candidate.dp as usize {
            set.create(&mut plane, ms, p.candidate.layout, p.replica(r), counters, |shard, catalogue| {
                match sources.files.get(&ms.role) {
                    Some((params, optim)) => fill_shard(shard, catalogue, params, optim.as_ref()),
                    None => init_shard(shard, catalogue, config.job.seed ^ ms.role as u64).map_err(|e| e.to_string()),
                }
            })?;
        }
    }
    let job = RlJob::new(&mut plane, &set, plan.clone(), settings)?;
    if session.rank() == 0 {
        print_plan(&plan);
        std::fs::create_dir_all(&out)?;
    }
    let jsonl = out.join("metrics.jsonl");
    for step in sources.start_step..u64::from(config.job.steps) {
        let metrics = job.step(&mut plane, &mut set, step)?;
        let record = record(&mut plane, &set, &plan, step, &metrics)?;
        if session.rank() == 0 {
            print_step(step, &metrics);
            let mut f = std::fs::OpenOptions::new().create(true).append(true).open(&jsonl)?;
            writeln!(f, "{record}")?;
        }
        let every = u64::from(config.train.checkpoint_every);
        if step + 1 == u64::from(config.job.steps) || (every > 0 && (step + 1) % every == 0) {
            save(
                &mut plane,
                &set,
                &job,
                &config,
                step + 1,
                &out.join("checkpoints").join(format!("step-{}", step + 1)),
            )?;
        }
    }
    Ok(())
}

/// The plan written in the config (checked against the world and the models), or the
/// planner's for this many ranks.
fn job_plan(config: &JobConfig, world: i32) -> Result<Plan, RuntimeError> {
    if config.plan.is_empty() {
        return Ok(Planner::new(config, world as u32, None, Efficiencies::default())?.search(None)?.plan());
    }
    let cats = catalogues(config);
    let mut placements = Vec::new();
    for ms in model_stages(config.rl.algorithm) {
        let e = config.plan.get(&ms.to_string()).ok_or_else(|| RuntimeError::Usage(format!("[plan] has no table for {ms}: a fixed plan places every model-stage of {} (or none, to let the planner choose)", config.rl.algorithm.name())))?;
        let layout = Layout::new(e.tp, e.pp);
        cats[&ms.role].check_layout(layout).map_err(|err| RuntimeError::Usage(format!("[plan.\"{ms}\"]: {err}")))?;
        let candidate = Candidate {
            model_stage: ms,
            layout,
            dp: e.dp,
            recompute: Recompute::None,
            micro_batch: config.rl.micro_batch,
        };
        placements.push(Placement { candidate, ranks: e.ranks.clone() });
    }
    let plan = Plan { placements };
    plan.validate(world as u32)
        .map_err(|err| RuntimeError::Usage(format!("[plan] does not fit {world} ranks: {err}")))?;
    Ok(plan)
}

/// Runs the supervised warm-ups the config asks for (every rank) and returns their files.
fn warm_up_models(
    plane: &mut MpiPlane,
    world: i32,
    config: &JobConfig,
    settings: &StepSettings,
    dir: &Path,
) -> Result<Sources, RuntimeError> {
    let mut files = BTreeMap::new();
    let t = &config.train;
    let everyone = plane.group(&(0..world).collect::<Vec<_>>())?;
    for (role, kind, steps) in
        [(Role::Actor, Warmup::Actor, t.warmup_actor_steps), (Role::Reward, Warmup::RewardModel, t.warmup_reward_steps)]
    {
        if steps == 0 {
            continue;
        }
        let mut set = EmuSet::new(plane.rank(), world, config.cluster.device_memory_bytes(), catalogues(config));
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
            settings.sampling.max_new_tokens,
            t.warmup_lr,
        )?;
        checkpoint::save_model(plane, &set, id, dir, role.name())?;
        plane.barrier(everyone)?; // rank 0 has written the file before anyone reads it
        if plane.rank() == 0 {
            log::info!("warm-up of the {} model: {steps} steps, final loss {loss:.4}", role.name());
        }
        files.insert(role, (TensorFile::read(&p_path(dir, role))?, None));
    }
    // The reference starts as the warmed-up actor; the critic from the reward model when they
    // share an architecture (InstructGPT's choice), otherwise fresh.
    if files.contains_key(&Role::Actor) {
        files.insert(Role::Reference, (TensorFile::read(&p_path(dir, Role::Actor))?, None));
    }
    if config.models.critic.as_ref() == Some(&config.models.reward) && files.contains_key(&Role::Reward) {
        files.insert(Role::Critic, (TensorFile::read(&p_path(dir, Role::Reward))?, None));
    }
    Ok(Sources { files, counters: BTreeMap::new(), start_step: 0 })
}

fn p_path(dir: &Path, role: Role) -> PathBuf {
    checkpoint::params_path(dir, role.name())
}

/// Every model, its optimizer state and its counters from checkpoint `dir`.
fn from_checkpoint(dir: &Path) -> Result<Sources, RuntimeError> {
    let sidecar = checkpoint::read_sidecar(dir)?;
    let mut files = BTreeMap::new();
    for role in [Role::Actor, Role::Critic, Role::Reference, Role::Reward] {
        let params = p_path(dir, role);
        if !params.exists() {
            continue;
        }
        let optim = checkpoint::optim_path(dir, role.name());
        let optim = if optim.exists() { Some(TensorFile::read(&optim)?) } else { None };
        files.insert(role, (TensorFile::read(&params)?, optim));
    }
    Ok(Sources { files, counters: sidecar.counters, start_step: sidecar.step })
}

/// Saves every model (its first training replica, or first replica) and the sidecar.
fn save(
    plane: &mut MpiPlane,
    set: &EmuSet,
    job: &RlJob,
    config: &JobConfig,
    step: u64,
    dir: &Path,
) -> Result<(), RuntimeError> {
    let mut saved = Vec::new();
    for (ms, ids) in &job.replicas {
        let role = ms.role;
        let training = ModelStage::new(role, Stage::Training);
        // A model that trains is saved from its training replica (with Adam's moments).
        if saved.contains(&role) || (!ms.trains() && job.replicas.contains_key(&training)) {
            continue;
        }
        checkpoint::save_model(plane, set, ids[0], dir, role.name())?;
        saved.push(role);
    }
    if plane.rank() == 0 {
        let counters =
            job.replicas.iter().filter_map(|(ms, ids)| set.emu(ids[0]).map(|e| (ms.to_string(), e.counters))).collect();
        let sidecar = Sidecar {
            format: checkpoint::FORMAT,
            job: config.job.name.clone(),
            algorithm: config.rl.algorithm.name().into(),
            step,
            seed: config.job.seed,
            data_position: step * u64::from(config.rl.prompts_per_step),
            counters,
            rng: "counter-based: draws are functions of (seed, sequence id, position)".into(),
        };
        checkpoint::write_sidecar(dir, &sidecar)?;
        log::info!("checkpoint of step {step} written to {}", dir.display());
    }
    Ok(())
}

/// The step's JSON-lines record (docs/operations.md); digests and peak memory need every rank.
fn record(
    plane: &mut MpiPlane,
    set: &EmuSet,
    plan: &Plan,
    step: u64,
    m: &StepMetrics,
) -> Result<serde_json::Value, RuntimeError> {
    let digests = set.digests(plane)?;
    let mut state_digest = serde_json::Map::new();
    for emu in set.emus() {
        state_digest.entry(emu.model_stage.to_string()).or_insert_with(|| json!(digests[&emu.id].to_string()));
    }
    let group = plane.group(&(0..set.world_size()).collect::<Vec<_>>())?;
    let mut peaks = vec![0u8; 8 * set.world_size() as usize];
    plane.all_gather(group, &set.store().ledger().peak().to_le_bytes(), &mut peaks)?;
    let peak = peaks.chunks_exact(8).map(|c| u64::from_le_bytes(c.try_into().unwrap_or([0; 8]))).max().unwrap_or(0);
    let plan_json: serde_json::Map<String, serde_json::Value> = plan
        .placements
        .iter()
        .map(|p| (p.candidate.model_stage.to_string(), json!({"tp": p.candidate.layout.tp, "pp": p.candidate.layout.pp, "dp": p.candidate.dp, "ranks": p.ranks})))
        .collect();
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
        "step_seconds": m.step_seconds,
        "stage_seconds": m.stage_seconds,
        "tokens_per_second": m.generated_tokens as f64 / m.step_seconds.max(1e-9),
        "plan": plan_json,
        "transition": null,
        "peak_memory_bytes": peak,
        "state_digest": state_digest,
    }))
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

fn print_step(step: u64, m: &StepMetrics) {
    let stage = |k: &str| m.stage_seconds.get(k).copied().unwrap_or(0.0);
    println!(
        "step {step:>4}  reward {:.3}  len {:>5.2} (p95 {:>2})  kl {:+.4}  gen {:.2}s  inf {:.2}s  train {:.2}s  sync {:.3}s  tok/s {:.0}",
        m.reward_mean,
        m.response_len_mean,
        m.response_len_p95,
        m.kl,
        stage("generation"),
        stage("inference"),
        stage("training"),
        stage("weight_sync"),
        m.generated_tokens as f64 / m.step_seconds.max(1e-9)
    );
}
