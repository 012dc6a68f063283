//! `nereus selftest transitions`: random plan pairs executed as global transition DAGs.
//!
//! Even cases: rank 0 draws a current and a target plan (PPO's six model-stages of a tiny model
//! on the job's ranks, several sharing ranks) and broadcasts them, every other one at the
//! tightest memory its DAG can schedule. Odd cases: the planner's own move of the embedded tiny
//! PPO job between two response lengths on a drawn device memory, when `choose` calls it
//! executable. Every rank builds the DAG, all agree on its hash, the current plan's EMUs are
//! created, and every rank executes its nodes in the one global order. Checks: every model-stage ends exactly at its target
//! replicas (layout and ranks), every replica's digest equals the model-stage's digest before
//! the transition, and the ledgers charge exactly the shards held. With `--device`, the state
//! is device-resident and every node's bytes move over the GPU data plane.

use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

use nereus_core::config::DeviceChoice;
use nereus_core::config::{JobConfig, Overrides};
use nereus_core::cost::Efficiencies;
use nereus_core::model::{shard_bytes, Catalogue, Layout, Position, Section};
use nereus_core::plan::{ModelStage, Plan, Role};
use nereus_core::planner::{catalogues, Planner};
use nereus_core::rng::Rng;
use nereus_core::transition::global::Links;
use nereus_core::transition::testing::{plan_pair, tightest_capacity, tiny_catalogue};
use nereus_core::transition::{choose, Coordination, TransitionDag, TransitionError};
use nereus_exec::comm::{broadcast_bytes, DataPlane, MpiPlane};
use nereus_exec::emu::dag::{agree_on_dag, execute};
use nereus_exec::emu::{Counters, DeviceMemory, Digest, EmuSet, Exchange, HostMemory, LocalShard, ShardMemory};
use nereus_runtime::device::{open_device, Plane};
use nereus_runtime::{RuntimeError, Session};

/// What the run did.
#[derive(Debug, Default, Serialize)]
pub struct TransitionSummary {
    /// Cases drawn.
    pub cases: u32,
    /// Transitions executed.
    pub executed: u32,
    /// Cases not executed: random pairs whose DAG is blocked, planner cases that keep.
    pub refused: u32,
    /// Primitives executed.
    pub primitives: u64,
    /// Resource edges in the executed DAGs.
    pub resource_edges: u64,
    /// Bytes sent over the data plane.
    pub bytes_sent: u64,
    /// Bytes the executed DAGs staged through host memory.
    pub staged_bytes: u64,
    /// Cases drawn from the planner (odd cases).
    pub planner_cases: u32,
    /// Of those, targets `choose` reported executable (each one executed).
    pub planner_executable: u32,
    /// Of those, cases where the planner kept the current plan.
    pub planner_kept: u32,
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

/// `catalogue` as the model of every role (the random cases' tiny model).
pub(crate) fn for_every_role(catalogue: &Catalogue) -> BTreeMap<Role, Catalogue> {
    [Role::Actor, Role::Critic, Role::Reference, Role::Reward].into_iter().map(|r| (r, catalogue.clone())).collect()
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
    materialize_in(plane, &HostMemory, world, for_every_role(catalogue), plan, capacity, Vec::new())
}

/// [`materialize`] with shards in `memory`, each role's own catalogue, and `spare` buffers in
/// the store's cache (see [`nereus_exec::emu::ShardStore::keep_buffers`]).
pub(crate) fn materialize_in<M: ShardMemory + Clone, P: DataPlane>(
    plane: &mut P,
    memory: &M,
    world: i32,
    catalogues: BTreeMap<Role, Catalogue>,
    plan: &Plan,
    capacity: u64,
    spare: Vec<M::Buffer>,
) -> Result<(EmuSet<M>, BTreeMap<ModelStage, Digest>), RuntimeError> {
    let mut set = EmuSet::in_memory(plane.rank(), world, capacity, catalogues, memory.clone());
    set.store_mut().keep_buffers(spare);
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
            let mut plane = session.control_plane();
            run_cases(session, &mut plane, &HostMemory, cases, seed)
        }
        Some(choice) => {
            let (mut plane, memory) = open_device(session, choice)?;
            DeviceCases { session, cases, seed }.run(&mut plane, memory)
        }
    }
}

