//! One RL step's rollouts, replicated on every rank: sequences, response lengths, scores, and
//! per-position arrays `[S, T]` aligned with the model's output rows.
//!
//! Row `t` of sequence `s` is an *action row* when token `t + 1` is part of the response: the
//! LM's row `t` is `log π(token[t+1] | token[..=t])` and the critic's row `t` is the value of
//! the state before that action. Response tokens sit at positions `P..P+len` (EOS included),
//! so the action rows are `P−1..P−1+len`.

use std::ops::Range;

use serde::{Deserialize, Serialize};

use super::advantage::{gae, group_advantages, remax_advantages, whiten};
use nereus_core::config::Algorithm;

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

    /// Mean over action tokens of `log π_old − log π_ref` (the sampled KL estimate).
    pub fn kl_mean(&self) -> f64 {
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

    /// Fills `advantages` (and `returns` for PPO). PPO: per-token reward `−β·(log π_old −
    /// log π_ref)` plus the score on the last action, GAE over the critic's values, whitened over
    /// all action tokens. GRPO: the group-normalized score on every action. ReMax: the score
    /// minus the greedy response's score (`greedy`) on every action.
    pub fn compute_advantages(&mut self, algorithm: Algorithm, p: AdvantageParams, greedy: &[f32]) {
        let n = self.sequences() * self.seq_len;
        self.advantages = vec![0.0; n];
        let scores: Vec<f64> = self.scores.iter().map(|&x| f64::from(x)).collect();
        let per_sequence = match algorithm {
            Algorithm::Ppo => None,
            Algorithm::Grpo => Some(group_advantages(&scores, p.group)),
            Algorithm::Remax => {
                Some(remax_advantages(&scores, &greedy.iter().map(|&x| f64::from(x)).collect::<Vec<_>>()))
            }
        };
        if let Some(adv) = per_sequence {
            for (s, &a) in adv.iter().enumerate() {
                for t in self.action_rows(s) {
                    self.advantages[s * self.seq_len + t] = a as f32;
                }
            }
            return;
        }
        self.returns = vec![0.0; n];
        let mut all = Vec::new();
        let mut spans = Vec::new();
        for (s, &score) in scores.iter().enumerate() {
            let rows: Vec<usize> = self.action_rows(s).map(|t| s * self.seq_len + t).collect();
            let mut rewards: Vec<f64> =
                rows.iter().map(|&i| -p.kl_coef * f64::from(self.old_logp[i] - self.ref_logp[i])).collect();
            if let Some(last) = rewards.last_mut() {
                *last += score;
            }
            let values: Vec<f64> = rows.iter().map(|&i| f64::from(self.values[i])).collect();
            let (adv, ret) = gae(&rewards, &values, p.gamma, p.lambda);
            for (&i, r) in rows.iter().zip(ret) {
                self.returns[i] = r as f32;
            }
            spans.push(rows);
            all.extend(adv);
        }
        whiten(&mut all);
        for (i, a) in spans.into_iter().flatten().zip(all) {
            self.advantages[i] = a as f32;
        }
    }
}
