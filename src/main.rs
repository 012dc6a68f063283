//! The `nereus` command line: one SPMD binary, started by `srun` or `mpirun` (or by hand).
//!
//! `main` only dispatches: each command lives in `commands/<name>.rs` with its arguments and
//! the function that runs it; `launch` says how a command reaches the ranks. Built without the
//! `mpi` feature, the binary plans and simulates only, and says so for the other commands.

mod allocator;
mod commands;
mod error;
mod launch;
mod logging;

use clap::{Parser, Subcommand};
use nereus_core::thread_budget::ThreadBudget;
use std::process::ExitCode;

use commands::{bench, data, inspect, logprobs, model, plan, reward, selftest, simulate, trace, train};

/// Nereus: keeps an RL post-training job on the fastest memory-feasible parallel plan.
#[derive(Parser, Debug)]
#[command(name = "nereus", version, about, propagate_version = true)]
struct Cli {
    #[command(flatten)]
    global: launch::Global,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Show what a job would run with, or where its ranks sit.
    #[command(subcommand)]
    Inspect(inspect::InspectCommand),
    /// Find the fastest memory-feasible TP/PP/DP plan for a job (per model-stage).
    Plan(plan::PlanArgs),
    /// Run an RL job (PPO, GRPO, ReMax) under mpirun/srun, on the host reference engine (f32,
    /// MPI) or each rank's device (bf16; --device or cluster.device, NCCL/RCCL), on one plan or
    /// under the live controller; one line per step, JSON lines in <output_dir>/metrics.jsonl.
    Train(train::TrainArgs),
    /// Per-token log-probabilities log p(x_t | x_<t), t >= 1 (a value model: per-position values)
    /// of token sequences under a Hugging Face model directory, on one rank or under mpirun with
    /// any layout; prints {"model": DIR, "logprobs": [[...], ...]} (or "values").
    Logprobs(logprobs::LogprobsArgs),
    /// Simulate the job over a trace under several policies, with the live controller's code
    /// (one process; no MPI launch needed).
    Simulate(simulate::SimulateArgs),
    /// Traces for `nereus simulate`.
    #[command(subcommand)]
    Trace(trace::TraceCommand),
    /// Check a prompt file against a model's tokenizer and chat template.
    #[command(subcommand)]
    Data(data::DataCommand),
    /// Bring a model in from another format (llama.cpp's GGUF) as a Hugging Face directory.
    #[command(subcommand)]
    Model(model::ModelCommand),
    /// Score a JSON-lines file of responses against reference answers with a rule-based reward
    /// (math, exact), offline; prints the mean reward and accuracy.
    Reward(reward::RewardArgs),
    /// Measure the runtime's machinery (run under mpirun/srun).
    #[cfg_attr(feature = "mpi", command(subcommand))]
    Bench(bench::BenchCommand),
    /// Check the runtime's machinery on this job's ranks.
    #[cfg_attr(feature = "mpi", command(subcommand))]
    Selftest(selftest::SelftestCommand),
}

/// The system allocator with the per-thread budgets a chat template renders under
/// (`nereus_core::thread_budget`: one thread-local read per allocation elsewhere).
#[cfg(not(feature = "alloc-meter"))]
#[global_allocator]
static ALLOCATOR: ThreadBudget<std::alloc::System> = ThreadBudget(std::alloc::System);

/// The same, heap-metered for `nereus bench planner`'s peak-memory figure, in bench builds only
/// (`--features alloc-meter`).
#[cfg(feature = "alloc-meter")]
#[global_allocator]
static ALLOCATOR: ThreadBudget<nereus_bench::alloc_meter::MeteredAllocator> =
    ThreadBudget(nereus_bench::alloc_meter::MeteredAllocator);

fn main() -> ExitCode {
    allocator::keep_freed_buffers();
    let cli = Cli::parse();
    if let Err(code) = cli.global.check() {
        return ExitCode::from(code);
    }
    let global = &cli.global;
    let code = match cli.command {
        Command::Inspect(c) => inspect::exec(c, global),
        Command::Plan(a) => plan::exec(a, global),
        Command::Train(a) => train::exec(a, global),
        Command::Logprobs(a) => logprobs::exec(a, global),
        Command::Simulate(a) => simulate::exec(a, global),
        Command::Trace(c) => trace::exec(c, global),
        Command::Data(c) => data::exec(c, global),
        Command::Model(c) => model::exec(c, global),
        Command::Reward(a) => reward::exec(a, global),
        Command::Bench(c) => bench::exec(c, global),
        Command::Selftest(c) => selftest::exec(c, global),
    };
    ExitCode::from(code)
}

#[cfg(test)]
mod tests {
    use clap::CommandFactory;

    /// clap's own consistency checks over every command (unique names and flags, valid
    /// defaults), which release builds do not run when parsing.
    #[test]
    fn the_command_line_is_consistent() {
        super::Cli::command().debug_assert();
    }
}
