//! The user's data for an RL job, and nothing that touches a rank:
//!
//! - [`records`]: prompt files (JSON lines, Parquet) read into records with named, possibly
//!   nested fields, every error naming the file, the line and the field;
//! - [`text`]: the model directory's tokenizer (`tokenizer.json`), chat template and special
//!   tokens, rendering chat messages into the token ids a prompt starts from;
//! - [`reward`]: rewards over text — rules (`math`, `exact`) and external scorer commands;
//! - [`model_files`]: Hugging Face model directories and safetensors files, read and written;
//! - [`gguf`]: llama.cpp's GGUF files, imported as model directories.
//!
//! See `docs/data.md` for the file formats and the keys.

pub mod gguf;
pub mod model_files;
pub mod prompts;
pub mod records;
pub mod reward;
pub mod synth;
pub mod text;

/// The unit tests run under the allocator the `nereus` binary installs, so the bounds on a chat
/// template's memory hold in them too.
#[cfg(test)]
#[global_allocator]
static ALLOCATOR: nereus_core::thread_budget::ThreadBudget<std::alloc::System> =
    nereus_core::thread_budget::ThreadBudget(std::alloc::System);
