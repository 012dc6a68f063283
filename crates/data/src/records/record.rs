//! One record of a prompt or response file, wherever it came from, and the errors that name
//! where a file went wrong.

use std::path::{Path, PathBuf};

use serde_json::Value;
use thiserror::Error;

use nereus_core::file_error::FileError;

/// Why a data file cannot be used.
#[derive(Debug, Error)]
pub enum DataError {
    /// The system refused the file.
    #[error("{0}")]
    File(#[from] FileError),
    /// A record is not what the format needs.
    #[error("{}: {reason}", locate(path, *line))]
    Line {
        /// The file.
        path: PathBuf,
        /// Its 1-based line number (row number in a Parquet file).
        line: usize,
        /// What is wrong with it.
        reason: String,
    },
    /// The file as a whole cannot be read in its format.
    #[error("{}: {reason}", path.display())]
    Format {
        /// The file.
        path: PathBuf,
        /// Why.
        reason: String,
    },
    /// The file holds no record.
    #[error("{}: no records (the file is empty or holds only blank lines)", path.display())]
    Empty {
        /// The file.
        path: PathBuf,
    },
}

/// One record of a JSON-lines or Parquet file and where it came from.
#[derive(Debug, Clone, PartialEq)]
pub struct Record {
    /// Its 1-based line number (row number in a Parquet file).
    pub line: usize,
    /// The object.
    pub value: Value,
}

impl Record {
    /// The string at `path` (dotted for nested objects), or an error naming the field and line.
    pub fn text(&self, file: &Path, path: &str) -> Result<String, DataError> {
        let error = |reason: String| DataError::Line { path: file.to_path_buf(), line: self.line, reason };
        match field(&self.value, path) {
            None => Err(error(format!("no field `{path}`"))),
            Some(Value::String(s)) => Ok(s.clone()),
            // Reference answers are often numbers in users' files ("answer": 42).
            Some(Value::Number(n)) => Ok(n.to_string()),
            Some(other) => Err(error(format!("field `{path}` is {}, not a string", kind(other)))),
        }
    }
}

/// The value at a dotted `path` (`reward_model.ground_truth`) inside `value`, if every step is
/// an object holding the next key.
pub fn field<'v>(value: &'v Value, path: &str) -> Option<&'v Value> {
    path.split('.').try_fold(value, |v, key| v.as_object()?.get(key))
}

pub(crate) fn kind(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "a list",
        Value::Object(_) => "an object",
    }
}

/// `file:line` for JSON lines, `file row N` for Parquet (whose records have no lines).
fn locate(path: &Path, line: usize) -> String {
    match super::is_parquet_path(path) {
        true => format!("{} row {line}", path.display()),
        false => format!("{}:{line}", path.display()),
    }
}
