//! The planner itself: candidates, frontiers, the per-stage DP, rank assignment.

use serde::Serialize;
use std::collections::BTreeMap;
use std::sync::Arc;
use thiserror::Error;

use crate::config::{Algorithm, JobConfig};
use crate::cost::{
    training_state_bytes_per_param, CostModel, Efficiencies, Estimate, Hardware, ModelStats, Workload, GRADIENT_BYTES,
};
use crate::model::{Architecture, Catalogue, Layout};
use crate::plan::{model_stages, Candidate, ModelStage, Placement, Plan, Recompute, Role, Stage};
use crate::units::format_bytes;

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
    /// The pool is empty.
    #[error("the pool has no GPUs; pass --gpus N with N >= 1")]
    EmptyPool,
}

/// The chosen placement of one model-stage and its estimate.
#[derive(Debug, Clone, Serialize)]
pub struct ModelStagePlan {
    /// Placement.
    pub placement: Placement,
    /// Estimate.
    pub estimate: Estimate,
}

/// A global plan with its predicted step latency.
#[derive(Debug, Clone, Serialize)]
pub struct PlannedJob {
    /// Per model-stage, in stage order.
    pub model_stages: Vec<ModelStagePlan>,
    /// Predicted step latency, seconds.
    pub step_latency_s: f64,
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
/// every [`Planner::replanned`] copy, so a replan only redoes the search.
#[derive(Clone)]
pub struct Planner {
    cost: CostModel,
    models: Arc<BTreeMap<Role, Model>>,
    workloads: BTreeMap<ModelStage, Workload>,
    model_stages: Vec<ModelStage>,
    resident: BTreeMap<Stage, u64>,
}

type Scored = (Candidate, Estimate);

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

impl Planner {
    /// A planner for `config`'s job on `gpus` devices of its cluster, at `response_len` tokens
    /// (default: the configured maximum).
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
        let mut models = BTreeMap::new();
        for (role, catalogue) in catalogues(config) {
            let stats = ModelStats::new(&catalogue);
            models.insert(role, Model { catalogue, stats });
        }
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
            };
            workloads.insert(*ms, w);
        }
        let mut planner = Planner {
            cost: CostModel { hardware, efficiencies },
            models: Arc::new(models),
            workloads,
            model_stages,
            resident: BTreeMap::new(),
        };
        planner.resident = planner.resident_per_stage();
        Ok(planner)
    }

    /// The same job re-targeted: another pool size, response length or calibration. Cheap:
    /// the catalogues are shared, only the workloads and resident state are recomputed.
    pub fn replanned(&self, gpus: u32, response_len: u64, efficiencies: Efficiencies) -> Result<Planner, PlannerError> {
        if gpus == 0 {
            return Err(PlannerError::EmptyPool);
        }
        let mut p = self.clone();
        p.cost.hardware.devices = gpus;
        p.cost.efficiencies = efficiencies;
        for w in p.workloads.values_mut() {
            w.response_len = response_len;
        }
        p.resident = p.resident_per_stage();
        Ok(p)
    }

    /// Per stage: one replica of every other stage's model-stage state, spread evenly over the
    /// pool, stays resident while the stage runs.
    fn resident_per_stage(&self) -> BTreeMap<Stage, u64> {
        let state = |ms: &ModelStage| {
            let m = &self.models[&ms.role];
            let per_param = if ms.trains() {
                training_state_bytes_per_param(m.stats.arch.dtype, GRADIENT_BYTES)
            } else {
                m.stats.arch.dtype.bytes()
            };
            m.stats.params * per_param
        };
        [Stage::Generation, Stage::Inference, Stage::Training]
            .into_iter()
            .map(|stage| {
                let others: u64 = self.model_stages.iter().filter(|ms| ms.stage != stage).map(state).sum();
                (stage, others / u64::from(self.cost.hardware.devices))
            })
            .collect()
    }

    /// The model-stages planned, in stage order.
    pub fn model_stages(&self) -> &[ModelStage] {
        &self.model_stages
    }

    /// Parameters per model.
    pub fn parameters(&self) -> BTreeMap<Role, u64> {
        self.models.iter().map(|(r, m)| (*r, m.stats.params)).collect()
    }

    /// Estimates one candidate.
    pub fn estimate(&self, c: &Candidate) -> Estimate {
        let m = &self.models[&c.model_stage.role];
        self.estimate_with(m.stats.max_params_per_rank(&m.catalogue, c.layout), c)
    }

    /// Estimates one candidate whose layout's heaviest-rank parameter count is known.
    fn estimate_with(&self, params_per_rank: u64, c: &Candidate) -> Estimate {
        let m = &self.models[&c.model_stage.role];
        self.cost.estimate(
            params_per_rank,
            &m.stats,
            c,
            &self.workloads[&c.model_stage],
            self.resident[&c.model_stage.stage],
        )
    }

    /// Every candidate of `ms` (feasible or not) with TP inside a node.
    ///
    /// With `prune`, only the smallest `dp` for each per-replica batch `⌈B/dp⌉` is kept: a
    /// larger `dp` with the same batch uses more ranks, needs the same memory and is no faster
    /// (its DP all-reduce only grows), so it can never be on the frontier.
    fn all_candidates(&self, ms: ModelStage, prune: bool) -> Vec<Scored> {
        let hw = &self.cost.hardware;
        let model = &self.models[&ms.role];
        let workload = &self.workloads[&ms];
        let sequences = workload.sequences;
        let recomputes: &[Recompute] =
            if ms.trains() { &[Recompute::None, Recompute::Selective, Recompute::Full] } else { &[Recompute::None] };
        let micro_batches: Vec<u32> = if ms.stage == Stage::Generation {
            vec![workload.micro_batch as u32]
        } else {
            std::iter::successors(Some(workload.micro_batch.max(1) as u32), |m| (*m > 1).then_some(m / 2)).collect()
        };
        let mut out = Vec::new();
        for tp in (1..=hw.devices_per_node.min(hw.devices)).filter(|t| hw.devices_per_node.is_multiple_of(*t)) {
            // A deeper pipeline whose fullest stage has as many blocks as a shallower one's is as
            // slow and needs more ranks: only the shallowest pp per stage size can be optimal.
            let layers = model.stats.arch.layers as u32;
            let pps = (1..=(hw.devices / tp).min(layers))
                .filter(|&pp| pp == 1 || layers.div_ceil(pp) < layers.div_ceil(pp - 1));
            for pp in pps {
                let layout = Layout::new(tp, pp);
                if model.catalogue.check_layout(layout).is_err() {
                    continue;
                }
                let params_per_rank = model.stats.max_params_per_rank(&model.catalogue, layout);
                let max_dp = (hw.devices / layout.size()).min(sequences.min(u64::from(u32::MAX)) as u32);
                let mut last_batch = u64::MAX;
                for dp in 1..=max_dp {
                    let batch = sequences.div_ceil(u64::from(dp));
                    if prune && batch == last_batch {
                        continue;
                    }
                    last_batch = batch;
                    for &micro_batch in &micro_batches {
                        // Recomputation only trades speed for memory: past the first feasible
                        // mode, the others are slower on the same ranks.
                        for &recompute in recomputes {
                            let c = Candidate { model_stage: ms, layout, dp, recompute, micro_batch };
                            let e = self.estimate_with(params_per_rank, &c);
                            out.push((c, e));
                            if prune && e.feasible {
                                break;
                            }
                        }
                    }
                }
            }
        }
        out
    }

    /// Feasible candidates of `ms`.
    pub fn candidates(&self, ms: ModelStage) -> Vec<Scored> {
        self.all_candidates(ms, true).into_iter().filter(|(_, e)| e.feasible).collect()
    }

    /// The latency-versus-ranks frontier of `ms`: ascending ranks, strictly falling latency.
    /// Among equally fast candidates with the same rank count, `prefer` (the current one) wins.
    pub fn frontier(&self, ms: ModelStage, prefer: Option<&Candidate>) -> Vec<Scored> {
        let mut best: BTreeMap<u32, Scored> = BTreeMap::new();
        for (c, e) in self.candidates(ms) {
            let slot = best.entry(c.ranks()).or_insert((c, e));
            let better = e.seconds < slot.1.seconds || (e.seconds == slot.1.seconds && Some(&c) == prefer);
            if better {
                *slot = (c, e);
            }
        }
        let mut frontier: Vec<Scored> = Vec::new();
        for (_, point) in best {
            if frontier.last().is_none_or(|last| point.1.seconds < last.1.seconds) {
                frontier.push(point);
            }
        }
        frontier
    }

    /// Predicted step latency of any plan under this planner's workload and calibration
    /// (infinite if a placement does not fit): what admission compares, `ΔL = L(S) − L(S*)`.
    pub fn predict(&self, plan: &Plan) -> f64 {
        let latency: BTreeMap<ModelStage, f64> =
            plan.placements.iter().map(|p| (p.candidate.model_stage, self.estimate(&p.candidate).seconds)).collect();
        plan.step_latency(|p| latency[&p.candidate.model_stage])
    }

    /// The fastest feasible plan (ties: the current plan's candidates and ranks).
    pub fn search(&self, current: Option<&Plan>) -> Result<PlannedJob, PlannerError> {
        let prefer = |ms: ModelStage| {
            current.and_then(|p| p.placements.iter().find(|x| x.candidate.model_stage == ms)).map(|p| p.candidate)
        };
        let mut chosen: Vec<Scored> = Vec::new();
        for stage in [Stage::Generation, Stage::Inference, Stage::Training] {
            let members: Vec<ModelStage> = self.model_stages.iter().copied().filter(|m| m.stage == stage).collect();
            let mut frontiers = Vec::new();
            for &ms in &members {
                let f = self.frontier(ms, prefer(ms).as_ref());
                if f.is_empty() {
                    return Err(self.does_not_fit(ms));
                }
                frontiers.push(f);
            }
            match min_max_knapsack(&frontiers, self.cost.hardware.devices) {
                Some(picks) => chosen.extend(picks.into_iter().enumerate().map(|(i, k)| frontiers[i][k])),
                None => {
                    let need = frontiers.iter().map(|f| f[0].0.ranks()).sum();
                    return Err(PlannerError::StageTooLarge {
                        gpus: self.cost.hardware.devices,
                        stage,
                        need,
                        hint: self.hint(),
                    });
                }
            }
        }
        let placements = assign_ranks(&chosen, self.cost.hardware.devices, current);
        let model_stages: Vec<ModelStagePlan> = chosen
            .iter()
            .zip(placements)
            .map(|((_, e), placement)| ModelStagePlan { placement, estimate: *e })
            .collect();
        let plan = Plan { placements: model_stages.iter().map(|m| m.placement.clone()).collect() };
        let by_ms: BTreeMap<ModelStage, f64> =
            model_stages.iter().map(|m| (m.placement.candidate.model_stage, m.estimate.seconds)).collect();
        let step_latency_s = plan.step_latency(|p| by_ms[&p.candidate.model_stage]);
        Ok(PlannedJob { model_stages, step_latency_s })
    }

    /// The optimal step latency by brute force over every feasible candidate combination
    /// (small settings only: tests use it to check [`Planner::search`]).
    pub fn exhaustive(&self) -> Option<f64> {
        let n = self.cost.hardware.devices;
        let mut total = 0.0;
        for stage in [Stage::Generation, Stage::Inference, Stage::Training] {
            let lists: Vec<Vec<Scored>> = self
                .model_stages
                .iter()
                .filter(|m| m.stage == stage)
                .map(|&m| self.all_candidates(m, false).into_iter().filter(|(_, e)| e.feasible).collect())
                .collect();
            fn go(lists: &[Vec<Scored>], budget: u32, worst: f64) -> Option<f64> {
                let Some((first, rest)) = lists.split_first() else { return Some(worst) };
                first
                    .iter()
                    .filter(|(c, _)| c.ranks() <= budget)
                    .filter_map(|(c, e)| go(rest, budget - c.ranks(), worst.max(e.seconds)))
                    .min_by(f64::total_cmp)
            }
            total += go(&lists, n, 0.0)?;
        }
        Some(total)
    }

    fn does_not_fit(&self, ms: ModelStage) -> PlannerError {
        let hw = &self.cost.hardware;
        let need = self.all_candidates(ms, true).iter().map(|(_, e)| e.memory.total()).min().unwrap_or(0);
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
        let len = self.workloads.values().next().map_or(0, |w| w.response_len);
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

    fn search_quiet(&self) -> bool {
        [Stage::Generation, Stage::Inference, Stage::Training].into_iter().all(|stage| {
            let frontiers: Vec<Vec<Scored>> =
                self.model_stages.iter().filter(|m| m.stage == stage).map(|&m| self.frontier(m, None)).collect();
            frontiers.iter().all(|f| !f.is_empty())
                && min_max_knapsack(&frontiers, self.cost.hardware.devices).is_some()
        })
    }
}

