//! The device engine's GEMMs: bf16 inputs, f32 accumulation, from the vendor library opened at
//! run time (cuBLAS on NVIDIA, hipBLAS on ROCm, as NCCL and RCCL are), and on the emulated device
//! from the host engine's `matmul` on the bf16 inputs widened to f32, rounded as a device stores
//! its output, so the emulated numerics are the devices'.
//!
//! Every matrix is row-major, as the engine stores them; the vendor libraries are column-major,
//! so a row-major `C = op(A)·op(B)` is issued as the column-major `Cᵀ = op(B)ᵀ·op(A)ᵀ`.

use super::linalg::{matmul, Op};

/// What the GEMM writes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GemmOut {
    /// bf16 (activations), overwriting `C` or adding to it (`bf16(C + op(A)·op(B))`, the sum
    /// in f32: input gradients that several layers feed).
    Bf16 {
        /// Add to `C` instead of overwriting it.
        accumulate: bool,
    },
    /// f32, overwriting `C` (`accumulate` false) or adding to it (weight gradients).
    F32 {
        /// Add to `C` instead of overwriting it.
        accumulate: bool,
    },
}

impl GemmOut {
    /// Whether `C` is added to (the libraries' `beta = 1`) rather than overwritten.
    pub fn accumulates(self) -> bool {
        match self {
            GemmOut::Bf16 { accumulate } | GemmOut::F32 { accumulate } => accumulate,
        }
    }

    /// Bytes of one element of `C`.
    pub fn bytes(self) -> usize {
        match self {
            GemmOut::Bf16 { .. } => 2,
            GemmOut::F32 { .. } => 4,
        }
    }
}

/// `C[m,n] (+)= op(A)·op(B)`: `A` stored `[m,k]` (`Op::N`) or `[k,m]` (`Op::T`), `B` `[k,n]` or
/// `[n,k]`, both bf16, contiguous and row-major.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Gemm {
    /// Rows of `C`.
    pub m: usize,
    /// The contracted dimension.
    pub k: usize,
    /// Columns of `C`.
    pub n: usize,
    /// How `A` is used.
    pub op_a: Op,
    /// How `B` is used.
    pub op_b: Op,
    /// What `C` holds.
    pub out: GemmOut,
}

impl Gemm {
    /// Multiply-adds (for TFLOP/s: twice this).
    pub fn macs(&self) -> u64 {
        (self.m * self.k * self.n) as u64
    }
}

/// The GEMM on host memory (the emulated device): bf16 widened to f32 exactly, accumulated in
/// f32 by the host engine's `matmul`, the output rounded to bf16 or kept in f32.
///
/// # Safety
/// `a`, `b` and `c` address host memory of the sizes `g` implies.
pub unsafe fn gemm_on_host(g: &Gemm, a: u64, b: u64, c: u64) {
    let widen = |addr: u64, len: usize| -> Vec<f32> {
        // SAFETY: the caller's contract.
        let bits = unsafe { std::slice::from_raw_parts(addr as *const u16, len) };
        bits.iter().map(|&h| nereus_core::half::bf16_to_f32(h)).collect()
    };
    let (a, b) = (widen(a, g.m * g.k), widen(b, g.k * g.n));
    match g.out {
        GemmOut::Bf16 { accumulate } => {
            // SAFETY: the caller's contract.
            let c = unsafe { std::slice::from_raw_parts_mut(c as *mut u16, g.m * g.n) };
            // As the libraries' epilogue: `C` widened, the product added in f32, rounded once.
            let mut out: Vec<f32> = if accumulate {
                c.iter().map(|&h| nereus_core::half::bf16_to_f32(h)).collect()
            } else {
                vec![0.0; g.m * g.n]
            };
            matmul(&mut out, &a, g.op_a, &b, g.op_b, g.m, g.k, g.n, accumulate);
            for (dst, v) in c.iter_mut().zip(&out) {
                *dst = nereus_core::half::f32_to_bf16(*v);
            }
        }
        GemmOut::F32 { accumulate } => {
            // SAFETY: the caller's contract.
            let c = unsafe { std::slice::from_raw_parts_mut(c as *mut f32, g.m * g.n) };
            matmul(c, &a, g.op_a, &b, g.op_b, g.m, g.k, g.n, accumulate);
        }
    }
}

#[cfg(any(feature = "cuda", feature = "rocm"))]
pub use vendor::*;

