//! Candidates, plans, validity and the execution-overlap graph.
//!
//! Rank arithmetic: a candidate's ranks are `dp` replicas of `tp · pp` ranks each; replica `r`
//! is `ranks[r·tp·pp .. (r+1)·tp·pp]`, ordered TP-fastest inside (see
//! [`Layout::position`](crate::model::Layout::position)). Example: `(tp, pp, dp) = (2, 2, 2)`
//! on ranks `[8..16]`: replica 1 is ranks 12–15, and its stage-1 TP group is ranks 14–15.

use serde::{Deserialize, Serialize};

use super::{ModelStage, Role, Stage};
use crate::config::Algorithm;
use crate::model::Layout;

/// Activation recomputation of a training model-stage (Korthikanti et al., 2022).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Recompute {
    /// Store every activation.
    None,
    /// Recompute the attention core (softmax, dropout, scores) in the backward pass.
    Selective,
    /// Store only each block's input; recompute the whole block.
    Full,
}

/// `⟨tp, pp, dp⟩` (and recomputation) for one model-stage, before ranks are assigned.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct Candidate {
    /// The model-stage.
    pub model_stage: ModelStage,
    /// `(tp, pp)`.
    pub layout: Layout,
    /// Replicas.
    pub dp: u32,
    /// Recomputation (training only; `None` elsewhere).
    pub recompute: Recompute,
    /// Sequences per micro-batch (training and inference; at most the configured one).
    pub micro_batch: u32,
}

impl Candidate {
    /// Ranks the candidate occupies.
    pub fn ranks(&self) -> u32 {
        self.layout.size() * self.dp
    }
}

/// A candidate with concrete ranks: `π_M = ⟨tp, pp, dp, R_M⟩`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Placement {
    /// The candidate.
    pub candidate: Candidate,
    /// `dp · tp · pp` world ranks, replica-major, TP-fastest inside a replica.
    pub ranks: Vec<i32>,
}

impl Placement {
    /// The ranks of replica `r`.
    pub fn replica(&self, r: usize) -> &[i32] {
        let size = self.candidate.layout.size() as usize;
        &self.ranks[r * size..(r + 1) * size]
    }
}

/// One placement per model-stage.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Plan {
    /// Placements, in model-stage order.
    pub placements: Vec<Placement>,
}

/// Why a plan is not valid.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PlanError {
    /// A placement's rank count does not match `tp · pp · dp`.
    #[error("{model_stage}: {got} ranks given for tp·pp·dp = {want}")]
    RankCount {
        /// The model-stage.
        model_stage: ModelStage,
        /// Ranks listed.
        got: usize,
        /// Ranks needed.
        want: u32,
    },
    /// A rank outside the pool.
    #[error("{model_stage}: rank {rank} is outside the pool of {pool} ranks")]
    OutsidePool {
        /// The model-stage.
        model_stage: ModelStage,
        /// The rank.
        rank: i32,
        /// Pool size.
        pool: u32,
    },
    /// A rank appears twice in one placement (two replicas, or two positions of one replica,
    /// of the same model-stage).
    #[error("{model_stage}: rank {rank} appears twice; a model-stage's replicas use distinct ranks")]
    RepeatedRank {
        /// The model-stage.
        model_stage: ModelStage,
        /// The rank.
        rank: i32,
    },
}

/// The model-stages of one RL step of `algorithm`, in stage order (generation → inference →
/// training). ReMax's greedy baseline rollout is extra work of `actor/generation`.
pub fn model_stages(algorithm: Algorithm) -> Vec<ModelStage> {
    use Role::*;
    use Stage::*;
    let mut out = vec![
        ModelStage::new(Actor, Generation),
        ModelStage::new(Reference, Inference),
        ModelStage::new(Reward, Inference),
    ];
    if algorithm.uses_critic() {
        out.push(ModelStage::new(Critic, Inference));
    }
    out.push(ModelStage::new(Actor, Training));
    if algorithm.uses_critic() {
        out.push(ModelStage::new(Critic, Training));
    }
    out
}

