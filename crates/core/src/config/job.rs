//! `[job]`: what the job is called, how it is seeded, how long it runs, where it writes.

use serde::{Deserialize, Serialize};
use std::path::PathBuf;

use super::{check, ConfigError};

/// The `[job]` section.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct JobSection {
    /// Job name; used in output file names, so letters, digits, `-`, `_` and `.` only.
    pub name: String,
    /// Seed of every random stream (data order, sampling, initialization); per-rank streams are
    /// derived from it and the rank's data-parallel position, never from the world rank.
    #[serde(default)]
    pub seed: u64,
    /// Number of RL steps to run.
    pub steps: u32,
    /// Directory for metrics (JSON lines), checkpoints and logs; created by rank 0.
    #[serde(default = "default_output_dir")]
    pub output_dir: PathBuf,
    /// Seconds a control-plane collective may wait before the watchdog aborts the whole job
    /// (at most one week).
    #[serde(default = "default_collective_timeout_s")]
    pub collective_timeout_s: f64,
    /// Kept for configs written when only SIGTERM and this signal made `nereus train`
    /// checkpoint and stop: SIGTERM, SIGUSR1 and SIGUSR2 all do now, from the start of the
    /// process (`"SIGUSR1"` or `"SIGUSR2"` are still accepted, and change nothing).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub checkpoint_on_signal: Option<String>,
}

/// Signals `job.checkpoint_on_signal` may name.
pub const CHECKPOINT_SIGNALS: [&str; 2] = ["SIGUSR1", "SIGUSR2"];

fn default_output_dir() -> PathBuf {
    PathBuf::from("runs")
}

/// Longest `job.name`, in characters.
pub const MAX_NAME_LEN: usize = 128;

fn default_collective_timeout_s() -> f64 {
    300.0
}

impl JobSection {
    /// Checks ranges; errors name the key under `job.`.
    pub fn validate(&self) -> Result<(), ConfigError> {
        // One safe path component: no separator, not `.` or `..` (nor hidden), short enough
        // for a file name with suffixes under any file system's 255-byte limit.
        let name_ok = (1..=MAX_NAME_LEN).contains(&self.name.len())
            && !self.name.starts_with('.')
            && self.name.chars().all(|c| c.is_ascii_alphanumeric() || "-_.".contains(c));
        if !name_ok {
            return Err(ConfigError::invalid(
                "job.name",
                format!("{:?}", self.name),
                format!("must be 1 to {MAX_NAME_LEN} letters, digits, `-`, `_` and `.`, not starting with `.` (one file-name component)"),
            ));
        }
        check::at_least_one("job.steps", self.steps)?;
        if self.output_dir.as_os_str().is_empty() {
            return Err(ConfigError::invalid("job.output_dir", "\"\"", "must be a directory path"));
        }
        check::timeout("job.collective_timeout_s", self.collective_timeout_s)?;
        match &self.checkpoint_on_signal {
            Some(sig) if !CHECKPOINT_SIGNALS.contains(&sig.as_str()) => Err(ConfigError::invalid(
                "job.checkpoint_on_signal",
                format!("{sig:?}"),
                format!("must be one of {} (SIGTERM always checkpoints)", CHECKPOINT_SIGNALS.join(", ")),
            )),
            _ => Ok(()),
        }
    }
}
