//! `nereus bench transition-planning`: building, scheduling and costing the global transition
//! DAG for synthetic jobs of 32 to 16,384 ranks, and the schedule's critical-path gap to the
//! best order on instances small enough for an exhaustive search.
//!
//! Large instances: Llama-3.1-8B PPO on the H200 cluster, re-planned from 1K- to 8K-token
//! responses (the planner's own plans, so every model-stage changes layout). Small instances:
//! random plan pairs of a tiny model on 4–8 ranks whose DAG has at most 8 primitives.

use serde::Serialize;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::Instant;

use nereus_core::config::{JobConfig, Overrides};
use nereus_core::cost::Hardware;
use nereus_core::model::{Layout, Position};
use nereus_core::plan::{ModelStage, Plan};
use nereus_core::transition::global::check;
use nereus_core::transition::testing::{base_planner, replanned_pair, whole_memory_links, Sizer, SMALL_LINKS};
use nereus_core::transition::{Coordination, TransitionDag};

use super::{machine, BenchReport, Floor};
use nereus_runtime::{RuntimeError, Session};

/// One measurement.
#[derive(Debug, Clone, Serialize)]
pub struct Row {
    /// `large` (planner plans) or `small` (exhaustive comparison).
    pub kind: String,
    /// Ranks in the pool.
    pub ranks: u32,
    /// Primitives in the DAG.
    pub nodes: usize,
    /// Resource edges added.
    pub resource_edges: usize,
    /// Median time to build, schedule and cost the DAG, seconds.
    pub build_seconds: f64,
    /// Predicted `L_tran` of the schedule, seconds.
    pub l_tran_s: f64,
    /// Best `L_tran` over every feasible order (small instances), seconds.
    pub optimal_l_tran_s: Option<f64>,
}

/// Global transition DAG build time from 32 to 16,384 ranks, and its gap to the best order.
#[derive(Debug, Clone)]
pub struct Options {
    /// The job whose plans change (run from the repository root for the default).
    pub config: PathBuf,
    /// Pool sizes (ranks), comma-separated.
    pub ranks: Vec<u32>,
    /// Repetitions per size (the median is reported).
    pub reps: usize,
    /// Also write the report as JSON.
    pub json: Option<PathBuf>,
}

/// Runs the benchmark on every rank with `args`.
pub fn run(session: &mut Session, args: &Options) -> Result<(), RuntimeError> {
    benchmark(session, &args.config, &args.ranks, args.reps, args.json.as_deref())
}

/// Runs the benchmark on rank 0.
fn benchmark(
    session: &mut Session,
    config_path: &Path,
    sizes: &[u32],
    reps: usize,
    json: Option<&Path>,
) -> Result<(), RuntimeError> {
    let config = session.load_config(Some(config_path), &Overrides::default())?;
    if session.rank() != 0 {
        return Ok(());
    }
    let mut rows = large(&config, sizes, reps)?;
    rows.extend(small(200));
    let mut out = std::io::stdout().lock();
    writeln!(
        out,
        "{:<6} {:>7} {:>7} {:>9} {:>11} {:>11} {:>11}",
        "kind", "ranks", "nodes", "res.edges", "build ms", "L_tran s", "optimal s"
    )
    .map_err(RuntimeError::Stdout)?;
    for r in rows.iter().filter(|r| r.kind == "large") {
        writeln!(
            out,
            "{:<6} {:>7} {:>7} {:>9} {:>11.3} {:>11.3} {:>11}",
            r.kind,
            r.ranks,
            r.nodes,
            r.resource_edges,
            r.build_seconds * 1e3,
            r.l_tran_s,
            "-"
        )
        .map_err(RuntimeError::Stdout)?;
    }
    let small: Vec<&Row> = rows.iter().filter(|r| r.kind == "small").collect();
    let gaps: Vec<f64> =
        small.iter().filter_map(|r| r.optimal_l_tran_s.filter(|o| *o > 0.0).map(|o| r.l_tran_s / o - 1.0)).collect();
    let worst_gap = gaps.iter().copied().fold(0.0, f64::max);
    let mean_gap = gaps.iter().sum::<f64>() / gaps.len().max(1) as f64;
    writeln!(
        out,
        "small instances: {} compared with the exhaustive best order; critical-path gap mean {:.2}%, worst {:.2}%",
        gaps.len(),
        mean_gap * 100.0,
        worst_gap * 100.0
    )
    .map_err(RuntimeError::Stdout)?;
    drop(out);
    let at = |n: u32| {
        rows.iter().find(|r| r.kind == "large" && r.ranks == n).map_or(f64::INFINITY, |r| r.build_seconds * 1e3)
    };
    let floors = vec![
        Floor::at_most("build_ms_at_1024_ranks", at(1024), 1.0, "ms"),
        Floor::at_most("build_ms_at_16384_ranks", at(16384), 50.0, "ms"),
        Floor::at_most("critical_path_gap_to_optimal_worst", worst_gap * 100.0, 7.0, "%"),
    ];
    BenchReport { bench: "transition-planning".into(), machine: machine(session), rows, floors }.finish(json)
}

