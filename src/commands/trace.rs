//! `nereus trace synth … OUT.csv`: traces for `nereus simulate`, shaped like the paper's.

use clap::{Args, Subcommand};
use std::path::PathBuf;

use nereus_core::config::check::{show, MAX_DEVICES, MAX_TOKENS};
use nereus_core::sim::synth::{synthesize, Shape, SynthSpec};
use nereus_core::sim::trace::MAX_ROWS;

use super::simulate::write_file;
use crate::error::CommandError;
use crate::launch::{solo, Global};

/// `nereus trace …`.
#[derive(Subcommand, Debug, Clone)]
pub enum TraceCommand {
    /// Write a synthetic trace shaped like the paper's: length growth (Fig. 4a), spot pool
    /// changes (Fig. 3), both, the 26-step trace of §6.3, published length curves, an elastic
    /// pool, or noisy bursty growth with a pool that moves at the same time (mixed).
    Synth(SynthArgs),
}

/// `nereus trace synth`.
#[derive(Args, Debug, Clone)]
pub struct SynthArgs {
    /// The CSV file to write.
    pub out: PathBuf,
    /// The shape.
    #[arg(long, value_parser = super::named::<Shape>(), default_value = "growth")]
    pub shape: Shape,
    /// Steps (paper26 has 26).
    #[arg(long, allow_negative_numbers = true, default_value_t = 1000)]
    pub steps: u64,
    /// The full pool, GPUs.
    #[arg(long, allow_negative_numbers = true, default_value_t = 1024)]
    pub gpus: u32,
    /// GPUs per node (the unit of spot changes).
    #[arg(long, allow_negative_numbers = true, default_value_t = 8)]
    pub gpus_per_node: u32,
    /// Mean response length at the start, tokens.
    #[arg(long, allow_hyphen_values = true, default_value_t = 500.0)]
    pub from: f64,
    /// Mean response length at the end, tokens.
    #[arg(long, allow_hyphen_values = true, default_value_t = 8000.0)]
    pub to: f64,
    /// Longest response (p95 is cut there), tokens.
    #[arg(long, allow_hyphen_values = true, default_value_t = 8192.0)]
    pub max_len: f64,
    /// Seed of the noise and the spot events.
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// Leave out the available_gpus column (the pool then comes from `simulate --gpus`).
    #[arg(long)]
    pub no_pool: bool,
}

/// Runs `nereus trace …` (this process alone).
pub fn exec(command: TraceCommand, global: &Global) -> u8 {
    let TraceCommand::Synth(a) = command;
    solo(global, || {
        let spec = SynthSpec {
            shape: a.shape,
            steps: a.steps,
            gpus: a.gpus,
            gpus_per_node: a.gpus_per_node,
            from: a.from,
            to: a.to,
            max_len: a.max_len,
            seed: a.seed,
            pool: !a.no_pool,
        };
        check(&spec).map_err(|why| CommandError::Usage(format!("trace synth: {why}")))?;
        write_file(&a.out, synthesize(&spec).to_csv())
    })
}

/// Every size within what `simulate` reads back (a trace of at most `MAX_ROWS` steps, pools of
/// at most `MAX_DEVICES` GPUs, responses of at most `MAX_TOKENS` tokens), and lengths that
/// `--max-len` would not cut.
fn check(spec: &SynthSpec) -> Result<(), String> {
    if !(1..=MAX_ROWS as u64).contains(&spec.steps) {
        return Err(format!("--steps {} must be between 1 and {MAX_ROWS} (the most steps simulate reads)", spec.steps));
    }
    if !(1..=MAX_DEVICES).contains(&spec.gpus) || !(1..=spec.gpus).contains(&spec.gpus_per_node) {
        return Err(format!(
            "--gpus {} must be between 1 and {MAX_DEVICES}, and --gpus-per-node {} between 1 and --gpus",
            spec.gpus, spec.gpus_per_node
        ));
    }
    let tokens = f64::from(MAX_TOKENS);
    if !(spec.max_len >= 1.0 && spec.max_len <= tokens) {
        return Err(format!("--max-len {} must lie in [1, {MAX_TOKENS}] tokens", show(spec.max_len)));
    }
    for (flag, len) in [("--from", spec.from), ("--to", spec.to)] {
        if !(len >= 1.0 && len <= spec.max_len) {
            return Err(format!(
                "{flag} {} must lie in [1, --max-len = {}] tokens (a longer mean would be cut to --max-len)",
                show(len),
                show(spec.max_len)
            ));
        }
    }
    Ok(())
}
