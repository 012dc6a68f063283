//! What rank 0 prints while a job trains: the plan, one line per step, and a block under it for
//! a decision and a transition.

use nereus_core::index_list::format_index_list;
use nereus_core::plan::Plan;
use nereus_core::record::EvalResult;
use nereus_exec::rl::StepMetrics;

use super::outcome::Boundary;

/// The plan, one model-stage per line.
pub fn print_plan(plan: &Plan) {
    for p in &plan.placements {
        let c = &p.candidate;
        println!(
            "plan {:<22} tp {} pp {} dp {} ranks {}",
            c.model_stage.to_string(),
            c.layout.tp,
            c.layout.pp,
            c.dp,
            format_index_list(&p.ranks)
        );
    }
}

/// Wall time of the run so far and the estimate of what is left, in seconds.
#[derive(Debug, Clone, Copy)]
pub struct Progress {
    /// Seconds since this run started stepping (warm-ups and set-up included).
    pub elapsed_s: f64,
    /// The steps left at this run's mean seconds per step so far.
    pub eta_s: f64,
}

/// `1h02m`, `3m05s`, `42s`.
fn clock(seconds: f64) -> String {
    let s = seconds.max(0.0).round() as u64;
    match (s / 3600, s / 60 % 60, s % 60) {
        (0, 0, sec) => format!("{sec}s"),
        (0, min, sec) => format!("{min}m{sec:02}s"),
        (h, min, _) => format!("{h}h{min:02}m"),
    }
}

/// One step.
pub fn print_step(step: u64, m: &StepMetrics, plan: &Plan, progress: Progress) {
    let s = &m.stage_seconds;
    let skipped = if m.stats.skipped_updates > 0 {
        format!("  SKIPPED {} update(s)", m.stats.skipped_updates)
    } else {
        String::new()
    };
    println!(
        "step {step:>4}  reward {:.3}  len {:>5.2} (p95 {:>2})  kl {:+.4}  gen {:.2}s  inf {:.2}s  train {:.2}s  sync {:.3}s  tok/s {:.0}  plan {}  {} elapsed, eta {}{skipped}",
        m.stats.reward_mean,
        m.stats.response_len_mean,
        m.stats.response_len_p95,
        m.stats.kl,
        s.generation,
        s.inference,
        s.training,
        s.weight_sync,
        m.generated_tokens as f64 / m.step_seconds.max(1e-9),
        plan.compact(),
        clock(progress.elapsed_s),
        clock(progress.eta_s)
    );
}

/// A decision and a transition, in one block under the step line.
pub fn print_boundary(b: &Boundary) {
    let Some(d) = &b.decision else { return };
    let num = |x: Option<f64>| x.map_or("-".to_string(), |x| format!("{x:.4}"));
    let a = d.admission;
    let verdict = match (d.admitted, d.kind) {
        (true, Some(kind)) => kind.name(),
        (true, None) => "admitted",
        (false, _) => "rejected",
    };
    println!(
        "  decision: trigger {}  ΔL {} s  L_tran {} s  H {}  γ {}  → {verdict} ({})",
        serde_json::to_string(&d.trigger).unwrap_or_default(),
        num(a.and_then(|a| a.delta_l_s)),
        num(a.and_then(|a| a.l_tran_s)),
        num(a.map(|a| a.h_x)),
        num(a.map(|a| a.gamma)),
        d.reason
    );
    if let Some(t) = &b.transition {
        println!(
            "  transition: {:.3} s (predicted {:.3} s), {} bytes, {} primitives: {}  →  {}",
            t.seconds, t.predicted_seconds, t.bytes, t.primitives, t.from, t.to
        );
    }
}

/// One evaluation's line.
pub fn print_eval(done: u64, e: &EvalResult) {
    let accuracy = e.accuracy.map(|a| format!("accuracy {a:.3}  ")).unwrap_or_default();
    let pass = match (e.pass_k, e.pass_at_k) {
        (Some(k), Some(p)) => format!("pass@{k} {p:.3}  "),
        _ => String::new(),
    };
    println!(
        "eval after step {done}: {accuracy}{pass}reward {:.3}  len {:.2}  ({} held-out prompts, greedy)",
        e.mean_reward, e.response_len_mean, e.prompts
    );
}

#[cfg(test)]
mod tests {
    #[test]
    fn clocks_read_as_people_read_them() {
        assert_eq!([5.0, 65.4, 3_725.0, 0.4].map(super::clock), ["5s", "1m05s", "1h02m", "0s"].map(String::from));
    }
}
