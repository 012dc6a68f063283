//! `nereus selftest <what>`: the self-tests of `nereus-bench`, on every rank of an MPI launch.

use crate::launch::Global;

/// `nereus selftest …`.
#[cfg(feature = "mpi")]
pub type SelftestArgs = nereus_bench::selftest::SelftestCommand;
/// `nereus selftest …` (needs the `mpi` feature).
#[cfg(not(feature = "mpi"))]
#[derive(clap::Args, Debug, Clone)]
pub struct SelftestArgs {
    #[command(flatten)]
    rest: super::Unavailable,
}

/// Runs `nereus selftest …` on every rank.
#[cfg(feature = "mpi")]
pub fn exec(command: SelftestArgs, global: &Global) -> u8 {
    crate::launch::spmd(global, |session| nereus_bench::selftest::run(session, &command))
}

/// Without the `mpi` feature: says what is missing.
#[cfg(not(feature = "mpi"))]
pub fn exec(_: SelftestArgs, _: &Global) -> u8 {
    crate::launch::needs_mpi("selftest")
}