/// A plan in short form: `actor/generation 1x1x8, …` (tp × pp × dp per model-stage).
impl std::fmt::Display for Plan {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        for (k, p) in self.placements.iter().enumerate() {
            let c = &p.candidate;
            let sep = if k == 0 { "" } else { ", " };
            write!(f, "{sep}{} {}x{}x{}", c.model_stage, c.layout.tp, c.layout.pp, c.dp)?;
        }
        Ok(())
    }
}

impl Plan {
    /// The plan in a few characters for a console line: each model-stage's `tp·pp·dp` digits,
    /// in plan order (`114/222/…`).
    pub fn compact(&self) -> String {
        self.placements
            .iter()
            .map(|p| format!("{}{}{}", p.candidate.layout.tp, p.candidate.layout.pp, p.candidate.dp))
            .collect::<Vec<_>>()
            .join("/")
    }

    /// The same plan with every rank `r` renamed `f(r)` (a pool that is not the first ranks of
    /// the world: the planner lays plans out on `0..N`, the job runs them on the pool's ranks).
    pub fn map_ranks(&self, f: impl Fn(i32) -> i32) -> Plan {
        let placements = self
            .placements
            .iter()
            .map(|p| Placement { candidate: p.candidate, ranks: p.ranks.iter().map(|&r| f(r)).collect() })
            .collect();
        Plan { placements }
    }

    /// Checks rank counts, the pool, and that no rank holds two replicas of one model-stage.
    /// Model-stages may share ranks, in one stage too: they then run one after another there.
    pub fn validate(&self, pool: u32) -> Result<(), PlanError> {
        // The placement (counted from 1) that last listed each rank.
        let mut listed_by = vec![0usize; pool as usize];
        for (i, p) in self.placements.iter().enumerate() {
            let ms = p.candidate.model_stage;
            if p.ranks.len() != p.candidate.ranks() as usize {
                return Err(PlanError::RankCount { model_stage: ms, got: p.ranks.len(), want: p.candidate.ranks() });
            }
            for &r in &p.ranks {
                if r < 0 || r as u32 >= pool {
                    return Err(PlanError::OutsidePool { model_stage: ms, rank: r, pool });
                }
                if std::mem::replace(&mut listed_by[r as usize], i + 1) == i + 1 {
                    return Err(PlanError::RepeatedRank { model_stage: ms, rank: r });
                }
            }
        }
        Ok(())
    }

    /// The step latency of the execution-overlap graph: stages run one after another; inside a
    /// stage, model-stages sharing ranks serialize and groups on disjoint ranks overlap, so a
    /// stage takes the longest chain of rank-sharing model-stages.
    pub fn step_latency(&self, latency_of: impl Fn(&Placement) -> f64) -> f64 {
        [Stage::Generation, Stage::Inference, Stage::Training]
            .into_iter()
            .map(|stage| {
                let nodes: Vec<(&[i32], f64)> = self
                    .placements
                    .iter()
                    .filter(|p| p.candidate.model_stage.stage == stage)
                    .map(|p| (p.ranks.as_slice(), latency_of(p)))
                    .collect();
                overlap_latency(&nodes)
            })
            .sum()
    }
}

/// The latency of one stage's execution-overlap graph: `nodes` (rank set, seconds) that share a
/// rank, directly or through others, run one after another; such groups run concurrently.
pub fn overlap_latency(nodes: &[(&[i32], f64)]) -> f64 {
    overlap_critical(nodes).0
}

/// The slowest group of one stage's execution-overlap graph: its latency and its nodes.
pub fn overlap_critical(nodes: &[(&[i32], f64)]) -> (f64, Vec<usize>) {
    overlap_groups(nodes)
        .into_iter()
        .map(|g| (g.iter().map(|&i| nodes[i].1).sum::<f64>(), g))
        .fold((0.0, Vec::new()), |best, g| if g.0 > best.0 { g } else { best })
}

