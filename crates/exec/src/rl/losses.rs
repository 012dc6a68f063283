//! Training objectives of the RL step, as [`Objective`]s over the engine's per-row outputs.
//! Every loss is normalized by counts of the whole mini-batch (all DP replicas: its tokens, or
//! its sequences), so the gradient does not depend on how the mini-batch is split.
//!
//! The actor's loss ([`ActorLoss`]) is composed from small per-token functions by
//! [`PolicyTerms`]: a clipped importance-ratio surrogate (per token, [`clipped_surrogate`], or
//! per sequence, [`gspo_token`]), a KL estimator ([`kl_token`]), the entropy estimate
//! ([`entropy_token`]), and an aggregation ([`agg_divisor`]). The objectives run on the host
//! from the gathered log-probabilities, one host synchronization per micro-batch.

use std::ops::Range;

pub use super::kl::{kl_k1, kl_k2, kl_k3, kl_low_var, kl_token};
use super::Rollout;
use crate::engine::Objective;
use nereus_core::config::rl::BEHAVIOUR_WEIGHT_CAP;
use nereus_core::config::{Algorithm, KlEstimator, LossAgg};

/// The clipped surrogate for one token with the decoupled clip range `[1 − low, 1 + high]`
/// (PPO, Schulman et al. 2017, with `low = high = ε`; DAPO's clip-higher, Yu et al. 2025,
/// arXiv:2503.14476): with `ρ = e^{log_ratio}`, `loss = −min(ρA, clip(ρ, 1−low, 1+high)A)`.
/// Returns the loss and `d loss / d log_ratio`. `low ≤ 1` and `high ≥ 0` (the config checks).
pub fn clipped_surrogate(log_ratio: f64, advantage: f64, low: f64, high: f64) -> (f64, f64) {
    let ratio = log_ratio.exp();
    let unclipped = ratio * advantage;
    let clipped = ratio.clamp(1.0 - low, 1.0 + high) * advantage;
    if unclipped <= clipped || (1.0 - low..=1.0 + high).contains(&ratio) {
        (-unclipped.min(clipped), -unclipped)
    } else {
        (-clipped, 0.0)
    }
}

/// PPO's clipped surrogate for one token (Schulman et al. 2017): with `ρ = e^{logp − old}`,
/// `loss = −min(ρA, clip(ρ, 1−ε, 1+ε)A)`. Returns the loss and `d loss / d logp`.
pub fn ppo_token(logp: f64, old_logp: f64, advantage: f64, clip: f64) -> (f64, f64) {
    clipped_surrogate(logp - old_logp, advantage, clip, clip)
}

/// GSPO's loss for one token of a sequence (Zheng et al. 2025, arXiv:2507.18071, "GSPO-token"
/// with a sequence-level advantage): the clipped surrogate of the sequence's ratio `s = e^{x̄}`,
/// `x̄` the mean of its tokens' `logp − old` (the geometric mean of the token ratios), whose
/// gradient reaches each token as `sg[s] · π/sg[π]` does. `x̄` is capped at 10 with no gradient
/// beyond, as verl's `compute_policy_loss_gspo` does. Returns the loss and `d loss / d logp`.
pub fn gspo_token(seq_log_ratio: f64, advantage: f64, low: f64, high: f64) -> (f64, f64) {
    let (loss, grad) = clipped_surrogate(seq_log_ratio.min(10.0), advantage, low, high);
    (loss, if seq_log_ratio > 10.0 { 0.0 } else { grad })
}

/// Decoupled PPO's behaviour weight for one token (Hilton et al. 2022, "Batch size-invariance
/// for policy optimization", arXiv:2110.00641; as AReaL applies it to stale rollouts, Fu et al.
/// 2025, arXiv:2505.24298, `behav_imp_weight_cap`): the surrogate clips the ratio to the
/// proximal policy `π_old` (the trained weights before this step's updates) and is weighted by
/// `π_old / π_behav`, the importance of the policy that generated the token, truncated at
/// `cap`. A constant of the loss: no gradient flows through it.
pub fn behaviour_weight(old_logp: f64, behav_logp: f64, cap: f64) -> f64 {
    (old_logp - behav_logp).exp().min(cap)
}

