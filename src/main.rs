//! The `nereus` command line: one SPMD binary, started by `srun` or `mpirun` (or by hand).
//!
//! This file only parses arguments; `nereus::runtime` does the work on every rank.

use clap::{Args, Parser, Subcommand};
use log::LevelFilter;
use std::path::PathBuf;
use std::process::ExitCode;

use nereus_bench::bench::{self, scaling::ScalingOptions};
use nereus_bench::selftest;
use nereus_core::config::{Algorithm, Overrides, PolicyMode};
use nereus_core::sim::synth::SynthSpec;
use nereus_core::sim::{RestartModel, Truth};
use nereus_runtime::checkpoint::ResumeFrom;
use nereus_runtime::logprobs::LogprobsOptions;
use nereus_runtime::plan::PlanRequest;
use nereus_runtime::simulate::SimulateRequest;
use nereus_runtime::train::TrainOptions;
use nereus_runtime::{self as runtime, inspect, report_selftest, DeviceChoice, LogOptions, SessionOptions};

/// Nereus: keeps an RL post-training job on the fastest memory-feasible parallel plan.
#[derive(Parser, Debug)]
#[command(name = "nereus", version, about, propagate_version = true)]
struct Cli {
    /// Log level of rank 0 (error, warn, info, debug, trace); default: RUST_LOG, else info.
    #[arg(long, global = true, value_name = "LEVEL")]
    log_level: Option<LevelFilter>,
    /// Let every rank log at that level, not only rank 0 (others log warnings and errors).
    #[arg(long, global = true)]
    log_all_ranks: bool,
    /// Seconds a collective may wait before the watchdog aborts the job
    /// (default: job.collective_timeout_s, else 300).
    #[arg(long, global = true, value_name = "SECONDS")]
    collective_timeout: Option<f64>,
    #[command(subcommand)]
    command: TopCommand,
}

