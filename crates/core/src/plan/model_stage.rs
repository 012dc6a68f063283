//! Model-stages: one model in one stage of the RL step, e.g. `actor/generation`.

use serde::{Deserialize, Serialize};
use std::fmt;

/// A model of the RL job.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Role {
    /// The policy.
    Actor,
    /// The value model (PPO).
    Critic,
    /// The frozen reference policy.
    Reference,
    /// The reward model.
    Reward,
}

impl Role {
    /// The head its model carries: a value head for the critic and the reward model.
    pub fn head(self) -> crate::model::OutputHead {
        match self {
            Role::Critic | Role::Reward => crate::model::OutputHead::Value,
            Role::Actor | Role::Reference => crate::model::OutputHead::Lm,
        }
    }

    /// The name in model-stage names and checkpoint files: `actor`, `critic`, `reference`,
    /// `reward`.
    pub fn name(self) -> &'static str {
        match self {
            Role::Actor => "actor",
            Role::Critic => "critic",
            Role::Reference => "reference",
            Role::Reward => "reward",
        }
    }
}

/// A stage of the synchronous RL step.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Stage {
    /// Sampling responses.
    Generation,
    /// Log-probs, values, rewards.
    Inference,
    /// Optimizer updates.
    Training,
}

/// One model in one stage.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct ModelStage {
    /// The model.
    pub role: Role,
    /// The stage.
    pub stage: Stage,
}

impl ModelStage {
    /// `role/stage`.
    pub const fn new(role: Role, stage: Stage) -> ModelStage {
        ModelStage { role, stage }
    }

    /// Whether this model-stage keeps optimizer state (training).
    pub fn trains(self) -> bool {
        self.stage == Stage::Training
    }
}

/// The weight syncs of an RL step, `(from, into)`: trained parameters copied into the layouts
/// that use them (the actor's generation, the critic's inference), in the order a step runs them.
pub const WEIGHT_SYNCS: [(ModelStage, ModelStage); 2] = [
    (ModelStage::new(Role::Actor, Stage::Training), ModelStage::new(Role::Actor, Stage::Generation)),
    (ModelStage::new(Role::Critic, Stage::Training), ModelStage::new(Role::Critic, Stage::Inference)),
];

impl fmt::Display for ModelStage {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let role = self.role.name();
        let stage = match self.stage {
            Stage::Generation => "generation",
            Stage::Inference => "inference",
            Stage::Training => "training",
        };
        write!(f, "{role}/{stage}")
    }
}
