//! `nereus train [FILE] [--resume …] [--pool …] [--fail-rank R --at-step K] [--device …]`: an RL
//! job (PPO, GRPO, ReMax) under mpirun/srun on the host reference engine or each rank's device,
//! on one plan or under the live controller; one line per step, JSON lines in
//! `<output_dir>/metrics.jsonl`.

use clap::Args;
use std::path::PathBuf;

use super::OverrideArgs;
use crate::launch::Global;

/// `nereus train`.
#[derive(Args, Debug, Clone)]
pub struct TrainArgs {
    /// Job file (TOML); the embedded default when omitted.
    pub file: Option<PathBuf>,
    #[cfg(feature = "mpi")]
    #[command(flatten)]
    pub start: flags::StartArgs,
    /// Keep state on and compute with this device (`cuda`, `rocm`, `emulated`, `auto`);
    /// replaces `cluster.device`. Without either, the host reference engine trains on `mpi`,
    /// and `nccl`/`rccl` jobs train on CUDA/ROCm devices.
    #[cfg(feature = "mpi")]
    #[arg(long, value_name = "KIND", value_parser = super::named::<nereus_core::config::DeviceChoice>())]
    pub device: Option<nereus_core::config::DeviceChoice>,
    #[command(flatten)]
    pub overrides: OverrideArgs,
    #[cfg(not(feature = "mpi"))]
    #[command(flatten)]
    pub rest: super::Unavailable,
}

/// Runs `nereus train` on every rank.
#[cfg(feature = "mpi")]
pub fn exec(args: TrainArgs, global: &Global) -> u8 {
    // Before MPI starts: a stop signal (or SIGHUP) that arrives during bring-up, the config
    // agreement or a warm-up must find its handler, not the default that kills the rank.
    if let Err(e) = nereus_runtime::train::signals::install() {
        eprintln!("nereus: error: {e}");
        return e.exit_code();
    }
    let overrides = nereus_core::config::Overrides { device: args.device, ..args.overrides.into() };
    let options = args.start.into();
    crate::launch::spmd(global, |session| {
        nereus_runtime::train::run(session, args.file.as_deref(), &overrides, &options)
    })
}

/// Without the `mpi` feature: says what is missing.
#[cfg(not(feature = "mpi"))]
pub fn exec(_: TrainArgs, _: &Global) -> u8 {
    crate::launch::needs_mpi("train")
}

#[cfg(feature = "mpi")]
mod flags {
    use nereus_core::config::ResumeFrom;
    use nereus_runtime::train::TrainOptions;

    /// How `nereus train` starts, beside its job file.
    #[derive(Debug, Clone, clap::Args)]
    pub struct StartArgs {
        /// Resume from a checkpoint (any layout): a `step-N` directory, `latest` (the newest
        /// complete checkpoint of the output directory), or `auto` (that, or a fresh start when
        /// there is none: for batch scripts that requeue).
        #[arg(long, value_name = "DIR|latest|auto")]
        pub resume: Option<ResumeFrom>,
        /// Resume without the optimizer state: AdamW restarts from zero moments.
        #[arg(long = "resume-reset-optimizer", requires = "resume")]
        pub reset_optimizer: bool,
        /// The ranks the job may use at the start: a count N or the index list of the first N
        /// ranks (`0-5`); `[pool] trace` and `<output_dir>/pool` take over when present.
        #[arg(long, value_name = "N|0-(N-1)", allow_hyphen_values = true)]
        pub pool: Option<String>,
        /// Declare this rank lost without warning at the start of `--at-step` (its state is
        /// gone; the controller replans around it, a checkpoint restores what had no replica).
        #[arg(long, value_name = "R", requires = "fail_at_step", allow_negative_numbers = true)]
        pub fail_rank: Option<u32>,
        /// The step at whose start `--fail-rank` is lost.
        #[arg(long = "at-step", value_name = "K", requires = "fail_rank", allow_negative_numbers = true)]
        pub fail_at_step: Option<u64>,
    }

    impl From<StartArgs> for TrainOptions {
        fn from(a: StartArgs) -> Self {
            let StartArgs { resume, reset_optimizer, pool, fail_rank, fail_at_step } = a;
            TrainOptions { resume, reset_optimizer, pool, fail_rank, fail_at_step }
        }
    }
}