#[derive(Subcommand, Debug)]
enum TopCommand {
    /// Show what a job would run with, or where its ranks sit.
    #[command(subcommand)]
    Inspect(InspectCommand),
    /// Find the fastest memory-feasible TP/PP/DP plan for a job (per model-stage).
    Plan {
        /// Job file (TOML); the embedded default when omitted.
        file: Option<PathBuf>,
        /// GPUs in the pool (default: the cluster's nodes x devices per node).
        #[arg(long)]
        gpus: Option<u32>,
        /// Response length in tokens to plan for (default: rl.max_response_len).
        #[arg(long, value_name = "TOKENS")]
        seq_len: Option<u64>,
        /// What-if: the response length the current plan was made for; prints the transition
        /// from that plan to the one for --seq-len (ΔL, L_tran, whether it can run).
        #[arg(long, value_name = "TOKENS")]
        from_seq_len: Option<u64>,
        /// What-if: the pool the current plan was made for (default: --gpus).
        #[arg(long, value_name = "N")]
        from_gpus: Option<u32>,
        /// Print JSON.
        #[arg(long)]
        json: bool,
        #[command(flatten)]
        overrides: OverrideArgs,
    },
    /// Run an RL job (PPO, GRPO, ReMax) on the reference engine (under mpirun/srun), on one
    /// plan or under the live controller; one line per step, JSON lines in
    /// <output_dir>/metrics.jsonl.
    Train {
        /// Job file (TOML); the embedded default when omitted.
        file: Option<PathBuf>,
        /// Resume from a checkpoint (any layout): a `step-N` directory, `latest` (the newest
        /// complete checkpoint of the output directory), or `auto` (that, or a fresh start when
        /// there is none: for batch scripts that requeue).
        #[arg(long, value_name = "DIR|latest|auto")]
        resume: Option<ResumeFrom>,
        /// Resume without the optimizer state: AdamW restarts from zero moments.
        #[arg(long, requires = "resume")]
        resume_reset_optimizer: bool,
        /// The ranks the job may use at the start: a count N or the index list of the first N
        /// ranks (`0-5`); `[pool] trace` and `<output_dir>/pool` take over when present.
        #[arg(long, value_name = "N|0-(N-1)")]
        pool: Option<String>,
        /// Declare this rank lost without warning at the start of `--at-step` (its state is
        /// gone; the controller replans around it, a checkpoint restores what had no replica).
        #[arg(long, value_name = "R", requires = "at_step")]
        fail_rank: Option<u32>,
        /// The step at whose start `--fail-rank` is lost.
        #[arg(long, value_name = "K", requires = "fail_rank")]
        at_step: Option<u64>,
        #[command(flatten)]
        overrides: OverrideArgs,
    },
    /// Per-token log-probabilities log p(x_t | x_<t), t >= 1 (a value model: per-position values)
    /// of token sequences under a Hugging Face model directory, on one rank or under mpirun with
    /// any layout; prints {"model": DIR, "logprobs": [[...], ...]} (or "values").
    Logprobs {
        /// The model directory (config.json and *.safetensors), e.g. a checkpoint's step-N/actor.
        dir: PathBuf,
        /// JSON file with a list of token-id sequences, e.g. [[1, 5, 9], [2, 7]].
        #[arg(long, value_name = "FILE.json")]
        tokens: PathBuf,
        /// Write the JSON here instead of standard output.
        #[arg(long, value_name = "PATH")]
        json: Option<PathBuf>,
        /// Tensor-parallel degree of each replica (the ranks form ranks / (tp x pp) replicas that
        /// share the sequences).
        #[arg(long, default_value_t = 1)]
        tp: u32,
        /// Pipeline-parallel degree of each replica.
        #[arg(long, default_value_t = 1)]
        pp: u32,
        /// Sequences per forward pass.
        #[arg(long, default_value_t = 1)]
        micro_batch: usize,
    },
    /// Simulate the job over a trace under several policies, with the live controller's code and
    /// the cost model as ground truth (one process; no MPI launch needed).
    Simulate {
        /// Job file (TOML); the embedded default when omitted.
        file: Option<PathBuf>,
        /// The trace: CSV with `step` and any of `seq_len_mean`, `seq_len_p95`, `available_gpus`.
        #[arg(long, value_name = "TRACE.csv")]
        trace: PathBuf,
        /// GPUs where the trace has no `available_gpus` (default: the cluster's devices).
        #[arg(long)]
        gpus: Option<u32>,
        /// Policies to simulate, comma-separated.
        #[arg(long, value_enum, value_delimiter = ',', default_value = "nereus,static,greedy,every-k")]
        policies: Vec<PolicyMode>,
        /// γ of the nereus policy (default: policy.gamma).
        #[arg(long, conflicts_with = "gamma_sweep")]
        gamma: Option<f64>,
        /// Several γ values for the nereus policy, comma-separated (e.g. 0,0.1,0.2,...,1).
        #[arg(long, value_delimiter = ',')]
        gamma_sweep: Vec<f64>,
        /// Efficiencies of the ground truth: JSON list of 8, or {"efficiencies": [...]}.
        #[arg(long, value_name = "EFF.json")]
        calibration: Option<PathBuf>,
        /// Seconds a checkpoint/restart costs besides the checkpoint I/O.
        #[arg(long, default_value_t = 300.0)]
        restart_s: f64,
        /// File system bandwidth of the checkpoint I/O, GB/s.
        #[arg(long, default_value_t = 10.0)]
        fs_gbps: f64,
        /// How wrong the cost model is: σ of the log of each plan's true over predicted step
        /// seconds, drawn once per plan (0: the cost model is the ground truth; bench
        /// calibration's held-out 8–13% MAPE is σ ≈ 0.1–0.16).
        #[arg(long, default_value_t = 0.0, value_name = "SIGMA")]
        model_error: f64,
        /// Relative step-to-step jitter of the ground truth (standard deviation).
        #[arg(long, default_value_t = 0.0, value_name = "SIGMA")]
        noise: f64,
        /// Seed of the model error and jitter draws.
        #[arg(long, default_value_t = 1)]
        seed: u64,
        /// Write {"runs": [...]} here.
        #[arg(long, value_name = "PATH")]
        json: Option<PathBuf>,
        /// Write one JSON line per simulated step here.
        #[arg(long, value_name = "PATH")]
        jsonl: Option<PathBuf>,
        /// Write the plot here (PATH.svg and PATH.png).
        #[arg(long, value_name = "PATH")]
        plot: Option<PathBuf>,
        #[command(flatten)]
        overrides: OverrideArgs,
    },
    /// Traces for `nereus simulate`.
    #[command(subcommand)]
    Trace(TraceCommand),
    /// Measure the runtime's machinery (run under mpirun/srun).
    #[command(subcommand)]
    Bench(BenchCommand),
    /// Check the runtime's machinery on this job's ranks.
    #[command(subcommand)]
    Selftest(SelftestCommand),
}

