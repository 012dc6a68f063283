//! The records a training job writes, one JSON object per line of `metrics.jsonl` (see
//! `docs/operations.md`): serde structs defined once, written by the runtime and read back by
//! the simulator's replay, the benchmarks and the tests. The controller's own record,
//! [`Decision`], lives with the controller (`policy`).

use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::path::PathBuf;

use crate::cost::{MemoryBreakdown, OpSeconds};
use crate::plan::{PerPhase, Plan};
use crate::planner::StepSeconds;
use crate::policy::controller::{StepRecord, TransitionSeconds};
use crate::policy::{Decision, TransitionKind};

/// One line of `metrics.jsonl` per RL step.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct StepLine {
    /// The step (0-based).
    pub step: u64,
    /// Rewards, lengths, KL, losses and gradient norms.
    #[serde(flatten)]
    pub stats: StepStats,
    /// Measured wall seconds of the step.
    pub step_seconds: f64,
    /// The cost model's prediction of them.
    pub predicted_step_seconds: f64,
    /// Measured seconds per phase.
    pub stage_seconds: StepSeconds,
    /// The cost model's prediction of them.
    pub predicted_stage_seconds: StepSeconds,
    /// Seconds per phase and operation class: the slowest rank's measured, and predicted.
    pub op_seconds: Measured<PerPhase<OpSeconds>>,
    /// Generated tokens per second of step time.
    pub tokens_per_second: f64,
    /// Generated tokens per second of the generation phase (absent in runs recorded before it
    /// was).
    #[serde(default)]
    pub generation_tokens_per_second: f64,
    /// The plan the step ran under, per model-stage.
    pub plan: BTreeMap<String, PlacementRecord>,
    /// The controller's decision at the boundary after the step (`null` when no trigger fired).
    pub decision: Option<Decision>,
    /// The transition made at that boundary (`null` when nothing moved).
    pub transition: Option<TransitionRecord>,
    /// The fullest rank's peak memory, measured by its ledger.
    pub peak_memory_bytes: u64,
    /// The cost model's prediction of the fullest rank's peak.
    pub predicted_peak_memory_bytes: u64,
    /// The fullest rank's peak, item by item, measured and predicted.
    pub peak_memory: Measured<RankMemory>,
    /// Every rank's peak, measured and predicted.
    pub rank_peak_memory_bytes: Measured<Vec<u64>>,
    /// On a device: each rank's most bytes held in device allocations since the start, by the
    /// allocator's own count, beside the ledger's peaks above (absent on the host engine).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rank_allocator_peak_bytes: Option<Vec<u64>>,
    /// Per model-stage, the layout-independent digest of its logical state (empty, and left
    /// out, on steps `train.digest_every` skips).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub state_digest: BTreeMap<String, String>,
    /// Per model-stage, its logical counters (absent in runs recorded before they were).
    #[serde(default)]
    pub counters: BTreeMap<String, CountersRecord>,
    /// The pool and what it held, when the pool can change during the run.
    #[serde(flatten, default, skip_serializing_if = "Option::is_none")]
    pub elastic: Option<ElasticRecord>,
    /// An asynchronous step's policy versions and weight sync (`rl.mode = "async"`).
    #[serde(rename = "async", default, skip_serializing_if = "Option::is_none")]
    pub asynchronous: Option<AsyncRecord>,
}

