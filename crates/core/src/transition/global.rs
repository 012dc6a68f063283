//! The global DAG: every model-stage's local DAG, one schedule with release-before-acquire
//! resource edges, a memory check at every step, and the critical-path cost `L_tran`.

use petgraph::graph::{DiGraph, NodeIndex};
use petgraph::Direction;
use rustc_hash::{FxHashMap, FxHashSet};
use serde::Serialize;
use std::collections::BTreeMap;
use thiserror::Error;

use super::local::{local_dag, units_of, Primitive, Unit, UnitId};
use crate::cost::Hardware;
use crate::index_list::format_index_list;
use crate::model::{Layout, Position};
use crate::plan::{ModelStage, Plan, Stage};

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
    /// Bytes/s between a rank's device memory and its host memory, when a transition blocked by
    /// memory may stage a Split's or Merge's sources through host memory (`None`: it may not).
    pub host_bytes_per_s: Option<f64>,
    /// Cores a node's ranks share for their copies, where ranks stand in for devices on a CPU
    /// node (`None`: every rank copies on its own device, as a GPU's engines do).
    pub cores_per_node: Option<u32>,
}

impl Links {
    /// The links of `hardware`'s pool; with `host_bytes_per_s`, transitions blocked by memory
    /// may stage through host memory at that rate.
    pub fn of(hardware: &Hardware, host_bytes_per_s: Option<f64>) -> Links {
        Links {
            devices_per_node: hardware.devices_per_node,
            intra_bytes_per_s: hardware.intra_bytes_per_s,
            inter_bytes_per_s: hardware.inter_bytes_per_s,
            memory_bytes_per_s: hardware.hbm_bytes_per_s,
            setup_seconds: hardware.communicator_setup_s,
            capacity_bytes: hardware.usable_bytes(),
            host_bytes_per_s,
            cores_per_node: hardware.cores_per_node,
        }
    }
}

/// One node of the global DAG.
#[derive(Debug, Clone, Serialize)]
pub struct Node {
    /// The primitive.
    pub primitive: Primitive,
    /// Its model-stage.
    pub model_stage: ModelStage,
    /// Bytes it allocates per rank (before it frees anything).
    pub acquire: Vec<(i32, u64)>,
    /// Bytes it frees per rank when done.
    pub release: Vec<(i32, u64)>,
    /// Estimated duration, seconds.
    pub seconds: f64,
    /// Pack/unpack buffer bytes it may need on each rank it acquires on, only while it runs.
    pub transient: u64,
    /// Whether its sources go to host memory before its new units are allocated (a Split or
    /// Merge that cannot fit beside its sources; `seconds` includes both copies).
    pub staged: bool,
    /// Seconds each rank spends copying bytes into its new units (receiving, or slicing and
    /// concatenating locally) at its links' rates.
    pub copying: Vec<(i32, f64)>,
}

impl Node {
    /// Whether staging can help this node: it frees its sources on the ranks it acquires on.
    fn stageable(&self) -> bool {
        matches!(self.primitive, Primitive::Split { .. } | Primitive::Merge { .. })
    }

    /// Seconds of copying the sources out to host memory and back in, at `host` bytes/s.
    fn staging_seconds(&self, host: f64) -> f64 {
        2.0 * self.release.iter().map(|(_, b)| *b).max().unwrap_or(0) as f64 / host
    }
}

impl Node {
    /// The ranks taking part, each once: the unit's ranks, or for an Extend or a Sync the
    /// source's and then the copy's or target's.
    pub fn ranks<'u>(&self, units: &'u Units) -> impl Iterator<Item = i32> + 'u {
        let (a, b): (&[i32], &[i32]) = match &self.primitive {
            Primitive::Split { source, .. } => (&units[source].ranks, &[]),
            Primitive::Extend { source, copy } => (&units[source].ranks, &units[copy].ranks),
            Primitive::Merge { merged, .. } => (&units[merged].ranks, &[]),
            Primitive::Destroy { unit } => (&units[unit].ranks, &[]),
            Primitive::Sync { source, target } => (&units[source].ranks, &units[target].ranks),
        };
        // A Sync's target may share ranks with its source (an Extend's copy never does).
        a.iter().chain(b.iter().filter(move |r| !a.contains(r))).copied()
    }

    /// `Split actor/training UnitId(3) (tp=2, pp=2) -> (tp=1, pp=2) on [0-3]` and the like
    /// (built on demand: plans of thousands of nodes need no strings).
    pub fn label(&self, units: &Units) -> String {
        let ms = self.model_stage;
        let on = |id: &UnitId| format_index_list(&sorted(&units[id].ranks));
        match &self.primitive {
            Primitive::Split { source, parts } => format!(
                "Split {ms} {source:?} {} -> {} on [{}]",
                units[source].layout,
                units[&parts[0]].layout,
                on(source)
            ),
            Primitive::Extend { source, copy } => format!("Extend {ms} {source:?} [{}] -> [{}]", on(source), on(copy)),
            Primitive::Merge { merged, .. } => format!("Merge {ms} -> {} on [{}]", units[merged].layout, on(merged)),
            Primitive::Destroy { unit } => format!("Destroy {ms} {unit:?} on [{}]", on(unit)),
            Primitive::Sync { source, target } => format!(
                "Sync {} {source:?} {} [{}] -> {ms} {target:?} {} [{}]",
                units[source].model_stage,
                units[source].layout,
                on(source),
                units[target].layout,
                on(target)
            ),
        }
    }
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
    /// Node index in the graph (`TransitionDag::label` names it).
    pub node: usize,
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
    /// `L_tran`: the critical path, or where ranks share a CPU node's cores, the node's copying
    /// over its cores when that is longer; seconds.
    pub seconds: f64,
    /// Highest bytes held on any rank at any point.
    pub peak_bytes: u64,
}

