//! What both engine benchmarks (the host's and a device's) measure and count: the rows, the
//! products and attention FLOPs of a training step, and the timed passes.

use std::time::Instant;

use serde::Serialize;

use crate::bench::median;
use nereus_core::model::Architecture;
use nereus_exec::backend::gpu::DeviceCounters;
use nereus_exec::comm::DataPlane;
use nereus_exec::emu::EmuSet;
use nereus_exec::engine::{
    train_step, AdamW, Batch, CrossEntropy, EngineError, EngineMemory, Op, Replica, Sampling, StopIds, Wave,
};
use nereus_runtime::RuntimeError;

/// Token steps between a device's reads of the finished flags in the benchmark's decode (the
/// engine's default, `[train] stop_check_every`).
pub const STOP_CHECK_EVERY: usize = 16;

/// The device's dense bf16 peak and HBM bandwidth (from a cluster file).
#[derive(Debug, Clone, Copy)]
pub struct Peaks {
    /// FLOP/s.
    pub flops: f64,
    /// Bytes per second.
    pub hbm_bytes_per_s: f64,
}

/// One measured phase.
#[derive(Debug, Clone, Serialize)]
pub struct Row {
    /// `forward`, `backward`, `train_step`, `decode`, `gemm_reference`, or a kernel family of
    /// one training step (`kernels:gemm`, …; see `engine/kernels.rs`).
    pub phase: String,
    /// Tokens processed per run.
    pub tokens: u64,
    /// Median seconds per run.
    pub seconds: f64,
    /// Tokens per second.
    pub tokens_per_second: f64,
    /// Counted FLOPs per run.
    pub flops: f64,
    /// Achieved GFLOP/s.
    pub gflops_per_second: f64,
    /// Achieved FLOP/s over the GEMM crate's FLOP/s on the step's shapes (on a device: over
    /// the bare library GEMM's).
    pub fraction_of_gemm: f64,
    /// Achieved FLOP/s over the device's dense peak (model FLOP utilisation; on a device with
    /// a cluster file).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub fraction_of_peak: Option<f64>,
    /// The HBM roofline's time over the measured time (decode on a device with a cluster file).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub fraction_of_roofline: Option<f64>,
    /// What the device did over the phase's span (on a device).
    #[serde(flatten, skip_serializing_if = "Option::is_none")]
    pub counts: Option<PassCounts>,
    /// Launch calls per token step, one token of every sequence (decode on a device): one
    /// where the step is a replayed graph.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub launches_per_token: Option<f64>,
    /// Kernels and GEMMs the device ran per token step (decode on a device).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub kernels_per_token: Option<f64>,
    /// Host waits per token step (decode on a device).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub syncs_per_token: Option<f64>,
    /// Launches of a kernel family in one training step (the `kernels:*` rows).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub kernel_launches: Option<u64>,
    /// The bytes a memory-bound kernel family must move in one training step, at the least
    /// (the `kernels:*` rows; `fraction_of_roofline` is their HBM time over the measured).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub bytes: Option<f64>,
    /// The most the device's allocator held during one training step: parameters, optimizer
    /// state, gradients and the step's buffers (`train_step` on a device; on the peer's row,
    /// PyTorch's `max_memory_allocated`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub peak_bytes: Option<u64>,
    /// The cost model's prediction of `peak_bytes` (`cost/reference.rs`; `train_step` on a
    /// device).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub predicted_peak_bytes: Option<u64>,
}

/// What a device did over one measured span: the overheads a GPU profile is read against.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct PassCounts {
    /// Launch calls the host made: kernels, GEMM library calls and recorded graphs.
    pub launches: u64,
    /// Kernels and GEMMs the device ran (those inside graph launches included).
    pub kernels: u64,
    /// Device allocations asked of the runtime (not those the cache served).
    pub allocations: u64,
    /// Times the host waited for the device (stream synchronizations and upload waits).
    pub syncs: u64,
    /// Bytes that crossed the host link, both ways.
    pub host_device_bytes: u64,
    /// Bytes zeroed on the device by memsets (buffers cleared before use).
    pub memset_bytes: u64,
}

impl From<DeviceCounters> for PassCounts {
    fn from(c: DeviceCounters) -> PassCounts {
        PassCounts {
            launches: c.launches + c.gemms + c.graph_launches,
            kernels: c.launches + c.gemms + c.graph_kernels + c.graph_gemms,
            allocations: c.allocations,
            syncs: c.host_waits(),
            host_device_bytes: c.host_device_bytes(),
            memset_bytes: c.zeroed_bytes,
        }
    }
}

