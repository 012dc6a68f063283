//! How a run starts, beside its job file: where it resumes from (`--resume`) and which device
//! holds its state (`--device`).

use std::path::PathBuf;
use std::str::FromStr;

/// Where a resumed run starts from (`--resume`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ResumeFrom {
    /// This checkpoint directory.
    Dir(PathBuf),
    /// The newest complete checkpoint of the output directory; an error when there is none.
    Latest,
    /// The newest complete checkpoint if there is one, else a fresh start (batch scripts that
    /// requeue a preempted job).
    Auto,
}

impl FromStr for ResumeFrom {
    type Err = std::convert::Infallible;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Ok(match s {
            "latest" => ResumeFrom::Latest,
            "auto" => ResumeFrom::Auto,
            dir => ResumeFrom::Dir(dir.into()),
        })
    }
}

/// Which device `--device` (or `cluster.device`) asks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum DeviceChoice {
    /// The backend this binary has: CUDA, else ROCm.
    Auto,
    /// NVIDIA through the CUDA driver and NCCL.
    Cuda,
    /// AMD through HIP and RCCL.
    Rocm,
    /// Host memory posing as a device, NCCL's API over MPI: the device path on a CPU-only
    /// machine (tests; no speed to measure).
    Emulated,
}

crate::named_enum!(DeviceChoice { Auto => "auto", Cuda => "cuda", Rocm => "rocm", Emulated => "emulated" });
