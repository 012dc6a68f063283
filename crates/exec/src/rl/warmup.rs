//! Supervised warm-ups that precede RL, run by the engine itself: the actor learns the task's
//! format from short correct answers (so it starts RL answering briefly), and the reward model
//! learns to score responses by the rule (so the reward model-stage is a real transformer with
//! a scalar head whose weights come from training). Both run data-parallel over every rank.

use super::{Rollout, ScoreRegression, SequenceCrossEntropy, Task};
use crate::comm::DataPlane;
use crate::emu::{Counters, EmuId, EmuSet};
use crate::engine::{init_shard, train_step, AdamW, Batch, EngineError, Objective, Replica};
use nereus_core::model::Layout;
use nereus_core::plan::ModelStage;

/// What a warm-up trains.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Warmup {
    /// Next-token cross-entropy on 1–3 correct terms and EOS.
    Actor,
    /// Squared error of the last position's value against the rule's reward.
    RewardModel,
}

/// A warm-up batch of `count` sequences for step `step`; the error says why the task has none.
fn batch(
    kind: Warmup,
    task: &Task,
    seed: u64,
    step: u64,
    count: usize,
    response_len: usize,
) -> Result<Rollout, String> {
    let (p, eos) = (task.prompt_len(), task.stop().0);
    let t = p + response_len;
    let mut r = Rollout { prompt_len: p, seq_len: t, ..Rollout::default() };
    for i in 0..count as u64 {
        let index = step * count as u64 + i;
        let (prompt, start, response, score) = match (kind, task) {
            (Warmup::Actor, _) => {
                let (prompt, start, response) = task.warmup_example(seed, index)?;
                (prompt, start, response, 0.0) // next-token cross-entropy reads no score
            }
            (Warmup::RewardModel, Task::Arithmetic(a)) => {
                let prompt = a.prompt(seed ^ 0xA11CE, index);
                let response = a.graded_response(&prompt, seed, index, response_len);
                let score = a.reward(&prompt, &response);
                (prompt, 0, response, score)
            }
            (Warmup::RewardModel, Task::Text(_)) => {
                return Err("a text job has no graded responses to warm a reward model up on: set train.warmup_reward_steps = 0 and score with [reward] (train.reward = \"rule\"), or start the reward model from a directory (models.reward.path)".into())
            }
        };
        r.scores.push(score);
        r.starts.push(start);
        r.lengths.push(response.len().min(response_len));
        r.tokens.extend(prompt.iter().chain(&response).copied().chain(std::iter::repeat(eos)).take(t));
    }
    Ok(r)
}

/// Creates `model_stage` data-parallel over every rank (`tp = pp = 1`), trains it `steps` steps
/// on `count` sequences per step, and returns its first replica and the last loss. Every rank
/// calls it.
#[allow(clippy::too_many_arguments)]
pub fn warm_up<P: DataPlane>(
    plane: &mut P,
    set: &mut EmuSet,
    model_stage: ModelStage,
    kind: Warmup,
    task: &Task,
    seed: u64,
    steps: u32,
    count: usize,
    response_len: usize,
    lr: f64,
) -> Result<(EmuId, f64), EngineError> {
    let world = set.world_size();
    let counters = Counters { seed, ..Counters::default() };
    let mut ids = Vec::new();
    for r in 0..world {
        ids.push(set.create(plane, model_stage, Layout::new(1, 1), &[r], counters, |shard, catalogue| {
            init_shard(shard, catalogue, seed).map_err(|e| e.to_string())
        })?);
    }
    let replica = Replica::new(plane, set, ids[plane.rank() as usize], task.prompt_len() + response_len)?;
    let opt = AdamW { lr: lr as f32, ..AdamW::default() };
    let mut loss = 0.0;
    let members: Vec<usize> = (0..count).collect();
    for step in 0..u64::from(steps) {
        let rollout = batch(kind, task, seed, step, count, response_len)
            .map_err(|what| EngineError::Shape { what: format!("the supervised warm-up of {model_stage}: {what}") })?;
        let tokens = rollout.tokens_of(&members);
        let objective: Box<dyn Objective> = match kind {
            Warmup::Actor => Box::new(SequenceCrossEntropy { rollout: &rollout, members: &members, first_row: 1 }),
            Warmup::RewardModel => Box::new(ScoreRegression { rollout: &rollout, members: &members }),
        };
        let starts = rollout.starts_of(&members);
        let b = Batch { tokens: &tokens, seq_len: rollout.seq_len, starts: &starts };
        let report = train_step(plane, set, &replica, &b, count, objective.as_ref(), &opt)?;
        if report.skipped {
            return Err(EngineError::Diverged {
                what: format!(
                    "the supervised warm-up of {model_stage} at step {step}: loss {}, gradient norm {}",
                    report.loss, report.grad_norm
                ),
            });
        }
        loss = report.loss;
    }
    Ok((ids[0], loss))
}