impl Row {
    /// A phase of `tokens` in `seconds` doing `flops`, against `reference` FLOP/s.
    pub fn new(phase: &str, tokens: u64, seconds: f64, flops: f64, reference: f64) -> Row {
        Row {
            phase: phase.into(),
            tokens,
            seconds,
            tokens_per_second: tokens as f64 / seconds,
            flops,
            gflops_per_second: flops / seconds / 1e9,
            fraction_of_gemm: if flops > 0.0 { flops / seconds / reference } else { 0.0 },
            fraction_of_peak: None,
            fraction_of_roofline: None,
            counts: None,
            launches_per_token: None,
            kernels_per_token: None,
            syncs_per_token: None,
            kernel_launches: None,
            bytes: None,
            peak_bytes: None,
            predicted_peak_bytes: None,
        }
    }
}

/// One matrix product `C[m,n] = op(A)·op(B)` of a training step.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Gemm {
    /// Rows of the product.
    pub m: usize,
    /// The contracted dimension.
    pub k: usize,
    /// Columns of the product.
    pub n: usize,
    /// Whether `A` is stored transposed.
    pub a: Op,
    /// Whether `B` is stored transposed.
    pub b: Op,
}

impl Gemm {
    pub fn flops(&self) -> f64 {
        2.0 * (self.m * self.k * self.n) as f64
    }
}

/// Every product of one training step on `n` tokens: per linear layer `(in, out)` the forward
/// `x·Wᵀ`, and backward `dy·W` and `dyᵀ·x` (the engine's `linear_forward/_backward`).
pub fn step_gemms(a: &Architecture, n: usize) -> Vec<Gemm> {
    let (c, q, kv, f, v) =
        (a.hidden as usize, a.q_width() as usize, a.kv_width() as usize, a.ffn as usize, a.vocab as usize);
    // Q, k and v are one product over their adjacent weights, as are gate and up, as the engine
    // issues them.
    let block = [(c, q + 2 * kv), (q, c), (c, 2 * f), (f, c)];
    let linears = (0..a.layers).flat_map(|_| block).chain([(c, v)]);
    linears
        .flat_map(|(inp, out)| {
            [
                Gemm { m: n, k: inp, n: out, a: Op::N, b: Op::T },
                Gemm { m: n, k: out, n: inp, a: Op::N, b: Op::N },
                Gemm { m: out, k: n, n: inp, a: Op::T, b: Op::N },
            ]
        })
        .collect()
}

/// Attention FLOPs of a training step: `2·D·T(T+1)` forward (scores and values, causal) per
/// sequence, head and block, and twice that backward.
pub fn attention_flops(a: &Architecture, b: usize, t: usize) -> f64 {
    3.0 * (a.layers as usize * b * a.heads as usize * 2 * a.head_dim as usize * t * (t + 1)) as f64
}

/// `len` benchmark operand values in ±0.1 from `seed` (not zeros, which multiply faster on
/// some hardware and draw less power on a GPU).
pub fn operand(len: usize, seed: f32) -> Vec<f32> {
    (0..len).map(|i| (i as f32 * 0.37 + seed).sin() * 0.1).collect()
}

/// What the device did in each phase of the last measured round, and over every round after
/// the warm-up.
#[derive(Debug, Clone, Copy, Default)]
pub struct PhaseCounts {
    /// The forward pass.
    pub forward: DeviceCounters,
    /// The training step.
    pub step: DeviceCounters,
    /// Generation of one new token.
    pub prefill: DeviceCounters,
    /// Generation of all new tokens.
    pub generate: DeviceCounters,
    /// Device allocations asked of the runtime in every phase of every round after the first.
    pub allocations_after_warmup: u64,
    /// The most host waits one training step made (after the first round).
    pub most_syncs_per_step: u64,
}

impl PhaseCounts {
    /// Decode's span: generating every new token less generating one.
    pub fn decode(&self) -> DeviceCounters {
        self.generate.since(&self.prefill)
    }

    /// Launch calls over decode's span (GEMM library calls and graph launches included).
    pub fn decode_launches(&self) -> u64 {
        PassCounts::from(self.decode()).launches
    }

    /// Kernels and GEMMs the device ran over decode's span.
    pub fn decode_kernels(&self) -> u64 {
        PassCounts::from(self.decode()).kernels
    }

    /// Host waits over decode's span.
    pub fn decode_syncs(&self) -> u64 {
        self.decode().host_waits()
    }
}

/// Median seconds of the phases of one replica's step.
pub struct Phases {
    /// A forward pass over the training batch.
    pub forward: f64,
    /// A training step.
    pub step: f64,
    /// Generation of one new token (the prompts' prefill).
    pub prefill: f64,
    /// One decode step: generating all new tokens less generating one, per token.
    pub decode_step: f64,
    /// What the device did (on a device).
    pub counts: Option<PhaseCounts>,
}

/// `count` token ids the benchmarks train and prompt on (spread over the vocabulary).
fn bench_tokens(arch: &Architecture, count: usize) -> Vec<u32> {
    (0..count).map(|i| (nereus_core::rng::mix(i as u64) % arch.vocab) as u32).collect()
}

