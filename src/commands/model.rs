//! `nereus model import-gguf FILE --out DIR`: a llama.cpp GGUF file as a Hugging Face model
//! directory (docs/models.md).

use clap::Subcommand;

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
#[cfg(feature = "mpi")]
pub type ImportArgs = nereus_runtime::import::ImportGgufOptions;
/// `nereus model import-gguf` (needs the `mpi` feature, which builds the model-directory writer).
#[cfg(not(feature = "mpi"))]
pub type ImportArgs = super::Unavailable;

/// Runs `nereus model …` in this process (no MPI launch needed).
pub fn exec(command: ModelCommand, global: &Global) -> u8 {
    match command {
        #[cfg(feature = "mpi")]
        ModelCommand::ImportGguf(args) => {
            crate::logging::init(0, &global.log());
            match nereus_runtime::import::import_gguf(&args) {
                Ok(()) => 0,
                Err(e) => {
                    eprintln!("nereus: error: {e}");
                    e.exit_code()
                }
            }
        }
        #[cfg(not(feature = "mpi"))]
        ModelCommand::ImportGguf(_) => {
            let _ = global;
            crate::launch::needs_mpi("model import-gguf")
        }
    }
}
