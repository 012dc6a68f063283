//! `nereus bench coordination`: the paper's three overlap types, executed on the job's ranks
//! (8 in the issue) with random rank placements and random start delays, for Nereus's global
//! DAG and for the per-component baseline.
//!
//! Overlap types, each a transition of a tiny model whose units share ranks:
//! - `same-model-across-stages`: actor/generation and actor/training on overlapping ranks both
//!   move;
//! - `different-models-same-stage`: reward inference shrinks and reference inference grows onto
//!   the ranks it frees;
//! - `different-models-across-stages`: reward inference shrinks while critic training grows onto
//!   the same ranks.
//!
//! Memory is the shared resource (model-stages of one stage may share ranks, as the paper's
//! execution-overlap graph allows): each rank gets the smallest capacity at which the global DAG
//! can still schedule the transition (found by bisection), the tightest setting in which
//! coordination succeeds, and the one in which uncoordinated orders overrun it.
//!
//! Nereus: the global DAG is executed for real; every rank first sleeps a random delay. A trial
//! succeeds when every model-stage reaches its target with every digest unchanged (so no rank
//! was ever held twice or overrun: the executor's memory check would have refused) and no
//! collective stalled (the watchdog would have aborted). Baseline: each model-stage runs its
//! local DAG alone, starting after its own random delay; the interleaving is replayed against
//! the same memory rules, and a trial fails at the first conflict (the
//! point where the real job would corrupt a rank it shares or run out of memory).

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
use nereus_core::transition::testing::{tightest_capacity, tiny_catalogue};
use nereus_core::transition::TransitionDag;
use nereus_exec::comm::{DataPlane, MpiPlane};
use nereus_runtime::transition::{agree_on_dag, execute};
use nereus_runtime::{RuntimeError, Session};

use super::{machine, BenchReport, Floor};

/// One overlap type's results.
#[derive(Debug, Clone, Serialize)]
pub struct Row {
    /// The overlap type.
    pub overlap: String,
    /// Trials run.
    pub trials: u32,
    /// Trials in which Nereus reached every target.
    pub nereus_successes: u32,
    /// Trials in which the per-component baseline did.
    pub baseline_successes: u32,
    /// Resource edges Nereus added, over all trials.
    pub resource_edges: u64,
    /// First baseline conflict seen (an example).
    pub baseline_example: Option<String>,
}

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

/// The three overlap types, 100 trials each, Nereus vs the per-component baseline (8 ranks).
#[derive(Debug, Clone, clap::Args)]
pub struct Args {
    /// Trials per overlap type.
    #[arg(long, default_value_t = 100)]
    pub trials: u32,
    /// Seed of the random placements and delays.
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// Also write the report as JSON.
    #[arg(long, value_name = "PATH")]
    pub json: Option<PathBuf>,
}

/// Runs the benchmark on every rank with `args`.
pub fn run(session: &mut Session, args: &Args) -> Result<(), RuntimeError> {
    benchmark(session, args.trials, args.seed, args.json.as_deref())
}

/// Runs `trials` trials of each overlap type on every rank.
fn benchmark(session: &Session, trials: u32, seed: u64, json: Option<&Path>) -> Result<(), RuntimeError> {
    let world = session.world().size();
    if world < 8 {
        return Err(RuntimeError::Usage("bench coordination needs 8 MPI ranks (mpirun -n 8 …)".into()));
    }
    let catalogue = tiny_catalogue();
    let bytes = state_bytes(&catalogue);
    let mut plane = MpiPlane::new(session.world(), session.watchdog().clone());
    let mut rows = Vec::new();
    for (kind, name) in OVERLAPS.iter().enumerate() {
        let mut row = Row {
            overlap: name.to_string(),
            trials,
            nereus_successes: 0,
            baseline_successes: 0,
            resource_edges: 0,
            baseline_example: None,
        };
        for trial in 0..trials {
            let mut rng = Rng::new(seed ^ ((kind as u64) << 40) ^ u64::from(trial));
            let (from, to) = scenario(kind, &mut rng, world);
            let mut links = Links {
                devices_per_node: 4,
                intra_bytes_per_s: 5e9,
                inter_bytes_per_s: 1e9,
                memory_bytes_per_s: 10e9,
                setup_seconds: 1e-3,
                capacity_bytes: u64::MAX / 4,
                host_bytes_per_s: None,
            };
            links.capacity_bytes = tightest_capacity(&from, &to, &bytes, &links);
            let capacity = links.capacity_bytes;
            // Baseline: local DAGs alone, each model-stage delayed at random.
            let delays: BTreeMap<ModelStage, f64> =
                from.placements.iter().map(|p| (p.candidate.model_stage, rng.below(1000) as f64 * 1e-4)).collect();
            if let Ok(alone) = TransitionDag::plan(&from, &to, &bytes, &links, false) {
                match check::first_conflict(&alone, &check::delayed_order(&alone, &|ms| delays[&ms]), &bytes, capacity)
                {
                    None => row.baseline_successes += 1,
                    Some(conflict) => {
                        row.baseline_example.get_or_insert(conflict);
                    }
                }
            }
            // Nereus: the global DAG, executed after a random per-rank start delay.
            let Ok(dag) = TransitionDag::plan(&from, &to, &bytes, &links, true) else { continue };
            row.resource_edges += dag.resource_edges as u64;
            let ok = run_nereus(session, &mut plane, &catalogue, &from, &to, &dag, capacity, &mut rng)?;
            row.nereus_successes += u32::from(ok);
        }
        rows.push(row);
    }
    if session.rank() != 0 {
        return Ok(());
    }
    let mut out = std::io::stdout().lock();
    writeln!(out, "{:<32} {:>7} {:>8} {:>9} {:>10}", "overlap", "trials", "nereus", "baseline", "res.edges")
        .map_err(RuntimeError::Stdout)?;
    for r in &rows {
        writeln!(
            out,
            "{:<32} {:>7} {:>7.0}% {:>8.0}% {:>10}",
            r.overlap,
            r.trials,
            100.0 * f64::from(r.nereus_successes) / f64::from(r.trials),
            100.0 * f64::from(r.baseline_successes) / f64::from(r.trials),
            r.resource_edges
        )
        .map_err(RuntimeError::Stdout)?;
        if let Some(e) = &r.baseline_example {
            writeln!(out, "    baseline conflict, e.g.: {e}").map_err(RuntimeError::Stdout)?;
        }
    }
    drop(out);
    let floors = rows
        .iter()
        .map(|r| {
            Floor::at_least(
                &format!("nereus_success_{}", r.overlap),
                100.0 * f64::from(r.nereus_successes) / f64::from(r.trials),
                100.0,
                "%",
            )
        })
        .collect();
    BenchReport { bench: "coordination".into(), machine: machine(session), rows, floors }.finish(json)
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
    let ok = missed_targets(&set, to).is_empty() && changed_digests(plane, &set, &before)?.is_empty();
    let mut bad = [u64::from(!ok)];
    let all = plane.group(&(0..world).collect::<Vec<_>>())?;
    plane.all_reduce_sum_u64(all, &mut bad)?;
    Ok(bad[0] == 0)
}
