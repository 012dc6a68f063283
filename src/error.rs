//! Why a command of the binary failed, for the commands that run over the core alone.

use thiserror::Error;

use nereus_core::config::ConfigError;
use nereus_core::exit::{EXIT_FAILURE, EXIT_USAGE};
use nereus_core::file_error::FileError;
use nereus_core::planner::PlannerError;
use nereus_core::sim::SimError;
use nereus_core::transition::TransitionError;

/// Why a planning, simulating or tracing command failed.
#[derive(Debug, Error)]
pub enum CommandError {
    /// The job config is broken.
    #[error("{0}")]
    Config(#[from] ConfigError),
    /// No plan fits.
    #[error("{0}")]
    Planner(#[from] PlannerError),
    /// A transition cannot be planned.
    #[error("{0}")]
    Transition(#[from] TransitionError),
    /// A simulation cannot run (a bad trace, calibration or request).
    #[error("{0}")]
    Sim(#[from] SimError),
    /// The command was used wrongly.
    #[error("{0}")]
    Usage(String),
    /// A file could not be written.
    #[error("{0}")]
    Io(#[from] FileError),
    /// Printing to standard output failed.
    #[error("cannot write to standard output: {0}")]
    Stdout(std::io::Error),
}

impl CommandError {
    /// The process exit status: 2 for anything the user can fix, 1 for files the system refused.
    pub fn exit_code(&self) -> u8 {
        match self {
            CommandError::Io(_) | CommandError::Stdout(_) => EXIT_FAILURE,
            // A trace or calibration file that cannot be read (missing, a directory, a pipe) is
            // the user's to fix: exit 2, as for every other input file a command names.
            CommandError::Sim(SimError::Io(e)) if e.is_wrong_input() => EXIT_USAGE,
            CommandError::Sim(SimError::Io(_)) => EXIT_FAILURE,
            CommandError::Transition(_) => EXIT_FAILURE,
            _ => EXIT_USAGE,
        }
    }
}

/// The error-mapping closure for a failed write of `path`.
pub fn write_error(path: &std::path::Path) -> impl FnOnce(std::io::Error) -> CommandError {
    let to_file_error = FileError::on("write", path);
    move |source| CommandError::Io(to_file_error(source))
}

#[cfg(feature = "mpi")]
impl From<CommandError> for nereus_runtime::RuntimeError {
    fn from(e: CommandError) -> Self {
        use nereus_runtime::RuntimeError;
        match e {
            CommandError::Config(e) => e.into(),
            CommandError::Planner(e) => RuntimeError::Planner(e),
            CommandError::Transition(e) => RuntimeError::Transition(e),
            CommandError::Sim(SimError::Io(e)) if e.is_wrong_input() => RuntimeError::Usage(e.to_string()),
            CommandError::Sim(SimError::Io(e)) => RuntimeError::Io(e),
            CommandError::Sim(e) => RuntimeError::Usage(e.to_string()),
            CommandError::Usage(m) => RuntimeError::Usage(m),
            CommandError::Io(e) => RuntimeError::Io(e),
            CommandError::Stdout(e) => RuntimeError::Stdout(e),
        }
    }
}
