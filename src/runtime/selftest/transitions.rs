//! `nereus selftest transitions`: random plan pairs executed as global transition DAGs.
//!
//! Per case, rank 0 draws a current and a target plan (PPO's six model-stages of a tiny model
//! on the job's ranks, several sharing ranks) and broadcasts them; every rank builds the DAG,
//! all agree on its hash, the current plan's EMUs are created, and every rank executes its
//! nodes in the one global order. Checks: every model-stage ends exactly at its target
//! replicas (layout and ranks), every replica's digest equals the model-stage's digest before
//! the transition, and the ledgers charge exactly the shards held.

use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

use crate::comm::{broadcast_bytes, DataPlane, MpiPlane};
use crate::emu::{shard_bytes, Counters, Digest, EmuSet, LocalShard, Section};
use crate::model::{Catalogue, Layout, Position};
use crate::plan::{ModelStage, Plan, Role};
use crate::runtime::rng::Rng;
use crate::runtime::transition::{agree_on_dag, execute};
use crate::runtime::{RuntimeError, Session};
use crate::transition::global::Links;
use crate::transition::testing::{plan_pair, tiny_catalogue};
use crate::transition::{TransitionDag, TransitionError};

/// What the run did.
#[derive(Debug, Default, Serialize)]
pub struct TransitionSummary {
    /// Cases drawn.
    pub cases: u32,
    /// Transitions executed.
    pub executed: u32,
    /// Plans refused before any move (blocked DAGs).
    pub refused: u32,
    /// Primitives executed.
    pub primitives: u64,
    /// Resource edges in the executed DAGs.
    pub resource_edges: u64,
    /// Bytes sent over the data plane.
    pub bytes_sent: u64,
    /// Failed checks (empty on success).
    pub failures: Vec<String>,
}

#[derive(Serialize, Deserialize)]
struct Pair {
    from: Plan,
    to: Plan,
}

/// State bytes of one position of a unit of `catalogue`, as the EMU store charges them.
pub(crate) fn state_bytes(catalogue: &Catalogue) -> impl Fn(ModelStage, Layout, Position) -> u64 + '_ {
    move |ms, layout, p| {
        let dtype = catalogue.arch.dtype;
        shard_bytes(&catalogue.shard(layout, p), &Section::of(ms.trains(), dtype), dtype)
    }
}

/// An EMU set holding `plan`'s replicas of a `catalogue` model (every role), filled with
/// synthetic state, and each model-stage's digest.
pub(crate) fn materialize(
    plane: &mut MpiPlane<'_>,
    world: i32,
    catalogue: &Catalogue,
    plan: &Plan,
    capacity: u64,
) -> Result<(EmuSet, BTreeMap<ModelStage, Digest>), RuntimeError> {
    let catalogues: BTreeMap<Role, Catalogue> = [Role::Actor, Role::Critic, Role::Reference, Role::Reward]
        .into_iter()
        .map(|r| (r, catalogue.clone()))
        .collect();
    let mut set = EmuSet::new(plane.rank(), world, capacity, catalogues);
    for (k, p) in plan.placements.iter().enumerate() {
        let counters = Counters {
            updates: k as u64,
            model_version: 1,
            policy_version: 1,
            data_position: 7 * k as u64,
            seed: 1000 + k as u64,
        };
        for r in 0..p.candidate.dp as usize {
            set.create_synthetic(plane, p.candidate.model_stage, p.candidate.layout, p.replica(r), counters)?;
        }
    }
    let digests = set.digests(plane)?;
    let before = set.emus().map(|e| (e.model_stage, digests[&e.id])).collect();
    Ok((set, before))
}

/// How each model-stage of `target` differs from the replicas `set` holds (empty: all reached).
pub(crate) fn missed_targets(set: &EmuSet, target: &Plan) -> Vec<String> {
    let mut missed = Vec::new();
    for p in &target.placements {
        let ms = p.candidate.model_stage;
        let mut want: Vec<(Layout, Vec<i32>)> =
            (0..p.candidate.dp as usize).map(|r| (p.candidate.layout, p.replica(r).to_vec())).collect();
        let mut got: Vec<(Layout, Vec<i32>)> = set.replicas(ms).iter().map(|e| (e.layout, e.ranks.clone())).collect();
        want.sort();
        got.sort();
        if got != want {
            missed.push(format!("{ms} ended at {got:?}, target {want:?}"));
        }
    }
    missed
}

