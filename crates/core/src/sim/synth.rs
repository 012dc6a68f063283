//! Synthetic traces shaped like the paper's (deterministic: a seed, no clock).
//!
//! - [`Shape::Growth`] (Fig. 4a): the mean response length rises along a logistic curve from
//!   `from` to `to` tokens over the run, with a few percent of autocorrelated noise; the p95 is
//!   the mean times `tail` (1.3), within `max_len`.
//! - [`Shape::Spot`] (Fig. 3): the pool of a spot allocation: whole nodes are reclaimed and
//!   given back at random steps (a change every 50 steps on average), between half the pool and
//!   all of it; the length stays at `from`.
//! - [`Shape::Both`]: the two together (independent draws of the same seed).
//! - [`Shape::Paper26`]: the paper's 26-step trace (§6.3): the mean length from 1,147 to 3,722
//!   tokens, on 8 to 32 GPUs that change four times.
//! - Published length curves ([`Shape::PaperGrowth`], [`Shape::R1Zero`], [`Shape::DeepScaleR`]):
//!   the mean response length follows a curve read from a published RL run, between anchor points
//!   (`(fraction of the run, tokens)`, linear between them), over `steps` steps, with the same
//!   autocorrelated noise; p95 is the mean times [`LONG_COT_TAIL`]. docs/evaluation.md ("Traces")
//!   says where each curve comes from and how it was read.
//! - [`Shape::Elastic`]: an elastic allocation that starts at half the pool and is granted nodes
//!   one at a time (every 100 steps on average), with a rare preemption of one node (every 500).
//! - [`Shape::Mixed`]: lengths and the pool change together (issue 52): the mean length rises
//!   from `from` to `to` along a power curve `x^k` (`k` drawn per seed in `[0.5, 2]`) with 8%
//!   independent step-to-step noise and rare 1.5× bursts (3% of steps); the p95 is 1.15–1.25×
//!   the mean; the pool is taken and returned in units of an eighth of it (a node of 8 GPUs at
//!   64) about every 40 steps, never below a quarter of it (16 GPUs at 64).

use super::trace::{Trace, TraceRow};

/// The kind of trace.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Shape {
    /// Response lengths grow; the pool is fixed.
    Growth,
    /// The pool changes; lengths are fixed.
    Spot,
    /// Both.
    Both,
    /// The paper's 26-step trace of growth and pool changes (8–32 GPUs).
    Paper26,
    /// The paper's length figures: mean response length from 1.3K to 4.1K tokens.
    PaperGrowth,
    /// DeepSeek-R1-Zero's average response length during RL (Guo et al. 2025, Fig. 1b).
    R1Zero,
    /// DeepScaleR-1.5B's response length over its 8K/16K/24K context phases (Luo et al. 2025).
    DeepScaleR,
    /// The pool of an elastic allocation: granted nodes one by one, a rare preemption.
    Elastic,
    /// Noisy, bursty length growth along a power curve while the pool shrinks and grows.
    Mixed,
}

crate::named_enum!(Shape {
    Growth => "growth",
    Spot => "spot",
    Both => "both",
    Paper26 => "paper26",
    PaperGrowth => "paper-growth",
    R1Zero => "r1-zero",
    DeepScaleR => "deepscaler",
    Elastic => "elastic",
    Mixed => "mixed",
});

/// A published run's mean response length: `(fraction of the run, tokens)`, linear between.
type Curve = &'static [(f64, f64)];

/// The paper's length figures: from about 1.3K to 4.1K tokens, a steady rise.
const PAPER_GROWTH: Curve = &[(0.0, 1300.0), (1.0, 4100.0)];
/// DeepSeek-R1-Zero, Fig. 1b (Nature 2025; Fig. 3 of arXiv:2501.12948), 0–10,000 steps:
/// about 1K at the start, 2.5K at 2,000 steps, 4.5K at 4,000, 6.5K at 6,000, 11K at 8,000 and
/// 15K at 10,000 (read to about ±1K; see docs/evaluation.md).
const R1_ZERO: Curve = &[(0.0, 1000.0), (0.2, 2500.0), (0.4, 4500.0), (0.6, 6500.0), (0.8, 11000.0), (1.0, 15000.0)];
/// DeepScaleR-1.5B-Preview (Luo et al. 2025, blog), about 1,750 steps: under the 8K context
/// the length drops from 5,500 to 3,500 tokens (stated), then grows back towards the cap; the
/// 16K (from about step 1,040) and 24K (from about step 1,500) phases let it grow further
/// (shape stated, values read from the figure to about ±1K).
const DEEPSCALER: Curve =
    &[(0.0, 5500.0), (0.15, 3500.0), (0.55, 5200.0), (0.6, 5600.0), (0.85, 8000.0), (1.0, 9500.0)];

