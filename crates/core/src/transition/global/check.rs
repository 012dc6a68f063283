//! Costing other orders of a planned transition by its own rules — a given order (another
//! scheduler's, the exact MILP's), the best order by exhaustive search (small DAGs), and the
//! per-component baseline's orders — to check the list schedule against (`exact`, the
//! benchmarks). Nothing here is on the runtime's path.

use petgraph::graph::NodeIndex;
use petgraph::visit::EdgeRef;
use petgraph::Direction;
use std::collections::BTreeMap;

use super::{BuildWork, EdgeKind, Links, NodeTiming, ResourceState, TransitionDag};
use crate::index_list::format_index_list;
use crate::model::{Layout, Position};
use crate::plan::ModelStage;

/// When each node of `order` runs: after its predecessors in the graph, the `extra`
/// dependencies, and every earlier node on its ranks.
fn timings(dag: &TransitionDag, order: &[usize], extra: &[(usize, usize)]) -> Vec<NodeTiming> {
    let mut finish = vec![0.0f64; dag.graph.node_count()];
    let mut rank_free = vec![0.0f64; dag.units.pool()];
    let mut extra_preds: Vec<Vec<usize>> = vec![Vec::new(); if extra.is_empty() { 0 } else { dag.graph.node_count() }];
    for &(a, b) in extra {
        extra_preds[b].push(a);
    }
    let mut timings = Vec::with_capacity(order.len());
    for &i in order {
        let node = &dag.graph[NodeIndex::new(i)];
        let after_preds = dag
            .graph
            .neighbors_directed(NodeIndex::new(i), Direction::Incoming)
            .map(|p| finish[p.index()])
            .fold(0.0, f64::max);
        let after_extra = extra_preds.get(i).into_iter().flatten().map(|&a| finish[a]).fold(0.0, f64::max);
        let after_ranks = node.ranks(&dag.units).map(|r| rank_free[r as usize]).fold(0.0, f64::max);
        let start = after_preds.max(after_extra).max(after_ranks);
        finish[i] = start + node.seconds;
        for r in node.ranks(&dag.units) {
            rank_free[r as usize] = finish[i];
        }
        timings.push(NodeTiming { node: i, start, finish: finish[i] });
    }
    timings
}

/// The shortest critical path over every feasible order of the local DAGs (exponential:
/// small instances only), to measure how far the list schedule is from optimal.
pub fn optimal_seconds(
    dag: &TransitionDag,
    bytes: &dyn Fn(ModelStage, Layout, Position) -> u64,
    links: &Links,
) -> Option<f64> {
    let view = local_view(dag);
    let n = view.graph.node_count();
    let mut best: Option<f64> = None;
    let mut order = Vec::with_capacity(n);
    let mut edges = Vec::new();
    let waiting: Vec<usize> =
        (0..n).map(|i| view.graph.neighbors_directed(NodeIndex::new(i), Direction::Incoming).count()).collect();
    let mut state = ResourceState::new(&view, bytes, links.capacity_bytes, true);
    search(&view, &mut state, waiting, &mut order, &mut edges, &mut best);
    best
}

/// The DAG with its local edges only: the release-before-acquire edges are the list
/// schedule's own choices, which another order need not make.
fn local_view(dag: &TransitionDag) -> TransitionDag {
    TransitionDag {
        graph: dag.graph.filter_map(|_, n| Some(n.clone()), |_, e| (*e == EdgeKind::Local).then_some(*e)),
        units: dag.units.clone(),
        initial: dag.initial.clone(),
        targets: BTreeMap::new(),
        resource_edges: 0,
        schedule: dag.schedule.clone(),
        work: BuildWork::default(),
    }
}

