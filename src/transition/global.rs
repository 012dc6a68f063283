//! The global DAG: every model-stage's local DAG, one schedule with release-before-acquire
//! resource edges, a memory check at every step, and the critical-path cost `L_tran`.

use petgraph::graph::{DiGraph, NodeIndex};
use petgraph::Direction;
use serde::Serialize;
use std::collections::{BTreeMap, BTreeSet};
use thiserror::Error;

use super::local::{local_dag, units_of, Primitive, Unit, UnitId};
use crate::model::{Layout, Position};
use crate::plan::{ModelStage, Plan, Stage};
use crate::topology::format_index_list;

/// Why a transition cannot be planned.
#[derive(Debug, Error)]
pub enum TransitionError {
    /// No primitive can proceed: every ready acquisition is blocked.
    #[error("transition infeasible: {primitive} is blocked on rank(s) {ranks}: {reason}; no state was moved")]
    Blocked {
        /// The blocked primitive.
        primitive: String,
        /// The ranks it cannot acquire.
        ranks: String,
        /// Memory or ownership.
        reason: String,
    },
    /// The plans do not describe the same model-stages.
    #[error("current and target plans differ in their model-stages: {0}")]
    Mismatch(String),
}

/// What the planner needs to know about the machine.
#[derive(Debug, Clone, Copy, Serialize)]
pub struct Links {
    /// Devices per node (ranks `n·d .. (n+1)·d` share node `n`).
    pub devices_per_node: u32,
    /// Bytes/s between two devices of a node.
    pub intra_bytes_per_s: f64,
    /// Bytes/s between devices of different nodes (per device).
    pub inter_bytes_per_s: f64,
    /// Bytes/s of local memory (for local slicing).
    pub memory_bytes_per_s: f64,
    /// Seconds to set up a communicator for a new rank set.
    pub setup_seconds: f64,
    /// Bytes each rank may hold.
    pub capacity_bytes: u64,
}

/// One node of the global DAG.
#[derive(Debug, Clone, Serialize)]
pub struct Node {
    /// The primitive.
    pub primitive: Primitive,
    /// Its model-stage.
    pub model_stage: ModelStage,
    /// Ranks taking part.
    pub ranks: Vec<i32>,
    /// Bytes it allocates per rank (before it frees anything).
    pub acquire: Vec<(i32, u64)>,
    /// Bytes it frees per rank when done.
    pub release: Vec<(i32, u64)>,
    /// Estimated duration, seconds.
    pub seconds: f64,
    /// Human-readable label.
    pub label: String,
}

/// Why an edge exists.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub enum EdgeKind {
    /// Inside a model-stage's local DAG.
    Local,
    /// Release-before-acquire across model-stages.
    Resource,
}

/// Start and finish of one node in the schedule.
#[derive(Debug, Clone, Serialize)]
pub struct NodeTiming {
    /// Node label.
    pub label: String,
    /// Start, seconds after the transition begins.
    pub start: f64,
    /// Finish.
    pub finish: f64,
}

/// The order every rank follows, and its cost.
#[derive(Debug, Clone, Serialize)]
pub struct Schedule {
    /// Nodes in the one global order.
    pub order: Vec<usize>,
    /// Per node (in order): when it runs.
    pub timings: Vec<NodeTiming>,
    /// `L_tran`: the critical path, seconds.
    pub seconds: f64,
    /// Highest bytes held on any rank at any point.
    pub peak_bytes: u64,
}

/// A planned transition.
#[derive(Debug, Clone)]
pub struct TransitionDag {
    /// Nodes and edges.
    pub graph: DiGraph<Node, EdgeKind>,
    /// Every unit: current, intermediate and target.
    pub units: BTreeMap<UnitId, Unit>,
    /// Units alive at the start.
    pub initial: Vec<UnitId>,
    /// Units alive at the end, per model-stage.
    pub targets: BTreeMap<ModelStage, Vec<UnitId>>,
    /// Resource edges added.
    pub resource_edges: usize,
    /// The schedule.
    pub schedule: Schedule,
}

const STAGES: [Stage; 3] = [Stage::Generation, Stage::Inference, Stage::Training];

fn stage_rank(s: Stage) -> usize {
    STAGES.iter().position(|x| *x == s).unwrap_or(0)
}