/// What an asynchronous step trained on and left in flight (docs/engine.md, "Asynchronous
/// training").
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct AsyncRecord {
    /// Seconds the ranks outside generation waited on it beyond their own work (inference,
    /// training), rank 0's: 0 when generation is the shorter pipeline. The step line's
    /// `stage_seconds.generation` is generation's own time.
    pub generation_wait_seconds: f64,
    /// The policy version trained: the training weights' version before the step's updates.
    pub policy_version: u64,
    /// Per sample trained on, in batch order, the version of the policy that generated it.
    pub sample_versions: Vec<u64>,
    /// `policy_version` less the oldest of `sample_versions` (at most `rl.max_staleness`).
    pub staleness: u64,
    /// Rollouts generated ahead that were dropped unused: older than `rl.max_staleness`, or
    /// for other prompts than the step's (their prompts are generated again).
    pub dropped_rollouts: u64,
    /// Where the rollouts generated during this step for the next one start (the data
    /// position of their first prompt): in flight at the step's end.
    pub ahead_position: u64,
    /// The policy version that generated them.
    pub ahead_version: u64,
    /// The weight sync after the step: the trained parameters copied into the generation
    /// layout, with parameter digests of `actor/training` before and `actor/generation` after
    /// (equal); `null` when the generation weights are still within `rl.max_staleness`.
    pub weight_sync: Option<TransitionRecord>,
}

/// What an RL step learned and produced: the numbers a user watches.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct StepStats {
    /// Mean task (rule) reward of the sampled responses.
    pub reward_mean: f64,
    /// Mean reward-model score (the learned reward), when one scores.
    pub rm_score_mean: f64,
    /// Mean response length, tokens (EOS included).
    pub response_len_mean: f64,
    /// 95th percentile of the response length.
    pub response_len_p95: f64,
    /// Mean sampled KL divergence of the policy from the reference, per token.
    pub kl: f64,
    /// The last actor update's loss.
    pub actor_loss: f64,
    /// The last critic update's loss (0 without a critic).
    pub critic_loss: f64,
    /// The last actor update's gradient norm.
    pub actor_grad_norm: f64,
    /// The last critic update's gradient norm.
    pub critic_grad_norm: f64,
    /// Updates refused because their loss or gradient norm was not finite
    /// (`on_nonfinite = "skip-step"`).
    pub skipped_updates: u64,
    /// Responses scored 0 because the reward command failed on them (`[reward] on_error =
    /// "zero"`); absent when none.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub reward_failures: u64,
    /// Sampling rounds the step took under dynamic sampling (`rl.dynamic_sampling`); absent
    /// without it.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub sampling_rounds: u64,
    /// Groups dynamic sampling dropped because their rewards were all equal; absent when none.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub dropped_groups: u64,
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}

impl StepLine {
    /// What the controller is shown of this step (a recorded run replays through it).
    pub fn observed(&self) -> StepRecord {
        StepRecord {
            step: self.step,
            response_len_mean: self.stats.response_len_mean,
            response_len_p95: self.stats.response_len_p95,
            step_seconds: self.step_seconds,
            stage_seconds: Some(self.stage_seconds),
            op_seconds: Some(self.op_seconds.measured),
            pool_size: None,
            lost_ranks: self.elastic.as_ref().map(|e| e.lost_ranks.clone()).unwrap_or_default(),
            transition: self
                .transition
                .as_ref()
                .map(|t| TransitionSeconds { predicted_seconds: t.predicted_seconds, seconds: t.seconds }),
        }
    }
}

/// A value as measured, beside what the cost model predicted for it.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Measured<T> {
    /// What the job measured.
    pub measured: T,
    /// What the cost model predicted.
    pub predicted: T,
}

/// One rank's memory, item by item.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct RankMemory {
    /// The rank.
    pub rank: i32,
    /// Its bytes per item at its peak.
    pub items: MemoryBreakdown,
}

/// One model-stage of the plan in force.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PlacementRecord {
    /// Tensor parallelism.
    pub tp: u32,
    /// Pipeline parallelism.
    pub pp: u32,
    /// Data parallelism.
    pub dp: u32,
    /// World ranks, replica-major.
    pub ranks: Vec<i32>,
}

/// `plan` of a step line: each model-stage's layout and ranks.
pub fn placements(plan: &Plan) -> BTreeMap<String, PlacementRecord> {
    plan.placements
        .iter()
        .map(|p| {
            let c = &p.candidate;
            let record = PlacementRecord { tp: c.layout.tp, pp: c.layout.pp, dp: c.dp, ranks: p.ranks.clone() };
            (c.model_stage.to_string(), record)
        })
        .collect()
}

