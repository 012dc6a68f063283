//! A transition DAG's schedule as a mixed-integer linear program, solved by HiGHS: the best
//! `L_tran` over every order of the primitives that respects the local DAGs, the ranks and their
//! memory, which the list schedule of `transition::global` is checked against.
//!
//! Variables: `s[i] ≥ 0` the start of node `i` (duration `d[i]`); `C` the makespan;
//! `o[i][j]` = 1 when `i` runs before `j`, for each pair that shares a rank and that no chain
//! of local edges orders (a disjunctive formulation with big-M ordering binaries).
//!
//! ```text
//! minimize C
//! C ≥ s[i] + tail[i]                      every node
//! s[j] ≥ s[i] + d[i]                      every local edge i → j
//! s[j] ≥ s[i] + d[i] − M·(1 − o[i][j])    } a rank runs one primitive at a time
//! s[i] ≥ s[j] + d[j] − M·o[i][j]          }
//! Σ_{i on r, i ≠ j} net[i][r]·before(i, j) ≤ cap − held[r] − alloc[j][r] − transient[j]
//!                                          every rank r that j allocates on
//! head[i] ≤ s[i] ≤ M − tail[i];  C ≥ the longest chain, and each rank's nodes back to back
//! ```
//! `head[i]` and `tail[i]` are the longest chains of local edges before `i` and from it (itself
//! included); the last line and the tails are valid bounds that only tighten the relaxation, in
//! which half-set binaries otherwise let everything overlap. `before(i, j)` is `o[i][j]`,
//! `1 − o[j][i]`, or 1 or 0 where local edges decide it; `net[i][r]` what `i` allocates on `r`
//! less what it frees there; `alloc[j][r]` its allocation there; `held[r]` the current plan's
//! bytes on `r`. `M = Σ d`: running the nodes one at a time in a feasible order is a schedule,
//! so no optimum needs a longer horizon.
//!
//! Memory is checked as the list schedule checks it: along each rank's order, a node's
//! allocation (and its pack buffers) before its release. Every node that allocates or frees on a
//! rank runs on that rank, so a rank's nodes never overlap in time and its order is the order of
//! its `before` terms. Memory constraints that cannot bind (the unbounded pools of the
//! generator) are left out. DAGs with nodes staged through host memory are not modelled.

use good_lp::{constraint, highs, variable, Expression, ProblemVariables, SolverModel, Variable};
use petgraph::visit::EdgeRef;
use std::collections::BTreeMap;

use super::{solve, Optimum};
use crate::model::{Layout, Position};
use crate::plan::ModelStage;
use crate::transition::global::EdgeKind;
use crate::transition::TransitionDag;

/// The horizon in the model's time unit. HiGHS's tolerances are absolute (1e-7 for a row,
/// 1e-6 for an integer): with durations of 0.1 ms a row could be violated by a node's whole
/// length, so times are rescaled to this horizon, and each memory row to its largest term.
const HORIZON: f64 = 1000.0;

/// One primitive as the model sees it.
#[derive(Debug, Clone, Default)]
pub struct Job {
    /// Duration, seconds.
    pub seconds: f64,
    /// Ranks it runs on (and allocates or frees on).
    pub ranks: Vec<i32>,
    /// Bytes it allocates per rank.
    pub acquire: Vec<(i32, u64)>,
    /// Bytes it frees per rank when done.
    pub release: Vec<(i32, u64)>,
    /// Pack buffers on each rank it allocates on, while it runs.
    pub transient: u64,
}

/// One memory row: while `node` allocates, the nets of the nodes before it must fit `headroom`
/// (both in units of the row's largest net).
#[derive(Debug, Clone)]
struct MemoryRow {
    node: usize,
    /// `(other node, net)` for the pairs whose order is free.
    free: Vec<(usize, f64)>,
    /// What is left once the current plan, the nodes fixed before it and its own allocation
    /// are in.
    headroom: f64,
}

/// A scheduling instance: jobs, precedence, the pairs that compete for a rank, memory rows.
#[derive(Debug, Clone)]
pub struct Instance {
    seconds: Vec<f64>,
    /// Per node, the nodes its local edges lead to.
    successors: Vec<Vec<usize>>,
    /// The nodes in an order that respects the edges.
    topological: Vec<usize>,
    /// Per rank, the nodes on it.
    rank_nodes: Vec<Vec<usize>>,
    /// Pairs `(i, j)`, `i < j`, that share a rank and that no chain of edges orders.
    free_pairs: Vec<(usize, usize)>,
    memory: Vec<MemoryRow>,
}

