//! The host's linear algebra: the scalar type of the reference engine (`f32` for training, `f64`
//! for finite-difference checks) and the matrix product, which the host engine's linear layers and
//! the emulated device's GEMMs share. Products go through the `gemm` crate, single-threaded (one
//! core per MPI rank):
//! measured on this machine's shapes it ran 8–15% faster than `matrixmultiply`, and clearly
//! faster with a transposed operand (`docs/engine.md`); everything else is plain loops.

use std::fmt::Debug;

use std::iter::Sum;
use std::ops::{Add, AddAssign, Div, Mul, MulAssign, Neg, Sub, SubAssign};

/// A floating-point scalar the engine's layers are written over.
pub trait Real:
    Copy
    + Debug
    + Default
    + PartialOrd
    + Send
    + Sync
    + 'static
    + Add<Output = Self>
    + Sub<Output = Self>
    + Mul<Output = Self>
    + Div<Output = Self>
    + Neg<Output = Self>
    + AddAssign
    + SubAssign
    + MulAssign
    + Sum
{
    /// Zero.
    const ZERO: Self;
    /// One.
    const ONE: Self;
    /// The value nearest `x`.
    fn of(x: f64) -> Self;
    /// As `f64`.
    fn to_f64(self) -> f64;
    /// `e^self`.
    fn exp(self) -> Self;
    /// Natural logarithm.
    fn ln(self) -> Self;
    /// Square root.
    fn sqrt(self) -> Self;
    /// The larger of two values.
    fn max(self, other: Self) -> Self;
    /// Sine and cosine.
    fn sin_cos(self) -> (Self, Self);
    /// `C[m,n] = α·A[m,k]·B[k,n] + β·C` over strided operands (row stride, column stride).
    ///
    /// # Safety
    /// The pointers and strides must describe valid, non-overlapping (for `c`) matrices.
    #[allow(clippy::too_many_arguments)]
    unsafe fn gemm_raw(
        m: usize,
        k: usize,
        n: usize,
        alpha: Self,
        a: *const Self,
        rsa: isize,
        csa: isize,
        b: *const Self,
        rsb: isize,
        csb: isize,
        beta: Self,
        c: *mut Self,
        rsc: isize,
        csc: isize,
    );
}

macro_rules! impl_real {
    ($t:ty) => {
        impl Real for $t {
            const ZERO: Self = 0.0;
            const ONE: Self = 1.0;
            fn of(x: f64) -> Self {
                x as $t
            }
            fn to_f64(self) -> f64 {
                self as f64
            }
            fn exp(self) -> Self {
                <$t>::exp(self)
            }
            fn ln(self) -> Self {
                <$t>::ln(self)
            }
            fn sqrt(self) -> Self {
                <$t>::sqrt(self)
            }
            fn max(self, other: Self) -> Self {
                <$t>::max(self, other)
            }
            fn sin_cos(self) -> (Self, Self) {
                <$t>::sin_cos(self)
            }
            unsafe fn gemm_raw(
                m: usize,
                k: usize,
                n: usize,
                alpha: Self,
                a: *const Self,
                rsa: isize,
                csa: isize,
                b: *const Self,
                rsb: isize,
                csb: isize,
                beta: Self,
                c: *mut Self,
                rsc: isize,
                csc: isize,
            ) {
                // gemm computes `dst = α'·dst + β'·lhs·rhs`, column stride before row stride.
                gemm::gemm(
                    m,
                    n,
                    k,
                    c,
                    csc,
                    rsc,
                    beta != 0.0,
                    a,
                    csa,
                    rsa,
                    b,
                    csb,
                    rsb,
                    beta,
                    alpha,
                    false,
                    false,
                    false,
                    gemm::Parallelism::None,
                )
            }
        }
    };
}

impl_real!(f32);
impl_real!(f64);

/// Whether an operand of [`matmul`] is used as stored or transposed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Op {
    /// As stored (row-major `[rows, cols]`).
    N,
    /// Transposed.
    T,
}

/// `C[m,n] (+)= op(A)·op(B)`, every matrix row-major and contiguous: `A` is stored `[m,k]`
/// (`Op::N`) or `[k,m]` (`Op::T`), `B` is `[k,n]` or `[n,k]`. `accumulate` adds to `C`.
#[allow(clippy::too_many_arguments)]
pub fn matmul<T: Real>(
    c: &mut [T],
    a: &[T],
    op_a: Op,
    b: &[T],
    op_b: Op,
    m: usize,
    k: usize,
    n: usize,
    accumulate: bool,
) {
    assert!(
        c.len() == m * n && a.len() == m * k && b.len() == k * n,
        "matmul shapes: c {} a {} b {} for m={m} k={k} n={n}",
        c.len(),
        a.len(),
        b.len()
    );
    if m == 0 || n == 0 {
        return;
    }
    let (rsa, csa) = match op_a {
        Op::N => (k as isize, 1),
        Op::T => (1, m as isize),
    };
    let (rsb, csb) = match op_b {
        Op::N => (n as isize, 1),
        Op::T => (1, k as isize),
    };
    let beta = if accumulate { T::ONE } else { T::ZERO };
    {
        // SAFETY: the lengths were checked against the shapes above and `c` is a distinct slice.
        unsafe {
            T::gemm_raw(
                m,
                k,
                n,
                T::ONE,
                a.as_ptr(),
                rsa,
                csa,
                b.as_ptr(),
                rsb,
                csb,
                beta,
                c.as_mut_ptr(),
                n as isize,
                1,
            )
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn matmul_matches_the_definition_for_every_transpose() {
        let (m, k, n) = (3, 4, 5);
        let a: Vec<f64> = (0..m * k).map(|i| i as f64 * 0.5 - 2.0).collect();
        let b: Vec<f64> = (0..k * n).map(|i| (i as f64).sin()).collect();
        let at: Vec<f64> = (0..k * m).map(|i| a[(i % m) * k + i / m]).collect();
        let bt: Vec<f64> = (0..n * k).map(|i| b[(i % k) * n + i / k]).collect();
        let want: Vec<f64> = (0..m * n).map(|i| (0..k).map(|p| a[(i / n) * k + p] * b[p * n + i % n]).sum()).collect();
        for (aa, oa, bb, ob) in
            [(&a, Op::N, &b, Op::N), (&at, Op::T, &b, Op::N), (&a, Op::N, &bt, Op::T), (&at, Op::T, &bt, Op::T)]
        {
            let mut c = vec![1.0; m * n];
            matmul(&mut c, aa, oa, bb, ob, m, k, n, true);
            for (x, w) in c.iter().zip(&want) {
                assert!((x - 1.0 - w).abs() < 1e-12, "{oa:?}{ob:?}: {x} vs {w}");
            }
        }
    }
}