/// The cases on device-resident state.
struct DeviceCases<'s> {
    session: &'s Session,
    cases: u32,
    seed: u64,
}

impl DeviceCases<'_> {
    /// Runs on this rank's device plane, with shards in `memory`.
    fn run(self, plane: &mut Plane<'_>, memory: DeviceMemory) -> Result<TransitionSummary, RuntimeError> {
        run_cases(self.session, plane, &memory, self.cases, self.seed)
    }
}

/// One transition to execute: the plans, the bytes per unit position its DAG was planned with,
/// every role's catalogue and the per-rank capacity the EMU store enforces.
struct Case {
    dag: TransitionDag,
    from: Plan,
    to: Plan,
    catalogues: BTreeMap<Role, Catalogue>,
    capacity: u64,
}

fn run_cases<M: ShardMemory + Clone, P: Exchange<M>>(
    session: &Session,
    plane: &mut P,
    memory: &M,
    cases: u32,
    seed: u64,
) -> Result<TransitionSummary, RuntimeError> {
    let world = session.world().size();
    let mut summary = TransitionSummary { cases, ..TransitionSummary::default() };
    let planned = PlannerCases::new(world as u32)?;
    for case in 0..cases {
        let mut rng = Rng::new(seed.wrapping_mul(7_919).wrapping_add(u64::from(case)));
        // Odd cases: the planner's own targets; even cases: random pairs, every other one at
        // the tightest memory the DAG can schedule (where releases must precede acquires).
        let drawn = if case % 2 == 1 {
            planned.draw(&mut rng, &mut summary)?
        } else {
            random_case(session, &mut rng, case % 4 == 2)?
        };
        let Some(c) = drawn else {
            summary.refused += 1;
            continue;
        };
        agree_on_dag(session.world(), session.watchdog(), &c.dag)?;
        let (mut set, before) = materialize_in(plane, memory, world, c.catalogues, &c.from, c.capacity, Vec::new())?;
        let (_, report) = execute(&mut set, plane, &c.dag)?;
        summary.executed += 1;
        summary.primitives += report.primitives as u64;
        summary.bytes_sent += report.bytes_sent;
        summary.resource_edges += c.dag.resource_edges as u64;
        summary.staged_bytes += c.dag.staged_bytes();
        check(case, plane, &set, &c.to, &before, &mut summary)?;
    }
    Ok(summary)
}

/// The links of the random cases (one node of four devices per four ranks).
fn random_links(capacity_bytes: u64) -> Links {
    Links {
        devices_per_node: 4,
        intra_bytes_per_s: 5e9,
        inter_bytes_per_s: 1e9,
        memory_bytes_per_s: 10e9,
        setup_seconds: 1e-3,
        capacity_bytes,
        host_bytes_per_s: None,
        cores_per_node: None,
    }
}

/// A random plan pair of the tiny model (rank 0's draw, broadcast), at unbounded memory or at
/// the tightest the DAG can schedule; `None` when its DAG is blocked.
fn random_case(session: &Session, rng: &mut Rng, tight: bool) -> Result<Option<Case>, RuntimeError> {
    let world = session.world().size();
    let catalogue = tiny_catalogue();
    let drawn = serde_json::to_vec(&{
        let (from, to) = plan_pair(rng, &catalogue, world as u32);
        Pair { from, to }
    })
    .expect("plans serialize");
    let pair: Pair =
        serde_json::from_slice(&broadcast_bytes(session.world(), session.watchdog(), "plan broadcast", &drawn)?)
            .map_err(|e| RuntimeError::Usage(format!("undecodable plan from rank 0: {e}")))?;
    let bytes = state_bytes(&catalogue);
    let mut links = random_links(u64::MAX / 4);
    if tight {
        links.capacity_bytes = tightest_capacity(&pair.from, &pair.to, &bytes, &links);
    }
    match TransitionDag::plan(&pair.from, &pair.to, &bytes, &links, Coordination::Global) {
        Ok(dag) => Ok(Some(Case {
            dag,
            from: pair.from,
            to: pair.to,
            catalogues: for_every_role(&catalogue),
            capacity: links.capacity_bytes,
        })),
        Err(TransitionError::Blocked { .. }) => Ok(None),
        Err(e) => Err(e.into()),
    }
}