/// p95 over mean of a long chain-of-thought run's response lengths. No report above gives it;
/// DeepScaleR states that incorrect responses ran three times longer than correct ones, so the
/// distribution is wide. 1.8 is the p95 of a log-normal whose log has σ ≈ 0.45: an assumption,
/// not a measurement.
pub const LONG_COT_TAIL: f64 = 1.8;

/// What to synthesize.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SynthSpec {
    /// The kind of trace.
    pub shape: Shape,
    /// Steps (ignored by `Paper26`, which has 26).
    pub steps: u64,
    /// The full pool, GPUs.
    pub gpus: u32,
    /// GPUs per node (the unit a spot pool changes by).
    pub gpus_per_node: u32,
    /// Mean response length at the start, tokens.
    pub from: f64,
    /// Mean response length at the end, tokens.
    pub to: f64,
    /// The longest response the job allows (p95 is cut there).
    pub max_len: f64,
    /// Seed of the noise and the spot events.
    pub seed: u64,
    /// Whether to write the `available_gpus` column (without it the pool is the simulator's
    /// `--gpus`, so one trace serves every size).
    pub pool: bool,
}

impl Default for SynthSpec {
    fn default() -> Self {
        SynthSpec {
            shape: Shape::Growth,
            steps: 1000,
            gpus: 1024,
            gpus_per_node: 8,
            from: 500.0,
            to: 8000.0,
            max_len: 8192.0,
            seed: 1,
            pool: true,
        }
    }
}

/// p95 over mean of a step's response lengths.
const TAIL: f64 = 1.3;
/// Relative standard deviation of the length noise, and its step-to-step correlation.
const NOISE: (f64, f64) = (0.03, 0.8);
/// Chance per step that the spot pool changes.
const SPOT_CHANGE: f64 = 0.02;

/// SplitMix64 (Steele, Lea, Flood 2014): a uniform draw in `[0, 1)`.
fn uniform(state: &mut u64) -> f64 {
    *state = state.wrapping_add(0x9E37_79B9_7F4A_7C15);
    let mut z = *state;
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    ((z ^ (z >> 31)) >> 11) as f64 / (1u64 << 53) as f64
}

/// The trace `spec` describes.
pub fn synthesize(spec: &SynthSpec) -> Trace {
    match spec.shape {
        Shape::Paper26 => return paper26(spec),
        Shape::Mixed => return mixed(spec),
        _ => {}
    }
    let curve = match spec.shape {
        Shape::PaperGrowth => Some(PAPER_GROWTH),
        Shape::R1Zero => Some(R1_ZERO),
        Shape::DeepScaleR => Some(DEEPSCALER),
        _ => None,
    };
    let grow = matches!(spec.shape, Shape::Growth | Shape::Both);
    let lengths = match curve {
        Some(curve) => published(spec, curve),
        None => lengths(spec, grow),
    };
    let tail = if curve.is_some() { LONG_COT_TAIL } else { TAIL };
    let pools = match spec.shape {
        Shape::Spot | Shape::Both => Some(spot_pool(spec)),
        Shape::Elastic => Some(elastic_pool(spec)),
        _ => None,
    };
    let rows = (0..spec.steps)
        .map(|t| {
            let mean = lengths[t as usize];
            TraceRow {
                step: t,
                seq_len_mean: Some(mean),
                seq_len_p95: Some((mean * tail).min(spec.max_len).max(mean)),
                available_gpus: spec.pool.then(|| pools.as_ref().map_or(spec.gpus, |p| p[t as usize])),
            }
        })
        .collect();
    Trace { rows }
}

