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

pub mod device;
pub mod kernels;
pub mod measure;
pub mod peer;

use peer::{Peer, PeerOutcome};

use super::{machine, median, BenchReport, Floor};
use device::{DeviceBench, EngineShape, Measured};
use kernels::ClassCheck;
use measure::{attention_flops, operand, step_gemms, time_phases, Gemm, Peaks, Phases, Row};
use nereus_core::config::Dtype;
use nereus_core::config::{load_cluster_file, DeviceChoice};
use nereus_core::model::{Architecture, Catalogue, Layout, OutputHead};
use nereus_core::plan::{ModelStage, Role, Stage};
use nereus_exec::emu::{Counters, EmuSet};
use nereus_exec::engine::{init_shard, matmul, Replica};
use nereus_runtime::{RuntimeError, Session};

/// Sequences and positions of the training batch.
const BATCH: (usize, usize) = (4, 256);
/// Decode: sequences, prompt tokens, new tokens.
const DECODE: (usize, usize, usize) = (8, 16, 64);

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
#[derive(Debug, Clone)]
pub struct Options {
    /// Measured repetitions after one warm-up (the median is reported).
    pub reps: usize,
    /// Also write the report as JSON.
    pub json: Option<PathBuf>,
    /// Run the bf16 engine on the rank's device instead (`emulated`, `cuda`, `rocm`).
    pub device: Option<DeviceChoice>,
    /// The device benchmark's model and batch (default: `tiny` on the emulator, `llama1b` on a
    /// GPU).
    pub shape: Option<EngineShape>,
    /// A cluster file whose `device_peak_tflops` and `device_hbm_gbps` give the model FLOP
    /// utilisation and the decode roofline (with `--device`).
    pub cluster: Option<PathBuf>,
    /// A peer run on the same shape in the same run, its rows and floors beside ours (with
    /// `--device`; [`peer`]).
    pub peer: Option<Peer>,
}

/// Runs the benchmark on every rank with `args`.
pub fn run(session: &mut Session, args: &Options) -> Result<(), RuntimeError> {
    match args.device {
        None => benchmark(session, args.reps, args.json.as_deref()),
        Some(choice) => on_device(session, args, choice),
    }
}

/// `--device`: the engine on each rank's device; rank 0 measures and reports.
fn on_device(session: &Session, args: &Options, choice: DeviceChoice) -> Result<(), RuntimeError> {
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
    let Some(Measured { title, mut rows, mut floors, checks }) = job.run(&mut plane, memory)? else {
        return Ok(());
    };
    // A peer that fails fails the command, after our rows are reported.
    let (peer, failed) = match args.peer.map(|Peer::Torch| peer::run_torch(shape, args.reps)) {
        Some(Ok(outcome)) => (Some(outcome), None),
        Some(Err(e)) => (None, Some(e)),
        None => (None, None),
    };
    if let Some(PeerOutcome::Ran(run)) = &peer {
        let theirs = peer::peer_rows(&rows, run, shape.decode_token_steps());
        if choice != DeviceChoice::Emulated {
            floors.extend(peer::peer_floors(&rows, &theirs));
        }
        rows.extend(theirs);
    }
    print_rows(&title, &rows)?;
    print_checks(&checks)?;
    if let Some((peak, predicted)) =
        rows.iter().find(|r| r.phase == "train_step").and_then(|r| r.peak_bytes.zip(r.predicted_peak_bytes))
    {
        let gb = |bytes: u64| bytes as f64 / 1e9;
        println!("training step memory: {:.4} GB at the allocator's peak, {:.4} GB predicted", gb(peak), gb(predicted));
    }
    match &peer {
        Some(PeerOutcome::Ran(run)) => println!(
            "peer: PyTorch {} on {}, peak memory {:.2} GB (scripts/peer-torch.py)",
            run.torch,
            run.device,
            run.peak_memory_bytes as f64 / 1e9
        ),
        Some(PeerOutcome::Absent(why)) => println!("peer torch: not run on this machine ({why}); no peer row"),
        None => {}
    }
    if choice == DeviceChoice::Emulated {
        println!("(the grid emulator: only the step's counts are held to floors, not its speed)");
    }
    BenchReport { bench: "engine".into(), machine: machine(session), rows, floors }.finish(args.json.as_deref())?;
    failed.map_or(Ok(()), Err)
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
    time_phases(&plane, &mut set, &replica, arch, (b, t, db, dp, dn), reps, &|| None)
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
        "{:<26} {:>8} {:>10} {:>12} {:>10} {:>9} {:>8} {:>9}\n",
        "phase", "tokens", "seconds", "tokens/s", "GFLOP/s", "of GEMM", "of peak", "roofline"
    );
    let optional = |x: Option<f64>| x.map_or("-".to_string(), |x| format!("{x:.3}"));
    for r in rows {
        text += &format!(
            "{:<26} {:>8} {:>10.4} {:>12.0} {:>10.2} {:>9.3} {:>8} {:>9}\n",
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

/// The cost model's predictions for the kernel table's classes beside the event timings.
fn print_checks(checks: &[ClassCheck]) -> Result<(), RuntimeError> {
    if checks.is_empty() {
        return Ok(());
    }
    let mut text = format!(
        "cost model (uncalibrated efficiencies) against the kernel table:\n{:<10} {:>10} {:>10} {:>10} {:>10} {:>10}\n",
        "class", "roofline", "predicted", "measured", "ratio", "implied"
    );
    for c in checks {
        text += &format!(
            "{:<10} {:>10.3e} {:>10.3e} {:>10.3e} {:>10.3} {:>10.3}\n",
            c.class.name(),
            c.ideal,
            c.predicted,
            c.measured,
            c.predicted / c.measured,
            c.ideal / c.measured
        );
    }
    std::io::stdout().lock().write_all(text.as_bytes()).map_err(RuntimeError::Stdout)
}
