//! `nereus selftest primitives`: random EMU primitive sequences on the job's ranks, checking
//! after every step that nothing was lost or changed.
//!
//! Every rank draws the same decisions from one seed. Per case: a random tiny architecture, a
//! random layout with `tp, pp ∈ {1, 2, 3, 4, 8}` where they divide, random rank placement, then
//! random Split / Merge / Extend / Destroy steps and out-of-memory drills. Checks: every
//! replica's digest equals the original after every step; a replica gathered on rank 0 equals,
//! byte for byte, the state generated there from the seed; Destroy refuses the last replica;
//! an Extend or Split onto a rank without room is refused before any byte moves and leaves the
//! state intact; every rank's ledger charges exactly the shards it holds.
//!
//! With `--device`, the same cases run with device-resident shards over the GPU data plane
//! (every moved byte checked by the same digests and the byte-exact gather against the host
//! reference), plus device collectives (all-gather, broadcast, all-reduce) on disjoint
//! communicators made by split or by unique id.

use std::collections::BTreeMap;

use serde::Serialize;

use nereus_core::config::Dtype;
use nereus_core::model::{Architecture, Catalogue, Layout, OutputHead, Position};
use nereus_core::plan::{ModelStage, Role, Stage};
use nereus_exec::comm::DataPlane;
use nereus_exec::emu::{
    synthetic_fill, Counters, DeviceMemory, Digest, EmuError, EmuId, EmuSet, Exchange, HostMemory, LocalShard,
    PrimitiveOptions, ShardMemory,
};

use nereus_core::config::DeviceChoice;
use nereus_core::rng::Rng;
use nereus_runtime::device::{open_device, Plane};
use nereus_runtime::{RuntimeError, Session};

/// Tensor-parallel and pipeline degrees drawn from.
const DEGREES: [u32; 5] = [1, 2, 3, 4, 8];

/// What a selftest run did.
#[derive(Debug, Default, Serialize)]
pub struct SelftestSummary {
    /// Cases run.
    pub cases: u32,
    /// Primitives executed, by kind.
    pub executed: BTreeMap<String, u64>,
    /// Refusals checked (last-replica Destroy, out-of-memory Extend/Split).
    pub refusals: BTreeMap<String, u64>,
    /// Full-state byte comparisons on rank 0.
    pub gathers: u64,
    /// Data-plane checks on disjoint groups (all-reduce, all-gather, broadcast).
    pub group_checks: u64,
    /// Bytes sent over the data plane.
    pub bytes_sent: u64,
    /// The device and collective library with `--device` (absent for host memory over MPI).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub device: Option<String>,
    /// Failed checks (empty on success).
    pub failures: Vec<String>,
}

fn random_arch(rng: &mut Rng) -> Architecture {
    let kv_heads = *rng.pick(&[1u64, 2, 3, 4, 8, 24]);
    let heads = kv_heads * *rng.pick(&[1u64, 2, 3]);
    let head_dim = *rng.pick(&[2u64, 4]);
    let hidden = *rng.pick(&[8u64, 12, 16]);
    Architecture {
        vocab: 24 * (1 + rng.below(3) as u64),
        hidden,
        layers: 1 + rng.below(8) as u64,
        heads,
        kv_heads,
        head_dim,
        ffn: 24 * (1 + rng.below(2) as u64),
        tie_embeddings: rng.below(4) == 0,
        qk_norm: rng.below(2) == 0,
        head: if rng.below(2) == 0 { OutputHead::Lm } else { OutputHead::Value },
        dtype: *rng.pick(&[Dtype::F32, Dtype::Bf16]),
    }
}

/// Layouts of at most `max_ranks` ranks that `catalogue` accepts.
fn valid_layouts(catalogue: &Catalogue, max_ranks: u32) -> Vec<Layout> {
    let mut out = Vec::new();
    for tp in DEGREES {
        for pp in DEGREES {
            let l = Layout::new(tp, pp);
            if l.size() <= max_ranks && catalogue.check_layout(l).is_ok() {
                out.push(l);
            }
        }
    }
    out
}

