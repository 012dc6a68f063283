//! Admission and monitoring on hand numbers.

use super::*;

fn proposal(delta_l_s: f64, l_tran_s: f64, horizon: f64) -> Proposal {
    Proposal {
        urgent: false,
        delta_l_s,
        l_tran_s,
        current_s: 10.0,
        horizon,
        changes_layout: true,
        pool_growth: false,
        measured: false,
        trial_gain_s: None,
    }
}

#[test]
fn no_gain_is_rejected_whatever_the_payback() {
    for delta in [0.0, -1.0, f64::NAN] {
        assert!(!admit(PolicyMode::Nereus, &proposal(delta, 0.0, 100.0), 0.5, 0.0).admitted, "{delta}");
        assert!(!admit(PolicyMode::Greedy, &proposal(delta, 0.0, 100.0), 0.5, 0.0).admitted, "{delta}");
    }
}

#[test]
fn payback_exactly_at_gamma_h_is_admitted_and_just_above_is_not() {
    // ΔL = 2 s, H = 4, γ = 0.5: the budget is 2 steps, i.e. L_tran = 4 s.
    let at = admit(PolicyMode::Nereus, &proposal(2.0, 4.0, 4.0), 0.5, 0.0);
    assert!(at.admitted && at.kind == Some(TransitionKind::Opportunistic), "{at:?}");
    let above = admit(PolicyMode::Nereus, &proposal(2.0, 4.0 + 1e-9, 4.0), 0.5, 0.0);
    assert!(!above.admitted, "{above:?}");
    // Greedy ignores the payback.
    assert!(admit(PolicyMode::Greedy, &proposal(2.0, 400.0, 4.0), 0.5, 0.0).admitted);
}

#[test]
fn gamma_zero_admits_urgent_transitions_only() {
    assert!(!admit(PolicyMode::Nereus, &proposal(5.0, 0.0, 100.0), 0.0, 0.0).admitted);
    let urgent = Proposal { urgent: true, delta_l_s: f64::INFINITY, ..proposal(0.0, 50.0, 1.0) };
    let v = admit(PolicyMode::Nereus, &urgent, 0.0, 0.0);
    assert!(v.admitted && v.kind == Some(TransitionKind::Urgent), "{v:?}");
    // Urgency waives profitability, not the static policy's fixed layouts.
    assert!(!admit(PolicyMode::Static, &urgent, 0.5, 0.0).admitted);
    let dp_only = Proposal { changes_layout: false, ..urgent };
    assert!(admit(PolicyMode::Static, &dp_only, 0.5, 0.0).admitted);
    // Without a pool change or a violation the static baseline does not move at all.
    let faster = Proposal { urgent: false, ..dp_only };
    assert!(!admit(PolicyMode::Static, &faster, 0.5, 0.0).admitted);
}

#[test]
fn min_gain_holds_back_small_gains() {
    // 2% of a 10 s step is below a 5% minimum.
    assert!(!admit(PolicyMode::Nereus, &proposal(0.2, 0.0, 10.0), 0.5, 0.05).admitted);
    assert!(admit(PolicyMode::Nereus, &proposal(0.6, 0.0, 10.0), 0.5, 0.05).admitted);
}

fn observation(step: u64, response_len: f64) -> Observation {
    Observation { step, response_len, step_seconds: 1.0, predicted_seconds: 1.0, pool: 8, memory_violation: false }
}

fn monitor() -> Monitor {
    Monitor::new(Thresholds { response_length: 0.3, step_latency: 0.3 })
}

#[test]
fn horizons_move_only_at_crossings() {
    let mut m = monitor();
    assert!(m.observe(&observation(0, 10.0)).is_empty(), "the first observation sets the reference");
    assert!(m.observe(&observation(1, 12.9)).is_empty(), "29% is not a crossing");
    assert_eq!(m.track(Signal::ResponseLength).horizon, 1.0);
    assert_eq!(m.observe(&observation(2, 13.1)), vec![Trigger::Drift(Signal::ResponseLength)]);
    let first = m.track(Signal::ResponseLength).horizon;
    assert_eq!(first, 0.5 * 2.0 + 0.5 * 1.0, "the first crossing counts the steps since the reference");
    // Without a replan the reference stays at 10: step 6 crosses again, 4 steps later.
    assert!(m.observe(&observation(6, 14.0)).contains(&Trigger::Drift(Signal::ResponseLength)));
    let h = m.track(Signal::ResponseLength).horizon;
    assert_eq!(h, 0.5 * 4.0 + 0.5 * first);
    assert_eq!(m.horizon(&[Trigger::Drift(Signal::ResponseLength), Trigger::MemoryViolation], 6), h);
    assert_eq!(m.horizon(&[Trigger::PoolShrink], 6), 1.0);
    // A standing gap's horizon: per signal the larger of its horizon and the steps it has been
    // quiet, the smallest of those — the length (crossed at 6) at once, 14 steps later.
    assert_eq!(m.horizon(&[Trigger::StandingGap], 6), h);
    assert_eq!(m.horizon(&[Trigger::StandingGap], 20), 14.0, "latency and pool quiet for 20 steps");
    assert_eq!(m.standing_horizon(20), 14.0);
}