/// The planner's targets on a scaled-down CPU cluster: the embedded tiny PPO job on one node of
/// the world's ranks. A case plans for one response length, re-plans for another (and a device
/// memory drawn between the least any plan needs and twice that), and executes the transition
/// `choose` reports executable, with host staging allowed. Every rank plans alike; the DAG's
/// hash is agreed before anything moves.
struct PlannerCases {
    config: JobConfig,
}

impl PlannerCases {
    fn new(world: u32) -> Result<PlannerCases, RuntimeError> {
        let mut config =
            JobConfig::load(None, &Overrides::default(), &mut || unreachable!("the default names its cluster"))?;
        config.cluster.nodes = 1;
        config.cluster.devices_per_node = world;
        Ok(PlannerCases { config })
    }

    /// The planner for `len` response tokens on `memory_gb` per device.
    fn planner(&self, len: u64, memory_gb: f64) -> Result<Planner, RuntimeError> {
        let mut config = self.config.clone();
        config.cluster.device_memory_gb = memory_gb;
        Ok(Planner::new(&config, config.cluster.devices(), Some(len), Efficiencies::default())?)
    }

    /// The least device memory (GB, to 1%) at which both lengths have a plan.
    fn least_memory(&self, lens: [u64; 2]) -> Result<f64, RuntimeError> {
        let fits = |gb: f64| -> Result<bool, RuntimeError> {
            Ok(self.planner(lens[0], gb)?.search(None).is_ok() && self.planner(lens[1], gb)?.search(None).is_ok())
        };
        let (mut lo, mut hi) = (0.0, self.config.cluster.device_memory_gb);
        while hi - lo > 0.01 * hi {
            let mid = 0.5 * (lo + hi);
            if fits(mid)? {
                hi = mid;
            } else {
                lo = mid;
            }
        }
        Ok(hi)
    }

    /// One drawn case, or `None` when the planner keeps the current plan (counted in `summary`).
    fn draw(&self, rng: &mut Rng, summary: &mut TransitionSummary) -> Result<Option<Case>, RuntimeError> {
        let max = u64::from(self.config.rl.max_response_len);
        let lens: Vec<u64> = [4, 8, 16, max].into_iter().filter(|&l| l <= max).collect();
        let (from_len, to_len) = (*rng.pick(&lens), *rng.pick(&lens));
        let least = self.least_memory([from_len, to_len])?;
        let memory_gb = least * (1.0 + rng.below(100) as f64 / 100.0);
        let current = self.planner(from_len, memory_gb)?.search(None)?.plan();
        let planner = self.planner(to_len, memory_gb)?;
        let links = Links::of(&planner.cost().hardware, Some(self.config.cluster.host_link_gbps * 1e9));
        let choice = choose(&planner, &current, &links)?;
        summary.planner_cases += 1;
        let Some(dag) = choice.dag.filter(|_| !choice.keep) else {
            summary.planner_kept += 1;
            return Ok(None);
        };
        summary.planner_executable += 1;
        Ok(Some(Case {
            dag,
            from: current,
            to: choice.target.plan(),
            catalogues: catalogues(&self.config),
            capacity: links.capacity_bytes,
        }))
    }
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
