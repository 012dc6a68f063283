//! The list scheduler behind [`TransitionDag::plan`](super::TransitionDag::plan): one global
//! order for every node of every model-stage, timed and checked against memory.
//!
//! Earliest start first: among the ready nodes that fit, the one that can start first (after
//! its predecessors and its ranks' earlier nodes) runs next; ties go to Destroys, then to the
//! longest remaining path, then to stage order generation → inference → training. Ready nodes
//! are keyed by their earliest start ([`ready`]), which only grows, so stale keys are refreshed
//! when they come first; a node that does not fit waits on the ranks that block it until
//! something is freed there.

use petgraph::graph::NodeIndex;
use petgraph::Direction;
use rustc_hash::FxHashMap;

use super::{stage_rank, BuildWork, EdgeKind, NodeTiming, ResourceState, Schedule, TransitionDag, TransitionError};
use crate::index_list::format_index_list;
use crate::transition::local::Primitive;

mod ready;

use ready::ReadyQueue;

/// The tie rank's bits of a key (the node's position in priority order, below the Destroy bit).
const POSITION: u64 = !(1 << 63);

/// Every node's ranks ([`Node::ranks`](super::Node::ranks)), one node after another in one
/// vector: looked up at every pop, refreshed key and placement.
struct NodeRanks {
    /// Where each node's ranks begin in `ranks` (one more entry at the end).
    start: Vec<u32>,
    ranks: Vec<u32>,
}

impl NodeRanks {
    fn of(dag: &TransitionDag) -> NodeRanks {
        let n = dag.graph.node_count();
        let mut start = Vec::with_capacity(n + 1);
        let mut ranks = Vec::with_capacity(2 * n);
        start.push(0);
        for node in dag.graph.node_weights() {
            ranks.extend(node.ranks(&dag.units).map(|r| r as u32));
            start.push(ranks.len() as u32);
        }
        NodeRanks { start, ranks }
    }

    /// The ranks of node `i`.
    fn of_node(&self, i: usize) -> &[u32] {
        &self.ranks[self.start[i] as usize..self.start[i + 1] as usize]
    }
}

/// One scheduling pass over a DAG.
pub(super) struct ListScheduler<'d> {
    dag: &'d TransitionDag,
    state: ResourceState,
    /// Seconds per byte staged through host memory when a Split or Merge is blocked by memory
    /// (`None`: nothing is staged).
    stage_to_host: Option<f64>,
    /// Per node: predecessors not yet scheduled.
    waiting: Vec<usize>,
    /// Per node: when its scheduled predecessors finish (all of them once it is ready).
    preds_finish: Vec<f64>,
    finish: Vec<f64>,
    /// Per rank: when its last scheduled node finishes.
    rank_free: Vec<f64>,
    ranks: NodeRanks,
    /// Nodes by tie-break priority; a key's low bits index this.
    by_priority: Vec<usize>,
    /// Per node: its tie-break rank (not-Destroy in the top bit, then its priority position).
    tie: Vec<u64>,
    ready: ReadyQueue,
    /// Per rank: nodes blocked by memory there.
    blocked_on: Vec<Vec<usize>>,
    /// Entries in `blocked_on`, all ranks together (none: nothing to wake).
    blocked_entries: usize,
    is_blocked: Vec<bool>,
    first_block: Option<(usize, Vec<i32>, String)>,
    order: Vec<usize>,
    /// Release-before-acquire edges the schedule needs beyond the graph's.
    new_edges: Vec<(usize, usize)>,
    deps: Vec<usize>,
    /// Per node: the seconds its staging through host memory adds, when staged.
    staged: Vec<Option<f64>>,
    /// What the pass visited.
    work: BuildWork,
}

/// What a successful pass decided, for the DAG to take on.
pub(super) struct Scheduled {
    pub order: Vec<usize>,
    pub finish: Vec<f64>,
    pub staged: Vec<Option<f64>>,
    pub new_edges: Vec<(usize, usize)>,
    pub peak_bytes: u64,
}

impl<'d> ListScheduler<'d> {
    /// A pass over `dag` from memory `state`; with `stage_to_host`, blocked Splits and Merges
    /// may stage their sources through host memory at that bandwidth.
    pub fn new(dag: &'d TransitionDag, state: ResourceState, stage_to_host: Option<f64>) -> Self {
        let n = dag.graph.node_count();
        let pool = state.usage.len();
        let mut waiting = vec![0; n];
        for edge in dag.graph.raw_edges() {
            waiting[edge.target().index()] += 1;
        }
        let mut work =
            BuildWork { node_visits: 2 * n as u64, edge_visits: dag.graph.edge_count() as u64, ..BuildWork::default() };
        let (by_priority, tie) = priorities(dag, &mut work);
        let mut scheduler = ListScheduler {
            dag,
            state,
            stage_to_host,
            waiting,
            preds_finish: vec![0.0; n],
            finish: vec![0.0; n],
            rank_free: vec![0.0; pool],
            ranks: NodeRanks::of(dag),
            by_priority,
            tie,
            ready: ReadyQueue::default(),
            blocked_on: vec![Vec::new(); pool],
            blocked_entries: 0,
            is_blocked: vec![false; n],
            first_block: None,
            order: Vec::with_capacity(n),
            new_edges: Vec::new(),
            deps: Vec::new(),
            staged: vec![None; n],
            work,
        };
        for i in (0..n).filter(|&i| scheduler.waiting[i] == 0) {
            scheduler.ready.push(0.0f64.to_bits(), scheduler.tie[i]);
        }
        scheduler
    }

