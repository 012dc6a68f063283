//! The planner itself: candidates, frontiers, the per-stage layout, rank assignment, and the
//! placement-exact memory check that closes the loop.

use serde::Serialize;
use std::collections::BTreeMap;
use std::sync::Arc;
use thiserror::Error;

use super::assign::{assign, GroupToPlace};
use super::candidates::{Fastest, Point, Pool, Scored, Skeleton, SHAVE};
use super::stage::{self, StageChoice};
use crate::config::{Algorithm, JobConfig};
use crate::cost::{
    CostModel, Efficiencies, EngineKind, Estimate, Hardware, MemoryBreakdown, MemoryItem, ModelStats, OpSeconds,
    PositionCost, PositionMemory, RankPeaks, Workload,
};
use crate::model::{Architecture, Catalogue, Layout};
use crate::plan::{
    model_stages, overlap_critical, Candidate, ModelStage, PerPhase, Placement, Plan, Recompute, Role, Stage,
};
use crate::units::format_bytes;

/// Stages in the order they run.
const STAGES: [Stage; 3] = [Stage::Generation, Stage::Inference, Stage::Training];

/// Rounds of layout and placement check per rung of the transient ladder.
const PLACEMENT_ROUNDS: usize = 4;
/// Shares of a rank's usable memory the transient buffers may take when the state has to be
/// capped (see `Planner::place`).
const TRANSIENT_LADDER: [f64; 6] = [0.5, 0.35, 0.25, 0.15, 0.1, 0.05];
/// How far the rung ordering searches a rung's first stage past the fastest found so far: a rung
/// whose first stage alone takes longer than this multiple is tried last, and its own floor is
/// found only if the plans found by then do not cut it already (the order changes the work,
/// never the plan).
const RUNG_ORDER_SPAN: f64 = 2.0;
/// The weight sync's share of the step above which fewer sync-filled replicas are tried.
const SYNC_SWEEP_SHARE: f64 = 0.1;

/// Per-rank limits on candidates when the uncapped plan does not fit every rank.
pub(super) struct Caps {
    /// State per rank, per model-stage.
    state: BTreeMap<ModelStage, u64>,
    /// Transient peak per rank.
    pub(super) transient: u64,
}

impl Caps {
    /// The state cap of `ms`.
    pub(super) fn state(&self, ms: ModelStage) -> u64 {
        self.state.get(&ms).copied().unwrap_or(u64::MAX)
    }
}

/// One model-stage's cost model inputs (statistics, workload), for candidates of it.
pub(super) struct StageCost<'p> {
    cost: &'p CostModel,
    stats: &'p ModelStats,
    workload: &'p Workload,
    ms: ModelStage,
}

impl StageCost<'_> {
    /// The model-stage.
    pub(super) fn model_stage(&self) -> ModelStage {
        self.ms
    }

    /// [`Planner::estimate`] of a candidate of this model-stage.
    pub(super) fn estimate(&self, c: &Candidate) -> Estimate {
        self.cost.estimate(self.stats, c, self.workload)
    }

    /// [`CostModel::position_cost`] of a candidate of this model-stage.
    pub(super) fn position_cost(&self, c: &Candidate, j: u32) -> PositionCost {
        self.cost.position_cost(self.stats, c, self.workload, j)
    }

    /// [`PositionCost::transient`] of `c` at `position`, in bytes.
    pub(super) fn transient_bytes(&self, position: &PositionCost, c: &Candidate) -> u64 {
        position.transient(c, self.workload).total()
    }

    /// Whether a position peaking at `peak` bytes fits a rank of its own
    /// ([`CostModel::fits_alone`]).
    pub(super) fn fits_alone(&self, peak: u64) -> bool {
        self.cost.fits_alone(peak)
    }

    /// [`CostModel::seconds`] of a feasible candidate of this model-stage.
    pub(super) fn seconds(&self, c: &Candidate) -> f64 {
        self.cost.seconds(self.stats, c, self.workload)
    }

    /// [`CostModel::seconds_floor`] of a candidate's layout and replica count.
    pub(super) fn seconds_floor(&self, c: &Candidate) -> f64 {
        self.cost.seconds_floor(self.stats, c, self.workload)
    }

    /// [`Planner::position_memory`] of a candidate of this model-stage.
    pub(super) fn position_memory(&self, c: &Candidate, j: u32) -> PositionMemory {
        self.cost.position_memory(self.stats, c, self.workload, j)
    }
}

