//! Executable targets: the planner's fastest plan when its transition DAG can run from the
//! current plan; else slower plans with cheaper transitions (the model-stages whose moves
//! block it kept where they are); else the same through host memory; else "keep the current
//! plan", with the reason. Pure: plans, DAGs and predictions.

use serde::Serialize;
use std::collections::BTreeMap;

use super::global::{Coordination, Links, TransitionDag, TransitionError};
use crate::model::{Layout, Position};
use crate::plan::{ModelStage, Plan, WEIGHT_SYNCS};
use crate::planner::{PlannedJob, Planner, PlannerError};

/// What a replan found, and whether the job can get there.
#[derive(Debug, Clone)]
pub struct TargetChoice {
    /// The target (the current plan when `keep`).
    pub target: PlannedJob,
    /// Predicted step seconds of the current plan under the new workload (infinite when it no
    /// longer fits).
    pub current_seconds: f64,
    /// `ΔL = L(S) − L(S*)`.
    pub delta_l_s: f64,
    /// The transition DAG, when the target differs from the current plan and can be reached.
    pub dag: Option<TransitionDag>,
    /// `L_tran`, the DAG's critical path (0 when nothing moves).
    pub l_tran_s: f64,
    /// Whether the current plan stays (nothing better can be reached, or nothing better exists).
    pub keep: bool,
    /// Why the fastest target could not be reached, when it could not.
    pub blocked_reason: Option<String>,
    /// 0 when the fastest plan was taken; `k` for the `k`-th fallback.
    pub fallback_rank: usize,
    /// Bytes staged through host memory (0 if none).
    pub staged_bytes: u64,
}

/// The counts of a DAG for reports.
#[derive(Debug, Clone, Copy, Default, Serialize)]
pub struct DagCounts {
    /// Primitives.
    pub nodes: usize,
    /// Release-before-acquire edges between model-stages.
    pub resource_edges: usize,
}

impl TargetChoice {
    /// Whether a transition is to run (a reachable target other than the current plan).
    pub fn executable(&self) -> bool {
        !self.keep
    }

    /// Node and resource-edge counts of the DAG.
    pub fn counts(&self) -> DagCounts {
        self.dag.as_ref().map_or_else(DagCounts::default, |d| DagCounts {
            nodes: d.graph.node_count(),
            resource_edges: d.resource_edges,
        })
    }
}

/// The state one rank at `position` of a `layout` unit of `ms` holds, as the planner counts it.
pub fn state_bytes(planner: &Planner) -> impl Fn(ModelStage, Layout, Position) -> u64 + '_ {
    move |ms, layout, position| planner.position_state(ms, layout, position.pp).total()
}

/// The weight syncs of `plan` ([`WEIGHT_SYNCS`] whose two ends it has), each planned as a
/// transition of Syncs ([`TransitionDag::weight_sync`]) with `planner`'s state bytes, keyed by
/// the model-stage synced into.
pub fn weight_syncs(
    planner: &Planner,
    plan: &Plan,
    links: &Links,
) -> Result<BTreeMap<ModelStage, TransitionDag>, TransitionError> {
    let bytes = state_bytes(planner);
    let mut syncs = BTreeMap::new();
    for pair in WEIGHT_SYNCS {
        if let Some(dag) = TransitionDag::weight_sync(plan, pair, &bytes, links)? {
            syncs.insert(pair.1, dag);
        }
    }
    Ok(syncs)
}

/// Plans the move from `current` to the fastest reachable plan of `planner` (its pool and
/// workload). `links.host_bytes_per_s` allows host staging as the last resort before "keep".
pub fn choose(planner: &Planner, current: &Plan, links: &Links) -> Result<TargetChoice, PlannerError> {
    let (best, current_seconds) = planner.search_from(current)?;
    let keep = |reason: Option<String>| TargetChoice {
        target: planned_as_is(planner, current, &best),
        current_seconds,
        delta_l_s: 0.0,
        dag: None,
        l_tran_s: 0.0,
        keep: true,
        blocked_reason: reason,
        fallback_rank: 0,
        staged_bytes: 0,
    };
    if best.plan() == *current {
        return Ok(keep(None));
    }
    let bytes = state_bytes(planner);
    let device_only = Links { host_bytes_per_s: None, ..*links };
    let attempt =
        |target: &Plan, links: &Links| TransitionDag::plan(current, target, &bytes, links, Coordination::Global);
    let first_block = match attempt(&best.plan(), &device_only) {
        Ok(dag) => return Ok(reached(best, dag, current_seconds, 0)),
        Err(e) => e,
    };
    // Fallbacks: keep where they are, one more each time, the model-stages whose moves block
    // (the blocked primitive's first), as long as the plan still fits every rank; and the best
    // plan that keeps every layout (DP and ranks follow the pool: Extends and Destroys only, the
    // cheapest moves to make room for). Tried fastest first.
    let mut fallbacks: Vec<Plan> = fallbacks(planner, current, &best, &first_block);
    if let Ok((kept, _)) = planner.keeping_layouts(current).search_from(current) {
        fallbacks.push(kept.plan());
    }
    let mut fallbacks: Vec<(f64, Plan)> = fallbacks
        .into_iter()
        .map(|plan| (planner.predict(&plan), plan))
        .filter(|(seconds, plan)| *seconds < current_seconds && *plan != best.plan())
        .collect();
    fallbacks.sort_by(|a, b| a.0.total_cmp(&b.0));
    fallbacks.dedup_by(|a, b| a.1 == b.1);
    let fallbacks: Vec<Plan> = fallbacks.into_iter().map(|(_, plan)| plan).collect();
    for (k, plan) in fallbacks.iter().enumerate() {
        if let Ok(dag) = attempt(plan, &device_only) {
            return Ok(reached(planned_as_is(planner, plan, &best), dag, current_seconds, k + 1));
        }
    }
    // Beyond the paper: the fastest plan, then the fallbacks, with sources staged through host
    // memory where a Split or Merge has no room beside them.
    if links.host_bytes_per_s.is_some() {
        let tries = std::iter::once(best.plan()).chain(fallbacks);
        for (k, plan) in tries.enumerate() {
            if let Ok(dag) = attempt(&plan, links) {
                return Ok(reached(planned_as_is(planner, &plan, &best), dag, current_seconds, k));
            }
        }
    }
    Ok(keep(Some(first_block.to_string())))
}

