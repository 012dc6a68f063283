//! `[plan."<model-stage>"]`: a fixed parallel plan, instead of the planner's choice. Either
//! every model-stage of the algorithm has a table, or none does.
//!
//! ```toml
//! [plan."actor/training"]
//! tp = 2
//! pp = 2
//! dp = 2
//! ranks = [0, 1, 2, 3, 4, 5, 6, 7]   # dp·tp·pp ranks, replica-major, TP-fastest
//! ```

use serde::{Deserialize, Serialize};

use super::{check, ConfigError};

/// Model-stage names a plan table may use.
pub const MODEL_STAGE_NAMES: [&str; 6] = [
    "actor/generation",
    "actor/training",
    "critic/inference",
    "critic/training",
    "reference/inference",
    "reward/inference",
];

/// One model-stage's placement.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PlanEntry {
    /// Tensor-parallel degree.
    pub tp: u32,
    /// Pipeline-parallel degree.
    pub pp: u32,
    /// Replicas.
    pub dp: u32,
    /// `dp · tp · pp` world ranks: replica after replica, TP-fastest inside one.
    pub ranks: Vec<i32>,
}

/// Checks names and degrees; rank sets are checked against the world when the job starts.
pub fn validate(plan: &std::collections::BTreeMap<String, PlanEntry>) -> Result<(), ConfigError> {
    for (name, e) in plan {
        if !MODEL_STAGE_NAMES.contains(&name.as_str()) {
            return Err(ConfigError::invalid(
                format!("plan.\"{name}\""),
                name,
                format!("not a model-stage; use one of {}", MODEL_STAGE_NAMES.join(", ")),
            ));
        }
        for (key, value) in [("tp", e.tp), ("pp", e.pp), ("dp", e.dp)] {
            check::at_least_one(&format!("plan.\"{name}\".{key}"), value)?;
        }
        if e.ranks.len() != (e.tp * e.pp * e.dp) as usize {
            return Err(ConfigError::invalid(
                format!("plan.\"{name}\".ranks"),
                format!("{:?}", e.ranks),
                format!("needs dp·tp·pp = {} ranks", e.tp * e.pp * e.dp),
            ));
        }
    }
    Ok(())
}
