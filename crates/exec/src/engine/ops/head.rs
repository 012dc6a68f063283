//! Output heads: token log-probabilities from vocabulary-parallel logits, and a scalar value
//! head (`score.weight`, as Hugging Face's sequence-classification models).
//!
//! With the vocabulary split over TP ranks, `log p(y) = z_y − log Σ_v e^{z_v}` needs three
//! reductions over the group: the maximum (for stability), the sum of exponentials, and `z_y`
//! (held by one rank, zero elsewhere). Every rank of the group ends with the same `log p`.

use super::TensorGroup;
use crate::engine::{EngineError, Real};

fn local_index(target: u32, v0: usize, v: usize) -> Option<usize> {
    (target as usize).checked_sub(v0).filter(|&i| i < v)
}

/// `logp[N] = logits[n, target_n] − logsumexp(logits[n, :])` over the whole vocabulary; this
/// rank holds columns `v0..v0+V` of `logits[N,V]`. Saves `lse[N]` for the backward pass.
pub fn log_probs_forward<T: Real, G: TensorGroup<T>>(
    logp: &mut [T],
    lse: &mut [T],
    logits: &[T],
    targets: &[u32],
    v0: usize,
    tp: &G,
) -> Result<(), EngineError> {
    let v = logits.len() / targets.len().max(1);
    for (m, row) in lse.iter_mut().zip(logits.chunks_exact(v)) {
        *m = row.iter().fold(T::of(f64::NEG_INFINITY), |a, &b| a.max(b));
    }
    tp.max(lse)?;
    // The sum of exponentials is accumulated in f64: summed in order in f32, tens of thousands
    // of terms (a 49k–128k vocabulary) bias log p by about 1e-4.
    let mut sums: Vec<T> = lse
        .iter()
        .zip(logits.chunks_exact(v))
        .map(|(&m, row)| T::of(row.iter().map(|&z| (z - m).exp().to_f64()).sum::<f64>()))
        .collect();
    tp.sum(&mut sums)?;
    for n in 0..targets.len() {
        logp[n] = local_index(targets[n], v0, v).map_or(T::ZERO, |i| logits[n * v + i]);
        lse[n] += sums[n].ln();
    }
    tp.sum(logp)?;
    for (lp, &m) in logp.iter_mut().zip(lse.iter()) {
        *lp -= m;
    }
    Ok(())
}

/// `dlogits[N,V] = dlogp[n] · (1[v = target_n] − softmax(logits)[n,v])` (overwrites).
pub fn log_probs_backward<T: Real>(
    dlogits: &mut [T],
    dlogp: &[T],
    logits: &[T],
    lse: &[T],
    targets: &[u32],
    v0: usize,
) {
    let v = logits.len() / targets.len().max(1);
    for n in 0..targets.len() {
        let (row, drow) = (&logits[n * v..(n + 1) * v], &mut dlogits[n * v..(n + 1) * v]);
        for (dz, &z) in drow.iter_mut().zip(row) {
            *dz = -dlogp[n] * (z - lse[n]).exp();
        }
        if let Some(i) = local_index(targets[n], v0, v) {
            drow[i] += dlogp[n];
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
