//! Prompt files users bring: JSON-lines records with named, possibly nested fields
//! (`reward_model.ground_truth`), prompts as text or chat messages, every error naming the file,
//! the line and the field.

mod jsonl;
mod prompt;

pub(crate) use jsonl::kind;
pub use jsonl::{field, read_jsonl, DataError, Record};
pub use prompt::{Message, Prompt};
