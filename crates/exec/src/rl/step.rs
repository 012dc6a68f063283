//! The synchronous RL step across model-stages (docs/engine.md, "The RL step"):
//!
//! 1. generation — `actor/generation` replicas sample responses to their share of the prompts
//!    (ReMax also decodes each prompt greedily for its baseline);
//! 2. inference — `reference/inference`, `reward/inference`, `critic/inference` and the actor's
//!    own log-probabilities run on their ranks; one sum over the world assembles the rollout
//!    on every rank (each replica's speaker contributes its rows);
//! 3. training — advantages (replicated), then mini-batches of `actor/training` and
//!    `critic/training` updates, gradients all-reduced within each model-stage;
//! 4. weight sync — training weights are resharded into the generation (and critic inference)
//!    layouts, rank to rank;
//! 5. safe boundary — metrics and digests are assembled for rank 0.

use std::collections::BTreeMap;
use std::time::Instant;

use serde::Serialize;

use super::advantage::{overlong_penalty, varied_groups, Estimator};
use super::losses::{ActorLoss, PolicyTerms, RatioLevel};
use super::task::{ArithmeticTask, Scores, Split, Task, TextSample};
use super::{AdvantageParams, Rollout, ValueLoss};
mod overlap;
pub use overlap::Ahead;

use crate::comm::{DataPlane, GroupId};
use crate::emu::{dag, Counters, EmuId, EmuSet, Exchange, ShardMemory};
use crate::engine::parallel::assemble_rows;
use crate::engine::timers::{self, timed};
use crate::engine::{
    share, train_step, AdamW, Batch, EngineError, EngineMemory, Generated, Objective, Replica, Sampling, StepReport,
    Wave,
};
use nereus_core::config::rl::BEHAVIOUR_WEIGHT_CAP;
use nereus_core::config::{Algorithm, JobConfig, KlEstimator, KlIn, RewardSource};
use nereus_core::cost::OpClass;
use nereus_core::cost::OpSeconds;
use nereus_core::plan::{ModelStage, PerPhase, Phase, Plan, Role, Stage};
use nereus_core::planner::StepSeconds;
use nereus_core::record::{EvalResult, StepStats};
use nereus_core::transition::TransitionDag;

/// Everything an RL step needs besides the state, derived from the job config.
#[derive(Debug, Clone)]
pub struct StepSettings {
    /// The algorithm (`rl.algorithm`).
    pub algorithm: Algorithm,
    /// The task and its reward.
    pub task: Task,
    /// Prompts per step.
    pub prompts: usize,
    /// Samples per prompt.
    pub samples: usize,
    /// Sequences per optimizer update.
    pub mini_batch: usize,
    /// Sequences per forward/backward pass.
    pub micro_batch: usize,
    /// Passes over each step's rollouts.
    pub epochs: usize,
    /// Sampling of the actor.
    pub sampling: Sampling,
    /// Actor optimizer.
    pub actor_opt: AdamW,
    /// Critic optimizer.
    pub critic_opt: AdamW,
    /// Advantage coefficients.
    pub advantage: AdvantageParams,
    /// How advantages are estimated.
    pub estimator: Estimator,
    /// The KL estimator of the rewards' penalty (`rl.kl_in = "reward"`), else `None`.
    pub reward_kl: Option<KlEstimator>,
    /// The actor loss's terms.
    pub policy: PolicyTerms,
    /// Critic value clip.
    pub value_clip: f64,
    /// Most sampling rounds of a step under DAPO's dynamic sampling; `None` without it.
    pub dynamic_rounds: Option<usize>,
    /// DAPO's overlong buffer in tokens (0: no shaping).
    pub overlong_buffer: usize,
    /// Score the policy is trained on.
    pub reward: RewardSource,
    /// Decoded responses recorded per step (text jobs).
    pub samples_logged: usize,
    /// Sampled answers per held-out prompt for pass@k (0: greedy answers only).
    pub pass_k: usize,
    /// `rl.max_staleness` in asynchronous mode (`overlap`); `None`: synchronous steps.
    pub max_staleness: Option<u64>,
}

impl StepSettings {
    /// The built-in arithmetic task of `config` (its `[data]` section aside).
    pub fn arithmetic_task(config: &JobConfig) -> Task {
        let (rl, t) = (&config.rl, &config.train);
        let cap = if t.reward_cap > 0 { t.reward_cap } else { rl.max_response_len };
        let vocab = config.models.actor.vocab;
        Task::Arithmetic(ArithmeticTask { prompt_len: rl.prompt_len as usize, vocab, cap: cap as usize })
    }

    /// The settings of `config` for `task` (the arithmetic task, or the text task its
    /// `[data]` section describes).
    pub fn new(config: &JobConfig, task: Task) -> StepSettings {
        let (rl, t) = (&config.rl, &config.train);
        let (eos, also_stop) = task.stop();
        let opt = |lr: f64| AdamW {
            lr: lr as f32,
            weight_decay: t.weight_decay as f32,
            max_grad_norm: t.max_grad_norm as f32,
            ..AdamW::default()
        };
        StepSettings {
            algorithm: rl.algorithm,
            task,
            prompts: rl.prompts_per_step as usize,
            samples: rl.samples_per_prompt as usize,
            mini_batch: rl.mini_batch as usize,
            micro_batch: rl.micro_batch as usize,
            epochs: rl.epochs as usize,
            sampling: Sampling {
                temperature: t.temperature as f32,
                top_p: t.top_p as f32,
                min_p: t.min_p as f32,
                top_k: t.top_k,
                max_new_tokens: rl.max_response_len as usize,
                eos,
                also_stop,
                greedy: false,
                seed: config.job.seed,
                stop_check_every: t.stop_check_every as usize,
            },
            actor_opt: opt(t.actor_lr),
            critic_opt: opt(t.critic_lr),
            advantage: AdvantageParams {
                kl_coef: t.kl_coef,
                gamma: t.discount,
                lambda: t.gae_lambda,
                group: rl.samples_per_prompt as usize,
            },
            estimator: Estimator::of(rl.algorithm),
            reward_kl: (rl.kl_in() == KlIn::Reward).then_some(rl.kl_estimator()),
            policy: Self::policy_terms(config),
            value_clip: t.value_clip,
            dynamic_rounds: rl.dynamic_sampling().then_some(rl.max_sampling_rounds as usize),
            overlong_buffer: rl.overlong_buffer() as usize,
            reward: t.reward,
            samples_logged: config.data.as_ref().map_or(0, |d| d.samples_per_step as usize),
            pass_k: config.data.as_ref().map_or(0, |d| d.pass_k as usize),
            max_staleness: rl.max_staleness().map(u64::from),
        }
    }

