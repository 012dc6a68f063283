//! Per-token estimators of `KL(π ‖ π_ref)` from the sampled token's log-probabilities
//! (Schulman, "Approximating KL divergence", 2020), with their derivatives in `logp`: the KL
//! term of the actor's loss (`losses.rs`) and the KL penalty in the rewards (`rollout.rs`).

use nereus_core::config::KlEstimator;

/// The k1 estimator of `KL(π ‖ π_ref)` for one token, `logp − ref` (Schulman 2020), and its
/// derivative in `logp`.
pub fn kl_k1(logp: f64, ref_logp: f64) -> (f64, f64) {
    (logp - ref_logp, 1.0)
}

/// The k2 estimator, `½(logp − ref)²` (Schulman 2020), and its derivative in `logp`.
pub fn kl_k2(logp: f64, ref_logp: f64) -> (f64, f64) {
    let x = logp - ref_logp;
    (0.5 * x * x, x)
}

/// The k3 estimator of `KL(π ‖ π_ref)` for one token, `e^{ref − logp} − (ref − logp) − 1`
/// (Schulman 2020; GRPO's KL term), and its derivative in `logp`.
pub fn kl_k3(logp: f64, ref_logp: f64) -> (f64, f64) {
    let d = ref_logp - logp;
    (d.exp() - d - 1.0, 1.0 - d.exp())
}

/// k3 with verl's guards (`low_var_kl` in `kl_penalty_forward`): `ref − logp` clamped to ±20,
/// the estimate to ±10 (no gradient where either clamp holds).
pub fn kl_low_var(logp: f64, ref_logp: f64) -> (f64, f64) {
    let raw = ref_logp - logp;
    let d = raw.clamp(-20.0, 20.0);
    let kl = d.exp() - d - 1.0;
    let grad = if d != raw || kl.abs() > 10.0 { 0.0 } else { 1.0 - d.exp() };
    (kl.clamp(-10.0, 10.0), grad)
}

/// The KL estimate of one token by `estimator`, and its derivative in `logp`.
pub fn kl_token(estimator: KlEstimator, logp: f64, ref_logp: f64) -> (f64, f64) {
    match estimator {
        KlEstimator::K1 => kl_k1(logp, ref_logp),
        KlEstimator::K2 => kl_k2(logp, ref_logp),
        KlEstimator::K3 => kl_k3(logp, ref_logp),
        KlEstimator::LowVarKl => kl_low_var(logp, ref_logp),
    }
}
