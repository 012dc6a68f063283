//! The f64 references the device kernels are checked against, written from the formulas (not
//! from the kernels), and the finite-difference checks of their backward passes.

/// RMSNorm forward of one row: `(y, inv_rms)`.
pub fn rmsnorm(x: &[f64], weight: &[f64], eps: f64) -> (Vec<f64>, f64) {
    let mean_square = x.iter().map(|v| v * v).sum::<f64>() / x.len() as f64;
    let r = 1.0 / (mean_square + eps).sqrt();
    (x.iter().zip(weight).map(|(v, w)| v * r * w).collect(), r)
}

/// RMSNorm backward of one row: `(dx, dweight contribution)`.
pub fn rmsnorm_backward(dy: &[f64], x: &[f64], weight: &[f64], eps: f64) -> (Vec<f64>, Vec<f64>) {
    let (_, r) = rmsnorm(x, weight, eps);
    let n = x.len() as f64;
    let mean_gx = dy.iter().zip(weight).zip(x).map(|((d, w), v)| d * w * v).sum::<f64>() / n;
    let dx = dy.iter().zip(weight).zip(x).map(|((d, w), v)| r * (d * w - v * r * r * mean_gx)).collect();
    let dweight = dy.iter().zip(x).map(|(d, v)| d * v * r).collect();
    (dx, dweight)
}

/// `silu(g)·u`.
pub fn swiglu(g: f64, u: f64) -> f64 {
    g / (1.0 + (-g).exp()) * u
}

/// `(d out/d g, d out/d u)` of [`swiglu`].
pub fn swiglu_backward(g: f64, u: f64) -> (f64, f64) {
    let s = 1.0 / (1.0 + (-g).exp());
    (u * s * (1.0 + g * (1.0 - s)), g * s)
}

/// Row statistics of one vocab shard: `(max, Σ exp(l − max), target logit or −∞)`.
pub fn row_stats(logits: &[f64], target: i64, shard_start: i64) -> (f64, f64, f64) {
    let max = logits.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    let sum = logits.iter().map(|l| (l - max).exp()).sum();
    let t = target - shard_start;
    let target_logit = if t >= 0 && (t as usize) < logits.len() { logits[t as usize] } else { f64::NEG_INFINITY };
    (max, sum, target_logit)
}

/// AdamW's hyper-parameters and step (bias corrections `c1 = 1 − β1^t`, `c2 = 1 − β2^t`).
#[derive(Debug, Clone, Copy)]
pub struct AdamStep {
    /// Learning rate.
    pub lr: f64,
    /// β1.
    pub beta1: f64,
    /// β2.
    pub beta2: f64,
    /// ε.
    pub eps: f64,
    /// Decoupled weight decay.
    pub weight_decay: f64,
    /// `1 − β1^t`.
    pub c1: f64,
    /// `1 − β2^t`.
    pub c2: f64,
}

/// One AdamW update of one element: `(param, m, v)` after the step.
pub fn adamw(a: &AdamStep, param: f64, m: f64, v: f64, g: f64) -> (f64, f64, f64) {
    let m = a.beta1 * m + (1.0 - a.beta1) * g;
    let v = a.beta2 * v + (1.0 - a.beta2) * g * g;
    let p = param - a.lr * (m / a.c1 / ((v / a.c2).sqrt() + a.eps) + a.weight_decay * param);
    (p, m, v)
}

/// Central difference of `f` at `x` in direction `index`: `(f(x + h) − f(x − h)) / 2h`.
///
/// `h = ε^(1/3)·max(|x|, 1)` balances the truncation error (∝ h²) against the roundoff of the
/// two evaluations (∝ ε/h); with `h = 1e-6` roundoff alone reached 1.3e-5 of a near-zero
/// derivative on one seed in thousands (a 54-column RMSNorm).
pub fn central_difference(x: &[f64], index: usize, f: impl Fn(&[f64]) -> f64) -> f64 {
    let h = f64::EPSILON.cbrt() * x[index].abs().max(1.0);
    let (mut plus, mut minus) = (x.to_vec(), x.to_vec());
    plus[index] += h;
    minus[index] -= h;
    (f(&plus) - f(&minus)) / (2.0 * h)
}