/// The move from `current` to `target`, a plan of `planner`'s pool (`None` when no DAG reaches
/// it): how a controller goes back to a plan it left.
pub fn toward(planner: &Planner, current: &Plan, target: &Plan, links: &Links) -> Option<TargetChoice> {
    let dag = TransitionDag::plan(current, target, &state_bytes(planner), links, Coordination::Global).ok()?;
    Some(reached(planner.evaluate(target), dag, planner.predict(current), 0))
}

fn reached(target: PlannedJob, dag: TransitionDag, current_seconds: f64, fallback_rank: usize) -> TargetChoice {
    TargetChoice {
        delta_l_s: current_seconds - target.step_latency_s,
        l_tran_s: dag.schedule.seconds,
        staged_bytes: dag.staged_bytes(),
        target,
        current_seconds,
        dag: Some(dag),
        keep: false,
        blocked_reason: None,
        fallback_rank,
    }
}

/// `plan` with the planner's predictions (`like` supplies nothing but the shape of the report).
fn planned_as_is(planner: &Planner, plan: &Plan, like: &PlannedJob) -> PlannedJob {
    if *plan == like.plan() {
        return like.clone();
    }
    planner.evaluate(plan)
}

/// The best plan with the model-stages that block kept in their current placements, one more
/// at a time: the blocked primitive's model-stage first, then the others in plan order. Only
/// plans that are valid on the pool and fit every rank are tried (and, by the caller, only
/// those faster than the current plan).
fn fallbacks(planner: &Planner, current: &Plan, best: &PlannedJob, blocked: &TransitionError) -> Vec<Plan> {
    let blocked_ms = match blocked {
        TransitionError::Blocked { primitive, .. } => {
            planner.model_stages().iter().copied().find(|ms| primitive.contains(&format!(" {ms} ")))
        }
        TransitionError::Mismatch(_) => None,
    };
    let target = best.plan();
    let mut order = moved(current, &target);
    if let Some(ms) = blocked_ms {
        order.retain(|m| *m != ms);
        order.insert(0, ms);
    }
    kept_in_place(planner, current, target, order)
}

/// The model-stages whose placement differs between `current` and `target`, in plan order.
fn moved(current: &Plan, target: &Plan) -> Vec<ModelStage> {
    target
        .placements
        .iter()
        .filter(|p| current.placements.iter().find(|c| c.candidate.model_stage == p.candidate.model_stage) != Some(*p))
        .map(|p| p.candidate.model_stage)
        .collect()
}

/// `target` with the model-stages of `order` put back in their `current` placements, one more
/// at a time; only plans valid on the pool that fit every rank, other than `current`.
fn kept_in_place(planner: &Planner, current: &Plan, target: Plan, order: Vec<ModelStage>) -> Vec<Plan> {
    let usable = planner.cost().hardware.usable_bytes();
    let pool = planner.cost().hardware.devices;
    let mut plan = target;
    let mut out = Vec::new();
    for ms in order {
        let Some(old) = current.placements.iter().find(|p| p.candidate.model_stage == ms) else { continue };
        if let Some(slot) = plan.placements.iter_mut().find(|p| p.candidate.model_stage == ms) {
            *slot = old.clone();
        }
        if plan.validate(pool).is_ok() && planner.rank_peaks(&plan).max().0 <= usable && plan != *current {
            out.push(plan.clone());
        }
    }
    out
}

/// Slower targets with cheaper transitions than `choice` (for an admission that rejected it):
/// its plan with the model-stages that move the most state kept where they are, one more at a
/// time, each reachable from `current` and still faster than it. Lazy: each DAG is planned when
/// the caller asks for the next one.
pub fn cheaper_targets<'a>(
    planner: &'a Planner,
    current: &'a Plan,
    choice: &'a TargetChoice,
    links: &'a Links,
) -> impl Iterator<Item = TargetChoice> + 'a {
    let target = choice.target.plan();
    let bytes = state_bytes(planner);
    let weight =
        |ms: ModelStage| {
            target.placements.iter().find(|p| p.candidate.model_stage == ms).map_or(0, |p| {
                bytes(ms, p.candidate.layout, Position { tp: 0, pp: 0 }) * u64::from(p.candidate.ranks())
            })
        };
    let mut order = moved(current, &target);
    order.sort_by_key(|&ms| std::cmp::Reverse(weight(ms)));
    let plans = if choice.keep { Vec::new() } else { kept_in_place(planner, current, target, order) };
    plans.into_iter().filter(move |plan| planner.predict(plan) < choice.current_seconds).enumerate().filter_map(
        move |(k, plan)| {
            let dag = TransitionDag::plan(current, &plan, &state_bytes(planner), links, Coordination::Global).ok()?;
            Some(reached(planner.evaluate(&plan), dag, choice.current_seconds, choice.fallback_rank + k + 1))
        },
    )
}
