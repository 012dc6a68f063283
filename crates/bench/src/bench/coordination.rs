//! `nereus bench coordination`: the paper's three overlap types, executed on the job's ranks
//! (8 in the issue) with random rank placements and random start delays, for Nereus's global
//! DAG and for the per-component baseline, both on live EMUs.
//!
//! Overlap types, each a transition of a tiny model whose units share ranks:
//! - `same-model-across-stages`: actor/generation and actor/training on overlapping ranks both
//!   move;
//! - `different-models-same-stage`: reward inference shrinks and reference inference grows onto
//!   the ranks it frees;
//! - `different-models-across-stages`: reward inference shrinks while critic training grows onto
//!   the same ranks.
//!
//! Memory is the shared resource. Its capacity is chosen independently of either scheduler: the
//! state of the fullest rank under the plan before or after (whichever is larger), times 1.00,
//! 1.05, 1.10, 1.25, 1.5, 2, 3 and 4 (a Split holds its source, its parts and pack buffers at
//! once, so a transition that splits on a full rank needs several times its state, whoever
//! schedules it). Every rank gets
//! that capacity, and the EMUs' memory ledgers enforce it.
//!
//! - **Nereus** plans its global DAG at that capacity. A DAG it cannot schedule is *blocked*
//!   and is not run. Otherwise every rank sleeps a random delay and executes the DAG. A trial
//!   completes when every model-stage reaches its target with every digest unchanged.
//! - **The baseline** runs each model-stage's transition in its own order, as a DynaRL-style
//!   system does (its local DAG, no cross-model resource edges). The model-stages start after
//!   random delays of their own, and the primitives run in the order those delays interleave
//!   them. Every primitive asks every rank for room before it moves a byte
//!   ([`Agreement::World`]). An overrun is therefore an out-of-memory refusal on every rank at
//!   once, which ends the trial cleanly. A corrupted rank or a hang never happens. A stall, a
//!   primitive waiting for memory another holds, would need an executor that waits. This one
//!   refuses, so the report counts stalls as 0 and says why. The watchdog stays armed and would
//!   abort the run if a collective hung.

use serde::Serialize;
use std::collections::BTreeMap;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::selftest::{changed_digests, materialize, missed_targets, state_bytes};
use nereus_core::model::{Catalogue, Layout};
use nereus_core::plan::{Candidate, ModelStage, Placement, Plan, Recompute, Role, Stage};
use nereus_core::rng::Rng;
use nereus_core::transition::global::{check, Links};
use nereus_core::transition::testing::{fullest_rank, tiny_catalogue};
use nereus_core::transition::{Coordination, TransitionDag};
use nereus_exec::comm::{DataPlane, MpiPlane};
use nereus_exec::emu::dag::{agree_on_dag, execute, execute_in_order, Agreement, DagError};
use nereus_exec::emu::{Digest, EmuError};
use nereus_runtime::{RuntimeError, Session};

use super::{machine, BenchReport, Floor};

/// One overlap type at one capacity.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Row {
    /// The overlap type.
    pub overlap: String,
    /// Capacity over the fullest rank's state before or after.
    pub capacity_factor: f64,
    /// Trials run.
    pub trials: u32,
    /// Trials whose global DAG could not be scheduled at this capacity (not run).
    pub nereus_blocked: u32,
    /// Trials Nereus ran and completed (every target, every digest unchanged).
    pub nereus_completed: u32,
    /// Trials Nereus ran and did not complete.
    pub nereus_failed: u32,
    /// Trials the baseline completed.
    pub baseline_completed: u32,
    /// Trials the baseline ended with an out-of-memory refusal.
    pub baseline_refused: u32,
    /// Trials the baseline ran to the end with a target missed or a digest changed.
    pub baseline_failed: u32,
    /// Trials cut by the watchdog (none can be: see the module's doc).
    pub stalled: u32,
    /// Resource edges Nereus added, over the trials it ran.
    pub resource_edges: u64,
    /// The first baseline refusal seen (an example).
    pub baseline_example: Option<String>,
    /// Why the global DAG was blocked, the first time it was (an example).
    pub blocked_example: Option<String>,
}

