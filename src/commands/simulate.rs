//! `nereus simulate FILE --trace T.csv …`: the job over a trace under several policies, on one
//! process (the pure simulator, `nereus_core::sim`); this file is its I/O: the job file, the
//! trace, the calibration, the table, the JSON, the JSON lines and the plot.

use clap::Args;
use serde::Serialize;
use std::io::Write;
use std::path::{Path, PathBuf};

use nereus_core::config::check::{self, MAX_DEVICES};
use nereus_core::config::{JobConfig, PolicyMode};
use nereus_core::sim::{self, plot, Comparison, PolicySpread, RestartModel, RunSummary, SimOptions, SimStep, Truth};

use crate::error::{write_error, CommandError};
use crate::launch::{planner_command, Global};

/// `nereus simulate`: the job over a trace under several policies, with the live controller's
/// code (one process; no MPI launch needed).
#[derive(Args, Debug, Clone)]
pub struct SimulateArgs {
    /// Job file (TOML); the embedded default when omitted.
    pub file: Option<PathBuf>,
    /// The trace: CSV with `step` and any of `seq_len_mean`, `seq_len_p95`, `available_gpus`.
    #[arg(long, value_name = "TRACE.csv")]
    pub trace: PathBuf,
    /// GPUs where the trace has no `available_gpus` (default: the cluster's devices).
    #[arg(long, allow_negative_numbers = true)]
    pub gpus: Option<u32>,
    /// Policies to simulate, comma-separated.
    #[arg(long, value_parser = super::named::<PolicyMode>(), value_delimiter = ',', default_value = "nereus,static,greedy,every-k")]
    pub policies: Vec<PolicyMode>,
    /// γ of the nereus policy (default: policy.gamma).
    #[arg(long, conflicts_with = "gamma_sweep", allow_negative_numbers = true)]
    pub gamma: Option<f64>,
    /// Several γ values for the nereus policy, comma-separated (e.g. 0,0.1,0.2,...,1).
    #[arg(long, value_delimiter = ',', allow_negative_numbers = true)]
    pub gamma_sweep: Vec<f64>,
    /// Efficiencies of the ground truth: JSON list of 8, or {"efficiencies": [...]}.
    #[arg(long, value_name = "EFF.json")]
    pub calibration: Option<PathBuf>,
    /// Seconds a checkpoint/restart costs besides the checkpoint I/O.
    #[arg(long, default_value_t = 300.0, allow_negative_numbers = true)]
    pub restart_s: f64,
    /// File system bandwidth of the checkpoint I/O, GB/s.
    #[arg(long, default_value_t = 10.0, allow_negative_numbers = true)]
    pub fs_gbps: f64,
    /// The ground truth: `machine`, a seeded machine that differs from the cost model per
    /// operation class and plan shape, with jitter (the flags below); `model`, the cost model
    /// itself (exact: greedy cannot lose; for reproducing earlier results).
    #[arg(long, value_enum, default_value = "machine")]
    pub truth: TruthKind,
    /// σ of the log of the machine's per-class efficiencies around the controller's start.
    #[arg(long, default_value_t = Truth::machine(1).calibration_error, value_name = "SIGMA", allow_negative_numbers = true)]
    pub calibration_error: f64,
    /// σ of the log of each class's efficiency per plan shape (what calibration cannot learn;
    /// bench calibration's held-out 8–13% MAPE is σ ≈ 0.1–0.16).
    #[arg(long, default_value_t = Truth::machine(1).op_error, value_name = "SIGMA", allow_negative_numbers = true)]
    pub op_error: f64,
    /// Relative step-to-step jitter of each phase's seconds (standard deviation).
    #[arg(long, default_value_t = Truth::machine(1).noise, value_name = "SIGMA", allow_negative_numbers = true)]
    pub noise: f64,
    /// Relative step-to-step jitter of the response lengths (standard deviation).
    #[arg(long, default_value_t = Truth::machine(1).length_noise, value_name = "SIGMA", allow_negative_numbers = true)]
    pub length_noise: f64,
    /// σ of the log of a transition's seconds around its uncalibrated prediction.
    #[arg(long, default_value_t = Truth::machine(1).transition_error, value_name = "SIGMA", allow_negative_numbers = true)]
    pub transition_error: f64,
    /// Seed of the first machine.
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// Machines (seeds `seed`, `seed + 1`, …) every policy runs on; results are their mean and
    /// spread.
    #[arg(long, default_value_t = 5, allow_negative_numbers = true)]
    pub seeds: u32,
    /// Write {"runs": [...]} here.
    #[arg(long, value_name = "PATH")]
    pub json: Option<PathBuf>,
    /// Write one JSON line per simulated step here.
    #[arg(long, value_name = "PATH")]
    pub jsonl: Option<PathBuf>,
    /// Write the plot here (PATH.svg and PATH.png).
    #[arg(long, value_name = "PATH")]
    pub plot: Option<PathBuf>,
    #[command(flatten)]
    pub overrides: SimulateOverrides,
}

/// `--truth`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum TruthKind {
    /// A seeded machine that is not the cost model.
    Machine,
    /// The cost model itself.
    Model,
}

/// The job-file keys `simulate` lets the command line override (its `--seed` is the ground
/// truth's, not `job.seed`).
#[derive(Args, Debug, Clone)]
pub struct SimulateOverrides {
    /// Overrides rl.algorithm.
    #[arg(long, value_parser = super::named::<nereus_core::config::Algorithm>())]
    pub algorithm: Option<nereus_core::config::Algorithm>,
    /// Cluster file replacing the job file's [cluster] table (e.g. configs/clusters/lumi-g.toml).
    #[arg(long, value_name = "FILE")]
    pub cluster: Option<PathBuf>,
    /// Overrides cluster.nodes.
    #[arg(long, allow_negative_numbers = true)]
    pub nodes: Option<u32>,
}

