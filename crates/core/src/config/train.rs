//! `[train]`: what the reference engine needs to run the job — optimizer, sampling, the RL
//! coefficients, the supervised warm-up, and checkpoints. Every key has a default.

use serde::{Deserialize, Serialize};

use super::{check, Algorithm, ConfigError};

/// Which score the policy is trained on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum RewardSource {
    /// The task's verifiable rule.
    Rule,
    /// The reward model-stage's score.
    Model,
}

/// What `nereus train` does when an update's loss or gradient norm is not finite (the update
/// itself is never applied).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum OnNonFinite {
    /// Stop with exit status 1, naming the step, the model-stage and the value.
    Stop,
    /// Skip the update and go on; stop after 3 consecutive steps with skipped updates.
    SkipStep,
}

/// The `[train]` section.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct TrainSection {
    /// Actor learning rate (AdamW).
    pub actor_lr: f64,
    /// Critic learning rate.
    pub critic_lr: f64,
    /// AdamW decoupled weight decay (matrices only).
    pub weight_decay: f64,
    /// Global gradient-norm clip (0 disables).
    pub max_grad_norm: f64,
    /// Sampling temperature of the actor.
    pub temperature: f64,
    /// Nucleus sampling mass (of the candidates `min_p` and `top_k` leave).
    pub top_p: f64,
    /// Min-p sampling: candidates have at least this probability relative to the most likely
    /// token's (0: off).
    pub min_p: f64,
    /// Top-k sampling: at most this many candidates, the most likely (0: off).
    pub top_k: u32,
    /// How often, in generated tokens, a device's host reads whether every response has ended:
    /// between reads no token step waits for the host; a larger value saves waits and wastes up
    /// to this many steps of compute after the last response ends (the CPU engine checks every
    /// step, where a check is free).
    pub stop_check_every: u32,
    /// KL coefficient: per-token reward penalty (PPO) or loss term (GRPO, ReMax).
    pub kl_coef: f64,
    /// PPO ratio clip ε.
    pub clip_ratio: f64,
    /// Lower clip of the importance ratio, `1 − clip_low` (DAPO's decoupled clip, Yu et al.,
    /// 2025, arXiv:2503.14476); unset: the algorithm's (0.2 for `dapo`, 3e-4 for `gspo`, else
    /// `clip_ratio`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub clip_low: Option<f64>,
    /// Upper clip of the importance ratio, `1 + clip_high` (DAPO's clip-higher: 0.28; GSPO's,
    /// Zheng et al., 2025, arXiv:2507.18071: 4e-4); unset: the algorithm's, else `clip_ratio`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub clip_high: Option<f64>,
    /// Coefficient of the entropy bonus in the policy loss (0: none). The entropy of each
    /// response token's distribution is estimated from the sampled token, `−log π(y_t)`, and its
    /// gradient by the score function, `−log π(y_t) · ∇log π(y_t)` (the engine's objective sees
    /// the sampled token's log-probability, not the whole vocabulary's distribution).
    pub entropy_coef: f64,
    /// Critic value clip.
    pub value_clip: f64,
    /// GAE discount γ.
    pub discount: f64,
    /// GAE λ.
    pub gae_lambda: f64,
    /// Score the policy is trained on: `rule` or `model`.
    pub reward: RewardSource,
    /// Correct terms that earn the task's full reward (0: the response length cap).
    pub reward_cap: u32,
    /// Supervised warm-up steps of the actor before RL (0: start from random weights).
    pub warmup_actor_steps: u32,
    /// Supervised steps that train the reward model on the rule before RL.
    pub warmup_reward_steps: u32,
    /// Learning rate of both warm-ups.
    pub warmup_lr: f64,
    /// Memory per rank of the warm-ups in GB (0: `cluster.device_memory_gb`). The warm-ups are
    /// the supervised phase before the RL job, not part of its plan: a job that studies a tight
    /// memory cap may give them their own.
    pub warmup_memory_gb: f64,
    /// Save a checkpoint every this many RL steps (0: none during the run; the end's is
    /// `checkpoint_at_end`'s).
    pub checkpoint_every: u32,
    /// Save a checkpoint after the last step, whatever `checkpoint_every` says (false: the job
    /// ends without one unless `checkpoint_every` or a stop signal asks; for benchmark and
    /// throwaway runs whose final state nobody resumes, which at 1 B parameters is ~20 GB).
    pub checkpoint_at_end: bool,
    /// Write a checkpoint due by `checkpoint_every` before the last step in the background:
    /// the step loop waits only while every model is gathered onto rank 0's host memory, and a
    /// thread writes the files while training goes on (false: the loop waits for the files).
    /// Checkpoints at the end, on a stop signal or a failure are on disk before the job exits.
    pub checkpoint_async: bool,
    /// Record every model-stage's state digest (SHA-256 over its parameters and moments, every
    /// rank) in the step record every this many steps and after the last (0: never; transitions
    /// always digest before and after). Hashing costs about a second per GB a rank holds.
    pub digest_every: u32,
    /// Largest weight file of a checkpoint's model directories, in GB (10^9 bytes); a larger
    /// model is split into shards with an index, as transformers does (its default, 5).
    pub checkpoint_shard_gb: f64,
    /// A non-finite loss or gradient norm: `stop` (exit 1) or `skip-step` (skip the update).
    pub on_nonfinite: OnNonFinite,
}

