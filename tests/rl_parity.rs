//! Nereus's advantage estimators, policy losses and loss aggregations against the formulas as
//! published (verl's `core_algos.py`, the papers), written independently in float64 numpy
//! (`tests/py/rl_reference.py`, in the test-only Python). Random ragged batches — responses of
//! every length up to the cap, all-masked rows (length 0), groups whose rewards are all equal —
//! go to both; every estimator (with the KL penalty in the rewards by each estimator, or none),
//! every policy loss (per-token and per-sequence ratio, decoupled clip, each KL estimator in the
//! loss, the entropy bonus) under every aggregation must agree within 1e-6. The loss runs as the
//! engine runs it: a shuffled mini-batch in two micro-batches, normalized by the mini-batch's
//! counts. Skipped, with a note, when the reference Python is missing outside CI.

mod common;

use std::process::{Command, Stdio};

use nereus_core::config::{KlEstimator, LossAgg};
use nereus_core::named::Named;
use nereus_core::rng::Rng;
use nereus_exec::engine::Objective;
use nereus_exec::rl::advantage::Estimator;
use nereus_exec::rl::losses::{ActorLoss, PolicyTerms, RatioLevel};
use nereus_exec::rl::{AdvantageParams, Rollout};
use serde_json::{json, Value};

const GROUP: usize = 4;
const PROMPT: usize = 3;
const CAP: usize = 6;

/// A uniform draw in `[lo, hi)`.
fn uniform(rng: &mut Rng, lo: f64, hi: f64) -> f64 {
    lo + (hi - lo) * (rng.next_u64() >> 11) as f64 / (1u64 << 53) as f64
}

/// Three groups of four ragged responses: group 1 has equal rewards, each group an all-masked
/// row; log-probabilities near each other so that clipping goes both ways.
fn batch(seed: u64) -> (Rollout, Vec<f32>, Vec<usize>, Vec<f32>) {
    let mut rng = Rng::new(seed);
    let s = 3 * GROUP;
    let t = PROMPT + CAP;
    let lengths: Vec<usize> = (0..s).map(|i| if i % GROUP == 2 { 0 } else { 1 + rng.below(CAP) }).collect();
    let scores: Vec<f32> =
        (0..s).map(|i| if i / GROUP == 1 { 0.5 } else { rng.below(3) as f32 * 0.5 - 0.25 }).collect();
    let mut rows = |lo: f64, hi: f64| (0..s * t).map(|_| uniform(&mut rng, lo, hi) as f32).collect::<Vec<f32>>();
    let old_logp = rows(-3.0, -0.05);
    let ref_logp: Vec<f32> = old_logp.iter().zip(rows(-0.4, 0.4)).map(|(o, d)| o + d).collect();
    let values = rows(-1.0, 1.0);
    let advantages = rows(-2.0, 2.0);
    let greedy = (0..s).map(|i| [0.0, 0.25, 0.5][i / GROUP]).collect();
    let mut members: Vec<usize> = (0..s).collect();
    rng.shuffle(&mut members);
    let outputs: Vec<f32> = members
        .iter()
        .flat_map(|&m| (0..t).map(move |r| m * t + r))
        .map(|i| old_logp[i] + uniform(&mut rng, -0.3, 0.3) as f32)
        .collect();
    let tokens = vec![1u32; s * t];
    let rollout = Rollout {
        prompt_len: PROMPT,
        seq_len: t,
        starts: Vec::new(),
        tokens,
        lengths,
        scores,
        old_logp,
        ref_logp,
        behav_logp: Vec::new(),
        values,
        advantages,
        returns: Vec::new(),
    };
    (rollout, greedy, members, outputs)
}

const PARAMS: AdvantageParams = AdvantageParams { kl_coef: 0.1, gamma: 0.9, lambda: 0.8, group: GROUP };

