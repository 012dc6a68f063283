//! One RL step's rollouts, replicated on every rank: sequences, response lengths, scores, and
//! per-position arrays `[S, T]` aligned with the model's output rows.
//!
//! Row `t` of sequence `s` is an *action row* when token `t + 1` is part of the response: the
//! LM's row `t` is `log π(token[t+1] | token[..=t])` and the critic's row `t` is the value of
//! the state before that action. Response tokens sit at positions `P..P+len` (EOS included),
//! so the action rows are `P−1..P−1+len`.

use std::ops::Range;

use serde::{Deserialize, Serialize};

use super::advantage::{
    discounted_returns, gae, group_advantages, group_mean_advantages, leave_one_out_advantages, remax_advantages,
    whiten, Estimator,
};
use super::kl::kl_token;
use nereus_core::config::{Algorithm, KlEstimator, KlIn};

/// Rollouts of one RL step.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Rollout {
    /// Prompt tokens `P`.
    pub prompt_len: usize,
    /// Positions per sequence `T = P + R`.
    pub seq_len: usize,
    /// Per sequence, the position of its first real token (left padding before it is masked);
    /// empty when no sequence is padded.
    #[serde(default)]
    pub starts: Vec<usize>,
    /// Tokens `[S, T]`.
    pub tokens: Vec<u32>,
    /// Response lengths (EOS included).
    pub lengths: Vec<usize>,
    /// Sequence scores the policy is trained on.
    pub scores: Vec<f32>,
    /// `log π_old` per row.
    pub old_logp: Vec<f32>,
    /// `log π_ref` per row.
    pub ref_logp: Vec<f32>,
    /// `log π_behav` per row: the log-probabilities of the (older) policy that generated the
    /// rollout, in asynchronous mode; empty when the rollout is on-policy.
    #[serde(default)]
    pub behav_logp: Vec<f32>,
    /// Critic values per row (PPO only).
    pub values: Vec<f32>,
    /// Advantages per row (zero off action rows).
    pub advantages: Vec<f32>,
    /// Value targets per row (PPO only).
    pub returns: Vec<f32>,
}

/// Coefficients of the advantage computation.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct AdvantageParams {
    /// Per-token KL penalty in PPO's rewards.
    pub kl_coef: f64,
    /// GAE discount γ.
    pub gamma: f64,
    /// GAE λ.
    pub lambda: f64,
    /// Samples per prompt (GRPO's group).
    pub group: usize,
}

impl Rollout {
    /// Sequence `i`'s prompt and its response (up to and including its stop token).
    pub fn prompt_and_response(&self, i: usize) -> (&[u32], &[u32]) {
        let (p, t) = (self.prompt_len, self.seq_len);
        let seq = &self.tokens[i * t..(i + 1) * t];
        (&seq[..p], &seq[p..p + self.lengths[i]])
    }

    /// Sequences `S`.
    pub fn sequences(&self) -> usize {
        self.lengths.len()
    }

    /// The action rows of sequence `s`.
    pub fn action_rows(&self, s: usize) -> Range<usize> {
        self.prompt_len - 1..self.prompt_len - 1 + self.lengths[s]
    }

    /// Action rows in the sequences `members`.
    pub fn action_count(&self, members: &[usize]) -> usize {
        members.iter().map(|&s| self.lengths[s]).sum()
    }

    /// The tokens of sequences `members`, in that order.
    pub fn tokens_of(&self, members: &[usize]) -> Vec<u32> {
        members.iter().flat_map(|&s| self.tokens[s * self.seq_len..(s + 1) * self.seq_len].to_vec()).collect()
    }

    /// The first real positions of sequences `members`, in that order (empty when no sequence
    /// is padded).
    pub fn starts_of(&self, members: &[usize]) -> Vec<usize> {
        if self.starts.is_empty() {
            return Vec::new();
        }
        members.iter().map(|&s| self.starts[s]).collect()
    }