/// The work one [`TransitionDag::plan`] did, counted by its passes as they go: a machine-free
/// measure of the build's cost that CI bounds by the DAG's size, so that a pass which looks at
/// every node once per node fails a test on any machine. Each pass counts what it visits.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct BuildWork {
    /// Nodes looked at, over every pass (a node counts each time a pass looks at it).
    pub node_visits: u64,
    /// Edges followed or looked up, over every pass.
    pub edge_visits: u64,
    /// Units looked at while the local DAGs are built and gathered
    /// ([`LocalDag::unit_visits`](super::local::LocalDag::unit_visits), and one each).
    pub unit_visits: u64,
}

impl BuildWork {
    /// Node, edge and unit visits together.
    pub fn total(&self) -> u64 {
        self.node_visits + self.edge_visits + self.unit_visits
    }

    fn add(&mut self, other: BuildWork) {
        self.node_visits += other.node_visits;
        self.edge_visits += other.edge_visits;
        self.unit_visits += other.unit_visits;
    }
}

/// A planned transition.
#[derive(Debug, Clone)]
pub struct TransitionDag {
    /// Nodes and edges.
    pub graph: DiGraph<Node, EdgeKind>,
    /// Every unit: current, intermediate and target.
    pub units: Units,
    /// Units alive at the start.
    pub initial: Vec<UnitId>,
    /// Units alive at the end, per model-stage.
    pub targets: BTreeMap<ModelStage, Vec<UnitId>>,
    /// Resource edges added.
    pub resource_edges: usize,
    /// The schedule.
    pub schedule: Schedule,
    /// The work its build did.
    pub work: BuildWork,
}

/// Every unit of a transition, indexed by its id (ids are dense, in creation order).
#[derive(Debug, Clone, Default)]
pub struct Units {
    units: Vec<Unit>,
    /// One more than the highest rank of any unit so far (kept as units come: every pass
    /// sizes its per-rank state by it).
    pool: usize,
}

impl Units {
    fn push(&mut self, unit: Unit) {
        debug_assert_eq!(unit.id.0, self.units.len(), "unit ids are dense and in creation order");
        let highest = unit.ranks.iter().copied().max().map_or(0, |r| r as usize + 1);
        self.pool = self.pool.max(highest);
        self.units.push(unit);
    }

    /// One more than the highest rank any unit uses.
    pub fn pool(&self) -> usize {
        self.pool
    }

    /// How many units.
    pub fn len(&self) -> usize {
        self.units.len()
    }

    /// Whether there are none.
    pub fn is_empty(&self) -> bool {
        self.units.is_empty()
    }
}

impl std::ops::Index<UnitId> for Units {
    type Output = Unit;
    fn index(&self, id: UnitId) -> &Unit {
        &self.units[id.0]
    }
}

impl std::ops::Index<&UnitId> for Units {
    type Output = Unit;
    fn index(&self, id: &UnitId) -> &Unit {
        &self.units[id.0]
    }
}

const STAGES: [Stage; 3] = [Stage::Generation, Stage::Inference, Stage::Training];

fn stage_rank(s: Stage) -> usize {
    STAGES.iter().position(|x| *x == s).unwrap_or(0)
}

/// How far a transition's schedule looks across model-stages.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Coordination {
    /// Nereus's global DAG: release-before-acquire edges between model-stages, every rank's
    /// memory and time shared by all of them.
    Global,
    /// The per-component baseline: each model-stage scheduled as if alone (no resource edges,
    /// no check against other model-stages' memory or ranks).
    PerModelStage,
}

