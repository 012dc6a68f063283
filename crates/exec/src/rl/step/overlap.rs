//! The asynchronous RL step (`rl.mode = "async"`, docs/engine.md, "Asynchronous training"):
//! the actor's generation runs on ranks of its own (the planner's split, `planner::overlap`).
//!
//! Step `n` trains on rollouts sampled ahead during step `n − 1` by the generation weights
//! (policy version `v_b`, at most `rl.max_staleness` versions behind the trained `v`), while
//! the generation ranks sample step `n + 1`'s rollouts with the same weights:
//!
//! ```text
//! generation ranks:  sample n+1 (+ behaviour log-probs) ─┐
//! other ranks:       infer n → score → train n ──────────┴─ assemble n+1 ─ weight sync (when due)
//! ```
//!
//! The loss weighs each token by its truncated behaviour weight (decoupled PPO,
//! `losses::behaviour_weight`). The weight sync copies the trained parameters into the
//! generation layout only when the next rollouts would otherwise lag more than
//! `max_staleness` versions (every step with 1, every other step with 2); it is recorded with
//! the parameter digests of both sides. Rollouts sampled ahead that are older than that, or for
//! other prompts (after a resume, a transition that lost them), are dropped and the step
//! samples its own first.

use std::collections::BTreeMap;
use std::time::Instant;

use super::{token_rows, Laps, RlJob, Round, StepMetrics, Updates, ACTOR, CRITIC_INFERENCE, GENERATION};
use crate::emu::{EmuSet, Exchange};
use crate::engine::{Batch, EngineError, EngineMemory, Generated};
use crate::rl::Rollout;
use nereus_core::plan::{ModelStage, Phase};
use nereus_core::record::{AsyncRecord, TransitionRecord};

/// Rollouts sampled ahead of the step that trains on them, the same on every rank: tokens,
/// lengths and behaviour log-probabilities, nothing inferred yet.
#[derive(Debug, Clone)]
pub struct Ahead {
    /// The sampled sequences, `behav_logp` filled.
    pub rollout: Rollout,
    /// The data position of their first prompt.
    pub first: u64,
    /// The policy version of the weights that sampled them.
    pub version: u64,
    /// The slowest generation rank's seconds sampling them (with their behaviour log-probs).
    pub seconds: f64,
}

impl RlJob {
    /// Runs asynchronous RL step `step` on every rank (see the module doc): trains on `ahead`
    /// (or, when it is missing or too stale, on rollouts sampled first), leaves the next
    /// step's rollouts in `ahead`, and syncs the weights when due.
    pub fn step_async<M: EngineMemory, P: Exchange<M>>(
        &self,
        plane: &mut P,
        set: &mut EmuSet<M>,
        step: u64,
        ahead: &mut Option<Ahead>,
    ) -> Result<StepMetrics, EngineError> {
        let s = &self.settings;
        let k = s.max_staleness.unwrap_or(1);
        let start = Instant::now();
        let counters: Vec<_> = set.emus().map(|e| (e.id, e.model_stage, e.counters)).collect();
        let first = counters.first().map_or(0, |c| c.2.data_position);
        let (trained, behaviour) = (version(set, ACTOR), version(set, GENERATION));
        let mut laps = Laps::start();
        let (current, dropped) = match ahead.take() {
            Some(a) if a.first == first && trained.saturating_sub(a.version) <= k => (a, 0),
            other => {
                let rows = self.sample_ahead(plane, set, step, first)?;
                (self.assemble_ahead(plane, rows, first, behaviour)?, u64::from(other.is_some()))
            }
        };
        laps.done(Phase::Generation);
        let next = first + s.prompts as u64;
        let rows = self.sample_ahead(plane, set, step + 1, next)?;
        let (batch, updates) = self.train_ahead(plane, set, step, &current, &mut laps)?;
        let sampled = self.assemble_ahead(plane, rows, next, behaviour)?;
        laps.done(Phase::Generation);
        // The rollouts sampled during step n + 1 by the weights in place then train at version
        // `trained + 2`: sync now if they would lag more than k.
        let weight_sync = match trained + 2 > behaviour + k {
            true => Some(self.weight_sync(plane, set)?),
            false => None,
        };
        self.sync_weights(plane, set, &[CRITIC_INFERENCE])?;
        self.advance_counters(set, counters, step, next, &updates);
        let generation_version = if weight_sync.is_some() { step + 1 } else { behaviour };
        set_version(set, GENERATION, generation_version);
        laps.done(Phase::WeightSync);
        let record = AsyncRecord {
            generation_wait_seconds: laps.stage.generation,
            policy_version: trained,
            sample_versions: vec![current.version; current.rollout.sequences()],
            staleness: trained.saturating_sub(current.version),
            dropped_rollouts: dropped,
            ahead_position: next,
            ahead_version: behaviour,
            weight_sync,
        };
        let stats = batch.stats();
        let samples = self.samples(&batch.rollout, &batch.positions, &batch.rule, plane.rank());
        let mut metrics = self.metrics_of(stats, &batch, updates, laps, start);
        // Generation's own seconds (what the planner predicts for the phase and calibration
        // compares), not the wait the other ranks saw, which the async record keeps.
        metrics.stage_seconds.generation = sampled.seconds;
        *ahead = Some(sampled);
        metrics.generated_tokens = current.rollout.lengths.iter().sum::<usize>() as u64;
        (metrics.samples, metrics.asynchronous) = (samples, Some(record));
        Ok(metrics)
    }

