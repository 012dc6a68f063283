//! The RL algorithms and the choices each makes: how advantages are estimated, how the policy
//! loss is clipped and aggregated, and where the KL to the reference goes. An algorithm is a
//! [`Recipe`] of defaults for the `[rl]` and `[train]` keys it shapes; a key the job file sets
//! wins over its recipe (`RlSection::complete` writes the recipe's values into the keys left
//! unset, so `inspect config` shows every one).

use serde::{Deserialize, Serialize};

/// The RL post-training algorithm.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum Algorithm {
    /// Proximal Policy Optimization with a learned critic and GAE (Schulman et al., 2017).
    #[serde(rename = "ppo")]
    Ppo,
    /// Group Relative Policy Optimization: group-normalized rewards, no critic (Shao et al., 2024).
    #[serde(rename = "grpo")]
    Grpo,
    /// ReMax: REINFORCE with a greedy-decoding baseline, no critic (Li et al., 2023).
    #[serde(rename = "remax")]
    Remax,
    /// DAPO (Yu et al., 2025, arXiv:2503.14476): GRPO's advantages with decoupled clipping
    /// (`clip_low` 0.2, `clip_high` 0.28), dynamic sampling (groups whose rewards are all equal
    /// are dropped and the step samples more prompts), token-level loss aggregation, overlong
    /// reward shaping and no KL term.
    #[serde(rename = "dapo")]
    Dapo,
    /// Dr. GRPO (Liu et al., 2025, arXiv:2503.20783): GRPO without the standard-deviation
    /// normalization of group advantages and without per-sequence length normalization (the
    /// loss sums each sequence's tokens over a constant, `seq-mean-token-sum-norm`).
    #[serde(rename = "dr-grpo")]
    DrGrpo,
    /// RLOO (Ahmadian et al., 2024, arXiv:2402.14740): REINFORCE with the leave-one-out mean of
    /// the other samples of the prompt as baseline; the KL penalty is part of the reward.
    #[serde(rename = "rloo")]
    Rloo,
    /// REINFORCE++ (Hu, 2025, arXiv:2501.03262): token-level KL penalty in the reward,
    /// discounted returns, advantages normalized over the whole batch; no critic, no groups.
    #[serde(rename = "reinforce++")]
    ReinforcePp,
    /// REINFORCE++-baseline (Hu, 2025, arXiv:2501.03262): the group mean subtracted from each
    /// score, then normalized over the whole batch; token-level KL penalty in the reward.
    #[serde(rename = "reinforce++-baseline")]
    ReinforcePpBaseline,
    /// GSPO (Zheng et al., 2025, arXiv:2507.18071): GRPO's advantages with a sequence-level
    /// importance ratio (the geometric mean of the token ratios) clipped per sequence
    /// (`clip_low` 3e-4, `clip_high` 4e-4), losses averaged per sequence.
    #[serde(rename = "gspo")]
    Gspo,
}

crate::named_enum!(Algorithm {
    Ppo => "ppo",
    Grpo => "grpo",
    Remax => "remax",
    Dapo => "dapo",
    DrGrpo => "dr-grpo",
    Rloo => "rloo",
    ReinforcePp => "reinforce++",
    ReinforcePpBaseline => "reinforce++-baseline",
    Gspo => "gspo",
});

/// How a mini-batch's per-token policy losses become one number (verl's `agg_loss` in
/// `verl/trainer/ppo/core_algos.py`; sequences with no response token count for nothing).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum LossAgg {
    /// The mean over every response token of the mini-batch (DAPO's token-level loss, Yu et
    /// al., 2025, arXiv:2503.14476).
    #[serde(rename = "token-mean")]
    TokenMean,
    /// The mean over sequences of each sequence's token sum.
    #[serde(rename = "seq-mean-token-sum")]
    SeqMeanTokenSum,
    /// The mean over sequences of each sequence's token mean (GRPO's original form, Shao et
    /// al., 2024; GSPO's, Zheng et al., 2025, arXiv:2507.18071).
    #[serde(rename = "seq-mean-token-mean")]
    SeqMeanTokenMean,
    /// The mean over sequences of each sequence's token sum over the constant
    /// `rl.max_response_len` (Dr. GRPO, Liu et al., 2025, arXiv:2503.20783: no length bias).
    #[serde(rename = "seq-mean-token-sum-norm")]
    SeqMeanTokenSumNorm,
}