/// Relative disagreement of an analytic derivative with its central difference.
pub fn fd_error(analytic: f64, numeric: f64) -> f64 {
    (analytic - numeric).abs() / analytic.abs().max(numeric.abs()).max(1e-3)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_backward_references_agree_with_finite_differences() {
        let x = [0.3, -1.2, 0.8, 2.0, -0.1];
        let w = [1.1, 0.9, -0.5, 1.3, 0.7];
        let dy = [0.2, -0.4, 1.0, 0.3, -0.9];
        let (dx, dw) = rmsnorm_backward(&dy, &x, &w, 1e-5);
        let loss_x = |x: &[f64]| rmsnorm(x, &w, 1e-5).0.iter().zip(&dy).map(|(y, d)| y * d).sum::<f64>();
        let loss_w = |w: &[f64]| rmsnorm(&x, w, 1e-5).0.iter().zip(&dy).map(|(y, d)| y * d).sum::<f64>();
        for i in 0..x.len() {
            assert!(fd_error(dx[i], central_difference(&x, i, loss_x)) < 1e-6, "dx[{i}]");
            assert!(fd_error(dw[i], central_difference(&w, i, loss_w)) < 1e-6, "dw[{i}]");
        }
        let (dg, du) = swiglu_backward(0.7, -1.3);
        assert!(fd_error(dg, central_difference(&[0.7], 0, |g| swiglu(g[0], -1.3))) < 1e-6);
        assert!(fd_error(du, central_difference(&[-1.3], 0, |u| swiglu(0.7, u[0]))) < 1e-6);
    }
}

/// The shapes of one attention call (the kernels' legend in `crates/kernels/device/attention.cu`).
#[derive(Debug, Clone, Copy)]
pub struct Attention {
    /// Sequences `B`.
    pub b: usize,
    /// Query positions `Tq`.
    pub tq: usize,
    /// Valid key positions `Tk ≥ Tq`.
    pub tk: usize,
    /// Positions per sequence in the K/V buffers (`≥ Tk`).
    pub tc: usize,
    /// Query heads `H`.
    pub heads: usize,
    /// Key/value heads `K`, dividing `H`.
    pub kv_heads: usize,
    /// Head width `D`.
    pub d: usize,
}

impl Attention {
    /// Offset of query `(b, i, h)` in `q`/`out` `[B,Tq,H,D]`.
    pub fn q_at(&self, b: usize, i: usize, h: usize) -> usize {
        ((b * self.tq + i) * self.heads + h) * self.d
    }

    /// Offset of key/value `(b, j, g)` in `[B,Tc,K,D]`.
    pub fn kv_at(&self, b: usize, j: usize, g: usize) -> usize {
        ((b * self.tc + j) * self.kv_heads + g) * self.d
    }

    /// The keys query `i` of a sequence starting at `first` attends to (empty for a pad query).
    pub fn keys(&self, i: usize, first: usize) -> std::ops::Range<usize> {
        first..self.tk - self.tq + i + 1
    }

    fn probabilities(&self, q: &[f64], k: &[f64], b: usize, i: usize, h: usize, first: usize) -> Vec<f64> {
        let (g, scale) = (h / (self.heads / self.kv_heads), 1.0 / (self.d as f64).sqrt());
        let qi = &q[self.q_at(b, i, h)..][..self.d];
        let scores: Vec<f64> = self
            .keys(i, first)
            .map(|j| qi.iter().zip(&k[self.kv_at(b, j, g)..][..self.d]).map(|(x, y)| x * y).sum::<f64>() * scale)
            .collect();
        let max = scores.iter().copied().fold(f64::NEG_INFINITY, f64::max);
        let sum: f64 = scores.iter().map(|s| (s - max).exp()).sum();
        scores.iter().map(|s| (s - max).exp() / sum).collect()
    }
}