#[derive(Subcommand, Debug)]
enum TraceCommand {
    /// Write a synthetic trace shaped like the paper's: length growth (Fig. 4a), spot pool
    /// changes (Fig. 3), both, or the 26-step trace of §6.3.
    Synth {
        /// The CSV file to write.
        out: PathBuf,
        /// The shape.
        #[arg(long, value_enum, default_value = "growth")]
        shape: nereus_core::sim::synth::Shape,
        /// Steps (paper26 has 26).
        #[arg(long, default_value_t = 1000)]
        steps: u64,
        /// The full pool, GPUs.
        #[arg(long, default_value_t = 1024)]
        gpus: u32,
        /// GPUs per node (the unit of spot changes).
        #[arg(long, default_value_t = 8)]
        gpus_per_node: u32,
        /// Mean response length at the start, tokens.
        #[arg(long, default_value_t = 500.0)]
        from: f64,
        /// Mean response length at the end, tokens.
        #[arg(long, default_value_t = 8000.0)]
        to: f64,
        /// Longest response (p95 is cut there), tokens.
        #[arg(long, default_value_t = 8192.0)]
        max_len: f64,
        /// Seed of the noise and the spot events.
        #[arg(long, default_value_t = 1)]
        seed: u64,
        /// Leave out the available_gpus column (the pool then comes from `simulate --gpus`).
        #[arg(long)]
        no_pool: bool,
    },
}

