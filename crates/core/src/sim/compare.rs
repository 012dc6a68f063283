//! Several policies, and several γ for Nereus, over one trace on several seeds' machines: what
//! `nereus simulate` and `nereus bench simulate` run, the table they print (mean and spread
//! over the seeds, and each policy against Nereus seed by seed) and the files they read.

use std::path::Path;

use serde::Serialize;

use super::{simulate, PolicyRun, RunSummary, SimError, SimOptions, SimStep, Trace};
use crate::config::{JobConfig, PolicyMode};
use crate::cost::Efficiencies;

/// What to compare over a trace.
#[derive(Debug, Clone)]
pub struct Comparison {
    /// The pool where the trace has no `available_gpus` (default: the cluster's devices).
    pub gpus: Option<u32>,
    /// Policies to run.
    pub policies: Vec<PolicyMode>,
    /// γ values for `nereus` (empty: the job's; the other policies run once, at the job's).
    pub gammas: Vec<f64>,
    /// The ground truth (its seed replaced by each of `seeds`), the restart model and the
    /// calibration.
    pub options: SimOptions,
    /// The seeds: each is another machine ([`super::Truth`]), run by every policy.
    pub seeds: Vec<u64>,
}

/// Every (policy, γ) of `comparison` over `trace` on every seed: summaries and steps, seed
/// after seed.
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
            for &seed in &comparison.seeds {
                let options =
                    SimOptions { truth: super::Truth { seed, ..comparison.options.truth }, ..comparison.options };
                out.push(simulate(config, &points, PolicyRun { mode, gamma }, &options)?);
            }
        }
    }
    Ok(out)
}

/// A value's mean, sample standard deviation, least and greatest over seeds.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Spread {
    /// Mean.
    pub mean: f64,
    /// Sample standard deviation (0 for one seed).
    pub sd: f64,
    /// Least.
    pub min: f64,
    /// Greatest.
    pub max: f64,
}

impl Spread {
    /// The spread of `xs` (all zero when empty).
    pub fn of(xs: &[f64]) -> Spread {
        if xs.is_empty() {
            return Spread { mean: 0.0, sd: 0.0, min: 0.0, max: 0.0 };
        }
        let n = xs.len() as f64;
        let mean = xs.iter().sum::<f64>() / n;
        let var = if xs.len() > 1 { xs.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / (n - 1.0) } else { 0.0 };
        let min = xs.iter().copied().fold(f64::INFINITY, f64::min);
        let max = xs.iter().copied().fold(f64::NEG_INFINITY, f64::max);
        Spread { mean, sd: var.sqrt(), min, max }
    }
}

/// One (policy, γ) over the seeds (an element of `policies` in `--json`).
#[derive(Debug, Clone, Serialize)]
pub struct PolicySpread {
    /// The policy.
    pub policy: PolicyMode,
    /// γ.
    pub gamma: f64,
    /// Seeds run.
    pub seeds: usize,
    /// Mean seconds per step (transitions and restarts amortized), over the seeds.
    pub mean_step_s: Spread,
    /// Transitions per run.
    pub transitions: Spread,
    /// Opportunistic transitions per run.
    pub opportunistic: Spread,
    /// Transitions' share of the run time, percent.
    pub transition_share_pct: Spread,
    /// Restarts per run.
    pub restarts: Spread,
    /// Seed by seed, this policy's mean step over Nereus's at the job's γ on the same machine
    /// (`None` when that run is not in the comparison): above 1, Nereus was faster.
    pub over_nereus: Option<Spread>,
}

/// Groups `runs` by (policy, γ), in the order they first appear.
pub fn spreads(runs: &[RunSummary], job_gamma: f64) -> Vec<PolicySpread> {
    let mut keys: Vec<(PolicyMode, f64)> = Vec::new();
    for r in runs {
        if !keys.iter().any(|&(p, g)| p == r.policy && g == r.gamma) {
            keys.push((r.policy, r.gamma));
        }
    }
    let nereus =
        |seed: u64| runs.iter().find(|r| r.policy == PolicyMode::Nereus && r.gamma == job_gamma && r.seed == seed);
    keys.into_iter()
        .map(|(policy, gamma)| {
            let mine: Vec<&RunSummary> = runs.iter().filter(|r| r.policy == policy && r.gamma == gamma).collect();
            let of = |f: &dyn Fn(&RunSummary) -> f64| Spread::of(&mine.iter().map(|r| f(r)).collect::<Vec<_>>());
            let ratios: Option<Vec<f64>> =
                mine.iter().map(|r| nereus(r.seed).map(|n| r.mean_step_s / n.mean_step_s)).collect();
            PolicySpread {
                policy,
                gamma,
                seeds: mine.len(),
                mean_step_s: of(&|r| r.mean_step_s),
                transitions: of(&|r| r.transitions as f64),
                opportunistic: of(&|r| r.opportunistic as f64),
                transition_share_pct: of(&|r| 100.0 * r.transition_share),
                restarts: of(&|r| r.restarts as f64),
                over_nereus: ratios.map(|r| Spread::of(&r)),
            }
        })
        .collect()
}

/// Reads and parses a trace file.
pub fn read_trace(path: &Path) -> Result<Trace, SimError> {
    let bytes = crate::file_error::read_regular(path)?;
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
    let text = crate::file_error::read_regular_string(path)?;
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
    policy_name(s.policy, s.gamma)
}

fn policy_name(policy: PolicyMode, gamma: f64) -> String {
    if policy == PolicyMode::Nereus {
        format!("{} γ={}", policy.name(), gamma)
    } else {
        policy.name().to_string()
    }
}

/// The policies over their seeds as a table: mean ± sd of the mean step, each against Nereus
/// seed by seed, and the transitions and restarts per run.
pub fn spread_table(spreads: &[PolicySpread]) -> String {
    let mut text = format!(
        "{:<16} {:>5} {:>20} {:>18} {:>7} {:>6} {:>8} {:>6}\n",
        "policy", "seeds", "mean step s", "over nereus", "trans", "opp", "share %", "rest"
    );
    for p in spreads {
        let m = p.mean_step_s;
        let ratio = p.over_nereus.map_or("-".into(), |r| format!("{:.4} ± {:.4}", r.mean, r.sd));
        text += &format!(
            "{:<16} {:>5} {:>20} {:>18} {:>7.1} {:>6.1} {:>8.4} {:>6.1}\n",
            policy_name(p.policy, p.gamma),
            p.seeds,
            format!("{:.2} ± {:.2}", m.mean, m.sd),
            ratio,
            p.transitions.mean,
            p.opportunistic.mean,
            p.transition_share_pct.mean,
            p.restarts.mean,
        );
    }
    text
}

/// The runs as a table, one line per run.
pub fn table(runs: &[RunSummary]) -> String {
    let mut text = format!(
        "{:<16} {:>5} {:>6} {:>11} {:>12} {:>5} {:>4} {:>4} {:>10} {:>8} {:>6} {:>5} {:>7}\n",
        "policy",
        "seed",
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
            "{:<16} {:>5} {:>6} {:>11.2} {:>12.1} {:>5} {:>4} {:>4} {:>10.2} {:>8.4} {:>6} {:>5} {:>7.2}\n",
            run_name(r),
            r.seed,
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