    /// Schedules every node, or says which one is blocked and why; and what the pass visited,
    /// either way.
    pub fn run(mut self) -> (Result<Scheduled, TransitionError>, BuildWork) {
        while let Some((start_bits, tie)) = self.ready.pop() {
            self.work.node_visits += 1;
            let i = self.by_priority[(tie & POSITION) as usize];
            let start = self.earliest_start(i);
            if start.to_bits() > start_bits {
                // A stale key is put back under the node's start now. (Each ready node has one
                // key and its own tie rank, so the keys are distinct and the order is that of
                // the keys alone.)
                self.ready.push(start.to_bits(), tie);
                continue;
            }
            if self.admit(i) {
                self.place(i, start);
            }
        }
        if self.order.len() < self.dag.graph.node_count() {
            self.work.node_visits += self.dag.graph.node_count() as u64;
            return (Err(self.blocked()), self.work);
        }
        let work = self.work;
        let scheduled = Scheduled {
            order: self.order,
            finish: self.finish,
            staged: self.staged,
            new_edges: self.new_edges,
            peak_bytes: self.state.peak,
        };
        (Ok(scheduled), work)
    }

    /// Puts node `i` among the ready ones, keyed by when it could start now.
    fn push_ready(&mut self, i: usize) {
        // Starts are non-negative, so their bits order like the numbers.
        let start = self.earliest_start(i);
        self.ready.push(start.to_bits(), self.tie[i]);
    }

    /// When ready node `i` could start: after its predecessors and its ranks' earlier nodes.
    fn earliest_start(&self, i: usize) -> f64 {
        self.ranks.of_node(i).iter().map(|&r| self.rank_free[r as usize]).fold(self.preds_finish[i], f64::max)
    }

    /// Whether node `i` fits now (staged through host memory if it must and may); a node that
    /// does not waits on the ranks that block it.
    fn admit(&mut self, i: usize) -> bool {
        let node = &self.dag.graph[NodeIndex::new(i)];
        if let Err((ranks, reason)) = self.state.fits(node, false) {
            // Blocked by memory: a Split or Merge may still run with its sources in host memory.
            let stage = self.stage_to_host.filter(|_| node.stageable() && self.state.fits(node, true).is_ok());
            let Some(host) = stage else {
                for &r in &ranks {
                    self.blocked_on[r as usize].push(i);
                }
                self.blocked_entries += ranks.len();
                self.is_blocked[i] = true;
                self.first_block.get_or_insert((i, ranks, reason));
                return false;
            };
            self.staged[i] = Some(node.staging_seconds(host));
        }
        self.is_blocked[i] = false;
        true
    }

    /// Runs node `i` from `start` (or later, after the releases it acquires from), wakes what
    /// waited on the ranks it frees, and readies its successors.
    fn place(&mut self, i: usize, start: f64) {
        let dag = self.dag;
        let node = &dag.graph[NodeIndex::new(i)];
        self.state.apply_into(i, node, self.staged[i].is_some(), &mut self.deps);
        let begin = self.deps.iter().map(|&d| self.finish[d]).fold(start, f64::max);
        let graph = &dag.graph;
        self.work.edge_visits += self.deps.len() as u64;
        let added = self.deps.iter().copied().filter(|&d| !graph.contains_edge(NodeIndex::new(d), NodeIndex::new(i)));
        self.new_edges.extend(added.map(|d| (d, i)));
        self.finish[i] = begin + node.seconds + self.staged[i].unwrap_or(0.0);
        for &r in self.ranks.of_node(i) {
            self.rank_free[r as usize] = self.finish[i];
        }
        // Whatever waited on a rank this node freed may fit now.
        for &(r, _) in &node.release {
            if self.blocked_entries == 0 {
                break;
            }
            let waiting = std::mem::take(&mut self.blocked_on[r as usize]);
            self.blocked_entries -= waiting.len();
            for j in waiting {
                self.work.node_visits += 1;
                if self.is_blocked[j] {
                    self.is_blocked[j] = false;
                    self.push_ready(j);
                }
            }
        }
        self.order.push(i);
        for succ in graph.neighbors_directed(NodeIndex::new(i), Direction::Outgoing) {
            self.work.edge_visits += 1;
            let after = &mut self.preds_finish[succ.index()];
            *after = after.max(self.finish[i]);
            self.waiting[succ.index()] -= 1;
            if self.waiting[succ.index()] == 0 {
                self.push_ready(succ.index());
            }
        }
    }