fn large(config: &JobConfig, sizes: &[u32], reps: usize) -> Result<Vec<Row>, RuntimeError> {
    let base = base_planner(config)?;
    let sizer = Sizer::of(config);
    let mut rows = Vec::new();
    for &ranks in sizes {
        let (from, to) = replanned_pair(&base, ranks)?;
        let hw = Hardware::new(&config.cluster, ranks, 0.0);
        let links = whole_memory_links(&hw);
        let bytes = |ms: ModelStage, l: Layout, p: Position| sizer.bytes(ms, l, p);
        let mut times = Vec::new();
        let mut last = None;
        for _ in 0..reps.max(1) {
            let start = Instant::now();
            let dag = TransitionDag::plan(&from, &to, &bytes, &links, Coordination::Global);
            times.push(start.elapsed().as_secs_f64());
            last = Some(dag);
        }
        times.sort_by(f64::total_cmp);
        let row = match last.expect("at least one repetition") {
            Ok(dag) => Row {
                kind: "large".into(),
                ranks,
                nodes: dag.graph.node_count(),
                resource_edges: dag.resource_edges,
                build_seconds: times[times.len() / 2],
                l_tran_s: dag.schedule.seconds,
                optimal_l_tran_s: None,
            },
            Err(e) => {
                log::warn!("{ranks} ranks: {e}");
                Row {
                    kind: "large".into(),
                    ranks,
                    nodes: 0,
                    resource_edges: 0,
                    build_seconds: times[times.len() / 2],
                    l_tran_s: f64::NAN,
                    optimal_l_tran_s: None,
                }
            }
        };
        rows.push(row);
    }
    Ok(rows)
}

/// Random small plan pairs whose DAG is small enough to enumerate every order.
fn small(cases: u64) -> Vec<Row> {
    let tiny = nereus_core::transition::testing::tiny_catalogue();
    let sizer = Sizer::tiny();
    let bytes = |ms: ModelStage, l: Layout, p: Position| sizer.bytes(ms, l, p);
    let mut rows = Vec::new();
    for case in 0..cases {
        let mut rng = nereus_core::rng::Rng::new(case);
        let pool = 4 + rng.below(5) as u32;
        let (from, to): (Plan, Plan) = nereus_core::transition::testing::plan_pair(&mut rng, &tiny, pool);
        let links = SMALL_LINKS;
        let start = Instant::now();
        let Ok(dag) = TransitionDag::plan(&from, &to, &bytes, &links, Coordination::Global) else { continue };
        let build = start.elapsed().as_secs_f64();
        if dag.graph.node_count() == 0 || dag.graph.node_count() > 8 {
            continue;
        }
        let optimal = check::optimal_seconds(&dag, &bytes, &links);
        rows.push(Row {
            kind: "small".into(),
            ranks: pool,
            nodes: dag.graph.node_count(),
            resource_edges: dag.resource_edges,
            build_seconds: build,
            l_tran_s: dag.schedule.seconds,
            optimal_l_tran_s: optimal,
        });
    }
    rows
}