/// Replicas whose digest differs from their model-stage's digest `before`.
pub(crate) fn changed_digests(
    plane: &mut MpiPlane<'_>,
    set: &EmuSet,
    before: &BTreeMap<ModelStage, Digest>,
) -> Result<Vec<String>, RuntimeError> {
    let digests = set.digests(plane)?;
    Ok(set
        .emus()
        .filter(|e| digests[&e.id] != before[&e.model_stage])
        .map(|e| {
            format!(
                "{} of {} has digest {} after the transition, {} before",
                e.id, e.model_stage, digests[&e.id], before[&e.model_stage]
            )
        })
        .collect())
}

/// Runs `cases` random transitions on every rank (at least 3 ranks).
pub fn transitions(session: &Session, cases: u32, seed: u64) -> Result<TransitionSummary, RuntimeError> {
    let world = session.world().size();
    if world < 3 {
        return Err(RuntimeError::Usage(
            "selftest transitions needs at least 3 MPI ranks (one per inference model-stage)".into(),
        ));
    }
    let catalogue = tiny_catalogue();
    let bytes = state_bytes(&catalogue);
    let links = Links {
        devices_per_node: 4,
        intra_bytes_per_s: 5e9,
        inter_bytes_per_s: 1e9,
        memory_bytes_per_s: 10e9,
        setup_seconds: 1e-3,
        capacity_bytes: u64::MAX / 4,
    };
    let mut plane = MpiPlane::new(session.world(), session.watchdog().clone());
    let mut summary = TransitionSummary { cases, ..TransitionSummary::default() };
    for case in 0..cases {
        let mut rng = Rng::new(seed.wrapping_mul(7_919).wrapping_add(u64::from(case)));
        let drawn = serde_json::to_vec(&{
            let (from, to) = plan_pair(&mut rng, &catalogue, world as u32);
            Pair { from, to }
        })
        .expect("plans serialize");
        // Rank 0's draw is the one every rank uses.
        let pair: Pair =
            serde_json::from_slice(&broadcast_bytes(session.world(), session.watchdog(), "plan broadcast", &drawn)?)
                .map_err(|e| RuntimeError::Usage(format!("undecodable plan from rank 0: {e}")))?;
        let dag = match TransitionDag::plan(&pair.from, &pair.to, &bytes, &links, true) {
            Ok(dag) => dag,
            Err(TransitionError::Blocked { .. }) => {
                summary.refused += 1;
                continue;
            }
            Err(e) => return Err(e.into()),
        };
        agree_on_dag(session.world(), session.watchdog(), &dag)?;
        let (mut set, before) = materialize(&mut plane, world, &catalogue, &pair.from, u64::MAX / 4)?;
        let (_, report) = execute(&mut set, &mut plane, &dag)?;
        summary.executed += 1;
        summary.primitives += report.primitives as u64;
        summary.bytes_sent += report.bytes_sent;
        summary.resource_edges += dag.resource_edges as u64;
        check(case, &mut plane, &set, &pair.to, &before, &mut summary)?;
    }
    Ok(summary)
}

/// Target replicas reached, digests unchanged, ledgers exact — agreed across ranks.
fn check(
    case: u32,
    plane: &mut MpiPlane<'_>,
    set: &EmuSet,
    target: &Plan,
    before: &BTreeMap<ModelStage, Digest>,
    summary: &mut TransitionSummary,
) -> Result<(), RuntimeError> {
    let found = missed_targets(set, target).into_iter().chain(changed_digests(plane, set, before)?);
    summary.failures.extend(found.map(|f| format!("case {case}: {f}")));
    let held: u64 = set.store().shards().map(LocalShard::bytes).sum();
    let mut bad = [u64::from(held != set.store().ledger().used())];
    let all = plane.group(&(0..set.world_size()).collect::<Vec<_>>())?;
    plane.all_reduce_sum_u64(all, &mut bad)?;
    if bad[0] > 0 {
        summary.failures.push(format!("case {case}: on {} rank(s) the ledger disagrees with the shards held", bad[0]));
    }
    Ok(())
}