/// Mean lengths along a published `curve` over `spec.steps` steps, times the same AR(1) noise
/// as [`lengths`] (what a real run's step-to-step variation looks like at this scale).
fn published(spec: &SynthSpec, curve: Curve) -> Vec<f64> {
    noisy(spec, 0x6375_7276, |x| {
        let k = curve.iter().rposition(|(at, _)| *at <= x).unwrap_or(0).min(curve.len() - 2);
        let ((x0, y0), (x1, y1)) = (curve[k], curve[k + 1]);
        y0 + (y1 - y0) * ((x - x0) / (x1 - x0)).clamp(0.0, 1.0)
    })
}

/// An elastic allocation's pool: it starts at half the pool; each step one node is granted
/// with probability 1/100 (while short) and one is preempted with probability 1/500.
fn elastic_pool(spec: &SynthSpec) -> Vec<u32> {
    let mut state = spec.seed ^ 0x656c_6173;
    let node = spec.gpus_per_node.max(1);
    let (min, max) = ((spec.gpus / 2).max(node), spec.gpus);
    let mut pool = min;
    (0..spec.steps)
        .map(|t| {
            if t > 0 {
                if pool < max && uniform(&mut state) < 0.01 {
                    pool = (pool + node).min(max);
                } else if uniform(&mut state) < 0.002 {
                    pool = pool.saturating_sub(node).max(node);
                }
            }
            pool
        })
        .collect()
}

/// Mean lengths: a logistic rise from `from` to `to` (flat at `from` without growth), times
/// AR(1) noise.
fn lengths(spec: &SynthSpec, grow: bool) -> Vec<f64> {
    let logistic = |x: f64| 1.0 / (1.0 + (-8.0 * (x - 0.5)).exp());
    let (lo, hi) = (logistic(0.0), logistic(1.0));
    noisy(spec, 0x6c65_6e67, |x| {
        let share = if grow { (logistic(x) - lo) / (hi - lo) } else { 0.0 };
        spec.from + (spec.to - spec.from) * share
    })
}

/// `mean(x)` at every step (`x` the run's fraction, 0 to 1) times AR(1) noise ([`NOISE`])
/// drawn from the spec's seed salted with `salt`, within `[1, max_len]`.
fn noisy(spec: &SynthSpec, salt: u64, mean: impl Fn(f64) -> f64) -> Vec<f64> {
    let mut state = spec.seed ^ salt;
    let mut noise = 0.0;
    let (sd, rho) = NOISE;
    (0..spec.steps)
        .map(|t| {
            let x = t as f64 / (spec.steps.max(2) - 1) as f64;
            // A centred uniform with the right standard deviation.
            let shock = (uniform(&mut state) - 0.5) * (12.0f64).sqrt() * sd;
            noise = rho * noise + (1.0 - rho * rho).sqrt() * shock;
            (mean(x) * (1.0 + noise)).clamp(1.0, spec.max_len)
        })
        .collect()
}

/// The spot pool: at each step, with probability [`SPOT_CHANGE`], one to four nodes are
/// reclaimed (or given back), staying between half the pool and all of it.
fn spot_pool(spec: &SynthSpec) -> Vec<u32> {
    let mut state = spec.seed ^ 0x7370_6f74;
    let node = spec.gpus_per_node.max(1);
    let (min, max) = ((spec.gpus / 2).max(node), spec.gpus);
    let mut pool = max;
    (0..spec.steps)
        .map(|t| {
            if t > 0 && uniform(&mut state) < SPOT_CHANGE {
                let nodes = 1 + (uniform(&mut state) * 4.0) as u32;
                let delta = nodes * node * (spec.gpus / node / 16).max(1);
                // Reclaims are likelier while the pool is full, returns while it is short.
                let reclaim = uniform(&mut state) < f64::from(pool - min + 1) / f64::from(max - min + 2);
                pool = if reclaim { pool.saturating_sub(delta).max(min) } else { (pool + delta).min(max) };
            }
            pool
        })
        .collect()
}

/// Relative standard deviation of a mixed trace's step-to-step length noise (independent).
const MIXED_NOISE: f64 = 0.08;
/// Chance per step of a mixed trace's length burst, and its factor.
const MIXED_BURST: (f64, f64) = (0.03, 1.5);
/// The range of a mixed trace's p95 over mean.
const MIXED_TAIL: (f64, f64) = (1.15, 1.25);
/// Chance per step that a mixed trace's pool changes.
const MIXED_POOL_CHANGE: f64 = 0.025;

