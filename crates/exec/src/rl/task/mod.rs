//! What a job trains on: the built-in arithmetic task over token ids, or a text task — a
//! user's prompt file through the model's tokenizer and chat template, its responses decoded
//! and scored by a rule or an external scorer.
//!
//! Prompts are addressed by their run position (step × prompts per step + k), so every rank and
//! every layout reads the same prompt, and a resumed job continues at the next one.

mod arithmetic;
mod text;

use std::sync::Arc;

pub use arithmetic::{ArithmeticTask, EOS};
pub use text::{TextReward, TextSample, TextTask, TextTerm};

use super::Rollout;
use crate::engine::StopIds;

/// The task of a job.
#[derive(Debug, Clone)]
pub enum Task {
    /// Arithmetic continuation over token ids (the built-in task).
    Arithmetic(ArithmeticTask),
    /// Prompts from a file, rewards over decoded text.
    Text(Arc<TextTask>),
}

/// Which prompts a batch answers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Split {
    /// Training prompts, by run position.
    Train,
    /// Held-out prompts, by index in the file's order.
    Eval,
}

/// The rewards of a batch of responses.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Scores {
    /// One reward per sequence.
    pub rewards: Vec<f32>,
    /// Whether each answer matched the reference (empty when the reward does not say: a
    /// scorer command).
    pub correct: Vec<bool>,
    /// Responses scored 0 because the scorer failed on them (`on_error = "zero"`).
    pub failures: u64,
}

impl Task {
    /// Prompt tokens per sequence (text prompts are left-padded to it).
    pub fn prompt_len(&self) -> usize {
        match self {
            Task::Arithmetic(t) => t.prompt_len,
            Task::Text(t) => t.prompt_len,
        }
    }

    /// The token a response ends with (and is padded with), and the further ids it stops at.
    pub fn stop(&self) -> (u32, StopIds) {
        match self {
            Task::Arithmetic(_) => (EOS, StopIds::NONE),
            Task::Text(t) => t.stop(),
        }
    }

    /// The prompt at run position `position`, exactly [`Task::prompt_len`] tokens.
    pub fn prompt(&self, seed: u64, position: u64) -> Vec<u32> {
        match self {
            Task::Arithmetic(t) => t.prompt(seed, position),
            Task::Text(t) => t.prompt(position),
        }
    }

    /// Where the prompt at run position `position` begins after its left padding (masked).
    pub fn prompt_start(&self, position: u64) -> usize {
        match self {
            Task::Arithmetic(_) => 0,
            Task::Text(t) => t.prompt_start(position),
        }
    }

    /// The weight of the reward model's score in the reward trained on (`train.reward =
    /// "rule"`): a text job's `model` term, 0 otherwise.
    pub fn model_weight(&self) -> f32 {
        match self {
            Task::Arithmetic(_) => 0.0,
            Task::Text(t) => t.reward.model_weight() as f32,
        }
    }

    /// Whether one process scores for the job (a scorer command, started on rank 0), rather
    /// than every rank alike.
    pub fn scores_on_one_rank(&self) -> bool {
        matches!(self, Task::Text(t) if t.runs_a_command())
    }

    /// The rewards of `rollout`'s sequences, sequence `i` answering the prompt at run
    /// position `positions[i]` (held-out prompt `positions[i]` with [`Split::Eval`]); the
    /// error names the failure.
    pub fn score(&self, rollout: &Rollout, split: Split, positions: &[u64]) -> Result<Scores, String> {
        match self {
            Task::Arithmetic(_) if split == Split::Eval => Err("the arithmetic task has no held-out prompts".into()),
            Task::Arithmetic(t) => {
                let rewards = (0..rollout.sequences())
                    .map(|i| {
                        let (prompt, response) = rollout.prompt_and_response(i);
                        t.reward(prompt, response)
                    })
                    .collect();
                Ok(Scores { rewards, correct: Vec::new(), failures: 0 })
            }
            Task::Text(t) => t.score(rollout, split, positions),
        }
    }

    /// A supervised warm-up example for the actor: (prompt, where it begins after its
    /// padding, response ending in its stop token), example `index` of seed `seed`.
    pub fn warmup_example(&self, seed: u64, index: u64) -> Result<(Vec<u32>, usize, Vec<u32>), String> {
        match self {
            Task::Arithmetic(t) => {
                let prompt = t.prompt(seed ^ 0xA11CE, index);
                let response = t.warmup_response(&prompt, index);
                Ok((prompt, 0, response))
            }
            Task::Text(t) => t.warmup_example(index),
        }
    }
}