/// The MILP's answer.
#[derive(Debug, Clone)]
pub struct ExactSchedule {
    /// Its makespan and bound.
    pub optimum: Optimum,
    /// The order it runs the nodes in (by start time, each node after its predecessors and the
    /// nodes its binaries put first); `None` when zero-length nodes at one instant leave that
    /// order circular.
    pub order: Option<Vec<usize>>,
}

impl Instance {
    /// The instance of `dag`'s primitives and local edges (the resource edges are the list
    /// schedule's own choices, so they are left out), with `capacity` bytes per rank; `None`
    /// when a node is staged through host memory.
    pub fn of(
        dag: &TransitionDag,
        bytes: &dyn Fn(ModelStage, Layout, Position) -> u64,
        capacity: u64,
    ) -> Option<Instance> {
        if dag.graph.node_weights().any(|n| n.staged) {
            return None;
        }
        let jobs: Vec<Job> = dag
            .graph
            .node_weights()
            .map(|n| Job {
                seconds: n.seconds,
                ranks: n.ranks(&dag.units).collect(),
                acquire: n.acquire.clone(),
                release: n.release.clone(),
                transient: n.transient,
            })
            .collect();
        let edges: Vec<(usize, usize)> = dag
            .graph
            .edge_references()
            .filter(|e| *e.weight() == EdgeKind::Local)
            .map(|e| (e.source().index(), e.target().index()))
            .collect();
        Some(Instance::new(&jobs, &edges, &dag.initial_bytes(bytes), capacity))
    }

    /// The instance of `jobs` under `edges` (`(before, after)`, acyclic), on ranks holding
    /// `held` bytes at the start, each with room for `capacity`.
    pub fn new(jobs: &[Job], edges: &[(usize, usize)], held: &[u64], capacity: u64) -> Instance {
        let mut successors = vec![Vec::new(); jobs.len()];
        for &(a, b) in edges {
            successors[a].push(b);
        }
        let topological = topological(&successors);
        let reach = reachability(&topological, &successors);
        let on_rank = nodes_per_rank(jobs);
        let mut free_pairs: Vec<(usize, usize)> = on_rank
            .values()
            .flat_map(|nodes| nodes.iter().enumerate().flat_map(|(k, &i)| nodes[k + 1..].iter().map(move |&j| (i, j))))
            .filter(|&(i, j)| !reach[i][j] && !reach[j][i])
            .collect();
        free_pairs.sort_unstable();
        free_pairs.dedup();
        let reach = &reach;
        let memory = on_rank
            .iter()
            .flat_map(|(&r, nodes)| {
                let held = held.get(r as usize).copied().unwrap_or(0);
                nodes.iter().filter_map(move |&j| memory_row(jobs, reach, nodes, r, j, held, capacity))
            })
            .collect();
        let seconds = jobs.iter().map(|j| j.seconds).collect();
        Instance { seconds, successors, topological, rank_nodes: on_rank.into_values().collect(), free_pairs, memory }
    }

    /// Ordering binaries in the model.
    pub fn binaries(&self) -> usize {
        self.free_pairs.len()
    }

    /// The shortest makespan, seconds (HiGHS stops after `time_limit_s` when given: then the
    /// best schedule found and the bound); `None` when no order fits in memory.
    pub fn solve(&self, time_limit_s: Option<f64>) -> Option<ExactSchedule> {
        if self.memory.iter().any(|row| row.free.is_empty() && row.headroom < 0.0) {
            return None;
        }
        let unit = self.seconds.iter().sum::<f64>() / HORIZON;
        if unit <= 0.0 {
            return Some(ExactSchedule { optimum: Optimum::ZERO, order: Some(self.topological.clone()) });
        }
        let d: Vec<f64> = self.seconds.iter().map(|s| s / unit).collect();
        let (head, tail) = self.chains(&d);
        let mut vars = ProblemVariables::new();
        // Columns: the starts (0..n), the binaries in `free_pairs` order, the makespan.
        let s: Vec<Variable> = (0..d.len()).map(|i| vars.add(variable().min(head[i]).max(HORIZON - tail[i]))).collect();
        let order: BTreeMap<(usize, usize), Variable> =
            self.free_pairs.iter().map(|&pair| (pair, vars.add(variable().binary()))).collect();
        let makespan = vars.add(variable().min(self.makespan_floor(&d, &head, &tail)));
        let mut problem = vars.minimise(makespan).using(highs);
        for (i, next) in self.successors.iter().enumerate() {
            for &j in next {
                problem = problem.with(constraint!(s[j] >= s[i] + d[i]));
            }
        }
        for (i, si) in s.iter().enumerate() {
            problem = problem.with(constraint!(makespan >= *si + tail[i]));
        }
        for (&(i, j), &o) in &order {
            problem = problem.with(constraint!(s[j] >= s[i] + d[i] - HORIZON * (1.0 - o)));
            problem = problem.with(constraint!(s[i] >= s[j] + d[j] - HORIZON * o));
        }
        for row in &self.memory {
            let j = row.node;
            let before = |i: usize| -> Expression {
                if i < j {
                    order[&(i, j)].into()
                } else {
                    1.0 - order[&(j, i)]
                }
            };
            let nets: Expression = row.free.iter().map(|&(i, net)| net * before(i)).sum();
            problem = problem.with(constraint!(nets <= row.headroom));
        }
        let (optimum, columns) = solve(problem, time_limit_s)?;
        let n = d.len();
        let first: Vec<bool> = columns[n..n + self.free_pairs.len()].iter().map(|o| *o > 0.5).collect();
        Some(ExactSchedule { optimum: optimum.scaled(unit), order: self.order_of(&columns[..n], &first) })
    }

