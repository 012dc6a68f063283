//! Elastic Model Units: one replica of one model-stage, `⟨M, T, R, θ, ω⟩`, plus its counters.

use serde::{Deserialize, Serialize};
use std::fmt;

use nereus_core::model::{Layout, Position};
use nereus_core::plan::ModelStage;

/// Identifier of an EMU, unique for the life of a job (never reused).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct EmuId(pub u64);

impl fmt::Display for EmuId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "emu#{}", self.0)
    }
}

/// The logical counters `(c, v, p)` and the seed that, with the DP rank and `p`, determines the
/// RNG and data-loader state. They travel with the state: a new replica continues from them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Serialize, Deserialize)]
pub struct Counters {
    /// Optimizer updates applied (Adam's `t`).
    pub updates: u64,
    /// Version of this model-stage's weights.
    pub model_version: u64,
    /// Policy version the weights correspond to.
    pub policy_version: u64,
    /// Position in the minibatch stream (samples consumed).
    pub data_position: u64,
    /// Job seed.
    pub seed: u64,
}

/// One replica of one model-stage: a layout, its ordered ranks and its counters.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Emu {
    /// Identifier.
    pub id: EmuId,
    /// The model-stage it is a replica of.
    pub model_stage: ModelStage,
    /// `(tp, pp)`.
    pub layout: Layout,
    /// World ranks, TP-fastest (see [`Layout::position`]); `len = tp × pp`.
    pub ranks: Vec<i32>,
    /// `(c, v, p)` and the seed.
    pub counters: Counters,
}

impl Emu {
    /// The position `rank` holds, if it belongs to this EMU.
    pub fn position_of(&self, rank: i32) -> Option<Position> {
        self.ranks.iter().position(|&r| r == rank).map(|i| self.layout.position(i))
    }

    /// The rank holding `position`.
    pub fn rank_at(&self, position: Position) -> i32 {
        self.ranks[self.layout.index(position)]
    }
}
