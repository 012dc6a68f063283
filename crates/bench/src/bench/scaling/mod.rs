//! `nereus bench scaling`: scaling a PPO job's training state three ways in one run, on real
//! ranks with real bytes (the paper's Table 4: 16→32 GPUs in 6.52 s against Tenplex's 66.43 s
//! and UCP's 836.74 s).
//!
//! The state: `actor/training` and `critic/training` EMUs (θ and both Adam moments, f32) of two
//! Llama-style models of 58.7 M and 50.3 M parameters (`--small`: 0.8 M), the actor's replicas on
//! the even ranks and the critic's on the odd ones. Cases: DP doubling 2→4 and 4→8 ranks
//! (Extend), shrinking 8→4 (Destroy), and a reshard of every model from `(tp=2, pp=1)` to
//! `(tp=1, pp=2)`, with one replica each on 4 ranks and with two on 8; a case runs when the
//! world has its ranks. Each case is measured as
//! - (a) **Nereus**: the transition DAG planned from plan to plan, agreed and executed on the
//!   live EMUs (Extend copies resident replicas onto the new ranks; Destroy frees);
//! - (b) **checkpoint/restart** as UCP does it ([`restart`]): every rank of each model's first
//!   replica saves its shards as safetensors, the job's state is dropped, and a fresh `mpirun`
//!   of this binary with the new rank count loads them into the new layout; timed from the
//!   save's start until every rank of the new job holds its state, so `mpirun`'s start-up is
//!   part of what it pays;
//! - (c) **per-tensor** as Tenplex does it (Wagenländer et al., SOSP 2024): replicas already in
//!   their target place stay resident, every other target is built one tensor at a time from
//!   the current replicas, reading each sub-tensor on its own rank where one holds it, so only
//!   sub-tensors whose placement changes cross ranks ([`EmuSet::rebuild_per_tensor`]), over the
//!   same data plane (MPI);
//!
//! and the floor: (a)'s bytes over the point-to-point bandwidth measured in the same run (ranks
//! of one node: a memory copy between processes). Every method's result is checked: each
//! model-stage ends at its target replicas with the layout-independent digest it had before.

mod restart;

pub use restart::restore;

use serde::Serialize;
use std::collections::BTreeMap;
use std::io::Write;
use std::path::PathBuf;

use crate::selftest::{changed_digests, materialize_in, missed_targets, state_bytes};
use nereus_core::config::DataPlane as PlaneKind;
use nereus_core::config::DeviceChoice;
use nereus_core::config::Dtype;
use nereus_core::model::{Architecture, Catalogue, Layout, OutputHead, Position};
use nereus_core::plan::{Candidate, ModelStage, Placement, Plan, Recompute, Role, Stage};
use nereus_core::transition::global::Links;
use nereus_core::transition::{Coordination, TransitionDag};
use nereus_exec::comm::{DataPlane, GroupId};
use nereus_exec::emu::dag::{agree_on_dag, execute};
use nereus_exec::emu::{DeviceMemory, Digest, EmuSet, Exchange, HostMemory, ShardMemory};
use nereus_runtime::device::{open_device, Plane};
use nereus_runtime::{RuntimeError, Session};

use super::primitives::{device_p2p_seconds, host_p2p_seconds, timed, Measured, Wait};
use super::{machine, BenchReport, Floor};

/// Bytes every rank may hold (host memory: the machine, not a device, is the limit).
const CAPACITY: u64 = u64::MAX / 4;

/// The paper's Table 4 (16→32 GPUs): Nereus, Tenplex and UCP seconds.
const PAPER_TABLE_4: (f64, f64, f64) = (6.52, 66.43, 836.74);

