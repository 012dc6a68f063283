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

use clap::Args;
use std::path::PathBuf;

use nereus_core::config::sets::KeySet;
use nereus_core::config::{Algorithm, Overrides, PolicyMode};

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
    /// Overrides rl.algorithm (ppo, grpo, remax).
    #[arg(long, value_parser = parse_algorithm)]
    pub algorithm: Option<Algorithm>,
    /// Overrides policy.mode: off, nereus, static, every-k or greedy.
    #[arg(long, value_enum)]
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

/// `--algorithm`'s values.
pub fn parse_algorithm(s: &str) -> Result<Algorithm, String> {
    match s {
        "ppo" => Ok(Algorithm::Ppo),
        "grpo" => Ok(Algorithm::Grpo),
        "remax" => Ok(Algorithm::Remax),
        other => Err(format!("unknown algorithm `{other}`; expected ppo, grpo or remax")),
    }
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
