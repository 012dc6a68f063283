//! `nereus bench engine`: forward, backward, training-step and decode throughput of the CPU
//! reference engine on one rank, and the FLOP/s it achieves against the GEMM crate's own FLOP/s
//! on exactly the matrix shapes a training step multiplies, measured in the same run. With
//! `--device`, the same engine on the rank's device ([`device`]).
//!
//! FLOPs counted: every linear layer's products (forward `2·N·in·out`; backward twice that, for
//! the input and the weight gradients) and causal attention (`2·D·T(T+1)` per sequence and head
//! forward, twice that backward). Norms, RoPE, SwiGLU and the optimizer are not counted — their
//! time is, so the fraction is a lower bound on GEMM efficiency.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::Instant;

use serde::Serialize;

pub mod device;

use super::{machine, median, BenchReport, Floor};
use crate::DeviceArg;
use device::{DeviceBench, EngineShape, Peaks};
use nereus_core::config::Dtype;
use nereus_core::config::{load_cluster_file, DeviceChoice};
use nereus_core::model::{Architecture, Catalogue, Layout, OutputHead};
use nereus_core::plan::{ModelStage, Role, Stage};
use nereus_exec::comm::DataPlane;
use nereus_exec::emu::{Counters, EmuSet};
use nereus_exec::engine::{
    init_shard, matmul, train_step, AdamW, Batch, CrossEntropy, EngineError, EngineMemory, Op, Replica, Sampling,
    StopIds, Wave,
};
use nereus_runtime::{RuntimeError, Session};

/// Sequences and positions of the training batch.
const BATCH: (usize, usize) = (4, 256);
/// Decode: sequences, prompt tokens, new tokens.
const DECODE: (usize, usize, usize) = (8, 16, 64);

/// One measured phase.
#[derive(Debug, Clone, Serialize)]
pub struct Row {
    /// `forward`, `backward`, `train_step`, `decode`, or `gemm_reference`.
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
}

impl Row {
    /// A phase of `tokens` in `seconds` doing `flops`, against `reference` FLOP/s.
    fn new(phase: &str, tokens: u64, seconds: f64, flops: f64, reference: f64) -> Row {
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
        }
    }
}

/// The benchmark model: 4 blocks, 512 wide, 8 query / 4 key-value heads of 64, SwiGLU 1408,
/// vocabulary 4096 (about 16 M parameters).
fn bench_arch() -> Architecture {
    Architecture {
        vocab: 4096,
        hidden: 512,
        layers: 4,
        heads: 8,
        kv_heads: 4,
        head_dim: 64,
        ffn: 1408,
        tie_embeddings: false,
        qk_norm: false,
        head: OutputHead::Lm,
        dtype: Dtype::F32,
    }
}

/// One matrix product `C[m,n] = op(A)·op(B)` of a training step.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Gemm {
    m: usize,
    k: usize,
    n: usize,
    a: Op,
    b: Op,
}

impl Gemm {
    fn flops(&self) -> f64 {
        2.0 * (self.m * self.k * self.n) as f64
    }
}