/// The entropy of one token's distribution estimated from the sampled token, `Ĥ = −logp`
/// (its expectation under the policy is the entropy), and the score-function estimate of its
/// gradient, `−logp · ∇logp` (Williams 1992), as a derivative in `logp`: both `−logp`.
pub fn entropy_token(logp: f64) -> (f64, f64) {
    (-logp, -logp)
}

/// Counts of a mini-batch that normalize its loss.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct BatchCounts {
    /// Response tokens.
    pub tokens: usize,
    /// Sequences with at least one response token.
    pub sequences: usize,
    /// The longest response allowed (`rl.max_response_len`), Dr. GRPO's constant.
    pub horizon: usize,
}

impl BatchCounts {
    /// The counts of the sequences `members` of `rollout`.
    pub fn of(rollout: &Rollout, members: &[usize]) -> BatchCounts {
        BatchCounts {
            tokens: rollout.action_count(members),
            sequences: members.iter().filter(|&&s| rollout.lengths[s] > 0).count(),
            horizon: rollout.seq_len - rollout.prompt_len,
        }
    }
}

/// What one token's loss of a sequence of `len` response tokens is divided by under `agg`
/// (verl's `agg_loss`, `verl/trainer/ppo/core_algos.py`, with the global batch's counts).
pub fn agg_divisor(agg: LossAgg, len: usize, batch: BatchCounts) -> f64 {
    let sequences = batch.sequences as f64;
    match agg {
        LossAgg::TokenMean => batch.tokens as f64,
        LossAgg::SeqMeanTokenSum => sequences,
        LossAgg::SeqMeanTokenMean => sequences * len as f64,
        LossAgg::SeqMeanTokenSumNorm => sequences * batch.horizon as f64,
    }
}

/// Whether the importance ratio is per token or per sequence.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RatioLevel {
    /// `π(y_t)/π_old(y_t)` per token (PPO and its descendants).
    Token,
    /// The geometric mean of a sequence's token ratios (GSPO, Zheng et al. 2025,
    /// arXiv:2507.18071).
    Sequence,
}

impl RatioLevel {
    /// The ratio `algorithm` clips.
    pub fn of(algorithm: Algorithm) -> RatioLevel {
        match algorithm {
            Algorithm::Gspo => RatioLevel::Sequence,
            _ => RatioLevel::Token,
        }
    }
}

/// The terms of the actor's loss and their aggregation, from the job's configuration.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct PolicyTerms {
    /// Per-token or per-sequence importance ratio.
    pub ratio: RatioLevel,
    /// The ratio's lower clip, `1 − clip_low`.
    pub clip_low: f64,
    /// The ratio's upper clip, `1 + clip_high`.
    pub clip_high: f64,
    /// Coefficient of the KL term in the loss (0: none).
    pub kl_coef: f64,
    /// The KL term's estimator.
    pub kl_estimator: KlEstimator,
    /// Coefficient of the entropy bonus (0: none).
    pub entropy_coef: f64,
    /// How the tokens' losses are aggregated.
    pub agg: LossAgg,
    /// The truncation of a stale token's behaviour weight ([`behaviour_weight`]; asynchronous
    /// mode's `rl.behaviour_weight_cap`).
    pub behaviour_cap: f64,
}

impl PolicyTerms {
    /// PPO's and GRPO's loss as [`PolicyLoss`] computes it: per-token ratio clipped to `1 ± clip`,
    /// `kl_coef ·` k3 in the loss, no entropy bonus, the mean over the mini-batch's tokens.
    pub fn ppo(clip: f64, kl_coef: f64) -> PolicyTerms {
        PolicyTerms {
            ratio: RatioLevel::Token,
            clip_low: clip,
            clip_high: clip,
            kl_coef,
            kl_estimator: KlEstimator::K3,
            entropy_coef: 0.0,
            agg: LossAgg::TokenMean,
            behaviour_cap: BEHAVIOUR_WEIGHT_CAP,
        }
    }