/// The vendor libraries (with a GPU backend compiled in).
#[cfg(any(feature = "cuda", feature = "rocm"))]
mod vendor {
    use std::ffi::c_void;

    use super::{Gemm, GemmOut};
    use crate::backend::library::LibrarySearch;
    use crate::backend::linalg::Op;
    use crate::backend::BackendError;

    /// A vendor BLAS's names and enumeration values (the parts of the ABI the engine uses).
    #[derive(Debug, Clone, Copy)]
    pub struct BlasAbi {
        /// Shown in errors: `cuBLAS` or `hipBLAS`.
        pub name: &'static str,
        /// Shared libraries tried in order.
        pub libraries: &'static [&'static str],
        /// Environment variable naming the library's path instead.
        pub env: &'static str,
        /// Symbols: create, destroy, set stream, strided-batched GEMM.
        pub symbols: [&'static str; 4],
        /// `(no transpose, transpose)`.
        pub ops: (i32, i32),
        /// `(bf16, f32)` data types.
        pub types: (i32, i32),
        /// The f32 compute type and the default algorithm.
        pub compute_and_algo: (i32, i32),
    }

    /// cuBLAS 12 (`cublasGemmStridedBatchedEx`: `CUDA_R_16BF` = 14, `CUDA_R_32F` = 0,
    /// `CUBLAS_COMPUTE_32F` = 68, `CUBLAS_GEMM_DEFAULT` = −1).
    pub const CUBLAS: BlasAbi = BlasAbi {
        name: "cuBLAS",
        libraries: &["libcublas.so.12", "libcublas.so.13", "libcublas.so"],
        env: "NEREUS_CUBLAS_LIBRARY",
        symbols: ["cublasCreate_v2", "cublasDestroy_v2", "cublasSetStream_v2", "cublasGemmStridedBatchedEx"],
        ops: (0, 1),
        types: (14, 0),
        compute_and_algo: (68, -1),
    };

    /// hipBLAS 2 (ROCm 6, LUMI's; `hipblasDatatype_t` compute type: `HIPBLAS_R_16B` = 168,
    /// `HIPBLAS_R_32F` = 151, `HIPBLAS_OP_N/T` = 111/112, `HIPBLAS_GEMM_DEFAULT` = 160). hipBLAS 3
    /// (ROCm 7) changed `hipblasGemmEx`'s types to `hipDataType` and `hipblasComputeType_t`.
    pub const HIPBLAS: BlasAbi = BlasAbi {
        name: "hipBLAS",
        // Not the unversioned name: hipBLAS 3 keeps the symbol with other enum types.
        libraries: &["libhipblas.so.2"],
        env: "NEREUS_HIPBLAS_LIBRARY",
        symbols: ["hipblasCreate", "hipblasDestroy", "hipblasSetStream", "hipblasGemmStridedBatchedEx"],
        ops: (111, 112),
        types: (168, 151),
        compute_and_algo: (151, 160),
    };

    type Create = unsafe extern "C" fn(*mut *mut c_void) -> i32;
    type Destroy = unsafe extern "C" fn(*mut c_void) -> i32;
    type SetStream = unsafe extern "C" fn(*mut c_void, *mut c_void) -> i32;
    /// `(handle, opA, opB, m, n, k, α, A, typeA, lda, strideA, B, typeB, ldb, strideB, β, C, typeC,
    /// ldc, strideC, batch, compute, algo)`, identical in cuBLAS and hipBLAS 2.
    type GemmStridedBatched = unsafe extern "C" fn(
        *mut c_void,
        i32,
        i32,
        i32,
        i32,
        i32,
        *const c_void,
        *const c_void,
        i32,
        i32,
        i64,
        *const c_void,
        i32,
        i32,
        i64,
        *const c_void,
        *mut c_void,
        i32,
        i32,
        i64,
        i32,
        i32,
        i32,
    ) -> i32;

    /// A vendor BLAS opened at run time, with one handle.
    pub struct VendorBlas {
        abi: BlasAbi,
        handle: *mut c_void,
        destroy: Destroy,
        set_stream: SetStream,
        gemm: GemmStridedBatched,
        _library: libloading::Library,
    }

    fn blas_error(abi: &BlasAbi, reason: String) -> BackendError {
        BackendError::Kernels { backend: abi.name, reason }
    }