impl TransitionDag {
    /// Plans the transition from `current` to `target`. `bytes(ms, layout, position)` is the
    /// state one position of a unit holds; `coordination` says whether model-stages are
    /// scheduled together (Nereus) or each alone (the per-component baseline).
    pub fn plan(
        current: &Plan,
        target: &Plan,
        bytes: &dyn Fn(ModelStage, Layout, Position) -> u64,
        links: &Links,
        coordination: Coordination,
    ) -> Result<TransitionDag, TransitionError> {
        let cross_model_stage = coordination == Coordination::Global;
        for (name, plan) in [("current", current), ("target", target)] {
            let short = plan.placements.iter().find(|p| p.ranks.len() != (p.candidate.ranks()) as usize);
            if let Some(p) = short {
                return Err(TransitionError::Mismatch(format!(
                    "the {name} plan gives {} {} ranks for {} ({} replicas of {})",
                    p.candidate.model_stage,
                    p.ranks.len(),
                    p.candidate.ranks(),
                    p.candidate.dp,
                    p.candidate.layout
                )));
            }
        }
        let mut dag = TransitionDag::build(current, target, &mut Shards::new(bytes), links)?;
        // Staging through host memory is the fallback of a transition blocked by memory, not
        // a choice among equals: only when the plain schedule is blocked.
        match dag.schedule(bytes, links, cross_model_stage, None) {
            Err(TransitionError::Blocked { .. }) if cross_model_stage && links.host_bytes_per_s.is_some() => {
                dag.schedule(bytes, links, cross_model_stage, links.host_bytes_per_s)?
            }
            outcome => outcome?,
        }
        Ok(dag)
    }

    /// The weight sync of `plan` from `from` (a training model-stage) into `to` (a stage of the
    /// same model that does not train) as a transition that keeps every unit where it is: one
    /// Sync per replica of `to`, from replica `g mod dp` of `from` (spreading the senders),
    /// timed and ordered like any transition (nodes sharing ranks one after another). `None`
    /// when `plan` has no `from` or no `to` (GRPO has no critic).
    pub fn weight_sync(
        plan: &Plan,
        (from, to): (ModelStage, ModelStage),
        bytes: &dyn Fn(ModelStage, Layout, Position) -> u64,
        links: &Links,
    ) -> Result<Option<TransitionDag>, TransitionError> {
        if from.role != to.role || !from.trains() || to.trains() {
            return Err(TransitionError::Mismatch(format!("no weight sync from {from} into {to}")));
        }
        let mut shards = Shards::new(bytes);
        let mut dag = TransitionDag::build(plan, plan, &mut shards, links)?;
        debug_assert_eq!(dag.graph.node_count(), 0, "a plan moved onto itself keeps every unit");
        let of = |ms: ModelStage| -> Vec<UnitId> {
            dag.initial.iter().copied().filter(|u| dag.units[u].model_stage == ms).collect()
        };
        let (sources, targets) = (of(from), of(to));
        if sources.is_empty() || targets.is_empty() {
            return Ok(None);
        }
        let machine = Machine::new(links, dag.units.pool());
        for (g, &target) in targets.iter().enumerate() {
            let sync = Primitive::Sync { source: sources[g % sources.len()], target };
            let node = make_node(sync, to, &dag.units, &mut shards, &machine);
            dag.graph.add_node(node);
        }
        dag.work.node_visits += targets.len() as u64;
        // Memory is the planner's to check here: its placement-exact peaks count each rank's
        // own pack buffers for the sync (a Sync's `transient` is its largest rank's), and the
        // ledger refuses at run time what a restored plan cannot hold.
        dag.schedule(bytes, links, false, None)?;
        Ok(Some(dag))
    }

    /// Every model-stage's local DAG, as one graph of costed nodes (not yet scheduled).
    fn build(
        current: &Plan,
        target: &Plan,
        shards: &mut Shards,
        links: &Links,
    ) -> Result<TransitionDag, TransitionError> {
        let mut next = 0;
        let mut units = Units::default();
        let mut initial = Vec::new();
        let mut targets = BTreeMap::new();
        let mut locals = Vec::with_capacity(current.placements.len());
        let mut unit_visits = 0;
        for placement in &current.placements {
            let ms = placement.candidate.model_stage;
            let goal = target
                .placements
                .iter()
                .find(|p| p.candidate.model_stage == ms)
                .ok_or_else(|| TransitionError::Mismatch(format!("{ms} has no target")))?;
            let cur = units_of(placement, &mut next);
            let want: Vec<(Layout, &[i32])> =
                (0..goal.candidate.dp as usize).map(|r| (goal.candidate.layout, goal.replica(r))).collect();
            let mut local = local_dag(&cur, &want, &mut next);
            initial.extend(cur.iter().map(|u| u.id));
            unit_visits += local.unit_visits + (cur.len() + local.units.len()) as u64;
            for u in cur.into_iter().chain(std::mem::take(&mut local.units)) {
                units.push(u);
            }
            targets.insert(ms, std::mem::take(&mut local.targets));
            locals.push((ms, local));
        }
        if target.placements.len() != current.placements.len() {
            return Err(TransitionError::Mismatch("different numbers of model-stages".into()));
        }
        // Every local DAG is known before the graph is made: its storage is sized once.
        let nodes = locals.iter().map(|(_, l)| l.nodes.len()).sum();
        let edges = locals.iter().map(|(_, l)| l.edges.len()).sum();
        let mut graph: DiGraph<Node, EdgeKind> = DiGraph::with_capacity(nodes, edges);
        let machine = Machine::new(links, units.pool());
        for (ms, local) in locals {
            let base = graph.node_count();
            for p in local.nodes {
                graph.add_node(make_node(p, ms, &units, shards, &machine));
            }
            for (a, b) in &local.edges {
                graph.add_edge(NodeIndex::new(base + a), NodeIndex::new(base + b), EdgeKind::Local);
            }
        }
        let work = BuildWork { node_visits: nodes as u64, edge_visits: edges as u64, unit_visits };
        let mut dag = TransitionDag {
            graph,
            units,
            initial,
            targets,
            resource_edges: 0,
            schedule: Schedule { order: vec![], timings: vec![], seconds: 0.0, peak_bytes: 0 },
            work,
        };
        dag.copy_fused_pairs_once(shards, &machine);
        Ok(dag)
    }