/// One training step of `b` sequences of `t` tokens, as [`time_phases`] times them.
pub fn train_once<M: EngineMemory, P: DataPlane>(
    plane: &P,
    set: &mut EmuSet<M>,
    replica: &Replica,
    arch: &Architecture,
    (b, t): (usize, usize),
) -> Result<(), EngineError> {
    let tokens = bench_tokens(arch, b * t);
    let batch = Batch { tokens: &tokens, seq_len: t, starts: &[] };
    let objective = CrossEntropy { sequences: b, seq_len: t };
    train_step(plane, set, replica, &batch, b, &objective, &AdamW::default()).map(drop)
}

/// Median seconds of a forward pass, a training step, a prefill (one new token) and one decode
/// step of `replica` in memory `M`, over `reps` rounds after a warm-up: the same passes the RL
/// step runs, on the host or a device (whose passes end with a wait for the device). On a
/// device, `counters` reads its [`DeviceCounters`] (on the host it gives `None`).
pub fn time_phases<M: EngineMemory, P: DataPlane>(
    plane: &P,
    set: &mut EmuSet<M>,
    replica: &Replica,
    arch: &Architecture,
    (b, t, db, dp, dn): (usize, usize, usize, usize, usize),
    reps: usize,
    counters: &dyn Fn() -> Option<DeviceCounters>,
) -> Result<Phases, RuntimeError> {
    let tokens = bench_tokens(arch, (b * t).max(db * dp));
    let batch = Batch { tokens: &tokens[..b * t], seq_len: t, starts: &[] };
    let objective = CrossEntropy { sequences: b, seq_len: t };
    let opt = AdamW::default();
    let ids: Vec<u64> = (0..db as u64).collect();
    // EOS outside the vocabulary: every sequence decodes all its tokens.
    let sampling = |new| Sampling {
        temperature: 1.0,
        top_p: 1.0,
        min_p: 0.0,
        top_k: 0,
        max_new_tokens: new,
        eos: arch.vocab as u32,
        also_stop: StopIds::NONE,
        greedy: true,
        seed: 1,
        stop_check_every: STOP_CHECK_EVERY,
    };
    let wave = [Wave { prompts: tokens[..db * dp].to_vec(), starts: Vec::new(), ids }];
    // Seconds and device counts of one pass.
    let timed = |f: &mut dyn FnMut() -> Result<(), EngineError>| -> Result<(f64, Option<DeviceCounters>), EngineError> {
        let (start, before) = (Instant::now(), counters());
        f()?;
        let seconds = start.elapsed().as_secs_f64();
        Ok((seconds, counters().zip(before).map(|(after, before)| after.since(&before))))
    };
    let mut runs: [Vec<f64>; 4] = Default::default();
    let mut counts: Option<PhaseCounts> = None;
    for rep in 0..=reps.max(1) {
        let (forward, fc) = timed(&mut || M::infer(plane, set, replica, &batch, b).map(drop))?;
        let (step, sc) = timed(&mut || train_step(plane, set, replica, &batch, b, &objective, &opt).map(drop))?;
        let (prefill, pc) = timed(&mut || M::generate(plane, set, replica, &wave, &sampling(1)).map(drop))?;
        let (full, gc) = timed(&mut || M::generate(plane, set, replica, &wave, &sampling(dn)).map(drop))?;
        // The decode steps are the difference, and a small shape's are shorter than its prefill:
        // a stall while one prefill was timed (tests run beside each other on two cores) could
        // make it zero. So the prefill is timed on both sides of the full decode and the
        // quicker of the two is taken.
        let (again, _) = timed(&mut || M::generate(plane, set, replica, &wave, &sampling(1)).map(drop))?;
        let prefill = prefill.min(again);
        // The first round warms the allocator, the libraries' heuristics and the caches.
        if rep > 0 {
            let decode_step = (full - prefill).max(0.0) / (dn.max(2) - 1) as f64;
            for (k, v) in [forward, step, prefill, decode_step].into_iter().enumerate() {
                runs[k].push(v);
            }
            if let (Some(forward), Some(step), Some(prefill), Some(generate)) = (fc, sc, pc, gc) {
                let earlier = counts.unwrap_or_default();
                let allocations = [forward, step, prefill, generate].iter().map(|c| c.allocations).sum::<u64>();
                counts = Some(PhaseCounts {
                    forward,
                    step,
                    prefill,
                    generate,
                    allocations_after_warmup: earlier.allocations_after_warmup + allocations,
                    most_syncs_per_step: earlier.most_syncs_per_step.max(step.host_waits()),
                });
            }
        }
    }
    let [forward, step, prefill, decode_step] = runs.map(median);
    Ok(Phases { forward, step, prefill, decode_step, counts })
}
