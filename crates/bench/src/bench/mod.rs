//! `nereus bench <what>`: benchmarks that need MPI ranks, one module each with its `Options` and
//! `run` (the binary's `commands/bench.rs` parses the flags into the options). Each prints a
//! table and can write the JSON contract of `docs/benchmarks.md`: `{"bench", "machine", "rows",
//! "floors"}`.

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

    /// `nereus bench solver`'s options (none without the `exact` feature).
    #[derive(Debug, Clone, Default)]
    pub struct Options;

    /// Fails with a usage error (exit status 2) that names the build.
    pub fn run(_: &mut Session, _: &Options) -> Result<(), RuntimeError> {
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