/// `nereus bench scaling`: scaling a PPO job's training state (two 50M+-parameter models, θ
/// and Adam moments): DP 2→4→8 ranks, 8→4, and a reshard, each by the transition DAG, by
/// checkpoint/restart (UCP-style, a fresh mpirun) and tensor by tensor (Tenplex-style), against
/// the point-to-point bandwidth (mpirun -n 8).
#[derive(Debug, Clone)]
pub struct Options {
    /// A state of a few MB (tests) instead of the 50M+-parameter models.
    pub small: bool,
    /// Where the checkpoint/restart method writes its checkpoints (replaced per case).
    pub dir: PathBuf,
    /// The launcher of the restarted job; `-n N`, this binary and its arguments follow.
    pub launcher: String,
    /// Measurements of the DAG and of the per-tensor baseline per case (the median is
    /// reported; checkpoint/restart runs once).
    pub reps: usize,
    /// Only these cases (extend-2-4, extend-4-8, destroy-8-4, reshard-tp2-pp2,
    /// reshard-tp2-pp2-dp2), comma-separated.
    pub cases: Vec<String>,
    /// Also write the report as JSON.
    pub json: Option<PathBuf>,
    /// The state lives in device memory and moves over the GPU data plane (all three methods;
    /// the restarted job of (b) opens the same device).
    pub device: Option<DeviceChoice>,
}

/// One case, measured three ways.
#[derive(Debug, Clone, Serialize)]
pub struct Row {
    /// `extend-2-4`, `extend-4-8`, `destroy-8-4`, `reshard-tp2-pp2`, `reshard-tp2-pp2-dp2`.
    pub case: String,
    /// Where the state lived and moved: `host` (MPI), or the backend of the device `--device`
    /// opened (`cuda`, `rocm`, `emulated`) over the GPU data plane.
    pub memory: String,
    /// Ranks the job holds before.
    pub from_ranks: u32,
    /// Ranks it holds after.
    pub to_ranks: u32,
    /// One replica of every model: the job's logical state, bytes.
    pub state_bytes: u64,
    /// (a): bytes the DAG sent between ranks.
    pub bytes_moved: u64,
    /// (a): bytes the DAG copied between buffers of one rank (on a CPU node these cost about
    /// what sent bytes cost: both are memory copies).
    pub bytes_local: u64,
    /// (a): measured seconds (between barriers of the world).
    pub nereus_s: f64,
    /// (a): the DAG's `L_tran` with the measured point-to-point bandwidth.
    pub predicted_s: f64,
    /// (b): seconds from the save's start until every rank of the new job holds its state.
    pub ucp_s: f64,
    /// (b): bytes written to the checkpoint.
    pub checkpoint_bytes: u64,
    /// (c): measured seconds.
    pub tenplex_s: f64,
    /// (c): bytes sent between ranks.
    pub tenplex_bytes: u64,
    /// (c): bytes copied between buffers of one rank.
    pub tenplex_bytes_local: u64,
    /// `bytes_moved` over the point-to-point bandwidth, seconds.
    pub floor_s: f64,
    /// `ucp_s / nereus_s`.
    pub ucp_over_nereus: f64,
    /// `tenplex_s / nereus_s`.
    pub tenplex_over_nereus: f64,
    /// `nereus_s / floor_s` (`None` when nothing moves).
    pub nereus_over_floor: Option<f64>,
}

/// One scaling case: the job's plan before and after.
pub(crate) struct Case {
    name: &'static str,
    from: Plan,
    to: Plan,
}

impl Case {
    /// Ranks a plan occupies (one more than its highest rank).
    fn ranks(plan: &Plan) -> u32 {
        plan.placements.iter().flat_map(|p| p.ranks.iter()).max().map_or(0, |r| *r as u32 + 1)
    }
}

