//! `nereus model import-gguf FILE --out DIR`: a llama.cpp GGUF file as a Hugging Face model
//! directory (docs/models.md). Pure file I/O: it runs in this process, in any build.

use std::path::PathBuf;

use clap::{Args, Subcommand};

use nereus_core::config::Dtype;
use nereus_data::gguf::import::import_gguf;

use crate::launch::Global;

/// `nereus model …`.
#[derive(Subcommand, Debug, Clone)]
pub enum ModelCommand {
    /// Write a Llama-architecture GGUF file (F32, F16, BF16, Q4_0, Q4_1, Q8_0 tensors) as a
    /// Hugging Face model directory: weights dequantized to f32 or bf16, tokenizer.json, the
    /// chat template.
    ImportGguf(ImportArgs),
}

/// `nereus model import-gguf`'s arguments.
#[derive(Debug, Clone, Args)]
pub struct ImportArgs {
    /// The GGUF file.
    pub file: PathBuf,
    /// The model directory to write (created; files in it are replaced).
    #[arg(long, value_name = "DIR")]
    pub out: PathBuf,
    /// Dtype of the written weights: f32 (exactly the dequantized values) or bf16.
    #[arg(long, default_value = "f32", value_parser = parse_dtype)]
    pub dtype: Dtype,
}

fn parse_dtype(s: &str) -> Result<Dtype, String> {
    match s {
        "f32" => Ok(Dtype::F32),
        "bf16" => Ok(Dtype::Bf16),
        other => Err(format!("`{other}`: f32 or bf16")),
    }
}

/// Runs `nereus model …` in this process (no MPI launch needed).
pub fn exec(command: ModelCommand, global: &Global) -> u8 {
    crate::logging::init(0, &global.log());
    match command {
        ModelCommand::ImportGguf(args) => match import_gguf(&args.file, &args.out, args.dtype) {
            Ok(done) => {
                let s = &done.spec;
                println!(
                    "{}: {} layers, hidden {}, {} heads ({} KV), vocab {}, {} tensors as {} in {}",
                    args.file.display(),
                    s.layers,
                    s.hidden,
                    s.heads,
                    s.kv_heads,
                    s.vocab,
                    done.tensors,
                    nereus_core::config::hf::hf_dtype_name(args.dtype),
                    args.out.display()
                );
                0
            }
            Err(e) => {
                eprintln!("nereus: error: {e}");
                e.exit_code()
            }
        },
    }
}
