//! Executing a planned transition on every rank: agree on the DAG, then run its primitives
//! in the one global order on the EMU set. A step boundary's transitions and the weight syncs
//! inside a step ([`Primitive::Sync`]) run here alike.

use std::collections::BTreeMap;

use sha2::{Digest as _, Sha256};
use thiserror::Error;

use crate::comm::{agree, CommError, Watchdog, World};
use petgraph::graph::NodeIndex;

use nereus_core::transition::{Primitive, TransitionDag, UnitId};

use super::{EmuError, EmuId, EmuSet, Exchange, PrimitiveOptions, PrimitiveReport, Route, ShardMemory};

/// Why a planned transition did not run to its end.
#[derive(Debug, Error)]
pub enum DagError {
    /// A primitive failed (no room, invalid arguments).
    #[error(transparent)]
    Emu(#[from] EmuError),
    /// The agreement or a transfer failed.
    #[error(transparent)]
    Comm(#[from] CommError),
    /// The DAG does not describe the EMUs this job holds.
    #[error("{0}")]
    Mismatch(String),
}

/// What an executed transition did (identical on every rank).
#[derive(Debug, Clone, Default, serde::Serialize)]
pub struct ExecutionReport {
    /// Primitives run.
    pub primitives: usize,
    /// Bytes sent over the data plane, all ranks together.
    pub bytes_sent: u64,
    /// Bytes copied between two buffers of one rank, all ranks together.
    pub bytes_local: u64,
}

/// A 64-bit digest of the DAG's schedule: every node, in order, with its ranks.
pub fn dag_hash(dag: &TransitionDag) -> u64 {
    let mut h = Sha256::new();
    for &i in &dag.schedule.order {
        let node = &dag.graph[NodeIndex::new(i)];
        let ranks: Vec<i32> = node.ranks(&dag.units).collect();
        h.update(format!("{:?}|{:?}|{ranks:?};", node.primitive, node.model_stage).as_bytes());
    }
    u64::from_be_bytes(h.finalize()[..8].try_into().expect("SHA-256 has 32 bytes"))
}

/// Checks with one all-reduce that every rank holds the same DAG (a mismatch stops the job
/// before any byte moves).
pub fn agree_on_dag(world: &World, watchdog: &Watchdog, dag: &TransitionDag) -> Result<(), DagError> {
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
) -> Result<(BTreeMap<UnitId, EmuId>, ExecutionReport), DagError> {
    // The schedule has checked memory: primitives need only their own ranks to agree, so
    // primitives on disjoint ranks run concurrently.
    execute_in_order(set, plane, dag, &dag.schedule.order, Agreement::Participants)
}

/// Which ranks agree that a primitive's targets fit before it moves a byte.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Agreement {
    /// Its own ranks (primitives on disjoint ranks run concurrently).
    Participants,
    /// Every rank, primitive after primitive: a primitive without room fails on every rank at
    /// once, so an order nobody checked (a baseline's) stops cleanly where it overruns.
    World,
}

/// Runs `dag`'s primitives in `order` (every node once), the room for each agreed by
/// `agreement` ([`execute`] runs the DAG's own schedule).
pub fn execute_in_order<M: ShardMemory, P: Exchange<M>>(
    set: &mut EmuSet<M>,
    plane: &mut P,
    dag: &TransitionDag,
    order: &[usize],
    agreement: Agreement,
) -> Result<(BTreeMap<UnitId, EmuId>, ExecutionReport), DagError> {
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
                DagError::Mismatch(format!(
                    "the transition starts from {} {} on {:?}, which this job does not hold",
                    u.model_stage, u.layout, u.ranks
                ))
            })?;
        ids.insert(*uid, emu.id);
    }
    let mut report = ExecutionReport::default();
    // A weight sync (Syncs only) allocates nothing but pack buffers and runs every step: it
    // stays on the step's stream with the allocator's cache, which a reshaping transition
    // (whose sizes change) runs apart from and empties.
    let reshapes = dag.graph.node_weights().any(|n| !matches!(n.primitive, Primitive::Sync { .. }));
    set.set_participants_only(agreement == Agreement::Participants);
    if reshapes {
        plane.begin_transition()?;
    }
    let outcome = run_nodes(set, plane, dag, order, &mut ids, &mut report);
    set.set_participants_only(false);
    let finished = if reshapes { plane.end_transition() } else { Ok(()) };
    plane.set_context(None);
    outcome?;
    finished?;
    Ok((ids, report))
}