crate::named_enum!(LossAgg {
    TokenMean => "token-mean",
    SeqMeanTokenSum => "seq-mean-token-sum",
    SeqMeanTokenMean => "seq-mean-token-mean",
    SeqMeanTokenSumNorm => "seq-mean-token-sum-norm",
});

/// A per-token estimator of `KL(π ‖ π_ref)` from the sampled token's log-ratio
/// `x = log π − log π_ref` (Schulman, "Approximating KL divergence", 2020).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum KlEstimator {
    /// `x`: unbiased, high variance, can be negative.
    #[serde(rename = "k1")]
    K1,
    /// `x² / 2`: biased, low variance.
    #[serde(rename = "k2")]
    K2,
    /// `e^{−x} − 1 + x`: unbiased, low variance, never negative (GRPO's, Shao et al., 2024).
    #[serde(rename = "k3")]
    K3,
    /// k3 with verl's guards (`low_var_kl` in `kl_penalty_forward`): `−x` clamped to ±20 before
    /// the exponential, the estimate clamped to ±10.
    #[serde(rename = "low-var-kl")]
    LowVarKl,
}

crate::named_enum!(KlEstimator { K1 => "k1", K2 => "k2", K3 => "k3", LowVarKl => "low-var-kl" });

/// Where the KL to the reference enters (with coefficient `train.kl_coef`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum KlIn {
    /// A per-token penalty in the rewards (PPO, Ouyang et al., 2022; RLOO; REINFORCE++).
    #[serde(rename = "reward")]
    Reward,
    /// A term of the policy loss (GRPO, Shao et al., 2024).
    #[serde(rename = "loss")]
    Loss,
    /// Nowhere (DAPO, Yu et al., 2025, arXiv:2503.14476).
    #[serde(rename = "none")]
    Off,
}

crate::named_enum!(KlIn { Reward => "reward", Loss => "loss", Off => "none" });

/// The defaults an algorithm gives the keys it shapes.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Recipe {
    /// `rl.loss_agg`.
    pub loss_agg: LossAgg,
    /// `rl.kl_in`.
    pub kl_in: KlIn,
    /// `rl.kl_estimator`.
    pub kl_estimator: KlEstimator,
    /// `rl.dynamic_sampling`.
    pub dynamic_sampling: bool,
    /// `rl.overlong_buffer` as a fraction of `rl.max_response_len` (DAPO's 4,096 of 20,480).
    pub overlong_fraction: f64,
    /// `(train.clip_low, train.clip_high)`; `None`: both `train.clip_ratio`.
    pub clip: Option<(f64, f64)>,
}

impl Algorithm {
    /// Whether the algorithm trains a critic (value model).
    pub fn uses_critic(self) -> bool {
        matches!(self, Algorithm::Ppo)
    }

    /// Whether its baseline comes from the other samples of the same prompt, so that it needs
    /// `rl.samples_per_prompt ≥ 2`.
    pub fn needs_groups(self) -> bool {
        use Algorithm::*;
        matches!(self, Grpo | Dapo | DrGrpo | Rloo | ReinforcePpBaseline | Gspo)
    }

    /// The defaults of the keys the algorithm shapes, as its paper sets them.
    pub fn recipe(self) -> Recipe {
        use Algorithm::*;
        let base = Recipe {
            loss_agg: LossAgg::TokenMean,
            kl_in: KlIn::Loss,
            kl_estimator: KlEstimator::K3,
            dynamic_sampling: false,
            overlong_fraction: 0.0,
            clip: None,
        };
        let in_reward = Recipe { kl_in: KlIn::Reward, kl_estimator: KlEstimator::K1, ..base };
        match self {
            Grpo | Remax => base,
            Ppo | Rloo | ReinforcePp | ReinforcePpBaseline => in_reward,
            Dapo => Recipe {
                kl_in: KlIn::Off,
                dynamic_sampling: true,
                overlong_fraction: 0.2,
                clip: Some((0.2, 0.28)),
                ..base
            },
            DrGrpo => Recipe { loss_agg: LossAgg::SeqMeanTokenSumNorm, ..base },
            Gspo => Recipe { loss_agg: LossAgg::SeqMeanTokenMean, clip: Some((3e-4, 4e-4)), ..base },
        }
    }
}
