//! `nereus bench <what>`: the benchmarks of `nereus-bench`, on every rank of an MPI launch. Each
//! benchmark's flags are parsed here into the plain options its module takes.

use crate::launch::Global;

#[cfg(feature = "mpi")]
pub use flags::BenchCommand;

/// `nereus bench …` (needs the `mpi` feature).
#[cfg(not(feature = "mpi"))]
#[derive(clap::Args, Debug, Clone)]
pub struct BenchCommand {
    #[command(flatten)]
    rest: super::Unavailable,
}

/// Runs `nereus bench …` on every rank.
#[cfg(feature = "mpi")]
pub fn exec(command: BenchCommand, global: &Global) -> u8 {
    crate::launch::spmd(global, |session| flags::run(session, command))
}

/// Without the `mpi` feature: says what is missing.
#[cfg(not(feature = "mpi"))]
pub fn exec(_: BenchCommand, _: &Global) -> u8 {
    crate::launch::needs_mpi("bench")
}

#[cfg(feature = "mpi")]
mod flags {
    use std::path::PathBuf;

    use nereus_bench::bench::engine::device::EngineShape;
    use nereus_bench::bench::engine::peer::Peer;
    use nereus_bench::bench::{
        calibration, controller, coordination, engine, planner, primitives, scaling, simulate, solver, transition,
    };
    use nereus_runtime::{RuntimeError, Session};

    use crate::commands::{named, DeviceArg};

    /// `nereus bench <what>`: measure the runtime's machinery (run under mpirun/srun).
    #[derive(Debug, Clone, clap::Subcommand)]
    pub enum BenchCommand {
        /// Plan selection on 8–64 GPUs and transition scheduling on DAGs of up to 64 primitives
        /// against exact MILPs solved by HiGHS (build with --features exact): gap and time ratio.
        Solver(SolverArgs),
        /// The simulator: a 1,000-step length-growth trace, four policies, at 1,024 and 16,384 GPUs.
        Simulate(SimulateArgs),
        /// Forward, backward, training-step and decode throughput of the engine on one rank (the
        /// CPU reference, or with --device the bf16 engine on the rank's device).
        Engine(EngineArgs),
        /// Split/Merge/Extend/Destroy bytes, time and bandwidth vs point-to-point (>= 2 ranks; with
        /// --device, also the pack/unpack kernels vs the device's copy engine, from 1 rank).
        Primitives(PrimitivesArgs),
        /// Scaling a PPO job's training state (two 50M+-parameter models, θ and Adam moments):
        /// DP 2→4→8 ranks, 8→4, and a reshard, each by the transition DAG, by checkpoint/restart
        /// (UCP-style, a fresh mpirun) and tensor by tensor (Tenplex-style), against the
        /// point-to-point bandwidth (mpirun -n 8).
        Scaling(ScalingArgs),
        /// Global transition DAG build time from 32 to 16,384 ranks, and its gap to the best order.
        TransitionPlanning(TransitionArgs),
        /// The three overlap types at eight memory capacities, Nereus and the per-component
        /// baseline both executed on live EMUs (8 ranks).
        Coordination(CoordinationArgs),
        /// The cost model calibrated on this machine: the tiny PPO job under 16 fixed plans on 4 and
        /// 8 ranks, efficiencies fitted on half, the other half predicted (mpirun -n 8).
        Calibration(CalibrationArgs),
        /// The time of one controller decision: the tiny job's recorded run, and Llama-3.1-8B PPO
        /// at 1,024 and 16,384 GPUs from modelled monitor records.
        Controller(ControllerArgs),
        /// Replan time and peak memory of the plan search from 8 to 16,384 GPUs.
        Planner(PlannerArgs),
        /// The restarted job of `bench scaling` (launched by it).
        #[command(hide = true)]
        ScalingRestore {
            /// The checkpoint directory.
            dir: PathBuf,
        },
    }