    /// One token's `(loss, d loss / d logp)` before aggregation: the surrogate on row `i`'s
    /// advantage (per token, or on the sequence's mean log-ratio `seq_log_ratio`), plus the KL
    /// term, minus the entropy bonus.
    fn token(&self, r: &Rollout, i: usize, logp: f64, seq_log_ratio: f64) -> (f64, f64) {
        let advantage = f64::from(r.advantages[i]);
        let (l, g) = match self.ratio {
            RatioLevel::Token => {
                clipped_surrogate(logp - f64::from(r.old_logp[i]), advantage, self.clip_low, self.clip_high)
            }
            RatioLevel::Sequence => gspo_token(seq_log_ratio, advantage, self.clip_low, self.clip_high),
        };
        // A stale rollout (asynchronous mode) weighs each token by its behaviour weight.
        let (l, g) = match r.behav_logp.get(i) {
            Some(&behav) => {
                let w = behaviour_weight(f64::from(r.old_logp[i]), f64::from(behav), self.behaviour_cap);
                (w * l, w * g)
            }
            None => (l, g),
        };
        let (kl, dkl) =
            if self.kl_coef > 0.0 { kl_token(self.kl_estimator, logp, f64::from(r.ref_logp[i])) } else { (0.0, 0.0) };
        let (l, g) = (l + self.kl_coef * kl, g + self.kl_coef * dkl);
        if self.entropy_coef > 0.0 {
            let (h, dh) = entropy_token(logp);
            (l - self.entropy_coef * h, g - self.entropy_coef * dh)
        } else {
            (l, g)
        }
    }
}

/// The actor's loss of a mini-batch (the sequences `members` of `rollout`, in order), composed
/// by [`PolicyTerms`].
pub struct ActorLoss<'a> {
    /// Rollouts.
    pub rollout: &'a Rollout,
    /// Rollout sequence of each mini-batch sequence.
    pub members: &'a [usize],
    /// The loss's terms.
    pub terms: PolicyTerms,
}

/// The policy loss of a mini-batch (the sequences `members` of `rollout`, in order): PPO's
/// clipped surrogate on the advantages, plus `kl_coef ·` k3 KL to the reference in the loss
/// (GRPO, ReMax; PPO puts its KL into the rewards and passes 0) — [`ActorLoss`] with
/// [`PolicyTerms::ppo`].
pub struct PolicyLoss<'a> {
    /// Rollouts.
    pub rollout: &'a Rollout,
    /// Rollout sequence of each mini-batch sequence.
    pub members: &'a [usize],
    /// ε of the ratio clip.
    pub clip: f64,
    /// Coefficient of the KL term.
    pub kl_coef: f64,
}

/// PPO's clipped value loss for one token: `½·max((V − R)², (V_clip − R)²)` with
/// `V_clip = V_old + clip(V − V_old, −ε, ε)`. Returns the loss and `d loss / d V`.
pub fn value_token(value: f64, old_value: f64, ret: f64, clip: f64) -> (f64, f64) {
    let clipped = old_value + (value - old_value).clamp(-clip, clip);
    let (a, b) = ((value - ret).powi(2), (clipped - ret).powi(2));
    if a >= b || (value - old_value).abs() <= clip {
        (0.5 * a.max(b), value - ret)
    } else {
        (0.5 * b, 0.0)
    }
}

/// PPO's clipped value loss of a mini-batch.
pub struct ValueLoss<'a> {
    /// Rollouts.
    pub rollout: &'a Rollout,
    /// Rollout sequence of each mini-batch sequence.
    pub members: &'a [usize],
    /// ε of the value clip.
    pub clip: f64,
}

/// Next-token cross-entropy from row `first_row` through the last response token (the actor's
/// supervised warm-up: with `first_row = 1` the prompt's own terms teach the rule at every
/// position, the response teaches the format).
pub struct SequenceCrossEntropy<'a> {
    /// Rollouts (tokens and lengths are used).
    pub rollout: &'a Rollout,
    /// Rollout sequence of each mini-batch sequence.
    pub members: &'a [usize],
    /// First row that counts.
    pub first_row: usize,
}