impl Default for TrainSection {
    fn default() -> Self {
        TrainSection {
            actor_lr: 3e-4,
            critic_lr: 1e-3,
            weight_decay: 0.0,
            max_grad_norm: 1.0,
            temperature: 1.0,
            top_p: 1.0,
            min_p: 0.0,
            top_k: 0,
            stop_check_every: 16,
            kl_coef: 0.02,
            clip_ratio: 0.2,
            clip_low: None,
            clip_high: None,
            entropy_coef: 0.0,
            value_clip: 0.2,
            discount: 1.0,
            gae_lambda: 0.95,
            reward: RewardSource::Rule,
            reward_cap: 0,
            warmup_actor_steps: 0,
            warmup_reward_steps: 0,
            warmup_lr: 3e-3,
            warmup_memory_gb: 0.0,
            checkpoint_every: 0,
            checkpoint_at_end: true,
            checkpoint_async: true,
            digest_every: 1,
            checkpoint_shard_gb: 5.0,
            on_nonfinite: OnNonFinite::Stop,
        }
    }
}

impl TrainSection {
    /// `(clip_low, clip_high)`: the keys, else `algorithm`'s, else `clip_ratio` for both.
    pub fn clip_range(&self, algorithm: Algorithm) -> (f64, f64) {
        let (low, high) = algorithm.recipe().clip.unwrap_or((self.clip_ratio, self.clip_ratio));
        (self.clip_low.unwrap_or(low), self.clip_high.unwrap_or(high))
    }

    /// Writes `algorithm`'s clip range into the clip keys left unset (see
    /// [`super::RlSection::complete`]).
    pub fn complete(&mut self, algorithm: Algorithm) {
        let (low, high) = self.clip_range(algorithm);
        (self.clip_low, self.clip_high) = (Some(low), Some(high));
    }

    /// The decoupled clip range: `clip_low` in [0, 1], `clip_high` ≥ 0, and `clip_low ≤
    /// clip_high` (the algorithm's values count where the keys are unset).
    fn check_clip_range(&self, algorithm: Algorithm) -> Result<(), ConfigError> {
        let (low, high) = self.clip_range(algorithm);
        check::within("train.clip_low", low, 0.0, 1.0)?;
        check::within("train.clip_high", high, 0.0, f64::MAX)?;
        if low > high {
            let why = format!(
                "is above train.clip_high ({}): the ratio's trust region would be narrower above 1 than below (DAPO's clip-higher widens the upper side)",
                check::show(high)
            );
            return Err(ConfigError::invalid("train.clip_low", check::show(low), why));
        }
        Ok(())
    }

    /// Checks ranges (the clip range against the job's `algorithm`); errors name the key under
    /// `train.`.
    pub fn validate(&self, algorithm: Algorithm) -> Result<(), ConfigError> {
        self.check_ranges()?;
        self.check_clip_range(algorithm)
    }

    /// Every key's range on its own.
    fn check_ranges(&self) -> Result<(), ConfigError> {
        for (key, value) in [
            ("train.actor_lr", self.actor_lr),
            ("train.critic_lr", self.critic_lr),
            ("train.warmup_lr", self.warmup_lr),
            ("train.temperature", self.temperature),
            ("train.checkpoint_shard_gb", self.checkpoint_shard_gb),
        ] {
            check::positive(key, value)?;
        }
        check::within("train.top_p", self.top_p, 0.0, 1.0)?;
        check::positive("train.top_p", self.top_p)?;
        check::within("train.min_p", self.min_p, 0.0, 1.0)?;
        check::within("train.stop_check_every", f64::from(self.stop_check_every), 1.0, 4096.0)?;
        check::within("train.clip_ratio", self.clip_ratio, 0.0, 1.0)?;
        check::within("train.discount", self.discount, 0.0, 1.0)?;
        check::within("train.gae_lambda", self.gae_lambda, 0.0, 1.0)?;
        for (key, value) in [
            ("train.weight_decay", self.weight_decay),
            ("train.max_grad_norm", self.max_grad_norm),
            ("train.kl_coef", self.kl_coef),
            ("train.value_clip", self.value_clip),
            ("train.entropy_coef", self.entropy_coef),
        ] {
            check::within(key, value, 0.0, f64::MAX)?;
        }
        check::within("train.warmup_memory_gb", self.warmup_memory_gb, 0.0, check::MAX_DEVICE_MEMORY_GB)?;
        Ok(())
    }

    /// `checkpoint_shard_gb` in bytes (at least one).
    pub fn checkpoint_shard_bytes(&self) -> u64 {
        (self.checkpoint_shard_gb * 1e9).max(1.0) as u64
    }
}
