//! `nereus selftest transitions`: random plan pairs executed as global transition DAGs.
//!
//! Per case, rank 0 draws a current and a target plan (PPO's six model-stages of a tiny model
//! on the job's ranks, several sharing ranks) and broadcasts them; every rank builds the DAG,
//! all agree on its hash, the current plan's EMUs are created, and every rank executes its
//! nodes in the one global order. Checks: every model-stage ends exactly at its target
//! replicas (layout and ranks), every replica's digest equals the model-stage's digest before
//! the transition, and the ledgers charge exactly the shards held. With `--device`, the state
//! is device-resident and every node's bytes move over the GPU data plane.

use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

use crate::backend::gpu::GpuRuntime;
use crate::comm::collectives::CollectiveLib;
use crate::comm::{broadcast_bytes, DataPlane, MpiPlane};
use crate::emu::{
    shard_bytes, Counters, DeviceMemory, Digest, EmuSet, Exchange, HostMemory, LocalShard, Section, ShardMemory,
};
use crate::model::{Catalogue, Layout, Position};
use crate::plan::{ModelStage, Plan, Role};
use crate::runtime::device::{with_device, DeviceChoice, DeviceJob, Plane};
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
    materialize_in(plane, &HostMemory, world, catalogue, plan, capacity)
}

/// [`materialize`] with shards in `memory`.
pub(crate) fn materialize_in<M: ShardMemory + Clone, P: DataPlane>(
    plane: &mut P,
    memory: &M,
    world: i32,
    catalogue: &Catalogue,
    plan: &Plan,
    capacity: u64,
) -> Result<(EmuSet<M>, BTreeMap<ModelStage, Digest>), RuntimeError> {
    let catalogues: BTreeMap<Role, Catalogue> = [Role::Actor, Role::Critic, Role::Reference, Role::Reward]
        .into_iter()
        .map(|r| (r, catalogue.clone()))
        .collect();
    let mut set = EmuSet::in_memory(plane.rank(), world, capacity, catalogues, memory.clone());
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
pub(crate) fn missed_targets<M: ShardMemory>(set: &EmuSet<M>, target: &Plan) -> Vec<String> {
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
pub(crate) fn changed_digests<M: ShardMemory, P: DataPlane>(
    plane: &mut P,
    set: &EmuSet<M>,
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

/// Runs `cases` random transitions on every rank (at least 3 ranks), with state in host memory
/// over MPI, or on the device `device` names.
pub fn transitions(
    session: &Session,
    cases: u32,
    seed: u64,
    device: Option<DeviceChoice>,
) -> Result<TransitionSummary, RuntimeError> {
    if session.world().size() < 3 {
        return Err(RuntimeError::Usage(
            "selftest transitions needs at least 3 MPI ranks (one per inference model-stage)".into(),
        ));
    }
    match device {
        None => {
            let mut plane = MpiPlane::new(session.world(), session.watchdog().clone());
            run_cases(session, &mut plane, &HostMemory, cases, seed)
        }
        Some(choice) => with_device(session, choice, DeviceCases { session, cases, seed }),
    }
}

/// The cases on device-resident state.
struct DeviceCases<'s> {
    session: &'s Session,
    cases: u32,
    seed: u64,
}

impl DeviceJob for DeviceCases<'_> {
    type Output = TransitionSummary;

    fn run<L: CollectiveLib, R: GpuRuntime>(
        self,
        plane: &mut Plane<'_, L, R>,
        memory: DeviceMemory<R>,
    ) -> Result<TransitionSummary, RuntimeError> {
        run_cases(self.session, plane, &memory, self.cases, self.seed)
    }
}

fn run_cases<M: ShardMemory + Clone, P: Exchange<M>>(
    session: &Session,
    plane: &mut P,
    memory: &M,
    cases: u32,
    seed: u64,
) -> Result<TransitionSummary, RuntimeError> {
    let world = session.world().size();
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
        let (mut set, before) = materialize_in(plane, memory, world, &catalogue, &pair.from, u64::MAX / 4)?;
        let (_, report) = execute(&mut set, plane, &dag)?;
        summary.executed += 1;
        summary.primitives += report.primitives as u64;
        summary.bytes_sent += report.bytes_sent;
        summary.resource_edges += dag.resource_edges as u64;
        check(case, plane, &set, &pair.to, &before, &mut summary)?;
    }
    Ok(summary)
}

/// Target replicas reached, digests unchanged, ledgers exact — agreed across ranks.
fn check<M: ShardMemory, P: DataPlane>(
    case: u32,
    plane: &mut P,
    set: &EmuSet<M>,
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