/// Capacities tried, over the fullest rank's state before or after the transition.
const CAPACITY_FACTORS: [f64; 8] = [1.0, 1.05, 1.10, 1.25, 1.5, 2.0, 3.0, 4.0];

const OVERLAPS: [&str; 3] =
    ["same-model-across-stages", "different-models-same-stage", "different-models-across-stages"];

fn placement(role: Role, stage: Stage, layout: Layout, ranks: Vec<i32>) -> Placement {
    let dp = ranks.len() as u32 / layout.size();
    Placement {
        candidate: Candidate {
            model_stage: ModelStage::new(role, stage),
            layout,
            dp,
            recompute: Recompute::None,
            micro_batch: 1,
        },
        ranks,
    }
}

/// A plan pair of overlap type `kind` on `world` ranks (placed by a random permutation).
fn scenario(kind: usize, rng: &mut Rng, world: i32) -> (Plan, Plan) {
    let mut perm: Vec<i32> = (0..world).collect();
    rng.shuffle(&mut perm);
    let at = |range: std::ops::Range<usize>| -> Vec<i32> { perm[range].to_vec() };
    let l = |tp, pp| Layout::new(tp, pp);
    match kind {
        0 => {
            // Actor generation (2,1) x2 on r0-3 and training (4,1) on r0-3 → generation (4,1)
            // on r4-7, training (2,2) on r2-5.
            let from = Plan {
                placements: vec![
                    placement(Role::Actor, Stage::Generation, l(2, 1), at(0..4)),
                    placement(Role::Actor, Stage::Training, l(4, 1), at(0..4)),
                ],
            };
            let to = Plan {
                placements: vec![
                    placement(Role::Actor, Stage::Generation, l(4, 1), at(4..8)),
                    placement(Role::Actor, Stage::Training, l(2, 2), at(2..6)),
                ],
            };
            (from, to)
        }
        1 => {
            // Reward (2,2) on r0-3 shrinks to (2,1) on r0-1; reference (1,1) x2 on r4-5 adds
            // replicas on r2-3, which reward still holds: a whole model there fits only once
            // reward's stage 1 has left.
            let from = Plan {
                placements: vec![
                    placement(Role::Reward, Stage::Inference, l(2, 2), at(0..4)),
                    placement(Role::Reference, Stage::Inference, l(1, 1), at(4..6)),
                ],
            };
            let to = Plan {
                placements: vec![
                    placement(Role::Reward, Stage::Inference, l(2, 1), at(0..2)),
                    placement(Role::Reference, Stage::Inference, l(1, 1), [at(4..6), at(2..4)].concat()),
                ],
            };
            (from, to)
        }
        _ => {
            // Reward inference (1,1) x4 on r0-3 shrinks to x2 on r0-1; critic training (1,1)
            // on r4 adds replicas on r2-3: each of those ranks fits one of the two.
            let from = Plan {
                placements: vec![
                    placement(Role::Reward, Stage::Inference, l(1, 1), at(0..4)),
                    placement(Role::Critic, Stage::Training, l(1, 1), at(4..5)),
                ],
            };
            let to = Plan {
                placements: vec![
                    placement(Role::Reward, Stage::Inference, l(1, 1), at(0..2)),
                    placement(Role::Critic, Stage::Training, l(1, 1), [at(4..5), at(2..4)].concat()),
                ],
            };
            (from, to)
        }
    }
}

/// The three overlap types at eight memory capacities, Nereus and the per-component baseline executed
/// (8 ranks).
#[derive(Debug, Clone)]
pub struct Options {
    /// Trials per overlap type and capacity.
    pub trials: u32,
    /// Seed of the random placements and delays.
    pub seed: u64,
    /// Also write the report as JSON.
    pub json: Option<PathBuf>,
}

/// Runs the benchmark on every rank with `args`.
pub fn run(session: &mut Session, args: &Options) -> Result<(), RuntimeError> {
    benchmark(session, args.trials, args.seed, args.json.as_deref())
}