/// Squared error of the value at each sequence's last token against its score (the reward
/// model's supervised training).
pub struct ScoreRegression<'a> {
    /// Rollouts (scores are the targets).
    pub rollout: &'a Rollout,
    /// Rollout sequence of each mini-batch sequence.
    pub members: &'a [usize],
}

/// Walks the action rows of the mini-batch sequences `seqs`: `f(k, s, rollout row, local row)`
/// for the `k`-th of them, rollout sequence `s`.
fn for_actions(
    rollout: &Rollout,
    members: &[usize],
    seqs: Range<usize>,
    mut f: impl FnMut(usize, usize, usize, usize),
) {
    let t = rollout.seq_len;
    for (k, mb) in seqs.clone().enumerate() {
        let s = members[mb];
        for row in rollout.action_rows(s) {
            f(k, s, s * t + row, k * t + row);
        }
    }
}

/// The aggregation `agg` over the mini-batch of a per-token `(loss, d loss / d output)`
/// (`per_token(k, rollout row, local row)`): writes each row's gradient (zero off the action
/// rows) and returns this micro-batch's share.
fn aggregate(
    rollout: &Rollout,
    members: &[usize],
    seqs: Range<usize>,
    grad: &mut [f32],
    agg: LossAgg,
    mut per_token: impl FnMut(usize, usize, usize) -> (f64, f64),
) -> f64 {
    let counts = BatchCounts::of(rollout, members);
    let mut loss = 0.0;
    grad.fill(0.0);
    for_actions(rollout, members, seqs, |k, s, i, j| {
        let norm = agg_divisor(agg, rollout.lengths[s], counts);
        let (l, g) = per_token(k, i, j);
        loss += l / norm;
        grad[j] = (g / norm) as f32;
    });
    loss
}

/// The mean over each sequence's action rows of `outputs − old_logp` (GSPO's `log s`), for the
/// mini-batch sequences `seqs` (0 for a sequence without response tokens).
fn sequence_log_ratios(rollout: &Rollout, members: &[usize], seqs: Range<usize>, outputs: &[f32]) -> Vec<f64> {
    let mut sums = vec![0.0; seqs.len()];
    for_actions(rollout, members, seqs.clone(), |k, _, i, j| {
        sums[k] += f64::from(outputs[j]) - f64::from(rollout.old_logp[i]);
    });
    seqs.zip(&mut sums).map(|(mb, sum)| *sum / rollout.lengths[members[mb]].max(1) as f64).collect()
}

impl Objective for ActorLoss<'_> {
    fn loss_and_grad(&self, seqs: Range<usize>, outputs: &[f32], grad: &mut [f32]) -> f64 {
        let (r, t) = (self.rollout, &self.terms);
        let ratios = match t.ratio {
            RatioLevel::Sequence => sequence_log_ratios(r, self.members, seqs.clone(), outputs),
            RatioLevel::Token => Vec::new(),
        };
        aggregate(r, self.members, seqs, grad, t.agg, |k, i, j| {
            t.token(r, i, f64::from(outputs[j]), ratios.get(k).copied().unwrap_or(0.0))
        })
    }
}

impl Objective for PolicyLoss<'_> {
    fn loss_and_grad(&self, seqs: Range<usize>, outputs: &[f32], grad: &mut [f32]) -> f64 {
        let terms = PolicyTerms::ppo(self.clip, self.kl_coef);
        ActorLoss { rollout: self.rollout, members: self.members, terms }.loss_and_grad(seqs, outputs, grad)
    }
}

impl Objective for ValueLoss<'_> {
    fn loss_and_grad(&self, seqs: Range<usize>, outputs: &[f32], grad: &mut [f32]) -> f64 {
        let r = self.rollout;
        aggregate(r, self.members, seqs, grad, LossAgg::TokenMean, |_, i, j| {
            value_token(f64::from(outputs[j]), f64::from(r.values[i]), f64::from(r.returns[i]), self.clip)
        })
    }
}

