//! Vocabulary-parallel token embedding: this rank holds rows `v0..v0+V` of `W[vocab, C]`;
//! tokens outside them contribute zeros, and the TP all-reduce that follows completes the row.

use crate::engine::Real;

/// `out[N,C] = W[token − v0]` for tokens this rank holds, zero otherwise.
pub fn embedding_forward<T: Real>(out: &mut [T], tokens: &[u32], w: &[T], v0: usize, c: usize) {
    let v = w.len() / c;
    for (row, &tok) in out.chunks_exact_mut(c).zip(tokens) {
        match (tok as usize).checked_sub(v0).filter(|&i| i < v) {
            Some(i) => row.copy_from_slice(&w[i * c..(i + 1) * c]),
            None => row.fill(T::ZERO),
        }
    }
}

/// `dW[token − v0] += dy` for tokens this rank holds.
pub fn embedding_backward<T: Real>(dw: &mut [T], dy: &[T], tokens: &[u32], v0: usize, c: usize) {
    let v = dw.len() / c;
    for (row, &tok) in dy.chunks_exact(c).zip(tokens) {
        if let Some(i) = (tok as usize).checked_sub(v0).filter(|&i| i < v) {
            for (d, &g) in dw[i * c..(i + 1) * c].iter_mut().zip(row) {
                *d += g;
            }
        }
    }
}
