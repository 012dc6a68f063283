//! Rotary position embeddings (Su et al. 2021) in Hugging Face's "rotate half" form: channel
//! `i < D/2` pairs with `i + D/2` and both turn by `pos · ω_i`, with `ω_i = θ^(−2i/D)`
//! (θ from the model's config) or, under Llama 3.1's `llama3` scaling, `ω_i` rescaled by its
//! wavelength (transformers' `_compute_llama3_parameters`).

use std::f64::consts::PI;

use crate::engine::Real;
use nereus_core::config::RopeScaling;

/// The rotation frequencies `ω_i`, `i < D/2`, of heads `d` wide: `θ^(−2i/D)`, then scaled.
///
/// `llama3`: with `L` the original context, a frequency whose wavelength `2π/ω` is shorter
/// than `L / high_freq_factor` is kept, one longer than `L / low_freq_factor` is divided by
/// `factor`, and one in between is interpolated:
/// `ω' = (1 − s)·ω/factor + s·ω` with `s = (L/λ − low_freq_factor) / (high_freq_factor − low_freq_factor)`.
pub fn frequencies(d: usize, theta: f64, scaling: Option<&RopeScaling>) -> Vec<f64> {
    let base = (0..d / 2).map(|i| theta.powf(-2.0 * i as f64 / d as f64));
    match scaling {
        None => base.collect(),
        Some(&RopeScaling::Llama3 { factor, low_freq_factor, high_freq_factor, original_max_position_embeddings }) => {
            let context = f64::from(original_max_position_embeddings);
            let (long, short) = (context / low_freq_factor, context / high_freq_factor);
            base.map(|w| {
                let wavelength = 2.0 * PI / w;
                if wavelength < short {
                    w
                } else if wavelength > long {
                    w / factor
                } else {
                    let s = (context / wavelength - low_freq_factor) / (high_freq_factor - low_freq_factor);
                    (1.0 - s) * w / factor + s * w
                }
            })
            .collect()
        }
    }
}

/// How the fused projection's rows are read by [`Rope::split_qkv`] and [`Rope::merge_qkv`]
/// (and the engine's `Compute::qkv_split` and `qkv_merge`): `N = B·T` rows, each its `heads`
/// query heads, then its `kv_heads` key heads, then its `kv_heads` value heads.
#[derive(Debug, Clone, Copy)]
pub struct QkvLayout {
    /// Positions per sequence in the call.
    pub t: usize,
    /// Position of each sequence's first row.
    pub pos0: usize,
    /// Query heads `H`.
    pub heads: usize,
    /// Key/value heads `K`.
    pub kv_heads: usize,
    /// Whether q and k are rotated here (not for a model with q/k-norms: it rotates after them).
    pub rotate: bool,
    /// Where k and v go into a KV cache: its positions per sequence (a split only).
    pub kv_t_cap: Option<usize>,
}

/// Cosine and sine tables for positions `0..max_positions` and head width `D`.
#[derive(Debug, Clone)]
pub struct Rope<T> {
    half: usize,
    cos: Vec<T>,
    sin: Vec<T>,
}

impl<T: Real> Rope<T> {
    /// Tables for `max_positions` positions of heads `d` wide (`d` even), base `theta`,
    /// frequencies scaled by `scaling` (see [`frequencies`]).
    pub fn new(max_positions: usize, d: usize, theta: f64, scaling: Option<&RopeScaling>) -> Rope<T> {
        let half = d / 2;
        let omega = frequencies(d, theta, scaling);
        let mut cos = Vec::with_capacity(max_positions * half);
        let mut sin = Vec::with_capacity(max_positions * half);
        for pos in 0..max_positions {
            for &w in &omega {
                let angle = pos as f64 * w;
                cos.push(T::of(angle.cos()));
                sin.push(T::of(angle.sin()));
            }
        }
        Rope { half, cos, sin }
    }

    /// The cosine and sine tables, `[positions, D/2]` each.
    pub fn tables(&self) -> (&[T], &[T]) {
        (&self.cos, &self.sin)
    }

    /// `D/2`.
    pub fn half(&self) -> usize {
        self.half
    }

    /// Positions the tables cover.
    pub fn max_positions(&self) -> usize {
        self.cos.len() / self.half.max(1)
    }

    /// Splits `qkv[N, (H+2K)·D]` into `q[N, H·D]` and `k, v` (`[N, K·D]`, or a KV cache's rows
    /// `[B, T_cap, K·D]` at positions `pos0 + t`), rotating q and k where `l.rotate` says so.
    pub fn split_qkv(&self, (q, k, v): (&mut [T], &mut [T], &mut [T]), qkv: &[T], l: QkvLayout) {
        let (qw, kw) = (l.heads * 2 * self.half, l.kv_heads * 2 * self.half);
        for (row, fused) in qkv.chunks_exact(qw + 2 * kw).enumerate() {
            let pos = l.pos0 + row % l.t;
            let kv_row = l.kv_t_cap.map_or(row, |t_cap| row / l.t * t_cap + pos);
            let (qr, kr) = (&mut q[row * qw..][..qw], &mut k[kv_row * kw..][..kw]);
            qr.copy_from_slice(&fused[..qw]);
            kr.copy_from_slice(&fused[qw..qw + kw]);
            v[kv_row * kw..][..kw].copy_from_slice(&fused[qw + kw..]);
            if l.rotate {
                self.apply(qr, 1, l.heads, pos, false);
                self.apply(kr, 1, l.kv_heads, pos, false);
            }
        }
    }

    /// The backward of [`Rope::split_qkv`] (no cache): `dqkv` written whole from `dq, dk, dv`,
    /// `dq` and `dk` rotated back where `l.rotate` says so.
    pub fn merge_qkv(&self, dqkv: &mut [T], (dq, dk, dv): (&[T], &[T], &[T]), l: QkvLayout) {
        let (qw, kw) = (l.heads * 2 * self.half, l.kv_heads * 2 * self.half);
        for (row, fused) in dqkv.chunks_exact_mut(qw + 2 * kw).enumerate() {
            let pos = l.pos0 + row % l.t;
            let (fq, rest) = fused.split_at_mut(qw);
            let (fk, fv) = rest.split_at_mut(kw);
            fq.copy_from_slice(&dq[row * qw..][..qw]);
            fk.copy_from_slice(&dk[row * kw..][..kw]);
            fv.copy_from_slice(&dv[row * kw..][..kw]);
            if l.rotate {
                self.apply(fq, 1, l.heads, pos, true);
                self.apply(fk, 1, l.kv_heads, pos, true);
            }
        }
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