/// Why no plan was found.
#[derive(Debug, Error)]
pub enum PlannerError {
    /// A model-stage fits no candidate even with the whole pool.
    #[error("no plan fits {gpus} GPUs: {model_stage} needs at least {} on its heaviest rank even at its best layout, and a device has {} usable ({headroom:.0}% headroom){hint}", format_bytes(*need_bytes), format_bytes(*usable_bytes))]
    DoesNotFit {
        /// Pool size.
        gpus: u32,
        /// The model-stage.
        model_stage: ModelStage,
        /// Smallest peak over all candidates, bytes.
        need_bytes: u64,
        /// Usable memory per device, bytes.
        usable_bytes: u64,
        /// Headroom percentage.
        headroom: f64,
        /// What would fit.
        hint: String,
    },
    /// The model-stages of one stage cannot share the pool.
    #[error("no plan fits {gpus} GPUs: the {stage:?} stage's model-stages need at least {need} GPUs together{hint}")]
    StageTooLarge {
        /// Pool size.
        gpus: u32,
        /// The stage.
        stage: Stage,
        /// Smallest total.
        need: u32,
        /// What would fit.
        hint: String,
    },
    /// Every model-stage fits on its own, but no placement keeps every rank within memory
    /// once the state of all the EMUs a rank holds is added up.
    #[error("no plan fits {gpus} GPUs: every placement found puts more than the {} usable on some rank (rank {rank} would hold {}: {}){hint}", format_bytes(*usable_bytes), format_bytes(*peak_bytes), .holders.join(", "))]
    Placement {
        /// Pool size.
        gpus: u32,
        /// The fullest rank of the last attempt.
        rank: i32,
        /// Its peak.
        peak_bytes: u64,
        /// Usable bytes per device.
        usable_bytes: u64,
        /// The model-stages holding state there.
        holders: Vec<String>,
        /// What would fit.
        hint: String,
    },
    /// The pool is empty.
    #[error("the pool has no GPUs; pass --gpus N with N >= 1")]
    EmptyPool,
    /// The config's `[plan]` cannot run: it does not match the pool or the models, or does
    /// not fit in memory (the message names the key and the values).
    #[error("{0}")]
    Fixed(String),
}

/// The chosen placement of one model-stage and its estimate.
#[derive(Debug, Clone, Serialize)]
pub struct ModelStagePlan {
    /// Placement.
    pub placement: Placement,
    /// Estimate.
    pub estimate: Estimate,
}

/// Predicted seconds per phase of a step.
pub type StepSeconds = crate::plan::PerPhase<f64>;

/// A global plan with its predictions.
#[derive(Debug, Clone, Serialize)]
pub struct PlannedJob {
    /// Per model-stage, in stage order.
    pub model_stages: Vec<ModelStagePlan>,
    /// Predicted step latency, seconds.
    pub step_latency_s: f64,
    /// Its parts.
    pub step_seconds: StepSeconds,
    /// Every rank's predicted peak memory.
    pub rank_peaks: RankPeaks,
}

impl PlannedJob {
    /// The plan without estimates.
    pub fn plan(&self) -> Plan {
        Plan { placements: self.model_stages.iter().map(|m| m.placement.clone()).collect() }
    }
}

struct Model {
    catalogue: Catalogue,
    stats: ModelStats,
}

/// A planner for one job on one pool. The models' catalogues are built once and shared by
/// every [`Planner::replanned`] copy, and so are the search's candidates while the pool keeps
/// its size, so a replan only redoes the search.
#[derive(Clone)]
pub struct Planner {
    cost: CostModel,
    models: Arc<BTreeMap<Role, Model>>,
    workloads: BTreeMap<ModelStage, Workload>,
    model_stages: Vec<ModelStage>,
    /// Every model-stage's candidate layouts and replica counts on this pool.
    skeleton: Arc<Skeleton>,
}

/// The parameter catalogue of every model of a job (critic and reward carry value heads).
pub fn catalogues(config: &JobConfig) -> BTreeMap<Role, Catalogue> {
    config
        .models
        .roles()
        .into_iter()
        .map(|(name, spec)| {
            let role = match name {
                "actor" => Role::Actor,
                "critic" => Role::Critic,
                "reference" => Role::Reference,
                _ => Role::Reward,
            };
            (role, Catalogue::new(Architecture::from_spec(spec, matches!(role, Role::Critic | Role::Reward))))
        })
        .collect()
}

/// The plan written in `config`'s `[plan]` tables (`None` when there are none, to let the
/// planner choose), checked against a pool of `pool` ranks and the models' layouts.
pub fn fixed_plan(config: &JobConfig, pool: u32) -> Result<Option<Plan>, String> {
    if config.plan.is_empty() {
        return Ok(None);
    }
    let cats = catalogues(config);
    let mut placements = Vec::new();
    for ms in model_stages(config.rl.algorithm) {
        let e = config.plan.get(&ms.to_string()).ok_or_else(|| {
            format!(
                "[plan] has no table for {ms}: a fixed plan places every model-stage of {} (or none, to let the planner choose)",
                config.rl.algorithm.name()
            )
        })?;
        let layout = Layout::new(e.tp, e.pp);
        cats[&ms.role].check_layout(layout).map_err(|err| format!("[plan.\"{ms}\"]: {err}"))?;
        // Generation decodes each replica's whole share at once; the rest use rl.micro_batch.
        let share = config.rl.sequences_per_step().div_ceil(e.dp.max(1));
        let micro_batch = if ms.stage == Stage::Generation { share } else { config.rl.micro_batch };
        let candidate = Candidate { model_stage: ms, layout, dp: e.dp, recompute: Recompute::None, micro_batch };
        placements.push(Placement { candidate, ranks: e.ranks.clone() });
    }
    let plan = Plan { placements };
    plan.validate(pool).map_err(|err| format!("[plan] does not fit {pool} ranks: {err}"))?;
    Ok(Some(plan))
}