fn run_nodes<M: ShardMemory, P: Exchange<M>>(
    set: &mut EmuSet<M>,
    plane: &mut P,
    dag: &TransitionDag,
    order: &[usize],
    ids: &mut BTreeMap<UnitId, EmuId>,
    report: &mut ExecutionReport,
) -> Result<(), DagError> {
    let fused = dag.fused_splits();
    for &i in order {
        plane.set_context(Some(format!("transition node {i}: {}", dag.label(i))));
        let (done, made) = run_node(set, plane, dag, i, ids, &fused)?;
        for (unit, emu) in made.iter().zip(&done.created) {
            let made = &set.emu(*emu).expect("a created EMU exists").ranks;
            if *made != dag.units[unit].ranks {
                return Err(DagError::Mismatch(format!(
                    "{} made ranks {made:?}, the plan expected {:?}",
                    dag.label(i),
                    dag.units[unit].ranks
                )));
            }
            ids.insert(*unit, *emu);
        }
        log::debug!("{}: {:.3} s, {} bytes sent", dag.label(i), done.seconds, done.bytes_sent);
        report.primitives += 1;
        report.bytes_sent += done.bytes_sent;
        report.bytes_local += done.bytes_local;
    }
    Ok(())
}

/// Runs node `i`; returns what it did and the units it made, in the order of `created`. A
/// Split of `fused` runs with its Merge ([`EmuSet::reshard_with`]), which then does nothing.
fn run_node<M: ShardMemory, P: Exchange<M>>(
    set: &mut EmuSet<M>,
    plane: &mut P,
    dag: &TransitionDag,
    i: usize,
    ids: &BTreeMap<UnitId, EmuId>,
    fused: &BTreeMap<usize, usize>,
) -> Result<(PrimitiveReport, Vec<UnitId>), DagError> {
    let node = &dag.graph[NodeIndex::new(i)];
    let made = node.primitive.creates().to_vec();
    let options = PrimitiveOptions { route: Route::staged_if(node.staged), in_transition: true };
    let done = match &node.primitive {
        Primitive::Split { source, .. } if fused.contains_key(&i) => {
            let merge = &dag.graph[NodeIndex::new(fused[&i])];
            let Primitive::Merge { merged, .. } = &merge.primitive else { unreachable!("fused with a Merge") };
            let (unit, staged) = (&dag.units[merged], node.staged || merge.staged);
            let done = set.reshard_with(plane, ids[source], unit.layout, &unit.ranks, Route::staged_if(staged))?;
            return Ok((done, vec![*merged]));
        }
        Primitive::Merge { .. } if fused.values().any(|&m| m == i) => {
            let label = format!("{} (done with its Split)", dag.label(i));
            let done =
                PrimitiveReport { primitive: label, bytes_sent: 0, bytes_local: 0, seconds: 0.0, created: vec![] };
            return Ok((done, vec![]));
        }
        Primitive::Split { source, parts } => set.split(plane, ids[source], dag.units[&parts[0]].layout, options)?,
        Primitive::Extend { source, copy } => set.extend(plane, ids[source], &dag.units[copy].ranks, options)?,
        Primitive::Merge { parts, merged } => {
            let part_ids: Vec<EmuId> = parts.iter().map(|p| ids[p]).collect();
            set.merge(plane, &part_ids, dag.units[merged].layout, options)?
        }
        Primitive::Destroy { unit } => set.destroy(ids[unit])?,
        Primitive::Sync { source, target } => set.sync_params(plane, ids[source], ids[target])?,
    };
    Ok((done, made))
}
