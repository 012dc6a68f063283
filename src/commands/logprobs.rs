//! `nereus logprobs DIR --tokens FILE.json`: per-token log-probabilities log p(x_t | x_<t),
//! t >= 1 (a value model: per-position values) of token sequences under a Hugging Face model
//! directory, on one rank or under mpirun with any layout.

use crate::launch::Global;

/// `nereus logprobs`: prints {"model": DIR, "logprobs": [[...], ...]} (or "values").
#[cfg(feature = "mpi")]
pub type LogprobsArgs = nereus_runtime::logprobs::LogprobsOptions;
/// `nereus logprobs` (needs the `mpi` feature).
#[cfg(not(feature = "mpi"))]
pub type LogprobsArgs = super::Unavailable;

/// Runs `nereus logprobs` on every rank.
#[cfg(feature = "mpi")]
pub fn exec(args: LogprobsArgs, global: &Global) -> u8 {
    crate::launch::spmd(global, |session| nereus_runtime::logprobs::run(session, &args))
}

/// Without the `mpi` feature: says what is missing.
#[cfg(not(feature = "mpi"))]
pub fn exec(_: LogprobsArgs, _: &Global) -> u8 {
    crate::launch::needs_mpi("logprobs")
}
