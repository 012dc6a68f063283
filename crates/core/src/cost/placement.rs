//! Placement-exact memory: what each rank of a plan holds at its peak. Under ZeRO-0 every DP
//! replica keeps full state on its own ranks, and a rank keeps the state of every EMU it holds
//! (every model-stage, every stage) from step to step; on top of that, one pass at a time runs
//! there (passes of one rank are serialized), so the rank's peak is
//!
//! `Σ state of its EMUs + max over the model-stages it serves of their transient peak`.
//!
//! The same sum is what the engine's ledger charges, item by item.

use serde::Serialize;

use super::memory::MemoryBreakdown;
use super::PositionMemory;
use crate::plan::{Candidate, ModelStage, Plan};

/// One rank's predicted peak.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct RankMemory {
    /// State of every EMU on the rank.
    pub state: MemoryBreakdown,
    /// The largest transient of the passes that run on the rank.
    pub transient: MemoryBreakdown,
    /// The model-stage whose pass sets the transient peak.
    pub busiest: Option<ModelStage>,
}

impl RankMemory {
    /// State plus the largest transient.
    pub fn peak(&self) -> u64 {
        self.state.total() + self.transient.total()
    }

    /// The breakdown at the peak.
    pub fn at_peak(&self) -> MemoryBreakdown {
        self.state.plus(&self.transient)
    }
}

/// Every rank's predicted peak under a plan.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct RankPeaks {
    /// Indexed by world rank.
    pub ranks: Vec<RankMemory>,
}

fn ranks_consider(ranks: &mut [RankMemory], r: i32, transient: MemoryBreakdown, model_stage: ModelStage) {
    if let Some(rank) = ranks.get_mut(r as usize) {
        if transient.total() > rank.transient.total() {
            rank.transient = transient;
            rank.busiest = Some(model_stage);
        }
    }
}

impl RankPeaks {
    /// Adds up `plan` on a pool of `pool` ranks; `memory_of(candidate, j)` is what one rank at
    /// pipeline position `j` of the candidate holds.
    pub fn of(plan: &Plan, pool: u32, mut memory_of: impl FnMut(&Candidate, u32) -> PositionMemory) -> RankPeaks {
        let mut ranks = vec![RankMemory::default(); pool as usize];
        for p in &plan.placements {
            let c = &p.candidate;
            let per_stage: Vec<PositionMemory> = (0..c.layout.pp).map(|j| memory_of(c, j)).collect();
            for replica in p.ranks.chunks(c.layout.size().max(1) as usize) {
                for (k, &r) in replica.iter().enumerate() {
                    let m = &per_stage[c.layout.position(k).pp as usize];
                    if let Some(rank) = ranks.get_mut(r as usize) {
                        rank.state = rank.state.plus(&m.state);
                    }
                    ranks_consider(&mut ranks, r, m.transient, c.model_stage);
                }
            }
        }
        RankPeaks { ranks }
    }

    /// Counts another pass on rank `r` (its transient peak `transient`, for `model_stage`).
    pub fn consider(&mut self, r: i32, transient: MemoryBreakdown, model_stage: ModelStage) {
        ranks_consider(&mut self.ranks, r, transient, model_stage);
    }

    /// The highest peak, and its rank.
    pub fn max(&self) -> (u64, i32) {
        self.ranks.iter().enumerate().map(|(r, m)| (m.peak(), r as i32)).max().unwrap_or((0, 0))
    }

    /// Ranks whose peak passes `usable` bytes.
    pub fn over(&self, usable: u64) -> Vec<i32> {
        self.ranks.iter().enumerate().filter(|(_, m)| m.peak() > usable).map(|(r, _)| r as i32).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cost::MemoryItem;
    use crate::model::Layout;
    use crate::plan::{Placement, Recompute, Role, Stage};

    fn place(role: Role, stage: Stage, layout: Layout, dp: u32, ranks: Vec<i32>) -> Placement {
        let model_stage = ModelStage::new(role, stage);
        Placement {
            candidate: Candidate { model_stage, layout, dp, recompute: Recompute::None, micro_batch: 1 },
            ranks,
        }
    }

    #[test]
    fn states_add_up_and_the_largest_transient_counts_once() {
        // Rank 1 holds a generation replica (state 10, transient 7) and stage 1 of a pp = 2
        // training replica (state 20 + 2 per stage index, transient 5).
        let plan = Plan {
            placements: vec![
                place(Role::Actor, Stage::Generation, Layout::new(1, 1), 2, vec![0, 1]),
                place(Role::Actor, Stage::Training, Layout::new(1, 2), 1, vec![2, 1]),
            ],
        };
        let peaks = RankPeaks::of(&plan, 3, |c, j| {
            let (state, transient) = if c.model_stage.trains() { (20 + 2 * u64::from(j), 5) } else { (10, 7) };
            let mut m = PositionMemory::default();
            m.state.add(MemoryItem::Params, state);
            m.transient.add(MemoryItem::Activations, transient);
            m
        });
        assert_eq!(peaks.ranks.iter().map(RankMemory::peak).collect::<Vec<_>>(), vec![17, 10 + 22 + 7, 20 + 5]);
        assert_eq!(peaks.ranks[1].busiest, Some(ModelStage::new(Role::Actor, Stage::Generation)));
        assert_eq!(peaks.max(), (39, 1));
        assert_eq!(peaks.over(30), vec![1]);
    }
}
