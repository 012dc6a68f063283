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
    pub options: nereus_runtime::train::TrainOptions,
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
    let overrides = args.overrides.into();
    crate::launch::spmd(global, |session| {
        nereus_runtime::train::run(session, args.file.as_deref(), &overrides, &args.options)
    })
}

/// Without the `mpi` feature: says what is missing.
#[cfg(not(feature = "mpi"))]
pub fn exec(_: TrainArgs, _: &Global) -> u8 {
    crate::launch::needs_mpi("train")
}
