//! `nereus simulate` and `nereus trace synth`: the I/O around the pure simulator (`sim`):
//! the job file, the trace, the calibration, the table, the JSON, the JSON lines and the plot.

use serde::Serialize;
use std::io::Write;
use std::path::{Path, PathBuf};

use super::{io_error, RuntimeError, Session};
use nereus_core::config::{JobConfig, Overrides, PolicyMode};
use nereus_core::cost::Efficiencies;
use nereus_core::sim::synth::{synthesize, SynthSpec};
use nereus_core::sim::{plot, simulate, PolicyRun, RestartModel, RunSummary, SimOptions, SimStep, Trace, Truth};

/// What `nereus simulate` is asked.
#[derive(Debug, Clone)]
pub struct SimulateRequest {
    /// The trace (CSV).
    pub trace: PathBuf,
    /// The pool where the trace has no `available_gpus` (default: the cluster's devices).
    pub gpus: Option<u32>,
    /// Policies to run.
    pub policies: Vec<PolicyMode>,
    /// γ values for `nereus` (empty: the job's; the other policies run once, at the job's).
    pub gammas: Vec<f64>,
    /// Efficiencies of the ground truth (JSON: a list of 8, or `{"efficiencies": [...]}`).
    pub calibration: Option<PathBuf>,
    /// What a stop costs.
    pub restart: RestartModel,
    /// How wrong the cost model is about the simulated machine.
    pub truth: Truth,
    /// `{"runs": [...]}` here.
    pub json: Option<PathBuf>,
    /// One line per simulated step here.
    pub jsonl: Option<PathBuf>,
    /// The plot: `PATH` with the extensions `.svg` and `.png`.
    pub plot: Option<PathBuf>,
}

/// `nereus simulate --json`.
#[derive(Debug, Serialize)]
pub struct SimulateOut {
    /// One per policy and γ.
    pub runs: Vec<RunSummary>,
}

/// Reads a calibration file: `[e0, …, e7]` or `{"efficiencies": [...]}`.
pub fn read_calibration(path: &Path) -> Result<Efficiencies, RuntimeError> {
    let text = std::fs::read_to_string(path).map_err(io_error("read", path))?;
    let value: serde_json::Value = serde_json::from_str(&text)
        .map_err(|e| RuntimeError::Usage(format!("calibration `{}` is not JSON: {e}", path.display())))?;
    let list = value.get("efficiencies").cloned().unwrap_or(value);
    let e: Efficiencies = serde_json::from_value(list).map_err(|e| {
        RuntimeError::Usage(format!(
            "calibration `{}`: expected a list of 8 efficiencies in (0, 1]: {e}",
            path.display()
        ))
    })?;
    if e.0.iter().any(|x| !(x.is_finite() && *x > 0.0 && *x <= 1.0)) {
        return Err(RuntimeError::Usage(format!(
            "calibration `{}`: every efficiency must be in (0, 1], got {:?}",
            path.display(),
            e.0
        )));
    }
    Ok(e)
}

/// Reads and parses a trace file.
pub fn read_trace(path: &Path) -> Result<Trace, RuntimeError> {
    let text = std::fs::read_to_string(path).map_err(io_error("read", path))?;
    Trace::parse(&text, &path.display().to_string()).map_err(|e| RuntimeError::Usage(e.to_string()))
}

/// Every (policy, γ) of the request over `trace`: summaries and steps.
pub fn run_all(
    config: &JobConfig,
    trace: &Trace,
    request: &SimulateRequest,
) -> Result<Vec<(RunSummary, Vec<SimStep>)>, RuntimeError> {
    let gpus = request.gpus.unwrap_or(config.cluster.devices());
    let points = trace.points(f64::from(config.rl.max_response_len), gpus);
    let efficiencies = request.calibration.as_deref().map(read_calibration).transpose()?;
    let options = SimOptions { efficiencies, restart: request.restart, truth: request.truth };
    let gammas = if request.gammas.is_empty() { vec![config.policy.gamma] } else { request.gammas.clone() };
    let mut out = Vec::new();
    for &mode in &request.policies {
        if mode == PolicyMode::Off {
            return Err(RuntimeError::Usage(
                "--policies: `off` has no controller to simulate; use static for a fixed layout".into(),
            ));
        }
        // γ only matters to nereus; the others run once, at the job's γ.
        let job_gamma = [config.policy.gamma];
        let runs: &[f64] = if mode == PolicyMode::Nereus { &gammas } else { &job_gamma };
        for &gamma in runs {
            let run = PolicyRun { mode, gamma };
            out.push(simulate(config, &points, run, &options).map_err(|e| RuntimeError::Usage(e.to_string()))?);
        }
    }
    Ok(out)
}

