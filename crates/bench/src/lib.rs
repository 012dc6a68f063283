//! Nereus's harnesses: the benchmarks behind `nereus bench …` ([`bench`]), the self-tests
//! behind `nereus selftest …` ([`selftest`]) and the heap meter the planner benchmark reads
//! ([`alloc_meter`]). Products of their own, but not the runtime: the production binary calls
//! into this crate only for those commands.

pub mod alloc_meter;
pub mod bench;
pub mod selftest;

use nereus_core::config::DeviceChoice;

/// `--device[=KIND]`: device-resident state over the GPU data plane.
#[derive(clap::Args, Debug, Clone)]
pub struct DeviceArg {
    /// Keep shards in device memory and move them over NCCL/RCCL: `auto` (the backend this
    /// binary has; the default when the flag has no value), `cuda`, `rocm`, or `emulated` (host
    /// memory posing as a device over MPI, to test the device path without a GPU).
    #[arg(long, value_name = "KIND", num_args = 0..=1, default_missing_value = "auto")]
    pub device: Option<DeviceChoice>,
}
