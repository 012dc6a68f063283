//! Advantages: GAE for PPO (Schulman et al. 2016), group-relative for GRPO (Shao et al. 2024)
//! and Dr. GRPO (Liu et al. 2025), leave-one-out for RLOO (Ahmadian et al. 2024), a
//! greedy-rollout baseline for ReMax (Li et al. 2023), discounted returns for REINFORCE++ (Hu
//! 2025), whitening; and DAPO's reward shaping and group filter (Yu et al. 2025).

use nereus_core::config::Algorithm;

/// How a step's advantages are estimated: the algorithm's ([`Estimator::of`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Estimator {
    /// GAE over the critic's values, whitened over the batch's tokens (PPO).
    Gae,
    /// Each score minus its group's mean, over the group's standard deviation when `std`
    /// (GRPO, DAPO, GSPO; without: Dr. GRPO, Liu et al. 2025, arXiv:2503.20783).
    Group {
        /// Divide by the group's standard deviation.
        std: bool,
    },
    /// Each score minus the mean of the other scores of its group (RLOO, Ahmadian et al. 2024,
    /// arXiv:2402.14740).
    LeaveOneOut,
    /// Each score minus the greedy response's (ReMax).
    Greedy,
    /// Discounted returns of the token rewards, whitened over the batch's tokens (REINFORCE++,
    /// Hu 2025, arXiv:2501.03262).
    Returns,
    /// Each score minus its group's mean, whitened over the batch's tokens
    /// (REINFORCE++-baseline, Hu 2025, arXiv:2501.03262).
    GroupWhitened,
}

impl Estimator {
    /// The estimator of `algorithm`.
    pub fn of(algorithm: Algorithm) -> Estimator {
        use Algorithm::*;
        match algorithm {
            Ppo => Estimator::Gae,
            Grpo | Dapo | Gspo => Estimator::Group { std: true },
            DrGrpo => Estimator::Group { std: false },
            Rloo => Estimator::LeaveOneOut,
            Remax => Estimator::Greedy,
            ReinforcePp => Estimator::Returns,
            ReinforcePpBaseline => Estimator::GroupWhitened,
        }
    }
}

/// Generalized advantage estimation over one response: `rewards[t]` and `values[t]` per action,
/// the value after the last action taken as 0. Returns `(advantages, returns)`.
pub fn gae(rewards: &[f64], values: &[f64], gamma: f64, lambda: f64) -> (Vec<f64>, Vec<f64>) {
    let n = rewards.len();
    let mut adv = vec![0.0; n];
    let mut next = 0.0;
    for t in (0..n).rev() {
        let next_value = if t + 1 < n { values[t + 1] } else { 0.0 };
        let delta = rewards[t] + gamma * next_value - values[t];
        next = delta + gamma * lambda * next;
        adv[t] = next;
    }
    let returns = adv.iter().zip(values).map(|(a, v)| a + v).collect();
    (adv, returns)
}

/// GRPO: each score minus its group's mean, over the group's (population) standard deviation.
pub fn group_advantages(scores: &[f64], group: usize) -> Vec<f64> {
    scores
        .chunks(group.max(1))
        .flat_map(|g| {
            let mean = g.iter().sum::<f64>() / g.len() as f64;
            let std = (g.iter().map(|s| (s - mean).powi(2)).sum::<f64>() / g.len() as f64).sqrt();
            g.iter().map(move |s| (s - mean) / (std + 1e-6)).collect::<Vec<_>>()
        })
        .collect()
}

/// Dr. GRPO (Liu et al. 2025, arXiv:2503.20783): each score minus its group's mean, without
/// GRPO's division by the standard deviation.
pub fn group_mean_advantages(scores: &[f64], group: usize) -> Vec<f64> {
    scores
        .chunks(group.max(1))
        .flat_map(|g| {
            let mean = g.iter().sum::<f64>() / g.len() as f64;
            g.iter().map(move |s| s - mean).collect::<Vec<_>>()
        })
        .collect()
}

/// RLOO (Ahmadian et al. 2024, arXiv:2402.14740): each score minus the mean of the other `k − 1`
/// scores of its group (a group of one keeps its score).
pub fn leave_one_out_advantages(scores: &[f64], group: usize) -> Vec<f64> {
    scores
        .chunks(group.max(1))
        .flat_map(|g| {
            let (sum, n) = (g.iter().sum::<f64>(), g.len() as f64);
            g.iter().map(move |s| if n > 1.0 { s - (sum - s) / (n - 1.0) } else { *s }).collect::<Vec<_>>()
        })
        .collect()
}

/// The discounted returns `G_t = r_t + γ·G_{t+1}` of one response's token rewards
/// (REINFORCE++, Hu 2025, arXiv:2501.03262).
pub fn discounted_returns(rewards: &[f64], gamma: f64) -> Vec<f64> {
    let mut returns = vec![0.0; rewards.len()];
    let mut next = 0.0;
    for t in (0..rewards.len()).rev() {
        next = rewards[t] + gamma * next;
        returns[t] = next;
    }
    returns
}