impl Planner {
    /// A planner for `config`'s job on `gpus` devices of its cluster, at `response_len` tokens
    /// (default: the configured maximum), costed for the engine of the cluster's data plane.
    pub fn new(
        config: &JobConfig,
        gpus: u32,
        response_len: Option<u64>,
        efficiencies: Efficiencies,
    ) -> Result<Planner, PlannerError> {
        if gpus == 0 {
            return Err(PlannerError::EmptyPool);
        }
        let hardware = Hardware::new(&config.cluster, gpus, config.policy.memory_headroom);
        let models = catalogues(config)
            .into_iter()
            .map(|(role, catalogue)| {
                let stats = ModelStats::new(&catalogue);
                (role, Model { catalogue, stats })
            })
            .collect();
        let rl = &config.rl;
        let sequences = u64::from(rl.prompts_per_step) * u64::from(rl.samples_per_prompt);
        let model_stages = model_stages(rl.algorithm);
        let mut workloads = BTreeMap::new();
        for ms in &model_stages {
            let greedy = if rl.algorithm == Algorithm::Remax && ms.stage == Stage::Generation {
                u64::from(rl.prompts_per_step)
            } else {
                0
            };
            let w = Workload {
                sequences: sequences + greedy,
                prompt_len: rl.prompt_len.into(),
                response_len: response_len.unwrap_or(rl.max_response_len.into()),
                micro_batch: rl.micro_batch.into(),
                mini_batch: rl.mini_batch.into(),
                epochs: rl.epochs.into(),
            };
            workloads.insert(*ms, w);
        }
        let cost = CostModel { hardware, efficiencies, engine: EngineKind::of(&config.cluster) };
        let mut planner = Planner { cost, models: Arc::new(models), workloads, model_stages, skeleton: Arc::default() };
        planner.skeleton = Arc::new(Skeleton::of(&planner));
        Ok(planner)
    }

    /// The same job re-targeted: another pool size, response length or calibration. Cheap:
    /// the catalogues are shared, only the workloads change.
    pub fn replanned(&self, gpus: u32, response_len: u64, efficiencies: Efficiencies) -> Result<Planner, PlannerError> {
        if gpus == 0 {
            return Err(PlannerError::EmptyPool);
        }
        let mut p = self.clone();
        p.cost.efficiencies = efficiencies;
        for w in p.workloads.values_mut() {
            w.response_len = response_len;
        }
        if gpus != p.cost.hardware.devices {
            p.cost.hardware.devices = gpus;
            p.skeleton = Arc::new(Skeleton::of(&p));
        }
        Ok(p)
    }

    /// The search's candidates on this pool, before any estimate.
    pub(super) fn skeleton(&self) -> &Skeleton {
        &self.skeleton
    }

    /// The cost model.
    pub fn cost(&self) -> &CostModel {
        &self.cost
    }

    /// The model-stages planned, in stage order.
    pub fn model_stages(&self) -> &[ModelStage] {
        &self.model_stages
    }

    /// Parameters per model.
    pub fn parameters(&self) -> BTreeMap<Role, u64> {
        self.models.iter().map(|(r, m)| (*r, m.stats.params)).collect()
    }

    /// The catalogue of a model.
    pub fn catalogue(&self, role: Role) -> &Catalogue {
        &self.models[&role].catalogue
    }

    /// The response length planned for.
    pub fn response_len(&self) -> u64 {
        self.workloads.values().next().map_or(0, |w| w.response_len)
    }

    /// Estimates one candidate (its heaviest position on a rank of its own).
    pub fn estimate(&self, c: &Candidate) -> Estimate {
        self.stage_cost(c.model_stage).estimate(c)
    }