    /// Runs `command` on every rank of `session`.
    pub fn run(session: &mut Session, command: BenchCommand) -> Result<(), RuntimeError> {
        match command {
            BenchCommand::Solver(args) => solver::run(session, &args.into()),
            BenchCommand::Simulate(args) => simulate::run(session, &args.into()),
            BenchCommand::Engine(args) => engine::run(session, &args.into()),
            BenchCommand::Primitives(args) => primitives::run(session, &args.into()),
            BenchCommand::Scaling(args) => scaling::run(session, &args.into()),
            BenchCommand::TransitionPlanning(args) => transition::run(session, &args.into()),
            BenchCommand::Coordination(args) => coordination::run(session, &args.into()),
            BenchCommand::Calibration(args) => calibration::run(session, &args.into()),
            BenchCommand::Controller(args) => controller::run(session, &args.into()),
            BenchCommand::Planner(args) => planner::run(session, &args.into()),
            BenchCommand::ScalingRestore { dir } => scaling::restore(session, &dir),
        }
    }

    /// `nereus bench solver`'s flags.
    #[cfg(feature = "exact")]
    #[derive(Debug, Clone, clap::Args)]
    pub struct SolverArgs {
        /// The job to plan (run from the repository root for the default).
        #[arg(long, default_value = "configs/llama3.1-8b-ppo.toml")]
        pub config: PathBuf,
        /// Repetitions per instance of our searches and of plan selection's MILP (the median is
        /// reported; a DAG's MILP is solved once).
        #[arg(long, default_value_t = 3)]
        pub reps: usize,
        /// Seconds each DAG-scheduling MILP may run before it reports its best schedule and bound.
        #[arg(long, default_value_t = 60.0)]
        pub time_limit: f64,
        /// Also write the report as JSON.
        #[arg(long, value_name = "PATH")]
        pub json: Option<PathBuf>,
    }

    #[cfg(feature = "exact")]
    impl From<SolverArgs> for solver::Options {
        fn from(a: SolverArgs) -> Self {
            solver::Options { config: a.config, reps: a.reps, time_limit: a.time_limit, json: a.json }
        }
    }

    /// `nereus bench solver` without the `exact` feature: its flags are taken as they come, so
    /// that it can say what the build lacks.
    #[cfg(not(feature = "exact"))]
    #[derive(Debug, Clone, clap::Args)]
    pub struct SolverArgs {
        #[arg(trailing_var_arg = true, allow_hyphen_values = true, hide = true)]
        args: Vec<String>,
    }

    #[cfg(not(feature = "exact"))]
    impl From<SolverArgs> for solver::Options {
        fn from(_: SolverArgs) -> Self {
            solver::Options
        }
    }

    /// The simulator: a 1,000-step length-growth trace, four policies, at 1,024 and 16,384 GPUs.
    #[derive(Debug, Clone, clap::Args)]
    pub struct SimulateArgs {
        /// The job to simulate (run from the repository root for the default).
        #[arg(long, default_value = "configs/llama3.1-8b-ppo.toml")]
        pub config: PathBuf,
        /// The trace (its available_gpus column, if any, is replaced by each size).
        #[arg(long, default_value = "configs/traces/growth-1000.csv")]
        pub trace: PathBuf,
        /// Also write the report as JSON.
        #[arg(long, value_name = "PATH")]
        pub json: Option<PathBuf>,
    }

    impl From<SimulateArgs> for simulate::Options {
        fn from(a: SimulateArgs) -> Self {
            simulate::Options { config: a.config, trace: a.trace, json: a.json }
        }
    }

    /// Forward, backward, training-step and decode throughput of the CPU engine on one rank,
    /// and its FLOP/s against the GEMM crate's on the step's own shapes.
    #[derive(Debug, Clone, clap::Args)]
    pub struct EngineArgs {
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
        #[arg(long, value_parser = named::<EngineShape>(), requires = "device")]
        pub shape: Option<EngineShape>,
        /// A cluster file whose `device_peak_tflops` and `device_hbm_gbps` give the model FLOP
        /// utilisation and the decode roofline (with `--device`).
        #[arg(long, value_name = "FILE", requires = "device")]
        pub cluster: Option<PathBuf>,
        /// Also run a peer on the same shape in the same run (`torch`: scripts/peer-torch.py,
        /// PyTorch eager and Hugging Face generate; said plainly where PyTorch or CUDA is absent).
        #[arg(long, value_parser = named::<Peer>(), requires = "device")]
        pub peer: Option<Peer>,
    }