/// The two trained models: `small` gives a state of a few MB.
fn models(small: bool) -> BTreeMap<Role, Catalogue> {
    let (vocab, hidden, layers, heads) = if small { (1024, 128, 2, 4) } else { (16_384, 512, 10, 8) };
    let actor = Architecture {
        vocab,
        hidden,
        layers,
        heads,
        kv_heads: heads,
        head_dim: hidden / heads,
        ffn: 4 * hidden,
        tie_embeddings: false,
        qk_norm: false,
        head: OutputHead::Lm,
        dtype: Dtype::F32,
    };
    let critic = Architecture { head: OutputHead::Value, ..actor.clone() };
    BTreeMap::from([(Role::Actor, Catalogue::new(actor)), (Role::Critic, Catalogue::new(critic))])
}

fn placement(role: Role, layout: Layout, ranks: Vec<i32>) -> Placement {
    let candidate = Candidate {
        model_stage: ModelStage::new(role, Stage::Training),
        layout,
        dp: ranks.len() as u32 / layout.size(),
        recompute: Recompute::None,
        micro_batch: 1,
    };
    Placement { candidate, ranks }
}

/// Data parallelism on `ranks` ranks: one `(1, 1)` actor replica per even rank, one critic
/// replica per odd rank.
fn data_parallel(ranks: i32) -> Plan {
    let on = |first: i32| (first..ranks).step_by(2).collect::<Vec<i32>>();
    let one = Layout::new(1, 1);
    Plan { placements: vec![placement(Role::Actor, one, on(0)), placement(Role::Critic, one, on(1))] }
}

/// `dp` replicas per model in the 2-rank `layout`: the actor's on ranks `0..2·dp`, the
/// critic's on the next `2·dp`.
fn two_rank_replicas(layout: Layout, dp: i32) -> Plan {
    let actor = (0..2 * dp).collect();
    let critic = (2 * dp..4 * dp).collect();
    Plan { placements: vec![placement(Role::Actor, layout, actor), placement(Role::Critic, layout, critic)] }
}

/// The cases that fit in `world` ranks.
fn cases(world: i32) -> Vec<Case> {
    let all = [
        Case { name: "extend-2-4", from: data_parallel(2), to: data_parallel(4) },
        Case { name: "extend-4-8", from: data_parallel(4), to: data_parallel(8) },
        Case { name: "destroy-8-4", from: data_parallel(8), to: data_parallel(4) },
        Case {
            name: "reshard-tp2-pp2",
            from: two_rank_replicas(Layout::new(2, 1), 1),
            to: two_rank_replicas(Layout::new(1, 2), 1),
        },
        Case {
            name: "reshard-tp2-pp2-dp2",
            from: two_rank_replicas(Layout::new(2, 1), 2),
            to: two_rank_replicas(Layout::new(1, 2), 2),
        },
    ];
    all.into_iter().filter(|c| Case::ranks(&c.from).max(Case::ranks(&c.to)) <= world as u32).collect()
}

/// What every method needs: the ranks, the memory the state lives in, the models, the
/// yardstick.
pub(crate) struct Bench<'s, 'p, P, M: ShardMemory> {
    session: &'s Session,
    plane: &'p mut P,
    /// Host memory, or the device's (`--device`).
    memory: M,
    /// The device the restarted job of method (b) opens (`None`: host memory).
    device: Option<DeviceChoice>,
    /// Where the state lives, for the rows: `host`, or the device's backend.
    resident: String,
    all: GroupId,
    catalogues: BTreeMap<Role, Catalogue>,
    /// Point-to-point bytes/s measured at the start.
    bandwidth: f64,
    /// The cores this node's ranks share for their copies: host-resident state is copied by
    /// them; a device's copies run on its own engines (`None`).
    shared_cores: Option<u32>,
    options: &'s Options,
    /// Every buffer the last measurement's store held, live or cached: the next one starts
    /// with them cached, as a long-running job's caching allocator holds the buffers of the
    /// transitions it ran before. On a CPU rank the kernel's first touch of a new page costs
    /// more than the copy into it; a GPU's allocator pool pays neither.
    spare: Vec<M::Buffer>,
}