#[derive(Subcommand, Debug)]
enum BenchCommand {
    /// Plan selection on 8–64 GPUs and transition scheduling on DAGs of up to 64 primitives
    /// against exact MILPs solved by HiGHS (build with --features exact): gap and time ratio.
    Solver {
        /// The job to plan (run from the repository root for the default).
        #[arg(long, default_value = "configs/llama3.1-8b-ppo.toml")]
        config: PathBuf,
        /// Repetitions per instance of our searches and of plan selection's MILP (the median is
        /// reported; a DAG's MILP is solved once).
        #[arg(long, default_value_t = 3)]
        reps: usize,
        /// Seconds each DAG-scheduling MILP may run before it reports its best schedule and bound.
        #[arg(long, default_value_t = 60.0)]
        time_limit: f64,
        /// Also write the report as JSON.
        #[arg(long, value_name = "PATH")]
        json: Option<PathBuf>,
    },
    /// The simulator: a 1,000-step length-growth trace, four policies, at 1,024 and 16,384 GPUs.
    Simulate {
        /// The job to simulate (run from the repository root for the default).
        #[arg(long, default_value = "configs/llama3.1-8b-ppo.toml")]
        config: PathBuf,
        /// The trace (its available_gpus column, if any, is replaced by each size).
        #[arg(long, default_value = "configs/traces/growth-1000.csv")]
        trace: PathBuf,
        /// Also write the report as JSON.
        #[arg(long, value_name = "PATH")]
        json: Option<PathBuf>,
    },
    /// Forward, backward, training-step and decode throughput of the CPU engine on one rank,
    /// and its FLOP/s against the GEMM crate's on the step's own shapes.
    Engine {
        /// Measured repetitions after one warm-up (the median is reported).
        #[arg(long, default_value_t = 3)]
        reps: usize,
        /// Also write the report as JSON.
        #[arg(long, value_name = "PATH")]
        json: Option<PathBuf>,
    },
    /// Split/Merge/Extend/Destroy bytes, time and bandwidth vs point-to-point (>= 2 ranks; with
    /// --device, also the pack/unpack kernels vs the device's copy engine, from 1 rank).
    Primitives {
        /// Unit sizes in MiB, comma-separated.
        #[arg(long, value_delimiter = ',', default_value = "1,4,16,64,256,1024")]
        sizes_mib: Vec<u64>,
        /// Measured repetitions per size after one warm-up (the median is reported).
        #[arg(long, default_value_t = 5)]
        reps: usize,
        /// Also write the report as JSON.
        #[arg(long, value_name = "PATH")]
        json: Option<PathBuf>,
        #[command(flatten)]
        device: DeviceArg,
    },
    /// Scaling a PPO job's training state (two 50M+-parameter models, θ and Adam moments):
    /// DP 2→4→8 ranks, 8→4, and a reshard, each by the transition DAG, by checkpoint/restart
    /// (UCP-style, a fresh mpirun) and tensor by tensor (Tenplex-style), against the
    /// point-to-point bandwidth (mpirun -n 8).
    Scaling {
        /// A state of a few MB (tests) instead of the 50M+-parameter models.
        #[arg(long)]
        small: bool,
        /// Where the checkpoint/restart method writes its checkpoints (replaced per case).
        #[arg(long, value_name = "DIR", default_value = "runs/bench-scaling")]
        dir: PathBuf,
        /// The launcher of the restarted job; `-n N`, this binary and its arguments follow.
        #[arg(long, value_name = "COMMAND", default_value = "mpirun --oversubscribe")]
        launcher: String,
        /// Measurements of the DAG and of the per-tensor baseline per case (the median is
        /// reported; checkpoint/restart runs once).
        #[arg(long, default_value_t = 3)]
        reps: usize,
        /// Only these cases (extend-2-4, extend-4-8, destroy-8-4, reshard-tp2-pp2,
        /// reshard-tp2-pp2-dp2), comma-separated.
        #[arg(long, value_delimiter = ',')]
        cases: Vec<String>,
        /// Also write the report as JSON.
        #[arg(long, value_name = "PATH")]
        json: Option<PathBuf>,
    },
    /// The restarted job of `bench scaling` (launched by it).
    #[command(hide = true)]
    ScalingRestore {
        /// The checkpoint directory.
        dir: PathBuf,
    },
    /// Global transition DAG build time from 32 to 16,384 ranks, and its gap to the best order.
    TransitionPlanning {
        /// The job whose plans change (run from the repository root for the default).
        #[arg(long, default_value = "configs/llama3.1-8b-ppo.toml")]
        config: PathBuf,
        /// Pool sizes (ranks), comma-separated.
        #[arg(long, value_delimiter = ',', default_value = "32,64,128,256,512,1024,2048,4096,8192,16384")]
        ranks: Vec<u32>,
        /// Repetitions per size (the median is reported).
        #[arg(long, default_value_t = 5)]
        reps: usize,
        /// Also write the report as JSON.
        #[arg(long, value_name = "PATH")]
        json: Option<PathBuf>,
    },
    /// The three overlap types, 100 trials each, Nereus vs the per-component baseline (8 ranks).
    Coordination {
        /// Trials per overlap type.
        #[arg(long, default_value_t = 100)]
        trials: u32,
        /// Seed of the random placements and delays.
        #[arg(long, default_value_t = 1)]
        seed: u64,
        /// Also write the report as JSON.
        #[arg(long, value_name = "PATH")]
        json: Option<PathBuf>,
    },
    /// The cost model calibrated on this machine: the tiny PPO job under 16 fixed plans on 4 and
    /// 8 ranks, efficiencies fitted on half, the other half predicted (mpirun -n 8).
    Calibration {
        /// Cluster file whose detected figures the start-up probes measure.
        #[arg(long, default_value = "configs/clusters/local-detect.toml")]
        cluster: PathBuf,
        /// Training steps per plan (the first is a warm-up and not measured).
        #[arg(long, default_value_t = 8)]
        steps: u32,
        /// Where the plans' runs are written (replaced).
        #[arg(long, default_value = "runs/bench-calibration")]
        out_dir: PathBuf,
        /// Also write the report as JSON.
        #[arg(long, value_name = "PATH")]
        json: Option<PathBuf>,
    },
    /// The time of one controller decision: the tiny job's recorded run, and Llama-3.1-8B PPO
    /// at 1,024 and 16,384 GPUs from modelled monitor records.
    Controller {
        /// The large job (run from the repository root for the defaults).
        #[arg(long, default_value = "configs/llama3.1-8b-ppo.toml")]
        config: PathBuf,
        /// Also write the report as JSON.
        #[arg(long, value_name = "PATH")]
        json: Option<PathBuf>,
    },
    /// Replan time and peak memory of the plan search from 8 to 16,384 GPUs.
    Planner {
        /// The job to plan (run from the repository root for the default).
        #[arg(long, default_value = "configs/llama3.1-8b-ppo.toml")]
        config: PathBuf,
        /// Response length in tokens to plan for.
        #[arg(long, default_value_t = 4096)]
        seq_len: u64,
        /// Repetitions per size (the median is reported).
        #[arg(long, default_value_t = 5)]
        reps: usize,
        /// Also write the report as JSON.
        #[arg(long, value_name = "PATH")]
        json: Option<PathBuf>,
    },
}

