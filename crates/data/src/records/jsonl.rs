//! JSON lines: one object per line, blank lines skipped, every error naming the file and line.

use std::path::{Path, PathBuf};

use serde_json::Value;
use thiserror::Error;

use nereus_core::file_error::FileError;

/// Lines longer than this are refused before they are parsed (a file that is not JSON lines,
/// or one record that would not fit any prompt).
pub const MAX_LINE_BYTES: usize = 64 << 20;

/// Why a data file cannot be used.
#[derive(Debug, Error)]
pub enum DataError {
    /// The system refused the file.
    #[error("{0}")]
    File(#[from] FileError),
    /// A line is not what the format needs.
    #[error("{}:{line}: {reason}", path.display())]
    Line {
        /// The file.
        path: PathBuf,
        /// Its 1-based line number.
        line: usize,
        /// What is wrong with it.
        reason: String,
    },
    /// The file holds no record.
    #[error("{}: no records (the file is empty or holds only blank lines)", path.display())]
    Empty {
        /// The file.
        path: PathBuf,
    },
}

/// One record of a JSON-lines file and where it came from.
#[derive(Debug, Clone, PartialEq)]
pub struct Record {
    /// Its 1-based line number.
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

/// Every record of the JSON-lines file at `path`: one object per non-blank line. A line that
/// is not UTF-8, not JSON, or not an object is an error naming the line.
pub fn read_jsonl(path: &Path) -> Result<Vec<Record>, DataError> {
    let bytes = std::fs::read(path).map_err(FileError::on("read", path))?;
    let bytes = bytes.strip_prefix(b"\xEF\xBB\xBF").unwrap_or(&bytes);
    let mut records = Vec::new();
    for (k, raw) in bytes.split(|&b| b == b'\n').enumerate() {
        let line = k + 1;
        let error = |reason: String| DataError::Line { path: path.to_path_buf(), line, reason };
        if raw.len() > MAX_LINE_BYTES {
            return Err(error(format!("the line is {} bytes, above the limit of {MAX_LINE_BYTES}", raw.len())));
        }
        let text = std::str::from_utf8(raw)
            .map_err(|e| error(format!("not UTF-8 text (invalid byte at column {})", e.valid_up_to() + 1)))?;
        let text = text.trim();
        if text.is_empty() {
            continue;
        }
        let value: Value = serde_json::from_str(text).map_err(|e| error(format!("not JSON: {e}")))?;
        if !value.is_object() {
            return Err(error(format!("a record must be a JSON object, found {}", kind(&value))));
        }
        records.push(Record { line, value });
    }
    if records.is_empty() {
        return Err(DataError::Empty { path: path.to_path_buf() });
    }
    Ok(records)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn file(text: &[u8]) -> (tempfile::TempDir, PathBuf) {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("data.jsonl");
        std::fs::write(&path, text).unwrap();
        (dir, path)
    }

    #[test]
    fn records_keep_their_line_numbers_and_nested_fields_resolve() {
        let (_d, path) =
            file(b"\xEF\xBB\xBF{\"a\": {\"b\": \"x\"}, \"n\": 42}\n\n  \n{\"a\": {\"b\": \"y\"}, \"n\": 1.5}\n");
        let records = read_jsonl(&path).unwrap();
        assert_eq!(records.iter().map(|r| r.line).collect::<Vec<_>>(), [1, 4]);
        assert_eq!(records[1].text(&path, "a.b").unwrap(), "y");
        assert_eq!(records[0].text(&path, "n").unwrap(), "42");
        let missing = records[0].text(&path, "a.c").unwrap_err().to_string();
        assert!(missing.ends_with("data.jsonl:1: no field `a.c`"), "{missing}");
        let object = records[0].text(&path, "a").unwrap_err().to_string();
        assert!(object.contains(":1: field `a` is an object, not a string"), "{object}");
    }

    #[test]
    fn bad_lines_are_named() {
        for (text, needle) in [
            (&b"{\"a\": 1}\n{\"a\": \n"[..], ":2: not JSON"),
            (b"{\"a\": 1}\n[1, 2]\n", ":2: a record must be a JSON object, found a list"),
            (b"{\"a\": \"\xff\"}\n", ":1: not UTF-8 text (invalid byte at column 8)"),
            (b"\n \n", "no records"),
        ] {
            let (_d, path) = file(text);
            let e = read_jsonl(&path).unwrap_err().to_string();
            assert!(e.contains(needle), "{e}");
        }
        let e = read_jsonl(Path::new("/nonexistent/x.jsonl")).unwrap_err().to_string();
        assert!(e.starts_with("cannot read `/nonexistent/x.jsonl`"), "{e}");
    }
}
