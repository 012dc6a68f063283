//! `[rl]`: the RL algorithm, its batch geometry, and the choices of its loss and sampling.

use serde::{Deserialize, Serialize};

pub use super::algorithm::{Algorithm, KlEstimator, KlIn, LossAgg, Recipe};
use super::{check, ConfigError};

/// The `[rl]` section.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RlSection {
    /// `ppo`, `grpo`, `remax`, `dapo`, `dr-grpo`, `rloo`, `reinforce++`,
    /// `reinforce++-baseline` or `gspo` ([`Algorithm`]).
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
    /// How the policy loss aggregates its tokens ([`LossAgg`]); unset: the algorithm's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub loss_agg: Option<LossAgg>,
    /// Where the KL to the reference enters: `reward`, `loss` or `none` ([`KlIn`]); unset: the
    /// algorithm's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kl_in: Option<KlIn>,
    /// The per-token KL estimator: `k1`, `k2`, `k3` or `low-var-kl` ([`KlEstimator`]); unset:
    /// the algorithm's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kl_estimator: Option<KlEstimator>,
    /// DAPO's dynamic sampling (Yu et al., 2025, arXiv:2503.14476): groups whose rewards are all
    /// equal are dropped and the step samples the next prompts until its batch is full; unset:
    /// the algorithm's (on for `dapo`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dynamic_sampling: Option<bool>,
    /// Most sampling rounds of one step under dynamic sampling (each round samples
    /// `prompts_per_step` prompts); the step fails, naming this key, when they do not fill it.
    #[serde(default = "ten")]
    pub max_sampling_rounds: u32,
    /// DAPO's overlong reward shaping (Yu et al., 2025, arXiv:2503.14476): a response longer
    /// than `max_response_len − overlong_buffer` tokens loses `(len − (max_response_len −
    /// overlong_buffer)) / overlong_buffer` of reward, linearly up to 1 at the cap (0: off);
    /// unset: the algorithm's (`max_response_len / 5` for `dapo`, else 0).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub overlong_buffer: Option<u32>,
    /// `sync` (generate, infer, train, then sync weights, one after another) or `async`
    /// ([`RlMode`]): generation for the next step overlaps training on this one.
    #[serde(default)]
    pub mode: RlMode,
    /// Asynchronous mode only: most policy versions a rollout may lag the policy it trains
    /// (rollouts older than this are dropped, never trained on); unset: 1 with `mode = "async"`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_staleness: Option<u32>,
    /// Asynchronous mode only: the truncation of each stale token's behaviour weight
    /// `π_old / π_behav` (decoupled PPO; AReaL's `behav_imp_weight_cap`, Fu et al. 2025,
    /// arXiv:2505.24298); unset: [`BEHAVIOUR_WEIGHT_CAP`] with `mode = "async"`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub behaviour_weight_cap: Option<f64>,
}

/// How an RL step orders its stages (`rl.mode`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum RlMode {
    /// Every step generates with the policy it then trains (on-policy).
    #[default]
    Sync,
    /// Rollouts for step n+1 are generated with the policy of step n (or older, up to
    /// `rl.max_staleness` versions) on ranks disjoint from training, overlapping step n's
    /// training; the loss corrects for the lag with a truncated importance weight (decoupled
    /// PPO, as AReaL does: Fu et al. 2025, arXiv:2505.24298).
    Async,
}

/// The default truncation of the behaviour weight in asynchronous mode
/// (`rl.behaviour_weight_cap`), AReaL's default for its asynchronous runs.
pub const BEHAVIOUR_WEIGHT_CAP: f64 = 5.0;

/// Most policy versions a rollout may lag (`rl.max_staleness`): rollouts are kept in memory
/// until trained on, so a bound far past any useful lag keeps the buffer small.
pub const MAX_STALENESS: u32 = 64;

fn one() -> u32 {
    1
}

fn ten() -> u32 {
    10
}

impl RlSection {
    /// Sequences generated per RL step (validation bounds the product, so it cannot wrap).
    pub fn sequences_per_step(&self) -> u32 {
        self.prompts_per_step.saturating_mul(self.samples_per_prompt)
    }

    /// `loss_agg`, or the algorithm's.
    pub fn loss_agg(&self) -> LossAgg {
        self.loss_agg.unwrap_or(self.algorithm.recipe().loss_agg)
    }

    /// `kl_in`, or the algorithm's.
    pub fn kl_in(&self) -> KlIn {
        self.kl_in.unwrap_or(self.algorithm.recipe().kl_in)
    }

    /// `kl_estimator`, or the algorithm's.
    pub fn kl_estimator(&self) -> KlEstimator {
        self.kl_estimator.unwrap_or(self.algorithm.recipe().kl_estimator)
    }

    /// `dynamic_sampling`, or the algorithm's.
    pub fn dynamic_sampling(&self) -> bool {
        self.dynamic_sampling.unwrap_or(self.algorithm.recipe().dynamic_sampling)
    }

    /// `max_staleness`, or 1 in asynchronous mode; `None` in synchronous mode.
    pub fn max_staleness(&self) -> Option<u32> {
        match self.mode {
            RlMode::Sync => self.max_staleness,
            RlMode::Async => Some(self.max_staleness.unwrap_or(1)),
        }
    }

    /// `behaviour_weight_cap`, or [`BEHAVIOUR_WEIGHT_CAP`] in asynchronous mode; `None` in
    /// synchronous mode (every rollout is on-policy).
    pub fn behaviour_weight_cap(&self) -> Option<f64> {
        match self.mode {
            RlMode::Sync => self.behaviour_weight_cap,
            RlMode::Async => Some(self.behaviour_weight_cap.unwrap_or(BEHAVIOUR_WEIGHT_CAP)),
        }
    }