/// Runs `trials` trials of each overlap type at each capacity on every rank.
fn benchmark(session: &Session, trials: u32, seed: u64, json: Option<&Path>) -> Result<(), RuntimeError> {
    let world = session.world().size();
    if world < 8 {
        return Err(RuntimeError::Usage("bench coordination needs 8 MPI ranks (mpirun -n 8 …)".into()));
    }
    let mut plane = session.control_plane();
    let mut rows = Vec::new();
    for (kind, name) in OVERLAPS.iter().enumerate() {
        for factor in CAPACITY_FACTORS {
            let mut row = Row { overlap: name.to_string(), capacity_factor: factor, trials, ..Row::default() };
            for trial in 0..trials {
                let mut rng = Rng::new(seed ^ ((kind as u64) << 40) ^ u64::from(trial));
                trial_pair(session, &mut plane, kind, factor, &mut rng, &mut row)?;
            }
            rows.push(row);
        }
    }
    if session.rank() != 0 {
        return Ok(());
    }
    print(&rows)?;
    let floors = rows
        .iter()
        .filter(|r| r.nereus_blocked < r.trials)
        .map(|r| {
            let ran = r.trials - r.nereus_blocked;
            Floor::at_least(
                &format!("nereus_completed_{}_at_{:.2}", r.overlap, r.capacity_factor),
                100.0 * f64::from(r.nereus_completed) / f64::from(ran),
                100.0,
                "%",
            )
        })
        .collect();
    BenchReport { bench: "coordination".into(), machine: machine(session), rows, floors }.finish(json)
}

/// One trial of overlap type `kind` at `factor` times the fullest rank: Nereus's global DAG,
/// then the baseline's per-component orders, each executed on fresh EMUs.
fn trial_pair(
    session: &Session,
    plane: &mut MpiPlane<'_>,
    kind: usize,
    factor: f64,
    rng: &mut Rng,
    row: &mut Row,
) -> Result<(), RuntimeError> {
    let catalogue = tiny_catalogue();
    let bytes = state_bytes(&catalogue);
    let (from, to) = scenario(kind, rng, session.world().size());
    let fullest = fullest_rank(&from, &bytes).max(fullest_rank(&to, &bytes));
    let capacity = (fullest as f64 * factor).ceil() as u64;
    let links = Links {
        devices_per_node: 4,
        intra_bytes_per_s: 5e9,
        inter_bytes_per_s: 1e9,
        memory_bytes_per_s: 10e9,
        setup_seconds: 1e-3,
        capacity_bytes: capacity,
        host_bytes_per_s: None,
        cores_per_node: None,
    };
    let delays: BTreeMap<ModelStage, f64> =
        from.placements.iter().map(|p| (p.candidate.model_stage, rng.below(1000) as f64 * 1e-4)).collect();
    match TransitionDag::plan(&from, &to, &bytes, &links, Coordination::Global) {
        Err(e) => {
            row.nereus_blocked += 1;
            row.blocked_example.get_or_insert(e.to_string());
        }
        Ok(dag) => {
            row.resource_edges += dag.resource_edges as u64;
            let ok = run_nereus(session, plane, &catalogue, &from, &to, &dag, capacity, rng)?;
            if ok {
                row.nereus_completed += 1;
            } else {
                row.nereus_failed += 1;
            }
        }
    }
    // The per-component DAG (no resource edges, no memory check at planning) in the order the
    // model-stages' own delays interleave it.
    let unchecked = Links { capacity_bytes: u64::MAX / 4, ..links };
    let alone = TransitionDag::plan(&from, &to, &bytes, &unchecked, Coordination::PerModelStage).map_err(|e| {
        RuntimeError::Usage(format!("the per-component baseline cannot plan {name}: {e}", name = OVERLAPS[kind]))
    })?;
    let order = check::delayed_order(&alone, &|ms| delays[&ms]);
    match run_baseline(session, plane, &catalogue, &from, &to, &alone, &order, capacity)? {
        Baseline::Completed => row.baseline_completed += 1,
        Baseline::Failed => row.baseline_failed += 1,
        Baseline::Refused(what) => {
            row.baseline_refused += 1;
            row.baseline_example.get_or_insert(what);
        }
    }
    Ok(())
}

