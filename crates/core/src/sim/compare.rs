//! Several policies, and several γ for Nereus, over one trace: what `nereus simulate` and
//! `nereus bench simulate` run, the table they print and the files they read.

use std::path::Path;

use super::{simulate, PolicyRun, RunSummary, SimError, SimOptions, SimStep, Trace};
use crate::config::{JobConfig, PolicyMode};
use crate::cost::Efficiencies;
use crate::file_error::FileError;

/// What to compare over a trace.
#[derive(Debug, Clone)]
pub struct Comparison {
    /// The pool where the trace has no `available_gpus` (default: the cluster's devices).
    pub gpus: Option<u32>,
    /// Policies to run.
    pub policies: Vec<PolicyMode>,
    /// γ values for `nereus` (empty: the job's; the other policies run once, at the job's).
    pub gammas: Vec<f64>,
    /// The ground truth, the restart model and the calibration.
    pub options: SimOptions,
}

/// Every (policy, γ) of `comparison` over `trace`: summaries and steps.
pub fn compare(
    config: &JobConfig,
    trace: &Trace,
    comparison: &Comparison,
) -> Result<Vec<(RunSummary, Vec<SimStep>)>, SimError> {
    let gpus = comparison.gpus.unwrap_or(config.cluster.devices());
    let points = trace.points(f64::from(config.rl.max_response_len), gpus);
    let gammas = if comparison.gammas.is_empty() { vec![config.policy.gamma] } else { comparison.gammas.clone() };
    let mut out = Vec::new();
    for &mode in &comparison.policies {
        if mode == PolicyMode::Off {
            return Err(SimError::Request(
                "--policies: `off` has no controller to simulate; use static for a fixed layout".into(),
            ));
        }
        // γ only matters to nereus; the others run once, at the job's γ.
        let job_gamma = [config.policy.gamma];
        let runs: &[f64] = if mode == PolicyMode::Nereus { &gammas } else { &job_gamma };
        for &gamma in runs {
            out.push(simulate(config, &points, PolicyRun { mode, gamma }, &comparison.options)?);
        }
    }
    Ok(out)
}

/// Reads and parses a trace file.
pub fn read_trace(path: &Path) -> Result<Trace, SimError> {
    let bytes = std::fs::read(path).map_err(FileError::on("read", path))?;
    let name = path.display().to_string();
    let text = String::from_utf8(bytes).map_err(|e| {
        let at = e.utf8_error().valid_up_to();
        let line = e.as_bytes()[..at].iter().filter(|&&b| b == b'\n').count() + 1;
        SimError::Trace { name: name.clone(), line, message: format!("not UTF-8 text (byte {at})") }
    })?;
    Trace::parse(&text, &name)
}

/// Reads a calibration file: `[e0, …, e7]` or `{"efficiencies": [...]}`, each in (0, 1].
pub fn read_calibration(path: &Path) -> Result<Efficiencies, SimError> {
    let text = std::fs::read_to_string(path).map_err(FileError::on("read", path))?;
    let bad = |why: String| SimError::Request(format!("calibration `{}`: {why}", path.display()));
    let value: serde_json::Value = serde_json::from_str(&text).map_err(|e| bad(format!("not JSON: {e}")))?;
    let list = value.get("efficiencies").cloned().unwrap_or(value);
    let e: Efficiencies =
        serde_json::from_value(list).map_err(|e| bad(format!("expected a list of 8 efficiencies in (0, 1]: {e}")))?;
    if e.0.iter().any(|x| !(x.is_finite() && *x > 0.0 && *x <= 1.0)) {
        return Err(bad(format!("every efficiency must be in (0, 1], got {:?}", e.0)));
    }
    Ok(e)
}

/// `policy`, or `nereus γ=0.5`.
pub fn run_name(s: &RunSummary) -> String {
    if s.policy == PolicyMode::Nereus {
        format!("{} γ={}", s.policy.name(), s.gamma)
    } else {
        s.policy.name().to_string()
    }
}

/// The runs as a table, one line per run.
pub fn table(runs: &[RunSummary]) -> String {
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
    text
}