/// The [`Shape::Mixed`] trace: a power-curve rise with independent noise and bursts, a p95
/// drawn per step, and a pool changing in eighths of `spec.gpus` (whole nodes), never below a
/// quarter of it.
fn mixed(spec: &SynthSpec) -> Trace {
    let mut state = spec.seed ^ 0x006d_6978_6564;
    let power = 0.5 + 1.5 * uniform(&mut state);
    let node = spec.gpus_per_node.max(1);
    let unit = (spec.gpus / 8 / node).max(1) * node;
    let (min, max) = ((spec.gpus / 4).max(unit).min(spec.gpus), spec.gpus);
    let mut pool = max;
    let rows = (0..spec.steps)
        .map(|t| {
            let x = t as f64 / (spec.steps.max(2) - 1) as f64;
            let shock = (uniform(&mut state) - 0.5) * (12.0f64).sqrt() * MIXED_NOISE;
            let burst = if uniform(&mut state) < MIXED_BURST.0 { MIXED_BURST.1 } else { 1.0 };
            let mean =
                ((spec.from + (spec.to - spec.from) * x.powf(power)) * (1.0 + shock) * burst).clamp(1.0, spec.max_len);
            let tail = MIXED_TAIL.0 + (MIXED_TAIL.1 - MIXED_TAIL.0) * uniform(&mut state);
            if t > 0 && uniform(&mut state) < MIXED_POOL_CHANGE {
                let delta = unit * (1 + u32::from(uniform(&mut state) < 0.3));
                // Takes are likelier while the pool is full, returns while it is short.
                let take = uniform(&mut state) < f64::from(pool - min + 1) / f64::from(max - min + 2);
                pool = if take { pool.saturating_sub(delta).max(min) } else { (pool + delta).min(max) };
            }
            TraceRow {
                step: t,
                seq_len_mean: Some((mean * 10.0).round() / 10.0),
                seq_len_p95: Some(((mean * tail).min(spec.max_len).max(mean) * 10.0).round() / 10.0),
                available_gpus: spec.pool.then_some(pool),
            }
        })
        .collect();
    Trace { rows }
}