    /// The actor loss's terms of `config`: the algorithm's ratio, `train.clip_low/high`, the KL
    /// term when `rl.kl_in = "loss"`, the entropy bonus, `rl.loss_agg`.
    fn policy_terms(config: &JobConfig) -> PolicyTerms {
        let (rl, t) = (&config.rl, &config.train);
        let (clip_low, clip_high) = t.clip_range(rl.algorithm);
        PolicyTerms {
            ratio: RatioLevel::of(rl.algorithm),
            clip_low,
            clip_high,
            kl_coef: if rl.kl_in() == KlIn::Loss { t.kl_coef } else { 0.0 },
            kl_estimator: rl.kl_estimator(),
            entropy_coef: t.entropy_coef,
            agg: rl.loss_agg(),
            behaviour_cap: rl.behaviour_weight_cap().unwrap_or(BEHAVIOUR_WEIGHT_CAP),
        }
    }

    /// Sequences per step.
    pub fn sequences(&self) -> usize {
        self.prompts * self.samples
    }

    /// Positions per sequence.
    pub fn seq_len(&self) -> usize {
        self.task.prompt_len() + self.sampling.max_new_tokens
    }

    /// A rollout of generated sequences (whose prompts begin at `starts`), before inference
    /// fills in the rest.
    fn rollout_of(&self, generated: Generated, starts: Vec<usize>) -> Rollout {
        Rollout {
            prompt_len: self.task.prompt_len(),
            seq_len: self.seq_len(),
            starts,
            tokens: generated.tokens,
            lengths: generated.lengths,
            ..Rollout::default()
        }
    }
}

/// The prompts of one sampling call: sequence `i` answers `tokens(i)` (left-padded to the
/// prompt length), whose real tokens begin at `start(i)`, with draw id `id(i)`.
struct Prompts<A, B, C> {
    tokens: A,
    start: B,
    id: C,
}

/// Draw ids of pass@k's sampled answers: above every training draw's (`step × sequences + i`),
/// so an evaluation never repeats a training sample's uniforms.
const PASS_AT_K_IDS: u64 = 1 << 62;

/// Draw ids of dynamic sampling's later rounds (`position × samples + j`): above every first
/// round's, below pass@k's.
const RESAMPLED_IDS: u64 = 1 << 61;

/// A generation replica's share of a sampling: its sequences, what it sampled, the replica.
type Share<'a> = (std::ops::Range<usize>, Generated, &'a Replica);

/// What one RL step reports on rank 0.
#[derive(Debug, Clone, Default, Serialize)]
pub struct StepMetrics {
    /// Rewards, lengths, KL, losses and gradient norms (as the step line records them).
    pub stats: StepStats,
    /// The first refused update of the step, if any.
    #[serde(skip)]
    pub non_finite: Option<NonFinite>,
    /// Wall seconds per phase (rank 0, between world-wide synchronization points).
    pub stage_seconds: StepSeconds,
    /// This rank's seconds per operation class in each phase (`engine::timers`).
    pub op_seconds: PerPhase<OpSeconds>,
    /// Wall seconds of the step.
    pub step_seconds: f64,
    /// Response tokens generated.
    pub generated_tokens: u64,
    /// A text job's first responses, decoded (rank 0).
    #[serde(skip)]
    pub samples: Vec<TextSample>,
    /// An asynchronous step's policy versions and weight sync (`None` for a synchronous step).
    pub asynchronous: Option<nereus_core::record::AsyncRecord>,
}

/// The optimizer updates of one training model-stage during a step.
#[derive(Debug, Clone, Copy)]
struct Updates {
    last: StepReport,
    applied: u64,
    skipped: u64,
    first_skipped: Option<StepReport>,
}

impl Default for Updates {
    fn default() -> Updates {
        Updates { last: StepReport::NONE, applied: 0, skipped: 0, first_skipped: None }
    }
}

impl Updates {
    /// Floats per model-stage when the updates travel to every rank.
    const WIDTH: usize = 7;

    fn add(&mut self, r: StepReport) {
        self.last = r;
        if r.skipped {
            self.skipped += 1;
            self.first_skipped.get_or_insert(r);
        } else {
            self.applied += 1;
        }
    }

    /// `[loss, norm, applied, skipped, has_skip, skipped loss, skipped norm]` (counts are exact
    /// in f32 far beyond any step's updates; NaN and infinities travel unchanged).
    fn to_row(self) -> [f32; Updates::WIDTH] {
        let first = self.first_skipped.unwrap_or(StepReport::NONE);
        let has = f32::from(u8::from(self.first_skipped.is_some()));
        let (l, n) = (self.last.loss as f32, self.last.grad_norm as f32);
        [l, n, self.applied as f32, self.skipped as f32, has, first.loss as f32, first.grad_norm as f32]
    }

    fn from_row(r: &[f32]) -> Updates {
        let report = |loss: f32, norm: f32, skipped| StepReport { loss: loss.into(), grad_norm: norm.into(), skipped };
        Updates {
            last: report(r[0], r[1], false),
            applied: r[2] as u64,
            skipped: r[3] as u64,
            first_skipped: (r[4] > 0.0).then(|| report(r[5], r[6], true)),
        }
    }
}

