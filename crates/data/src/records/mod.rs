//! Prompt files users bring: JSON-lines or Parquet records with named, possibly nested fields
//! (`reward_model.ground_truth`), prompts as text or chat messages, every error naming the file,
//! the line (or row) and the field.

mod jsonl;
mod parquet;
mod prompt;
mod record;

use std::path::Path;

pub use jsonl::read_jsonl;
pub use parquet::read_parquet;
pub use prompt::{Message, Prompt};
pub(crate) use record::kind;
pub use record::{field, DataError, Record};

/// Whether `path` names a Parquet file (by its `.parquet` extension); other files are read as
/// JSON lines.
pub fn is_parquet_path(path: &Path) -> bool {
    path.extension().is_some_and(|e| e.eq_ignore_ascii_case("parquet"))
}

/// Every record of the prompt or response file at `path`: Parquet rows for a `.parquet` file,
/// JSON lines otherwise.
pub fn read_records(path: &Path) -> Result<Vec<Record>, DataError> {
    match is_parquet_path(path) {
        true => read_parquet(path),
        false => read_jsonl(path),
    }
}
