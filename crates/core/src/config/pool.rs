//! `[pool]`: which of the world's ranks the job may use, step by step (resource drift).

use serde::{Deserialize, Serialize};
use std::path::PathBuf;

/// The `[pool]` section (optional). The MPI world is the job's largest allocation; the pool is
/// the ranks it may use now. Without a trace, `<output_dir>/pool` (written by an operator or a
/// scheduler hook, re-read at every step boundary) and `--pool` set it.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct PoolSection {
    /// CSV with a header: `step` and `available_gpus` (the first N ranks) or `ranks` (an index
    /// list such as `0-5`); a row holds from its step until the next row. Relative paths are
    /// resolved against the config file's directory.
    pub trace: Option<PathBuf>,
}