/// One sampling round of a step, scored: the rollout (its `scores` those the policy trains on),
/// the task's rewards, the reward model's scores, ReMax's greedy baseline, each sequence's data
/// position, and the responses whose scorer failed.
struct Round {
    rollout: Rollout,
    rule: Vec<f32>,
    rm: Vec<f32>,
    greedy: Vec<f32>,
    positions: Vec<u64>,
    failures: u64,
}

impl Round {
    /// `rollout` (of the prompts from data position `first`, `samples` each) before any score:
    /// what the ranks that do not score it hold.
    fn unscored(rollout: Rollout, first: u64, samples: usize) -> Round {
        let positions = (0..rollout.sequences()).map(|i| first + (i / samples) as u64).collect();
        Round { rollout, rule: Vec::new(), rm: Vec::new(), greedy: Vec::new(), positions, failures: 0 }
    }

    /// The groups (`g` consecutive sequences each) `groups`, in that order (the failures count
    /// stays the round's).
    fn select(&self, groups: &[usize], g: usize) -> Round {
        let seqs: Vec<usize> = groups.iter().flat_map(|&k| k * g..(k + 1) * g).collect();
        let pick = |v: &[f32]| if v.is_empty() { Vec::new() } else { seqs.iter().map(|&i| v[i]).collect() };
        Round {
            rollout: self.rollout.select(&seqs),
            rule: pick(&self.rule),
            rm: pick(&self.rm),
            greedy: pick(&self.greedy),
            positions: seqs.iter().map(|&i| self.positions[i]).collect(),
            failures: self.failures,
        }
    }

    /// Appends `other`'s sequences and failures.
    fn append(&mut self, other: Round) {
        self.rollout.append(other.rollout);
        self.rule.extend(other.rule);
        self.rm.extend(other.rm);
        self.greedy.extend(other.greedy);
        self.positions.extend(other.positions);
        self.failures += other.failures;
    }

    /// Groups of `g` sequences.
    fn groups(&self, g: usize) -> usize {
        self.rollout.sequences() / g.max(1)
    }

    /// Response tokens generated.
    fn tokens(&self) -> u64 {
        self.rollout.lengths.iter().sum::<usize>() as u64
    }

    /// What the step reports of its sampling: rewards and lengths of these sequences.
    fn stats(&self) -> StepStats {
        let lengths: Vec<f64> = self.rollout.lengths.iter().map(|&l| l as f64).collect();
        StepStats {
            reward_mean: self.rule.iter().map(|&x| f64::from(x)).sum::<f64>() / self.rule.len().max(1) as f64,
            rm_score_mean: self.rm.iter().map(|&x| f64::from(x)).sum::<f64>() / self.rm.len().max(1) as f64,
            response_len_mean: lengths.iter().sum::<f64>() / lengths.len() as f64,
            response_len_p95: percentile(&lengths, 0.95),
            reward_failures: self.failures,
            ..StepStats::default()
        }
    }
}

/// What dynamic sampling took: rounds, groups dropped, tokens generated after the first round.
#[derive(Debug, Clone, Copy)]
struct Filled {
    rounds: usize,
    dropped: usize,
    tokens: u64,
}

/// A step's wall seconds and per-class seconds, phase by phase, added up lap by lap (dynamic
/// sampling passes through generation and inference once per round).
struct Laps {
    lap: Instant,
    stage: StepSeconds,
    ops: PerPhase<OpSeconds>,
}

impl Laps {
    /// Starts the first lap (and drops the op timers' earlier counts).
    fn start() -> Laps {
        timers::take();
        Laps { lap: Instant::now(), stage: StepSeconds::default(), ops: PerPhase::default() }
    }

    /// Ends a lap of `phase`.
    fn done(&mut self, phase: Phase) {
        *self.stage.get_mut(phase) += self.lap.elapsed().as_secs_f64();
        let ops = timers::take();
        for (sum, x) in self.ops.get_mut(phase).0.iter_mut().zip(ops.0) {
            *sum += x;
        }
        self.lap = Instant::now();
    }
}

/// An update refused because a value was not finite: which model-stage, which value.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct NonFinite {
    /// The training model-stage.
    pub model_stage: ModelStage,
    /// `loss` or `gradient norm`.
    pub quantity: &'static str,
    /// Its value (NaN or ±inf).
    pub value: f64,
}

impl NonFinite {
    fn of(model_stage: ModelStage, r: StepReport) -> NonFinite {
        let (quantity, value) = if r.loss.is_finite() { ("gradient norm", r.grad_norm) } else { ("loss", r.loss) };
        NonFinite { model_stage, quantity, value }
    }
}

/// This rank's part of a running RL job: the plan, every replica's id and the replicas this rank
/// computes for. The engine that computes them is the shards' memory's ([`EngineMemory`]: the
/// host's, or a device's).
pub struct RlJob {
    /// Settings.
    pub settings: StepSettings,
    /// The plan the EMUs follow.
    pub plan: Plan,
    /// Replica ids per model-stage, in replica order.
    pub replicas: BTreeMap<ModelStage, Vec<EmuId>>,
    mine: BTreeMap<ModelStage, Replica>,
    world: GroupId,
    /// The ranks that infer, score and train: the world, or in asynchronous mode the ranks
    /// outside `actor/generation` (on generation's own ranks: the world, never used there).
    rollout_group: GroupId,
    /// The plan's weight syncs as transitions, keyed by the model-stage synced into.
    weight_syncs: BTreeMap<ModelStage, TransitionDag>,
}

/// What a weight sync ran ([`RlJob::sync_weights`]).
#[derive(Debug, Default)]
struct SyncDone {
    /// Bytes sent over the data plane, all ranks together.
    bytes: u64,
    /// Sync primitives run.
    primitives: usize,
    /// The transitions' predicted seconds, summed.
    predicted_seconds: f64,
}