/// DAPO's overlong reward shaping (Yu et al. 2025, arXiv:2503.14476, eq. 13): 0 up to
/// `max_len − buffer` tokens, then `−(len − (max_len − buffer)) / buffer`, down to −1 at the
/// cap (0 when `buffer` is 0).
pub fn overlong_penalty(len: usize, max_len: usize, buffer: usize) -> f64 {
    if buffer == 0 {
        return 0.0;
    }
    let expected = max_len.saturating_sub(buffer) as f64;
    (-(len as f64 - expected) / buffer as f64).min(0.0)
}

/// DAPO's dynamic-sampling filter (Yu et al. 2025, arXiv:2503.14476, eq. 11): the groups (of
/// `group` consecutive scores) whose scores are not all equal, in order.
pub fn varied_groups(scores: &[f32], group: usize) -> Vec<usize> {
    scores.chunks(group.max(1)).enumerate().filter(|(_, g)| g.iter().any(|s| *s != g[0])).map(|(k, _)| k).collect()
}

/// ReMax: each sampled response's score minus the score of the greedy response to its prompt.
pub fn remax_advantages(scores: &[f64], greedy_scores: &[f64]) -> Vec<f64> {
    scores.iter().zip(greedy_scores).map(|(s, g)| s - g).collect()
}

/// Shifts and scales `xs` to mean 0 and standard deviation 1.
pub fn whiten(xs: &mut [f64]) {
    let n = xs.len().max(1) as f64;
    let mean = xs.iter().sum::<f64>() / n;
    let std = (xs.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / n).sqrt();
    xs.iter_mut().for_each(|x| *x = (*x - mean) / (std + 1e-8));
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gae_matches_the_recursion_worked_by_hand() {
        // δ = [0.1, 0.1, 0.3]; A₂ = 0.3, A₁ = 0.1 + 0.95·0.3 = 0.385, A₀ = 0.1 + 0.95·0.385.
        let (adv, ret) = gae(&[0.0, 0.0, 1.0], &[0.5, 0.6, 0.7], 1.0, 0.95);
        for (got, want) in adv.iter().zip([0.46575, 0.385, 0.3]) {
            assert!((got - want).abs() < 1e-12, "{adv:?}");
        }
        for (got, want) in ret.iter().zip([0.96575, 0.985, 1.0]) {
            assert!((got - want).abs() < 1e-12, "{ret:?}");
        }
    }

    #[test]
    fn group_and_greedy_baselines_by_hand() {
        // Group [1, 2, 3, 6]: mean 3, std √3.5.
        let a = group_advantages(&[1.0, 2.0, 3.0, 6.0, 5.0, 5.0], 4);
        let s = 3.5f64.sqrt();
        for (got, want) in a.iter().zip([-2.0 / s, -1.0 / s, 0.0, 3.0 / s, 0.0, 0.0]) {
            assert!((got - want).abs() < 1e-5, "{a:?}");
        }
        assert_eq!(remax_advantages(&[0.5, 0.25], &[0.25, 0.5]), vec![0.25, -0.25]);
    }

    #[test]
    fn dr_grpo_rloo_and_reinforce_baselines_by_hand() {
        // Group [1, 2, 3, 6]: mean 3; leave-one-out means 11/3, 10/3, 3, 2.
        let close = |a: &[f64], b: &[f64]| a.iter().zip(b).all(|(x, y)| (x - y).abs() < 1e-12);
        assert!(close(&group_mean_advantages(&[1.0, 2.0, 3.0, 6.0], 4), &[-2.0, -1.0, 0.0, 3.0]));
        let loo = leave_one_out_advantages(&[1.0, 2.0, 3.0, 6.0, 5.0], 4);
        assert!(close(&loo, &[1.0 - 11.0 / 3.0, 2.0 - 10.0 / 3.0, 0.0, 4.0, 5.0]), "{loo:?}");
        // γ = 0.5: G₂ = 1, G₁ = −0.5 + 0.5, G₀ = 0.25 + 0.
        assert!(close(&discounted_returns(&[0.25, -0.5, 1.0], 0.5), &[0.25, 0.0, 1.0]));
    }

    #[test]
    fn dapo_shaping_and_group_filter_by_hand() {
        // Cap 20, buffer 4: free up to 16 tokens, then −1/4 per token, −1 at the cap.
        assert_eq!(overlong_penalty(16, 20, 4), 0.0);
        assert_eq!(overlong_penalty(18, 20, 4), -0.5);
        assert_eq!(overlong_penalty(20, 20, 4), -1.0);
        assert_eq!(overlong_penalty(20, 20, 0), 0.0);
        assert_eq!(varied_groups(&[1.0, 1.0, 0.0, 1.0, 0.0, 0.0], 2), vec![1]);
        assert_eq!(Estimator::of(Algorithm::DrGrpo), Estimator::Group { std: false });
    }
}