    impl From<EngineArgs> for engine::Options {
        fn from(a: EngineArgs) -> Self {
            engine::Options {
                reps: a.reps,
                json: a.json,
                device: a.device.device,
                shape: a.shape,
                cluster: a.cluster,
                peer: a.peer,
            }
        }
    }

    /// Split/Merge/Extend/Destroy bytes, time and bandwidth vs point-to-point (>= 2 ranks; with
    /// --device, also the pack/unpack kernels vs the device's copy engine, from 1 rank).
    #[derive(Debug, Clone, clap::Args)]
    pub struct PrimitivesArgs {
        /// Unit sizes in MiB, comma-separated.
        #[arg(long, value_delimiter = ',', default_value = "1,4,16,64,256,1024")]
        pub sizes_mib: Vec<u64>,
        /// Measured repetitions per size after one warm-up (the median is reported).
        #[arg(long, default_value_t = 5)]
        pub reps: usize,
        /// Also write the report as JSON.
        #[arg(long, value_name = "PATH")]
        pub json: Option<PathBuf>,
        #[command(flatten)]
        pub device: DeviceArg,
    }

    impl From<PrimitivesArgs> for primitives::Options {
        fn from(a: PrimitivesArgs) -> Self {
            primitives::Options { sizes_mib: a.sizes_mib, reps: a.reps, json: a.json, device: a.device.device }
        }
    }

    /// `nereus bench scaling`: scaling a PPO job's training state (two 50M+-parameter models, θ
    /// and Adam moments): DP 2→4→8 ranks, 8→4, and a reshard, each by the transition DAG, by
    /// checkpoint/restart (UCP-style, a fresh mpirun) and tensor by tensor (Tenplex-style), against
    /// the point-to-point bandwidth (mpirun -n 8).
    #[derive(Debug, Clone, clap::Args)]
    pub struct ScalingArgs {
        /// A state of a few MB (tests) instead of the 50M+-parameter models.
        #[arg(long)]
        pub small: bool,
        /// Where the checkpoint/restart method writes its checkpoints (replaced per case).
        #[arg(long, value_name = "DIR", default_value = "runs/bench-scaling")]
        pub dir: PathBuf,
        /// The launcher of the restarted job; `-n N`, this binary and its arguments follow.
        #[arg(long, value_name = "COMMAND", default_value = "mpirun --oversubscribe")]
        pub launcher: String,
        /// Measurements of the DAG and of the per-tensor baseline per case (the median is
        /// reported; checkpoint/restart runs once).
        #[arg(long, default_value_t = 3)]
        pub reps: usize,
        /// Only these cases (extend-2-4, extend-4-8, destroy-8-4, reshard-tp2-pp2,
        /// reshard-tp2-pp2-dp2), comma-separated.
        #[arg(long, value_delimiter = ',')]
        pub cases: Vec<String>,
        /// Also write the report as JSON.
        #[arg(long, value_name = "PATH")]
        pub json: Option<PathBuf>,
        /// The state lives in device memory and moves over the GPU data plane (all three methods;
        /// the restarted job of (b) opens the same device).
        #[command(flatten)]
        pub device: DeviceArg,
    }

    impl From<ScalingArgs> for scaling::Options {
        fn from(a: ScalingArgs) -> Self {
            scaling::Options {
                small: a.small,
                dir: a.dir,
                launcher: a.launcher,
                reps: a.reps,
                cases: a.cases,
                json: a.json,
                device: a.device.device,
            }
        }
    }

    /// Global transition DAG build time from 32 to 16,384 ranks, and its gap to the best order.
    #[derive(Debug, Clone, clap::Args)]
    pub struct TransitionArgs {
        /// The job whose plans change (run from the repository root for the default).
        #[arg(long, default_value = "configs/llama3.1-8b-ppo.toml")]
        pub config: PathBuf,
        /// Pool sizes (ranks), comma-separated.
        #[arg(long, value_delimiter = ',', default_value = "32,64,128,256,512,1024,2048,4096,8192,16384")]
        pub ranks: Vec<u32>,
        /// Repetitions per size (the median is reported).
        #[arg(long, default_value_t = 5)]
        pub reps: usize,
        /// Also write the report as JSON.
        #[arg(long, value_name = "PATH")]
        pub json: Option<PathBuf>,
    }