impl From<SimulateOverrides> for nereus_core::config::Overrides {
    fn from(a: SimulateOverrides) -> Self {
        nereus_core::config::Overrides {
            algorithm: a.algorithm,
            cluster_file: a.cluster,
            nodes: a.nodes,
            ..Default::default()
        }
    }
}

/// The largest σ of the simulated truth's errors: a log-normal of σ = 2 already scales a step
/// by more than 50 at one standard deviation.
const MAX_SIGMA: f64 = 2.0;
/// The most seeds one command runs (each is a run of every policy).
const MAX_SEEDS: u32 = 1000;

/// `nereus simulate --json`.
#[derive(Debug, Serialize)]
pub struct SimulateOut {
    /// Per policy and γ, over the seeds.
    pub policies: Vec<PolicySpread>,
    /// One per policy, γ and seed.
    pub runs: Vec<RunSummary>,
}

/// Runs `nereus simulate` (rank 0 simulates; one process is enough).
pub fn exec(args: SimulateArgs, global: &Global) -> u8 {
    planner_command(global, args.file.as_deref(), &args.overrides.clone().into(), |config, _| simulate(config, &args))
}

impl SimulateArgs {
    /// Checks every number a flag gives, naming the flag and what it accepts.
    fn check(&self) -> Result<(), CommandError> {
        if let Some(gpus) = self.gpus {
            check::between("--gpus", gpus, MAX_DEVICES)?;
        }
        check::within("--restart-s", self.restart_s, 0.0, check::MAX_TIMEOUT_S)?;
        check::positive("--fs-gbps", self.fs_gbps)?;
        for &gamma in self.gamma.iter().chain(&self.gamma_sweep) {
            // The same range as policy.gamma.
            check::within(if self.gamma.is_some() { "--gamma" } else { "--gamma-sweep" }, gamma, 0.0, 1.0)?;
        }
        for (flag, sigma) in [
            ("--calibration-error", self.calibration_error),
            ("--op-error", self.op_error),
            ("--noise", self.noise),
            ("--length-noise", self.length_noise),
            ("--transition-error", self.transition_error),
        ] {
            check::within(flag, sigma, 0.0, MAX_SIGMA)?;
        }
        check::between("--seeds", self.seeds, MAX_SEEDS)?;
        Ok(())
    }

    /// The comparison these arguments ask for.
    fn comparison(&self) -> Result<Comparison, CommandError> {
        self.check()?;
        let efficiencies = self.calibration.as_deref().map(sim::read_calibration).transpose()?;
        let restart = RestartModel { fs_bytes_per_s: self.fs_gbps * 1e9, restart_s: self.restart_s };
        let truth = match self.truth {
            TruthKind::Model => Truth::model(self.seed),
            TruthKind::Machine => Truth {
                calibration_error: self.calibration_error,
                op_error: self.op_error,
                noise: self.noise,
                length_noise: self.length_noise,
                transition_error: self.transition_error,
                seed: self.seed,
            },
        };
        let seeds = (0..u64::from(self.seeds)).map(|k| self.seed + k).collect();
        Ok(Comparison {
            gpus: self.gpus,
            policies: self.policies.clone(),
            gammas: if self.gamma_sweep.is_empty() {
                self.gamma.into_iter().collect()
            } else {
                self.gamma_sweep.clone()
            },
            options: SimOptions { efficiencies, restart, truth },
            seeds,
        })
    }
}

fn simulate(config: &JobConfig, args: &SimulateArgs) -> Result<(), CommandError> {
    let trace = sim::read_trace(&args.trace)?;
    let results = sim::compare(config, &trace, &args.comparison()?)?;
    let summaries: Vec<RunSummary> = results.iter().map(|r| r.0.clone()).collect();
    let gamma = args.gamma.unwrap_or(config.policy.gamma);
    let policies = sim::spreads(&summaries, gamma);
    let table = sim::spread_table(&policies);
    std::io::stdout().lock().write_all(table.as_bytes()).map_err(CommandError::Stdout)?;
    if let Some(p) = &args.json {
        let out = SimulateOut { policies, runs: summaries };
        write_file(p, serde_json::to_string_pretty(&out).expect("summaries serialize") + "\n")?;
    }
    if let Some(p) = &args.jsonl {
        let lines: String = results
            .iter()
            .flat_map(|r| &r.1)
            .map(|s| serde_json::to_string(s).expect("steps serialize") + "\n")
            .collect();
        write_file(p, lines)?;
    }
    if let Some(p) = &args.plot {
        // The first machine's runs (the others differ in their draws, not in what they show).
        let named: Vec<(String, Vec<SimStep>)> = results
            .iter()
            .filter(|(s, _)| s.seed == args.seed)
            .map(|(s, steps)| (sim::run_name(s), steps.clone()))
            .collect();
        let title = format!(
            "{} on {} ({}): {}",
            config.job.name,
            config.cluster.name,
            args.trace.display(),
            "step latency per policy"
        );
        let chart = plot::chart(&title, &named);
        write_file(&p.with_extension("svg"), chart.svg())?;
        let png = p.with_extension("png");
        std::fs::write(&png, chart.png()).map_err(write_error(&png))?;
        println!("wrote {}", png.display());
    }
    Ok(())
}

/// Writes `text` to `path` and says so.
pub fn write_file(path: &Path, text: String) -> Result<(), CommandError> {
    std::fs::write(path, text).map_err(write_error(path))?;
    println!("wrote {}", path.display());
    Ok(())
}
