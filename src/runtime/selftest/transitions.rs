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
use crate::emu::{shard_bytes, Counters, EmuSet, LocalShard, Section};
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

/// Runs `cases` random transitions on every rank (at least 3 ranks).
pub fn transitions(session: &Session, cases: u32, seed: u64) -> Result<TransitionSummary, RuntimeError> {
    let world = session.world().size();
    if world < 3 {
        return Err(RuntimeError::Usage("selftest transitions needs at least 3 MPI ranks (one per inference model-stage)".into()));
    }
    let catalogue = tiny_catalogue();
    let bytes = |ms: ModelStage, layout: Layout, p: Position| {
        let dtype = catalogue.arch.dtype;
        shard_bytes(&catalogue.shard(layout, p), &Section::of(ms.trains(), dtype), dtype)
    };
    let links = Links { devices_per_node: 4, intra_bytes_per_s: 5e9, inter_bytes_per_s: 1e9, memory_bytes_per_s: 10e9, setup_seconds: 1e-3, capacity_bytes: u64::MAX / 4 };
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
        let pair: Pair = serde_json::from_slice(&broadcast_bytes(session.world(), session.watchdog(), "plan broadcast", &drawn)?).map_err(|e| RuntimeError::Usage(format!("undecodable plan from rank 0: {e}")))?;
        let dag = match TransitionDag::plan(&pair.from, &pair.to, &bytes, &links, true) {
            Ok(dag) => dag,
            Err(TransitionError::Blocked { .. }) => {
                summary.refused += 1;
                continue;
            }
            Err(e) => return Err(e.into()),
        };
        agree_on_dag(session.world(), session.watchdog(), &dag)?;
        let catalogues: BTreeMap<Role, Catalogue> = [Role::Actor, Role::Critic, Role::Reference, Role::Reward].into_iter().map(|r| (r, catalogue.clone())).collect();
        let mut set = EmuSet::new(plane.rank(), world, u64::MAX / 4, catalogues);
        let mut before: BTreeMap<ModelStage, crate::emu::Digest> = BTreeMap::new();
        for (k, p) in pair.from.placements.iter().enumerate() {
            let counters = Counters { updates: k as u64, model_version: 1, policy_version: 1, data_position: 7 * k as u64, seed: 1000 + k as u64 };
            for r in 0..p.candidate.dp as usize {
                set.create_synthetic(&mut plane, p.candidate.model_stage, p.candidate.layout, p.replica(r), counters)?;
            }
        }
        let digests = set.digests(&mut plane)?;
        for e in set.emus() {
            before.entry(e.model_stage).or_insert(digests[&e.id]);
        }
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
fn check(case: u32, plane: &mut MpiPlane<'_>, set: &EmuSet, target: &Plan, before: &BTreeMap<ModelStage, crate::emu::Digest>, summary: &mut TransitionSummary) -> Result<(), RuntimeError> {
    for p in &target.placements {
        let ms = p.candidate.model_stage;
        let mut want: Vec<(Layout, Vec<i32>)> = (0..p.candidate.dp as usize).map(|r| (p.candidate.layout, p.replica(r).to_vec())).collect();
        let mut got: Vec<(Layout, Vec<i32>)> = set.replicas(ms).iter().map(|e| (e.layout, e.ranks.clone())).collect();
        want.sort();
        got.sort();
        if got != want {
            summary.failures.push(format!("case {case}: {ms} ended at {got:?}, target {want:?}"));
        }
    }
    let digests = set.digests(plane)?;
    for e in set.emus() {
        if digests[&e.id] != before[&e.model_stage] {
            summary.failures.push(format!("case {case}: {} of {} has digest {} after the transition, {} before", e.id, e.model_stage, digests[&e.id], before[&e.model_stage]));
        }
    }
    let held: u64 = set.store().shards().map(LocalShard::bytes).sum();
    let ledger_ok = held == set.store().ledger().used();
    let mut bad = [u64::from(!ledger_ok)];
    let all = plane.group(&(0..set.world_size()).collect::<Vec<_>>())?;
    plane.all_reduce_sum_u64(all, &mut bad)?;
    if bad[0] > 0 {
        summary.failures.push(format!("case {case}: on {} rank(s) the ledger disagrees with the shards held", bad[0]));
    }
    Ok(())
}