/// Picks one frontier point per model-stage minimizing the slowest, with total ranks within
/// `budget`. `best[i][b]`: smallest max latency of model-stages `0..=i` using at most `b` ranks.
fn min_max_knapsack(frontiers: &[Vec<Scored>], budget: u32) -> Option<Vec<usize>> {
    let b = budget as usize;
    let mut best: Vec<Vec<f64>> = Vec::with_capacity(frontiers.len());
    let mut pick: Vec<Vec<usize>> = Vec::with_capacity(frontiers.len());
    for (i, f) in frontiers.iter().enumerate() {
        let mut row = vec![f64::INFINITY; b + 1];
        let mut choice = vec![usize::MAX; b + 1];
        for r in 0..=b {
            for (k, (c, e)) in f.iter().enumerate() {
                let used = c.ranks() as usize;
                if used > r {
                    break; // frontier ranks ascend
                }
                let before = if i == 0 { 0.0 } else { best[i - 1][r - used] };
                let value = before.max(e.seconds);
                if value < row[r] {
                    row[r] = value;
                    choice[r] = k;
                }
            }
        }
        best.push(row);
        pick.push(choice);
    }
    if frontiers.is_empty() {
        return Some(Vec::new());
    }
    if !best[frontiers.len() - 1][b].is_finite() {
        return None;
    }
    let mut picks = vec![0; frontiers.len()];
    let mut r = b;
    for i in (0..frontiers.len()).rev() {
        let k = pick[i][r];
        picks[i] = k;
        r -= frontiers[i][k].0.ranks() as usize;
    }
    Some(picks)
}