const GENERATION: ModelStage = ModelStage::new(Role::Actor, Stage::Generation);
const ACTOR: ModelStage = ModelStage::new(Role::Actor, Stage::Training);
const CRITIC: ModelStage = ModelStage::new(Role::Critic, Stage::Training);
const CRITIC_INFERENCE: ModelStage = ModelStage::new(Role::Critic, Stage::Inference);
const REFERENCE: ModelStage = ModelStage::new(Role::Reference, Stage::Inference);
const REWARD: ModelStage = ModelStage::new(Role::Reward, Stage::Inference);

impl RlJob {
    /// The job over the EMUs of `set` (created from `plan`, replicas in plan order), which
    /// syncs trained weights by running `weight_syncs` (`plan`'s, planned and agreed on every
    /// rank: [`nereus_core::transition::weight_syncs`]). Every rank calls it; groups are formed
    /// here, model-stage by model-stage.
    pub fn new<M: ShardMemory, P: DataPlane>(
        plane: &mut P,
        set: &EmuSet<M>,
        plan: Plan,
        settings: StepSettings,
        weight_syncs: BTreeMap<ModelStage, TransitionDag>,
    ) -> Result<RlJob, EngineError> {
        let mut replicas: BTreeMap<ModelStage, Vec<EmuId>> = BTreeMap::new();
        for emu in set.emus() {
            replicas.entry(emu.model_stage).or_default().push(emu.id);
        }
        let mut mine = BTreeMap::new();
        for p in &plan.placements {
            let ms = p.candidate.model_stage;
            for &id in replicas.get(&ms).map(Vec::as_slice).unwrap_or(&[]) {
                if set.emu(id).is_some_and(|e| e.ranks.contains(&plane.rank())) {
                    mine.insert(ms, Replica::new(plane, set, id, settings.seq_len())?);
                }
            }
        }
        let world = plane.group(&(0..set.world_size()).collect::<Vec<_>>())?;
        let generation = plan.placements.iter().find(|p| p.candidate.model_stage == GENERATION);
        let generation = generation.map_or(&[][..], |p| p.ranks.as_slice());
        let rollout_group = match settings.max_staleness {
            Some(_) if !generation.contains(&plane.rank()) => {
                let rest: Vec<i32> = (0..set.world_size()).filter(|r| !generation.contains(r)).collect();
                plane.group(&rest)?
            }
            _ => world,
        };
        Ok(RlJob { settings, plan, replicas, mine, world, rollout_group, weight_syncs })
    }

    /// Runs RL step `step` (0-based) on every rank; rank 0's metrics are the job's. The step's
    /// prompts start at the data position the counters hold.
    pub fn step<M: EngineMemory, P: Exchange<M>>(
        &self,
        plane: &mut P,
        set: &mut EmuSet<M>,
        step: u64,
    ) -> Result<StepMetrics, EngineError> {
        let s = &self.settings;
        let start = Instant::now();
        let counters: Vec<(EmuId, ModelStage, Counters)> =
            set.emus().map(|e| (e.id, e.model_stage, e.counters)).collect();
        let first = counters.first().map_or(0, |c| c.2.data_position);
        let mut laps = Laps::start();
        let mut batch = self.round(plane, set, step, first, 0, &mut laps)?;
        let mut stats = batch.stats();
        let mut generated = batch.tokens();
        let rounds = match s.dynamic_rounds {
            Some(max) => self.fill(plane, set, step, first, max, &mut batch, &mut laps)?,
            None => Filled { rounds: 1, dropped: 0, tokens: 0 },
        };
        generated += rounds.tokens;
        if s.dynamic_rounds.is_some() {
            (stats.sampling_rounds, stats.dropped_groups) = (rounds.rounds as u64, rounds.dropped as u64);
        }
        let samples = self.samples(&batch.rollout, &batch.positions, &batch.rule, plane.rank());
        self.shape_overlong(&mut batch.rollout);
        batch.rollout.estimate(s.estimator, s.advantage, s.reward_kl, &batch.greedy);
        let updates = self.train(plane, set, &batch.rollout)?;
        laps.done(Phase::Training);
        self.sync_weights(plane, set, &[GENERATION, CRITIC_INFERENCE])?;
        let consumed = rounds.rounds as u64 * s.prompts as u64;
        self.advance_counters(set, counters, step, first + consumed, &updates);
        laps.done(Phase::WeightSync);
        let mut metrics = self.metrics_of(stats, &batch, updates, laps, start);
        (metrics.samples, metrics.generated_tokens) = (samples, generated);
        Ok(metrics)
    }

    /// What a step reports: the sampling's `stats` completed with the trained `batch`'s KL and
    /// failures and the `updates`' losses, norms and refusals, with the step's seconds.
    fn metrics_of(
        &self,
        mut stats: StepStats,
        batch: &Round,
        [actor, critic]: [Updates; 2],
        laps: Laps,
        start: Instant,
    ) -> StepMetrics {
        stats.reward_failures = batch.failures;
        stats.kl = batch.rollout.kl_mean();
        stats.actor_loss = actor.last.loss;
        stats.critic_loss = critic.last.loss;
        stats.actor_grad_norm = actor.last.grad_norm;
        stats.critic_grad_norm = critic.last.grad_norm;
        stats.skipped_updates = actor.skipped + critic.skipped;
        StepMetrics {
            stats,
            non_finite: [(ACTOR, actor), (CRITIC, critic)]
                .into_iter()
                .find_map(|(ms, u)| u.first_skipped.map(|r| NonFinite::of(ms, r))),
            stage_seconds: laps.stage,
            op_seconds: laps.ops,
            step_seconds: start.elapsed().as_secs_f64(),
            ..StepMetrics::default()
        }
    }