#[derive(Subcommand, Debug)]
enum SelftestCommand {
    /// Random plan pairs executed as global transition DAGs; checks targets and digests.
    Transitions {
        /// Random cases to run.
        #[arg(long, default_value_t = 20)]
        cases: u32,
        /// Seed of the random decisions (rank 0's draw is broadcast).
        #[arg(long, default_value_t = 1)]
        seed: u64,
        #[command(flatten)]
        device: DeviceArg,
    },
    /// Every (tp, pp, dp) with degrees in {1, 2, 4} that fits the world trains one step of a
    /// tiny LM and value model; parameters and gradients must match (1, 1, 1) within 1e-5.
    Engine,
    /// Random Split/Merge/Extend/Destroy sequences; checks digests, bytes and refusals.
    Primitives {
        /// Random cases to run.
        #[arg(long, default_value_t = 20)]
        cases: u32,
        /// Seed of the random decisions (same on every rank).
        #[arg(long, default_value_t = 1)]
        seed: u64,
        #[command(flatten)]
        device: DeviceArg,
    },
}

/// `--device[=KIND]`: device-resident state over the GPU data plane.
#[derive(Args, Debug, Clone)]
struct DeviceArg {
    /// Keep shards in device memory and move them over NCCL/RCCL: `auto` (the backend this
    /// binary has; the default when the flag has no value), `cuda`, `rocm`, or `emulated` (host
    /// memory posing as a device over MPI, to test the device path without a GPU).
    #[arg(long, value_name = "KIND", num_args = 0..=1, default_missing_value = "auto", value_parser = parse_device)]
    device: Option<DeviceChoice>,
}

fn parse_device(s: &str) -> Result<DeviceChoice, String> {
    s.parse()
}

#[derive(Subcommand, Debug)]
enum InspectCommand {
    /// Validate a job config on every rank and print it resolved (CLI > TOML > defaults).
    Config {
        /// Job file (TOML); the embedded default (configs/tiny-ppo.toml) when omitted.
        file: Option<PathBuf>,
        #[command(flatten)]
        overrides: OverrideArgs,
    },
    /// Print nodes, packages, NUMA domains, cores, GPUs and each rank's binding and device.
    Topology {
        /// Print JSON instead of a table.
        #[arg(long)]
        json: bool,
    },
}

