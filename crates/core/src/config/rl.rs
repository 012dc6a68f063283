//! `[rl]`: the RL algorithm and its batch geometry.

use serde::{Deserialize, Serialize};

use super::{check, ConfigError};

/// The RL post-training algorithm.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Algorithm {
    /// Proximal Policy Optimization with a learned critic and GAE (Schulman et al., 2017).
    Ppo,
    /// Group Relative Policy Optimization: group-normalized rewards, no critic (Shao et al., 2024).
    Grpo,
    /// ReMax: REINFORCE with a greedy-decoding baseline, no critic (Li et al., 2023).
    Remax,
}

impl Algorithm {
    /// Whether the algorithm trains a critic (value model).
    pub fn uses_critic(self) -> bool {
        matches!(self, Algorithm::Ppo)
    }
}

crate::named_enum!(Algorithm { Ppo => "ppo", Grpo => "grpo", Remax => "remax" });

/// The `[rl]` section.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RlSection {
    /// `ppo`, `grpo` or `remax`.
    pub algorithm: Algorithm,
    /// Prompts per RL step (the global prompt batch, split over the actor's DP replicas).
    pub prompts_per_step: u32,
    /// Responses sampled per prompt (GRPO's group size; at least 2 for GRPO).
    #[serde(default = "one")]
    pub samples_per_prompt: u32,
    /// Prompt length in tokens.
    pub prompt_len: u32,
    /// Longest response in tokens; sampling stops at EOS or here.
    pub max_response_len: u32,
    /// Sequences per optimizer update; must divide `prompts_per_step * samples_per_prompt`.
    pub mini_batch: u32,
    /// Sequences per forward/backward pass (gradient accumulation makes up the mini-batch).
    pub micro_batch: u32,
    /// Passes over each step's rollouts.
    #[serde(default = "one")]
    pub epochs: u32,
}

fn one() -> u32 {
    1
}

impl RlSection {
    /// Sequences generated per RL step (validation bounds the product, so it cannot wrap).
    pub fn sequences_per_step(&self) -> u32 {
        self.prompts_per_step.saturating_mul(self.samples_per_prompt)
    }

    /// Checks ranges and batch divisibility; errors name the key under `rl.`.
    pub fn validate(&self) -> Result<(), ConfigError> {
        check::at_least_one("rl.prompts_per_step", self.prompts_per_step)?;
        check::at_least_one("rl.samples_per_prompt", self.samples_per_prompt)?;
        if self.algorithm == Algorithm::Grpo && self.samples_per_prompt < 2 {
            return Err(ConfigError::invalid(
                "rl.samples_per_prompt",
                self.samples_per_prompt,
                "GRPO normalizes rewards within a group of samples of one prompt, so it needs at least 2",
            ));
        }
        let sequences = u64::from(self.prompts_per_step) * u64::from(self.samples_per_prompt);
        if sequences > u64::from(check::MAX_SEQUENCES) {
            return Err(ConfigError::invalid(
                "rl.prompts_per_step",
                self.prompts_per_step,
                format!(
                    "times rl.samples_per_prompt ({}) gives {sequences} sequences per step; at most {} are supported",
                    self.samples_per_prompt,
                    check::MAX_SEQUENCES
                ),
            ));
        }
        if self.prompt_len < 2 || self.prompt_len > check::MAX_TOKENS {
            return Err(ConfigError::invalid(
                "rl.prompt_len",
                self.prompt_len,
                format!(
                    "must be between 2 and {} (the task reads its step from the last two prompt terms)",
                    check::MAX_TOKENS
                ),
            ));
        }
        check::between("rl.max_response_len", self.max_response_len, check::MAX_TOKENS)?;
        check::at_least_one("rl.mini_batch", self.mini_batch)?;
        check::at_least_one("rl.micro_batch", self.micro_batch)?;
        check::at_least_one("rl.epochs", self.epochs)?;
        let sequences = self.sequences_per_step();
        check::divides("rl.mini_batch", self.mini_batch, sequences, "prompts_per_step * samples_per_prompt")?;
        check::divides("rl.micro_batch", self.micro_batch, self.mini_batch, "rl.mini_batch")
    }
}
