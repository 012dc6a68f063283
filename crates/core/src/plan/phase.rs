//! The four phases of a synchronous RL step, in order, and a value per phase.

use serde::{Deserialize, Serialize};

/// One phase of an RL step (`stage_seconds` and `op_seconds` in the step line are keyed by them).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Phase {
    /// Sampling responses with the actor.
    Generation,
    /// Reference, reward and critic inference and the actor's old log-probabilities.
    Inference,
    /// Actor and critic updates.
    Training,
    /// Resharding the trained weights into the generation (and critic inference) layouts.
    WeightSync,
}

impl Phase {
    /// Every phase, in step order.
    pub const ALL: [Phase; 4] = [Phase::Generation, Phase::Inference, Phase::Training, Phase::WeightSync];

    /// The phase's name in records (`generation`, …, `weight_sync`).
    pub fn name(self) -> &'static str {
        match self {
            Phase::Generation => "generation",
            Phase::Inference => "inference",
            Phase::Training => "training",
            Phase::WeightSync => "weight_sync",
        }
    }
}

/// A value for each phase of a step (seconds, seconds per operation class, …), written as an
/// object keyed by the phases' names.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct PerPhase<T> {
    /// Sampling.
    pub generation: T,
    /// Reference, reward and critic inference and the actor's old log-probabilities.
    pub inference: T,
    /// Actor and critic updates.
    pub training: T,
    /// Resharding the trained weights into the generation (and critic inference) layouts.
    pub weight_sync: T,
}

impl<T> PerPhase<T> {
    /// Builds one from a value per phase.
    pub fn from_fn(mut f: impl FnMut(Phase) -> T) -> PerPhase<T> {
        PerPhase {
            generation: f(Phase::Generation),
            inference: f(Phase::Inference),
            training: f(Phase::Training),
            weight_sync: f(Phase::WeightSync),
        }
    }

    /// The value of `phase`.
    pub fn get(&self, phase: Phase) -> &T {
        match phase {
            Phase::Generation => &self.generation,
            Phase::Inference => &self.inference,
            Phase::Training => &self.training,
            Phase::WeightSync => &self.weight_sync,
        }
    }

    /// The value of `phase`, to change.
    pub fn get_mut(&mut self, phase: Phase) -> &mut T {
        match phase {
            Phase::Generation => &mut self.generation,
            Phase::Inference => &mut self.inference,
            Phase::Training => &mut self.training,
            Phase::WeightSync => &mut self.weight_sync,
        }
    }

    /// Each phase's value through `f`.
    pub fn map<U>(&self, mut f: impl FnMut(&T) -> U) -> PerPhase<U> {
        PerPhase::from_fn(|p| f(self.get(p)))
    }

    /// `(phase, value)` in step order.
    pub fn iter(&self) -> impl Iterator<Item = (Phase, &T)> {
        Phase::ALL.into_iter().map(move |p| (p, self.get(p)))
    }
}

impl PerPhase<f64> {
    /// The whole step.
    pub fn total(&self) -> f64 {
        self.generation + self.inference + self.training + self.weight_sync
    }
}
