//! RMSNorm (Zhang & Sennrich 2019) as in Llama: `y = x / sqrt(mean(x²) + ε) · w`, ε from
//! the model's config (`rms_norm_eps`: Llama 3 1e-5, Qwen3 1e-6).

use crate::engine::Real;

/// `y[N,C] = x · rstd · w` with `rstd[N] = 1/sqrt(mean(x²) + ε)` saved for the backward pass.
pub fn rmsnorm_forward<T: Real>(y: &mut [T], rstd: &mut [T], x: &[T], w: &[T], c: usize, eps: f64) {
    for ((yr, xr), r) in y.chunks_exact_mut(c).zip(x.chunks_exact(c)).zip(rstd.iter_mut()) {
        let ms = xr.iter().map(|&v| v * v).sum::<T>() / T::of(c as f64);
        *r = T::ONE / (ms + T::of(eps)).sqrt();
        for ((yv, &xv), &wv) in yr.iter_mut().zip(xr).zip(w) {
            *yv = xv * *r * wv;
        }
    }
}

/// `dx += rstd·w·dy − x·rstd³/C·Σ(w·dy·x)` and `dw += Σ_rows dy·x·rstd` (ε enters through the
/// saved `rstd` only: `∂rstd/∂x_i = −rstd³·x_i/C` whatever ε is).
pub fn rmsnorm_backward<T: Real>(dx: &mut [T], dw: &mut [T], dy: &[T], x: &[T], w: &[T], rstd: &[T], c: usize) {
    let rows = dx.chunks_exact_mut(c).zip(dy.chunks_exact(c)).zip(x.chunks_exact(c)).zip(rstd);
    for (((dxr, dyr), xr), &r) in rows {
        let dot = dyr.iter().zip(xr).zip(w).map(|((&g, &xv), &wv)| g * wv * xv).sum::<T>();
        let k = dot * r * r * r / T::of(c as f64);
        for i in 0..c {
            dxr[i] += r * w[i] * dyr[i] - xr[i] * k;
            dw[i] += dyr[i] * xr[i] * r;
        }
    }
}
