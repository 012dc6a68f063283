//! What a planner knows of the job, beneath every search: the cost model, each model's
//! catalogue and statistics, each model-stage's workload and the layouts a policy fixes, with
//! the cost model's estimates of single candidates. The candidates (`candidates.rs`) and the
//! predictions of whole plans (`predict.rs`) are built on it alone, and the search on them, so
//! nothing here names the search.

use std::collections::BTreeMap;
use std::sync::Arc;

use crate::config::{Algorithm, JobConfig};
use crate::cost::{
    CostModel, Efficiencies, EngineKind, Estimate, Hardware, MemoryBreakdown, ModelStats, PositionCost, PositionMemory,
    Workload,
};
use crate::model::{Architecture, Catalogue, Layout};
use crate::plan::{model_stages, Candidate, ModelStage, Role, Stage};

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
            (role, Catalogue::new(Architecture::from_spec(spec, role.head())))
        })
        .collect()
}

/// One model of the job: its parameters and the statistics the cost model reads of them.
pub(super) struct Model {
    pub(super) catalogue: Catalogue,
    pub(super) stats: ModelStats,
}

/// The job as the cost model sees it on one pool: the part of a planner that does not depend
/// on the search. The models' catalogues are built once and shared by every copy.
#[derive(Clone)]
pub(super) struct JobModel {
    pub(super) cost: CostModel,
    pub(super) models: Arc<BTreeMap<Role, Model>>,
    pub(super) workloads: BTreeMap<ModelStage, Workload>,
    pub(super) model_stages: Vec<ModelStage>,
    /// The one layout each model-stage may take, when they are fixed (the static policy):
    /// only replica counts and ranks are searched.
    pub(super) fixed_layouts: Option<Arc<BTreeMap<ModelStage, Layout>>>,
    /// `rl.mode = "async"`: generation on ranks of its own, overlapping inference and
    /// training (`overlap.rs`).
    pub(super) overlapped: bool,
}

impl JobModel {
    /// `config`'s job on `gpus` devices of its cluster, at `response_len` tokens (default: the
    /// configured maximum), costed for the engine of the cluster's data plane.
    pub(super) fn new(
        config: &JobConfig,
        gpus: u32,
        response_len: Option<u64>,
        efficiencies: Efficiencies,
    ) -> JobModel {
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
        let overlapped = rl.mode == crate::config::RlMode::Async;
        JobModel { cost, models: Arc::new(models), workloads, model_stages, fixed_layouts: None, overlapped }
    }

    /// The same job on `gpus` devices, at `response_len` tokens, under `efficiencies`.
    pub(super) fn retarget(&mut self, gpus: u32, response_len: u64, efficiencies: Efficiencies) {
        self.cost.efficiencies = efficiencies;
        for w in self.workloads.values_mut() {
            w.response_len = response_len;
        }
        self.cost.hardware.devices = gpus;
    }

    /// How many model-stages have a fixed layout.
    pub(super) fn fixed_layout_count(&self) -> usize {
        self.fixed_layouts.as_ref().map_or(0, |l| l.len())
    }

    /// The layout `ms` must keep, when the layouts are fixed.
    pub(super) fn fixed_layout(&self, ms: ModelStage) -> Option<Layout> {
        self.fixed_layouts.as_ref().and_then(|l| l.get(&ms).copied())
    }

    /// The cost model.
    pub(super) fn cost(&self) -> &CostModel {
        &self.cost
    }

    /// The model-stages, in stage order.
    pub(super) fn model_stages(&self) -> &[ModelStage] {
        &self.model_stages
    }

    /// Parameters per model.
    pub(super) fn parameters(&self) -> BTreeMap<Role, u64> {
        self.models.iter().map(|(r, m)| (*r, m.stats.params)).collect()
    }

    /// The catalogue of a model.
    pub(super) fn catalogue(&self, role: Role) -> &Catalogue {
        &self.models[&role].catalogue
    }

    /// The response length of the workloads.
    pub(super) fn response_len(&self) -> u64 {
        self.workloads.values().next().map_or(0, |w| w.response_len)
    }

    /// Estimates one candidate (its heaviest position on a rank of its own).
    pub(super) fn estimate(&self, c: &Candidate) -> Estimate {
        self.stage_cost(c.model_stage).estimate(c)
    }

    /// The cost inputs of `ms`, looked up once for the many candidates a search estimates.
    pub(super) fn stage_cost(&self, ms: ModelStage) -> StageCost<'_> {
        StageCost { cost: &self.cost, stats: &self.models[&ms.role].stats, workload: &self.workloads[&ms], ms }
    }

    /// What one rank at pipeline position `j` of `c` holds.
    pub(super) fn position_memory(&self, c: &Candidate, j: u32) -> PositionMemory {
        self.stage_cost(c.model_stage).position_memory(c, j)
    }

    /// The state one rank at pipeline position `j` of a `layout` unit of `ms` keeps
    /// ([`JobModel::position_memory`]'s state, the same for every variant of the layout).
    pub(super) fn position_state(&self, ms: ModelStage, layout: Layout, j: u32) -> MemoryBreakdown {
        self.cost.position_state(&self.models[&ms.role].stats, ms, layout, j)
    }

    /// What one step asks of `ms`.
    pub(super) fn workload(&self, ms: ModelStage) -> &Workload {
        &self.workloads[&ms]
    }
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

    /// [`JobModel::estimate`] of a candidate of this model-stage.
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

    /// [`JobModel::position_memory`] of a candidate of this model-stage.
    pub(super) fn position_memory(&self, c: &Candidate, j: u32) -> PositionMemory {
        self.cost.position_memory(self.stats, c, self.workload, j)
    }
}