/// Runs `cases` random cases on every rank of the session, with shards in host memory over
/// MPI, or on the device `device` names.
pub fn primitives(
    session: &Session,
    cases: u32,
    seed: u64,
    device: Option<DeviceChoice>,
) -> Result<SelftestSummary, RuntimeError> {
    let world = session.world().size();
    match device {
        None => run_cases(&mut session.control_plane(), &HostMemory, world, cases, seed),
        Some(choice) => {
            let (mut plane, memory) = open_device(session, choice)?;
            DeviceCases { world, cases, seed }.run(&mut plane, memory)
        }
    }
}

/// The cases on device-resident shards, then the device collectives.
struct DeviceCases {
    world: i32,
    cases: u32,
    seed: u64,
}

impl DeviceCases {
    /// Runs on this rank's device plane, with shards in `memory`.
    fn run(self, plane: &mut Plane<'_>, memory: DeviceMemory) -> Result<SelftestSummary, RuntimeError> {
        let mut summary = run_cases(plane, &memory, self.world, self.cases, self.seed)?;
        super::device_groups::check(plane, &memory, self.world, &mut summary.failures)?;
        summary.group_checks += 1;
        let version = plane.lib().version().unwrap_or_default();
        summary.device = Some(format!("{}, {} {version}", memory.describe(), plane.lib().name()));
        Ok(summary)
    }
}

fn run_cases<M: ShardMemory + Clone, P: Exchange<M>>(
    plane: &mut P,
    memory: &M,
    world: i32,
    cases: u32,
    seed: u64,
) -> Result<SelftestSummary, RuntimeError> {
    let mut summary = SelftestSummary { cases, ..SelftestSummary::default() };
    check_disjoint_groups(plane, world, &mut summary)?;
    for case in 0..cases {
        let mut rng = Rng::new(seed.wrapping_mul(1_000_003).wrapping_add(u64::from(case)));
        run_case(plane, memory, world, &mut rng, case, &mut summary)?;
    }
    Ok(summary)
}

/// Two disjoint groups (the lower and upper half of the world, each created by its members
/// only) run collectives at the same time; every result depends on every member.
fn check_disjoint_groups<P: DataPlane>(
    plane: &mut P,
    world: i32,
    summary: &mut SelftestSummary,
) -> Result<(), RuntimeError> {
    let me = plane.rank();
    let half = (world / 2).max(1);
    let members: Vec<i32> = if me < half { (0..half).collect() } else { (half..world).collect() };
    let group = plane.group(&members)?;
    let again = plane.group(&members)?;
    let mut sum = [u64::try_from(me).unwrap_or(0) + 1];
    plane.all_reduce_sum_u64(group, &mut sum)?;
    let mut gathered = vec![0u8; members.len()];
    plane.all_gather(group, &[me as u8], &mut gathered)?;
    let mut root_value = [if me == members[0] { 100 + me as u8 } else { 0 }];
    plane.broadcast(group, 0, &mut root_value)?;
    let expected_sum: u64 = members.iter().map(|&r| r as u64 + 1).sum();
    let expected_gather: Vec<u8> = members.iter().map(|&r| r as u8).collect();
    let ok = group == again
        && sum[0] == expected_sum
        && gathered == expected_gather
        && root_value[0] == 100 + members[0] as u8;
    let mut failures = [u64::from(!ok)];
    let all = plane.group(&(0..world).collect::<Vec<_>>())?;
    plane.all_reduce_sum_u64(all, &mut failures)?;
    if failures[0] > 0 {
        summary.failures.push(format!("disjoint-group collectives gave wrong results on {} rank(s)", failures[0]));
    }
    summary.group_checks += 1;
    Ok(())
}