    /// The Splits whose parts all go, and go only, into one Merge (no Extend copies a part, no
    /// Destroy frees one), mapped to that Merge: the pair is one layout change on the same ranks,
    /// run as one redistribution so that nothing the Merge would discard crosses ranks.
    pub fn fused_splits(&self) -> BTreeMap<usize, usize> {
        self.fused_pairs(&mut BuildWork::default())
    }

    /// [`TransitionDag::fused_splits`], counting its visits into `work`: one pass over the nodes
    /// to index the Merges by their smallest part and the units an Extend or Destroy uses, one
    /// to look each Split up.
    fn fused_pairs(&self, work: &mut BuildWork) -> BTreeMap<usize, usize> {
        work.node_visits += 2 * self.graph.node_count() as u64;
        let mut used_elsewhere = vec![false; self.units.len()];
        // Per unit: the first Merge (in node order) whose smallest part it is. A Split's parts
        // are a Merge's exactly when their smallest part leads to a Merge with the same parts.
        let mut by_smallest = vec![usize::MAX; self.units.len()];
        let (mut theirs, mut ours) = (Vec::new(), Vec::new());
        for (j, node) in self.graph.node_weights().enumerate() {
            match &node.primitive {
                Primitive::Extend { source, .. } | Primitive::Sync { source, .. } => used_elsewhere[source.0] = true,
                Primitive::Destroy { unit } => used_elsewhere[unit.0] = true,
                Primitive::Merge { parts, .. } => {
                    let Some(smallest) = parts.iter().min() else { return self.fused_pairs_by_sets() };
                    let first = by_smallest[smallest.0];
                    if first == usize::MAX {
                        by_smallest[smallest.0] = j;
                    } else if !same_units(self.parts_of(first), parts, &mut theirs, &mut ours) {
                        // Two different Merges share a unit (no planned DAG does): index by
                        // every set of parts instead.
                        return self.fused_pairs_by_sets();
                    }
                }
                Primitive::Split { .. } => {}
            }
        }
        let mut fused = BTreeMap::new();
        for (i, node) in self.graph.node_weights().enumerate() {
            let Primitive::Split { parts, .. } = &node.primitive else { continue };
            let Some(j) = parts.iter().min().map(|p| by_smallest[p.0]).filter(|&j| j != usize::MAX) else { continue };
            if same_units(self.parts_of(j), parts, &mut theirs, &mut ours) && !parts.iter().any(|p| used_elsewhere[p.0])
            {
                fused.insert(i, j);
            }
        }
        fused
    }

    /// The parts of Merge node `j`.
    fn parts_of(&self, j: usize) -> &[UnitId] {
        match &self.graph[NodeIndex::new(j)].primitive {
            Primitive::Merge { parts, .. } => parts,
            _ => &[],
        }
    }

    /// [`TransitionDag::fused_pairs`] for any DAG: Merges indexed by their sorted parts.
    fn fused_pairs_by_sets(&self) -> BTreeMap<usize, usize> {
        let mut used_elsewhere: FxHashSet<UnitId> = FxHashSet::default();
        // The first Merge of each set of parts, as a scan in node order would find it.
        let mut merges: FxHashMap<Vec<UnitId>, usize> = FxHashMap::default();
        for (j, node) in self.graph.node_weights().enumerate() {
            match &node.primitive {
                Primitive::Extend { source, .. } | Primitive::Sync { source, .. } => {
                    used_elsewhere.insert(*source);
                }
                Primitive::Destroy { unit } => {
                    used_elsewhere.insert(*unit);
                }
                Primitive::Merge { parts, .. } => {
                    merges.entry(sorted(parts)).or_insert(j);
                }
                Primitive::Split { .. } => {}
            }
        }
        let mut fused = BTreeMap::new();
        for (i, node) in self.graph.node_weights().enumerate() {
            let Primitive::Split { parts, .. } = &node.primitive else { continue };
            if let Some(&j) = merges.get(&sorted(parts)).filter(|_| !parts.iter().any(|p| used_elsewhere.contains(p))) {
                fused.insert(i, j);
            }
        }
        fused
    }