    /// One sampling round of step `step`: `prompts_per_step` prompts from data position `first`
    /// generated (round `round`), inferred and scored.
    fn round<M: EngineMemory, P: Exchange<M>>(
        &self,
        plane: &mut P,
        set: &mut EmuSet<M>,
        step: u64,
        first: u64,
        round: usize,
        laps: &mut Laps,
    ) -> Result<Round, EngineError> {
        let s = &self.settings;
        let rollout = self.generate(plane, set, step, first, round)?;
        let greedy =
            if s.algorithm == Algorithm::Remax { self.greedy_scores(plane, set, step, first)? } else { Vec::new() };
        laps.done(Phase::Generation);
        let round = self.scored(plane, set, step, (rollout, first), greedy)?;
        laps.done(Phase::Inference);
        Ok(round)
    }

    /// The sampled `rollout` of the prompts from data position `first`, inferred and scored
    /// by the ranks of the rollout group (ReMax's `greedy` baseline beside it).
    fn scored<M: EngineMemory, P: Exchange<M>>(
        &self,
        plane: &mut P,
        set: &mut EmuSet<M>,
        step: u64,
        (mut rollout, first): (Rollout, u64),
        greedy: Vec<f32>,
    ) -> Result<Round, EngineError> {
        let s = &self.settings;
        let rm = self.infer(plane, set, &mut rollout)?;
        let positions: Vec<u64> = (0..rollout.sequences()).map(|i| first + (i / s.samples) as u64).collect();
        let group = self.rollout_group;
        let Scores { rewards: mut rule, failures, .. } =
            self.score(plane, group, &rollout, Split::Train, &positions, step)?;
        let model_weight = s.task.model_weight();
        if model_weight != 0.0 {
            rule.iter_mut().zip(&rm).for_each(|(r, m)| *r += model_weight * m);
        }
        rollout.scores = match s.reward {
            RewardSource::Rule => rule.clone(),
            RewardSource::Model => rm.clone(),
        };
        Ok(Round { rollout, rule, rm, greedy, positions, failures })
    }

    /// DAPO's dynamic sampling (Yu et al. 2025, arXiv:2503.14476): keeps the groups of `batch`
    /// whose scores are not all equal, samples the next `prompts_per_step` prompts round after
    /// round until `prompts_per_step` groups are kept (at most `max` rounds in all), and leaves
    /// the first of them in `batch`.
    #[allow(clippy::too_many_arguments)] // the step's context, as `round` takes it, and the batch it fills
    fn fill<M: EngineMemory, P: Exchange<M>>(
        &self,
        plane: &mut P,
        set: &mut EmuSet<M>,
        step: u64,
        first: u64,
        max: usize,
        batch: &mut Round,
        laps: &mut Laps,
    ) -> Result<Filled, EngineError> {
        let (g, p) = (self.settings.samples, self.settings.prompts);
        let keep = |r: &Round| r.select(&varied_groups(&r.rollout.scores, g), g);
        let mut kept = keep(batch);
        let mut filled = Filled { rounds: 1, dropped: p - kept.groups(g), tokens: 0 };
        while kept.groups(g) < p {
            if filled.rounds == max {
                return Err(EngineError::SamplingExhausted { step, kept: kept.groups(g), needed: p, rounds: max });
            }
            let next = self.round(plane, set, step, first + (filled.rounds * p) as u64, filled.rounds, laps)?;
            let varied = keep(&next);
            (filled.rounds, filled.dropped, filled.tokens) =
                (filled.rounds + 1, filled.dropped + p - varied.groups(g), filled.tokens + next.tokens());
            kept.append(varied);
        }
        *batch = kept.select(&(0..p).collect::<Vec<_>>(), g);
        Ok(filled)
    }

    /// DAPO's overlong reward shaping (`rl.overlong_buffer`) on the scores the policy trains on.
    fn shape_overlong(&self, rollout: &mut Rollout) {
        let (buffer, cap) = (self.settings.overlong_buffer, self.settings.sampling.max_new_tokens);
        if buffer == 0 {
            return;
        }
        for (score, &len) in rollout.scores.iter_mut().zip(&rollout.lengths) {
            *score += overlong_penalty(len, cap, buffer) as f32;
        }
    }

    /// Sequences per micro-batch of `ms`: its candidate's (the planner may pick fewer than the
    /// configured `rl.micro_batch` to fit memory).
    fn micro_batch(&self, ms: ModelStage) -> usize {
        self.plan
            .placements
            .iter()
            .find(|p| p.candidate.model_stage == ms)
            .map_or(self.settings.micro_batch, |p| p.candidate.micro_batch as usize)
    }

    /// The prompt at run position `position` (the counters' `data_position` is where the next
    /// step starts: `step × prompts` without dynamic sampling).
    fn prompt(&self, position: u64) -> Vec<u32> {
        self.settings.task.prompt(self.settings.sampling.seed, position)
    }

