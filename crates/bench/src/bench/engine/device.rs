//! `nereus bench engine --device …`: the engine on one rank's device (bf16 through the kernels
//! and the vendor GEMMs, its shards in the device shard store), and the three numbers the device
//! engine's floors name (docs/benchmarks.md):
//!
//! - **engine GEMMs against the bare library GEMM at the same shapes.** Library: every product of
//!   a training step ([`step_gemms`]) issued alone, bf16 output, nothing accumulated. Engine: the
//!   same products as the engine issues them (`linear_forward`, then `linear_backward` adding
//!   the input gradient in bf16 and the weight gradient in f32). The forward products are the
//!   same call in both, so only the backward's choices can cost anything.
//! - **model FLOP utilisation of a training step**: the step's counted FLOPs (GEMMs and causal
//!   attention) per second over the dense peak of the cluster file given.
//! - **decode against the HBM roofline**: the bytes one decode step must read (the bf16 weights,
//!   less an untied embedding table, of which only the tokens' rows are read, and the KV cache
//!   at the steps' mean context) over the cluster file's HBM bandwidth, against the measured
//!   step time (generating `new` tokens less generating one, per step).
//!
//! - **the step's host round trips**: every phase's launches, driver allocations, host waits and
//!   host↔device bytes, counted by the device; after the warm-up round no phase allocates, and
//!   a training step waits for the device at most twice.
//!
//! On the grid emulator every number is measured and reported, but only the counts' floors
//! apply (they do not depend on speed): it checks that the benchmark runs and that the step
//! makes no round trip a GPU would pay for, not how fast a GPU is.

use std::time::Instant;

use super::kernels::{self, ClassCheck};
use super::measure::{
    attention_flops, operand, step_gemms, time_phases, train_once, Gemm as StepGemm, PassCounts, Peaks, Phases, Row,
    STOP_CHECK_EVERY,
};
use crate::bench::Floor;
use nereus_core::config::{DeviceChoice, Dtype};
use nereus_core::cost::reference::{self, Residence};
use nereus_core::cost::MemoryItem;
use nereus_core::model::{Architecture, Catalogue, Layout, LocalShape, OutputHead, Position};
use nereus_core::plan::{ModelStage, Role, Stage};
use nereus_exec::backend::blas::{Gemm, GemmOut};
use nereus_exec::backend::gpu::{Device, DeviceArray, DeviceCounters};
use nereus_exec::emu::{Counters, DeviceMemory, EmuSet};
use nereus_exec::engine::compute::{Compute, InputGrad, OnDevice};
use nereus_exec::engine::{init_shard, with_device_params, EngineError, Op, Replica};
use nereus_runtime::device::Plane;
use nereus_runtime::RuntimeError;

/// The model and batch a device benchmark runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EngineShape {
    /// Two blocks 128 wide, 2 × 64 tokens, decode 4 × (8 + 8): seconds on the grid emulator.
    Tiny,
    /// The Llama-3.2-1B shape (16 blocks, 2048 wide, 32 query / 8 key-value heads of 64,
    /// SwiGLU 8192, 128,256-token vocabulary, tied embeddings; 1.24 B parameters), one
    /// 4,096-token sequence; decode 64 sequences of 128 + 128 tokens.
    Llama1b,
}

nereus_core::named_enum!(EngineShape { Tiny => "tiny", Llama1b => "llama1b" });

/// A shape's model, training batch (sequences, tokens) and decode (sequences, prompt, new).
struct Sizes {
    arch: Architecture,
    batch: (usize, usize),
    decode: (usize, usize, usize),
}

impl EngineShape {
    /// The token steps the decode row spans (every new token less the first).
    pub(super) fn decode_token_steps(self) -> u64 {
        self.sizes().decode.2.max(2) as u64 - 1
    }

    /// The shape's model.
    #[cfg(test)]
    pub(super) fn arch(self) -> Architecture {
        self.sizes().arch
    }

    fn sizes(self) -> Sizes {
        let lm = |vocab, hidden, layers, heads, kv_heads, head_dim, ffn, tie_embeddings| Architecture {
            vocab,
            hidden,
            layers,
            heads,
            kv_heads,
            head_dim,
            ffn,
            tie_embeddings,
            qk_norm: false,
            head: OutputHead::Lm,
            dtype: Dtype::Bf16,
        };
        match self {
            EngineShape::Tiny => {
                Sizes { arch: lm(512, 128, 2, 4, 2, 32, 352, false), batch: (2, 64), decode: (4, 8, 8) }
            }
            EngineShape::Llama1b => {
                Sizes { arch: lm(128_256, 2048, 16, 32, 8, 64, 8192, true), batch: (1, 4096), decode: (64, 128, 128) }
            }
        }
    }
}