/// Flags that override keys of the job file.
#[derive(Args, Debug, Clone)]
struct OverrideArgs {
    /// Overrides job.seed.
    #[arg(long)]
    seed: Option<u64>,
    /// Overrides job.steps.
    #[arg(long)]
    steps: Option<u32>,
    /// Overrides job.output_dir.
    #[arg(long, value_name = "DIR")]
    output_dir: Option<PathBuf>,
    /// Overrides rl.algorithm (ppo, grpo, remax).
    #[arg(long, value_parser = parse_algorithm)]
    algorithm: Option<Algorithm>,
    /// Overrides policy.mode: off, nereus, static, every-k or greedy.
    #[arg(long, value_enum)]
    policy: Option<PolicyMode>,
    /// Cluster file replacing the job file's [cluster] table (e.g. configs/clusters/lumi-g.toml).
    #[arg(long, value_name = "FILE")]
    cluster: Option<PathBuf>,
    /// Overrides cluster.nodes.
    #[arg(long)]
    nodes: Option<u32>,
}

fn parse_algorithm(s: &str) -> Result<Algorithm, String> {
    match s {
        "ppo" => Ok(Algorithm::Ppo),
        "grpo" => Ok(Algorithm::Grpo),
        "remax" => Ok(Algorithm::Remax),
        other => Err(format!("unknown algorithm `{other}`; expected ppo, grpo or remax")),
    }
}

impl From<OverrideArgs> for Overrides {
    fn from(a: OverrideArgs) -> Overrides {
        Overrides {
            seed: a.seed,
            steps: a.steps,
            output_dir: a.output_dir,
            algorithm: a.algorithm,
            policy: a.policy,
            cluster_file: a.cluster,
            nodes: a.nodes,
        }
    }
}

/// Heap metering for `nereus bench planner`'s peak-memory figure.
#[global_allocator]
static ALLOCATOR: nereus_bench::alloc_meter::MeteredAllocator = nereus_bench::alloc_meter::MeteredAllocator;