impl TransitionDag {
    /// Plans the transition from `current` to `target`. `bytes(ms, layout, position)` is the
    /// state one position of a unit holds. With `cross_model_stage = false`, each model-stage
    /// is scheduled as if alone (the per-component baseline): no resource edges, no check
    /// against other model-stages' memory or ranks.
    pub fn plan(current: &Plan, target: &Plan, bytes: &dyn Fn(ModelStage, Layout, Position) -> u64, links: &Links, cross_model_stage: bool) -> Result<TransitionDag, TransitionError> {
        let mut next = 0;
        let mut units: BTreeMap<UnitId, Unit> = BTreeMap::new();
        let mut initial = Vec::new();
        let mut graph: DiGraph<Node, EdgeKind> = DiGraph::new();
        let mut targets = BTreeMap::new();
        for placement in &current.placements {
            let ms = placement.candidate.model_stage;
            let goal = target.placements.iter().find(|p| p.candidate.model_stage == ms).ok_or_else(|| TransitionError::Mismatch(format!("{ms} has no target")))?;
            let cur = units_of(placement, &mut next);
            let want: Vec<(Layout, Vec<i32>)> = (0..goal.candidate.dp as usize).map(|r| (goal.candidate.layout, goal.replica(r).to_vec())).collect();
            let local = local_dag(&cur, &want, &mut next);
            for u in cur.iter().chain(&local.units) {
                units.insert(u.id, u.clone());
            }
            initial.extend(cur.iter().map(|u| u.id));
            let base = graph.node_count();
            for p in &local.nodes {
                let node = make_node(p.clone(), ms, &units, bytes, links);
                graph.add_node(node);
            }
            for (a, b) in &local.edges {
                graph.add_edge(NodeIndex::new(base + a), NodeIndex::new(base + b), EdgeKind::Local);
            }
            targets.insert(ms, local.targets);
        }
        if target.placements.len() != current.placements.len() {
            return Err(TransitionError::Mismatch("different numbers of model-stages".into()));
        }
        let mut dag = TransitionDag { graph, units, initial, targets, resource_edges: 0, schedule: Schedule { order: vec![], timings: vec![], seconds: 0.0, peak_bytes: 0 } };
        dag.schedule(bytes, links, cross_model_stage)?;
        Ok(dag)
    }