/// The benchmark on the device plane: rank 0 measures, other ranks return at once.
pub struct DeviceBench {
    /// Measured repetitions after one warm-up.
    pub reps: usize,
    /// Model and batch.
    pub shape: EngineShape,
    /// Which device was asked for (floors apply on GPUs only).
    pub choice: DeviceChoice,
    /// Peaks for MFU and the roofline, if a cluster file was given.
    pub peaks: Option<Peaks>,
}

/// What the benchmark measured on rank 0: a title, rows, floors, and the cost model's
/// predictions for the kernel table's classes.
pub struct Measured {
    /// The table's title.
    pub title: String,
    /// Phases, then the kernel families of one training step.
    pub rows: Vec<Row>,
    /// Floors computed from the rows.
    pub floors: Vec<Floor>,
    /// The cost model's prediction per class beside the measurement (with a cluster file).
    pub checks: Vec<ClassCheck>,
}

impl DeviceBench {
    /// Runs on this rank's device plane, with shards in `memory`.
    pub(super) fn run(self, plane: &mut Plane<'_>, memory: DeviceMemory) -> Result<Option<Measured>, RuntimeError> {
        use nereus_exec::comm::DataPlane;
        if plane.rank() != 0 {
            return Ok(None);
        }
        let Sizes { arch, batch: (b, t), decode: (db, dp, dn) } = self.shape.sizes();
        let ms = ModelStage::new(Role::Actor, Stage::Training);
        let catalogue = Catalogue::new(arch.clone());
        let params = catalogue.parameter_count();
        let mut set = EmuSet::in_memory(0, 1, u64::MAX / 2, [(Role::Actor, catalogue)].into_iter().collect(), memory);
        let id = set.create(plane, ms, Layout::new(1, 1), &[0], Counters::default(), |shard, cat| {
            init_shard(shard, cat, 3).map_err(|e| e.to_string())
        })?;
        let replica = Replica::new(plane, &set, id, t.max(dp + dn))?;
        let (library, engine) = time_gemms(&mut set, &replica, &arch, b * t, self.reps)?;
        let device = set.store().memory().shared_device();
        let counters = || Some(device.counters());
        let phases = time_phases(&*plane, &mut set, &replica, &arch, (b, t, db, dp, dn), self.reps, &counters)?;
        let mut rows = rows(&arch, (b, t, db, dp, dn), params, (library, engine), &phases, self.peaks);
        // Decode's span holds the token steps after the first (see `rows`).
        let mut floors = step_floors(&phases, dn.max(2) as u64 - 1);
        if self.choice != DeviceChoice::Emulated {
            floors.extend(speed_floors(&rows));
        }
        device.reset_peak();
        device.open_profile();
        let stepped = train_once(&*plane, &mut set, &replica, &arch, (b, t));
        let times = device.close_profile();
        stepped?;
        if let Some(step) = rows.iter_mut().find(|r| r.phase == "train_step") {
            step.peak_bytes = Some(device.allocated_bytes().1);
            step.predicted_peak_bytes = Some(predicted_step_peak(&arch, (b, t), params));
        }
        let reference = step_gemms(&arch, b * t).iter().map(StepGemm::flops).sum::<f64>() / library;
        let (families, checks) = kernels::table(&times?, &arch, (b, t), params, reference, self.peaks);
        rows.extend(families);
        if self.choice != DeviceChoice::Emulated {
            floors.extend(checks.iter().flat_map(ClassCheck::floors));
        }
        let title = format!(
            "device engine ({:?}): {params} parameters in bf16; batch {b} x {t} tokens; decode {db} x ({dp} + {dn})",
            self.choice
        );
        Ok(Some(Measured { title, rows, floors, checks }))
    }
}

/// The cost model's peak of one training step of `b × t` tokens on one device holding all
/// `params` (`cost/reference.rs`): the state it keeps and the step's buffers.
fn predicted_step_peak(arch: &Architecture, (b, t): (usize, usize), params: u64) -> u64 {
    let shape = LocalShape::of(arch, Layout::new(1, 1), Position { tp: 0, pp: 0 });
    let step = reference::training(&shape, params, b as u64, 1, t as u64, 1, 0, Residence::Device);
    reference::state(params, arch.dtype, true).plus(&step).total()
}

