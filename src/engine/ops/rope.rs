//! Rotary position embeddings (Su et al. 2021) in Hugging Face's "rotate half" form: channel
//! `i < D/2` pairs with `i + D/2` and both turn by `pos · θ^(−2i/D)`.

use crate::engine::Real;

/// Base θ of the rotary frequencies (Llama 2's 10,000; Llama 3 uses 500,000 with scaling,
/// which the tiny CPU models do not need).
pub const ROPE_THETA: f64 = 10_000.0;

/// Cosine and sine tables for positions `0..max_positions` and head width `D`.
#[derive(Debug, Clone)]
pub struct Rope<T> {
    half: usize,
    cos: Vec<T>,
    sin: Vec<T>,
}

impl<T: Real> Rope<T> {
    /// Tables for `max_positions` positions of heads `d` wide (`d` even).
    pub fn new(max_positions: usize, d: usize) -> Rope<T> {
        let half = d / 2;
        let mut cos = Vec::with_capacity(max_positions * half);
        let mut sin = Vec::with_capacity(max_positions * half);
        for pos in 0..max_positions {
            for i in 0..half {
                let angle = pos as f64 * ROPE_THETA.powf(-2.0 * i as f64 / d as f64);
                cos.push(T::of(angle.cos()));
                sin.push(T::of(angle.sin()));
            }
        }
        Rope { half, cos, sin }
    }

    /// Positions the tables cover.
    pub fn max_positions(&self) -> usize {
        self.cos.len() / self.half.max(1)
    }

    /// Rotates `x[B,T,H,D]` in place, position of `(b, t)` being `pos0 + t`; `inverse` turns
    /// the other way, which is the backward pass (a rotation's transpose is its inverse).
    pub fn apply(&self, x: &mut [T], t: usize, heads: usize, pos0: usize, inverse: bool) {
        let (half, d) = (self.half, 2 * self.half);
        for (row, xr) in x.chunks_exact_mut(heads * d).enumerate() {
            let pos = pos0 + row % t;
            let (cos, sin) = (&self.cos[pos * half..(pos + 1) * half], &self.sin[pos * half..(pos + 1) * half]);
            for head in xr.chunks_exact_mut(d) {
                for i in 0..half {
                    let s = if inverse { -sin[i] } else { sin[i] };
                    let (a, b) = (head[i], head[i + half]);
                    head[i] = a * cos[i] - b * s;
                    head[i + half] = b * cos[i] + a * s;
                }
            }
        }
    }
}
