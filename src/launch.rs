//! How a command reaches the job's ranks: the global flags, the SPMD session (feature `mpi`),
//! or, for the commands that only plan, this process alone.

use clap::Args;
use log::LevelFilter;
use std::path::Path;

use nereus_core::config::{check, JobConfig, Overrides};
use nereus_core::exit::EXIT_USAGE;

use crate::error::CommandError;
use crate::logging::{self, LogOptions};

/// Flags every command takes.
#[derive(Args, Debug, Clone)]
pub struct Global {
    /// Log level of rank 0 (error, warn, info, debug, trace); default: RUST_LOG, else info.
    #[arg(long, global = true, value_name = "LEVEL")]
    pub log_level: Option<LevelFilter>,
    /// Let every rank log at that level, not only rank 0 (others log warnings and errors).
    #[arg(long, global = true)]
    pub log_all_ranks: bool,
    /// Seconds a collective may wait before the watchdog aborts the job
    /// (default: job.collective_timeout_s, else 300).
    #[arg(long, global = true, value_name = "SECONDS")]
    pub collective_timeout: Option<f64>,
}

impl Global {
    /// Checks the flags' values (the exit status on a bad one).
    pub fn check(&self) -> Result<(), u8> {
        if let Some(t) = self.collective_timeout {
            if let Err(e) = check::timeout("--collective-timeout", t) {
                eprintln!("nereus: error: {e} (seconds; at most one week)");
                return Err(EXIT_USAGE);
            }
        }
        Ok(())
    }

    pub(crate) fn log(&self) -> LogOptions {
        LogOptions { level: self.log_level, all_ranks: self.log_all_ranks }
    }
}

/// Runs a command that needs the job config and the core only: under MPI every rank agrees on
/// the config and rank 0 runs `body` with the number of ranks that agreed; without the `mpi`
/// feature this process loads the config and runs it (a `[cluster] detect = true` then takes
/// only the values written in the file).
pub fn planner_command(
    global: &Global,
    path: Option<&Path>,
    overrides: &Overrides,
    body: impl FnOnce(&JobConfig, i32) -> Result<(), CommandError>,
) -> u8 {
    #[cfg(feature = "mpi")]
    {
        spmd(global, |session| {
            let config = session.load_config(path, overrides)?;
            if session.rank() != 0 {
                return Ok(());
            }
            body(&config, session.world().size()).map_err(Into::into)
        })
    }
    #[cfg(not(feature = "mpi"))]
    {
        solo(global, || body(&JobConfig::load(path, overrides, &mut Default::default)?, 1))
    }
}

/// Runs a command of this process alone (no job config to agree on).
pub fn solo(global: &Global, body: impl FnOnce() -> Result<(), CommandError>) -> u8 {
    logging::init(0, &global.log());
    match body() {
        Ok(()) => 0,
        Err(CommandError::Stdout(e)) if e.kind() == std::io::ErrorKind::BrokenPipe => 0,
        Err(e) => {
            eprintln!("nereus: error: {e}");
            e.exit_code()
        }
    }
}

/// Starts the SPMD session and runs `body` on every rank (see [`nereus_runtime::run`]).
#[cfg(feature = "mpi")]
pub fn spmd(
    global: &Global,
    body: impl FnOnce(&mut nereus_runtime::Session) -> Result<(), nereus_runtime::RuntimeError>,
) -> u8 {
    let options = nereus_runtime::SessionOptions { collective_timeout_s: global.collective_timeout };
    let log = global.log();
    nereus_runtime::run(options, |session| {
        logging::init(session.rank(), &log);
        body(session)
    })
}

/// What a binary built without the `mpi` feature says of a command that needs ranks.
#[cfg(not(feature = "mpi"))]
pub fn needs_mpi(command: &str) -> u8 {
    eprintln!(
        "nereus: error: `nereus {command}` runs on MPI ranks, and this binary was built without the `mpi` feature \
         (a planner-only build: plan, simulate, trace, inspect config, data, reward and model import-gguf); rebuild with the default features \
         (`cargo build --release`, which needs MPI, hwloc and libclang)"
    );
    EXIT_USAGE
}