fn run_case<M: ShardMemory + Clone, P: Exchange<M>>(
    plane: &mut P,
    memory: &M,
    world: i32,
    rng: &mut Rng,
    case: u32,
    summary: &mut SelftestSummary,
) -> Result<(), RuntimeError> {
    let arch = random_arch(rng);
    let catalogue = Catalogue::new(arch);
    let stage = ModelStage::new(Role::Actor, *rng.pick(&[Stage::Generation, Stage::Training]));
    let layouts = valid_layouts(&catalogue, world as u32);
    let layout = *rng.pick(&layouts);
    let mut ranks: Vec<i32> = (0..world).collect();
    rng.shuffle(&mut ranks);
    let counters = Counters {
        updates: rng.next_u64() % 100,
        model_version: 3,
        policy_version: 2,
        data_position: rng.next_u64() % 1000,
        seed: rng.next_u64(),
    };
    let catalogues = BTreeMap::from([(Role::Actor, catalogue.clone())]);
    let mut set = EmuSet::in_memory(plane.rank(), world, u64::MAX / 4, catalogues, memory.clone());
    let first = set.create_synthetic(plane, stage, layout, &ranks[..layout.size() as usize], counters)?;
    let original = set.digests(plane)?[&first];
    let mut check = Checker { case, original, summary };
    check.state(plane, &set, &catalogue, counters.seed, rng, "create")?;
    for _ in 0..8 {
        let label = step_once(plane, &mut set, &catalogue, world, rng, check.summary)?;
        check.state(plane, &set, &catalogue, counters.seed, rng, &label)?;
    }
    Ok(())
}

struct Checker<'s> {
    case: u32,
    original: Digest,
    summary: &'s mut SelftestSummary,
}

impl Checker<'_> {
    /// Digests of every replica, one gathered replica against the seed, and ledger accounting.
    fn state<M: ShardMemory, P: Exchange<M>>(
        &mut self,
        plane: &mut P,
        set: &EmuSet<M>,
        catalogue: &Catalogue,
        seed: u64,
        rng: &mut Rng,
        after: &str,
    ) -> Result<(), RuntimeError> {
        for (id, digest) in set.digests(plane)? {
            if digest != self.original {
                self.fail(format!(
                    "case {}: after {after}: {id} digest {digest} != original {}",
                    self.case, self.original
                ));
            }
        }
        let ids: Vec<EmuId> = set.emus().map(|e| e.id).collect();
        let id = *rng.pick(&ids);
        let gathered = set.gather(plane, id, 0)?;
        let mut wrong = 0u64;
        if let Some(full) = gathered {
            let mut reference = LocalShard::zeroed(
                EmuId(0),
                Position { tp: 0, pp: 0 },
                full.table.clone(),
                full.sections.clone(),
                full.dtype,
            );
            synthetic_fill(&mut reference, catalogue, seed);
            wrong = u64::from(reference.buffer != full.buffer);
            self.summary.gathers += 1;
        }
        let held: u64 = set.store().shards().map(LocalShard::bytes).sum();
        wrong += u64::from(held != set.store().ledger().used());
        let mut flags = [wrong];
        let group = plane.group(&(0..set.world_size()).collect::<Vec<_>>())?;
        plane.all_reduce_sum_u64(group, &mut flags)?;
        if flags[0] > 0 {
            self.fail(format!("case {}: after {after}: gathered bytes of {id} differ from the seed's state, or a ledger disagrees with its shards", self.case));
        }
        Ok(())
    }

    fn fail(&mut self, message: String) {
        log::error!("{message}");
        self.summary.failures.push(message);
    }
}

