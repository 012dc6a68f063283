//! `nereus data …`: checking a prompt file against a model's tokenizer and chat template before
//! a run (`preview`), and the project's own small text job (`synth`).

use clap::{Args, Subcommand};
use serde::Serialize;
use std::io::Write;
use std::path::PathBuf;

use nereus_core::config::hf::read_model_config;
use nereus_data::records::read_records;
use nereus_data::synth::{synth, SynthSpec};
use nereus_data::text::ModelText;

use super::simulate::write_file;
use crate::error::CommandError;
use crate::launch::{solo, Global};

/// `nereus data …`.
#[derive(Subcommand, Debug, Clone)]
pub enum DataCommand {
    /// Print the first prompts of a JSON-lines file as the model will see them: rendered with
    /// the model directory's chat template, and their token ids.
    Preview(PreviewArgs),
    /// Write the project's small text job: arithmetic word problems (train.jsonl, eval.jsonl)
    /// and a byte-level BPE tokenizer with a chat template trained on them (tokenizer/).
    Synth(SynthArgs),
}

/// `nereus data synth`.
#[derive(Args, Debug, Clone)]
pub struct SynthArgs {
    /// The directory to write (configs/data/tiny-math is this command's output with defaults).
    pub out: PathBuf,
    /// Training problems.
    #[arg(long, default_value_t = SynthSpec::default().train)]
    pub train: usize,
    /// Held-out problems.
    #[arg(long, default_value_t = SynthSpec::default().eval)]
    pub eval: usize,
    /// Largest operand.
    #[arg(long, default_value_t = SynthSpec::default().max_operand)]
    pub max_operand: u32,
    /// Token ids of the tokenizer (above 259: the 256 bytes and 3 special tokens come first).
    #[arg(long, default_value_t = SynthSpec::default().vocab)]
    pub vocab: usize,
    /// Seed of the problems.
    #[arg(long, default_value_t = SynthSpec::default().seed)]
    pub seed: u64,
    /// Share of the training answers that guess (the question's first number) instead of
    /// working the sum out: what RL then fixes.
    #[arg(long, default_value_t = SynthSpec::default().guess_share)]
    pub guess_share: f64,
}

/// `nereus data preview`.
#[derive(Args, Debug, Clone)]
pub struct PreviewArgs {
    /// The prompt file (JSON lines).
    pub file: PathBuf,
    /// The model directory (tokenizer.json, the chat template, config.json).
    #[arg(long)]
    pub model: PathBuf,
    /// Prompts to show.
    #[arg(long, default_value_t = 3)]
    pub count: usize,
    /// The field holding the prompt: a string or a list of chat messages (dotted for nesting).
    #[arg(long, default_value = "prompt")]
    pub prompt_key: String,
    /// Use string prompts as they are, not as one user message through the chat template.
    #[arg(long)]
    pub raw: bool,
    /// Also write the prompts as JSON: {"prompts": [{"text": …, "ids": […]}, …]}.
    #[arg(long, value_name = "PATH")]
    pub json: Option<PathBuf>,
}

/// What `--json` writes.
#[derive(Debug, Serialize)]
struct Preview {
    prompts: Vec<Rendered>,
}

/// One prompt as the model sees it.
#[derive(Debug, Serialize)]
struct Rendered {
    line: usize,
    text: String,
    ids: Vec<u32>,
}

/// Most problems `data synth` writes per split: a million is past what a CPU-sized job reads.
const MAX_SYNTH_PROBLEMS: usize = 1_000_000;
/// Most token ids its tokenizer may have: 2^20, past any published model's vocabulary.
const MAX_SYNTH_VOCAB: usize = 1 << 20;
/// Largest operand: sums and differences of two stay exact in any reader's numbers.
const MAX_SYNTH_OPERAND: u32 = 1_000_000_000;

/// Runs `nereus data …` (this process alone).
pub fn exec(command: DataCommand, global: &Global) -> u8 {
    match command {
        DataCommand::Preview(a) => solo(global, || preview(&a)),
        DataCommand::Synth(a) => solo(global, || synth_job(&a)),
    }
}

fn synth_job(a: &SynthArgs) -> Result<(), CommandError> {
    let sizes_ok = (260..=MAX_SYNTH_VOCAB).contains(&a.vocab)
        && (1..=MAX_SYNTH_PROBLEMS).contains(&a.train)
        && (1..=MAX_SYNTH_PROBLEMS).contains(&a.eval)
        && a.max_operand <= MAX_SYNTH_OPERAND;
    if !sizes_ok || !(0.0..=1.0).contains(&a.guess_share) {
        return Err(CommandError::Usage(format!(
            "--vocab must lie in [260, {MAX_SYNTH_VOCAB}] (above the 256 bytes and 3 special tokens), --train and --eval in [1, {MAX_SYNTH_PROBLEMS}], --max-operand at most {MAX_SYNTH_OPERAND}, --guess-share in [0, 1]; got {}, {}, {}, {}, {}",
            a.vocab, a.train, a.eval, a.max_operand, a.guess_share
        )));
    }
    let spec = SynthSpec {
        train: a.train,
        eval: a.eval,
        max_operand: a.max_operand,
        vocab: a.vocab,
        seed: a.seed,
        guess_share: a.guess_share,
    };
    synth(&spec, &a.out).map_err(|e| CommandError::Usage(e.to_string()))?;
    println!("wrote {} (train.jsonl: {}, eval.jsonl: {}, tokenizer/)", a.out.display(), a.train, a.eval);
    Ok(())
}

fn preview(a: &PreviewArgs) -> Result<(), CommandError> {
    let usage = |e: &dyn std::fmt::Display| CommandError::Usage(e.to_string());
    let text = ModelText::load(&a.model).map_err(|e| usage(&e))?;
    let mut out = std::io::stdout().lock();
    match read_model_config(&a.model) {
        Ok(model) => text.check_fits(model.spec.vocab as usize).map_err(|e| usage(&e))?,
        Err(_) if !a.model.join("config.json").exists() => {
            writeln!(out, "(no config.json in {}: the vocabulary fit is not checked)", a.model.display())
                .map_err(CommandError::Stdout)?
        }
        Err(why) => return Err(CommandError::Usage(format!("{}: {why}", a.model.display()))),
    }
    let special = text.special();
    writeln!(out, "eos ids {:?}, pad id {}, bos {:?}", special.eos_ids, special.pad_id, special.bos_token)
        .map_err(CommandError::Stdout)?;
    let records = read_records(&a.file).map_err(|e| usage(&e))?;
    let mut prompts = Vec::new();
    for record in records.iter().take(a.count) {
        let prompt = record.prompt(&a.file, &a.prompt_key).map_err(|e| usage(&e))?;
        let rendered =
            text.render(&prompt, !a.raw).map_err(|e| usage(&format!("{}:{}: {e}", a.file.display(), record.line)))?;
        let ids = text.encode(&rendered).map_err(|e| usage(&e))?;
        writeln!(out, "--- line {} ({} tokens)\n{rendered}\n{ids:?}", record.line, ids.len())
            .map_err(CommandError::Stdout)?;
        prompts.push(Rendered { line: record.line, text: rendered, ids });
    }
    match &a.json {
        Some(path) => {
            write_file(path, serde_json::to_string_pretty(&Preview { prompts }).expect("a preview serializes") + "\n")
        }
        None => Ok(()),
    }
}
