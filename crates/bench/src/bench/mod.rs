//! `nereus bench <what>`: benchmarks that need MPI ranks. Each prints a table and can write the
//! JSON contract of `docs/benchmarks.md`: `{"bench", "machine", "rows", "floors"}`.

pub mod calibration;
pub mod controller;
pub mod coordination;
pub mod engine;
pub mod planner;
pub mod primitives;
pub mod scaling;
pub mod simulate;
#[cfg(feature = "exact")]
pub mod solver;
pub mod transition;

/// `nereus bench solver` without the `exact` feature: it says how to build the solvers in.
#[cfg(not(feature = "exact"))]
pub mod solver {
    use nereus_runtime::{RuntimeError, Session};

    /// `nereus bench solver` (needs the `exact` feature).
    #[derive(Debug, Clone, clap::Args)]
    pub struct Args {
        #[arg(trailing_var_arg = true, allow_hyphen_values = true, hide = true)]
        args: Vec<String>,
    }

    /// Fails with a usage error (exit status 2) that names the build.
    pub fn run(_: &mut Session, _: &Args) -> Result<(), RuntimeError> {
        Err(RuntimeError::Usage(
            "nereus bench solver needs the exact solvers: build with `cargo build --release --features exact` \
             (HiGHS is built from source: cmake and a C++ compiler)"
                .into(),
        ))
    }
}

use serde::Serialize;
use std::io::Write;
use std::path::Path;

use nereus_runtime::{RuntimeError, Session};

/// `nereus bench <what>`: measure the runtime's machinery (run under mpirun/srun).
#[derive(Debug, Clone, clap::Subcommand)]
pub enum BenchCommand {
    /// Plan selection on 8–64 GPUs and transition scheduling on DAGs of up to 64 primitives
    /// against exact MILPs solved by HiGHS (build with --features exact): gap and time ratio.
    Solver(solver::Args),
    /// The simulator: a 1,000-step length-growth trace, four policies, at 1,024 and 16,384 GPUs.
    Simulate(simulate::Args),
    /// Forward, backward, training-step and decode throughput of the CPU engine on one rank,
    /// and its FLOP/s against the GEMM crate's on the step's own shapes.
    Engine(engine::Args),
    /// Split/Merge/Extend/Destroy bytes, time and bandwidth vs point-to-point (>= 2 ranks; with
    /// --device, also the pack/unpack kernels vs the device's copy engine, from 1 rank).
    Primitives(primitives::Args),
    /// Scaling a PPO job's training state (two 50M+-parameter models, θ and Adam moments):
    /// DP 2→4→8 ranks, 8→4, and a reshard, each by the transition DAG, by checkpoint/restart
    /// (UCP-style, a fresh mpirun) and tensor by tensor (Tenplex-style), against the
    /// point-to-point bandwidth (mpirun -n 8).
    Scaling(scaling::Args),
    /// Global transition DAG build time from 32 to 16,384 ranks, and its gap to the best order.
    TransitionPlanning(transition::Args),
    /// The three overlap types at eight memory capacities, Nereus and the per-component
    /// baseline both executed on live EMUs (8 ranks).
    Coordination(coordination::Args),
    /// The cost model calibrated on this machine: the tiny PPO job under 16 fixed plans on 4 and
    /// 8 ranks, efficiencies fitted on half, the other half predicted (mpirun -n 8).
    Calibration(calibration::Args),
    /// The time of one controller decision: the tiny job's recorded run, and Llama-3.1-8B PPO
    /// at 1,024 and 16,384 GPUs from modelled monitor records.
    Controller(controller::Args),
    /// Replan time and peak memory of the plan search from 8 to 16,384 GPUs.
    Planner(planner::Args),
    /// The restarted job of `bench scaling` (launched by it).
    #[command(hide = true)]
    ScalingRestore {
        /// The checkpoint directory.
        dir: std::path::PathBuf,
    },
}