    /// The copying of each fused Split and Merge ([`TransitionDag::fused_splits`]) as the
    /// executor runs them, one redistribution: each rank fills its new shard once, receiving
    /// part of it and slicing the rest from its old shard (on a CPU node both are copies by its
    /// core, at about the same rate), where the two nodes priced apart copy most bytes twice.
    /// Their durations stay as priced apart (the critical path).
    fn copy_fused_pairs_once(&mut self, shards: &mut Shards, machine: &Machine) {
        let mut work = BuildWork::default();
        let fused = self.fused_pairs(&mut work);
        self.work.add(work);
        for (split, merge) in fused {
            let Primitive::Merge { merged, .. } = &self.graph[NodeIndex::new(merge)].primitive else { continue };
            let unit = &self.units[merged];
            let bw = machine.slowest_link(&unit.ranks);
            let copying = shards.per_rank(unit).into_iter().map(|(r, b)| (r, b as f64 / bw)).collect();
            self.graph[NodeIndex::new(split)].copying = copying;
            self.graph[NodeIndex::new(merge)].copying.clear();
        }
    }

    /// Orders, times and memory-checks every node ([`schedule::ListScheduler`]), adding the
    /// release-before-acquire edges the order needs.
    fn schedule(
        &mut self,
        bytes: &dyn Fn(ModelStage, Layout, Position) -> u64,
        links: &Links,
        cross: bool,
        stage_to_host: Option<f64>,
    ) -> Result<(), TransitionError> {
        let state = ResourceState::new(self, bytes, links.capacity_bytes, cross);
        let (scheduled, work) = schedule::ListScheduler::new(self, state, stage_to_host).run();
        self.work.add(work);
        self.adopt(scheduled?);
        self.schedule.seconds = self.schedule.seconds.max(self.shared_cores_seconds(links));
        Ok(())
    }

    /// The least time the transition can take where ranks share a CPU node's cores
    /// (`Links::cores_per_node`): each core copies at one rank's rate, so a node's copying,
    /// summed over its ranks, takes at least that sum over its cores, however the nodes
    /// overlap. `bench scaling`'s 4 → 8 extension on 2 cores has its four receiving ranks copy
    /// at once and measures twice the time of one pair. 0 without shared cores.
    fn shared_cores_seconds(&mut self, links: &Links) -> f64 {
        let Some(cores) = links.cores_per_node else { return 0.0 };
        self.work.node_visits += self.graph.node_count() as u64;
        let mut per_node = BTreeMap::<i32, f64>::new();
        for (r, seconds) in self.graph.node_weights().flat_map(|n| &n.copying) {
            *per_node.entry(node_of(links, *r)).or_default() += seconds;
        }
        per_node.values().fold(0.0, |m, &s| m.max(s / f64::from(cores.max(1))))
    }

    /// Longest path from each node to the end of the local DAG, its own duration included.
    fn bottom_levels(&self, work: &mut BuildWork) -> Vec<f64> {
        let n = self.graph.node_count();
        let mut level = vec![0.0f64; n];
        // A local DAG's phases come in node order (Splits, Extends, Destroys, Merges), and its
        // edges only go from one phase to a later one: then the node order is topological and
        // no sort is needed. The check follows every edge once, a sort every node and edge.
        work.edge_visits += self.graph.edge_count() as u64;
        let forward = self.graph.raw_edges().iter().all(|e| e.source() < e.target());
        let order: Vec<NodeIndex> = if forward {
            (0..n).map(NodeIndex::new).collect()
        } else {
            work.node_visits += n as u64;
            work.edge_visits += self.graph.edge_count() as u64;
            petgraph::algo::toposort(&self.graph, None).expect("local DAGs are acyclic")
        };
        // The sweep visits every node and edge once.
        work.node_visits += n as u64;
        work.edge_visits += self.graph.edge_count() as u64;
        for &i in order.iter().rev() {
            let below =
                self.graph.neighbors_directed(i, Direction::Outgoing).map(|s| level[s.index()]).fold(0.0, f64::max);
            level[i.index()] = self.graph[i].seconds + below;
        }
        level
    }

    /// Bytes that go through host memory (the sources of staged nodes, every rank together).
    pub fn staged_bytes(&self) -> u64 {
        self.graph.node_weights().filter(|n| n.staged).flat_map(|n| n.release.iter().map(|(_, b)| b)).sum()
    }

