//! Predictions of any plan: every rank's peak memory and the step's seconds per phase, with
//! the roofline time per operation class along each phase's critical path. They need only
//! what the planner knows of the job ([`JobModel`]), not the search, which reads them.

use crate::cost::{MemoryBreakdown, MemoryItem, OpSeconds, RankPeaks};
use crate::plan::{overlap_critical, ModelStage, PerPhase, Plan, Role, Stage, WEIGHT_SYNCS as SYNCS};

use super::job::JobModel;

/// Predicted seconds per phase of a step.
pub type StepSeconds = PerPhase<f64>;

pub(super) const GENERATION: ModelStage = ModelStage::new(Role::Actor, Stage::Generation);
pub(super) const ACTOR_TRAINING: ModelStage = ModelStage::new(Role::Actor, Stage::Training);

/// An overlapped step's seconds: generation of the next step's rollouts runs beside inference
/// and training on this step's, then the weight sync (`max(gen, inf + train) + sync`).
pub fn overlapped_total(step: &StepSeconds) -> f64 {
    step.generation.max(step.inference + step.training) + step.weight_sync
}

/// Whether `plan` keeps `actor/generation` on ranks no other model-stage uses (what an
/// asynchronous step needs).
pub fn generation_apart(plan: &Plan) -> bool {
    let Some(g) = plan.placements.iter().find(|p| p.candidate.model_stage == GENERATION) else { return false };
    let others = plan.placements.iter().filter(|p| p.candidate.model_stage != GENERATION);
    others.flat_map(|p| p.ranks.iter()).all(|r| !g.ranks.contains(r))
}

impl JobModel {
    /// Every rank's predicted peak under `plan` (placement-exact), the weight sync's pack
    /// buffers included.
    pub(super) fn rank_peaks(&self, plan: &Plan) -> RankPeaks {
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

    /// Predicted seconds of one step under `plan`, stage by stage (infinite when a
    /// placement does not fit a rank on its own). Inside a stage, model-stages that share
    /// ranks run one after another and the others concurrently (the execution-overlap graph);
    /// the actor's old log-probabilities run on its training ranks during inference; the
    /// weight sync reshards the trained parameters into the generation and critic inference
    /// layouts.
    pub(super) fn step_seconds(&self, plan: &Plan) -> StepSeconds {
        self.stage_parts(plan).map(|(seconds, _)| *seconds)
    }

    /// Per stage (generation, inference, training, weight sync): its predicted seconds and the
    /// roofline time per operation class along its critical path (the slowest group of the
    /// overlap graph) — what calibration fits efficiencies to.
    pub(super) fn stage_parts(&self, plan: &Plan) -> PerPhase<(f64, OpSeconds)> {
        self.parts_of(plan, false)
    }

    /// [`JobModel::step_seconds`] of a plan known to keep every rank within memory (so every
    /// position of it fits a rank of its own: its candidates' memory is not estimated again).
    pub(super) fn fitting_step_seconds(&self, plan: &Plan) -> StepSeconds {
        self.parts_of(plan, true).map(|(seconds, _)| *seconds)
    }

    /// [`JobModel::stage_parts`]; `fits`: every candidate of `plan` is known to fit a rank of its
    /// own, so only its latency is estimated (the estimate's own, as it is for any that fits).
    pub(super) fn parts_of(&self, plan: &Plan, fits: bool) -> PerPhase<(f64, OpSeconds)> {
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
    pub(super) fn predict(&self, plan: &Plan) -> f64 {
        self.total(&self.step_seconds(plan))
    }

    /// A step's seconds from its parts: their sum, or with generation overlapped the slower
    /// pipeline plus the sync ([`overlapped_total`]).
    pub(super) fn total(&self, step: &StepSeconds) -> f64 {
        if self.overlapped {
            overlapped_total(step)
        } else {
            step.total()
        }
    }

    /// The weight sync's roofline time (the two reshards run one after the other).
    pub(super) fn weight_sync_breakdown(&self, plan: &Plan) -> OpSeconds {
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
}