    /// This rank's part of the rollouts of step `step` from data position `first`, sampled by
    /// the generation replicas with their behaviour log-probabilities (each replica's own
    /// forward pass over its share): `[tokens and length S×(T+1) | behav S×T | seconds W]`,
    /// zeros where other ranks contribute (all zeros outside `actor/generation`), the seconds
    /// this rank spent sampling at its own index of the last `W` (world size) entries.
    fn sample_ahead<M: EngineMemory, P: Exchange<M>>(
        &self,
        plane: &mut P,
        set: &mut EmuSet<M>,
        step: u64,
        first: u64,
    ) -> Result<Vec<f32>, EngineError> {
        let s = &self.settings;
        let (n, t) = (s.sequences(), s.seq_len());
        let start = Instant::now();
        let mut buf = vec![0f32; n * (t + 1) + n * t + set.world_size() as usize];
        let prompts = self.step_prompts(step, first, 0);
        let Some((share, out, replica)) = self.sample_share(plane, set, n, &s.sampling, &prompts)? else {
            return Ok(buf);
        };
        if replica.groups.is_leader() {
            buf[share.start * (t + 1)..share.end * (t + 1)].copy_from_slice(&token_rows(&out, t));
        }
        let mut tokens = vec![0u32; n * t];
        tokens[share.start * t..share.end * t].copy_from_slice(&out.tokens);
        let starts: Vec<usize> = (0..n).map(&prompts.start).collect();
        let batch = Batch { tokens: &tokens, seq_len: t, starts: &starts };
        let logp = M::infer(plane, set, replica, &batch, s.micro_batch)?;
        if replica.groups.speaks_for_outputs() {
            let at = n * (t + 1) + share.start * t;
            buf[at..at + logp.len()].copy_from_slice(&logp);
        }
        buf[n * (t + 1) + n * t + plane.rank() as usize] = start.elapsed().as_secs_f32();
        Ok(buf)
    }

    /// One sum over the world of every rank's [`RlJob::sample_ahead`] part: the rollouts
    /// sampled by policy version `version` from data position `first`, on every rank.
    fn assemble_ahead<P: crate::comm::DataPlane>(
        &self,
        plane: &mut P,
        mut buf: Vec<f32>,
        first: u64,
        version: u64,
    ) -> Result<Ahead, EngineError> {
        let s = &self.settings;
        let (n, t) = (s.sequences(), s.seq_len());
        plane.all_reduce_sum_f32(self.world, &mut buf)?;
        let (rows, rest) = buf.split_at(n * (t + 1));
        let (behav, seconds) = rest.split_at(n * t);
        let mut generated = Generated { tokens: Vec::with_capacity(n * t), lengths: Vec::with_capacity(n) };
        for row in rows.chunks_exact(t + 1) {
            generated.tokens.extend(row[..t].iter().map(|&x| x as u32));
            generated.lengths.push(row[t] as usize);
        }
        let starts = (0..n).map(|i| s.task.prompt_start(first + (i / s.samples) as u64)).collect();
        let mut rollout = s.rollout_of(generated, starts);
        rollout.behav_logp = behav.to_vec();
        let seconds = seconds.iter().copied().fold(0f32, f32::max).into();
        Ok(Ahead { rollout, first, version, seconds })
    }