    /// The task's rewards for `rollout`, the same on every rank. A scorer command runs on rank
    /// 0 alone and one sum over the world carries its rewards (and whether it failed) to every
    /// rank; a failure is an [`EngineError::Reward`] on every rank, before any state changed.
    fn score<P: DataPlane>(
        &self,
        plane: &mut P,
        group: GroupId,
        rollout: &Rollout,
        split: Split,
        positions: &[u64],
        step: u64,
    ) -> Result<Scores, EngineError> {
        let task = &self.settings.task;
        let failed = |what: String| EngineError::Reward { step, what };
        if !task.scores_on_one_rank() {
            return task.score(rollout, split, positions).map_err(failed);
        }
        let n = rollout.sequences();
        // [rewards…, verdicts…, failures, ok, has verdicts]: rank 0's values, zeros elsewhere.
        let mut buf = vec![0f32; 2 * n + 3];
        let mut message = None;
        if plane.rank() == 0 {
            match task.score(rollout, split, positions) {
                Ok(scores) => {
                    buf[..n].copy_from_slice(&scores.rewards);
                    for (slot, &c) in buf[n..2 * n].iter_mut().zip(&scores.correct) {
                        *slot = f32::from(u8::from(c));
                    }
                    buf[2 * n] = scores.failures as f32;
                    buf[2 * n + 1] = 1.0;
                    buf[2 * n + 2] = f32::from(u8::from(!scores.correct.is_empty()));
                }
                Err(e) => message = Some(e),
            }
        }
        plane.all_reduce_sum_f32(group, &mut buf)?;
        if buf[2 * n + 1] == 0.0 {
            return Err(failed(
                message.unwrap_or_else(|| {
                    "the reward command failed on rank 0 (its message is in rank 0's output)".into()
                }),
            ));
        }
        let correct = match buf[2 * n + 2] == 1.0 {
            true => buf[n..2 * n].iter().map(|&c| c == 1.0).collect(),
            false => Vec::new(),
        };
        Ok(Scores { rewards: buf[..n].to_vec(), correct, failures: buf[2 * n] as u64 })
    }

    /// Rank 0's decoded samples of a text job's step: its first `data.samples_per_step`
    /// sequences.
    fn samples(&self, rollout: &Rollout, positions: &[u64], rewards: &[f32], rank: i32) -> Vec<TextSample> {
        let Task::Text(t) = &self.settings.task else { return Vec::new() };
        if rank != 0 {
            return Vec::new();
        }
        let count = self.settings.samples_logged.min(rollout.sequences());
        (0..count).map(|i| t.sample_record(rollout, i, positions[i], rewards[i])).collect()
    }

    /// Greedy answers to the first `count` held-out prompts (all when 0), scored by the job's
    /// reward, and with `data.pass_k = k` also `k` sampled answers per prompt (pass@k); `None`
    /// for a job without held-out prompts. Every rank calls it; the state is not touched.
    /// `step` is the number of RL steps done, for messages.
    pub fn evaluate<M: EngineMemory, P: DataPlane>(
        &self,
        plane: &mut P,
        set: &mut EmuSet<M>,
        count: usize,
        step: u64,
    ) -> Result<Option<EvalResult>, EngineError> {
        let s = &self.settings;
        let Task::Text(t) = &s.task else { return Ok(None) };
        let n = match (t.eval_len(), count) {
            (0, _) => return Ok(None),
            (all, 0) => all,
            (all, c) => c.min(all),
        };
        let greedy = Sampling { greedy: true, ..s.sampling };
        let prompts = Prompts { tokens: |i| t.eval_prompt(i).0, start: |i| t.eval_prompt(i).1, id: |i| i as u64 };
        let rollout = self.sample(plane, set, n, &greedy, prompts)?;
        let indices: Vec<u64> = (0..n as u64).collect();
        let scores = self.score(plane, self.world, &rollout, Split::Eval, &indices, step)?;
        let mean = |xs: &mut dyn Iterator<Item = f64>| xs.sum::<f64>() / n as f64;
        let pass_at_k = match s.pass_k {
            0 => None,
            k => Some(self.pass_at_k(plane, set, n, k, step)?),
        };
        Ok(Some(EvalResult {
            prompts: n,
            mean_reward: mean(&mut scores.rewards.iter().map(|&x| f64::from(x))),
            accuracy: (!scores.correct.is_empty())
                .then(|| mean(&mut scores.correct.iter().map(|&c| f64::from(u8::from(c))))),
            pass_k: pass_at_k.map(|_| s.pass_k as u32),
            pass_at_k,
            response_len_mean: mean(&mut rollout.lengths.iter().map(|&l| l as f64)),
        }))
    }

    /// pass@k on the first `n` held-out prompts: the share with at least one correct answer
    /// among `k` sampled at the job's temperature and top-p (with n = k samples, the estimator
    /// of Chen et al. 2021, "Evaluating Large Language Models Trained on Code", is exactly this
    /// share). The config ensures the reward has a rule to give the verdicts.
    fn pass_at_k<M: EngineMemory, P: DataPlane>(
        &self,
        plane: &mut P,
        set: &mut EmuSet<M>,
        n: usize,
        k: usize,
        step: u64,
    ) -> Result<f64, EngineError> {
        let Task::Text(t) = &self.settings.task else { unreachable!("evaluate checked the task") };
        let prompts = Prompts {
            tokens: |i| t.eval_prompt(i / k).0,
            start: |i| t.eval_prompt(i / k).1,
            id: |i| PASS_AT_K_IDS + i as u64,
        };
        let rollout = self.sample(plane, set, n * k, &self.settings.sampling, prompts)?;
        let indices: Vec<u64> = (0..(n * k) as u64).map(|i| i / k as u64).collect();
        let correct = self.score(plane, self.world, &rollout, Split::Eval, &indices, step)?.correct;
        if correct.len() != n * k {
            return Err(EngineError::Reward { step, what: "pass@k needs a rule's verdicts (math or exact)".into() });
        }
        let solved = correct.chunks_exact(k).filter(|answers| answers.iter().any(|&c| c)).count();
        Ok(solved as f64 / n as f64)
    }