#[test]
fn references_reset_after_a_replan_even_a_rejected_one() {
    let mut m = monitor();
    m.observe(&observation(0, 10.0));
    let crossing = observation(3, 14.0);
    assert!(!m.observe(&crossing).is_empty());
    m.replanned(&crossing); // the target was rejected: the reference still moves to 14
    assert_eq!(m.track(Signal::ResponseLength).reference, Some(14.0));
    assert!(m.observe(&observation(4, 15.0)).is_empty(), "7% from the new reference");
}

#[test]
fn shrinks_and_memory_violations_are_urgent_growth_has_its_own_horizon() {
    let mut m = monitor();
    m.observe(&observation(0, 10.0));
    let shrunk = Observation { pool: 6, memory_violation: true, ..observation(1, 10.0) };
    let fired = m.observe(&shrunk);
    assert_eq!(fired, vec![Trigger::PoolShrink, Trigger::MemoryViolation]);
    assert!(fired.iter().all(|t| t.is_urgent()));
    assert!(!Trigger::Drift(Signal::StepLatency).is_urgent());
    // The pool comes back 5 steps later: a growth, not urgent, priced with H_pool.
    let grown = Observation { pool: 8, ..observation(6, 10.0) };
    assert_eq!(m.observe(&grown), vec![Trigger::PoolGrowth]);
    assert!(!Trigger::PoolGrowth.is_urgent());
    let h = m.horizon(&[Trigger::PoolGrowth], 6);
    assert_eq!(h, 0.5 * 5.0 + 0.5 * (0.5 * 1.0 + 0.5 * 1.0), "changes at steps 1 and 6: {h}");
}

#[test]
fn the_static_baseline_follows_a_growing_pool_and_nothing_else() {
    let grow = Proposal { pool_growth: true, changes_layout: false, ..proposal(1.0, 100.0, 1.0) };
    assert!(admit(PolicyMode::Static, &grow, 0.5, 0.0).admitted);
    assert!(!admit(PolicyMode::Static, &Proposal { pool_growth: false, ..grow }, 0.5, 0.0).admitted);
    assert!(!admit(PolicyMode::Static, &Proposal { changes_layout: true, ..grow }, 0.5, 0.0).admitted);
    // Nereus prices the same growth: a transition that does not pay back in the pool's
    // horizon is not taken.
    assert!(!admit(PolicyMode::Nereus, &grow, 0.5, 0.0).admitted);
}

#[test]
fn a_length_burst_waits_for_the_next_observation_under_hysteresis() {
    let mut plain = monitor();
    let mut steady = monitor().with_hysteresis();
    for m in [&mut plain, &mut steady] {
        m.observe(&observation(0, 10.0));
        assert!(m.observe(&observation(1, 10.5)).is_empty());
    }
    // A one-step burst of half again the length: the baselines' monitor fires at once...
    let burst = observation(2, 15.0);
    assert_eq!(plain.observe(&burst), vec![Trigger::Drift(Signal::ResponseLength)]);
    // ... the hysteresis waits, and the burst passes without a replan.
    assert!(steady.observe(&burst).is_empty(), "a jump past δ_len waits for the next step");
    assert!(steady.observe(&observation(3, 10.4)).is_empty(), "back within δ_len: nothing fires");
    // A jump that holds is a level shift: it fires on its second step.
    assert!(steady.observe(&observation(4, 15.0)).is_empty());
    assert_eq!(steady.observe(&observation(5, 15.2)), vec![Trigger::Drift(Signal::ResponseLength)]);
    // A trend that crosses without a jump fires at once.
    let mut trend = monitor().with_hysteresis();
    for (step, len) in [10.0, 11.0, 12.0, 13.5].into_iter().enumerate() {
        let fired = trend.observe(&observation(step as u64, len));
        assert_eq!(!fired.is_empty(), step == 3, "step {step}: {fired:?}");
    }
}