/// The paper's 26-step trace: lengths from 1,147 to 3,722 tokens (a straight rise with the same
/// noise), pool 16 → 32 → 8 → 16 → 32 GPUs (the pool scaled by `gpus / 32`).
fn paper26(spec: &SynthSpec) -> Trace {
    const STEPS: u64 = 26;
    const POOLS: [(u64, u32); 5] = [(0, 16), (5, 32), (11, 8), (15, 16), (20, 32)];
    let scale = f64::from(spec.gpus) / 32.0;
    let mut state = spec.seed ^ 0x0070_6170_6572;
    let rows = (0..STEPS)
        .map(|t| {
            let base = 1147.0 + (3722.0 - 1147.0) * t as f64 / (STEPS - 1) as f64;
            let wobble = if t == 0 || t == STEPS - 1 { 0.0 } else { (uniform(&mut state) - 0.5) * 0.06 };
            let mean = (base * (1.0 + wobble)).round();
            let pool = POOLS.iter().rev().find(|(s, _)| *s <= t).map_or(32, |p| p.1);
            TraceRow {
                step: t,
                seq_len_mean: Some(mean),
                seq_len_p95: Some((mean * TAIL).min(spec.max_len).round()),
                available_gpus: Some(((f64::from(pool) * scale).round() as u32).max(1)),
            }
        })
        .collect();
    Trace { rows }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn traces_are_deterministic_and_shaped_as_asked() {
        let spec = SynthSpec { shape: Shape::Both, steps: 1000, gpus: 1024, ..SynthSpec::default() };
        let a = synthesize(&spec);
        assert_eq!(a, synthesize(&spec));
        assert_ne!(a, synthesize(&SynthSpec { seed: 2, ..spec }));
        let first = a.rows[0].seq_len_mean.unwrap();
        let last = a.rows[999].seq_len_mean.unwrap();
        assert!((450.0..560.0).contains(&first) && (7200.0..8192.0).contains(&last), "{first} {last}");
        let pools: Vec<u32> = a.rows.iter().map(|r| r.available_gpus.unwrap()).collect();
        assert!(pools.iter().all(|&p| (512..=1024).contains(&p) && p % 8 == 0));
        let changes = pools.windows(2).filter(|w| w[0] != w[1]).count();
        assert!((5..=60).contains(&changes), "{changes} pool changes");
        assert!(a.rows.iter().all(|r| r.seq_len_p95.unwrap() >= r.seq_len_mean.unwrap()));
        let growth = synthesize(&SynthSpec { shape: Shape::Growth, ..spec });
        assert!(growth.rows.iter().all(|r| r.available_gpus == Some(1024)));
        let p = synthesize(&SynthSpec { shape: Shape::Paper26, gpus: 32, ..spec });
        assert_eq!(p.rows.len(), 26);
        assert_eq!((p.rows[0].seq_len_mean, p.rows[25].seq_len_mean), (Some(1147.0), Some(3722.0)));
        let pools: Vec<u32> = p.rows.iter().map(|r| r.available_gpus.unwrap()).collect();
        assert_eq!((pools.iter().min(), pools.iter().max()), (Some(&8), Some(&32)));
    }

    #[test]
    fn published_curves_pass_through_their_anchors() {
        let spec =
            SynthSpec { shape: Shape::R1Zero, steps: 1001, max_len: 32768.0, pool: false, ..SynthSpec::default() };
        let t = synthesize(&spec);
        // Within the noise (3%, autocorrelated) of the anchors at 0, 40% and 100% of the run.
        for (step, want) in [(0usize, 1000.0), (400, 4500.0), (1000, 15000.0)] {
            let got = t.rows[step].seq_len_mean.unwrap();
            assert!((got / want - 1.0).abs() < 0.12, "step {step}: {got} vs {want}");
        }
        assert!(t.rows.iter().all(|r| r.available_gpus.is_none()));
        let d = synthesize(&SynthSpec { shape: Shape::DeepScaleR, ..spec });
        let dip = d.rows[150].seq_len_mean.unwrap();
        assert!(dip < 0.75 * d.rows[0].seq_len_mean.unwrap(), "the 8K phase's drop: {dip}");
        let p95 = d.rows[10].seq_len_p95.unwrap() / d.rows[10].seq_len_mean.unwrap();
        assert!((p95 - LONG_COT_TAIL).abs() < 1e-9);
        let e = synthesize(&SynthSpec { shape: Shape::Elastic, steps: 2000, gpus: 64, pool: true, ..spec });
        let pools: Vec<u32> = e.rows.iter().map(|r| r.available_gpus.unwrap()).collect();
        assert_eq!(pools[0], 32, "starts at half");
        assert_eq!(*pools.iter().max().unwrap(), 64, "granted the whole pool within 2,000 steps");
        assert!(pools.iter().all(|p| p % 8 == 0));
    }

    #[test]
    fn mixed_traces_grow_noisily_while_the_pool_moves_by_nodes_above_a_quarter() {
        let spec = SynthSpec {
            shape: Shape::Mixed,
            steps: 400,
            gpus: 64,
            from: 1000.0,
            to: 6000.0,
            max_len: 16384.0,
            ..SynthSpec::default()
        };
        let t = synthesize(&spec);
        assert_eq!(t, synthesize(&spec));
        let mean = |r: &TraceRow| r.seq_len_mean.unwrap();
        let head: f64 = t.rows[..20].iter().map(mean).sum::<f64>() / 20.0;
        let tail: f64 = t.rows[380..].iter().map(mean).sum::<f64>() / 20.0;
        assert!((900.0..1300.0).contains(&head) && (5000.0..6600.0).contains(&tail), "{head} {tail}");
        for r in &t.rows {
            let ratio = r.seq_len_p95.unwrap() / mean(r);
            assert!((1.149..1.251).contains(&ratio), "step {}: p95/mean {ratio}", r.step);
        }
        let pools: Vec<u32> = t.rows.iter().map(|r| r.available_gpus.unwrap()).collect();
        assert!(pools.iter().all(|&p| (16..=64).contains(&p) && p % 8 == 0), "{pools:?}");
        let changes = pools.windows(2).filter(|w| w[0] != w[1]).count();
        assert!((3..=25).contains(&changes), "{changes} pool changes");
        let big = synthesize(&SynthSpec { gpus: 1024, ..spec });
        let pools: Vec<u32> = big.rows.iter().map(|r| r.available_gpus.unwrap()).collect();
        assert!(pools.iter().all(|&p| (256..=1024).contains(&p) && p % 128 == 0), "{pools:?}");
    }
}