    /// Per node, the longest chain of edges before it (`head`) and from it, itself included
    /// (`tail`), under durations `d`. They bound the starts and the makespan: valid rows that
    /// only tighten the relaxation, where the big-M rows alone let half-set binaries overlap
    /// everything.
    fn chains(&self, d: &[f64]) -> (Vec<f64>, Vec<f64>) {
        let (mut head, mut tail) = (vec![0.0f64; d.len()], d.to_vec());
        for &i in &self.topological {
            for &b in &self.successors[i] {
                head[b] = head[b].max(head[i] + d[i]);
            }
        }
        for &i in self.topological.iter().rev() {
            tail[i] = d[i] + self.successors[i].iter().map(|&b| tail[b]).fold(0.0, f64::max);
        }
        (head, tail)
    }

    /// A lower bound on the makespan: the longest chain, and on every rank its nodes one after
    /// another between the earliest head and the shortest tail.
    fn makespan_floor(&self, d: &[f64], head: &[f64], tail: &[f64]) -> f64 {
        let chain = (0..d.len()).map(|i| head[i] + tail[i]).fold(0.0, f64::max);
        let rank = |nodes: &Vec<usize>| {
            let first = nodes.iter().map(|&i| head[i]).fold(f64::INFINITY, f64::min);
            let last = nodes.iter().map(|&i| tail[i] - d[i]).fold(f64::INFINITY, f64::min);
            first + nodes.iter().map(|&i| d[i]).sum::<f64>() + last
        };
        self.rank_nodes.iter().map(rank).fold(chain, f64::max)
    }

    /// The order of a solution with `starts` whose binaries put the first node of each free
    /// pair first where `first` says so: among the nodes whose predecessors (by edge or by
    /// binary) have run, the earliest start next.
    fn order_of(&self, starts: &[f64], first: &[bool]) -> Option<Vec<usize>> {
        let n = starts.len();
        let mut successors = self.successors.clone();
        for (&(i, j), &i_first) in self.free_pairs.iter().zip(first) {
            let (a, b) = if i_first { (i, j) } else { (j, i) };
            successors[a].push(b);
        }
        let mut waiting = vec![0usize; n];
        successors.iter().flatten().for_each(|&b| waiting[b] += 1);
        let mut ready: Vec<usize> = (0..n).filter(|&i| waiting[i] == 0).collect();
        let mut order = Vec::with_capacity(n);
        while let Some(k) = (0..ready.len()).min_by(|&a, &b| starts[ready[a]].total_cmp(&starts[ready[b]])) {
            let i = ready.swap_remove(k);
            order.push(i);
            for &b in &successors[i] {
                waiting[b] -= 1;
                if waiting[b] == 0 {
                    ready.push(b);
                }
            }
        }
        (order.len() == n).then_some(order)
    }
}

/// Per rank, the nodes that run or move memory on it, ascending.
fn nodes_per_rank(jobs: &[Job]) -> BTreeMap<i32, Vec<usize>> {
    let mut on_rank: BTreeMap<i32, Vec<usize>> = BTreeMap::new();
    for (i, job) in jobs.iter().enumerate() {
        let mut ranks: Vec<i32> = job.ranks.clone();
        ranks.extend(job.acquire.iter().chain(&job.release).map(|(r, _)| *r));
        ranks.sort_unstable();
        ranks.dedup();
        for r in ranks {
            on_rank.entry(r).or_default().push(i);
        }
    }
    on_rank
}