/// Every product of one training step on `n` tokens: per linear layer `(in, out)` the forward
/// `x·Wᵀ`, and backward `dy·W` and `dyᵀ·x` (the engine's `linear_forward/_backward`).
fn step_gemms(a: &Architecture, n: usize) -> Vec<Gemm> {
    let (c, q, kv, f, v) =
        (a.hidden as usize, a.q_width() as usize, a.kv_width() as usize, a.ffn as usize, a.vocab as usize);
    let block = [(c, q), (c, kv), (c, kv), (q, c), (c, f), (c, f), (f, c)];
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
fn attention_flops(a: &Architecture, b: usize, t: usize) -> f64 {
    3.0 * (a.layers as usize * b * a.heads as usize * 2 * a.head_dim as usize * t * (t + 1)) as f64
}

/// `len` benchmark operand values in ±0.1 from `seed` (not zeros, which multiply faster on
/// some hardware and draw less power on a GPU).
fn operand(len: usize, seed: f32) -> Vec<f32> {
    (0..len).map(|i| (i as f32 * 0.37 + seed).sin() * 0.1).collect()
}

/// Seconds of one product of shape `g` with the GEMM crate (median of runs filling ≥ 0.2 s).
fn time_gemm(g: &Gemm) -> f64 {
    let (a, b) = (operand(g.m * g.k, 1.0), operand(g.k * g.n, 2.0));
    let mut c = vec![0f32; g.m * g.n];
    matmul(&mut c, &a, g.a, &b, g.b, g.m, g.k, g.n, false);
    let mut times = Vec::new();
    let start = Instant::now();
    while start.elapsed().as_secs_f64() < 0.2 || times.len() < 3 {
        let t = Instant::now();
        matmul(&mut c, &a, g.a, &b, g.b, g.m, g.k, g.n, false);
        times.push(t.elapsed().as_secs_f64());
    }
    median(times)
}

/// Forward, backward, training-step and decode throughput of the CPU engine on one rank,
/// and its FLOP/s against the GEMM crate's on the step's own shapes.
#[derive(Debug, Clone, clap::Args)]
pub struct Args {
    /// Measured repetitions after one warm-up (the median is reported).
    #[arg(long, default_value_t = 3)]
    pub reps: usize,
    /// Also write the report as JSON.
    #[arg(long, value_name = "PATH")]
    pub json: Option<PathBuf>,
    /// Run the bf16 engine on the rank's device instead (`emulated`, `cuda`, `rocm`).
    #[command(flatten)]
    pub device: DeviceArg,
    /// The device benchmark's model and batch (default: `tiny` on the emulator, `llama1b` on a
    /// GPU).
    #[arg(long, value_enum, requires = "device")]
    pub shape: Option<EngineShape>,
    /// A cluster file whose `device_peak_tflops` and `device_hbm_gbps` give the model FLOP
    /// utilisation and the decode roofline (with `--device`).
    #[arg(long, value_name = "FILE", requires = "device")]
    pub cluster: Option<PathBuf>,
}

/// Runs the benchmark on every rank with `args`.
pub fn run(session: &mut Session, args: &Args) -> Result<(), RuntimeError> {
    match args.device.device {
        None => benchmark(session, args.reps, args.json.as_deref()),
        Some(choice) => on_device(session, args, choice),
    }
}

/// `--device`: the engine on each rank's device; rank 0 measures and reports.
fn on_device(session: &Session, args: &Args, choice: DeviceChoice) -> Result<(), RuntimeError> {
    let peaks = match &args.cluster {
        None => None,
        Some(path) => {
            let c = load_cluster_file(path)?;
            let missing = |key: &str| RuntimeError::Usage(format!("{} sets no cluster.{key}", path.display()));
            let tflops = c.device_peak_tflops.ok_or_else(|| missing("device_peak_tflops"))?;
            let gbps = c.device_hbm_gbps.ok_or_else(|| missing("device_hbm_gbps"))?;
            Some(Peaks { flops: tflops * 1e12, hbm_bytes_per_s: gbps * 1e9 })
        }
    };
    let shape =
        args.shape.unwrap_or(if choice == DeviceChoice::Emulated { EngineShape::Tiny } else { EngineShape::Llama1b });
    let job = DeviceBench { reps: args.reps, shape, choice, peaks };
    let (mut plane, memory) = nereus_runtime::device::open_device(session, choice)?;
    let Some((title, rows, floors)) = job.run(&mut plane, memory)? else {
        return Ok(());
    };
    print_rows(&title, &rows)?;
    if choice == DeviceChoice::Emulated {
        println!("(the grid emulator: no floor applies)");
    }
    BenchReport { bench: "engine".into(), machine: machine(session), rows, floors }.finish(args.json.as_deref())
}

/// Runs the benchmark on rank 0 (other ranks return at once).
fn benchmark(session: &Session, reps: usize, json: Option<&Path>) -> Result<(), RuntimeError> {
    if session.rank() != 0 {
        return Ok(());
    }
    let arch = bench_arch();
    let (b, t) = BATCH;
    let n = b * t;
    let p = time_host_phases(session, &arch, reps)?;
    let gemms = step_gemms(&arch, n);
    let (gemm_flops, gemm_seconds) = gemm_reference(&gemms);
    let reference = gemm_flops / gemm_seconds;
    let attention = attention_flops(&arch, b, t);
    let row = |phase: &str, tokens: u64, seconds: f64, flops: f64| Row::new(phase, tokens, seconds, flops, reference);
    let (db, dp, dn) = DECODE;
    let steps = dn.max(2) as u64 - 1;
    let rows = vec![
        row("gemm_reference", n as u64, gemm_seconds, gemm_flops),
        row("forward", n as u64, p.forward, gemm_flops / 3.0 + attention / 3.0),
        row("backward", n as u64, (p.step - p.forward).max(1e-9), 2.0 * (gemm_flops + attention) / 3.0),
        row("train_step", n as u64, p.step, gemm_flops + attention),
        row("prefill", (db * dp) as u64, p.prefill, 0.0),
        row("decode", db as u64 * steps, p.decode_step * steps as f64, 0.0),
    ];
    let title = format!(
        "model: {} parameters; batch {b} x {t} tokens; decode {db} x ({dp} + {dn}) tokens",
        Catalogue::new(arch).parameter_count()
    );
    print_rows(&title, &rows)?;
    let step = rows.iter().find(|r| r.phase == "train_step").map_or(0.0, |r| r.fraction_of_gemm);
    let floors = vec![Floor::at_least("train_step_fraction_of_gemm_flops", step, 0.4, "ratio")];
    BenchReport { bench: "engine".into(), machine: machine(session), rows, floors }.finish(json)
}

/// The host engine's model on one rank, its phases timed.
fn time_host_phases(session: &Session, arch: &Architecture, reps: usize) -> Result<Phases, RuntimeError> {
    let (b, t) = BATCH;
    let (db, dp, dn) = DECODE;
    let mut plane = session.control_plane();
    let ms = ModelStage::new(Role::Actor, Stage::Training);
    let mut set = EmuSet::new(0, 1, 16 << 30, [(Role::Actor, Catalogue::new(arch.clone()))].into_iter().collect());
    let id = set.create(&mut plane, ms, Layout::new(1, 1), &[0], Counters::default(), |shard, cat| {
        init_shard(shard, cat, 3).map_err(|e| e.to_string())
    })?;
    let replica = Replica::new(&mut plane, &set, id, t.max(dp + dn))?;
    time_phases(&plane, &mut set, &replica, arch, (b, t, db, dp, dn), reps)
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
}

/// Median seconds of a forward pass, a training step, a prefill (one new token) and one decode
/// step of `replica` in memory `M`, over `reps` rounds after a warm-up: the same passes the RL
/// step runs, on the host or a device (whose passes end with a wait for the device).
pub fn time_phases<M: EngineMemory, P: DataPlane>(
    plane: &P,
    set: &mut EmuSet<M>,
    replica: &Replica,
    arch: &Architecture,
    (b, t, db, dp, dn): (usize, usize, usize, usize, usize),
    reps: usize,
) -> Result<Phases, RuntimeError> {
    let tokens: Vec<u32> =
        (0..(b * t).max(db * dp)).map(|i| (nereus_core::rng::mix(i as u64) % arch.vocab) as u32).collect();
    let batch = Batch { tokens: &tokens[..b * t], seq_len: t, starts: &[] };
    let objective = CrossEntropy { sequences: b, seq_len: t };
    let opt = AdamW::default();
    let ids: Vec<u64> = (0..db as u64).collect();
    // EOS outside the vocabulary: every sequence decodes all its tokens.
    let sampling = |new| Sampling {
        temperature: 1.0,
        top_p: 1.0,
        max_new_tokens: new,
        eos: arch.vocab as u32,
        also_stop: StopIds::NONE,
        greedy: true,
        seed: 1,
    };
    let wave = [Wave { prompts: tokens[..db * dp].to_vec(), starts: Vec::new(), ids }];
    let timed = |f: &mut dyn FnMut() -> Result<(), EngineError>| -> Result<f64, EngineError> {
        let start = Instant::now();
        f()?;
        Ok(start.elapsed().as_secs_f64())
    };
    let mut runs: [Vec<f64>; 4] = Default::default();
    for rep in 0..=reps.max(1) {
        let forward = timed(&mut || M::infer(plane, set, replica, &batch, b).map(drop))?;
        let step = timed(&mut || train_step(plane, set, replica, &batch, b, &objective, &opt).map(drop))?;
        let prefill = timed(&mut || M::generate(plane, set, replica, &wave, &sampling(1)).map(drop))?;
        let full = timed(&mut || M::generate(plane, set, replica, &wave, &sampling(dn)).map(drop))?;
        // The first round warms the allocator, the libraries' heuristics and the caches.
        if rep > 0 {
            let decode_step = (full - prefill).max(0.0) / (dn.max(2) - 1) as f64;
            for (k, v) in [forward, step, prefill, decode_step].into_iter().enumerate() {
                runs[k].push(v);
            }
        }
    }
    let [forward, step, prefill, decode_step] = runs.map(median);
    Ok(Phases { forward, step, prefill, decode_step })
}

/// The FLOPs of a step's GEMMs and the seconds the GEMM crate takes for them alone (each
/// distinct shape timed once).
fn gemm_reference(gemms: &[Gemm]) -> (f64, f64) {
    let flops: f64 = gemms.iter().map(Gemm::flops).sum();
    let mut distinct: Vec<(Gemm, f64)> = Vec::new();
    for g in gemms {
        if !distinct.iter().any(|(d, _)| d == g) {
            distinct.push((*g, time_gemm(g)));
        }
    }
    let seconds = gemms.iter().map(|g| distinct.iter().find(|(d, _)| d == g).map_or(0.0, |(_, s)| *s)).sum();
    (flops, seconds)
}

fn print_rows(title: &str, rows: &[Row]) -> Result<(), RuntimeError> {
    let mut text = format!("{title}\n");
    text += &format!(
        "{:<15} {:>8} {:>10} {:>12} {:>10} {:>9} {:>8} {:>9}\n",
        "phase", "tokens", "seconds", "tokens/s", "GFLOP/s", "of GEMM", "of peak", "roofline"
    );
    let optional = |x: Option<f64>| x.map_or("-".to_string(), |x| format!("{x:.3}"));
    for r in rows {
        text += &format!(
            "{:<15} {:>8} {:>10.4} {:>12.0} {:>10.2} {:>9.3} {:>8} {:>9}\n",
            r.phase,
            r.tokens,
            r.seconds,
            r.tokens_per_second,
            r.gflops_per_second,
            r.fraction_of_gemm,
            optional(r.fraction_of_peak),
            optional(r.fraction_of_roofline)
        );
    }
    std::io::stdout().lock().write_all(text.as_bytes()).map_err(RuntimeError::Stdout)
}