/// Times `f` after one warm-up run: `runs` back to back, then one wait for the device.
fn per_run(device: &Device, runs: usize, mut f: impl FnMut() -> Result<(), EngineError>) -> Result<f64, EngineError> {
    f()?;
    device.synchronize()?;
    let start = Instant::now();
    for _ in 0..runs.max(1) {
        f()?;
    }
    device.synchronize()?;
    Ok(start.elapsed().as_secs_f64() / runs.max(1) as f64)
}

/// The host benchmark's operand values ([`super::operand`]), rounded to bf16 on the compute.
fn filled<'d>(c: &mut OnDevice<'d, '_, '_>, len: usize, seed: f32) -> Result<DeviceArray<'d, u16>, EngineError> {
    let mut x = c.zeros(MemoryItem::Activations, len)?;
    let values = operand(len, seed);
    c.modify(&mut x, |v| {
        v.copy_from_slice(&values);
        Ok(())
    })?;
    Ok(x)
}

/// Seconds of every product of a training step on `n` tokens, issued bare and through the
/// engine's linear layers (each distinct layer shape timed once, weighted by its count).
fn time_gemms(
    set: &mut EmuSet<DeviceMemory>,
    replica: &Replica,
    arch: &Architecture,
    n: usize,
    reps: usize,
) -> Result<(f64, f64), RuntimeError> {
    // Every linear layer contributes its forward product first (see `step_gemms`).
    let layers: Vec<(usize, usize)> = step_gemms(arch, n).iter().step_by(3).map(|g| (g.k, g.n)).collect();
    let mut distinct: Vec<((usize, usize), usize)> = Vec::new();
    for shape in layers {
        match distinct.iter_mut().find(|(s, _)| *s == shape) {
            Some((_, count)) => *count += 1,
            None => distinct.push((shape, 1)),
        }
    }
    let runs = reps.max(1) * 2;
    Ok(with_device_params(set, replica, |c, _| {
        let (mut library, mut engine) = (0.0, 0.0);
        for &((inp, out), count) in &distinct {
            let (x, dy, w) = (filled(c, n * inp, 1.0)?, filled(c, n * out, 2.0)?, filled(c, out * inp, 3.0)?);
            let (mut y, mut dx, dw16) = (
                c.zeros(MemoryItem::Activations, n * out)?,
                c.zeros(MemoryItem::Activations, n * inp)?,
                c.zeros(MemoryItem::Activations, out * inp)?,
            );
            let dw = c.stats(MemoryItem::Gradients, out * inp)?;
            let (wv, mut gv, range) = (w.view(), dw.view(), 0..out * inp);
            let device = c.device();
            let bare = |m, k, n, op_a, op_b| Gemm { m, k, n, op_a, op_b, out: GemmOut::Bf16 { accumulate: false } };
            let products = [
                (bare(n, inp, out, Op::N, Op::T), x.ptr(), w.ptr(), y.ptr()),
                (bare(n, out, inp, Op::N, Op::N), dy.ptr(), w.ptr(), dx.ptr()),
                (bare(out, n, inp, Op::T, Op::N), dy.ptr(), x.ptr(), dw16.ptr()),
            ];
            library += count as f64
                * per_run(device, runs, || {
                    for (g, a, b, out) in &products {
                        // SAFETY: each buffer holds the product's operand or output.
                        unsafe { device.gemm(g, *a, *b, *out)? };
                    }
                    Ok(())
                })?;
            engine += count as f64
                * per_run(device, runs, || {
                    c.linear_forward(&mut y, &x, (&wv, &range), n, inp, out)?;
                    c.linear_backward(InputGrad::Write(&mut dx), (&mut gv, &range), &dy, &x, (&wv, &range), n, inp, out)
                })?;
        }
        Ok((library, engine))
    })?)
}

/// Bytes one decode step reads at context `context`: the bf16 weights (an untied embedding
/// table only for the tokens' rows) and every sequence's KV cache.
fn decode_bytes(arch: &Architecture, params: u64, sequences: u64, context: f64) -> f64 {
    let untied_embedding = if arch.tie_embeddings { 0 } else { arch.vocab * arch.hidden };
    let weights = 2 * (params - untied_embedding);
    let kv = sequences as f64 * arch.layers as f64 * 2.0 * arch.kv_width() as f64 * context * 2.0;
    weights as f64 + kv
}

