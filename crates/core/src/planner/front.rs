//! The planner's front end: a [`Planner`] for a job on a pool, built once and re-targeted
//! ([`Planner::replanned`]) as the pool, lengths and calibration move: what it knows of the
//! job (`job.rs`, asked through the planner) and the search's candidates on the pool; the
//! plans a config fixes; what a search finds ([`PlannedJob`]); and the errors that say why
//! nothing fits. The search itself (`search.rs`) builds on this file, never the other way.

use serde::Serialize;
use std::collections::BTreeMap;
use std::sync::Arc;
use thiserror::Error;

use super::candidates::{CandidateCache, Scored, Skeleton};
use super::job::{catalogues, JobModel};
use super::predict::{overlapped_total, StepSeconds};
use crate::config::JobConfig;
use crate::cost::{CostModel, Efficiencies, Estimate, MemoryBreakdown, OpSeconds, PositionMemory, RankPeaks, Workload};
use crate::model::{Catalogue, Layout};
use crate::plan::{model_stages, Candidate, ModelStage, PerPhase, Placement, Plan, Recompute, Role, Stage};
use crate::units::format_bytes;

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

/// A plan the search found or kept, with every rank's peak and its step's predicted seconds
/// (a [`PlannedJob`] before the estimates of its candidates).
pub(super) struct Found {
    pub(super) plan: Plan,
    pub(super) peaks: RankPeaks,
    pub(super) step: StepSeconds,
    /// Generation overlaps inference and training (`rl.mode = "async"`).
    pub(super) overlapped: bool,
}

impl Found {
    /// The step's predicted seconds ([`Planner::predict`]).
    pub(super) fn seconds(&self) -> f64 {
        if self.overlapped {
            overlapped_total(&self.step)
        } else {
            self.step.total()
        }
    }
}

/// A planner for one job on one pool: what it knows of the job and the search's candidates.
/// The models' catalogues are built once and shared by every [`Planner::replanned`] copy, and
/// so are the search's candidates while the pool keeps its size, so a replan only redoes the
/// search.
#[derive(Clone)]
pub struct Planner {
    /// The cost model, models, workloads and fixed layouts.
    pub(super) job: JobModel,
    /// Every model-stage's candidate layouts and replica counts on this pool.
    pub(super) skeleton: Arc<Skeleton>,
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
    if config.rl.mode == crate::config::RlMode::Async && !super::predict::generation_apart(&plan) {
        return Err("[plan.\"actor/generation\"].ranks: with rl.mode = \"async\" generation runs beside the other model-stages, so its ranks must be ones no other model-stage uses".into());
    }
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
        let job = JobModel::new(config, gpus, response_len, efficiencies);
        let skeleton = Arc::new(Skeleton::of(&job));
        Ok(Planner { job, skeleton })
    }

    /// The same job re-targeted: another pool size, response length or calibration. Cheap:
    /// the catalogues are shared, only the workloads change.
    pub fn replanned(&self, gpus: u32, response_len: u64, efficiencies: Efficiencies) -> Result<Planner, PlannerError> {
        if gpus == 0 {
            return Err(PlannerError::EmptyPool);
        }
        let mut p = self.clone();
        let resized = gpus != p.job.cost.hardware.devices;
        p.job.retarget(gpus, response_len, efficiencies);
        if resized {
            p.skeleton = Arc::new(Skeleton::of(&p.job));
        }
        Ok(p)
    }

    /// The same planner for a synchronous step: what an asynchronous job's search plans each
    /// side of its split with (`overlap.rs`).
    pub(super) fn synchronous(&self) -> Planner {
        let mut p = self.clone();
        p.job.overlapped = false;
        p
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
        p.job.fixed_layouts = Some(Arc::new(layouts));
        p.skeleton = Arc::new(Skeleton::of(&p.job));
        p
    }

    /// A cache of the search's candidates on this pool, nothing estimated yet.
    pub(super) fn candidates(&self) -> CandidateCache<'_> {
        CandidateCache::new(&self.job, &self.skeleton)
    }

    /// The latency-versus-ranks frontier of `ms`: ascending ranks, strictly falling latency.
    /// Among equally fast candidates with the same rank count, `prefer` (the current one) wins.
    pub fn frontier(&self, ms: ModelStage, prefer: Option<&Candidate>) -> Vec<Scored> {
        let points = self.candidates().frontier(ms, prefer, None, u32::MAX);
        points.into_iter().map(|p| (p.candidate, self.estimate(&p.candidate))).collect()
    }

    /// The layouts `ms` can take on this pool, each with the seconds of its fastest candidate
    /// that fits a rank of its own (any replica count), fastest first: where the controller
    /// looks for plans one layout away from the best (`policy::trial`).
    pub fn layouts_by_speed(&self, ms: ModelStage) -> Vec<(Layout, f64)> {
        let mut fastest: BTreeMap<Layout, f64> = BTreeMap::new();
        for (candidate, estimate) in self.candidates().all_fitting(ms) {
            let seconds = fastest.entry(candidate.layout).or_insert(f64::INFINITY);
            *seconds = seconds.min(estimate.seconds);
        }
        let mut layouts: Vec<(Layout, f64)> = fastest.into_iter().collect();
        layouts.sort_by(|a, b| a.1.total_cmp(&b.1));
        layouts
    }

    /// Any plan with this planner's predictions (its placements kept as they are).
    pub fn evaluate(&self, plan: &Plan) -> PlannedJob {
        let (step, peaks) = (self.step_seconds(plan), self.rank_peaks(plan));
        self.planned(Found { step, peaks, plan: plan.clone(), overlapped: self.job.overlapped })
    }

    /// A plan found, with the estimates of its candidates.
    pub(super) fn planned(&self, found: Found) -> PlannedJob {
        let step_latency_s = found.seconds();
        let Found { plan, peaks, step, .. } = found;
        let model_stages = plan
            .placements
            .into_iter()
            .map(|p| ModelStagePlan { estimate: self.estimate(&p.candidate), placement: p })
            .collect();
        PlannedJob { model_stages, step_latency_s, step_seconds: step, rank_peaks: peaks }
    }
}