    /// Opens the first library of `abi` that loads (or the one its environment variable names).
    pub fn open_library(abi: &BlasAbi) -> Result<libloading::Library, BackendError> {
        let search = LibrarySearch { name: abi.name, env: abi.env, sonames: abi.libraries };
        search.open().map(|opened| opened.library).map_err(|reason| blas_error(abi, reason))
    }

    /// Resolves every symbol the engine uses from `library` (what CI checks against the PyPI wheel).
    pub fn resolve_symbols(abi: &BlasAbi, library: &libloading::Library) -> Result<(), BackendError> {
        for symbol in abi.symbols {
            // SAFETY: only the address is taken.
            unsafe { library.get::<*const c_void>(symbol.as_bytes()) }
                .map_err(|e| blas_error(abi, format!("symbol {symbol}: {e}")))?;
        }
        Ok(())
    }

    impl VendorBlas {
        /// The BLAS in `cell`, opened (for `abi`) at the first call: a job that never multiplies
        /// never needs the library.
        pub fn opened(cell: &std::cell::OnceCell<VendorBlas>, abi: BlasAbi) -> Result<&VendorBlas, BackendError> {
            if cell.get().is_none() {
                let _ = cell.set(VendorBlas::open(abi)?);
            }
            Ok(cell.get().expect("set above"))
        }

        /// Opens the library of `abi` and creates a handle (on the current device).
        pub fn open(abi: BlasAbi) -> Result<VendorBlas, BackendError> {
            let library = open_library(&abi)?;
            resolve_symbols(&abi, &library)?;
            // SAFETY: the symbols were resolved above and have these C signatures (see the types).
            unsafe {
                let create = *library.get::<Create>(abi.symbols[0].as_bytes()).expect("resolved");
                let destroy = *library.get::<Destroy>(abi.symbols[1].as_bytes()).expect("resolved");
                let set_stream = *library.get::<SetStream>(abi.symbols[2].as_bytes()).expect("resolved");
                let gemm = *library.get::<GemmStridedBatched>(abi.symbols[3].as_bytes()).expect("resolved");
                let mut handle = std::ptr::null_mut();
                match create(&mut handle) {
                    0 => Ok(VendorBlas { abi, handle, destroy, set_stream, gemm, _library: library }),
                    status => Err(blas_error(&abi, format!("{} returned {status}", abi.symbols[0]))),
                }
            }
        }

        /// Enqueues `g` on `stream` (device addresses).
        ///
        /// # Safety
        /// `a`, `b`, `c` are device allocations of the sizes `g` implies; `stream` is live.
        pub unsafe fn gemm(&self, g: &Gemm, a: u64, b: u64, c: u64, stream: *mut c_void) -> Result<(), BackendError> {
            let abi = &self.abi;
            let status = (self.set_stream)(self.handle, stream);
            if status != 0 {
                return Err(blas_error(abi, format!("{} returned {status}", abi.symbols[2])));
            }
            let op = |o: Op| if o == Op::N { abi.ops.0 } else { abi.ops.1 };
            // Column-major Cᵀ[n,m] = op(B)ᵀ·op(A)ᵀ: B first; leading dimensions of the stored rows.
            let ld_b = if g.op_b == Op::N { g.n } else { g.k };
            let ld_a = if g.op_a == Op::N { g.k } else { g.m };
            let c_type = if matches!(g.out, GemmOut::Bf16 { .. }) { abi.types.0 } else { abi.types.1 };
            let beta = if g.out.accumulates() { 1.0f32 } else { 0.0 };
            let alpha = 1.0f32;
            let (compute, algo) = abi.compute_and_algo;
            let status = (self.gemm)(
                self.handle,
                op(g.op_b),
                op(g.op_a),
                g.n as i32,
                g.m as i32,
                g.k as i32,
                (&alpha as *const f32).cast(),
                b as *const c_void,
                abi.types.0,
                ld_b as i32,
                0,
                a as *const c_void,
                abi.types.0,
                ld_a as i32,
                0,
                (&beta as *const f32).cast(),
                c as *mut c_void,
                c_type,
                g.n as i32,
                0,
                1,
                compute,
                algo,
            );
            match status {
                0 => Ok(()),
                status => Err(blas_error(abi, format!("{} {g:?} returned {status}", abi.symbols[3]))),
            }
        }
    }

    impl Drop for VendorBlas {
        fn drop(&mut self) {
            // SAFETY: our handle, destroyed once.
            unsafe { (self.destroy)(self.handle) };
        }
    }
}