    /// Bytes each rank of the pool holds before the transition (the current plan's units).
    pub fn initial_bytes(&self, bytes: &dyn Fn(ModelStage, Layout, Position) -> u64) -> Vec<u64> {
        let mut usage = vec![0; self.units.pool()];
        let mut shards = Shards::new(bytes);
        for id in &self.initial {
            let unit = &self.units[id];
            for (&r, &b) in unit.ranks.iter().zip(shards.of(unit.model_stage, unit.layout)) {
                usage[r as usize] += b;
            }
        }
        usage
    }

    /// A readable name for node `i`.
    pub fn label(&self, i: usize) -> String {
        self.graph[NodeIndex::new(i)].label(&self.units)
    }
}

/// Memory while a schedule is walked: what every ordering decision, the list schedule's and
/// the exhaustive search's alike, is checked against. Indexed by rank. Model-stages may share
/// ranks (in one stage too: they then run one after another), so memory is the only limit.
#[derive(Clone)]
struct ResourceState {
    capacity: u64,
    cross: bool,
    usage: Vec<u64>,
    /// Per rank: the latest node of each model-stage that freed bytes there.
    last_release: Vec<[Option<(ModelStage, usize, u64)>; MAX_MODEL_STAGES]>,
    /// Per rank: the most bytes any release there freed, at least what each of its
    /// `last_release` freed (an acquisition that fits beside that needs none of them).
    most_freed: Vec<u64>,
    peak: u64,
}

/// Model-stages of the largest RL algorithm, with room to spare.
const MAX_MODEL_STAGES: usize = 8;

impl ResourceState {
    fn new(
        dag: &TransitionDag,
        bytes: &dyn Fn(ModelStage, Layout, Position) -> u64,
        capacity: u64,
        cross: bool,
    ) -> ResourceState {
        let usage = dag.initial_bytes(bytes);
        let pool = usage.len();
        let peak = usage.iter().copied().max().unwrap_or(0);
        let last_release = vec![[None; MAX_MODEL_STAGES]; pool];
        ResourceState { capacity, cross, usage, last_release, most_freed: vec![0; pool], peak }
    }

    /// `Ok` if `node`'s allocations fit now (with its sources already moved to host memory
    /// when `staged`); else the ranks short of room and why.
    fn fits(&self, node: &Node, staged: bool) -> Result<(), (Vec<i32>, String)> {
        if !self.cross {
            return Ok(());
        }
        let mut short = Vec::new();
        let mut reason = String::new();
        for &(r, b) in &node.acquire {
            let freed_first: u64 =
                if staged { node.release.iter().filter(|(x, _)| *x == r).map(|(_, b)| b).sum() } else { 0 };
            let used = self.usage[r as usize].saturating_sub(freed_first);
            // Staged sources are packed from host memory: no pack buffers on the device.
            let transient = if staged { 0 } else { node.transient };
            if used + b + transient > self.capacity {
                short.push(r);
                reason = format!(
                    "needs {b} bytes and {transient} of pack buffers on a rank holding {used} of {}",
                    self.capacity
                );
            }
        }
        if short.is_empty() {
            Ok(())
        } else {
            Err((short, reason))
        }
    }

    /// Runs node `i` (its sources first released when `staged`); puts into `deps` (cleared
    /// first) the earlier nodes of other model-stages it had to wait for (release-before-acquire):
    /// the latest release of another model-stage on a rank it acquires, when without what that
    /// release freed the allocation would not fit.
    fn apply_into(&mut self, i: usize, node: &Node, staged: bool, deps: &mut Vec<usize>) {
        deps.clear();
        if self.cross {
            for &(r, b) in &node.acquire {
                let used = self.usage[r as usize];
                // Beside the most any release here freed it fits: it needed none of them.
                let most = self.most_freed[r as usize];
                let total =
                    used.checked_add(b).and_then(|u| u.checked_add(node.transient)).and_then(|u| u.checked_add(most));
                if total.is_some_and(|total| total <= self.capacity) {
                    continue;
                }
                for &(other, d, freed) in self.last_release[r as usize].iter().flatten() {
                    let needed = used + b + node.transient + freed > self.capacity;
                    if other != node.model_stage && needed && !deps.contains(&d) {
                        deps.push(d);
                    }
                }
            }
        }
        let release = |s: &mut ResourceState| {
            for &(r, b) in &node.release {
                let u = &mut s.usage[r as usize];
                *u = u.saturating_sub(b);
                let most = &mut s.most_freed[r as usize];
                *most = (*most).max(b);
                let last = &mut s.last_release[r as usize];
                match last.iter_mut().position(|e| e.is_none_or(|(m, _, _)| m == node.model_stage)) {
                    Some(k) => last[k] = Some((node.model_stage, i, b)),
                    None => debug_assert!(false, "more than {MAX_MODEL_STAGES} model-stages"),
                }
            }
        };
        if staged {
            release(self);
        }
        for &(r, b) in &node.acquire {
            let u = &mut self.usage[r as usize];
            *u += b;
            self.peak = self.peak.max(*u);
        }
        if !staged {
            release(self);
        }
    }
}