    /// `overlong_buffer`, or the algorithm's share of `max_response_len`.
    pub fn overlong_buffer(&self) -> u32 {
        let share = self.algorithm.recipe().overlong_fraction * f64::from(self.max_response_len);
        self.overlong_buffer.unwrap_or(share as u32)
    }

    /// Writes the algorithm's value into every key of its recipe left unset (after the flags
    /// are applied), so the resolved job shows them.
    pub fn complete(&mut self) {
        self.loss_agg = Some(self.loss_agg());
        self.kl_in = Some(self.kl_in());
        self.kl_estimator = Some(self.kl_estimator());
        self.dynamic_sampling = Some(self.dynamic_sampling());
        self.overlong_buffer = Some(self.overlong_buffer());
        self.max_staleness = self.max_staleness();
        self.behaviour_weight_cap = self.behaviour_weight_cap();
    }

    /// Checks ranges and batch divisibility; errors name the key under `rl.`.
    pub fn validate(&self) -> Result<(), ConfigError> {
        check::at_least_one("rl.prompts_per_step", self.prompts_per_step)?;
        check::at_least_one("rl.samples_per_prompt", self.samples_per_prompt)?;
        self.check_groups()?;
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
        check::divides("rl.micro_batch", self.micro_batch, self.mini_batch, "rl.mini_batch")?;
        self.check_sampling()?;
        self.check_mode()?;
        self.check_behaviour_weight_cap()
    }

    /// `behaviour_weight_cap` belongs to asynchronous mode, where it is finite and at least 1.
    fn check_behaviour_weight_cap(&self) -> Result<(), ConfigError> {
        let key = "rl.behaviour_weight_cap";
        match (self.mode, self.behaviour_weight_cap()) {
            (RlMode::Sync, Some(cap)) => Err(ConfigError::invalid(
                key,
                cap,
                "applies only to rl.mode = \"async\" (rl.mode is \"sync\": every rollout is on-policy); remove it or set mode = \"async\"",
            )),
            (RlMode::Async, Some(cap)) if !(cap.is_finite() && cap >= 1.0) => Err(ConfigError::invalid(
                key,
                cap,
                "must be a finite number of at least 1 (a stale token's weight π_old / π_behav is truncated there; below 1 even on-policy tokens would be scaled down)",
            )),
            _ => Ok(()),
        }
    }

    /// `max_staleness` belongs to asynchronous mode, where it is at least 1 (0 would train
    /// only on rollouts of the policy being trained, which is synchronous mode).
    fn check_mode(&self) -> Result<(), ConfigError> {
        match (self.mode, self.max_staleness()) {
            (RlMode::Sync, Some(k)) => {
                let why =
                    "applies only to rl.mode = \"async\" (rl.mode is \"sync\"); remove it or set mode = \"async\"";
                return Err(ConfigError::invalid("rl.max_staleness", k, why));
            }
            (RlMode::Async, Some(k)) if !(1..=MAX_STALENESS).contains(&k) => {
                let why = format!(
                    "must be between 1 and {MAX_STALENESS} with rl.mode = \"async\" (0 versions of lag is rl.mode = \"sync\")"
                );
                return Err(ConfigError::invalid("rl.max_staleness", k, why));
            }
            _ => {}
        }
        if self.mode == RlMode::Async && (self.dynamic_sampling() || self.algorithm == Algorithm::Remax) {
            let (key, value) = match self.algorithm {
                Algorithm::Remax => ("rl.algorithm", "remax"),
                _ => ("rl.dynamic_sampling", "true"),
            };
            let why = "samples on the generation ranks in the middle of a step (a greedy baseline, or more rounds), which asynchronous mode keeps apart; set rl.mode = \"sync\"";
            return Err(ConfigError::invalid(key, value, why));
        }
        Ok(())
    }

    /// Algorithms that compare the samples of one prompt, and dynamic sampling, need at least
    /// two of them.
    fn check_groups(&self) -> Result<(), ConfigError> {
        if self.dynamic_sampling() && self.samples_per_prompt < 2 {
            let why = format!(
                "rl.samples_per_prompt = {} gives one sample per prompt, whose group always has equal rewards; set samples_per_prompt >= 2 or dynamic_sampling = false",
                self.samples_per_prompt
            );
            return Err(ConfigError::invalid("rl.dynamic_sampling", true, why));
        }
        if self.algorithm.needs_groups() && self.samples_per_prompt < 2 {
            let why = match self.algorithm {
                Algorithm::Grpo => {
                    "GRPO normalizes rewards within a group of samples of one prompt, so it needs at least 2".into()
                }
                a => format!(
                    "`{}` takes its baseline from the other samples of the same prompt, so it needs at least 2",
                    a.name()
                ),
            };
            return Err(ConfigError::invalid("rl.samples_per_prompt", self.samples_per_prompt, why));
        }
        Ok(())
    }

    /// Dynamic sampling and overlong shaping against the rest of `[rl]`.
    fn check_sampling(&self) -> Result<(), ConfigError> {
        check::between("rl.max_sampling_rounds", self.max_sampling_rounds, 1 << 16)?;
        if self.dynamic_sampling() && self.algorithm == Algorithm::Remax {
            let why = "ReMax's baseline is one greedy answer per prompt of the step, taken before any sample is scored; set dynamic_sampling = false";
            return Err(ConfigError::invalid("rl.dynamic_sampling", true, why));
        }
        if self.overlong_buffer() > self.max_response_len {
            let why = format!("must be at most rl.max_response_len ({})", self.max_response_len);
            return Err(ConfigError::invalid("rl.overlong_buffer", self.overlong_buffer(), why));
        }
        Ok(())
    }
}