fn main() -> ExitCode {
    let cli = Cli::parse();
    if let Some(t) = cli.collective_timeout {
        if !(t.is_finite() && t > 0.0 && t <= nereus_core::config::check::MAX_TIMEOUT_S) {
            let (most, t) = (nereus_core::config::check::MAX_TIMEOUT_S, nereus_core::config::check::show(t));
            eprintln!("nereus: error: --collective-timeout must be a positive number of seconds up to {most} (one week), got {t}");
            return ExitCode::from(runtime::EXIT_USAGE);
        }
    }
    let options = SessionOptions {
        log: LogOptions { level: cli.log_level, all_ranks: cli.log_all_ranks },
        collective_timeout_s: cli.collective_timeout,
    };
    let code = match cli.command {
        TopCommand::Inspect(InspectCommand::Config { file, overrides }) => {
            let overrides: Overrides = overrides.into();
            runtime::run(options, |s| inspect::config(s, file.as_deref(), &overrides))
        }
        TopCommand::Inspect(InspectCommand::Topology { json }) => runtime::run(options, |s| inspect::topology(s, json)),
        TopCommand::Plan { file, gpus, seq_len, from_seq_len, from_gpus, json, overrides } => {
            let request = PlanRequest { gpus, seq_len, from_seq_len, from_gpus, json };
            let overrides: Overrides = overrides.into();
            runtime::run(options, |s| runtime::plan::run(s, file.as_deref(), &overrides, &request))
        }
        TopCommand::Train { file, resume, resume_reset_optimizer, pool, fail_rank, at_step, overrides } => {
            let train = TrainOptions {
                resume,
                reset_optimizer: resume_reset_optimizer,
                pool,
                fail_rank,
                fail_at_step: at_step,
            };
            let overrides: Overrides = overrides.into();
            runtime::run(options, |s| runtime::train::run(s, file.as_deref(), &overrides, &train))
        }
        TopCommand::Logprobs { dir, tokens, json, tp, pp, micro_batch } => {
            let request = LogprobsOptions { dir, tokens, json, tp, pp, micro_batch };
            runtime::run(options, |s| runtime::logprobs::run(s, &request))
        }
        TopCommand::Simulate {
            file,
            trace,
            gpus,
            policies,
            gamma,
            gamma_sweep,
            calibration,
            restart_s,
            fs_gbps,
            model_error,
            noise,
            seed,
            json,
            jsonl,
            plot,
            overrides,
        } => {
            let request = SimulateRequest {
                trace,
                gpus,
                policies,
                gammas: if gamma_sweep.is_empty() { gamma.into_iter().collect() } else { gamma_sweep },
                calibration,
                restart: RestartModel { fs_bytes_per_s: fs_gbps * 1e9, restart_s },
                truth: Truth { model_error, noise, seed },
                json,
                jsonl,
                plot,
            };
            let overrides: Overrides = overrides.into();
            runtime::run(options, |s| runtime::simulate::run(s, file.as_deref(), &overrides, &request))
        }
        TopCommand::Trace(TraceCommand::Synth {
            out,
            shape,
            steps,
            gpus,
            gpus_per_node,
            from,
            to,
            max_len,
            seed,
            no_pool,
        }) => {
            let spec = SynthSpec { shape, steps, gpus, gpus_per_node, from, to, max_len, seed, pool: !no_pool };
            runtime::run(options, |s| runtime::simulate::synth(s, &spec, &out))
        }
        TopCommand::Bench(BenchCommand::Solver { config, reps, time_limit, json }) => {
            runtime::run(options, |s| bench::solver::run(s, &config, reps, time_limit, json.as_deref()))
        }
        TopCommand::Bench(BenchCommand::Simulate { config, trace, json }) => {
            runtime::run(options, |s| bench::simulate::run(s, &config, &trace, json.as_deref()))
        }
        TopCommand::Bench(BenchCommand::Primitives { sizes_mib, reps, json, device }) => runtime::run(options, |s| {
            bench::primitives::run(s, &sizes_mib, reps.max(1), json.as_deref(), device.device)
        }),
        TopCommand::Bench(BenchCommand::TransitionPlanning { config, ranks, reps, json }) => {
            runtime::run(options, |s| bench::transition::run(s, &config, &ranks, reps, json.as_deref()))
        }
        TopCommand::Bench(BenchCommand::Engine { reps, json }) => {
            runtime::run(options, |s| bench::engine::run(s, reps, json.as_deref()))
        }
        TopCommand::Bench(BenchCommand::Scaling { small, dir, launcher, reps, cases, json }) => {
            let scaling = ScalingOptions { small, dir, launcher, reps, cases, json };
            runtime::run(options, |s| bench::scaling::run(s, &scaling))
        }
        TopCommand::Bench(BenchCommand::ScalingRestore { dir }) => {
            runtime::run(options, |s| bench::scaling::restore(s, &dir))
        }
        TopCommand::Bench(BenchCommand::Coordination { trials, seed, json }) => {
            runtime::run(options, |s| bench::coordination::run(s, trials, seed, json.as_deref()))
        }
        TopCommand::Bench(BenchCommand::Calibration { cluster, steps, out_dir, json }) => {
            runtime::run(options, |s| bench::calibration::run(s, &cluster, steps, &out_dir, json.as_deref()))
        }
        TopCommand::Bench(BenchCommand::Controller { config, json }) => {
            runtime::run(options, |s| bench::controller::run(s, &config, json.as_deref()))
        }
        TopCommand::Bench(BenchCommand::Planner { config, seq_len, reps, json }) => {
            runtime::run(options, |s| bench::planner::run(s, &config, seq_len, reps, json.as_deref()))
        }
        TopCommand::Selftest(SelftestCommand::Transitions { cases, seed, device }) => runtime::run(options, |s| {
            selftest::transitions(s, cases, seed, device.device).and_then(|r| report_selftest(s, &r, &r.failures))
        }),
        TopCommand::Selftest(SelftestCommand::Engine) => {
            runtime::run(options, |s| selftest::engine(s).and_then(|r| report_selftest(s, &r, &r.failures)))
        }
        TopCommand::Selftest(SelftestCommand::Primitives { cases, seed, device }) => runtime::run(options, |s| {
            selftest::primitives(s, cases, seed, device.device).and_then(|r| report_selftest(s, &r, &r.failures))
        }),
    };
    ExitCode::from(code)
}