impl<P: Measured + Exchange<M>, M: ShardMemory + Clone> Bench<'_, '_, P, M> {
    /// The job's state in `plan`, filled with synthetic bytes, and each model-stage's digest;
    /// the store starts with the buffers the last measurement left ([`Bench::spare`]).
    fn materialize(&mut self, plan: &Plan) -> Result<(EmuSet<M>, BTreeMap<ModelStage, Digest>), RuntimeError> {
        let world = self.session.world().size();
        let spare = std::mem::take(&mut self.spare);
        materialize_in(self.plane, &self.memory, world, self.catalogues.clone(), plan, CAPACITY, spare)
    }

    /// Every model-stage at `to`'s replicas with its digest of `before`, or an error naming
    /// what `method` lost (the same on every rank; rank 0 reports it).
    fn verify(
        &mut self,
        method: &str,
        case: &Case,
        set: &EmuSet<M>,
        before: &BTreeMap<ModelStage, Digest>,
    ) -> Result<(), RuntimeError> {
        let mut failures = missed_targets(set, &case.to);
        failures.extend(changed_digests(self.plane, set, before)?);
        match failures.first() {
            None => Ok(()),
            Some(first) => Err(RuntimeError::everywhere(
                "bench scaling check",
                RuntimeError::SelftestFailed(format!("{method} on {}: {first}", case.name)),
            )),
        }
    }

    /// Bytes of one position of a unit, as the store charges them.
    fn state_bytes(&self, ms: ModelStage, layout: Layout, position: Position) -> u64 {
        state_bytes(&self.catalogues[&ms.role])(ms, layout, position)
    }

    /// The links the DAG is planned and costed with: this run's bandwidth everywhere.
    fn links(&self) -> Links {
        Links {
            devices_per_node: self.session.world().size() as u32,
            intra_bytes_per_s: self.bandwidth,
            inter_bytes_per_s: self.bandwidth,
            memory_bytes_per_s: self.bandwidth,
            setup_seconds: PlaneKind::Mpi.communicator_setup_s(),
            capacity_bytes: CAPACITY,
            host_bytes_per_s: None,
            cores_per_node: self.shared_cores,
        }
    }

    /// (a): the transition DAG on the live EMUs; seconds, bytes sent and copied locally,
    /// predicted seconds.
    fn nereus(&mut self, case: &Case) -> Result<(f64, u64, u64, f64), RuntimeError> {
        let (mut set, before) = self.materialize(&case.from)?;
        let bytes = |ms: ModelStage, l: Layout, p: Position| self.state_bytes(ms, l, p);
        let dag = TransitionDag::plan(&case.from, &case.to, &bytes, &self.links(), Coordination::Global)?;
        agree_on_dag(self.session.world(), self.session.watchdog(), &dag)?;
        let wait = Wait::Calm(self.session.world(), self.session.watchdog());
        let (report, seconds) = timed(self.plane, self.all, wait, |plane| Ok(execute(&mut set, plane, &dag)?.1))?;
        self.verify("the transition DAG", case, &set, &before)?;
        self.spare = set.into_buffers();
        Ok((seconds, report.bytes_sent, report.bytes_local, dag.schedule.seconds))
    }

    /// (c): every model-stage rebuilt tensor by tensor, Tenplex-style; seconds, bytes sent and
    /// copied locally.
    fn tenplex(&mut self, case: &Case) -> Result<(f64, u64, u64), RuntimeError> {
        let (mut set, before) = self.materialize(&case.from)?;
        set.set_participants_only(true);
        let wait = Wait::Calm(self.session.world(), self.session.watchdog());
        let ((sent, local), seconds) = timed(self.plane, self.all, wait, |plane| {
            let (mut sent, mut local) = (0, 0);
            for p in &case.to.placements {
                let dp = p.candidate.dp as usize;
                let targets: Vec<(Layout, Vec<i32>)> =
                    (0..dp).map(|r| (p.candidate.layout, p.replica(r).to_vec())).collect();
                let done = set.rebuild_per_tensor(plane, p.candidate.model_stage, &targets)?;
                (sent, local) = (sent + done.bytes_sent, local + done.bytes_local);
            }
            Ok((sent, local))
        })?;
        set.set_participants_only(false);
        self.verify("the per-tensor (Tenplex-style) baseline", case, &set, &before)?;
        self.spare = set.into_buffers();
        Ok((seconds, sent, local))
    }

