//! Plans: model-stages, candidates and plans (the types transitions and the planner share).

mod model_stage;

pub use model_stage::{ModelStage, Role, Stage};