    /// The cost inputs of `ms`, looked up once for the many candidates a search estimates.
    pub(super) fn stage_cost(&self, ms: ModelStage) -> StageCost<'_> {
        StageCost { cost: &self.cost, stats: &self.models[&ms.role].stats, workload: &self.workloads[&ms], ms }
    }

    /// What one rank at pipeline position `j` of `c` holds.
    pub fn position_memory(&self, c: &Candidate, j: u32) -> PositionMemory {
        self.stage_cost(c.model_stage).position_memory(c, j)
    }

    /// The state one rank at pipeline position `j` of a `layout` unit of `ms` keeps
    /// ([`Planner::position_memory`]'s state, the same for every variant of the layout).
    pub fn position_state(&self, ms: ModelStage, layout: Layout, j: u32) -> MemoryBreakdown {
        self.cost.position_state(&self.models[&ms.role].stats, ms, layout, j)
    }

    /// Every rank's predicted peak under `plan` (placement-exact), the weight sync's pack
    /// buffers included.
    pub fn rank_peaks(&self, plan: &Plan) -> RankPeaks {
        let pool = plan.placements.iter().flat_map(|p| p.ranks.iter()).map(|&r| r as u32 + 1).max().unwrap_or(0);
        let mut peaks = RankPeaks::of(plan, pool.max(self.cost.hardware.devices), |c, j| self.position_memory(c, j));
        let find = |ms: ModelStage| plan.placements.iter().find(|p| p.candidate.model_stage == ms);
        for (from, to) in SYNCS {
            let (Some(src), Some(dst)) = (find(from), find(to)) else { continue };
            // Rectangles are packed only when the TP split differs (row-parallel column blocks);
            // a rank packs at most what it sends and receives: its shards' parameters.
            if src.candidate.layout.tp == dst.candidate.layout.tp {
                continue;
            }
            // Bytes each rank packs, indexed by world rank.
            let mut pack = vec![0u64; peaks.ranks.len()];
            for p in [src, dst] {
                let layout = p.candidate.layout;
                let ms = p.candidate.model_stage;
                let params: Vec<u64> =
                    (0..layout.pp).map(|j| self.position_state(ms, layout, j).get(MemoryItem::Params)).collect();
                for (k, &r) in p.ranks.iter().enumerate() {
                    if let Some(bytes) = pack.get_mut(r as usize) {
                        *bytes += params[layout.position(k % layout.size() as usize).pp as usize];
                    }
                }
            }
            for (r, &bytes) in pack.iter().enumerate().filter(|(_, &bytes)| bytes > 0) {
                let mut sync = MemoryBreakdown::default();
                sync.add(MemoryItem::PackBuffers, bytes);
                peaks.consider(r as i32, sync, to);
            }
        }
        peaks
    }

    /// The latency-versus-ranks frontier of `ms`: ascending ranks, strictly falling latency.
    /// Among equally fast candidates with the same rank count, `prefer` (the current one) wins.
    pub fn frontier(&self, ms: ModelStage, prefer: Option<&Candidate>) -> Vec<Scored> {
        let points = Pool::new(self).frontier(ms, prefer, None, u32::MAX);
        points.into_iter().map(|(c, _)| (c, self.estimate(&c))).collect()
    }

    /// What one step asks of `ms`.
    pub fn workload(&self, ms: ModelStage) -> &Workload {
        &self.workloads[&ms]
    }

    /// Predicted seconds of one step under `plan`, stage by stage (infinite when a
    /// placement does not fit a rank on its own). Inside a stage, model-stages that share
    /// ranks run one after another and the others concurrently (the execution-overlap graph);
    /// the actor's old log-probabilities run on its training ranks during inference; the
    /// weight sync reshards the trained parameters into the generation and critic inference
    /// layouts.
    pub fn step_seconds(&self, plan: &Plan) -> StepSeconds {
        self.stage_parts(plan).map(|(seconds, _)| *seconds)
    }

    /// Per stage (generation, inference, training, weight sync): its predicted seconds and the
    /// roofline time per operation class along its critical path (the slowest group of the
    /// overlap graph) — what calibration fits efficiencies to.
    pub fn stage_parts(&self, plan: &Plan) -> PerPhase<(f64, OpSeconds)> {
        self.parts_of(plan, false)
    }

    /// [`Planner::step_seconds`] of a plan known to keep every rank within memory (so every
    /// position of it fits a rank of its own: its candidates' memory is not estimated again).
    fn fitting_step_seconds(&self, plan: &Plan) -> StepSeconds {
        self.parts_of(plan, true).map(|(seconds, _)| *seconds)
    }

    /// [`Planner::stage_parts`]; `fits`: every candidate of `plan` is known to fit a rank of its
    /// own, so only its latency is estimated (the estimate's own, as it is for any that fits).
    fn parts_of(&self, plan: &Plan, fits: bool) -> PerPhase<(f64, OpSeconds)> {
        let e = &self.cost.efficiencies;
        let stage = |s: Stage| -> (f64, OpSeconds) {
            // (ranks, roofline per class, seconds: infinite for a candidate that does not fit)
            let mut nodes: Vec<(&[i32], OpSeconds, f64)> = plan
                .placements
                .iter()
                .filter(|p| p.candidate.model_stage.stage == s)
                .map(|p| {
                    let c = &p.candidate;
                    let (ideal, seconds) = if fits {
                        let ideal =
                            self.cost.latency(&self.models[&c.model_stage.role].stats, c, self.workload(c.model_stage));
                        (ideal, ideal.seconds(e))
                    } else {
                        let est = self.estimate(c);
                        (est.ideal, est.seconds)
                    };
                    (p.ranks.as_slice(), ideal, seconds)
                })
                .collect();
            if s == Stage::Inference {
                for p in plan.placements.iter().filter(|p| p.candidate.model_stage == ACTOR_TRAINING) {
                    let (stats, w) = (&self.models[&Role::Actor].stats, &self.workloads[&ACTOR_TRAINING]);
                    let ideal = self.cost.old_logp_breakdown(stats, &p.candidate, w);
                    nodes.push((p.ranks.as_slice(), ideal, ideal.seconds(e)));
                }
            }
            let timed: Vec<(&[i32], f64)> = nodes.iter().map(|(r, _, t)| (*r, *t)).collect();
            let (seconds, critical) = overlap_critical(&timed);
            let ideal = critical.iter().fold(OpSeconds::default(), |acc, &i| acc.plus(&nodes[i].1));
            // An empty stage (no model-stage there) takes no time.
            let seconds = if critical.is_empty() { 0.0 } else { seconds };
            (seconds, ideal)
        };
        let sync = self.weight_sync_breakdown(plan);
        PerPhase {
            generation: stage(Stage::Generation),
            inference: stage(Stage::Inference),
            training: stage(Stage::Training),
            weight_sync: (sync.seconds(e), sync),
        }
    }

    /// Predicted step latency of any plan (what admission compares, `ΔL = L(S) − L(S*)`).
    pub fn predict(&self, plan: &Plan) -> f64 {
        self.step_seconds(plan).total()
    }

    /// The weight sync's roofline time (the two reshards run one after the other).
    fn weight_sync_breakdown(&self, plan: &Plan) -> OpSeconds {
        let find = |ms: ModelStage| plan.placements.iter().find(|p| p.candidate.model_stage == ms);
        SYNCS
            .into_iter()
            .filter_map(|(from, to)| Some((find(from)?, find(to)?)))
            .map(|(src, dst)| {
                let stats = &self.models[&src.candidate.model_stage.role].stats;
                self.cost.weight_sync(stats, src, dst)
            })
            .fold(OpSeconds::default(), |acc, b| acc.plus(&b))
    }

    /// The fastest plan whose every rank fits in memory (ties: the current plan's candidates
    /// and ranks).
    pub fn search(&self, current: Option<&Plan>) -> Result<PlannedJob, PlannerError> {
        self.search_kept(current).map(|(job, _)| job)
    }

    /// [`Planner::search`] from `current`, and `current`'s predicted step seconds: infinite
    /// when it no longer fits every rank (what a transition's `ΔL` starts from).
    pub fn search_from(&self, current: &Plan) -> Result<(PlannedJob, f64), PlannerError> {
        self.search_kept(Some(current))
    }

    fn search_kept(&self, current: Option<&Plan>) -> Result<(PlannedJob, f64), PlannerError> {
        let gpus = self.cost.hardware.devices;
        let kept = current.and_then(|plan| self.still_fits(plan));
        let current_seconds = kept.as_ref().map_or(f64::INFINITY, Found::seconds);
        let keep = |k: Found| Ok((self.planned(k), current_seconds));
        match (self.place(current), kept) {
            // The search under caps is a heuristic: it never returns a plan slower than keeping
            // the current one when that still fits.
            (Ok(found), Some(k)) if k.seconds() <= found.seconds() => keep(k),
            (Ok(found), _) => Ok((self.planned(found), current_seconds)),
            (Err(_), Some(k)) => keep(k),
            (Err(Unfit::Model(ms)), None) => Err(self.does_not_fit(ms)),
            (Err(Unfit::Stage { stage, need }), None) => {
                Err(PlannerError::StageTooLarge { gpus, stage, need, hint: self.hint() })
            }
            (Err(Unfit::Placement { plan, peaks }), None) => {
                let (peak, rank) = peaks.max();
                let holders = plan
                    .placements
                    .iter()
                    .filter(|p| p.ranks.contains(&rank))
                    .map(|p| p.candidate.model_stage.to_string())
                    .collect();
                let usable_bytes = self.cost.hardware.usable_bytes();
                Err(PlannerError::Placement { gpus, rank, peak_bytes: peak, usable_bytes, holders, hint: self.hint() })
            }
        }
    }

    /// `plan` with its peaks and step, if it is valid on this pool and every rank still fits
    /// (so every position of it fits a rank of its own: a rank's peak is at least its own).
    fn still_fits(&self, plan: &Plan) -> Option<Found> {
        plan.validate(self.cost.hardware.devices).ok()?;
        let peaks = self.rank_peaks(plan);
        let fits = peaks.max().0 <= self.cost.hardware.usable_bytes();
        fits.then(|| Found { step: self.fitting_step_seconds(plan), plan: plan.clone(), peaks })
    }

    /// The fastest placement found. The stages are laid out one by one, but the weight sync
    /// couples them: every replica of the generation (and critic inference) layout receives a
    /// full copy of the trained weights, so the fastest generation alone can lose the step to
    /// its sync. When the sync is a noticeable part of the step, fewer replicas of the layouts
    /// it fills are tried (halving), until two halvings in a row bring nothing.
    fn place(&self, current: Option<&Plan>) -> Result<Found, Unfit> {
        let mut pool = Pool::new(self);
        let mut best = self.place_within(current, &mut pool, u32::MAX, f64::INFINITY)?;
        if best.step.weight_sync < SYNC_SWEEP_SHARE * best.seconds() {
            return Ok(best);
        }
        let mut cap = self.sync_replicas(&best.plan) / 2;
        let mut misses = 0;
        while cap >= 1 && misses < 2 {
            match self.place_within(current, &mut pool, cap, best.seconds()) {
                Ok(found) if found.seconds() < best.seconds() => {
                    best = found;
                    misses = 0;
                }
                _ => misses += 1,
            }
            cap /= 2;
        }
        Ok(best)
    }

    /// The most replicas among the layouts the weight sync fills in `plan`.
    fn sync_replicas(&self, plan: &Plan) -> u32 {
        let filled = |p: &&Placement| SYNCS.iter().any(|(_, to)| *to == p.candidate.model_stage);
        plan.placements.iter().filter(filled).map(|p| p.candidate.dp).max().unwrap_or(1)
    }

    /// Rounds of layout and placement check: a round that finds ranks over their memory makes
    /// each model-stage there leave room for what it shares the rank with (what the rank holds
    /// besides its own position), and plans again. Layouts the weight sync fills keep to at
    /// most `sync_dp` replicas. Capped rounds that cannot beat `beat` seconds are cut short.
    fn place_within(&self, current: Option<&Plan>, pool: &mut Pool, sync_dp: u32, beat: f64) -> Result<Found, Unfit> {
        let usable = self.cost.hardware.usable_bytes();
        let uncapped = self.stage_layouts(pool, &Round { current, caps: None, sync_dp }, f64::INFINITY, &[])?;
        let first = self.ranks_for(&uncapped.stages, current);
        let peaks = self.rank_peaks(&first);
        if peaks.max().0 <= usable {
            return Ok(Found { step: self.fitting_step_seconds(&first), plan: first, peaks });
        }
        // Every rank holds a position of (nearly) every model-stage: its state adds up, and the
        // largest transient comes on top. So the transient is capped at a rung of a ladder, the
        // rest of the rank is shared out as state caps proportional to one replica's state (every
        // model-stage shards about as finely), the room shrinks by any overflow left, and the
        // fastest plan that fits over all rungs wins (on equal seconds, the earlier rung). (The
        // rungs' latencies are not unimodal — on A100, 0.35 can lose to 0.5 and 0.25 beat both —
        // so no rung is skipped unless its floor shows that it cannot win.)
        let rungs = self.rungs_in_order(current, pool, sync_dp);
        // The fastest plan that fits, and its rung.
        let mut best: Option<(Found, usize)> = None;
        // The unfit plan of the rung latest in the ladder (what the error reports).
        let mut last = (first, peaks, None);
        let ahead_of_first: f64 = uncapped.stage_floors.iter().skip(1).sum();
        for (first_floor, rung, mut caps) in rungs {
            let mut room = usable - caps.transient;
            for _ in 0..PLACEMENT_ROUNDS {
                let to_beat = match &best {
                    Some((b, b_rung)) if rung < *b_rung => b.seconds().next_up().min(beat),
                    Some((b, _)) => b.seconds().min(beat),
                    None => beat,
                };
                // The rung's first-stage floor (under its first round's caps, so under every
                // round's) may show already that it cannot win.
                if first_floor + ahead_of_first >= to_beat {
                    break;
                }
                let round = Round { current, caps: Some(&caps), sync_dp };
                let laid = match self.stage_layouts(pool, &round, to_beat, &uncapped.stage_floors) {
                    Ok(laid) if laid.complete() => laid,
                    // Unfit, or no faster than the best so far: the rung's later rounds, under
                    // tighter caps, could do no better.
                    _ => break,
                };
                let plan = self.ranks_for(&laid.stages, current);
                let peaks = self.rank_peaks(&plan);
                let (worst, _) = peaks.max();
                if worst <= usable {
                    let found = Found { step: self.fitting_step_seconds(&plan), plan, peaks };
                    let seconds = found.seconds();
                    if best
                        .as_ref()
                        .is_none_or(|(b, b_rung)| seconds < b.seconds() || (seconds == b.seconds() && rung < *b_rung))
                    {
                        best = Some((found, rung));
                    }
                    break;
                }
                room = room.saturating_sub(worst - usable);
                caps = Caps { state: self.state_caps(room), transient: caps.transient };
                if last.2.is_none_or(|latest| rung >= latest) {
                    last = (plan, peaks, Some(rung));
                }
            }
        }
        match best {
            Some((found, _)) => Ok(found),
            None => Err(Unfit::Placement { plan: last.0, peaks: last.1 }),
        }
    }

    /// The rungs of the transient ladder, as (first-stage floor, rung, first round's caps), in
    /// the order they are tried: the rungs whose first stage alone promises the fastest plan
    /// first, so that the best plan found early cuts the others short (on equal seconds the
    /// earlier rung of the ladder still wins, see `place_within`). The floors are found from
    /// the loosest transient cap down, each rung's capped picks bounding the next one's, and
    /// only up to [`RUNG_ORDER_SPAN`] times the fastest so far.
    fn rungs_in_order(&self, current: Option<&Plan>, pool: &mut Pool, sync_dp: u32) -> Vec<(f64, usize, Caps)> {
        let usable = self.cost.hardware.usable_bytes();
        let mut fastest = f64::INFINITY;
        let mut rungs = Vec::with_capacity(TRANSIENT_LADDER.len());
        for (rung, &share) in TRANSIENT_LADDER.iter().enumerate() {
            let transient = (usable as f64 * share) as u64;
            let caps = Caps { state: self.state_caps(usable - transient), transient };
            let cutoff = RUNG_ORDER_SPAN * fastest;
            let round = Round { current, caps: Some(&caps), sync_dp };
            let floor = self.stage_members(STAGES[0]).try_fold(0.0, |floor: f64, (ms, alone)| {
                let f = self.member_frontier(pool, &round, ms, alone, cutoff)?;
                Some(floor.max(f.last().map_or(f64::INFINITY, |p| p.1)))
            });
            let floor = floor.unwrap_or(cutoff);
            fastest = fastest.min(floor);
            rungs.push((floor, rung, caps));
        }
        rungs.sort_by(|a, b| a.0.total_cmp(&b.0).then(a.1.cmp(&b.1)));
        rungs
    }

    /// The model-stages `stage` runs, each with whether it is the stage's only one.
    fn stage_members(&self, stage: Stage) -> impl Iterator<Item = (ModelStage, bool)> + '_ {
        let of_stage = move || self.model_stages.iter().copied().filter(move |m| m.stage == stage);
        let alone = of_stage().count() == 1;
        of_stage().map(move |ms| (ms, alone))
    }

    /// The frontier of `ms` in `round`, `alone` in its stage or not: a stage of one model-stage
    /// takes its fastest point, so the rest is not built, nor the point searched for at or past
    /// `cutoff` (`None`: nothing fits below it).
    fn member_frontier(
        &self,
        pool: &mut Pool,
        round: &Round,
        ms: ModelStage,
        alone: bool,
        cutoff: f64,
    ) -> Option<Vec<Point>> {
        let max_dp = if SYNCS.iter().any(|(_, to)| *to == ms) { round.sync_dp } else { u32::MAX };
        let prefer = round.current.and_then(|p| p.placements.iter().find(|x| x.candidate.model_stage == ms));
        let prefer = prefer.map(|p| &p.candidate);
        if !alone {
            return Some(pool.frontier(ms, prefer, round.caps, max_dp));
        }
        match pool.fastest(ms, prefer, round.caps, max_dp, cutoff) {
            Fastest::Found(point) => Some(point.into_iter().collect()),
            Fastest::NotBelow => None,
        }
    }

    /// Per model-stage, its share of `room` bytes of state per rank, proportional to the
    /// state of one of its replicas.
    fn state_caps(&self, room: u64) -> BTreeMap<ModelStage, u64> {
        let replica_state = |ms: &ModelStage| self.position_state(*ms, Layout::new(1, 1), 0).total() as f64;
        let total: f64 = self.model_stages.iter().map(replica_state).sum::<f64>().max(1.0);
        self.model_stages.iter().map(|ms| (*ms, (room as f64 * replica_state(ms) / total) as u64)).collect()
    }

    /// One round: every stage's layout, stage by stage, and a floor under the step any plan
    /// from them gives: a stage takes at least as long as its slowest member's fastest frontier
    /// point, and once solved, its solution's seconds. Caps only take points away, so the floor
    /// only rises under tighter caps. Once the floor, with `ahead[i]` standing in for each stage
    /// `i` not yet laid out (an uncapped round's stage floors; none: 0), reaches `beat`, the
    /// stages left are not laid out: the round cannot give a faster plan.
    fn stage_layouts(&self, pool: &mut Pool, round: &Round, beat: f64, ahead: &[f64]) -> Result<StageLayouts, Unfit> {
        let mut laid = StageLayouts { stages: Vec::new(), stage_floors: Vec::new() };
        for (i, stage) in STAGES.into_iter().enumerate() {
            let ahead_rest: f64 = ahead.iter().skip(i + 1).sum();
            let cut = |laid: &StageLayouts| laid.floor() + ahead_rest >= beat;
            // A stage of one model-stage is not searched past what could still beat `beat` (with a
            // margin over the rounding of the sums).
            let cutoff = beat - laid.floor() - ahead_rest + 1e-9 * beat;
            let mut frontiers = Vec::new();
            for (ms, alone) in self.stage_members(stage) {
                let Some(f) = self.member_frontier(pool, round, ms, alone, cutoff) else {
                    laid.stage_floors.push(cutoff);
                    return Ok(laid);
                };
                let Some(&(_, fastest)) = f.last() else { return Err(Unfit::Model(ms)) };
                frontiers.push((f, fastest));
            }
            laid.stage_floors.push(frontiers.iter().map(|(_, fastest)| *fastest).fold(0.0, f64::max));
            if cut(&laid) {
                return Ok(laid);
            }
            let frontiers: Vec<Vec<Point>> = frontiers.into_iter().map(|(f, _)| f).collect();
            let choice = self.solve_stage(&frontiers).ok_or_else(|| Unfit::Stage {
                stage,
                need: frontiers.iter().map(|f| f[0].0.ranks()).max().unwrap_or(0),
            })?;
            // The stage takes at least its solution's seconds (its groups run on disjoint rank
            // sets; shaved, as the plan adds them up in another order), a tighter floor than
            // its slowest member alone.
            laid.stage_floors[i] = laid.stage_floors[i].max(choice.seconds * SHAVE);
            if cut(&laid) {
                return Ok(laid);
            }
            let groups = choice
                .groups
                .iter()
                .zip(&choice.group_ranks)
                .map(|(g, &ranks)| GroupToPlace {
                    members: g.iter().map(|&m| frontiers[m][choice.picks[m]].0).collect(),
                    ranks,
                })
                .collect();
            laid.stages.push(groups);
        }
        Ok(laid)
    }

    /// The ranks of every stage's groups (see [`assign`]), in model-stage order.
    fn ranks_for(&self, stages: &[Vec<GroupToPlace>], current: Option<&Plan>) -> Plan {
        let state_of = |c: &Candidate, j: u32| self.position_state(c.model_stage, c.layout, j).total();
        let mut placements = assign(stages, self.cost.hardware.devices, current, &state_of);
        placements.sort_by_key(|p| self.model_stages.iter().position(|&m| m == p.candidate.model_stage));
        Plan { placements }
    }

    fn solve_stage(&self, frontiers: &[Vec<Point>]) -> Option<StageChoice> {
        let points: Vec<Vec<(u32, f64)>> =
            frontiers.iter().map(|f| f.iter().map(|(c, seconds)| (c.ranks(), *seconds)).collect()).collect();
        let refs: Vec<&stage::Frontier> = points.iter().map(|p| p.as_slice()).collect();
        stage::solve(&refs, self.cost.hardware.devices)
    }

    /// Any plan with this planner's predictions (its placements kept as they are).
    pub fn evaluate(&self, plan: &Plan) -> PlannedJob {
        self.planned(Found { step: self.step_seconds(plan), peaks: self.rank_peaks(plan), plan: plan.clone() })
    }

    fn planned(&self, found: Found) -> PlannedJob {
        let Found { plan, peaks, step } = found;
        let model_stages = plan
            .placements
            .into_iter()
            .map(|p| ModelStagePlan { estimate: self.estimate(&p.candidate), placement: p })
            .collect();
        PlannedJob { model_stages, step_latency_s: step.total(), step_seconds: step, rank_peaks: peaks }
    }

    /// Each stage's optimum by brute force over every candidate (the first fitting variant of
    /// every layout and replica count; small settings only: tests check the frontier and the
    /// stage solver against it), summed over the stages.
    pub fn exhaustive(&self) -> Option<f64> {
        let mut pool = Pool::new(self);
        let mut total = 0.0;
        for stage in STAGES {
            let lists: Vec<Vec<(u32, f64)>> = self
                .model_stages
                .iter()
                .filter(|m| m.stage == stage)
                .map(|&m| pool.all_fitting(m).into_iter().map(|(c, e)| (c.ranks(), e.seconds)).collect())
                .collect();
            let refs: Vec<&stage::Frontier> = lists.iter().map(|l| l.as_slice()).collect();
            total += stage::solve_exhaustively(&refs, self.cost.hardware.devices)?;
        }
        Some(total)
    }

    /// Per stage (generation, inference, training), per model-stage of it: every fitting
    /// candidate as `(ranks, seconds)` — every variant (micro-batch, recomputation, decode
    /// wave) of every layout and replica count that fits a rank of its own, nothing pruned —
    /// the input of an exact solver.
    pub fn stage_candidates(&self) -> Vec<Vec<Vec<(u32, f64)>>> {
        let mut pool = Pool::new(self);
        STAGES
            .iter()
            .map(|&stage| {
                self.model_stages
                    .iter()
                    .filter(|m| m.stage == stage)
                    .map(|&m| pool.every_fitting(m).into_iter().map(|(c, e)| (c.ranks(), e.seconds)).collect())
                    .collect()
            })
            .collect()
    }

    /// The sum of the stage solver's optima (what [`Planner::exhaustive`] checks).
    pub fn stage_optima(&self) -> Option<f64> {
        let mut pool = Pool::new(self);
        let mut total = 0.0;
        for stage in STAGES {
            let frontiers: Vec<Vec<Point>> = self
                .model_stages
                .iter()
                .filter(|m| m.stage == stage)
                .map(|&m| pool.frontier(m, None, None, u32::MAX))
                .collect();
            total += self.solve_stage(&frontiers)?.seconds;
        }
        Some(total)
    }

    fn does_not_fit(&self, ms: ModelStage) -> PlannerError {
        let hw = &self.cost.hardware;
        let need = Pool::new(self).smallest_peak(ms);
        PlannerError::DoesNotFit {
            gpus: hw.devices,
            model_stage: ms,
            need_bytes: need,
            usable_bytes: hw.usable_bytes(),
            headroom: hw.headroom * 100.0,
            hint: self.hint(),
        }
    }

    /// What would fit: more GPUs, or shorter responses (recomputation is already searched).
    fn hint(&self) -> String {
        let len = self.response_len();
        let feasible_with = |gpus: u32, response: u64| {
            self.replanned(gpus, response, self.cost.efficiencies).is_ok_and(|p| p.search_quiet())
        };
        let n = self.cost.hardware.devices;
        let mut hints = Vec::new();
        // The smallest pool that fits: doubling finds one, bisection the least below it.
        if let Some(k) = (1..=6).find(|&k| feasible_with(n << k, len)) {
            let (mut lo, mut hi) = (n << (k - 1), n << k);
            while hi - lo > 1 {
                let mid = lo + (hi - lo) / 2;
                if feasible_with(mid, len) {
                    hi = mid;
                } else {
                    lo = mid;
                }
            }
            hints.push(format!("{hi} GPUs would fit"));
        }
        if let Some(l) = (1..=6).map(|k| len >> k).filter(|&l| l > 0).find(|&l| feasible_with(n, l)) {
            hints.push(format!("responses of {l} tokens would fit (--seq-len {l})"));
        }
        if hints.is_empty() {
            "; neither 64x the GPUs nor 64x shorter responses would fit: use a larger device or a smaller model".into()
        } else {
            format!("; {} (activation recomputation was already considered)", hints.join(", or "))
        }
    }

    /// Whether a plan exists (the hints' probe: the same search, without a message).
    fn search_quiet(&self) -> bool {
        self.place(None).is_ok()
    }
}

