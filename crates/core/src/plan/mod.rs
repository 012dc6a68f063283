//! Plans: model-stages, candidates and plans (the types transitions and the planner share).

mod candidate;
mod model_stage;
mod phase;

pub use candidate::{
    model_stages, overlap_critical, overlap_latency, Candidate, Placement, Plan, PlanError, Recompute,
};
pub use model_stage::{ModelStage, Role, Stage, WEIGHT_SYNCS};
pub use phase::{PerPhase, Phase};