    /// The sequences `keep` (in that order) as a rollout of their own: every per-sequence and
    /// per-row array cut to them (arrays not filled yet stay empty).
    pub fn select(&self, keep: &[usize]) -> Rollout {
        let t = self.seq_len;
        let rows = |v: &[f32]| -> Vec<f32> {
            if v.is_empty() {
                return Vec::new();
            }
            keep.iter().flat_map(|&s| v[s * t..(s + 1) * t].iter().copied()).collect()
        };
        let each = |v: &[f32]| -> Vec<f32> {
            if v.is_empty() {
                Vec::new()
            } else {
                keep.iter().map(|&s| v[s]).collect()
            }
        };
        Rollout {
            prompt_len: self.prompt_len,
            seq_len: t,
            starts: self.starts_of(keep),
            tokens: self.tokens_of(keep),
            lengths: keep.iter().map(|&s| self.lengths[s]).collect(),
            scores: each(&self.scores),
            old_logp: rows(&self.old_logp),
            behav_logp: rows(&self.behav_logp),
            ref_logp: rows(&self.ref_logp),
            values: rows(&self.values),
            advantages: rows(&self.advantages),
            returns: rows(&self.returns),
        }
    }

    /// Appends `other`'s sequences (a rollout of the same geometry, filled as far as this one).
    pub fn append(&mut self, other: Rollout) {
        self.starts.extend(other.starts);
        self.tokens.extend(other.tokens);
        self.lengths.extend(other.lengths);
        self.scores.extend(other.scores);
        self.old_logp.extend(other.old_logp);
        self.behav_logp.extend(other.behav_logp);
        self.ref_logp.extend(other.ref_logp);
        self.values.extend(other.values);
        self.advantages.extend(other.advantages);
        self.returns.extend(other.returns);
    }

    /// Mean over action tokens of `log π_old − log π_ref` (the sampled KL estimate; 0 before
    /// inference fills them in).
    pub fn kl_mean(&self) -> f64 {
        if self.old_logp.is_empty() || self.ref_logp.is_empty() {
            return 0.0;
        }
        let (mut sum, mut n) = (0.0, 0usize);
        for s in 0..self.sequences() {
            for t in self.action_rows(s) {
                let i = s * self.seq_len + t;
                sum += f64::from(self.old_logp[i] - self.ref_logp[i]);
                n += 1;
            }
        }
        sum / n.max(1) as f64
    }

    /// Fills `advantages` (and `returns` for PPO) as `algorithm` does by default (its
    /// [`Estimator`], the KL penalty in the rewards where its recipe puts it there, by k1):
    /// see [`Rollout::estimate`].
    pub fn compute_advantages(&mut self, algorithm: Algorithm, p: AdvantageParams, greedy: &[f32]) {
        let recipe = algorithm.recipe();
        let reward_kl = (recipe.kl_in == KlIn::Reward).then_some(recipe.kl_estimator);
        self.estimate(Estimator::of(algorithm), p, reward_kl, greedy);
    }

    /// Fills `advantages` (and `returns` for GAE). Each response's token rewards are
    /// `−p.kl_coef · KL_t` (by `reward_kl`; none when `None`) plus its score on the last action;
    /// a sequence's score is their sum (verl's `token_level_rewards.sum(-1)`). GAE: over the
    /// critic's values, whitened over all action tokens. REINFORCE++: the discounted returns,
    /// whitened. ReMax: each token's reward-to-go minus the greedy response's score (`greedy`).
    /// Group, leave-one-out: the sequence scores' advantages on every action;
    /// REINFORCE++-baseline's whitened over all action tokens.
    pub fn estimate(
        &mut self,
        estimator: Estimator,
        p: AdvantageParams,
        reward_kl: Option<KlEstimator>,
        greedy: &[f32],
    ) {
        self.advantages = vec![0.0; self.sequences() * self.seq_len];
        let penalties = self.kl_penalties(p.kl_coef, reward_kl);
        let scores = self.sequence_scores(&penalties);
        let broadcast = |adv: Vec<f64>| -> Vec<Vec<f64>> {
            adv.into_iter().zip(&self.lengths).map(|(a, &len)| vec![a; len]).collect()
        };
        let (rows, whitened) = match estimator {
            Estimator::Gae => return self.gae_advantages(&penalties, p),
            Estimator::Returns => {
                let rewards = self.token_rewards(penalties);
                (rewards.iter().map(|r| discounted_returns(r, p.gamma)).collect(), true)
            }
            Estimator::Greedy => {
                let rewards = self.token_rewards(penalties);
                let baseline = |s: usize, len: usize| vec![f64::from(greedy[s]); len];
                let to_go =
                    |(s, r): (usize, &Vec<f64>)| remax_advantages(&discounted_returns(r, 1.0), &baseline(s, r.len()));
                (rewards.iter().enumerate().map(to_go).collect(), false)
            }
            Estimator::Group { std: true } => (broadcast(group_advantages(&scores, p.group)), false),
            Estimator::Group { std: false } => (broadcast(group_mean_advantages(&scores, p.group)), false),
            Estimator::GroupWhitened => (broadcast(group_mean_advantages(&scores, p.group)), true),
            Estimator::LeaveOneOut => (broadcast(leave_one_out_advantages(&scores, p.group)), false),
        };
        self.set_rows(rows, whitened);
    }

