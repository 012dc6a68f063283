//! Device backends, split like candle's: the `cuda` and `rocm` features compile the real ones;
//! without them the same API exists and answers with [`BackendError::NotCompiled`], so the
//! default build, and every test, runs on a CPU-only machine.
//!
//! `gpu.rs` is the seam the GPU data plane and the device shard store use ([`gpu::GpuRuntime`],
//! [`gpu::Device`]); `cuda.rs` and `rocm.rs` implement it over the CUDA driver and the HIP
//! runtime, `emulated.rs` in host memory over the grid emulator. The kernels themselves, their
//! typed ids and argument structs and their launch geometry are the `nereus-kernels` crate's.

pub mod blas;
mod cache;
#[cfg(feature = "cuda")]
pub mod cuda;
pub mod emulated;
pub mod gpu;
#[cfg(any(feature = "cuda", feature = "rocm"))]
pub mod library;
pub mod linalg;
#[cfg(feature = "cuda")]
pub mod nvrtc;
pub mod profile;
mod recording;
#[cfg(feature = "rocm")]
pub mod rocm;
pub mod runtime;
mod staging;

use serde::{Deserialize, Serialize};
use thiserror::Error;

use nereus_core::config::DataPlane;

/// A device as its driver reports it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct DriverDevice {
    /// Ordinal among the devices visible to this process.
    pub ordinal: u32,
    /// Name reported by the driver.
    pub name: String,
    /// Total device memory in bytes.
    pub memory_bytes: u64,
}

/// Why a device backend cannot serve a request.
#[derive(Debug, Error)]
pub enum BackendError {
    /// The binary was built without the feature that backend needs.
    #[error("{what} needs {backend}, but this binary was not compiled with {backend} support; rebuild with `cargo build --release --features {feature}`")]
    NotCompiled {
        /// What was asked for, e.g. `data plane nccl`.
        what: String,
        /// `CUDA` or `ROCm`.
        backend: &'static str,
        /// The cargo feature.
        feature: &'static str,
    },
    /// The binary has the backend, but this machine shows it no device to use.
    #[error("no {backend} device visible: {reason}")]
    NoDevice {
        /// `CUDA` or `ROCm`.
        backend: &'static str,
        /// Why: no driver library, no device, or the assigned one is missing.
        reason: String,
    },
    /// The driver library is missing or returned an error.
    #[error("{backend} driver: {reason}")]
    Driver {
        /// `CUDA`, `ROCm` or `emulated`.
        backend: &'static str,
        /// The driver's message.
        reason: String,
    },
    /// The kernels cannot be compiled, loaded or launched.
    #[error("{backend} kernels: {reason}")]
    Kernels {
        /// `CUDA`, `ROCm` or `grid emulator`.
        backend: &'static str,
        /// The compiler's, loader's or emulator's message.
        reason: String,
    },
}

impl BackendError {
    /// Whether the user can fix this by rebuilding or choosing another machine (exit status 2),
    /// rather than a driver failing at run time.
    pub fn is_usage(&self) -> bool {
        matches!(self, BackendError::NotCompiled { .. } | BackendError::NoDevice { .. })
    }
}

impl From<nereus_kernels::grid::GridError> for BackendError {
    fn from(e: nereus_kernels::grid::GridError) -> Self {
        BackendError::Kernels { backend: "grid emulator", reason: e.0 }
    }
}

/// Checks that this binary can drive `plane`; MPI always can.
pub fn check_data_plane(plane: DataPlane) -> Result<(), BackendError> {
    let what = || {
        format!(
            "data plane `{}`",
            serde_json::to_value(plane).ok().and_then(|v| v.as_str().map(String::from)).unwrap_or_default()
        )
    };
    match plane {
        DataPlane::Mpi => Ok(()),
        DataPlane::Nccl if cfg!(feature = "cuda") => Ok(()),
        DataPlane::Rccl if cfg!(feature = "rocm") => Ok(()),
        DataPlane::Nccl => Err(BackendError::NotCompiled { what: what(), backend: "CUDA", feature: "cuda" }),
        DataPlane::Rccl => Err(BackendError::NotCompiled { what: what(), backend: "ROCm", feature: "rocm" }),
    }
}

/// CUDA devices visible to this process, from the CUDA driver.
pub fn cuda_devices() -> Result<Vec<DriverDevice>, BackendError> {
    #[cfg(feature = "cuda")]
    return cuda::devices();
    #[cfg(not(feature = "cuda"))]
    Err(BackendError::NotCompiled { what: "CUDA device discovery".into(), backend: "CUDA", feature: "cuda" })
}

/// HIP devices visible to this process, from the HIP runtime.
pub fn rocm_devices() -> Result<Vec<DriverDevice>, BackendError> {
    #[cfg(feature = "rocm")]
    return rocm::devices();
    #[cfg(not(feature = "rocm"))]
    Err(BackendError::NotCompiled { what: "ROCm device discovery".into(), backend: "ROCm", feature: "rocm" })
}

/// The backends compiled into this binary, e.g. `mpi, cuda`.
pub fn compiled_backends() -> &'static str {
    match (cfg!(feature = "cuda"), cfg!(feature = "rocm")) {
        (true, true) => "mpi, cuda (nccl), rocm",
        (true, false) => "mpi, cuda (nccl)",
        (false, true) => "mpi, rocm",
        (false, false) => "mpi",
    }
}

/// CI sets `NEREUS_REQUIRE_KERNEL_TOOLS=1` so that missing kernel tools fail a test instead of
/// skipping its check.
#[cfg(all(test, any(feature = "cuda", feature = "rocm")))]
pub(crate) fn tools_required() -> bool {
    std::env::var("NEREUS_REQUIRE_KERNEL_TOOLS").is_ok_and(|v| v == "1")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mpi_always_works_and_gpu_planes_need_their_feature() {
        assert!(check_data_plane(DataPlane::Mpi).is_ok());
        assert_eq!(check_data_plane(DataPlane::Nccl).is_ok(), cfg!(feature = "cuda"));
        assert_eq!(check_data_plane(DataPlane::Rccl).is_ok(), cfg!(feature = "rocm"));
        if let Err(e) = check_data_plane(DataPlane::Nccl) {
            assert!(e.to_string().contains("--features cuda"), "{e}");
        }
    }
}