fn rows(
    arch: &Architecture,
    (b, t, db, dp, dn): (usize, usize, usize, usize, usize),
    params: u64,
    (library, engine): (f64, f64),
    p: &Phases,
    peaks: Option<Peaks>,
) -> Vec<Row> {
    let n = (b * t) as u64;
    let gemm_flops: f64 = step_gemms(arch, b * t).iter().map(StepGemm::flops).sum();
    let attention = attention_flops(arch, b, t);
    let reference = gemm_flops / library;
    let row = |phase: &str, tokens: u64, seconds: f64, flops: f64| {
        let mut r = Row::new(phase, tokens, seconds, flops, reference);
        r.fraction_of_peak = peaks.filter(|_| flops > 0.0).map(|pk| flops / seconds / pk.flops);
        r
    };
    let steps = dn.max(2) as u64 - 1;
    let mut decode = row("decode", db as u64 * steps, p.decode_step * steps as f64, 0.0);
    let context = dp as f64 + dn as f64 / 2.0;
    let roofline = |pk: Peaks| decode_bytes(arch, params, db as u64, context) / pk.hbm_bytes_per_s;
    decode.fraction_of_roofline = peaks.map(|pk| roofline(pk) / p.decode_step);
    let counted = |mut r: Row, counts: Option<DeviceCounters>| {
        r.counts = counts.map(PassCounts::from);
        r
    };
    let c = p.counts;
    decode.launches_per_token = c.map(|c| c.decode_launches() as f64 / steps as f64);
    decode.kernels_per_token = c.map(|c| c.decode_kernels() as f64 / steps as f64);
    decode.syncs_per_token = c.map(|c| c.decode_syncs() as f64 / steps as f64);
    vec![
        row("gemm_library", n, library, gemm_flops),
        row("gemm_engine", n, engine, gemm_flops),
        counted(row("forward", n, p.forward, gemm_flops / 3.0 + attention / 3.0), c.map(|c| c.forward)),
        row("backward", n, (p.step - p.forward).max(1e-9), 2.0 * (gemm_flops + attention) / 3.0),
        counted(row("train_step", n, p.step, gemm_flops + attention), c.map(|c| c.step)),
        counted(row("prefill", (db * dp) as u64, p.prefill, 0.0), c.map(|c| c.prefill)),
        // Decode's span: generating every new token less generating one.
        counted(decode, c.map(|c| c.decode())),
    ]
}

/// The floors a step's device counts are held to, on every device the emulated one included:
/// no driver allocation once the first round has warmed the cache, at most two host waits in a
/// training step (reading the loss and the gradient norm for the log line), and at most one
/// per [`STOP_CHECK_EVERY`] generated tokens (the finished flags).
fn step_floors(p: &Phases, token_steps: u64) -> Vec<Floor> {
    let Some(c) = p.counts else { return Vec::new() };
    let syncs_per_token = c.decode_syncs() as f64 / token_steps.max(1) as f64;
    vec![
        Floor::at_most("allocations_after_warmup", c.allocations_after_warmup as f64, 0.0, "allocations"),
        Floor::at_most("syncs_per_train_step", c.most_syncs_per_step as f64, 2.0, "host waits"),
        Floor::at_most("syncs_per_token", syncs_per_token, 1.0 / STOP_CHECK_EVERY as f64, "host waits"),
    ]
}

/// The device engine's speed floors, from the rows (GPUs only).
fn speed_floors(rows: &[Row]) -> Vec<Floor> {
    let find = |phase: &str| rows.iter().find(|r| r.phase == phase);
    let mut out = Vec::new();
    if let Some(r) = find("gemm_engine") {
        out.push(Floor::at_least("engine_gemm_fraction_of_library", r.fraction_of_gemm, 0.8, "ratio"));
    }
    if let Some(mfu) = find("train_step").and_then(|r| r.fraction_of_peak) {
        out.push(Floor::at_least("train_step_mfu", mfu, 0.35, "ratio"));
    }
    if let Some(roofline) = find("decode").and_then(|r| r.fraction_of_roofline) {
        out.push(Floor::at_least("decode_fraction_of_hbm_roofline", roofline, 0.5, "ratio"));
    }
    out
}