/// One random primitive (or refusal drill); returns a label for messages.
fn step_once<M: ShardMemory, P: Exchange<M>>(
    plane: &mut P,
    set: &mut EmuSet<M>,
    catalogue: &Catalogue,
    world: i32,
    rng: &mut Rng,
    summary: &mut SelftestSummary,
) -> Result<String, RuntimeError> {
    let emus: Vec<_> = set.emus().cloned().collect();
    let used: Vec<i32> = emus.iter().flat_map(|e| e.ranks.iter().copied()).collect();
    let mut free: Vec<i32> = (0..world).filter(|r| !used.contains(r)).collect();
    rng.shuffle(&mut free);
    let emu = rng.pick(&emus).clone();
    let record = |summary: &mut SelftestSummary, kind: &str, bytes: u64| {
        *summary.executed.entry(kind.to_string()).or_default() += 1;
        summary.bytes_sent += bytes;
    };
    match rng.below(5) {
        0 | 1 if free.len() >= emu.ranks.len() => {
            let target = &free[..emu.ranks.len()];
            if rng.below(4) == 0 {
                return oom_drill(plane, set, target, summary, |set, plane| {
                    set.extend(plane, emu.id, target, PrimitiveOptions::default()).map(|_| ())
                });
            }
            let report = set.extend(plane, emu.id, target, PrimitiveOptions::default())?;
            record(summary, "extend", report.bytes_sent);
            Ok(report.primitive)
        }
        2 => {
            let subs: Vec<Layout> = valid_layouts(catalogue, world as u32)
                .into_iter()
                .filter(|s| {
                    *s != emu.layout && emu.layout.tp.is_multiple_of(s.tp) && emu.layout.pp.is_multiple_of(s.pp)
                })
                .collect();
            let Some(&sub) = subs.get(rng.below(subs.len().max(1))) else { return destroy(set, &emu, summary) };
            if rng.below(4) == 0 {
                let ranks = emu.ranks.clone();
                return oom_drill(plane, set, &ranks, summary, |set, plane| {
                    set.split(plane, emu.id, sub, PrimitiveOptions::default()).map(|_| ())
                });
            }
            let report = set.split(plane, emu.id, sub, PrimitiveOptions::default())?;
            record(summary, "split", report.bytes_sent);
            Ok(report.primitive)
        }
        3 => {
            let same: Vec<_> = emus.iter().filter(|e| e.layout == emu.layout).collect();
            let mut options = Vec::new();
            for a in DEGREES {
                for b in DEGREES {
                    let target = Layout::new(emu.layout.tp * a, emu.layout.pp * b);
                    let k = (a * b) as usize;
                    if k >= 2 && k <= same.len() && catalogue.check_layout(target).is_ok() {
                        options.push((target, k));
                    }
                }
            }
            if options.is_empty() {
                return destroy(set, &emu, summary);
            }
            let (target, k) = *rng.pick(&options);
            let ids: Vec<EmuId> = same[..k].iter().map(|e| e.id).collect();
            let report = set.merge(plane, &ids, target, PrimitiveOptions::default())?;
            record(summary, "merge", report.bytes_sent);
            Ok(report.primitive)
        }
        _ => destroy(set, &emu, summary),
    }
}

fn destroy<M: ShardMemory>(
    set: &mut EmuSet<M>,
    emu: &nereus_exec::emu::Emu,
    summary: &mut SelftestSummary,
) -> Result<String, RuntimeError> {
    let last = set.replicas(emu.model_stage).len() == 1;
    match set.destroy(emu.id) {
        Ok(report) if !last => {
            *summary.executed.entry("destroy".into()).or_default() += 1;
            Ok(report.primitive)
        }
        Err(EmuError::LastReplica { .. }) if last => {
            *summary.refusals.entry("destroy-last-replica".into()).or_default() += 1;
            Ok(format!("refused Destroy {} (last replica)", emu.id))
        }
        other => {
            summary.failures.push(format!("Destroy {} with last={last} gave {:?}", emu.id, other.map(|r| r.primitive)));
            Ok("destroy".into())
        }
    }
}

/// Shrinks one target rank's capacity to what it holds, runs `op`, expects `NoRoom` with every
/// EMU unchanged, then restores the capacity.
fn oom_drill<M: ShardMemory, P: Exchange<M>>(
    plane: &mut P,
    set: &mut EmuSet<M>,
    targets: &[i32],
    summary: &mut SelftestSummary,
    op: impl FnOnce(&mut EmuSet<M>, &mut P) -> Result<(), EmuError>,
) -> Result<String, RuntimeError> {
    let victim = targets[0];
    let before: Vec<_> = set.emus().cloned().collect();
    let capacity = set.store().ledger().capacity();
    if plane.rank() == victim {
        let used = set.store().ledger().used();
        set.store_mut().ledger_mut().set_capacity(used);
    }
    let outcome = op(set, plane);
    set.store_mut().ledger_mut().set_capacity(capacity);
    let after: Vec<_> = set.emus().cloned().collect();
    match outcome {
        Err(EmuError::NoRoom { ranks, .. }) if ranks == victim.to_string() && before == after => {
            *summary.refusals.entry("no-room".into()).or_default() += 1;
        }
        other => summary
            .failures
            .push(format!("out-of-memory drill on rank {victim}: expected a refusal naming it, got {other:?}")),
    }
    Ok(format!("refused primitive (no room on rank {victim})"))
}