    /// Samples `count` sequences on the generation replicas and assembles their tokens and
    /// lengths on every rank, as a rollout.
    fn sample<M: EngineMemory, P: DataPlane, A, B, C>(
        &self,
        plane: &mut P,
        set: &mut EmuSet<M>,
        count: usize,
        sampling: &Sampling,
        prompts: Prompts<A, B, C>,
    ) -> Result<Rollout, EngineError>
    where
        A: Fn(usize) -> Vec<u32>,
        B: Fn(usize) -> usize,
        C: Fn(usize) -> u64,
    {
        let t = self.settings.seq_len();
        // Each row is a sequence's tokens followed by its length (f32 is exact below 2^24); the
        // replica leaders contribute their rows, one sum over the world assembles them.
        let mut mine = None;
        if let Some((share, out, replica)) = self.sample_share(plane, set, count, sampling, &prompts)? {
            if replica.groups.is_leader() {
                mine = Some((share.start, token_rows(&out, t)));
            }
        }
        let all = assemble_rows(
            plane,
            self.world,
            count,
            t + 1,
            mine.as_ref().map(|(first, rows)| (*first, rows.as_slice())),
        )?;
        let (mut tokens, mut lengths) = (Vec::with_capacity(count * t), Vec::with_capacity(count));
        for row in all.chunks_exact(t + 1) {
            tokens.extend(row[..t].iter().map(|&x| x as u32));
            lengths.push(row[t] as usize);
        }
        let starts = (0..count).map(&prompts.start).collect();
        Ok(self.settings.rollout_of(Generated { tokens, lengths }, starts))
    }

    /// This rank's generation replica's share of `count` sequences sampled, with the replica
    /// (every rank of it holds the same tokens); `None` on ranks outside `actor/generation`.
    fn sample_share<M: EngineMemory, P: DataPlane, A, B, C>(
        &self,
        plane: &mut P,
        set: &mut EmuSet<M>,
        count: usize,
        sampling: &Sampling,
        prompts: &Prompts<A, B, C>,
    ) -> Result<Option<Share<'_>>, EngineError>
    where
        A: Fn(usize) -> Vec<u32>,
        B: Fn(usize) -> usize,
        C: Fn(usize) -> u64,
    {
        let Some(replica) = self.mine.get(&GENERATION) else { return Ok(None) };
        let share = share(count, replica.groups.replica);
        // Waves of `micro_batch` sequences, each with its own KV cache (the planner sizes them
        // to fit); draws depend on the sequence id only, so waves change no token.
        let wave = self.micro_batch(GENERATION).max(1);
        let waves: Vec<Wave> = share
            .clone()
            .step_by(wave)
            .map(|first| {
                let seqs = first..(first + wave).min(share.end);
                Wave {
                    prompts: seqs.clone().flat_map(&prompts.tokens).collect(),
                    starts: seqs.clone().map(&prompts.start).collect(),
                    ids: seqs.map(&prompts.id).collect(),
                }
            })
            .collect();
        let out = M::generate(plane, set, replica, &waves, sampling)?;
        Ok(Some((share, out, replica)))
    }

