//! The SwiGLU gate of the MLP (Shazeer 2020): `h = silu(g) · u`, `silu(g) = g·σ(g)`.

use crate::engine::Real;

fn sigmoid<T: Real>(x: T) -> T {
    T::ONE / (T::ONE + (-x).exp())
}

/// `h[N,F] = silu(g) · u`.
pub fn swiglu_forward<T: Real>(h: &mut [T], g: &[T], u: &[T]) {
    for ((hv, &gv), &uv) in h.iter_mut().zip(g).zip(u) {
        *hv = gv * sigmoid(gv) * uv;
    }
}

/// `dg += dh·u·σ(g)(1 + g(1 − σ(g)))`, `du += dh·silu(g)`.
pub fn swiglu_backward<T: Real>(dg: &mut [T], du: &mut [T], dh: &[T], g: &[T], u: &[T]) {
    for i in 0..dh.len() {
        let s = sigmoid(g[i]);
        dg[i] += dh[i] * u[i] * s * (T::ONE + g[i] * (T::ONE - s));
        du[i] += dh[i] * g[i] * s;
    }
}
