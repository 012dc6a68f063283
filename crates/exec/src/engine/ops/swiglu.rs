//! The SwiGLU gate of the MLP (Shazeer 2020): `h = silu(g) · u`, `silu(g) = g·σ(g)`, on the
//! fused gate/up product: `gu[N, 2F]` is one GEMM over the adjacent `gate_proj` and `up_proj`
//! weights, each row its gate (columns `0..F`) then its up (`F..2F`).

use crate::engine::Real;

fn sigmoid<T: Real>(x: T) -> T {
    T::ONE / (T::ONE + (-x).exp())
}

/// `h[N,F] = silu(g) · u` from `gu[N, 2F]`.
pub fn swiglu_forward<T: Real>(h: &mut [T], gu: &[T], f: usize) {
    for (hr, row) in h.chunks_exact_mut(f).zip(gu.chunks_exact(2 * f)) {
        let (g, u) = row.split_at(f);
        for ((hv, &gv), &uv) in hr.iter_mut().zip(g).zip(u) {
            *hv = gv * sigmoid(gv) * uv;
        }
    }
}

/// Into `dgu[N, 2F]`: `dg += dh·u·σ(g)(1 + g(1 − σ(g)))`, `du += dh·silu(g)`.
pub fn swiglu_backward<T: Real>(dgu: &mut [T], dh: &[T], gu: &[T], f: usize) {
    let rows = dgu.chunks_exact_mut(2 * f).zip(dh.chunks_exact(f)).zip(gu.chunks_exact(2 * f));
    for ((drow, dhr), row) in rows {
        let ((dg, du), (g, u)) = (drow.split_at_mut(f), row.split_at(f));
        for i in 0..f {
            let s = sigmoid(g[i]);
            dg[i] += dhr[i] * u[i] * s * (T::ONE + g[i] * (T::ONE - s));
            du[i] += dhr[i] * g[i] * s;
        }
    }
}
