//! The live controller of `nereus train` wired to the ranks: rank 0's [`Controller`] decides
//! (pure, `policy::controller`), every rank learns the [`Action`] and carries it out at the step
//! boundary — a transition DAG run on the live EMUs, a new response cap, or a checkpoint and a
//! stop when nothing fits.

use serde_json::{json, Value};
use std::collections::BTreeMap;
use std::time::Instant;

use nereus_core::plan::Plan;
use nereus_core::planner::Planner;
pub use nereus_core::policy::controller::{describe, Action, Controller, StepRecord};
use nereus_core::transition::target::state_bytes;
use nereus_core::transition::{global::Links, TransitionDag};
use nereus_exec::comm::{max_over_ranks, MpiPlane};
use nereus_exec::emu::EmuSet;

use super::transition::{agree_on_dag, execute};
use super::{RuntimeError, Session};

/// What a step boundary did, for the JSON lines and the log.
#[derive(Debug, Clone, Default)]
pub struct Boundary {
    /// The decision record (`null` when no trigger fired).
    pub decision: Value,
    /// The transition record (`null` when nothing moved).
    pub transition: Value,
    /// A rank lost at this boundary (`null` when none): the rank, the model-stages restored from
    /// a checkpoint and which.
    pub rank_loss: Value,
}

/// Rank 0 decides (`controller` is rank 0's), every rank learns the action. A failure on rank 0
/// is agreed first, so nobody waits on a broadcast that never comes.
pub fn decide(
    session: &Session,
    controller: Option<&mut Controller>,
    m: &StepRecord,
    plan: &Plan,
) -> Result<Action, RuntimeError> {
    let local = match controller {
        Some(c) => c.decide(m, plan).map(|a| serde_json::to_vec(&a).expect("actions serialize")).map_err(Into::into),
        None => Ok(Vec::new()),
    };
    let agreed = session.from_root("controller decision", local)?;
    serde_json::from_slice(&agreed).map_err(|e| RuntimeError::Usage(format!("undecodable decision from rank 0: {e}")))
}

/// Runs the transition `from → to` on every rank: the DAG planned with the state bytes and
/// links of `planner`, agreed by hash, executed on the live EMUs; digests per model-stage
/// before and after (layout-independent), measured seconds and bytes beside the prediction.
pub fn transition(
    session: &Session,
    plane: &mut MpiPlane,
    set: &mut EmuSet,
    planner: &Planner,
    host_bytes_per_s: f64,
    (from, to): (&Plan, &Plan),
    kind: Option<&str>,
) -> Result<Value, RuntimeError> {
    let links = Links::of(&planner.cost().hardware, Some(host_bytes_per_s));
    let dag = TransitionDag::plan(from, to, &state_bytes(planner), &links, true)?;
    agree_on_dag(session.world(), session.watchdog(), &dag)?;
    let before = stage_digests(plane, set)?;
    let start = Instant::now();
    let (_, report) = execute(set, plane, &dag)?;
    let seconds = start.elapsed().as_secs_f64();
    let seconds =
        f64::from_bits(max_over_ranks(session.world(), session.watchdog(), "transition time", seconds.to_bits()));
    let after = stage_digests(plane, set)?;
    Ok(json!({
        "kind": kind,
        "seconds": seconds,
        "predicted_seconds": dag.schedule.seconds,
        "bytes": report.bytes_sent, // already the total of every rank
        "staged_bytes": dag.staged_bytes(),
        "primitives": dag.graph.node_count(),
        "from": describe(from),
        "to": describe(to),
        "digests_before": before,
        "digests_after": after,
    }))
}

/// Each model-stage's digest (its first replica's; every replica holds the same state).
fn stage_digests(plane: &mut MpiPlane, set: &EmuSet) -> Result<BTreeMap<String, String>, RuntimeError> {
    let digests = set.digests(plane)?;
    let mut out = BTreeMap::new();
    for emu in set.emus() {
        out.entry(emu.model_stage.to_string()).or_insert_with(|| digests[&emu.id].to_string());
    }
    Ok(out)
}