/// Runs `command` on every rank of `session`.
pub fn run(session: &mut Session, command: &BenchCommand) -> Result<(), RuntimeError> {
    match command {
        BenchCommand::Solver(args) => solver::run(session, args),
        BenchCommand::Simulate(args) => simulate::run(session, args),
        BenchCommand::Engine(args) => engine::run(session, args),
        BenchCommand::Primitives(args) => primitives::run(session, args),
        BenchCommand::Scaling(args) => scaling::run(session, args),
        BenchCommand::TransitionPlanning(args) => transition::run(session, args),
        BenchCommand::Coordination(args) => coordination::run(session, args),
        BenchCommand::Calibration(args) => calibration::run(session, args),
        BenchCommand::Controller(args) => controller::run(session, args),
        BenchCommand::Planner(args) => planner::run(session, args),
        BenchCommand::ScalingRestore { dir } => scaling::restore(session, dir),
    }
}

/// The median of `xs` (the upper one of an even count; 0 when there is nothing to take it of).
pub fn median(mut xs: Vec<f64>) -> f64 {
    xs.sort_by(f64::total_cmp);
    xs.get(xs.len() / 2).copied().unwrap_or(0.0)
}

/// Where and on what a benchmark ran.
#[derive(Debug, Clone, Serialize)]
pub struct Machine {
    /// Host name of rank 0.
    pub hostname: String,
    /// MPI ranks.
    pub ranks: i32,
    /// Cores on rank 0's node (hwloc).
    pub cores: u32,
    /// The MPI library.
    pub mpi: String,
}

/// One floor an issue names, checked against the rows of the same run.
#[derive(Debug, Clone, Serialize)]
pub struct Floor {
    /// What is measured.
    pub name: String,
    /// The measured value.
    pub value: f64,
    /// The floor.
    pub floor: f64,
    /// `>=` when the value must reach the floor, `<=` when it must not exceed it.
    pub op: &'static str,
    /// Unit of value and floor.
    pub unit: String,
    /// Whether the floor holds.
    pub ok: bool,
}

impl Floor {
    /// `value >= floor`.
    pub fn at_least(name: &str, value: f64, floor: f64, unit: &str) -> Floor {
        Floor { name: name.into(), value, floor, op: ">=", unit: unit.into(), ok: value >= floor }
    }

    /// `value <= floor`.
    pub fn at_most(name: &str, value: f64, floor: f64, unit: &str) -> Floor {
        Floor { name: name.into(), value, floor, op: "<=", unit: unit.into(), ok: value <= floor }
    }
}

/// A finished benchmark.
#[derive(Debug, Clone, Serialize)]
pub struct BenchReport<R: Serialize> {
    /// Benchmark name.
    pub bench: String,
    /// Where it ran.
    pub machine: Machine,
    /// Measurements.
    pub rows: Vec<R>,
    /// Floors computed from the rows.
    pub floors: Vec<Floor>,
}

impl<R: Serialize> BenchReport<R> {
    /// Prints the floors and writes JSON to `json` if given (rank 0 calls this).
    pub fn finish(&self, json: Option<&Path>) -> Result<(), RuntimeError> {
        let mut out = std::io::stdout().lock();
        writeln!(out, "floors:").map_err(RuntimeError::Stdout)?;
        for f in &self.floors {
            let verdict = if f.ok { "ok" } else { "BELOW FLOOR" };
            writeln!(out, "  {:<40} {:>14.4} {} {:<12} {:<8} {verdict}", f.name, f.value, f.op, f.floor, f.unit)
                .map_err(RuntimeError::Stdout)?;
        }
        if let Some(path) = json {
            let text = serde_json::to_string_pretty(self).expect("reports serialize");
            std::fs::write(path, text + "\n").map_err(nereus_runtime::io_error("write", path))?;
            writeln!(out, "wrote {}", path.display()).map_err(RuntimeError::Stdout)?;
        }
        Ok(())
    }
}

/// The machine description for reports.
pub fn machine(session: &Session) -> Machine {
    let cores = nereus_topology::NodeTopology::discover(session.hostname()).map_or(0, |n| n.cores);
    Machine {
        hostname: session.hostname().into(),
        ranks: session.world().size(),
        cores,
        mpi: session.world().library_version(),
    }
}
