//! AdamW (Loshchilov & Hutter 2019) with global gradient-norm clipping, in place on the EMU's
//! flat parameter and moment sections.

use serde::{Deserialize, Serialize};

/// Optimizer hyper-parameters.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct AdamW {
    /// Learning rate.
    pub lr: f32,
    /// First-moment decay β₁.
    pub beta1: f32,
    /// Second-moment decay β₂.
    pub beta2: f32,
    /// ε added to `√v̂`.
    pub eps: f32,
    /// Decoupled weight decay on matrices (not on norm gains or the value head).
    pub weight_decay: f32,
    /// Gradients are scaled down so their global L2 norm is at most this (0 disables).
    pub max_grad_norm: f32,
}

impl Default for AdamW {
    fn default() -> AdamW {
        AdamW { lr: 1e-3, beta1: 0.9, beta2: 0.95, eps: 1e-8, weight_decay: 0.0, max_grad_norm: 1.0 }
    }
}

impl AdamW {
    /// The factor that brings a gradient of norm `norm` within `max_grad_norm`.
    pub fn clip_scale(&self, norm: f64) -> f32 {
        if self.max_grad_norm > 0.0 && norm > f64::from(self.max_grad_norm) {
            (f64::from(self.max_grad_norm) / norm) as f32
        } else {
            1.0
        }
    }

    /// One update of the elements of one tensor: `t` is the update number (from 1), `scale`
    /// the clipping factor, `decay` whether weight decay applies.
    #[allow(clippy::too_many_arguments)]
    pub fn update(&self, p: &mut [f32], m: &mut [f32], v: &mut [f32], g: &[f32], t: u64, scale: f32, decay: bool) {
        let (b1, b2) = (self.beta1, self.beta2);
        let c1 = 1.0 - b1.powi(t as i32);
        let c2 = 1.0 - b2.powi(t as i32);
        let wd = if decay { self.weight_decay } else { 0.0 };
        for i in 0..p.len() {
            let gi = g[i] * scale;
            m[i] = b1 * m[i] + (1.0 - b1) * gi;
            v[i] = b2 * v[i] + (1.0 - b2) * gi * gi;
            let step = (m[i] / c1) / ((v[i] / c2).sqrt() + self.eps);
            p[i] -= self.lr * (step + wd * p[i]);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn first_step_moves_each_weight_by_the_learning_rate_against_its_gradient() {
        let opt = AdamW { weight_decay: 0.0, ..AdamW::default() };
        let (mut p, mut m, mut v) = (vec![1.0, 1.0, 1.0], vec![0.0; 3], vec![0.0; 3]);
        opt.update(&mut p, &mut m, &mut v, &[0.5, -2.0, 0.0], 1, 1.0, false);
        // Bias-corrected m̂/√v̂ = sign(g) on the first step.
        assert!((p[0] - (1.0 - 1e-3)).abs() < 1e-6 && (p[1] - (1.0 + 1e-3)).abs() < 1e-6 && p[2] == 1.0);
        assert_eq!(opt.clip_scale(4.0), 0.25);
        assert_eq!(opt.clip_scale(0.5), 1.0);
    }
}