    /// Per sequence, `−kl_coef · KL_t` on each action row by `estimator` of the log-ratio
    /// `log π_old − log π_ref` as the rollout holds it (f32); empty rows when `estimator` is
    /// `None`.
    fn kl_penalties(&self, kl_coef: f64, estimator: Option<KlEstimator>) -> Vec<Vec<f64>> {
        let penalty = |i: usize| match estimator {
            Some(e) => -kl_coef * kl_token(e, f64::from(self.old_logp[i] - self.ref_logp[i]), 0.0).0,
            None => 0.0,
        };
        (0..self.sequences())
            .map(|s| match estimator {
                Some(_) => self.action_rows(s).map(|t| penalty(s * self.seq_len + t)).collect(),
                None => Vec::new(),
            })
            .collect()
    }

    /// Each sequence's score plus its KL penalties.
    fn sequence_scores(&self, penalties: &[Vec<f64>]) -> Vec<f64> {
        let score = |s: usize| f64::from(self.scores[s]);
        (0..self.sequences())
            .map(|s| if penalties[s].is_empty() { score(s) } else { score(s) + penalties[s].iter().sum::<f64>() })
            .collect()
    }

    /// Each sequence's token rewards: its KL penalties (zeros without) plus the score on the
    /// last action.
    fn token_rewards(&self, penalties: Vec<Vec<f64>>) -> Vec<Vec<f64>> {
        penalties
            .into_iter()
            .enumerate()
            .map(|(s, mut rewards)| {
                rewards.resize(self.lengths[s], 0.0);
                if let Some(last) = rewards.last_mut() {
                    *last += f64::from(self.scores[s]);
                }
                rewards
            })
            .collect()
    }

    /// PPO: GAE over the token rewards and the critic's values; returns, and advantages
    /// whitened over all action tokens.
    fn gae_advantages(&mut self, penalties: &[Vec<f64>], p: AdvantageParams) {
        self.returns = vec![0.0; self.sequences() * self.seq_len];
        let rewards = self.token_rewards(penalties.to_vec());
        let mut advantages = Vec::with_capacity(rewards.len());
        for (s, rewards) in rewards.iter().enumerate() {
            let rows: Vec<usize> = self.action_rows(s).map(|t| s * self.seq_len + t).collect();
            let values: Vec<f64> = rows.iter().map(|&i| f64::from(self.values[i])).collect();
            let (adv, ret) = gae(rewards, &values, p.gamma, p.lambda);
            for (&i, r) in rows.iter().zip(ret) {
                self.returns[i] = r as f32;
            }
            advantages.push(adv);
        }
        self.set_rows(advantages, true);
    }

    /// Writes per-sequence values (one per action row) to their rows, first whitened over all
    /// action tokens when `whitened`.
    fn set_rows(&mut self, per_sequence: Vec<Vec<f64>>, whitened: bool) {
        let mut all: Vec<f64> = per_sequence.into_iter().flatten().collect();
        if whitened {
            whiten(&mut all);
        }
        let seq_len = self.seq_len;
        let rows: Vec<usize> =
            (0..self.sequences()).flat_map(|s| self.action_rows(s).map(move |t| s * seq_len + t)).collect();
        for (i, a) in rows.into_iter().zip(all) {
            self.advantages[i] = a as f32;
        }
    }
}