/// `nereus simulate FILE --trace TRACE.csv …` (rank 0 simulates; one process is enough).
pub fn run(
    session: &mut Session,
    path: Option<&Path>,
    overrides: &Overrides,
    request: &SimulateRequest,
) -> Result<(), RuntimeError> {
    let config = session.load_config(path, overrides)?;
    if session.rank() != 0 {
        return Ok(());
    }
    let trace = read_trace(&request.trace)?;
    let results = run_all(&config, &trace, request)?;
    let mut w = std::io::stdout().lock();
    print_table(&mut w, &results.iter().map(|r| r.0.clone()).collect::<Vec<_>>())?;
    if let Some(p) = &request.json {
        let out = SimulateOut { runs: results.iter().map(|r| r.0.clone()).collect() };
        write_file(p, serde_json::to_string_pretty(&out).expect("summaries serialize") + "\n")?;
    }
    if let Some(p) = &request.jsonl {
        let lines: String = results
            .iter()
            .flat_map(|r| &r.1)
            .map(|s| serde_json::to_string(s).expect("steps serialize") + "\n")
            .collect();
        write_file(p, lines)?;
    }
    if let Some(p) = &request.plot {
        let named: Vec<(String, Vec<SimStep>)> =
            results.iter().map(|(s, steps)| (run_name(s), steps.clone())).collect();
        let title = format!(
            "{} on {} ({}): {}",
            config.job.name,
            config.cluster.name,
            request.trace.display(),
            "step latency per policy"
        );
        let chart = plot::chart(&title, &named);
        write_file(&p.with_extension("svg"), chart.svg())?;
        let png = p.with_extension("png");
        std::fs::write(&png, chart.png()).map_err(io_error("write", &png))?;
        println!("wrote {}", png.display());
    }
    Ok(())
}

/// `policy` or `nereus γ=0.5`.
pub fn run_name(s: &RunSummary) -> String {
    let policy = serde_json::to_value(s.policy).ok().and_then(|v| v.as_str().map(String::from)).unwrap_or_default();
    if s.policy == PolicyMode::Nereus {
        format!("{policy} γ={}", s.gamma)
    } else {
        policy
    }
}

/// The runs as a table.
pub fn print_table(w: &mut impl Write, runs: &[RunSummary]) -> Result<(), RuntimeError> {
    let mut text = format!(
        "{:<16} {:>6} {:>11} {:>12} {:>5} {:>4} {:>4} {:>10} {:>8} {:>6} {:>5} {:>7}\n",
        "policy",
        "steps",
        "mean step s",
        "total s",
        "trans",
        "urg",
        "opp",
        "trans s",
        "share %",
        "infeas",
        "rest",
        "wall s"
    );
    for r in runs {
        text += &format!(
            "{:<16} {:>6} {:>11.2} {:>12.1} {:>5} {:>4} {:>4} {:>10.2} {:>8.4} {:>6} {:>5} {:>7.2}\n",
            run_name(r),
            r.steps,
            r.mean_step_s,
            r.total_s,
            r.transitions,
            r.urgent,
            r.opportunistic,
            r.transition_s,
            100.0 * r.transition_share,
            r.infeasible_steps,
            r.restarts,
            r.wall_s
        );
    }
    w.write_all(text.as_bytes()).map_err(RuntimeError::Stdout)
}

fn write_file(path: &Path, text: String) -> Result<(), RuntimeError> {
    std::fs::write(path, text).map_err(io_error("write", path))?;
    println!("wrote {}", path.display());
    Ok(())
}

/// `nereus trace synth … OUT.csv` (rank 0 writes).
pub fn synth(session: &Session, spec: &SynthSpec, out: &Path) -> Result<(), RuntimeError> {
    if session.rank() != 0 {
        return Ok(());
    }
    if spec.steps == 0 || spec.gpus == 0 || !(spec.from >= 1.0 && spec.to >= 1.0 && spec.max_len >= 1.0) {
        return Err(RuntimeError::Usage(
            "trace synth: --steps, --gpus, --from, --to and --max-len must be positive".into(),
        ));
    }
    write_file(out, synthesize(spec).to_csv())
}