/// Causal GQA attention in f64: `(out[B,Tq,H,D], lse[B,H,Tq])`, pad queries zero and −∞.
pub fn attention(a: &Attention, q: &[f64], k: &[f64], v: &[f64], starts: &[usize]) -> (Vec<f64>, Vec<f64>) {
    let (mut out, mut lse) = (vec![0.0; a.b * a.tq * a.heads * a.d], vec![f64::NEG_INFINITY; a.b * a.heads * a.tq]);
    let scale = 1.0 / (a.d as f64).sqrt();
    for b in 0..a.b {
        for h in 0..a.heads {
            let g = h / (a.heads / a.kv_heads);
            for i in 0..a.tq {
                let keys = a.keys(i, starts[b]);
                if keys.is_empty() {
                    continue;
                }
                let qi = &q[a.q_at(b, i, h)..][..a.d];
                let scores: Vec<f64> = keys
                    .clone()
                    .map(|j| qi.iter().zip(&k[a.kv_at(b, j, g)..][..a.d]).map(|(x, y)| x * y).sum::<f64>() * scale)
                    .collect();
                let max = scores.iter().copied().fold(f64::NEG_INFINITY, f64::max);
                let sum: f64 = scores.iter().map(|s| (s - max).exp()).sum();
                lse[(b * a.heads + h) * a.tq + i] = max + sum.ln();
                let o = &mut out[a.q_at(b, i, h)..][..a.d];
                for (j, s) in keys.zip(&scores) {
                    let p = (s - max).exp() / sum;
                    for (oc, vc) in o.iter_mut().zip(&v[a.kv_at(b, j, g)..][..a.d]) {
                        *oc += p * vc;
                    }
                }
            }
        }
    }
    (out, lse)
}

/// Gradients of `Σ dout·out` with respect to `q`, `k` and `v`, with the magnitudes each sums
/// (what f32 rounds relative to): `((dq, dk, dv), (|dq|, |dk|, |dv|) scales)`. `out` is the
/// forward's output as the kernel sees it (its `δ_i = Σ dout·out` uses it).
#[allow(clippy::type_complexity)]
pub fn attention_backward(
    a: &Attention,
    (q, k, v): (&[f64], &[f64], &[f64]),
    out: &[f64],
    dout: &[f64],
    starts: &[usize],
) -> ([Vec<f64>; 3], [Vec<f64>; 3]) {
    let (mut grads, mut scales) = ([q, k, v].map(|x| vec![0.0; x.len()]), [q, k, v].map(|x| vec![0.0; x.len()]));
    let scale = 1.0 / (a.d as f64).sqrt();
    for (b, &first) in starts.iter().enumerate().take(a.b) {
        for h in 0..a.heads {
            let g = h / (a.heads / a.kv_heads);
            for i in 0..a.tq {
                let keys = a.keys(i, first);
                if keys.is_empty() {
                    continue;
                }
                let p = a.probabilities(q, k, b, i, h, first);
                let qo = a.q_at(b, i, h);
                let delta: f64 = (0..a.d).map(|c| dout[qo + c] * out[qo + c]).sum();
                // The dot products' own terms, not their sums, size their f32 rounding: a
                // query with one key has `dp = delta` exactly, where a kernel summing in
                // another order is off by the terms' size.
                let delta_mag: f64 = (0..a.d).map(|c| (dout[qo + c] * out[qo + c]).abs()).sum();
                for (j, &pj) in keys.zip(&p) {
                    let ko = a.kv_at(b, j, g);
                    let dp: f64 = (0..a.d).map(|c| dout[qo + c] * v[ko + c]).sum();
                    let dp_mag: f64 = (0..a.d).map(|c| (dout[qo + c] * v[ko + c]).abs()).sum();
                    let (ds, ds_mag) = (pj * (dp - delta), pj * (dp_mag + delta_mag));
                    for c in 0..a.d {
                        grads[0][qo + c] += scale * ds * k[ko + c];
                        scales[0][qo + c] += scale * ds_mag * k[ko + c].abs();
                        grads[1][ko + c] += scale * ds * q[qo + c];
                        scales[1][ko + c] += scale * ds_mag * q[qo + c].abs();
                        grads[2][ko + c] += pj * dout[qo + c];
                        scales[2][ko + c] += pj * dout[qo + c].abs();
                    }
                }
            }
        }
    }
    (grads, scales)
}