/// `L_tran` of running every node in `order` instead of the list schedule's order, with the
/// release-before-acquire waits it implies and `capacity` bytes a rank; `None` when `order`
/// breaks a local edge or a step overruns a rank's memory. Another scheduler's answer (the
/// exact MILP's) is costed by the same rules as the list schedule's.
pub fn order_seconds(
    dag: &TransitionDag,
    order: &[usize],
    bytes: &dyn Fn(ModelStage, Layout, Position) -> u64,
    capacity: u64,
) -> Option<f64> {
    let view = local_view(dag);
    let n = view.graph.node_count();
    let mut position = vec![usize::MAX; n];
    for (k, &i) in order.iter().enumerate() {
        *position.get_mut(i)? = k;
    }
    let respects =
        |e: petgraph::graph::EdgeReference<EdgeKind>| position[e.source().index()] < position[e.target().index()];
    if position.contains(&usize::MAX) || !view.graph.edge_references().all(respects) {
        return None;
    }
    let mut state = ResourceState::new(&view, bytes, capacity, true);
    let (mut edges, mut deps) = (Vec::new(), Vec::new());
    for &i in order {
        let node = &view.graph[NodeIndex::new(i)];
        state.fits(node, false).ok()?;
        state.apply_into(i, node, false, &mut deps);
        edges.extend(deps.iter().map(|&d| (d, i)));
    }
    Some(timings(&view, order, &edges).iter().map(|t| t.finish).fold(0.0, f64::max))
}

fn search(
    dag: &TransitionDag,
    state: &mut ResourceState,
    waiting: Vec<usize>,
    order: &mut Vec<usize>,
    edges: &mut Vec<(usize, usize)>,
    best: &mut Option<f64>,
) {
    let n = dag.graph.node_count();
    if order.len() == n {
        let t = timings(dag, order, edges).iter().map(|t| t.finish).fold(0.0, f64::max);
        if best.is_none_or(|b| t < b) {
            *best = Some(t);
        }
        return;
    }
    let candidates: Vec<usize> = (0..n).filter(|&i| waiting[i] == 0 && !order.contains(&i)).collect();
    for i in candidates {
        let node = &dag.graph[NodeIndex::new(i)];
        if state.fits(node, false).is_err() {
            continue;
        }
        let saved = state.clone();
        let mut deps = Vec::new();
        state.apply_into(i, node, false, &mut deps);
        let added = deps.len();
        edges.extend(deps.into_iter().map(|d| (d, i)));
        order.push(i);
        let mut next = waiting.clone();
        for succ in dag.graph.neighbors_directed(NodeIndex::new(i), Direction::Outgoing) {
            next[succ.index()] -= 1;
        }
        search(dag, state, next, order, edges, best);
        order.pop();
        edges.truncate(edges.len() - added);
        *state = saved;
    }
}

/// Walks `order` and returns the first step that would overrun a rank's memory or take a
/// rank another model-stage of its stage still holds, if any — how a schedule built
/// without cross-model-stage edges (the per-component baseline) fails.
pub fn first_conflict(
    dag: &TransitionDag,
    order: &[usize],
    bytes: &dyn Fn(ModelStage, Layout, Position) -> u64,
    capacity: u64,
) -> Option<String> {
    let mut state = ResourceState::new(dag, bytes, capacity, true);
    let mut deps = Vec::new();
    for &i in order {
        let node = &dag.graph[NodeIndex::new(i)];
        if let Err((ranks, reason)) = state.fits(node, false) {
            return Some(format!("{} on rank(s) {}: {reason}", dag.label(i), format_index_list(&ranks)));
        }
        state.apply_into(i, node, false, &mut deps);
    }
    None
}

/// The schedule's order when each model-stage starts `delay` seconds late (the nodes of a
/// model-stage keep their relative order; model-stages interleave by start time).
pub fn delayed_order(dag: &TransitionDag, delay: &dyn Fn(ModelStage) -> f64) -> Vec<usize> {
    let mut timed: Vec<(f64, usize)> = dag
        .schedule
        .timings
        .iter()
        .map(|t| (t.start + delay(dag.graph[NodeIndex::new(t.node)].model_stage), t.node))
        .collect();
    timed.sort_by(|a, b| a.0.total_cmp(&b.0));
    timed.into_iter().map(|(_, i)| i).collect()
}
