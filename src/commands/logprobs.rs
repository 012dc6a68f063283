//! `nereus logprobs DIR --tokens FILE.json`: per-token log-probabilities log p(x_t | x_<t),
//! t >= 1 (a value model: per-position values) of token sequences under a Hugging Face model
//! directory, on one rank or under mpirun with any layout.

use crate::launch::Global;

#[cfg(feature = "mpi")]
pub use flags::LogprobsArgs;
/// `nereus logprobs` (needs the `mpi` feature).
#[cfg(not(feature = "mpi"))]
pub type LogprobsArgs = super::Unavailable;

/// Runs `nereus logprobs` on every rank: prints {"model": DIR, "logprobs": [[...], ...]} (or
/// "values").
#[cfg(feature = "mpi")]
pub fn exec(args: LogprobsArgs, global: &Global) -> u8 {
    let options = args.into();
    crate::launch::spmd(global, |session| nereus_runtime::logprobs::run(session, &options))
}

/// Without the `mpi` feature: says what is missing.
#[cfg(not(feature = "mpi"))]
pub fn exec(_: LogprobsArgs, _: &Global) -> u8 {
    crate::launch::needs_mpi("logprobs")
}

#[cfg(feature = "mpi")]
mod flags {
    use std::path::PathBuf;

    use nereus_runtime::logprobs::LogprobsOptions;

    /// What `nereus logprobs` scores and how.
    #[derive(Debug, Clone, clap::Args)]
    pub struct LogprobsArgs {
        /// The model directory (config.json and *.safetensors), e.g. a checkpoint's step-N/actor.
        pub dir: PathBuf,
        /// JSON file with a list of token-id sequences, e.g. [[1, 5, 9], [2, 7]].
        #[arg(long, value_name = "FILE.json")]
        pub tokens: PathBuf,
        /// Write the JSON here instead of standard output.
        #[arg(long, value_name = "PATH")]
        pub json: Option<PathBuf>,
        /// Tensor-parallel degree of each replica (the ranks form ranks / (tp x pp) replicas that
        /// share the sequences).
        #[arg(long, default_value_t = 1, allow_negative_numbers = true)]
        pub tp: u32,
        /// Pipeline-parallel degree of each replica.
        #[arg(long, default_value_t = 1, allow_negative_numbers = true)]
        pub pp: u32,
        /// Sequences per forward pass.
        #[arg(long, default_value_t = 1, allow_negative_numbers = true)]
        pub micro_batch: usize,
    }

    impl From<LogprobsArgs> for LogprobsOptions {
        fn from(a: LogprobsArgs) -> Self {
            LogprobsOptions {
                dir: a.dir,
                tokens: a.tokens,
                json: a.json,
                tp: a.tp,
                pp: a.pp,
                micro_batch: a.micro_batch,
            }
        }
    }
}