/// The estimators, by the reference's names.
fn estimators() -> Vec<(Estimator, &'static str)> {
    vec![
        (Estimator::Gae, "gae"),
        (Estimator::Group { std: true }, "group"),
        (Estimator::Group { std: false }, "group-no-std"),
        (Estimator::LeaveOneOut, "rloo"),
        (Estimator::Greedy, "remax"),
        (Estimator::Returns, "reinforce++"),
        (Estimator::GroupWhitened, "reinforce++-baseline"),
    ]
}

/// Every policy loss: per-token and per-sequence ratios under each aggregation, each KL
/// estimator in the loss, the entropy bonus on every other one.
fn loss_cases() -> Vec<PolicyTerms> {
    let mut cases = Vec::new();
    for (k, (&agg, &kl)) in LossAgg::ALL.iter().flat_map(|a| KlEstimator::ALL.iter().map(move |k| (a, k))).enumerate() {
        for ratio in [RatioLevel::Token, RatioLevel::Sequence] {
            cases.push(PolicyTerms {
                ratio,
                clip_low: 0.2,
                clip_high: if k % 2 == 0 { 0.28 } else { 0.2 },
                kl_coef: if k % 3 == 0 { 0.0 } else { 0.1 },
                kl_estimator: kl,
                entropy_coef: if k % 2 == 1 { 0.05 } else { 0.0 },
                agg,
                // The rollouts are on-policy (no behaviour log-probs): the cap is never reached.
                behaviour_cap: nereus_core::config::rl::BEHAVIOUR_WEIGHT_CAP,
            });
        }
    }
    cases
}

fn f64s(xs: &[f32]) -> Vec<f64> {
    xs.iter().map(|&x| f64::from(x)).collect()
}

/// The reference's answers for `rollout`.
fn reference(python: &str, rollout: &Rollout, greedy: &[f32], members: &[usize], outputs: &[f32]) -> Value {
    let kls = [None, Some("k1"), Some("k2"), Some("k3"), Some("low-var-kl")];
    let advantage_cases: Vec<Value> = estimators()
        .iter()
        .flat_map(|(_, name)| kls.iter().map(move |kl| json!({"estimator": name, "reward_kl": kl})))
        .collect();
    let loss_cases: Vec<Value> = loss_cases()
        .iter()
        .map(|c| {
            json!({
                "ratio": if c.ratio == RatioLevel::Token { "token" } else { "sequence" },
                "clip_low": c.clip_low, "clip_high": c.clip_high, "kl_coef": c.kl_coef,
                "kl_estimator": c.kl_estimator.name(), "entropy_coef": c.entropy_coef, "agg": c.agg.name(),
            })
        })
        .collect();
    let input = json!({
        "prompt_len": rollout.prompt_len, "seq_len": rollout.seq_len, "group": GROUP,
        "lengths": rollout.lengths, "scores": f64s(&rollout.scores), "greedy": f64s(greedy),
        "old_logp": f64s(&rollout.old_logp), "ref_logp": f64s(&rollout.ref_logp),
        "values": f64s(&rollout.values), "advantages": f64s(&rollout.advantages),
        "seq_advantages": f64s(&sequence_advantages(rollout).advantages),
        "outputs": f64s(outputs), "members": members,
        "kl_coef": PARAMS.kl_coef, "gamma": PARAMS.gamma, "lam": PARAMS.lambda,
        "advantage_cases": advantage_cases, "loss_cases": loss_cases,
    });
    let mut child = Command::new(python)
        .arg(common::repo().join("tests/py/rl_reference.py"))
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("the reference python starts");
    std::io::Write::write_all(&mut child.stdin.take().unwrap(), input.to_string().as_bytes()).unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    serde_json::from_slice(&out.stdout).unwrap()
}

