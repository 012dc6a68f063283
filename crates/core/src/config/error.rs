//! Configuration errors: every variant names the file, the TOML key and the offending value.

use std::path::PathBuf;
use thiserror::Error;

/// Why a job or cluster configuration was rejected.
///
/// Each message is one paragraph a user can act on: where (file, line, column), which key, and
/// what is wrong with the value. The CLI maps every variant to exit status 2.
#[derive(Debug, Error)]
pub enum ConfigError {
    /// The file could not be read at all.
    #[error("cannot read config file `{path}`: {source}")]
    Read {
        /// The path as given (after resolving includes relative to the including file).
        path: PathBuf,
        /// The operating-system error.
        source: std::io::Error,
    },
    /// The file is not valid TOML, or a key is unknown, missing or of the wrong type.
    #[error("{path}: line {line}, column {column}{}: {message}", key_suffix(.key))]
    Parse {
        /// The file (or `<embedded default>`).
        path: PathBuf,
        /// 1-based line of the first offending character.
        line: usize,
        /// 1-based column of the first offending character.
        column: usize,
        /// Dotted key path, e.g. `models.actor.heads`, when the parser knows it.
        key: Option<String>,
        /// The parser's description of the problem.
        message: String,
    },
    /// A `--set` flag names no key of the job file, or gives it a value of the wrong type.
    #[error("{flag}: {message}")]
    Set {
        /// The flag as given.
        flag: String,
        /// What is wrong.
        message: String,
    },
    /// A value parsed but is out of range or inconsistent with another value.
    #[error("invalid value for `{key}` = {value}: {reason}")]
    Invalid {
        /// Dotted key path, e.g. `models.actor.kv_heads`.
        key: String,
        /// The offending value, rendered as in TOML.
        value: String,
        /// What is wrong and what would be accepted.
        reason: String,
    },
    /// A model directory named by `models.<role>.path` cannot be used.
    #[error("`{key}` = `{}`: {reason}", path.display())]
    ModelDirectory {
        /// Dotted key path, e.g. `models.actor.path`.
        key: String,
        /// The directory (relative paths resolved against the job file's directory).
        path: PathBuf,
        /// What is wrong with it.
        reason: String,
    },
    /// A key of the job and the model directory's `config.json` disagree.
    #[error("`{key}` = {value} in the job disagrees with `{file_key}` = {file_value} in `{}`; remove the key from the job or make the two agree", file.display())]
    Conflict {
        /// Dotted key path in the job, e.g. `models.actor.hidden`.
        key: String,
        /// Its value in the job.
        value: String,
        /// The `config.json`.
        file: PathBuf,
        /// The key there, e.g. `hidden_size`.
        file_key: String,
        /// Its value there.
        file_value: String,
    },
    /// A required key has no value after TOML, includes, detection and CLI flags are applied.
    #[error("missing value for `{key}`: {hint}")]
    Missing {
        /// Dotted key path.
        key: String,
        /// How to provide it.
        hint: String,
    },
}

fn key_suffix(key: &Option<String>) -> String {
    key.as_ref().map(|k| format!(" (key `{k}`)")).unwrap_or_default()
}

impl ConfigError {
    /// Shorthand for [`ConfigError::Invalid`].
    pub fn invalid(key: impl Into<String>, value: impl std::fmt::Display, reason: impl Into<String>) -> Self {
        ConfigError::Invalid { key: key.into(), value: value.to_string(), reason: reason.into() }
    }

    /// The dotted key the error is about, when there is one.
    pub fn key(&self) -> Option<&str> {
        match self {
            ConfigError::Read { .. } | ConfigError::Set { .. } => None,
            ConfigError::Parse { key, .. } => key.as_deref(),
            ConfigError::Invalid { key, .. }
            | ConfigError::Missing { key, .. }
            | ConfigError::ModelDirectory { key, .. }
            | ConfigError::Conflict { key, .. } => Some(key),
        }
    }
}