/// The nodes in an order that respects the edges to `successors` (which must be acyclic).
fn topological(successors: &[Vec<usize>]) -> Vec<usize> {
    let n = successors.len();
    let mut waiting = vec![0usize; n];
    successors.iter().flatten().for_each(|&b| waiting[b] += 1);
    let mut order: Vec<usize> = (0..n).filter(|&i| waiting[i] == 0).collect();
    let mut k = 0;
    while k < order.len() {
        for &b in &successors[order[k]] {
            waiting[b] -= 1;
            if waiting[b] == 0 {
                order.push(b);
            }
        }
        k += 1;
    }
    assert_eq!(order.len(), n, "the DAG's edges are acyclic");
    order
}

/// `reach[i][j]`: a chain of edges leads from `i` to `j` (`topological` respects them).
fn reachability(topological: &[usize], successors: &[Vec<usize>]) -> Vec<Vec<bool>> {
    let n = topological.len();
    let mut reach = vec![vec![false; n]; n];
    for &i in topological.iter().rev() {
        for &b in &successors[i] {
            reach[i][b] = true;
            let below = reach[b].clone();
            reach[i].iter_mut().zip(below).for_each(|(x, y)| *x |= y);
        }
    }
    reach
}

/// The bytes of `list` on rank `r`.
fn on(list: &[(i32, u64)], r: i32) -> impl Iterator<Item = u64> + '_ {
    list.iter().filter(move |(x, _)| *x == r).map(|(_, b)| *b)
}