impl Objective for SequenceCrossEntropy<'_> {
    fn loss_and_grad(&self, seqs: Range<usize>, outputs: &[f32], grad: &mut [f32]) -> f64 {
        let r = self.rollout;
        let rows = |s: usize| self.first_row..r.action_rows(s).end;
        let norm = self.members.iter().map(|&s| rows(s).len()).sum::<usize>() as f64;
        let mut loss = 0.0;
        grad.fill(0.0);
        for (k, mb) in seqs.enumerate() {
            for row in rows(self.members[mb]) {
                let j = k * r.seq_len + row;
                loss -= f64::from(outputs[j]) / norm;
                grad[j] = (-1.0 / norm) as f32;
            }
        }
        loss
    }
}

impl Objective for ScoreRegression<'_> {
    fn loss_and_grad(&self, seqs: Range<usize>, outputs: &[f32], grad: &mut [f32]) -> f64 {
        let (r, t) = (self.rollout, self.rollout.seq_len);
        let norm = self.members.len() as f64;
        let mut loss = 0.0;
        grad.fill(0.0);
        for (k, mb) in seqs.enumerate() {
            let s = self.members[mb];
            let j = k * t + r.prompt_len + r.lengths[s] - 1; // the row that has read the whole response
            let err = f64::from(outputs[j]) - f64::from(r.scores[s]);
            loss += err * err / norm;
            grad[j] = (2.0 * err / norm) as f32;
        }
        loss
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn close(a: f64, b: f64) {
        assert!((a - b).abs() < 1e-6, "{a} vs {b}");
    }

    #[test]
    fn token_losses_by_hand() {
        // ρ = e^{0.2} = 1.22140 > 1.2: a positive advantage is clipped (no gradient) ...
        let (l, g) = ppo_token(-1.0, -1.2, 2.0, 0.2);
        close(l, -2.4);
        close(g, 0.0);
        // ... a negative one is not: loss −ρA, gradient −ρA.
        let (l, g) = ppo_token(-1.0, -1.2, -2.0, 0.2);
        close(l, 2.0 * 0.2f64.exp());
        close(g, 2.0 * 0.2f64.exp());
        // Inside the trust region the surrogate is −ρA.
        let (l, g) = ppo_token(-1.0, -1.05, 1.0, 0.2);
        close(l, -(0.05f64).exp());
        close(g, -(0.05f64).exp());
        // k3 at logp = ref is zero with zero slope; at ref − logp = 0.5: e^{0.5} − 1.5.
        assert_eq!(kl_k3(-2.0, -2.0), (0.0, 0.0));
        let (kl, dkl) = kl_k3(-2.0, -1.5);
        close(kl, 0.5f64.exp() - 1.5);
        close(dkl, 1.0 - 0.5f64.exp());
        // V = 1.5, V_old = 1.0, R = 2.0, ε = 0.2: V_clip = 1.2 has the larger error (0.64).
        let (l, g) = value_token(1.5, 1.0, 2.0, 0.2);
        close(l, 0.32);
        close(g, 0.0);
        let (l, g) = value_token(1.1, 1.0, 2.0, 0.2);
        close(l, 0.5 * 0.81);
        close(g, -0.9);
    }

    /// One sequence, prompt 2, response 2 (T = 4): action rows 1 and 2.
    fn batch() -> Rollout {
        Rollout {
            prompt_len: 2,
            seq_len: 4,
            starts: Vec::new(),
            tokens: vec![5, 6, 7, 0],
            lengths: vec![2],
            scores: vec![0.5],
            old_logp: vec![0.0, -1.0, -2.0, 0.0],
            ref_logp: vec![0.0, -1.5, -2.0, 0.0],
            behav_logp: Vec::new(),
            values: vec![0.0, 0.2, 0.4, 0.0],
            advantages: vec![0.0, 1.0, -1.0, 0.0],
            returns: vec![0.0, 0.6, 0.5, 0.0],
        }
    }

    #[test]
    fn ppo_grpo_and_remax_losses_on_a_hand_written_batch() {
        let r = batch();
        let outputs = [9.0, -1.0, -1.9, 9.0]; // new log-probs; rows 0 and 3 are not actions
        let mut grad = [7.0f32; 4];
        // PPO (KL in the rewards): row 1 ρ = 1, A = 1 → −1; row 2 ρ = e^{0.1} = 1.10517 inside
        // the clip, A = −1 → +1.10517. Mean over 2 tokens.
        let ppo = PolicyLoss { rollout: &r, members: &[0], clip: 0.2, kl_coef: 0.0 };
        close(ppo.loss_and_grad(0..1, &outputs, &mut grad), (-1.0 + 0.1f64.exp()) / 2.0);
        assert_eq!(grad[0], 0.0);
        assert_eq!(grad[3], 0.0);
        close(f64::from(grad[1]), -0.5);
        close(f64::from(grad[2]), 0.1f64.exp() / 2.0);
        // GRPO / ReMax add β·k3: row 1 ref − logp = −0.5 → e^{−0.5} − 0.5; row 2 −0.1 → e^{−0.1} − 0.9.
        let grpo = PolicyLoss { rollout: &r, members: &[0], clip: 0.2, kl_coef: 0.1 };
        let kl = ((-0.5f64).exp() - 0.5) + ((-0.1f64).exp() - 0.9);
        close(grpo.loss_and_grad(0..1, &outputs, &mut grad), (-1.0 + 0.1f64.exp() + 0.1 * kl) / 2.0);
        close(f64::from(grad[1]), (-1.0 + 0.1 * (1.0 - (-0.5f64).exp())) / 2.0);
        // Critic: values 0.3 (row 1, old 0.2, R 0.6) and 0.45 (row 2, old 0.4, R 0.5), ε = 0.2:
        // ½(0.3² + 0.05²)/2.
        let critic = ValueLoss { rollout: &r, members: &[0], clip: 0.2 };
        close(critic.loss_and_grad(0..1, &[0.0, 0.3, 0.45, 0.0], &mut grad), 0.5 * (0.09 + 0.0025) / 2.0);
        close(f64::from(grad[1]), -0.3 / 2.0);
        // Reward model: the value at row P + len − 1 = 3 regresses onto the score.
        let rm = ScoreRegression { rollout: &r, members: &[0] };
        close(rm.loss_and_grad(0..1, &[0.0, 0.0, 0.0, 0.8], &mut grad), 0.09);
        close(f64::from(grad[3]), 0.6);
    }

    #[test]
    fn stale_tokens_are_weighted_by_their_truncated_behaviour_weight() {
        // On-policy (behaviour = proximal) the weight is 1 and the loss is the plain one.
        close(behaviour_weight(-1.0, -1.0, BEHAVIOUR_WEIGHT_CAP), 1.0);
        close(behaviour_weight(-1.0, -1.5, 5.0), 0.5f64.exp());
        close(behaviour_weight(0.0, -4.0, 5.0), 5.0);
        let outputs = [9.0, -1.0, -1.9, 9.0];
        let terms = PolicyTerms::ppo(0.2, 0.0);
        let loss = |r: &Rollout, grad: &mut [f32; 4]| {
            ActorLoss { rollout: r, members: &[0], terms }.loss_and_grad(0..1, &outputs, grad)
        };
        let (mut plain, mut weighted) = ([0f32; 4], [0f32; 4]);
        let on_policy = Rollout { behav_logp: batch().old_logp, ..batch() };
        close(loss(&batch(), &mut plain), loss(&on_policy, &mut weighted));
        assert_eq!(plain, weighted);
        // Row 1 generated by a policy e^{0.5} times less likely than π_old, row 2 by one 100
        // times less likely (truncated at 5): each token's loss and gradient scale by its weight.
        let stale = Rollout { behav_logp: vec![0.0, -1.5, -2.0 - 100f64.ln() as f32, 0.0], ..batch() };
        let (w1, w2) = (0.5f64.exp(), 5.0);
        close(loss(&stale, &mut weighted), (-w1 + w2 * 0.1f64.exp()) / 2.0);
        close(f64::from(weighted[1]), w1 * f64::from(plain[1]));
        close(f64::from(weighted[2]), w2 * f64::from(plain[2]));
    }

    #[test]
    fn ppo_advantages_from_rewards_with_kl_and_gae() {
        let mut r = batch();
        r.compute_advantages(
            nereus_core::config::Algorithm::Ppo,
            super::super::AdvantageParams { kl_coef: 0.1, gamma: 1.0, lambda: 1.0, group: 1 },
            &[],
        );
        // Rewards: row 1 −0.1·(−1 + 1.5) = −0.05; row 2 0 + score 0.5. λ = γ = 1: returns are
        // reward-to-go: 0.45 and 0.5; advantages 0.45 − 0.2 and 0.5 − 0.4, then whitened.
        close(f64::from(r.returns[1]), 0.45);
        close(f64::from(r.returns[2]), 0.5);
        close(f64::from(r.advantages[1]), 1.0);
        close(f64::from(r.advantages[2]), -1.0);
    }

    #[test]
    fn decoupled_clip_sequence_ratio_kl_estimators_and_entropy_by_hand() {
        // ρ = e^{0.22} = 1.2461: clipped at 1.2 with ε = 0.2, free under DAPO's clip-higher 0.28.
        assert_eq!(clipped_surrogate(0.22, 1.0, 0.2, 0.2), (-1.2, 0.0));
        let (l, g) = clipped_surrogate(0.22, 1.0, 0.2, 0.28);
        close(l, -(0.22f64).exp());
        close(g, -(0.22f64).exp());
        assert_eq!(ppo_token(-1.0, -1.22, 1.0, 0.2), clipped_surrogate(-1.0 - -1.22, 1.0, 0.2, 0.2));
        // GSPO's sequence ratio e^{x̄} clipped the same way; above x̄ = 10 no gradient.
        assert_eq!(gspo_token(0.22, 1.0, 0.2, 0.2), (-1.2, 0.0));
        assert_eq!(gspo_token(11.0, -1.0, 0.2, 0.2).1, 0.0);
        // k1, k2 at logp − ref = 0.5; low-var-kl is k3 below its clamps, 10 with no slope above.
        assert_eq!(kl_k1(-1.0, -1.5), (0.5, 1.0));
        assert_eq!(kl_k2(-1.0, -1.5), (0.125, 0.5));
        assert_eq!(kl_low_var(-2.0, -1.5), kl_k3(-2.0, -1.5));
        assert_eq!(kl_low_var(-20.0, -5.0), (10.0, 0.0));
        assert_eq!(entropy_token(-0.7), (0.7, 0.7));
    }

    #[test]
    fn aggregation_modes_and_the_ppo_terms_by_hand() {
        // Two sequences of lengths 2 and 0 (all masked) and 4 in a mini-batch, horizon 5.
        let counts = BatchCounts { tokens: 6, sequences: 2, horizon: 5 };
        assert_eq!(agg_divisor(LossAgg::TokenMean, 2, counts), 6.0);
        assert_eq!(agg_divisor(LossAgg::SeqMeanTokenSum, 2, counts), 2.0);
        assert_eq!(agg_divisor(LossAgg::SeqMeanTokenMean, 2, counts), 4.0);
        assert_eq!(agg_divisor(LossAgg::SeqMeanTokenSumNorm, 2, counts), 10.0);
        // PolicyLoss is ActorLoss with the PPO terms, bit for bit.
        let r = batch();
        let outputs = [9.0, -1.0, -1.9, 9.0];
        let (mut a, mut b) = ([0f32; 4], [0f32; 4]);
        let old =
            PolicyLoss { rollout: &r, members: &[0], clip: 0.2, kl_coef: 0.1 }.loss_and_grad(0..1, &outputs, &mut a);
        let terms = PolicyTerms::ppo(0.2, 0.1);
        let new = ActorLoss { rollout: &r, members: &[0], terms }.loss_and_grad(0..1, &outputs, &mut b);
        assert_eq!((old.to_bits(), a), (new.to_bits(), b));
        // seq-mean-token-sum of the one sequence: twice the token mean.
        let terms = PolicyTerms { agg: LossAgg::SeqMeanTokenSum, ..terms };
        let sum = ActorLoss { rollout: &r, members: &[0], terms }.loss_and_grad(0..1, &outputs, &mut b);
        close(sum, 2.0 * old);
    }
}
