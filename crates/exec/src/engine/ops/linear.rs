//! Linear layer without bias, Hugging Face weight layout `W[out, in]`.

use crate::backend::linalg::{matmul, Op, Real};
use crate::engine::timers::timed;
use nereus_core::cost::OpClass;

/// `y[N,out] = x[N,in] · W[out,in]ᵀ`.
pub fn linear_forward<T: Real>(y: &mut [T], x: &[T], w: &[T], n: usize, inp: usize, out: usize) {
    timed(OpClass::Gemm, || matmul(y, x, Op::N, w, Op::T, n, inp, out, false));
}

/// `dx[N,in] += dy · W` (when `dx` is given) and `dW[out,in] += dyᵀ · x`.
#[allow(clippy::too_many_arguments)]
pub fn linear_backward<T: Real>(
    dx: Option<&mut [T]>,
    dw: &mut [T],
    dy: &[T],
    x: &[T],
    w: &[T],
    n: usize,
    inp: usize,
    out: usize,
) {
    if let Some(dx) = dx {
        linear_input_grad(dx, dy, w, n, inp, out);
    }
    timed(OpClass::Gemm, || matmul(dw, dy, Op::T, x, Op::N, out, n, inp, true));
}

/// `dx[N,in] += dy · W`.
pub fn linear_input_grad<T: Real>(dx: &mut [T], dy: &[T], w: &[T], n: usize, inp: usize, out: usize) {
    timed(OpClass::Gemm, || matmul(dx, dy, Op::N, w, Op::N, n, out, inp, true));
}
