//! `nereus bench <what>`: the benchmarks of `nereus-bench`, on every rank of an MPI launch.

use crate::launch::Global;

/// `nereus bench …`.
#[cfg(feature = "mpi")]
pub type BenchArgs = nereus_bench::bench::BenchCommand;
/// `nereus bench …` (needs the `mpi` feature).
#[cfg(not(feature = "mpi"))]
#[derive(clap::Args, Debug, Clone)]
pub struct BenchArgs {
    #[command(flatten)]
    rest: super::Unavailable,
}

/// Runs `nereus bench …` on every rank.
#[cfg(feature = "mpi")]
pub fn exec(command: BenchArgs, global: &Global) -> u8 {
    crate::launch::spmd(global, |session| nereus_bench::bench::run(session, &command))
}

/// Without the `mpi` feature: says what is missing.
#[cfg(not(feature = "mpi"))]
pub fn exec(_: BenchArgs, _: &Global) -> u8 {
    crate::launch::needs_mpi("bench")
}