/// The memory row of `j` allocating on rank `r` among `nodes` (everything on `r`), or `None`
/// when `j` allocates nothing there or the row cannot bind even with every free node that adds
/// bytes placed before `j`.
fn memory_row(
    jobs: &[Job],
    reach: &[Vec<bool>],
    nodes: &[usize],
    r: i32,
    j: usize,
    held: u64,
    capacity: u64,
) -> Option<MemoryRow> {
    // The list schedule checks each allocation entry on its own, against what is held before.
    let alloc = on(&jobs[j].acquire, r).max()?;
    let net = |i: usize| on(&jobs[i].acquire, r).sum::<u64>() as f64 - on(&jobs[i].release, r).sum::<u64>() as f64;
    // Bytes are whole: half a byte of margin keeps a row that fits exactly feasible. Scaled to
    // its largest term, a row is then exact to HiGHS's tolerance (1e-7) of that term: to the
    // byte for the tiny model, to a few hundred bytes of a real shard.
    let mut headroom = capacity as f64 - held as f64 - alloc as f64 - jobs[j].transient as f64 + 0.5;
    let mut free = Vec::new();
    for &i in nodes.iter().filter(|&&i| i != j && !reach[j][i]) {
        if reach[i][j] {
            headroom -= net(i);
        } else if net(i) != 0.0 {
            free.push((i, net(i)));
        }
    }
    let worst: f64 = free.iter().map(|(_, net)| net.max(0.0)).sum();
    if worst <= headroom {
        return None;
    }
    let scale = free.iter().map(|(_, net)| net.abs()).fold(1.0, f64::max);
    Some(MemoryRow {
        node: j,
        free: free.into_iter().map(|(i, net)| (i, net / scale)).collect(),
        headroom: headroom / scale,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::transition::global::{check, Links};
    use crate::transition::testing::{plan_pair, tightest_capacity, tiny_catalogue};
    use crate::transition::Coordination;

    fn job(seconds: f64, ranks: &[i32]) -> Job {
        Job { seconds, ranks: ranks.to_vec(), ..Job::default() }
    }

    fn optimum(jobs: &[Job], edges: &[(usize, usize)], held: &[u64], capacity: u64) -> f64 {
        let o = Instance::new(jobs, edges, held, capacity).solve(None).expect("feasible").optimum;
        assert!(o.proved);
        o.seconds
    }

    #[test]
    fn ranks_run_one_primitive_at_a_time() {
        // A on rank 0 and B on rank 1 run together; X holds both ranks: 1 + 2 s whichever goes first.
        let jobs = [job(1.0, &[0]), job(1.0, &[1]), job(2.0, &[0, 1])];
        assert!((optimum(&jobs, &[], &[], u64::MAX) - 3.0).abs() < 1e-6);
        // X after A, B after X: a chain of 4 s.
        assert!((optimum(&jobs, &[(0, 2), (2, 1)], &[], u64::MAX) - 4.0).abs() < 1e-6);
        // Two long jobs on different ranks after a short one on both: 0.5 + 3 s.
        let jobs = [job(0.5, &[0, 1]), job(3.0, &[0]), job(3.0, &[1])];
        assert!((optimum(&jobs, &[], &[], u64::MAX) - 3.5).abs() < 1e-6);
    }

    #[test]
    fn an_allocation_waits_for_the_release_that_makes_room() {
        // Rank 0 holds 8 GiB of 10. P allocates 5 GiB there (1 s); D frees 6 GiB there, but
        // only after Q (4 s on rank 1). P fits only after D: 4 + 1 s, not 4 s.
        let gib = 1u64 << 30;
        let p = Job { acquire: vec![(0, 5 * gib)], ..job(1.0, &[0]) };
        let q = job(4.0, &[1]);
        let d = Job { release: vec![(0, 6 * gib)], ..job(0.0, &[0]) };
        let jobs = [p, q, d];
        assert!((optimum(&jobs, &[(1, 2)], &[8 * gib], 10 * gib) - 5.0).abs() < 1e-6);
        assert!((optimum(&jobs, &[(1, 2)], &[8 * gib], 20 * gib) - 4.0).abs() < 1e-6);
        // With pack buffers of 3 GiB it cannot run even after D (8 − 6 + 5 + 3 > 9).
        let jobs = [Job { transient: 3 * gib, ..jobs[0].clone() }, jobs[1].clone(), jobs[2].clone()];
        assert!(Instance::new(&jobs, &[(1, 2)], &[8 * gib], 9 * gib).solve(None).is_none());
    }

    /// The exact model agrees with the exhaustive search over orders (unbounded and tightest
    /// memory) on DAGs of up to 8 nodes, and no list schedule beats it. Among them are DAGs
    /// where the list schedule is not optimal and DAGs whose optimum memory changes, so neither
    /// agreement is vacuous.
    #[test]
    fn the_milp_agrees_with_the_exhaustive_search_on_small_dags() {
        let c = tiny_catalogue();
        let bytes = |ms: ModelStage, l: Layout, p: Position| {
            crate::model::shard_bytes(
                &c.shard(l, p),
                &crate::model::Section::of(ms.trains(), c.arch.dtype),
                c.arch.dtype,
            )
        };
        let unbounded = crate::transition::testing::SMALL_LINKS;
        let close = |a: f64, b: f64| (a - b).abs() <= 1e-4 * b + 1e-12;
        let (mut compared, mut list_above, mut memory_binds) = (0, 0, 0);
        for case in 0..1500 {
            let mut rng = crate::rng::Rng::new(case);
            let pool = 4 + rng.below(5) as u32;
            let (from, to) = plan_pair(&mut rng, &c, pool);
            let tight = Links { capacity_bytes: tightest_capacity(&from, &to, &bytes, &unbounded), ..unbounded };
            for links in [unbounded, tight] {
                let dag = TransitionDag::plan(&from, &to, &bytes, &links, Coordination::Global).expect("plannable");
                let n = dag.graph.node_count();
                if n == 0 || n > 8 {
                    continue;
                }
                for node in dag.graph.node_weights() {
                    let ranks: Vec<i32> = node.ranks(&dag.units).collect();
                    let touched = node.acquire.iter().chain(&node.release);
                    assert!(touched.clone().all(|(r, _)| ranks.contains(r)), "memory moves only on a node's ranks");
                }
                let brute =
                    check::optimal_seconds(&dag, &bytes, &links).expect("the list schedule's order is feasible");
                let instance = Instance::of(&dag, &bytes, links.capacity_bytes).unwrap();
                let solved = instance.solve(None).unwrap();
                let exact = solved.optimum;
                assert!(exact.proved);
                assert!(close(exact.seconds, brute), "case {case}: {exact:?} against {brute}");
                let replayed = solved.order.and_then(|o| check::order_seconds(&dag, &o, &bytes, links.capacity_bytes));
                assert!(replayed.is_some_and(|r| close(r, brute)), "case {case}: {replayed:?} against {brute}");
                assert!(exact.seconds <= dag.schedule.seconds * (1.0 + 1e-4));
                compared += 1;
                list_above += usize::from(!close(dag.schedule.seconds, brute));
                let without_memory = Instance { memory: vec![], ..instance }.solve(None).unwrap().optimum;
                memory_binds += usize::from(!close(without_memory.seconds, brute));
            }
        }
        assert!(compared >= 200 && list_above >= 3 && memory_binds >= 1, "{compared} {list_above} {memory_binds}");
    }
}
