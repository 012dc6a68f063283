//! `nereus selftest <what>`: the self-tests of `nereus-bench`, on every rank of an MPI launch.

use crate::launch::Global;

#[cfg(feature = "mpi")]
pub use flags::SelftestCommand;

/// `nereus selftest …` (needs the `mpi` feature).
#[cfg(not(feature = "mpi"))]
#[derive(clap::Args, Debug, Clone)]
pub struct SelftestCommand {
    #[command(flatten)]
    rest: super::Unavailable,
}

/// Runs `nereus selftest …` on every rank.
#[cfg(feature = "mpi")]
pub fn exec(command: SelftestCommand, global: &Global) -> u8 {
    crate::launch::spmd(global, |session| flags::run(session, command))
}

/// Without the `mpi` feature: says what is missing.
#[cfg(not(feature = "mpi"))]
pub fn exec(_: SelftestCommand, _: &Global) -> u8 {
    crate::launch::needs_mpi("selftest")
}

#[cfg(feature = "mpi")]
mod flags {
    use nereus_bench::selftest::{engine, kernels, primitives, transitions};
    use nereus_core::config::DeviceChoice;
    use nereus_runtime::{report_selftest, RuntimeError, Session};

    use crate::commands::DeviceArg;

    /// `nereus selftest <what>`: check the runtime's machinery on this job's ranks.
    #[derive(Debug, Clone, clap::Subcommand)]
    pub enum SelftestCommand {
        /// Random plan pairs executed as global transition DAGs; checks targets and digests.
        Transitions(RandomCases),
        /// Every (tp, pp, dp) with degrees in {1, 2, 4} that fits the world trains one step of a
        /// tiny LM and value model; parameters and gradients must match (1, 1, 1) within 1e-5,
        /// or, with `--device`, the host's f32 (1, 1, 1) within bf16 tolerance.
        Engine(EngineArgs),
        /// Random Split/Merge/Extend/Destroy sequences; checks digests, bytes and refusals.
        Primitives(RandomCases),
        /// Every device engine kernel on seeded random shapes against f64 references (the grid
        /// emulator at warp 32 and 64 by default; `--device cuda|rocm` on this rank's GPU).
        Kernels(KernelCases),
    }

    /// Where the engine parity runs.
    #[derive(Debug, Clone, clap::Args)]
    pub struct EngineArgs {
        /// Run every layout in bf16 on this rank's device (`emulated`: the grid emulator; `cuda`,
        /// `rocm`) against the host f32 engine; default: the host engine against itself.
        #[arg(long, value_name = "KIND")]
        pub device: Option<DeviceChoice>,
    }

    /// Which device the kernel self-test runs on, and its seed.
    #[derive(Debug, Clone, clap::Args)]
    pub struct KernelCases {
        /// Seed of the shapes and inputs.
        #[arg(long, default_value_t = 1)]
        pub seed: u64,
        /// `emulated` (the default: the grid emulator at warp 32 and 64), `cuda` or `rocm`.
        #[arg(long, value_name = "KIND")]
        pub device: Option<DeviceChoice>,
    }

    /// How many random cases a self-test draws, from which seed, on which device.
    #[derive(Debug, Clone, clap::Args)]
    pub struct RandomCases {
        /// Random cases to run.
        #[arg(long, default_value_t = 20)]
        pub cases: u32,
        /// Seed of the random decisions (every rank draws alike, or takes rank 0's draw).
        #[arg(long, default_value_t = 1)]
        pub seed: u64,
        #[command(flatten)]
        pub device: DeviceArg,
    }

    /// Runs `command` on every rank; rank 0 prints its JSON summary, and any failed check
    /// fails it.
    pub fn run(session: &mut Session, command: SelftestCommand) -> Result<(), RuntimeError> {
        match command {
            SelftestCommand::Transitions(c) => transitions(session, c.cases, c.seed, c.device.device)
                .and_then(|r| report_selftest(session, &r, &r.failures)),
            SelftestCommand::Engine(c) => {
                engine(session, c.device).and_then(|r| report_selftest(session, &r, &r.failures))
            }
            SelftestCommand::Primitives(c) => primitives(session, c.cases, c.seed, c.device.device)
                .and_then(|r| report_selftest(session, &r, &r.failures)),
            SelftestCommand::Kernels(c) => {
                kernels::kernels(session, c.seed, c.device).and_then(|r| report_selftest(session, &r, &r.failures))
            }
        }
    }
}
