//! The `nereus` command line: one SPMD binary, started by `srun` or `mpirun` (or by hand).
//!
//! This file only parses arguments; `nereus::runtime` does the work on every rank.

use clap::{Args, Parser, Subcommand};
use log::LevelFilter;
use std::path::PathBuf;
use std::process::ExitCode;

use nereus::config::{Algorithm, Overrides, PolicyMode};
use nereus::runtime::bench::scaling::ScalingOptions;
use nereus::runtime::checkpoint::ResumeFrom;
use nereus::runtime::logprobs::LogprobsOptions;
use nereus::runtime::plan::PlanRequest;
use nereus::runtime::train::TrainOptions;
use nereus::runtime::{self, Command, DeviceChoice, LogOptions, SessionOptions};

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
    /// Run an RL job (PPO, GRPO, ReMax) on the reference engine with a fixed plan (under
    /// mpirun/srun); one line per step, JSON lines in <output_dir>/metrics.jsonl.
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
    /// Measure the runtime's machinery (run under mpirun/srun).
    #[command(subcommand)]
    Bench(BenchCommand),
    /// Check the runtime's machinery on this job's ranks.
    #[command(subcommand)]
    Selftest(SelftestCommand),
}

#[derive(Subcommand, Debug)]
enum BenchCommand {
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
static ALLOCATOR: nereus::runtime::alloc_meter::MeteredAllocator = nereus::runtime::alloc_meter::MeteredAllocator;

fn main() -> ExitCode {
    let cli = Cli::parse();
    if let Some(t) = cli.collective_timeout {
        if !(t.is_finite() && t > 0.0 && t <= nereus::config::check::MAX_TIMEOUT_S) {
            let (most, t) = (nereus::config::check::MAX_TIMEOUT_S, nereus::config::check::show(t));
            eprintln!("nereus: error: --collective-timeout must be a positive number of seconds up to {most} (one week), got {t}");
            return ExitCode::from(runtime::EXIT_USAGE);
        }
    }
    let options = SessionOptions {
        log: LogOptions { level: cli.log_level, all_ranks: cli.log_all_ranks },
        collective_timeout_s: cli.collective_timeout,
    };
    let command = match cli.command {
        TopCommand::Inspect(InspectCommand::Config { file, overrides }) => {
            Command::InspectConfig { config: file, overrides: overrides.into() }
        }
        TopCommand::Inspect(InspectCommand::Topology { json }) => Command::InspectTopology { json },
        TopCommand::Plan { file, gpus, seq_len, from_seq_len, from_gpus, json, overrides } => Command::Plan {
            config: file,
            overrides: overrides.into(),
            request: PlanRequest { gpus, seq_len, from_seq_len, from_gpus, json },
        },
        TopCommand::Train { file, resume, resume_reset_optimizer, overrides } => Command::Train {
            config: file,
            overrides: overrides.into(),
            options: TrainOptions { resume, reset_optimizer: resume_reset_optimizer },
        },
        TopCommand::Logprobs { dir, tokens, json, tp, pp, micro_batch } => {
            Command::Logprobs(LogprobsOptions { dir, tokens, json, tp, pp, micro_batch })
        }
        TopCommand::Bench(BenchCommand::Primitives { sizes_mib, reps, json, device }) => {
            Command::BenchPrimitives { sizes_mib, reps: reps.max(1), json, device: device.device }
        }
        TopCommand::Bench(BenchCommand::TransitionPlanning { config, ranks, reps, json }) => {
            Command::BenchTransitionPlanning { config, ranks, reps, json }
        }
        TopCommand::Bench(BenchCommand::Engine { reps, json }) => Command::BenchEngine { reps, json },
        TopCommand::Bench(BenchCommand::Scaling { small, dir, launcher, reps, cases, json }) => {
            Command::BenchScaling(ScalingOptions { small, dir, launcher, reps, cases, json })
        }
        TopCommand::Bench(BenchCommand::ScalingRestore { dir }) => Command::BenchScalingRestore { dir },
        TopCommand::Bench(BenchCommand::Coordination { trials, seed, json }) => {
            Command::BenchCoordination { trials, seed, json }
        }
        TopCommand::Bench(BenchCommand::Calibration { cluster, steps, out_dir, json }) => {
            Command::BenchCalibration { cluster, steps, out_dir, json }
        }
        TopCommand::Bench(BenchCommand::Planner { config, seq_len, reps, json }) => {
            Command::BenchPlanner { config, seq_len, reps, json }
        }
        TopCommand::Selftest(SelftestCommand::Transitions { cases, seed, device }) => {
            Command::SelftestTransitions { cases, seed, device: device.device }
        }
        TopCommand::Selftest(SelftestCommand::Engine) => Command::SelftestEngine,
        TopCommand::Selftest(SelftestCommand::Primitives { cases, seed, device }) => {
            Command::SelftestPrimitives { cases, seed, device: device.device }
        }
    };
    ExitCode::from(runtime::run(options, command))
}