    /// Inference, scores and advantages of `a` on the ranks outside generation, then the
    /// updates (every rank learns what they did; generation ranks join only that).
    fn train_ahead<M: EngineMemory, P: Exchange<M>>(
        &self,
        plane: &mut P,
        set: &mut EmuSet<M>,
        step: u64,
        a: &Ahead,
        laps: &mut Laps,
    ) -> Result<(Round, [Updates; 2]), EngineError> {
        let s = &self.settings;
        let scored = match self.mine.contains_key(&GENERATION) {
            true => Ok(Round::unscored(a.rollout.clone(), a.first, s.samples)),
            false => self.scored(plane, set, step, (a.rollout.clone(), a.first), Vec::new()),
        };
        let mut round = self.agree_scored(plane, step, scored)?;
        if !self.mine.contains_key(&GENERATION) {
            self.shape_overlong(&mut round.rollout);
            round.rollout.estimate(s.estimator, s.advantage, s.reward_kl, &round.greedy);
        }
        laps.done(Phase::Inference);
        let updates = self.train(plane, set, &round.rollout)?;
        laps.done(Phase::Training);
        Ok((round, updates))
    }

    /// `scored` agreed on by every rank with one sum over the world: a failed reward, which
    /// only the scoring ranks (those outside generation) see, becomes an
    /// [`EngineError::Reward`] on the generation ranks too, so every rank stops before the
    /// update (nothing of the step changed) instead of the generation ranks waiting in it for
    /// the collective watchdog. Other errors return at once, as before.
    fn agree_scored<P: crate::comm::DataPlane>(
        &self,
        plane: &mut P,
        step: u64,
        scored: Result<Round, EngineError>,
    ) -> Result<Round, EngineError> {
        let mut failed = match &scored {
            Ok(_) => [0f32],
            Err(EngineError::Reward { .. }) => [1f32],
            Err(_) => return scored,
        };
        plane.all_reduce_sum_f32(self.world, &mut failed)?;
        match scored {
            Ok(_) if failed[0] > 0.0 => {
                let what = "the reward failed on the scoring ranks (rank 0's output names the line)".to_string();
                Err(EngineError::Reward { step, what })
            }
            scored => scored,
        }
    }

    /// The trained actor parameters copied into every generation replica, timed (slowest
    /// rank) and checked: the parameter digest of `actor/training` and of `actor/generation`
    /// after, keyed `actor` (equal when every byte arrived).
    fn weight_sync<M: EngineMemory, P: Exchange<M>>(
        &self,
        plane: &mut P,
        set: &mut EmuSet<M>,
    ) -> Result<TransitionRecord, EngineError> {
        let start = Instant::now();
        let done = self.sync_weights(plane, set, &[GENERATION])?;
        let mine = start.elapsed().as_secs_f64();
        let mut all = vec![0u8; 8 * set.world_size() as usize];
        plane.all_gather(self.world, &mine.to_le_bytes(), &mut all)?;
        let seconds =
            all.chunks_exact(8).map(|b| f64::from_le_bytes(b.try_into().expect("8 bytes"))).fold(0.0, f64::max);
        let digests = set.param_digests(plane)?;
        let (from, to) = (self.describe(set, ACTOR), self.describe(set, GENERATION));
        let digest = |ms: ModelStage| {
            let id = self.replicas[&ms][0];
            BTreeMap::from([("actor".to_string(), digests[&id].to_string())])
        };
        Ok(TransitionRecord {
            kind: None,
            seconds,
            predicted_seconds: done.predicted_seconds,
            bytes: done.bytes,
            staged_bytes: 0,
            primitives: done.primitives,
            from,
            to,
            digests_before: digest(ACTOR),
            digests_after: digest(GENERATION),
        })
    }

    /// `ms` as a record names it: its layout and the ranks of its replicas.
    fn describe<M: crate::emu::ShardMemory>(&self, set: &EmuSet<M>, ms: ModelStage) -> String {
        let emus: Vec<_> = self.replicas[&ms].iter().filter_map(|&id| set.emu(id)).collect();
        let ranks: Vec<&[i32]> = emus.iter().map(|e| e.ranks.as_slice()).collect();
        let layout = emus.first().map(|e| e.layout.to_string()).unwrap_or_default();
        format!("{ms} {layout} on {ranks:?}")
    }
}

/// The policy version `ms`'s replicas hold (0 when it has none).
fn version<M: crate::emu::ShardMemory>(set: &EmuSet<M>, ms: ModelStage) -> u64 {
    set.emus().find(|e| e.model_stage == ms).map_or(0, |e| e.counters.policy_version)
}

/// Sets the policy version of every replica of `ms` (the generation weights' own, which a
/// step that does not sync them leaves behind the trained version).
fn set_version<M: crate::emu::ShardMemory>(set: &mut EmuSet<M>, ms: ModelStage, v: u64) {
    let ids: Vec<_> = set.emus().filter(|e| e.model_stage == ms).map(|e| (e.id, e.counters)).collect();
    for (id, mut c) in ids {
        c.policy_version = v;
        set.set_counters(id, c);
    }
}
