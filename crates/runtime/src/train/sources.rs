//! Where every model's initial state comes from — its Hugging Face directory, a supervised
//! warm-up, the engine's initialization, or a verified checkpoint — and the plan's EMUs filled
//! from it.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use nereus_core::config::{hf, Dtype, JobConfig, ModelSpec};
use nereus_core::model::{Catalogue, Numerics, OutputHead};
use nereus_core::plan::{ModelStage, Placement, Plan, Role, Stage};
use nereus_core::planner::catalogues;
use nereus_core::policy::controller::ControllerState;
use nereus_exec::comm::DataPlane;
use nereus_exec::emu::{Counters, EmuError, EmuSet, LocalShard, ShardMemory};
use nereus_exec::engine::{init_piece, init_shard, EngineError};
use nereus_exec::rl::{warm_up, StepSettings, Warmup};

use super::TrainOptions;
use crate::checkpoint::{self, fill_shard, resume, CheckpointError, ResumeOptions};
use crate::{RuntimeError, Session};
use nereus_data::model_files::{open_weights, Expect, ModelWeights, TensorFile};

/// One model's initial state: parameters (a tensor absent there starts fresh: a value head
/// on a causal LM), and the moments of a resumed checkpoint.
pub(super) struct Source {
    params: ModelWeights,
    optimizer: Option<ModelWeights>,
}

/// Where each model's initial weights come from (a model without one is initialized by the
/// engine).
pub(super) struct Sources {
    files: BTreeMap<Role, Source>,
    counters: BTreeMap<String, Counters>,
    /// The step the job starts at (0, or the checkpoint's).
    pub start_step: u64,
    /// The checkpoints the job continues from, oldest first (empty on a fresh start).
    pub resumed_from: Vec<String>,
    /// The plan the checkpoint was written under and what the controller had learned (a
    /// fresh start, or a checkpoint that does not record them: none).
    pub saved_control: Option<(Plan, ControllerState)>,
}

/// Every replica of the plan, filled from `sources` (or the engine's initialization). Room is
/// checked by one all-reduce per replica, so a plan that does not fit fails on every rank at
/// the same replica, before anything is filled.
pub(super) fn create_state<M: ShardMemory + Clone, P: DataPlane>(
    plane: &mut P,
    config: &JobConfig,
    plan: &Plan,
    sources: &Sources,
    world: i32,
    memory: &M,
) -> Result<EmuSet<M>, RuntimeError> {
    let mut set = EmuSet::in_memory(plane.rank(), world, device_memory(config), job_catalogues(config), memory.clone());
    for p in &plan.placements {
        for r in 0..p.candidate.dp as usize {
            create_replica(plane, &mut set, config, sources, p, p.replica(r))?;
        }
    }
    Ok(set)
}

/// One replica of `placement`'s model-stage on `ranks`, filled from `sources` (or the engine's
/// initialization), with the sources' counters.
pub(super) fn create_replica<M: ShardMemory, P: DataPlane>(
    plane: &mut P,
    set: &mut EmuSet<M>,
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
    // Models that start alike start from one seed: the reference as the actor, the critic as
    // the reward model (the pairs `origin` names), so PPO's KL starts at zero without warm-ups too.
    let seed = config.job.seed ^ seed_role(config, ms.role) as u64;
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

/// Every model, its optimizer state and its counters from checkpoint `dir`, verified against
/// the job: every rank checks the sidecar and the files' structure, rank 0 also every byte.
pub(super) fn from_checkpoint(
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
    let mut resumed_from = resumed.sidecar.lineage.resumed_from.clone();
    resumed_from.extend(dir.file_name().map(|n| n.to_string_lossy().into_owned()));
    let saved_control = resumed.sidecar.plan.clone().zip(resumed.sidecar.controller.clone());
    Ok(Sources { files, counters, start_step: resumed.sidecar.step, resumed_from, saved_control })
}

/// The catalogues of the job's models, each computing with its model's RoPE and RMSNorm
/// numbers (the planner's catalogues describe shapes only).
pub(super) fn job_catalogues(config: &JobConfig) -> BTreeMap<Role, Catalogue> {
    catalogues(config)
        .into_iter()
        .map(|(role, c)| (role, c.with_numerics(Numerics::from_spec(spec(config, role)))))
        .collect()
}

pub(super) fn spec(config: &JobConfig, role: Role) -> &ModelSpec {
    let roles = config.models.roles();
    roles.into_iter().find(|(name, _)| *name == role.name()).map_or(&config.models.actor, |(_, s)| s)
}

/// Where a model of a fresh job starts.
#[derive(Debug, Clone, PartialEq)]
pub(super) enum Origin {
    /// A Hugging Face model directory.
    Dir(PathBuf),
    /// The supervised warm-up of this model.
    WarmUp(Role),
    /// The engine's initialization.
    Engine,
}

/// The role whose initialization seed `role` uses: the one it starts as (see [`origin`]).
fn seed_role(config: &JobConfig, role: Role) -> Role {
    let same = |a: Role, b: Role| spec(config, a).architecture_map() == spec(config, b).architecture_map();
    match role {
        Role::Reference if same(Role::Reference, Role::Actor) => Role::Actor,
        Role::Critic if same(Role::Critic, Role::Reward) => Role::Reward,
        role => role,
    }
}

/// Where `role` starts: its own `path`; else the actor's and the reward model's warm-ups; the
/// reference starts as the actor does, and the critic as the reward model when their
/// architectures match (InstructGPT's choice).
pub(super) fn origin(config: &JobConfig, role: Role) -> Origin {
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
pub(super) fn initial_sources<P: DataPlane>(
    session: &Session,
    plane: &mut P,
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
    Ok(Sources { files, counters: BTreeMap::new(), start_step: 0, resumed_from: Vec::new(), saved_control: None })
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
        if found.head == OutputHead::Value && !value {
            return Err(RuntimeError::Usage(format!(
                "models.{}.path = `{}` holds a sequence classifier ({}); the {} model needs a causal LM",
                role.name(),
                dir.display(),
                found.json["architectures"],
                role.name()
            )));
        }
        let fresh: &[&str] = if value && found.head == OutputHead::Lm { &["score.weight"] } else { &[] };
        let params = open_weights(&dir).map_err(CheckpointError::outside_checkpoint)?;
        let absent = params
            .check(catalogue, &[""], Expect::Pretrained { fresh })
            .map_err(CheckpointError::outside_checkpoint)?;
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
fn run_warm_up<P: DataPlane>(
    session: &Session,
    plane: &mut P,
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
    // The warm-up runs on the host reference engine in f32, whatever dtype the RL job keeps (a
    // bf16 job reads its output rounded).
    let catalogues = job_catalogues(config)
        .into_iter()
        .map(|(role, mut c)| {
            c.arch.dtype = Dtype::F32;
            (role, c)
        })
        .collect();
    let mut set = EmuSet::new(plane.rank(), world, memory, catalogues);
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
    )
    .map_err(|e| match e {
        EngineError::OutOfMemory(_) => RuntimeError::OutOfMemory(format!(
            "the supervised warm-up of the {} model ran out of memory: {e}; it may use {} per rank (train.warmup_memory_gb, else cluster.device_memory_gb): raise it, or lower rl.prompts_per_step or rl.max_response_len",
            role.name(),
            nereus_core::units::format_bytes(memory)
        )),
        e => e.into(),
    })?;
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
