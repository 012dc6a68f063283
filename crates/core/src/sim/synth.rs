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

use super::trace::{Trace, TraceRow};

/// The kind of trace.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Shape {
    /// Response lengths grow; the pool is fixed.
    Growth,
    /// The pool changes; lengths are fixed.
    Spot,
    /// Both.
    Both,
    /// The paper's 26-step trace of growth and pool changes (8–32 GPUs).
    Paper26,
}

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
    if spec.shape == Shape::Paper26 {
        return paper26(spec);
    }
    let grow = matches!(spec.shape, Shape::Growth | Shape::Both);
    let spot = matches!(spec.shape, Shape::Spot | Shape::Both);
    let lengths = lengths(spec, grow);
    let pools = spot.then(|| spot_pool(spec));
    let rows = (0..spec.steps)
        .map(|t| {
            let mean = lengths[t as usize];
            TraceRow {
                step: t,
                seq_len_mean: Some(mean),
                seq_len_p95: Some((mean * TAIL).min(spec.max_len).max(mean)),
                available_gpus: spec.pool.then(|| pools.as_ref().map_or(spec.gpus, |p| p[t as usize])),
            }
        })
        .collect();
    Trace { rows }
}

/// Mean lengths: a logistic rise from `from` to `to` (flat at `from` without growth), times
/// AR(1) noise.
fn lengths(spec: &SynthSpec, grow: bool) -> Vec<f64> {
    let mut state = spec.seed ^ 0x6c65_6e67;
    let mut noise = 0.0;
    let logistic = |x: f64| 1.0 / (1.0 + (-8.0 * (x - 0.5)).exp());
    let (lo, hi) = (logistic(0.0), logistic(1.0));
    (0..spec.steps)
        .map(|t| {
            let x = t as f64 / (spec.steps.max(2) - 1) as f64;
            let share = if grow { (logistic(x) - lo) / (hi - lo) } else { 0.0 };
            let (sd, rho) = NOISE;
            // A centred uniform with the right standard deviation.
            let shock = (uniform(&mut state) - 0.5) * (12.0f64).sqrt() * sd;
            noise = rho * noise + (1.0 - rho * rho).sqrt() * shock;
            ((spec.from + (spec.to - spec.from) * share) * (1.0 + noise)).clamp(1.0, spec.max_len)
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
}