fn node_of(links: &Links, r: i32) -> i32 {
    r / links.devices_per_node as i32
}

/// The links, and which node each rank of the pool is on: pricing the nodes asks it of every
/// rank they copy between, a division each otherwise.
struct Machine<'l> {
    links: &'l Links,
    node: Vec<i32>,
}

impl<'l> Machine<'l> {
    fn new(links: &'l Links, pool: usize) -> Machine<'l> {
        Machine { links, node: (0..pool as i32).map(|r| node_of(links, r)).collect() }
    }

    fn node_of(&self, r: i32) -> i32 {
        usize::try_from(r).ok().and_then(|k| self.node.get(k)).copied().unwrap_or_else(|| node_of(self.links, r))
    }

    /// Bytes/s between ranks `a` and `b`.
    fn link(&self, a: i32, b: i32) -> f64 {
        if self.node_of(a) == self.node_of(b) {
            self.links.intra_bytes_per_s
        } else {
            self.links.inter_bytes_per_s
        }
    }

    /// Bytes/s of the slowest link between `ranks`: a node's own, or between nodes.
    fn slowest_link(&self, ranks: &[i32]) -> f64 {
        let one_node = ranks.iter().all(|&r| self.node_of(r) == self.node_of(ranks[0]));
        if one_node {
            self.links.intra_bytes_per_s
        } else {
            self.links.inter_bytes_per_s
        }
    }
}

/// Bytes each rank of `unit` holds.
#[cfg(test)]
fn per_rank(unit: &Unit, bytes: &dyn Fn(ModelStage, Layout, Position) -> u64) -> Vec<(i32, u64)> {
    Shards::new(bytes).per_rank(unit)
}

/// The state bytes of every unit's positions, from `bytes` asked once per model-stage, layout
/// and pipeline stage: units of one layout of one model-stage hold the same shards whatever
/// their ranks, and a transition of thousands of units has a handful of layouts.
struct Shards<'b> {
    bytes: &'b dyn Fn(ModelStage, Layout, Position) -> u64,
    /// Per (model-stage, layout) asked for: the bytes of each position, in rank-list order.
    known: Vec<(ModelStage, Layout, Vec<u64>)>,
    /// The entries of `known` asked for last, latest first (units come in runs of one layout, or
    /// of two in turn: a Merge's target and its parts).
    recent: [usize; 2],
}