/// Concrete ranks, stage by stage: unchanged candidates keep their current ranks when free;
/// the rest get contiguous TP-aligned blocks, largest TP first.
fn assign_ranks(chosen: &[Scored], pool: u32, current: Option<&Plan>) -> Vec<Placement> {
    let mut out: Vec<Option<Placement>> = vec![None; chosen.len()];
    for stage in [Stage::Generation, Stage::Inference, Stage::Training] {
        let mut used = vec![false; pool as usize];
        let mut order: Vec<usize> = (0..chosen.len()).filter(|&i| chosen[i].0.model_stage.stage == stage).collect();
        for &i in &order {
            let c = chosen[i].0;
            let previous = current.and_then(|p| p.placements.iter().find(|x| x.candidate == c));
            if let Some(prev) = previous {
                if prev.ranks.iter().all(|&r| (r as u32) < pool && !used[r as usize]) {
                    prev.ranks.iter().for_each(|&r| used[r as usize] = true);
                    out[i] = Some(prev.clone());
                }
            }
        }
        order.retain(|&i| out[i].is_none());
        order.sort_by_key(|&i| std::cmp::Reverse(chosen[i].0.layout.tp));
        for i in order {
            let c = chosen[i].0;
            let (size, align) = (c.ranks() as usize, c.layout.tp as usize);
            let start = (0..pool as usize)
                .step_by(align)
                .find(|&s| s + size <= pool as usize && used[s..s + size].iter().all(|u| !u))
                .or_else(|| {
                    (0..pool as usize).find(|&s| s + size <= pool as usize && used[s..s + size].iter().all(|u| !u))
                });
            let ranks: Vec<i32> = match start {
                Some(s) => (s..s + size).map(|r| r as i32).collect(),
                // Fragmented by kept ranks: take any free ranks (the DP guarantees enough).
                None => (0..pool as usize).filter(|&r| !used[r]).take(size).map(|r| r as i32).collect(),
            };
            ranks.iter().for_each(|&r| used[r as usize] = true);
            out[i] = Some(Placement { candidate: c, ranks });
        }
    }
    out.into_iter().map(|p| p.expect("every model-stage placed")).collect()
}

#[cfg(test)]
mod tests;