/// Connected components of `nodes` under "shares a rank", as node indices.
fn overlap_groups(nodes: &[(&[i32], f64)]) -> Vec<Vec<usize>> {
    let mut group: Vec<usize> = (0..nodes.len()).collect();
    fn root(g: &mut [usize], mut i: usize) -> usize {
        while g[i] != i {
            g[i] = g[g[i]];
            i = g[i];
        }
        i
    }
    // Each rank joins every node that uses it to the first node seen on it (a negative rank,
    // which no valid plan has, joins nothing).
    let pool = nodes.iter().flat_map(|(ranks, _)| ranks.iter()).map(|&r| r.max(-1) + 1).max().unwrap_or(0);
    let mut first_on = vec![usize::MAX; pool as usize];
    for (i, (ranks, _)) in nodes.iter().enumerate() {
        for &r in ranks.iter() {
            let Some(seen) = usize::try_from(r).ok().and_then(|r| first_on.get_mut(r)) else { continue };
            if *seen == usize::MAX {
                *seen = i;
            } else if *seen != i {
                let (a, b) = (root(&mut group, i), root(&mut group, *seen));
                group[a] = b;
            }
        }
    }
    // By root, in order of the root's index.
    let mut members: Vec<Vec<usize>> = vec![Vec::new(); nodes.len()];
    for i in 0..nodes.len() {
        let r = root(&mut group, i);
        members[r].push(i);
    }
    members.retain(|m| !m.is_empty());
    members
}

#[cfg(test)]
mod tests {
    use super::*;

    fn place(role: Role, stage: Stage, ranks: Vec<i32>) -> Placement {
        let n = ranks.len() as u32;
        Placement {
            candidate: Candidate {
                model_stage: ModelStage::new(role, stage),
                layout: Layout::new(1, 1),
                dp: n,
                recompute: Recompute::None,
                micro_batch: 1,
            },
            ranks,
        }
    }

    #[test]
    fn stages_add_up_and_disjoint_model_stages_overlap() {
        let plan = Plan {
            placements: vec![
                place(Role::Actor, Stage::Generation, vec![0, 1, 2, 3]),
                place(Role::Reference, Stage::Inference, vec![0, 1]),
                place(Role::Reward, Stage::Inference, vec![2, 3]),
                place(Role::Actor, Stage::Training, vec![0, 1, 2, 3]),
            ],
        };
        plan.validate(4).unwrap();
        let latency = |p: &Placement| match p.candidate.model_stage.role {
            Role::Actor => 10.0,
            Role::Reference => 3.0,
            _ => 5.0,
        };
        assert_eq!(plan.step_latency(latency), 10.0 + 5.0 + 10.0);
    }

    #[test]
    fn sharing_ranks_inside_a_stage_serializes_and_a_repeated_rank_is_invalid() {
        let plan = Plan {
            placements: vec![
                place(Role::Reference, Stage::Inference, vec![0, 1]),
                place(Role::Reward, Stage::Inference, vec![1, 2]),
            ],
        };
        plan.validate(4).unwrap();
        assert_eq!(plan.step_latency(|p| if p.candidate.model_stage.role == Role::Reward { 2.0 } else { 3.0 }), 5.0);
        let repeated = Plan { placements: vec![place(Role::Reward, Stage::Inference, vec![1, 1])] };
        assert!(matches!(repeated.validate(4), Err(PlanError::RepeatedRank { rank: 1, .. })));
        let outside = Plan { placements: vec![place(Role::Reward, Stage::Inference, vec![1, 2])] };
        assert!(matches!(outside.validate(2), Err(PlanError::OutsidePool { rank: 2, .. })));
    }

    #[test]
    fn algorithms_have_their_model_stages() {
        assert_eq!(model_stages(Algorithm::Ppo).len(), 6);
        assert_eq!(model_stages(Algorithm::Grpo).len(), 4);
        assert!(!model_stages(Algorithm::Remax).iter().any(|m| m.role == Role::Critic));
    }
}
