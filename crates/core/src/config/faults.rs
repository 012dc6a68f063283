//! `[faults]`: failures a job declares for itself, to rehearse what a real one does.

use serde::{Deserialize, Serialize};

/// The `[faults]` section (optional; `--fail-rank` and `--at-step` override it).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct FaultsSection {
    /// A rank declared lost without warning: its state is gone at the start of `at_step`.
    pub fail_rank: Option<u32>,
    /// The step at whose start `fail_rank` is lost (at least 1: a step boundary precedes it).
    pub at_step: Option<u64>,
}
