//! Advantages: GAE for PPO (Schulman et al. 2016), group-relative for GRPO (Shao et al. 2024),
//! a greedy-rollout baseline for ReMax (Li et al. 2023), and whitening.

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
}