    /// One case, three ways (rows are complete on rank 0).
    fn case(&mut self, case: &Case) -> Result<Row, RuntimeError> {
        let reps = self.options.reps.max(1);
        // Buffers of the last case are not this one's sizes: they would only hold memory.
        self.spare.clear();
        log::info!("{}: the transition DAG", case.name);
        let (nereus_s, bytes_moved, bytes_local, predicted_s) = median_of(reps, |_| self.nereus(case), |m| m.0)?;
        log::info!("{}: per tensor, Tenplex-style", case.name);
        let (tenplex_s, tenplex_bytes, tenplex_bytes_local) = median_of(reps, |_| self.tenplex(case), |m| m.0)?;
        log::info!("{}: checkpoint and restart", case.name);
        let (ucp_s, checkpoint_bytes) = self.checkpoint_restart(case)?;
        let whole = |role: &Role| {
            let ms = ModelStage::new(*role, Stage::Training);
            self.state_bytes(ms, Layout::new(1, 1), Position { tp: 0, pp: 0 })
        };
        let state_bytes = self.catalogues.keys().map(whole).sum();
        let floor_s = bytes_moved as f64 / self.bandwidth;
        Ok(Row {
            case: case.name.into(),
            memory: self.resident.clone(),
            from_ranks: Case::ranks(&case.from),
            to_ranks: Case::ranks(&case.to),
            state_bytes,
            bytes_moved,
            bytes_local,
            nereus_s,
            predicted_s,
            ucp_s,
            checkpoint_bytes,
            tenplex_s,
            tenplex_bytes,
            tenplex_bytes_local,
            floor_s,
            ucp_over_nereus: ucp_s / nereus_s,
            tenplex_over_nereus: tenplex_s / nereus_s,
            nereus_over_floor: (bytes_moved > 0).then(|| nereus_s / floor_s),
        })
    }
}

/// The measurement with the median `seconds` of `reps` runs of `measure`, after one unmeasured
/// run that leaves its buffers to the next ([`Bench::spare`]).
fn median_of<T>(
    reps: usize,
    mut measure: impl FnMut(usize) -> Result<T, RuntimeError>,
    seconds: impl Fn(&T) -> f64,
) -> Result<T, RuntimeError> {
    measure(0)?;
    let mut all = (0..reps).map(&mut measure).collect::<Result<Vec<T>, _>>()?;
    all.sort_by(|a, b| seconds(a).total_cmp(&seconds(b)));
    Ok(all.swap_remove(reps / 2))
}

/// Runs the benchmark on every rank, with the state in host memory over MPI or on the device
/// `--device` names; rank 0 prints the table and writes the report.
pub fn run(session: &Session, options: &Options) -> Result<(), RuntimeError> {
    let world = session.world().size();
    let mut cases = cases(world);
    cases.retain(|c| options.cases.is_empty() || options.cases.iter().any(|n| n == c.name));
    if cases.is_empty() {
        return Err(RuntimeError::Usage(
            "bench scaling: no case fits; it needs at least 4 MPI ranks, 8 for every case (mpirun -n 8 …), and case names among extend-2-4, extend-4-8, destroy-8-4, reshard-tp2-pp2, reshard-tp2-pp2-dp2".into(),
        ));
    }
    let (rows, bandwidth) = match options.device {
        None => {
            let mut plane = session.control_plane();
            let all = plane.group(&(0..world).collect::<Vec<_>>())?;
            let wait = Wait::Calm(session.world(), session.watchdog());
            let bandwidth =
                yardstick_bytes(options) as f64 / host_p2p_seconds(&mut plane, all, wait, 3, yardstick_bytes(options))?;
            let bench = Bench::new(session, &mut plane, HostMemory, None, options, all, bandwidth);
            (bench.measure(&cases)?, bandwidth)
        }
        Some(choice) => {
            let (mut plane, memory) = open_device(session, choice)?;
            OnDevice { session, options, choice, cases: &cases }.run(&mut plane, memory)?
        }
    };
    if session.rank() != 0 {
        return Ok(());
    }
    print_table(&models(options.small), options.device, bandwidth, &rows).map_err(RuntimeError::Stdout)?;
    let report = BenchReport { bench: "scaling".into(), machine: machine(session), floors: floors(&rows), rows };
    report.finish(options.json.as_deref())
}