    /// The error of a pass that left nodes unscheduled: the first node still blocked, with
    /// what blocks it now (else the first that ever was).
    fn blocked(&self) -> TransitionError {
        let (i, ranks, reason) = self.first_block.clone().expect("unscheduled nodes of an acyclic DAG are blocked");
        let n = self.dag.graph.node_count();
        let (i, ranks, reason) = (0..n).find(|&j| self.is_blocked[j]).map_or((i, ranks, reason.clone()), |j| {
            let node = &self.dag.graph[NodeIndex::new(j)];
            let (r, why) = self.state.fits(node, false).err().unwrap_or((vec![], reason.clone()));
            (j, r, why)
        });
        TransitionError::Blocked { primitive: self.dag.label(i), ranks: format_index_list(&ranks), reason }
    }
}

/// Nodes by tie-break priority — longest remaining path first, then stage order, then index —
/// and each node's tie rank: not-Destroy in the top bit (Destroys first), then its position.
fn priorities(dag: &TransitionDag, work: &mut BuildWork) -> (Vec<usize>, Vec<u64>) {
    let n = dag.graph.node_count();
    let bottom = dag.bottom_levels(work);
    work.node_visits += 2 * n as u64;
    // The order of (longest path, longest first; stage rank) as one integer per node: the
    // path's bits in `total_cmp` order, flipped, above the stage rank.
    let class_key = |i: usize, node: &super::Node| {
        let bits = bottom[i].to_bits();
        let ordered = if bits >> 63 == 1 { !bits } else { bits | 1 << 63 };
        (u128::from(!ordered) << 64) | stage_rank(node.model_stage.stage) as u128
    };
    // A transition has a handful of such classes (a kind of node of a model-stage), met in
    // runs of consecutive nodes: a counting sort lays the nodes out class by class, each class
    // in index order, asking a map only where a run begins.
    let mut classes: FxHashMap<u128, usize> = FxHashMap::default();
    let mut run = (u128::MAX, 0);
    let mut class_of = Vec::with_capacity(n);
    for (i, node) in dag.graph.node_weights().enumerate() {
        let key = class_key(i, node);
        if key != run.0 {
            let next = classes.len();
            run = (key, *classes.entry(key).or_insert(next));
        }
        class_of.push(run.1);
    }
    let mut sizes = vec![0; classes.len()];
    class_of.iter().for_each(|&c| sizes[c] += 1);
    let mut sorted: Vec<(u128, usize)> = classes.into_iter().collect();
    sorted.sort_unstable();
    let (mut first, mut at) = (vec![0; sizes.len()], 0);
    for &(_, c) in &sorted {
        first[c] = at;
        at += sizes[c];
    }
    let mut by_priority = vec![0; n];
    for (i, &c) in class_of.iter().enumerate() {
        by_priority[first[c]] = i;
        first[c] += 1;
    }
    let mut tie = vec![0u64; n];
    for (position, &i) in by_priority.iter().enumerate() {
        let destroy = matches!(dag.graph[NodeIndex::new(i)].primitive, Primitive::Destroy { .. });
        tie[i] = (u64::from(!destroy) << 63) | position as u64;
    }
    (by_priority, tie)
}

impl TransitionDag {
    /// Takes on a pass's decisions: staged nodes marked and slowed, resource edges added, the
    /// schedule timed (the pass already timed every node under the final edges: a node's start
    /// was bounded by its predecessors, the dependencies it acquired and its ranks' earlier
    /// nodes).
    pub(super) fn adopt(&mut self, s: Scheduled) {
        for (i, extra) in s.staged.iter().enumerate() {
            if let Some(seconds) = extra {
                let node = &mut self.graph[NodeIndex::new(i)];
                node.staged = true;
                node.seconds += seconds;
            }
        }
        for (d, i) in &s.new_edges {
            self.graph.add_edge(NodeIndex::new(*d), NodeIndex::new(*i), EdgeKind::Resource);
        }
        self.resource_edges = s.new_edges.len();
        self.work.node_visits += s.order.len() as u64;
        self.work.edge_visits += s.new_edges.len() as u64;
        let finish = &s.finish;
        let timings: Vec<NodeTiming> = s
            .order
            .iter()
            .map(|&i| NodeTiming {
                node: i,
                start: finish[i] - self.graph[NodeIndex::new(i)].seconds,
                finish: finish[i],
            })
            .collect();
        let seconds = finish.iter().copied().fold(0.0, f64::max);
        self.schedule = Schedule { order: s.order, timings, seconds, peak_bytes: s.peak_bytes };
    }
}