/// What the planner knows of the job and predicts of any plan, asked of the planner as ever;
/// the answers come from the job's model (`job.rs`, `predict.rs`), which the search's
/// candidates are built on too.
impl Planner {
    /// How many model-stages have a fixed layout (0 unless [`Planner::keeping_layouts`] or
    /// [`Planner::holding_layout`]).
    pub fn fixed_layout_count(&self) -> usize {
        self.job.fixed_layout_count()
    }

    /// The cost model.
    pub fn cost(&self) -> &CostModel {
        self.job.cost()
    }

    /// The model-stages planned, in stage order.
    pub fn model_stages(&self) -> &[ModelStage] {
        self.job.model_stages()
    }

    /// Parameters per model.
    pub fn parameters(&self) -> BTreeMap<Role, u64> {
        self.job.parameters()
    }

    /// The catalogue of a model.
    pub fn catalogue(&self, role: Role) -> &Catalogue {
        self.job.catalogue(role)
    }

    /// The response length planned for.
    pub fn response_len(&self) -> u64 {
        self.job.response_len()
    }

    /// What one step asks of `ms`.
    pub fn workload(&self, ms: ModelStage) -> &Workload {
        self.job.workload(ms)
    }

    /// Estimates one candidate (its heaviest position on a rank of its own).
    pub fn estimate(&self, c: &Candidate) -> Estimate {
        self.job.estimate(c)
    }

    /// What one rank at pipeline position `j` of `c` holds.
    pub fn position_memory(&self, c: &Candidate, j: u32) -> PositionMemory {
        self.job.position_memory(c, j)
    }

    /// The state one rank at pipeline position `j` of a `layout` unit of `ms` keeps
    /// ([`Planner::position_memory`]'s state, the same for every variant of the layout).
    pub fn position_state(&self, ms: ModelStage, layout: Layout, j: u32) -> MemoryBreakdown {
        self.job.position_state(ms, layout, j)
    }

    /// Every rank's predicted peak under `plan` (placement-exact), the weight sync's pack
    /// buffers included.
    pub fn rank_peaks(&self, plan: &Plan) -> RankPeaks {
        self.job.rank_peaks(plan)
    }

    /// Predicted seconds of one step under `plan`, stage by stage (infinite when a
    /// placement does not fit a rank on its own). Inside a stage, model-stages that share
    /// ranks run one after another and the others concurrently (the execution-overlap graph);
    /// the actor's old log-probabilities run on its training ranks during inference; the
    /// weight sync reshards the trained parameters into the generation and critic inference
    /// layouts.
    pub fn step_seconds(&self, plan: &Plan) -> StepSeconds {
        self.job.step_seconds(plan)
    }

    /// Per stage (generation, inference, training, weight sync): its predicted seconds and the
    /// roofline time per operation class along its critical path (the slowest group of the
    /// overlap graph) — what calibration fits efficiencies to.
    pub fn stage_parts(&self, plan: &Plan) -> PerPhase<(f64, OpSeconds)> {
        self.job.stage_parts(plan)
    }

    /// Predicted step latency of any plan (what admission compares, `ΔL = L(S) − L(S*)`).
    pub fn predict(&self, plan: &Plan) -> f64 {
        self.job.predict(plan)
    }

    /// A step's seconds from its phases as this job runs them: their sum, or for an
    /// asynchronous job the slower pipeline plus the weight sync ([`overlapped_total`]).
    pub fn step_total(&self, step: &StepSeconds) -> f64 {
        self.job.total(step)
    }
}