/// Bytes of the point-to-point yardstick's message.
fn yardstick_bytes(options: &Options) -> u64 {
    if options.small {
        4 << 20
    } else {
        256 << 20
    }
}

/// The benchmark on device-resident state (`--device`): the yardstick is one device send.
struct OnDevice<'s, 'c> {
    session: &'s Session,
    options: &'s Options,
    choice: DeviceChoice,
    cases: &'c [Case],
}

impl OnDevice<'_, '_> {
    /// Runs on this rank's device plane, with shards in `memory`.
    fn run(self, plane: &mut Plane<'_>, memory: DeviceMemory) -> Result<(Vec<Row>, f64), RuntimeError> {
        let all = plane.group(&(0..self.session.world().size()).collect::<Vec<_>>())?;
        let wait = Wait::Calm(self.session.world(), self.session.watchdog());
        let bytes = yardstick_bytes(self.options);
        let bandwidth = bytes as f64 / device_p2p_seconds(plane, &memory, all, wait, 3, bytes)?;
        let backend = plane.device().runtime().backend().to_lowercase();
        let mut bench = Bench::new(self.session, plane, memory, Some(self.choice), self.options, all, bandwidth);
        bench.resident = backend;
        Ok((bench.measure(self.cases)?, bandwidth))
    }
}

impl<'s, 'p, P: Measured + Exchange<M>, M: ShardMemory + Clone> Bench<'s, 'p, P, M> {
    /// The bench over `plane` with state in `memory` (opened on `device`, or host memory).
    fn new(
        session: &'s Session,
        plane: &'p mut P,
        memory: M,
        device: Option<DeviceChoice>,
        options: &'s Options,
        all: GroupId,
        bandwidth: f64,
    ) -> Self {
        let catalogues = models(options.small);
        let resident = "host".into();
        let shared_cores = device.is_none().then(|| super::machine(session).cores).filter(|&c| c > 0);
        let spare = Vec::new();
        Bench { session, plane, memory, device, resident, all, catalogues, bandwidth, shared_cores, options, spare }
    }

    /// Every case, three ways.
    fn measure(mut self, cases: &[Case]) -> Result<Vec<Row>, RuntimeError> {
        cases.iter().map(|c| self.case(c)).collect()
    }
}

/// The floors, per case: (b) over (a) at least 10, (c) over (a) at least 2, (a) over
/// the bandwidth floor at most 1.5 (where bytes move; a Destroy must move none).
fn floors(rows: &[Row]) -> Vec<Floor> {
    let mut floors = Vec::new();
    for r in rows {
        floors.push(Floor::at_least(&format!("ucp_over_nereus_{}", r.case), r.ucp_over_nereus, 10.0, "ratio"));
        floors.push(Floor::at_least(&format!("tenplex_over_nereus_{}", r.case), r.tenplex_over_nereus, 2.0, "ratio"));
        match r.nereus_over_floor {
            Some(x) => floors.push(Floor::at_most(&format!("nereus_over_bandwidth_floor_{}", r.case), x, 1.5, "ratio")),
            None => floors.push(Floor::at_most(&format!("bytes_moved_{}", r.case), r.bytes_moved as f64, 0.0, "bytes")),
        }
    }
    floors
}