    /// List scheduling: Destroys as soon as they are ready; otherwise the first ready
    /// acquisition (stage order, then index) that fits; resource edges record which Destroys
    /// a blocked acquisition waited for.
    fn schedule(&mut self, bytes: &dyn Fn(ModelStage, Layout, Position) -> u64, links: &Links, cross: bool) -> Result<(), TransitionError> {
        let n = self.graph.node_count();
        let mut usage: BTreeMap<i32, u64> = BTreeMap::new();
        let mut holders: BTreeMap<(Stage, i32), BTreeMap<ModelStage, usize>> = BTreeMap::new();
        for id in &self.initial {
            let u = &self.units[id];
            for (k, &r) in u.ranks.iter().enumerate() {
                *usage.entry(r).or_default() += bytes(u.model_stage, u.layout, u.layout.position(k));
                *holders.entry((u.model_stage.stage, r)).or_default().entry(u.model_stage).or_default() += 1;
            }
        }
        let mut peak = usage.values().copied().max().unwrap_or(0);
        let mut waiting: Vec<usize> = (0..n).map(|i| self.graph.neighbors_directed(NodeIndex::new(i), Direction::Incoming).count()).collect();
        let mut done = vec![false; n];
        // Per rank: (node, bytes) freed there so far by each node.
        let mut releases: BTreeMap<i32, Vec<(usize, u64)>> = BTreeMap::new();
        let mut order = Vec::with_capacity(n);
        let mut new_edges: Vec<(usize, usize)> = Vec::new();
        while order.len() < n {
            let mut ready: Vec<usize> = (0..n).filter(|&i| !done[i] && waiting[i] == 0).collect();
            ready.sort_by_key(|&i| (!matches!(self.graph[NodeIndex::new(i)].primitive, Primitive::Destroy { .. }), stage_rank(self.graph[NodeIndex::new(i)].model_stage.stage), i));
            let fits = |i: usize, usage: &BTreeMap<i32, u64>, holders: &BTreeMap<(Stage, i32), BTreeMap<ModelStage, usize>>| -> Result<(), (Vec<i32>, String)> {
                let node = &self.graph[NodeIndex::new(i)];
                let mut short = Vec::new();
                let mut reason = String::new();
                for &(r, b) in &node.acquire {
                    let others: Vec<ModelStage> = holders.get(&(node.model_stage.stage, r)).map(|h| h.keys().copied().filter(|m| *m != node.model_stage).collect()).unwrap_or_default();
                    let over = usage.get(&r).copied().unwrap_or(0) + b > links.capacity_bytes;
                    if cross && (over || !others.is_empty()) {
                        short.push(r);
                        reason = if over { format!("needs {b} bytes on a rank holding {} of {}", usage.get(&r).copied().unwrap_or(0), links.capacity_bytes) } else { format!("still held by {}", others[0]) };
                    }
                }
                if short.is_empty() { Ok(()) } else { Err((short, reason)) }
            };
            let mut chosen = None;
            let mut first_block = None;
            for &i in &ready {
                match fits(i, &usage, &holders) {
                    Ok(()) => {
                        chosen = Some(i);
                        break;
                    }
                    Err(why) => {
                        first_block.get_or_insert((i, why));
                    }
                }
            }
            let Some(i) = chosen else {
                let (i, (ranks, reason)) = first_block.expect("a ready node exists while nodes remain (the DAG is acyclic)");
                return Err(TransitionError::Blocked { primitive: self.graph[NodeIndex::new(i)].label.clone(), ranks: format_index_list(&ranks), reason });
            };
            let node = self.graph[NodeIndex::new(i)].clone();
            if cross {
                // Release-before-acquire: an earlier node of another model-stage that freed a
                // rank this one acquires is a dependency when the rank was exclusive to it (same
                // stage) or when, without what it freed, this acquisition would not fit.
                let mut seen = BTreeSet::new();
                for &(r, b) in &node.acquire {
                    let mut freed_by_others = 0;
                    let mut owners_seen = BTreeSet::new();
                    for &(d, freed) in releases.get(&r).into_iter().flatten().rev() {
                        let other = self.graph[NodeIndex::new(d)].model_stage;
                        if other == node.model_stage {
                            continue;
                        }
                        // Only the latest release of each other same-stage model-stage matters.
                        let exclusive = other.stage == node.model_stage.stage && owners_seen.insert(other);
                        let needed = usage.get(&r).copied().unwrap_or(0) + b + freed_by_others > links.capacity_bytes.saturating_sub(freed);
                        freed_by_others += freed;
                        if (exclusive || needed) && seen.insert(d) && !self.graph.contains_edge(NodeIndex::new(d), NodeIndex::new(i)) {
                            new_edges.push((d, i));
                        }
                    }
                }
            }
            for &(r, b) in &node.acquire {
                let u = usage.entry(r).or_default();
                *u += b;
                peak = peak.max(*u);
            }
            for &(r, b) in &node.release {
                let u = usage.entry(r).or_default();
                *u = u.saturating_sub(b);
                releases.entry(r).or_default().push((i, b));
            }
            for id in node.primitive.creates() {
                for &r in &self.units[&id].ranks {
                    *holders.entry((node.model_stage.stage, r)).or_default().entry(node.model_stage).or_default() += 1;
                }
            }
            for id in node.primitive.frees() {
                for &r in &self.units[&id].ranks {
                    let h = holders.entry((node.model_stage.stage, r)).or_default();
                    if let Some(c) = h.get_mut(&node.model_stage) {
                        *c -= 1;
                        if *c == 0 {
                            h.remove(&node.model_stage);
                        }
                    }
                }
            }
            done[i] = true;
            order.push(i);
            for succ in self.graph.neighbors_directed(NodeIndex::new(i), Direction::Outgoing).collect::<Vec<_>>() {
                waiting[succ.index()] -= 1;
            }
        }
        for (d, i) in &new_edges {
            self.graph.add_edge(NodeIndex::new(*d), NodeIndex::new(*i), EdgeKind::Resource);
        }
        self.resource_edges = new_edges.len();
        self.schedule = self.cost(order, peak, links);
        Ok(())
    }

    /// Critical path of the order: a node starts when its predecessors and all its ranks'
    /// earlier nodes have finished.
    fn cost(&self, order: Vec<usize>, peak: u64, _links: &Links) -> Schedule {
        let mut finish = vec![0.0f64; self.graph.node_count()];
        let mut rank_free: BTreeMap<i32, f64> = BTreeMap::new();
        let mut timings = Vec::with_capacity(order.len());
        for &i in &order {
            let node = &self.graph[NodeIndex::new(i)];
            let after_preds = self.graph.neighbors_directed(NodeIndex::new(i), Direction::Incoming).map(|p| finish[p.index()]).fold(0.0, f64::max);
            let after_ranks = node.ranks.iter().map(|r| rank_free.get(r).copied().unwrap_or(0.0)).fold(0.0, f64::max);
            let start = after_preds.max(after_ranks);
            finish[i] = start + node.seconds;
            for r in &node.ranks {
                rank_free.insert(*r, finish[i]);
            }
            timings.push(NodeTiming { label: node.label.clone(), start, finish: finish[i] });
        }
        let seconds = finish.iter().copied().fold(0.0, f64::max);
        Schedule { order, timings, seconds, peak_bytes: peak }
    }

