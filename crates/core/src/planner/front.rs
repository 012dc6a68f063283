//! The planner's front end: a [`Planner`] for a job on a pool, built once and re-targeted
//! ([`Planner::replanned`]) as the pool, lengths and calibration move; what it knows of the
//! job (catalogues, workloads, the cost model's estimates); the plans a config fixes; and
//! the errors that say why nothing fits.

use serde::Serialize;
use std::collections::BTreeMap;
use std::sync::Arc;
use thiserror::Error;

use super::candidates::{CandidateCache, Scored, Skeleton};
use crate::config::{Algorithm, JobConfig};
use crate::cost::{
    CostModel, Efficiencies, EngineKind, Estimate, Hardware, MemoryBreakdown, ModelStats, PositionCost, PositionMemory,
    RankPeaks, Workload,
};
use crate::model::{Architecture, Catalogue, Layout};
use crate::plan::{model_stages, Candidate, ModelStage, Placement, Plan, Recompute, Role, Stage};
use crate::units::format_bytes;

use super::search::Found;

/// Why no plan was found.
#[derive(Debug, Error)]
pub enum PlannerError {
    /// A model-stage fits no candidate even with the whole pool.
    #[error("no plan fits {gpus} GPUs: {model_stage} needs at least {} on its heaviest rank even at its best layout, and a device has {} usable ({headroom:.0}% headroom){hint}", format_bytes(*need_bytes), format_bytes(*usable_bytes))]
    DoesNotFit {
        /// CandidateCache size.
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
        /// CandidateCache size.
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
        /// CandidateCache size.
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

pub(super) struct Model {
    pub(super) catalogue: Catalogue,
    pub(super) stats: ModelStats,
}

/// A planner for one job on one pool. The models' catalogues are built once and shared by
/// every [`Planner::replanned`] copy, and so are the search's candidates while the pool keeps
/// its size, so a replan only redoes the search.
#[derive(Clone)]
pub struct Planner {
    pub(super) cost: CostModel,
    pub(super) models: Arc<BTreeMap<Role, Model>>,
    pub(super) workloads: BTreeMap<ModelStage, Workload>,
    pub(super) model_stages: Vec<ModelStage>,
    /// Every model-stage's candidate layouts and replica counts on this pool.
    pub(super) skeleton: Arc<Skeleton>,
    /// The one layout each model-stage may take, when they are fixed (the static policy):
    /// only replica counts and ranks are searched.
    pub(super) fixed_layouts: Option<Arc<BTreeMap<ModelStage, Layout>>>,
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
/// One model-stage's cost model inputs (statistics, workload), for candidates of it.
pub(super) struct StageCost<'p> {
    pub(super) cost: &'p CostModel,
    pub(super) stats: &'p ModelStats,
    pub(super) workload: &'p Workload,
    pub(super) ms: ModelStage,
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
        let mut planner = Planner {
            cost,
            models: Arc::new(models),
            workloads,
            model_stages,
            skeleton: Arc::default(),
            fixed_layouts: None,
        };
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

    /// The same planner searching only `plan`'s layout for each model-stage (replica counts and
    /// ranks stay free): the static policy's planner, whose DP follows the pool.
    pub fn keeping_layouts(&self, plan: &Plan) -> Planner {
        self.fixing(plan.placements.iter().map(|p| (p.candidate.model_stage, p.candidate.layout)).collect())
    }

    /// The same planner with `ms` held to `layout` and every other model-stage free: where the
    /// controller looks for a plan one layout away from the best (`policy::trial`).
    pub fn holding_layout(&self, ms: ModelStage, layout: Layout) -> Planner {
        self.fixing(BTreeMap::from([(ms, layout)]))
    }

    /// The same planner searching only `layouts` for their model-stages (the rest free).
    fn fixing(&self, layouts: BTreeMap<ModelStage, Layout>) -> Planner {
        let mut p = self.clone();
        p.fixed_layouts = Some(Arc::new(layouts));
        p.skeleton = Arc::new(Skeleton::of(&p));
        p
    }

    /// How many model-stages have a fixed layout (0 unless [`Planner::keeping_layouts`] or
    /// [`Planner::holding_layout`]).
    pub fn fixed_layout_count(&self) -> usize {
        self.fixed_layouts.as_ref().map_or(0, |l| l.len())
    }

    /// The layout `ms` must keep, when the planner keeps layouts.
    pub(super) fn fixed_layout(&self, ms: ModelStage) -> Option<Layout> {
        self.fixed_layouts.as_ref().and_then(|l| l.get(&ms).copied())
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

    /// The latency-versus-ranks frontier of `ms`: ascending ranks, strictly falling latency.
    /// Among equally fast candidates with the same rank count, `prefer` (the current one) wins.
    pub fn frontier(&self, ms: ModelStage, prefer: Option<&Candidate>) -> Vec<Scored> {
        let points = CandidateCache::new(self).frontier(ms, prefer, None, u32::MAX);
        points.into_iter().map(|p| (p.candidate, self.estimate(&p.candidate))).collect()
    }

    /// The layouts `ms` can take on this pool, each with the seconds of its fastest candidate
    /// that fits a rank of its own (any replica count), fastest first: where the controller
    /// looks for plans one layout away from the best (`policy::trial`).
    pub fn layouts_by_speed(&self, ms: ModelStage) -> Vec<(Layout, f64)> {
        let mut fastest: BTreeMap<Layout, f64> = BTreeMap::new();
        for (candidate, estimate) in CandidateCache::new(self).all_fitting(ms) {
            let seconds = fastest.entry(candidate.layout).or_insert(f64::INFINITY);
            *seconds = seconds.min(estimate.seconds);
        }
        let mut layouts: Vec<(Layout, f64)> = fastest.into_iter().collect();
        layouts.sort_by(|a, b| a.1.total_cmp(&b.1));
        layouts
    }

    /// What one step asks of `ms`.
    pub fn workload(&self, ms: ModelStage) -> &Workload {
        &self.workloads[&ms]
    }

    /// Any plan with this planner's predictions (its placements kept as they are).
    pub fn evaluate(&self, plan: &Plan) -> PlannedJob {
        self.planned(Found { step: self.step_seconds(plan), peaks: self.rank_peaks(plan), plan: plan.clone() })
    }

    pub(super) fn planned(&self, found: Found) -> PlannedJob {
        let Found { plan, peaks, step } = found;
        let model_stages = plan
            .placements
            .into_iter()
            .map(|p| ModelStagePlan { estimate: self.estimate(&p.candidate), placement: p })
            .collect();
        PlannedJob { model_stages, step_latency_s: step.total(), step_seconds: step, rank_peaks: peaks }
    }

    pub(super) fn does_not_fit(&self, ms: ModelStage) -> PlannerError {
        let hw = &self.cost.hardware;
        let need = CandidateCache::new(self).smallest_peak(ms);
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
    pub(super) fn hint(&self) -> String {
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
    pub(super) fn search_quiet(&self) -> bool {
        self.place(None).is_ok()
    }
}