fn print_table(
    catalogues: &BTreeMap<Role, Catalogue>,
    device: Option<DeviceChoice>,
    bandwidth: f64,
    rows: &[Row],
) -> std::io::Result<()> {
    let mut out = std::io::stdout().lock();
    let resident = device.map_or_else(|| "host memory".into(), |d| format!("device memory ({d:?})").to_lowercase());
    for (role, c) in catalogues {
        writeln!(out, "{}: {} parameters, f32 θ + Adam m, v, in {resident}", role.name(), c.parameter_count())?;
    }
    let between = match device {
        None => "MPI between ranks of this node",
        Some(_) => "the GPU plane's library between devices",
    };
    writeln!(out, "point-to-point bandwidth: {:.2} GB/s ({between})", bandwidth / 1e9)?;
    print_times(&mut out, rows)?;
    print_bytes(&mut out, rows)
}

/// Seconds per case and method, beside the paper's Table 4.
fn print_times(out: &mut impl Write, rows: &[Row]) -> std::io::Result<()> {
    writeln!(
        out,
        "{:<19} {:>6} {:>10} {:>10} {:>9} {:>9} {:>9} {:>9} {:>9} {:>8} {:>8} {:>8}",
        "case",
        "ranks",
        "state MB",
        "moved MB",
        "(a) s",
        "pred. s",
        "(b) s",
        "(c) s",
        "floor s",
        "(b)/(a)",
        "(c)/(a)",
        "(a)/fl."
    )?;
    for r in rows {
        let over = r.nereus_over_floor.map_or_else(|| "-".into(), |x| format!("{x:.2}"));
        writeln!(
            out,
            "{:<19} {:>6} {:>10.1} {:>10.1} {:>9.3} {:>9.3} {:>9.3} {:>9.3} {:>9.3} {:>8.1} {:>8.1} {:>8}",
            r.case,
            format!("{}→{}", r.from_ranks, r.to_ranks),
            r.state_bytes as f64 / 1e6,
            r.bytes_moved as f64 / 1e6,
            r.nereus_s,
            r.predicted_s,
            r.ucp_s,
            r.tenplex_s,
            r.floor_s,
            r.ucp_over_nereus,
            r.tenplex_over_nereus,
            over
        )?;
    }
    let (n, t, u) = PAPER_TABLE_4;
    writeln!(
        out,
        "{:<19} {:>6} {:>10} {:>10} {:>9.2} {:>9} {:>9.2} {:>9.2} {:>9} {:>8.1} {:>8.1} {:>8}",
        "paper Table 4",
        "16→32",
        "-",
        "-",
        n,
        "-",
        u,
        t,
        "-",
        u / n,
        t / n,
        "-"
    )?;
    writeln!(out, "(a) Nereus DAG, (b) checkpoint/restart as UCP (mpirun start-up included), (c) per tensor as Tenplex")
}

/// Bytes per case sent and copied locally by the DAG and by the per-tensor baseline.
fn print_bytes(out: &mut impl Write, rows: &[Row]) -> std::io::Result<()> {
    // On one CPU node a byte copied inside a rank costs about what a byte sent costs (both are
    // memory copies); on a GPU cluster a local copy runs at HBM speed, a send at the link's.
    writeln!(
        out,
        "{:<19} {:>10} {:>10} {:>10} {:>10}",
        "bytes copied, MB", "(a) sent", "(a) local", "(c) sent", "(c) local"
    )?;
    for r in rows {
        let mb = |b: u64| b as f64 / 1e6;
        writeln!(
            out,
            "{:<19} {:>10.1} {:>10.1} {:>10.1} {:>10.1}",
            r.case,
            mb(r.bytes_moved),
            mb(r.bytes_local),
            mb(r.tenplex_bytes),
            mb(r.tenplex_bytes_local)
        )?;
    }
    Ok(())
}
