//! One file per command: its clap arguments and the function that runs it.

pub mod bench;
pub mod data;
pub mod inspect;
pub mod logprobs;
pub mod model;
pub mod plan;
pub mod reward;
pub mod selftest;
pub mod simulate;
pub mod trace;
pub mod train;

use clap::builder::{PossibleValuesParser, TypedValueParser};
use clap::Args;
use std::path::PathBuf;

use nereus_core::config::sets::KeySet;
use nereus_core::config::{Algorithm, DeviceChoice, Overrides, PolicyMode};
use nereus_core::named::Named;

/// Flags that override keys of the job file.
#[derive(Args, Debug, Clone)]
pub struct OverrideArgs {
    /// Overrides job.seed.
    #[arg(long, allow_negative_numbers = true)]
    pub seed: Option<u64>,
    /// Overrides job.steps.
    #[arg(long, allow_negative_numbers = true)]
    pub steps: Option<u32>,
    /// Overrides job.output_dir.
    #[arg(long, value_name = "DIR")]
    pub output_dir: Option<PathBuf>,
    /// Overrides rl.algorithm.
    #[arg(long, value_parser = named::<Algorithm>())]
    pub algorithm: Option<Algorithm>,
    /// Overrides policy.mode.
    #[arg(long, value_parser = named::<PolicyMode>())]
    pub policy: Option<PolicyMode>,
    /// Cluster file replacing the job file's [cluster] table (e.g. configs/clusters/lumi-g.toml).
    #[arg(long, value_name = "FILE")]
    pub cluster: Option<PathBuf>,
    /// Overrides cluster.nodes.
    #[arg(long, allow_negative_numbers = true)]
    pub nodes: Option<u32>,
    /// Sets any key of the job file: `--set rl.prompts_per_step=32` (repeatable; the value is
    /// TOML, or a string when it is not; checked as the file is; the flags above win).
    #[arg(long = "set", value_name = "SECTION.KEY=VALUE")]
    pub sets: Vec<KeySet>,
}

/// The value parser of a flag that takes one of an enum's words (`--help` lists them).
pub fn named<T: Named + Clone + Send + Sync>() -> impl TypedValueParser<Value = T> {
    PossibleValuesParser::new(T::ALL.iter().map(|v| v.name())).try_map(|word: String| {
        T::from_name(&word).ok_or_else(|| format!("unknown value `{word}`; expected one of {}", T::names()))
    })
}

/// `--device[=KIND]`: device-resident state over the GPU data plane.
#[derive(Args, Debug, Clone)]
pub struct DeviceArg {
    /// Keep shards in device memory and move them over NCCL/RCCL: `auto` (the backend this
    /// binary has; the default when the flag has no value), `cuda`, `rocm`, or `emulated` (host
    /// memory posing as a device over MPI, to test the device path without a GPU).
    #[arg(long, value_name = "KIND", num_args = 0..=1, default_missing_value = "auto")]
    pub device: Option<DeviceChoice>,
}

impl From<OverrideArgs> for Overrides {
    fn from(a: OverrideArgs) -> Overrides {
        Overrides {
            seed: a.seed,
            steps: a.steps,
            output_dir: a.output_dir,
            algorithm: a.algorithm,
            policy: a.policy,
            cluster_file: a.cluster,
            nodes: a.nodes,
            device: None,
            sets: a.sets,
        }
    }
}

/// The arguments of a command this build cannot run (taken as they come, so that the command
/// can say what is missing instead of clap refusing its flags).
#[cfg(not(feature = "mpi"))]
#[derive(Args, Debug, Clone)]
pub struct Unavailable {
    #[arg(trailing_var_arg = true, allow_hyphen_values = true, hide = true)]
    args: Vec<String>,
}