/// Where `ours` and `theirs` differ by more than 1e-6 (relative above 1), as messages.
fn differences(what: &str, ours: &[f64], theirs: &Value) -> Vec<String> {
    let theirs: Vec<f64> = serde_json::from_value(theirs.clone()).unwrap();
    assert_eq!(ours.len(), theirs.len(), "{what}: lengths");
    ours.iter()
        .zip(&theirs)
        .enumerate()
        .filter(|(_, (a, b))| (*a - *b).abs() > 1e-6 * b.abs().max(1.0) || !a.is_finite())
        .take(3)
        .map(|(i, (a, b))| format!("{what}[{i}]: ours {a}, reference {b}"))
        .collect()
}

/// Our advantages (and GAE's returns) for every case the reference answered.
fn check_advantages(rollout: &Rollout, greedy: &[f32], reference: &Value) -> Vec<String> {
    let kls = [None, Some(KlEstimator::K1), Some(KlEstimator::K2), Some(KlEstimator::K3), Some(KlEstimator::LowVarKl)];
    let mut problems = Vec::new();
    let cases = estimators().into_iter().flat_map(|e| kls.iter().map(move |&kl| (e, kl)));
    for (k, ((estimator, name), kl)) in cases.enumerate() {
        let mut r = rollout.clone();
        r.estimate(estimator, PARAMS, kl, greedy);
        let what = format!("{name} with KL {kl:?} in the reward");
        problems.extend(differences(&format!("{what}: advantages"), &f64s(&r.advantages), &reference["advantages"][k]));
        if estimator == Estimator::Gae {
            problems.extend(differences(&format!("{what}: returns"), &f64s(&r.returns), &reference["returns"][k]));
        }
    }
    problems
}

/// `rollout` with each sequence's advantage on all its rows (its first row's): GSPO's ratio is
/// the sequence's, and so is its advantage (the gradient of a per-token advantage under a
/// sequence ratio is a surrogate's, not the loss's derivative).
fn sequence_advantages(rollout: &Rollout) -> Rollout {
    let t = rollout.seq_len;
    let mut r = rollout.clone();
    for (i, a) in r.advantages.iter_mut().enumerate() {
        *a = rollout.advantages[i / t * t];
    }
    r
}

/// Our loss and gradient for every loss case, in two micro-batches of the shuffled mini-batch.
fn check_losses(rollout: &Rollout, members: &[usize], outputs: &[f32], reference: &Value) -> Vec<String> {
    let t = rollout.seq_len;
    let half = members.len() / 2;
    let per_sequence = sequence_advantages(rollout);
    let mut problems = Vec::new();
    for (k, terms) in loss_cases().into_iter().enumerate() {
        let rollout = if terms.ratio == RatioLevel::Sequence { &per_sequence } else { rollout };
        let loss = ActorLoss { rollout, members, terms };
        let mut grad = vec![0f32; outputs.len()];
        let (first, second) = grad.split_at_mut(half * t);
        let total = loss.loss_and_grad(0..half, &outputs[..half * t], first)
            + loss.loss_and_grad(half..members.len(), &outputs[half * t..], second);
        let what = format!("{terms:?}");
        problems.extend(differences(&format!("{what}: loss"), &[total], &json!([reference["losses"][k]["loss"]])));
        problems.extend(differences(&format!("{what}: gradient"), &f64s(&grad), &reference["losses"][k]["grad"]));
    }
    problems
}

#[test]
fn estimators_losses_and_aggregations_match_the_published_formulas() {
    let Some(python) = common::reference_python() else { return };
    let mut problems = Vec::new();
    for seed in [1, 2, 3] {
        let (rollout, greedy, members, outputs) = batch(seed);
        let reference = reference(&python, &rollout, &greedy, &members, &outputs);
        problems
            .extend(check_advantages(&rollout, &greedy, &reference).into_iter().map(|p| format!("seed {seed}: {p}")));
        problems.extend(
            check_losses(&rollout, &members, &outputs, &reference).into_iter().map(|p| format!("seed {seed}: {p}")),
        );
    }
    assert!(problems.is_empty(), "{} disagreements:\n{}", problems.len(), problems.join("\n"));
}