/// A model-stage's logical counters, as a step line records them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct CountersRecord {
    /// Optimizer updates applied.
    pub updates: u64,
    /// Policy version the weights correspond to.
    pub policy_version: u64,
    /// Samples consumed.
    pub data_position: u64,
}

/// A transition run at a step boundary.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TransitionRecord {
    /// How it was admitted.
    pub kind: Option<TransitionKind>,
    /// Measured seconds (slowest rank).
    pub seconds: f64,
    /// The DAG's critical path, seconds.
    pub predicted_seconds: f64,
    /// Bytes sent over the data plane, all ranks together.
    pub bytes: u64,
    /// Bytes staged through host memory.
    pub staged_bytes: u64,
    /// Primitives of the DAG.
    pub primitives: usize,
    /// The plan before.
    pub from: String,
    /// The plan after.
    pub to: String,
    /// Per model-stage digests before the transition.
    pub digests_before: BTreeMap<String, String>,
    /// And after (equal: no state was lost or changed).
    pub digests_after: BTreeMap<String, String>,
}

/// The pool of a step whose pool can change, what every rank held, and ranks lost.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ElasticRecord {
    /// The ranks the step ran on, as an index list (`0-3`).
    pub pool: String,
    /// Bytes every rank's ledger held at the end of the step (zero outside the pool).
    pub held_bytes: Vec<u64>,
    /// Ranks lost so far (sorted).
    pub lost_ranks: Vec<u32>,
    /// A rank lost at the boundary after this step (`null` when none).
    pub rank_loss: Option<RankLossRecord>,
}

/// A rank lost without warning at a step boundary.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RankLossRecord {
    /// The rank.
    pub rank: u32,
    /// Replicas that had a shard there, dropped.
    pub replicas_dropped: usize,
    /// Model-stages left without a replica, restored from a checkpoint.
    pub restored: Vec<String>,
    /// The checkpoint they came from.
    pub checkpoint: Option<PathBuf>,
}

/// An evaluation on the held-out prompts: greedy answers scored by the job's reward, and with
/// `data.pass_k` also `k` sampled answers per prompt.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct EvalResult {
    /// Prompts answered.
    pub prompts: usize,
    /// The greedy answers' mean reward (without a `model` term: the reward model does not
    /// score held-out answers).
    pub mean_reward: f64,
    /// The share answered correctly, greedily (by the first rule term; absent when the reward
    /// has no rule, as a scorer command gives rewards only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub accuracy: Option<f64>,
    /// `k` of pass@k: sampled answers per prompt, at the job's temperature and top-p.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pass_k: Option<u32>,
    /// The share of prompts with at least one correct answer among the `k` sampled.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pass_at_k: Option<f64>,
    /// Mean greedy response length, tokens.
    pub response_len_mean: f64,
}

/// An event of a run that is not a step (`{"event": "resume", …}`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "event", rename_all = "kebab-case")]
pub enum Event {
    /// The run continued from a checkpoint.
    Resume {
        /// The step it continued from.
        from_step: u64,
        /// The checkpoint.
        checkpoint: PathBuf,
        /// Step records already in the file at or after `from_step` (run again now).
        superseded_records: usize,
        /// Whether the checkpoint was not the newest: the run branches off an older line.
        #[serde(default)]
        branch: bool,
    },
    /// Greedy answers to the held-out prompts, scored by the job's reward (text jobs).
    Eval {
        /// RL steps done when it ran (0: after the warm-up, before any RL step).
        step: u64,
        /// What the evaluation found.
        #[serde(flatten)]
        result: EvalResult,
    },
    /// `--resume auto` found no complete checkpoint (a crash before the first): the run starts
    /// fresh, and the step records before this line belong to the run it abandons.
    FreshStart {
        /// Step records of the abandoned run.
        abandoned_records: usize,
    },
}
