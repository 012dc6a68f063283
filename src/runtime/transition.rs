//! Executing a planned transition on every rank: agree on the DAG, then run its primitives
//! in the one global order on the EMU set.

use std::collections::BTreeMap;

use sha2::{Digest as _, Sha256};

use crate::comm::{agree, Watchdog, World};
use crate::emu::{EmuId, EmuSet, Exchange, ShardMemory};
use crate::transition::{Primitive, TransitionDag, UnitId};

use super::RuntimeError;

/// What an executed transition did (identical on every rank).
#[derive(Debug, Clone, Default, serde::Serialize)]
pub struct ExecutionReport {
    /// Primitives run.
    pub primitives: usize,
    /// Bytes sent over the data plane, all ranks together.
    pub bytes_sent: u64,
}

/// A 64-bit digest of the DAG's schedule: every node, in order, with its ranks.
pub fn dag_hash(dag: &TransitionDag) -> u64 {
    let mut h = Sha256::new();
    for &i in &dag.schedule.order {
        let node = &dag.graph[petgraph::graph::NodeIndex::new(i)];
        let ranks: Vec<i32> = node.ranks(&dag.units).collect();
        h.update(format!("{:?}|{:?}|{ranks:?};", node.primitive, node.model_stage).as_bytes());
    }
    u64::from_be_bytes(h.finalize()[..8].try_into().expect("SHA-256 has 32 bytes"))
}

/// Checks with one all-reduce that every rank holds the same DAG (a mismatch stops the job
/// before any byte moves).
pub fn agree_on_dag(world: &World, watchdog: &Watchdog, dag: &TransitionDag) -> Result<(), RuntimeError> {
    agree(world, watchdog, "transition DAG agreement", Ok(dag_hash(dag)))?;
    Ok(())
}

/// Runs every primitive of `dag` in its global order. The DAG's initial units must be EMUs
/// of `set` (same model-stage, layout and ranks); returns which EMU each unit became. A device
/// plane runs the transition on a stream of its own and has waited for it when this returns.
pub fn execute<M: ShardMemory, P: Exchange<M>>(
    set: &mut EmuSet<M>,
    plane: &mut P,
    dag: &TransitionDag,
) -> Result<(BTreeMap<UnitId, EmuId>, ExecutionReport), RuntimeError> {
    let mut ids: BTreeMap<UnitId, EmuId> = BTreeMap::new();
    for uid in &dag.initial {
        let u = &dag.units[uid];
        let emu = set
            .emus()
            .find(|e| {
                e.model_stage == u.model_stage
                    && e.layout == u.layout
                    && e.ranks == u.ranks
                    && !ids.values().any(|x| *x == e.id)
            })
            .ok_or_else(|| {
                RuntimeError::Usage(format!(
                    "the transition starts from {} {} on {:?}, which this job does not hold",
                    u.model_stage, u.layout, u.ranks
                ))
            })?;
        ids.insert(*uid, emu.id);
    }
    let mut report = ExecutionReport::default();
    // The schedule has checked memory: primitives need only their own ranks to agree, so
    // primitives on disjoint ranks run concurrently.
    set.set_participants_only(true);
    plane.begin_transition()?;
    let outcome = run_nodes(set, plane, dag, &mut ids, &mut report);
    set.set_participants_only(false);
    let finished = plane.end_transition();
    plane.set_context(None);
    outcome?;
    finished?;
    Ok((ids, report))
}

fn run_nodes<M: ShardMemory, P: Exchange<M>>(
    set: &mut EmuSet<M>,
    plane: &mut P,
    dag: &TransitionDag,
    ids: &mut BTreeMap<UnitId, EmuId>,
    report: &mut ExecutionReport,
) -> Result<(), RuntimeError> {
    for &i in &dag.schedule.order {
        plane.set_context(Some(format!("transition node {i}: {}", dag.label(i))));
        let node = &dag.graph[petgraph::graph::NodeIndex::new(i)];
        let primitive = &node.primitive;
        let done = match primitive {
            Primitive::Split { source, parts } => {
                set.split_with(plane, ids[source], dag.units[&parts[0]].layout, node.staged)?
            }
            Primitive::Extend { source, copy } => {
                set.extend_in_transition(plane, ids[source], &dag.units[copy].ranks)?
            }
            Primitive::Merge { parts, merged } => {
                let part_ids: Vec<EmuId> = parts.iter().map(|p| ids[p]).collect();
                set.merge_with(plane, &part_ids, dag.units[merged].layout, node.staged)?
            }
            Primitive::Destroy { unit } => set.destroy(ids[unit])?,
        };
        for (unit, emu) in primitive.creates().iter().zip(&done.created) {
            let made = &set.emu(*emu).expect("a created EMU exists").ranks;
            if *made != dag.units[unit].ranks {
                return Err(RuntimeError::Usage(format!(
                    "{} made ranks {made:?}, the plan expected {:?}",
                    dag.label(i),
                    dag.units[unit].ranks
                )));
            }
            ids.insert(*unit, *emu);
        }
        report.primitives += 1;
        report.bytes_sent += done.bytes_sent;
    }
    Ok(())
}
