//! Training objectives of the RL step, as [`Objective`]s over the engine's per-row outputs.
//! Every loss is a mean over the action tokens of the whole mini-batch (all DP replicas), so
//! the gradient does not depend on how the mini-batch is split.

use std::ops::Range;

use super::Rollout;
use crate::engine::Objective;

/// PPO's clipped surrogate for one token (Schulman et al. 2017): with `ρ = e^{logp − old}`,
/// `loss = −min(ρA, clip(ρ, 1−ε, 1+ε)A)`. Returns the loss and `d loss / d logp`.
pub fn ppo_token(logp: f64, old_logp: f64, advantage: f64, clip: f64) -> (f64, f64) {
    let ratio = (logp - old_logp).exp();
    let unclipped = ratio * advantage;
    let clipped = ratio.clamp(1.0 - clip, 1.0 + clip) * advantage;
    if unclipped <= clipped || (1.0 - clip..=1.0 + clip).contains(&ratio) {
        (-unclipped.min(clipped), -unclipped)
    } else {
        (-clipped, 0.0)
    }
}

/// The k3 estimator of `KL(π ‖ π_ref)` for one token, `e^{ref − logp} − (ref − logp) − 1`
/// (Schulman 2020; GRPO's KL term), and its derivative in `logp`.
pub fn kl_k3(logp: f64, ref_logp: f64) -> (f64, f64) {
    let d = ref_logp - logp;
    (d.exp() - d - 1.0, 1.0 - d.exp())
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

/// The policy loss of a mini-batch (the sequences `members` of `rollout`, in order): PPO's
/// clipped surrogate on the advantages, plus `kl_coef ·` k3 KL to the reference in the loss
/// (GRPO, ReMax; PPO puts its KL into the rewards and passes 0).
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

/// Walks the action rows of the mini-batch sequences `seqs`: `f(rollout row, local row)`.
fn for_actions(rollout: &Rollout, members: &[usize], seqs: Range<usize>, mut f: impl FnMut(usize, usize)) {
    let t = rollout.seq_len;
    for (k, mb) in seqs.clone().enumerate() {
        let s = members[mb];
        for row in rollout.action_rows(s) {
            f(s * t + row, k * t + row);
        }
    }
}

/// The mean over the mini-batch's action tokens of a per-token `(loss, d loss / d output)`:
/// writes each row's gradient (zero off the action rows) and returns this micro-batch's share.
fn token_mean(
    rollout: &Rollout,
    members: &[usize],
    seqs: Range<usize>,
    grad: &mut [f32],
    mut per_token: impl FnMut(usize, usize) -> (f64, f64),
) -> f64 {
    let norm = rollout.action_count(members) as f64;
    let mut loss = 0.0;
    grad.fill(0.0);
    for_actions(rollout, members, seqs, |i, j| {
        let (l, g) = per_token(i, j);
        loss += l / norm;
        grad[j] = (g / norm) as f32;
    });
    loss
}

impl Objective for PolicyLoss<'_> {
    fn loss_and_grad(&self, seqs: Range<usize>, outputs: &[f32], grad: &mut [f32]) -> f64 {
        let r = self.rollout;
        token_mean(r, self.members, seqs, grad, |i, j| {
            let logp = f64::from(outputs[j]);
            let (l, g) = ppo_token(logp, f64::from(r.old_logp[i]), f64::from(r.advantages[i]), self.clip);
            let (kl, dkl) = if self.kl_coef > 0.0 { kl_k3(logp, f64::from(r.ref_logp[i])) } else { (0.0, 0.0) };
            (l + self.kl_coef * kl, g + self.kl_coef * dkl)
        })
    }
}

impl Objective for ValueLoss<'_> {
    fn loss_and_grad(&self, seqs: Range<usize>, outputs: &[f32], grad: &mut [f32]) -> f64 {
        let r = self.rollout;
        token_mean(r, self.members, seqs, grad, |i, j| {
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
}
