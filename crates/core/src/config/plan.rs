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

use super::{check, ConfigError, RlMode};

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

/// Checks names, degrees and, in asynchronous `mode`, that rank 0 does not generate; rank sets
/// are checked against the world when the job starts.
pub fn validate(plan: &std::collections::BTreeMap<String, PlanEntry>, mode: RlMode) -> Result<(), ConfigError> {
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
        let want = u64::from(e.tp) * u64::from(e.pp) * u64::from(e.dp);
        let key = format!("plan.\"{name}\".ranks");
        if e.ranks.len() as u64 != want {
            return Err(ConfigError::invalid(key, format!("{:?}", e.ranks), format!("needs dp·tp·pp = {want} ranks")));
        }
        let mut seen = std::collections::BTreeSet::new();
        if let Some(r) = e.ranks.iter().find(|&&r| r < 0 || !seen.insert(r)) {
            let why = if *r < 0 { "is negative" } else { "appears twice" };
            return Err(ConfigError::invalid(
                key,
                format!("{:?}", e.ranks),
                format!("rank {r} {why}: a model-stage's ranks are distinct world ranks"),
            ));
        }
    }
    check_async_generation(plan, mode)
}

/// In asynchronous mode rank 0 scores step n's rollouts while the generation ranks sample step
/// n + 1's, so `actor/generation` must not be placed on rank 0 (the planner puts it on the
/// last ranks of the pool).
fn check_async_generation(
    plan: &std::collections::BTreeMap<String, PlanEntry>,
    mode: RlMode,
) -> Result<(), ConfigError> {
    let Some(e) = plan.get("actor/generation").filter(|e| mode == RlMode::Async && e.ranks.contains(&0)) else {
        return Ok(());
    };
    Err(ConfigError::invalid(
        "plan.\"actor/generation\".ranks",
        format!("{:?}", e.ranks),
        "the actor/generation stage is placed on rank 0, which with rl.mode = \"async\" scores the rollouts while generation samples the next ones; put generation on ranks other than 0 (e.g. the last ones), or set rl.mode = \"sync\"",
    ))
}
