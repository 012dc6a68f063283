//! What rank 0 prints while a job trains: the plan, one line per step, and a block under it for
//! a decision and a transition.

use nereus_core::index_list::format_index_list;
use nereus_core::plan::Plan;
use nereus_exec::rl::StepMetrics;

use super::boundary::Boundary;

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

/// One step.
pub fn print_step(step: u64, m: &StepMetrics, plan: &Plan) {
    let s = &m.stage_seconds;
    let skipped = if m.stats.skipped_updates > 0 {
        format!("  SKIPPED {} update(s)", m.stats.skipped_updates)
    } else {
        String::new()
    };
    println!(
        "step {step:>4}  reward {:.3}  len {:>5.2} (p95 {:>2})  kl {:+.4}  gen {:.2}s  inf {:.2}s  train {:.2}s  sync {:.3}s  tok/s {:.0}  plan {}{skipped}",
        m.stats.reward_mean,
        m.stats.response_len_mean,
        m.stats.response_len_p95,
        m.stats.kl,
        s.generation,
        s.inference,
        s.training,
        s.weight_sync,
        m.generated_tokens as f64 / m.step_seconds.max(1e-9),
        plan.compact()
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
pub fn print_eval(done: u64, e: &nereus_exec::rl::Evaluation) {
    let accuracy = e.accuracy.map(|a| format!("accuracy {a:.3}  ")).unwrap_or_default();
    println!(
        "eval after step {done}: {accuracy}reward {:.3}  len {:.2}  ({} held-out prompts, greedy)",
        e.mean_reward, e.response_len_mean, e.prompts
    );
}
