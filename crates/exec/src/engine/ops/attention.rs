//! Causal self-attention with grouped-query heads: query head `h` reads key/value head
//! `h / (H/K)`. Keys and values may live in a longer cache (`t_cap` positions per sequence),
//! of which the first `tk` are valid; query `i` sits at position `tk − tq + i`, so the same
//! code runs training (`tq = tk`) and one-token decoding against a KV cache (`tq = 1`).
//!
//! A left-padded sequence `b` starts at key `starts[b]`: keys before it are masked out, and a
//! query before it (a pad position) attends to nothing and outputs zero. RoPE scores depend on
//! position differences only, so a padded sequence's real tokens get the outputs they would get
//! unpadded. The backward pass needs no mask: masked probabilities are zero.

use crate::engine::timers::timed;
use crate::engine::Real;
use nereus_core::cost::OpClass;

/// The shapes of one attention call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AttentionShape {
    /// Sequences `B`.
    pub b: usize,
    /// Query positions `Tq`.
    pub tq: usize,
    /// Valid key positions `Tk ≥ Tq`.
    pub tk: usize,
    /// Positions per sequence in the key/value buffers (`≥ Tk`).
    pub t_cap: usize,
    /// Query heads `H` (local).
    pub heads: usize,
    /// Key/value heads `K` (local), dividing `H`.
    pub kv_heads: usize,
    /// Head width `D`.
    pub d: usize,
}

impl AttentionShape {
    fn q_at(&self, b: usize, i: usize, h: usize) -> usize {
        ((b * self.tq + i) * self.heads + h) * self.d
    }
    fn kv_at(&self, b: usize, j: usize, g: usize) -> usize {
        ((b * self.t_cap + j) * self.kv_heads + g) * self.d
    }
    fn p_at(&self, b: usize, h: usize, i: usize) -> usize {
        ((b * self.heads + h) * self.tq + i) * self.tk
    }
    fn group(&self, h: usize) -> usize {
        h / (self.heads / self.kv_heads)
    }
    fn scale<T: Real>(&self) -> T {
        T::ONE / T::of(self.d as f64).sqrt()
    }
}

fn dot<T: Real>(a: &[T], b: &[T]) -> T {
    a.iter().zip(b).map(|(&x, &y)| x * y).sum()
}

/// `out[B,Tq,H,D] = softmax(q·kᵀ/√D, causal)·v`, keys before `starts[b]` masked (`starts`
/// empty: none); the probabilities `probs[B,H,Tq,Tk]` are saved for the backward pass (zero
/// above the diagonal and before the start).
pub fn attention_forward<T: Real>(
    out: &mut [T],
    probs: &mut [T],
    q: &[T],
    k: &[T],
    v: &[T],
    s: AttentionShape,
    starts: &[usize],
) {
    timed(OpClass::Attention, || forward(out, probs, q, k, v, s, starts));
}

fn forward<T: Real>(out: &mut [T], probs: &mut [T], q: &[T], k: &[T], v: &[T], s: AttentionShape, starts: &[usize]) {
    let (d, scale) = (s.d, s.scale::<T>());
    for b in 0..s.b {
        let first = starts.get(b).copied().unwrap_or(0);
        for h in 0..s.heads {
            let g = s.group(h);
            for i in 0..s.tq {
                let last = s.tk - s.tq + i;
                let p = &mut probs[s.p_at(b, h, i)..s.p_at(b, h, i) + s.tk];
                let o = &mut out[s.q_at(b, i, h)..s.q_at(b, i, h) + d];
                p.fill(T::ZERO);
                o.fill(T::ZERO);
                if last < first {
                    continue; // a pad position: nothing to attend to
                }
                let qi = &q[s.q_at(b, i, h)..s.q_at(b, i, h) + d];
                let mut max = T::of(f64::NEG_INFINITY);
                for j in first..=last {
                    p[j] = dot(qi, &k[s.kv_at(b, j, g)..s.kv_at(b, j, g) + d]) * scale;
                    max = max.max(p[j]);
                }
                let mut sum = T::ZERO;
                for pj in &mut p[first..=last] {
                    *pj = (*pj - max).exp();
                    sum += *pj;
                }
                p[first..=last].iter_mut().for_each(|pj| *pj = *pj / sum);
                for (j, &pj) in p.iter().enumerate().take(last + 1).skip(first) {
                    for (ov, &vv) in o.iter_mut().zip(&v[s.kv_at(b, j, g)..s.kv_at(b, j, g) + d]) {
                        *ov += pj * vv;
                    }
                }
            }
        }
    }
}

/// Backward of [`attention_forward`] for `tq = tk = t_cap`: accumulates `dq`, `dk`, `dv`.
#[allow(clippy::too_many_arguments)]
pub fn attention_backward<T: Real>(
    dq: &mut [T],
    dk: &mut [T],
    dv: &mut [T],
    dout: &[T],
    q: &[T],
    k: &[T],
    v: &[T],
    probs: &[T],
    s: AttentionShape,
) {
    timed(OpClass::Attention, || backward(dq, dk, dv, dout, q, k, v, probs, s));
}

#[allow(clippy::too_many_arguments)]
fn backward<T: Real>(
    dq: &mut [T],
    dk: &mut [T],
    dv: &mut [T],
    dout: &[T],
    q: &[T],
    k: &[T],
    v: &[T],
    probs: &[T],
    s: AttentionShape,
) {
    let (d, scale) = (s.d, s.scale::<T>());
    let mut dp = vec![T::ZERO; s.tk];
    for b in 0..s.b {
        for h in 0..s.heads {
            let g = s.group(h);
            for i in 0..s.tq {
                let last = s.tk - s.tq + i;
                let p = &probs[s.p_at(b, h, i)..s.p_at(b, h, i) + s.tk];
                let (qa, doi) = (s.q_at(b, i, h), &dout[s.q_at(b, i, h)..s.q_at(b, i, h) + d]);
                for j in 0..=last {
                    let ka = s.kv_at(b, j, g);
                    dp[j] = dot(doi, &v[ka..ka + d]);
                    for (dvv, &g_out) in dv[ka..ka + d].iter_mut().zip(doi) {
                        *dvv += p[j] * g_out;
                    }
                }
                let mean = (0..=last).map(|j| p[j] * dp[j]).sum::<T>();
                for j in 0..=last {
                    let ds = p[j] * (dp[j] - mean) * scale;
                    let ka = s.kv_at(b, j, g);
                    for c in 0..d {
                        dq[qa + c] += ds * k[ka + c];
                        dk[ka + c] += ds * q[qa + c];
                    }
                }
            }
        }
    }
}
