//! Output heads: token log-probabilities from vocabulary-parallel logits, and a scalar value
//! head (`score.weight`, as Hugging Face's sequence-classification models).
//!
//! `log p(y) = z_y − log Σ_v e^{z_v}` is computed a vocabulary chunk at a time (the fused LM
//! head never holds more than one chunk of logits): each chunk is folded into running
//! per-row statistics. With the vocabulary split over TP ranks the ranks' statistics need three
//! reductions over the group: the maximum (for stability), the sum of exponentials, and `z_y`
//! (held by one rank). Every rank of the group ends with the same `log p`.

use super::TensorGroup;
use crate::engine::{EngineError, Real};

fn local_index(target: u32, v0: usize, v: usize) -> Option<usize> {
    (target as usize).checked_sub(v0).filter(|&i| i < v)
}

/// The rows' running statistics of the fused LM head: maximum, sum of exponentials relative
/// to it, target logit (see [`crate::engine::compute::LogitStats`]).
pub struct RowStats<'a, T> {
    /// Row maxima `[N]`.
    pub max: &'a mut [T],
    /// Sums of `exp(logit − max)` `[N]`.
    pub sum: &'a mut [T],
    /// Target logits `[N]`, −inf until the chunk holding the target.
    pub target: &'a mut [T],
}

/// Folds one vocabulary chunk `logits[N, W]` (the vocabulary's columns `col0..col0 + W`) into
/// the rows' statistics: the first chunk (`first`) starts them, later ones merge into them
/// (online softmax, Milakov & Gimelshein 2018: `max' = max(m, m_c)`, `sum' = sum·e^{m − max'}
/// + sum_c·e^{m_c − max'}`).
pub fn log_probs_fold<T: Real>(acc: RowStats<'_, T>, logits: &[T], targets: &[u32], col0: usize, first: bool) {
    let w = logits.len() / targets.len().max(1);
    for (n, row) in logits.chunks_exact(w).enumerate() {
        let m = row.iter().fold(T::of(f64::NEG_INFINITY), |a, &b| a.max(b));
        // The sum of exponentials is accumulated in f64: summed in order in f32, tens of
        // thousands of terms (a 49k–128k vocabulary) bias log p by about 1e-4.
        let s: f64 = row.iter().map(|&z| (z - m).exp().to_f64()).sum();
        let held = local_index(targets[n], col0, w).map(|i| row[i]);
        if first {
            (acc.max[n], acc.sum[n]) = (m, T::of(s));
            acc.target[n] = held.unwrap_or(T::of(f64::NEG_INFINITY));
            continue;
        }
        let merged = acc.max[n].max(m);
        let earlier = acc.sum[n].to_f64() * (acc.max[n] - merged).exp().to_f64();
        (acc.max[n], acc.sum[n]) = (merged, T::of(earlier + s * (m - merged).exp().to_f64()));
        if let Some(t) = held {
            acc.target[n] = t;
        }
    }
}

/// `lse[N]` and `logp[N] = target − lse` over the whole vocabulary from every rank's folded
/// statistics of its shard, combined over `tp`: `lse = M + ln Σ_r sum_r·e^{max_r − M}`, `M` the
/// group's maximum, the target's logit from the rank holding it (the identity on one rank).
pub fn log_probs_finish<T: Real, G: TensorGroup<T>>(
    lse: &mut [T],
    logp: &mut [T],
    acc: RowStats<'_, T>,
    tp: &G,
) -> Result<(), EngineError> {
    lse.copy_from_slice(acc.max);
    tp.max(lse)?;
    for ((s, &m), &g) in acc.sum.iter_mut().zip(acc.max.iter()).zip(lse.iter()) {
        *s *= (m - g).exp();
    }
    tp.sum(acc.sum)?;
    for (lp, &t) in logp.iter_mut().zip(acc.target.iter()) {
        *lp = if t.to_f64().is_finite() { t } else { T::ZERO };
    }
    tp.sum(logp)?;
    for ((l, lp), &s) in lse.iter_mut().zip(logp.iter_mut()).zip(acc.sum.iter()) {
        *l += s.ln();
        *lp -= *l;
    }
    Ok(())
}

/// In place, a chunk's `logits[N,W]` (columns `col0..col0 + W`) become their gradient
/// `dlogp[n] · (1[v = target_n] − exp(logits[n,v] − lse[n]))`.
pub fn log_probs_backward<T: Real>(logits: &mut [T], dlogp: &[T], lse: &[T], targets: &[u32], col0: usize) {
    let w = logits.len() / targets.len().max(1);
    for (n, row) in logits.chunks_exact_mut(w).enumerate() {
        for z in row.iter_mut() {
            *z = -dlogp[n] * (*z - lse[n]).exp();
        }
        if let Some(i) = local_index(targets[n], col0, w) {
            row[i] += dlogp[n];
        }
    }
}

/// `value[N] = x[N,C] · w[C]`.
pub fn value_forward<T: Real>(value: &mut [T], x: &[T], w: &[T]) {
    for (out, row) in value.iter_mut().zip(x.chunks_exact(w.len())) {
        *out = row.iter().zip(w).map(|(&a, &b)| a * b).sum();
    }
}

/// `dx += dvalue · w`, `dw += Σ dvalue · x`.
pub fn value_backward<T: Real>(dx: &mut [T], dw: &mut [T], dvalue: &[T], x: &[T], w: &[T]) {
    let c = w.len();
    for ((dxr, row), &g) in dx.chunks_exact_mut(c).zip(x.chunks_exact(c)).zip(dvalue) {
        for i in 0..c {
            dxr[i] += g * w[i];
            dw[i] += g * row[i];
        }
    }
}