    impl From<TransitionArgs> for transition::Options {
        fn from(a: TransitionArgs) -> Self {
            transition::Options { config: a.config, ranks: a.ranks, reps: a.reps, json: a.json }
        }
    }

    /// The three overlap types at eight memory capacities, Nereus and the per-component baseline executed
    /// (8 ranks).
    #[derive(Debug, Clone, clap::Args)]
    pub struct CoordinationArgs {
        /// Trials per overlap type and capacity.
        #[arg(long, default_value_t = 25)]
        pub trials: u32,
        /// Seed of the random placements and delays.
        #[arg(long, default_value_t = 1)]
        pub seed: u64,
        /// Also write the report as JSON.
        #[arg(long, value_name = "PATH")]
        pub json: Option<PathBuf>,
    }

    impl From<CoordinationArgs> for coordination::Options {
        fn from(a: CoordinationArgs) -> Self {
            coordination::Options { trials: a.trials, seed: a.seed, json: a.json }
        }
    }

    /// The cost model calibrated on this machine: the tiny PPO job under 16 fixed plans on 4 and
    /// 8 ranks, efficiencies fitted on half, the other half predicted (mpirun -n 8).
    #[derive(Debug, Clone, clap::Args)]
    pub struct CalibrationArgs {
        /// Cluster file whose detected figures the start-up probes measure.
        #[arg(long, default_value = "configs/clusters/local-detect.toml")]
        pub cluster: PathBuf,
        /// Training steps per plan (the first is a warm-up and not measured).
        #[arg(long, default_value_t = 8)]
        pub steps: u32,
        /// Where the plans' runs are written (replaced).
        #[arg(long, default_value = "runs/bench-calibration")]
        pub out_dir: PathBuf,
        /// Also write the report as JSON.
        #[arg(long, value_name = "PATH")]
        pub json: Option<PathBuf>,
        /// Busy threads rank 0 spins beside the measurement, standing in for other work on the
        /// node's cores (a loaded machine); 0, the default, measures a quiet one. The floors hold
        /// for a quiet machine only; a loaded run reports its errors without them.
        #[arg(long, default_value_t = 0)]
        pub load: u32,
    }

    impl From<CalibrationArgs> for calibration::Options {
        fn from(a: CalibrationArgs) -> Self {
            calibration::Options { cluster: a.cluster, steps: a.steps, out_dir: a.out_dir, json: a.json, load: a.load }
        }
    }

    /// The time of one controller decision: the tiny job's recorded run, and Llama-3.1-8B PPO
    /// at 1,024 and 16,384 GPUs from modelled monitor records.
    #[derive(Debug, Clone, clap::Args)]
    pub struct ControllerArgs {
        /// The large job (run from the repository root for the defaults).
        #[arg(long, default_value = "configs/llama3.1-8b-ppo.toml")]
        pub config: PathBuf,
        /// Also write the report as JSON.
        #[arg(long, value_name = "PATH")]
        pub json: Option<PathBuf>,
    }

    impl From<ControllerArgs> for controller::Options {
        fn from(a: ControllerArgs) -> Self {
            controller::Options { config: a.config, json: a.json }
        }
    }

    /// Replan time and peak memory of the plan search from 8 to 16,384 GPUs.
    #[derive(Debug, Clone, clap::Args)]
    pub struct PlannerArgs {
        /// The job to plan (run from the repository root for the default).
        #[arg(long, default_value = "configs/llama3.1-8b-ppo.toml")]
        pub config: PathBuf,
        /// Response length in tokens to plan for.
        #[arg(long, default_value_t = 4096)]
        pub seq_len: u64,
        /// Repetitions per size (the median is reported).
        #[arg(long, default_value_t = 5)]
        pub reps: usize,
        /// Also write the report as JSON.
        #[arg(long, value_name = "PATH")]
        pub json: Option<PathBuf>,
    }

    impl From<PlannerArgs> for planner::Options {
        fn from(a: PlannerArgs) -> Self {
            planner::Options { config: a.config, seq_len: a.seq_len, reps: a.reps, json: a.json }
        }
    }
}