    /// The prompts of step `step`'s sampling round `round`, from data position `first`: draw
    /// ids `step × sequences + i` in the first round; later rounds (dynamic sampling) draw
    /// above them, by position.
    fn step_prompts(
        &self,
        step: u64,
        first: u64,
        round: usize,
    ) -> Prompts<impl Fn(usize) -> Vec<u32> + '_, impl Fn(usize) -> usize + '_, impl Fn(usize) -> u64 + '_> {
        let s = &self.settings;
        let n = s.sequences() as u64;
        let position = move |i: usize| first + (i / s.samples) as u64;
        Prompts {
            tokens: move |i| self.prompt(position(i)),
            start: move |i| s.task.prompt_start(position(i)),
            id: move |i| match round {
                0 => step * n + i as u64,
                _ => RESAMPLED_IDS + position(i) * s.samples as u64 + (i % s.samples) as u64,
            },
        }
    }

    /// Samples `samples_per_prompt` responses to each of the `prompts_per_step` prompts from
    /// data position `first`. Draw ids: `step × sequences + i` in a step's first round; later
    /// rounds (dynamic sampling) draw above them, by position.
    fn generate<M: EngineMemory, P: DataPlane>(
        &self,
        plane: &mut P,
        set: &mut EmuSet<M>,
        step: u64,
        first: u64,
        round: usize,
    ) -> Result<Rollout, EngineError> {
        let s = &self.settings;
        self.sample(plane, set, s.sequences(), &s.sampling, self.step_prompts(step, first, round))
    }

    /// ReMax: the rule score of each prompt's greedy response, one per sequence (the step's
    /// prompts start at data position `first`).
    fn greedy_scores<M: EngineMemory, P: DataPlane>(
        &self,
        plane: &mut P,
        set: &mut EmuSet<M>,
        step: u64,
        first: u64,
    ) -> Result<Vec<f32>, EngineError> {
        let s = &self.settings;
        let greedy = Sampling { greedy: true, ..s.sampling };
        let prompts = Prompts {
            tokens: |k| self.prompt(first + k as u64),
            start: |k| s.task.prompt_start(first + k as u64),
            id: |k| k as u64,
        };
        let r = self.sample(plane, set, s.prompts, &greedy, prompts)?;
        let positions: Vec<u64> = (0..s.prompts).map(|k| first + k as u64).collect();
        let per_prompt = self.score(plane, self.rollout_group, &r, Split::Train, &positions, step)?.rewards;
        Ok((0..s.sequences()).map(|i| per_prompt[i / s.samples]).collect())
    }

    /// Reference, reward and critic inference plus the actor's own log-probabilities, each on
    /// its ranks; one sum over the world assembles `[rm S | ref S·T | old S·T | values S·T]`.
    /// Returns the reward model's scores.
    fn infer<M: EngineMemory, P: DataPlane>(
        &self,
        plane: &mut P,
        set: &mut EmuSet<M>,
        rollout: &mut Rollout,
    ) -> Result<Vec<f32>, EngineError> {
        let (n, t) = (rollout.sequences(), rollout.seq_len);
        let (batch_tokens, batch_starts) = (rollout.tokens.clone(), rollout.starts.clone());
        let batch = Batch { tokens: &batch_tokens, seq_len: t, starts: &batch_starts };
        let mut buf = vec![0f32; n + 3 * n * t];
        for (ms, offset) in [(REWARD, 0), (REFERENCE, n), (ACTOR, n + n * t), (CRITIC_INFERENCE, n + 2 * n * t)] {
            let Some(replica) = self.mine.get(&ms) else { continue };
            let out = M::infer(plane, set, replica, &batch, self.micro_batch(ms))?;
            if !replica.groups.speaks_for_outputs() {
                continue;
            }
            let share = batch.share(replica.groups.replica);
            if ms == REWARD {
                for (k, s) in share.enumerate() {
                    buf[s] = out[k * t + rollout.prompt_len + rollout.lengths[s] - 1];
                }
            } else {
                buf[offset + share.start * t..offset + share.start * t + out.len()].copy_from_slice(&out);
            }
        }
        plane.all_reduce_sum_f32(self.rollout_group, &mut buf)?;
        rollout.ref_logp = buf[n..n + n * t].to_vec();
        rollout.old_logp = buf[n + n * t..n + 2 * n * t].to_vec();
        rollout.values = buf[n + 2 * n * t..].to_vec();
        Ok(buf[..n].to_vec())
    }

    /// Actor and critic updates over mini-batches; what they did reaches every rank.
    fn train<M: EngineMemory, P: DataPlane>(
        &self,
        plane: &mut P,
        set: &mut EmuSet<M>,
        rollout: &Rollout,
    ) -> Result<[Updates; 2], EngineError> {
        let s = &self.settings;
        let (mut actor, mut critic) = (Updates::default(), Updates::default());
        for _ in 0..s.epochs {
            for chunk in (0..rollout.sequences()).collect::<Vec<_>>().chunks(s.mini_batch) {
                let tokens = rollout.tokens_of(chunk);
                let starts = rollout.starts_of(chunk);
                let batch = Batch { tokens: &tokens, seq_len: rollout.seq_len, starts: &starts };
                if let Some(replica) = self.mine.get(&ACTOR) {
                    let loss = ActorLoss { rollout, members: chunk, terms: s.policy };
                    let opt = &s.actor_opt;
                    actor.add(train_step(
                        plane,
                        set,
                        replica,
                        &batch,
                        self.micro_batch(ACTOR),
                        &loss as &dyn Objective,
                        opt,
                    )?);
                }
                if let Some(replica) = self.mine.get(&CRITIC) {
                    let loss = ValueLoss { rollout, members: chunk, clip: s.value_clip };
                    let opt = &s.critic_opt;
                    critic.add(train_step(
                        plane,
                        set,
                        replica,
                        &batch,
                        self.micro_batch(CRITIC),
                        &loss as &dyn Objective,
                        opt,
                    )?);
                }
            }
        }
        let speaks =
            |ms: ModelStage| self.mine.get(&ms).is_some_and(|r| r.groups.replica.0 == 0 && r.groups.is_leader());
        let mut rows = [0f32; 2 * Updates::WIDTH];
        for (k, (ms, u)) in [(ACTOR, &actor), (CRITIC, &critic)].into_iter().enumerate() {
            if speaks(ms) {
                rows[k * Updates::WIDTH..(k + 1) * Updates::WIDTH].copy_from_slice(&u.to_row());
            }
        }
        let rows = assemble_rows(plane, self.world, 1, 2 * Updates::WIDTH, Some((0, &rows)))?;
        Ok([Updates::from_row(&rows[..Updates::WIDTH]), Updates::from_row(&rows[Updates::WIDTH..])])
    }

    /// Reshards trained weights into the layouts that use them (`into`, one after another): the
    /// plan's weight-sync transitions ([`TransitionDag::weight_sync`]: generation replica `g`
    /// from training replica `g mod dp`, spreading the senders; the same for the critic's
    /// inference), run by the transition executor. Returns what ran: the bytes sent (all ranks
    /// together), the primitives and their predicted seconds.
    fn sync_weights<M: EngineMemory, P: Exchange<M>>(
        &self,
        plane: &mut P,
        set: &mut EmuSet<M>,
        into: &[ModelStage],
    ) -> Result<SyncDone, EngineError> {
        let mut done = SyncDone::default();
        for dag in into.iter().filter_map(|ms| self.weight_syncs.get(ms)) {
            let (_, report) = timed(OpClass::Reshard, || dag::execute(set, plane, dag))?;
            done.bytes += report.bytes_sent;
            done.primitives += report.primitives;
            done.predicted_seconds += dag.schedule.seconds;
        }
        Ok(done)
    }

    /// Brings every rank's metadata to the counters the step produced, from the snapshot taken
    /// before it: the optimizer updates applied on the training replicas (which their own ranks
    /// already counted, update by update), and the policy version and data position (`next`,
    /// where the next step's prompts start) on every replica.
    fn advance_counters<M: ShardMemory>(
        &self,
        set: &mut EmuSet<M>,
        before: Vec<(EmuId, ModelStage, Counters)>,
        step: u64,
        next: u64,
        updates: &[Updates; 2],
    ) {
        for (id, ms, mut c) in before {
            let applied = match ms {
                ACTOR => updates[0].applied,
                CRITIC => updates[1].applied,
                _ => 0,
            };
            c.updates += applied;
            c.model_version += applied;
            c.policy_version = step + 1;
            c.data_position = next;
            set.set_counters(id, c);
        }
    }
}

/// Each sequence of `out` as a row of its `t` tokens followed by its length (f32 is exact
/// below 2^24).
fn token_rows(out: &Generated, t: usize) -> Vec<f32> {
    out.tokens
        .chunks_exact(t)
        .zip(&out.lengths)
        .flat_map(|(row, &len)| row.iter().map(|&x| x as f32).chain([len as f32]))
        .collect()
}

/// The `q`-quantile of `xs` (nearest rank).
fn percentile(xs: &[f64], q: f64) -> f64 {
    let mut v = xs.to_vec();
    v.sort_by(f64::total_cmp);
    v.get(((q * v.len() as f64).ceil() as usize).saturating_sub(1)).copied().unwrap_or(0.0)
}