    /// The units alive at the end of the schedule (for checks).
    pub fn final_units(&self) -> BTreeSet<UnitId> {
        let mut alive: BTreeSet<UnitId> = self.initial.iter().copied().collect();
        for &i in &self.schedule.order {
            let p = &self.graph[NodeIndex::new(i)].primitive;
            for id in p.frees() {
                alive.remove(&id);
            }
            for id in p.creates() {
                alive.insert(id);
            }
        }
        alive
    }
}

fn node_of(links: &Links, r: i32) -> i32 {
    r / links.devices_per_node as i32
}

fn per_rank(unit: &Unit, bytes: &dyn Fn(ModelStage, Layout, Position) -> u64) -> Vec<(i32, u64)> {
    unit.ranks.iter().enumerate().map(|(k, &r)| (r, bytes(unit.model_stage, unit.layout, unit.layout.position(k)))).collect()
}

/// A node with its rank set, memory effects and estimated duration.
fn make_node(p: Primitive, ms: ModelStage, units: &BTreeMap<UnitId, Unit>, bytes: &dyn Fn(ModelStage, Layout, Position) -> u64, links: &Links) -> Node {
    let u = |id: &UnitId| &units[id];
    let bw = |a: i32, b: i32| if node_of(links, a) == node_of(links, b) { links.intra_bytes_per_s } else { links.inter_bytes_per_s };
    let (ranks, acquire, release, seconds, label) = match &p {
        Primitive::Split { source, parts } => {
            let src = u(source);
            let acquire: Vec<(i32, u64)> = parts.iter().flat_map(|id| per_rank(u(id), bytes)).collect();
            let held = per_rank(src, bytes);
            // Each rank receives what its new shard has beyond its old one, from its unit's ranks.
            let slowest_bw = src.ranks.iter().flat_map(|&a| src.ranks.iter().map(move |&b| (a, b))).map(|(a, b)| bw(a, b)).fold(f64::INFINITY, f64::min);
            let incoming = acquire.iter().map(|(r, b)| b.saturating_sub(held.iter().find(|(x, _)| x == r).map_or(0, |(_, h)| *h))).max().unwrap_or(0);
            let secs = incoming as f64 / slowest_bw + links.setup_seconds;
            (src.ranks.clone(), acquire, held, secs, format!("Split {ms} {:?} {} -> {} on [{}]", source, src.layout, u(&parts[0]).layout, format_index_list(&sorted(&src.ranks))))
        }
        Primitive::Extend { source, copy } => {
            let (src, dst) = (u(source), u(copy));
            let acquire = per_rank(dst, bytes);
            let secs = acquire.iter().zip(&src.ranks).map(|((r, b), s)| *b as f64 / bw(*s, *r)).fold(0.0, f64::max) + links.setup_seconds;
            let mut ranks = src.ranks.clone();
            ranks.extend(&dst.ranks);
            (ranks, acquire, vec![], secs, format!("Extend {ms} {:?} [{}] -> [{}]", source, format_index_list(&sorted(&src.ranks)), format_index_list(&sorted(&dst.ranks))))
        }
        Primitive::Merge { parts, merged } => {
            let m = u(merged);
            let acquire = per_rank(m, bytes);
            let release: Vec<(i32, u64)> = parts.iter().flat_map(|id| per_rank(u(id), bytes)).collect();
            let secs = acquire.iter().map(|(_, b)| *b as f64 / links.memory_bytes_per_s).fold(0.0, f64::max);
            (m.ranks.clone(), acquire, release, secs, format!("Merge {ms} -> {} on [{}]", m.layout, format_index_list(&sorted(&m.ranks))))
        }
        Primitive::Destroy { unit } => {
            let x = u(unit);
            (x.ranks.clone(), vec![], per_rank(x, bytes), 0.0, format!("Destroy {ms} {:?} on [{}]", unit, format_index_list(&sorted(&x.ranks))))
        }
    };
    Node { primitive: p, model_stage: ms, ranks, acquire, release, seconds, label }
}

fn sorted(ranks: &[i32]) -> Vec<i32> {
    let mut r = ranks.to_vec();
    r.sort_unstable();
    r
}

#[cfg(test)]
mod tests;
