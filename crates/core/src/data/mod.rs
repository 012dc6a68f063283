//! Reading the files users bring: JSON-lines records with named, possibly nested fields
//! (`reward_model.ground_truth`), every error naming the file, the line and the field.

mod jsonl;

pub use jsonl::{field, read_jsonl, DataError, Record};