impl<'b> Shards<'b> {
    fn new(bytes: &'b dyn Fn(ModelStage, Layout, Position) -> u64) -> Shards<'b> {
        Shards { bytes, known: Vec::new(), recent: [0; 2] }
    }

    /// The bytes of each position of a `layout` unit of `ms`, in rank-list order.
    fn of(&mut self, ms: ModelStage, layout: Layout) -> &[u64] {
        let hit = |(m, l, _): &(ModelStage, Layout, Vec<u64>)| *m == ms && *l == layout;
        if !self.known.get(self.recent[0]).is_some_and(hit) {
            let k = if self.known.get(self.recent[1]).is_some_and(hit) {
                self.recent[1]
            } else if let Some(k) = self.known.iter().position(hit) {
                k
            } else {
                // Ranks are TP-fastest and TP positions of a stage hold equal shards: ask once per
                // stage, at its first position.
                let stages: Vec<u64> =
                    (0..layout.pp).map(|pp| (self.bytes)(ms, layout, Position { tp: 0, pp })).collect();
                let positions = (0..layout.size() as usize).map(|k| stages[layout.position(k).pp as usize]);
                self.known.push((ms, layout, positions.collect()));
                self.known.len() - 1
            };
            self.recent = [k, self.recent[0]];
        }
        &self.known[self.recent[0]].2
    }

    /// Bytes each rank of `unit` holds, appended to `out`.
    fn per_rank_into(&mut self, unit: &Unit, out: &mut Vec<(i32, u64)>) {
        let shard = self.of(unit.model_stage, unit.layout);
        out.extend(unit.ranks.iter().zip(shard).map(|(&r, &b)| (r, b)));
    }

    /// Bytes each rank of `unit` holds.
    fn per_rank(&mut self, unit: &Unit) -> Vec<(i32, u64)> {
        let mut out = Vec::with_capacity(unit.ranks.len());
        self.per_rank_into(unit, &mut out);
        out
    }

    /// [`Shards::per_rank`] of every unit of `ids`, one after another.
    fn per_rank_of_all(&mut self, ids: &[UnitId], units: &Units) -> Vec<(i32, u64)> {
        let mut out = Vec::with_capacity(ids.iter().map(|id| units[id].ranks.len()).sum());
        for id in ids {
            self.per_rank_into(&units[id], &mut out);
        }
        out
    }
}

/// A node with its rank set, memory effects and estimated duration.
fn make_node(p: Primitive, ms: ModelStage, units: &Units, shards: &mut Shards, machine: &Machine) -> Node {
    let (u, links) = (|id: &UnitId| &units[id], machine.links);
    let mut transient = 0;
    let mut copying = Vec::new();
    let (acquire, release, seconds) = match &p {
        Primitive::Split { source, parts } => {
            let src = u(source);
            let acquire = shards.per_rank_of_all(parts, units);
            let held = shards.per_rank(src);
            // Each rank receives what its new shard has beyond its old one, from its unit's ranks.
            let slowest_bw = machine.slowest_link(&src.ranks);
            // At most: the largest new shard less the smallest old one.
            let largest_new = acquire.iter().map(|(_, b)| *b).max().unwrap_or(0);
            let smallest_old = held.iter().map(|(_, b)| *b).min().unwrap_or(0);
            let incoming = largest_new.saturating_sub(smallest_old);
            // Pack buffers: at most what a rank receives plus its old shard once per other part.
            let largest_old = held.iter().map(|(_, b)| *b).max().unwrap_or(0);
            transient = incoming + largest_old * (parts.len() as u64 - 1);
            let receive = incoming as f64 / slowest_bw;
            // The parts partition the source's ranks: each of them receives.
            copying = src.ranks.iter().map(|&r| (r, receive)).collect();
            (acquire, held, receive + links.setup_seconds)
        }
        Primitive::Extend { source, copy } => {
            let (src, dst) = (u(source), u(copy));
            let acquire = shards.per_rank(dst);
            copying =
                acquire.iter().zip(&src.ranks).map(|((r, b), s)| (*r, *b as f64 / machine.link(*s, *r))).collect();
            let secs = copying.iter().map(|(_, t)| *t).fold(0.0, f64::max) + links.setup_seconds;
            (acquire, vec![], secs)
        }
        Primitive::Merge { parts, merged } => {
            let m = u(merged);
            let acquire = shards.per_rank(m);
            let release = shards.per_rank_of_all(parts, units);
            copying = acquire.iter().map(|(r, b)| (*r, *b as f64 / links.memory_bytes_per_s)).collect();
            let secs = copying.iter().map(|(_, t)| *t).fold(0.0, f64::max);
            (acquire, release, secs)
        }
        Primitive::Destroy { unit } => {
            let x = u(unit);
            (vec![], shards.per_rank(x), 0.0)
        }
        Primitive::Sync { source, target } => {
            let (src, dst) = (u(source), u(target));
            // The target does not train: its state is its parameters, already allocated. Each
            // target rank receives its shard over its slowest link from the source replica, or
            // copies it locally where it holds the same shard of the same layout.
            let shard = shards.per_rank(dst);
            let local = |k: usize, r: i32| src.layout == dst.layout && src.ranks[k] == r;
            let slowest = |r: i32| src.ranks.iter().map(|&s| machine.link(s, r)).fold(f64::MAX, f64::min);
            copying = shard
                .iter()
                .enumerate()
                .map(|(k, &(r, b))| (r, b as f64 / if local(k, r) { links.memory_bytes_per_s } else { slowest(r) }))
                .collect();
            // Rectangles are packed only when the TP split differs (row-parallel column blocks);
            // a rank packs at most the shard it receives.
            if src.layout.tp != dst.layout.tp {
                transient = shard.iter().map(|(_, b)| *b).max().unwrap_or(0);
            }
            // The pairs of ranks a sync uses repeat every step: no communicator is set up.
            let secs = copying.iter().map(|(_, t)| *t).fold(0.0, f64::max);
            // Nothing is acquired; `transient` records the pack buffers (the planner checks them).
            (shard.iter().map(|&(r, _)| (r, 0)).collect(), vec![], secs)
        }
    };
    Node { primitive: p, model_stage: ms, acquire, release, seconds, transient, staged: false, copying }
}

/// Whether `a` and `b` hold the same units (as multisets), sorted into the two buffers.
fn same_units(a: &[UnitId], b: &[UnitId], a_sorted: &mut Vec<UnitId>, b_sorted: &mut Vec<UnitId>) -> bool {
    if a.len() != b.len() {
        return false;
    }
    for (items, out) in [(a, &mut *a_sorted), (b, &mut *b_sorted)] {
        out.clear();
        out.extend_from_slice(items);
        out.sort_unstable();
    }
    a_sorted == b_sorted
}

/// `items` in ascending order (ranks, unit ids).
fn sorted<T: Ord + Clone>(items: &[T]) -> Vec<T> {
    let mut sorted = items.to_vec();
    sorted.sort_unstable();
    sorted
}

pub mod check;
#[cfg(test)]
mod digests;
mod schedule;
#[cfg(test)]
mod tests;