/// How a baseline trial ended.
enum Baseline {
    Completed,
    /// Ran to the end with a target missed or a digest changed.
    Failed,
    /// A primitive found no room (what it said).
    Refused(String),
}

/// Creates `from`'s EMUs at `capacity` and runs the baseline DAG in `order`, every primitive's
/// room agreed by every rank.
#[allow(clippy::too_many_arguments)]
fn run_baseline(
    session: &Session,
    plane: &mut MpiPlane<'_>,
    catalogue: &Catalogue,
    from: &Plan,
    to: &Plan,
    dag: &TransitionDag,
    order: &[usize],
    capacity: u64,
) -> Result<Baseline, RuntimeError> {
    let world = session.world().size();
    let (mut set, before) = materialize(plane, world, catalogue, from, capacity)?;
    match execute_in_order(&mut set, plane, dag, order, Agreement::World) {
        Ok(_) => {}
        Err(DagError::Emu(e @ EmuError::NoRoom { .. })) => return Ok(Baseline::Refused(e.to_string())),
        Err(e) => return Err(e.into()),
    }
    Ok(if completed(plane, &set, to, &before, world)? { Baseline::Completed } else { Baseline::Failed })
}

fn print(rows: &[Row]) -> Result<(), RuntimeError> {
    let mut out = std::io::stdout().lock();
    let line = |out: &mut dyn Write, text: String| writeln!(out, "{text}").map_err(RuntimeError::Stdout);
    line(
        &mut out,
        format!(
            "{:<32} {:>5} {:>6} {:>8} {:>10} {:>10} {:>9} {:>8} {:>9}",
            "overlap", "cap", "trials", "blocked", "nereus ok", "base ok", "base oom", "stalled", "res.edges"
        ),
    )?;
    for r in rows {
        line(
            &mut out,
            format!(
                "{:<32} {:>5.2} {:>6} {:>8} {:>10} {:>10} {:>9} {:>8} {:>9}",
                r.overlap,
                r.capacity_factor,
                r.trials,
                r.nereus_blocked,
                r.nereus_completed,
                r.baseline_completed,
                r.baseline_refused,
                r.stalled,
                r.resource_edges
            ),
        )?;
        if let Some(e) = &r.blocked_example {
            line(&mut out, format!("    global DAG blocked, e.g.: {e}"))?;
        }
        if let Some(e) = &r.baseline_example {
            line(&mut out, format!("    baseline refused, e.g.: {e}"))?;
        }
    }
    Ok(())
}

/// Creates `from`'s EMUs, sleeps a random per-rank delay, executes `dag`, and checks on every
/// rank that the targets are reached with unchanged digests.
#[allow(clippy::too_many_arguments)]
fn run_nereus(
    session: &Session,
    plane: &mut MpiPlane<'_>,
    catalogue: &Catalogue,
    from: &Plan,
    to: &Plan,
    dag: &TransitionDag,
    capacity: u64,
    rng: &mut Rng,
) -> Result<bool, RuntimeError> {
    agree_on_dag(session.world(), session.watchdog(), dag)?;
    let world = session.world().size();
    let (mut set, before) = materialize(plane, world, catalogue, from, capacity)?;
    let mut own = Rng::new(rng.next_u64() ^ plane.rank() as u64);
    std::thread::sleep(Duration::from_micros(own.below(3000) as u64));
    execute(&mut set, plane, dag)?;
    completed(plane, &set, to, &before, world)
}

/// Whether every rank holds `to`'s targets with the digests of `before` (one all-reduce).
fn completed(
    plane: &mut MpiPlane<'_>,
    set: &nereus_exec::emu::EmuSet,
    to: &Plan,
    before: &BTreeMap<ModelStage, Digest>,
    world: i32,
) -> Result<bool, RuntimeError> {
    let ok = missed_targets(set, to).is_empty() && changed_digests(plane, set, before)?.is_empty();
    let mut bad = [u64::from(!ok)];
    let all = plane.group(&(0..world).collect::<Vec<_>>())?;
    plane.all_reduce_sum_u64(all, &mut bad)?;
    Ok(bad[0] == 0)
}