/// What one round of layouts is asked under: the current plan (whose candidates win ties),
/// per-rank caps (none: uncapped) and the most replicas of a layout the weight sync fills.
struct Round<'a> {
    current: Option<&'a Plan>,
    caps: Option<&'a Caps>,
    sync_dp: u32,
}

/// A plan the search found or kept, with every rank's peak and its step's predicted seconds.
struct Found {
    plan: Plan,
    peaks: RankPeaks,
    step: StepSeconds,
}

impl Found {
    /// The step's predicted seconds ([`Planner::predict`]).
    fn seconds(&self) -> f64 {
        self.step.total()
    }
}

/// One round's stage layouts: per stage, its groups; and per stage laid out, a floor under
/// its seconds in any plan from them (see [`Planner::stage_layouts`]).
struct StageLayouts {
    stages: Vec<Vec<GroupToPlace>>,
    stage_floors: Vec<f64>,
}

impl StageLayouts {
    /// A floor under the step seconds of any plan from these layouts: the stages' floors.
    fn floor(&self) -> f64 {
        self.stage_floors.iter().sum()
    }

    /// Whether every stage was laid out (not cut short by its floor).
    fn complete(&self) -> bool {
        self.stages.len() == STAGES.len()
    }
}

/// Why a round of planning found nothing (turned into a [`PlannerError`] with a hint).
enum Unfit {
    /// A model-stage fits no candidate.
    Model(ModelStage),
    /// A stage's smallest layouts need more ranks than the pool.
    Stage { stage: Stage, need: u32 },
    /// Every placement tried leaves some rank over its memory; the last one.
    Placement { plan: Plan, peaks: RankPeaks },
}

const GENERATION: ModelStage = ModelStage::new(Role::Actor, Stage::Generation);
/// The weight syncs of a step: trained parameters into the layouts that use them.
const SYNCS: [(ModelStage, ModelStage); 2] = [(ACTOR_TRAINING, GENERATION), (CRITIC_TRAINING, CRITIC_INFERENCE)];
const ACTOR_TRAINING: ModelStage = ModelStage::new(Role::Actor, Stage::Training);
const CRITIC_TRAINING: ModelStage = ModelStage::new(Role::Critic, Stage::Training);
const CRITIC_INFERENCE: ModelStage = ModelStage::new(Role::Critic, Stage::Inference);

#[cfg(test)]
pub(super) mod tests;
