//! JSON lines: one object per line, blank lines skipped, every error naming the file and line.

use std::path::Path;

use serde_json::Value;

use nereus_core::file_error::read_regular;

use super::{kind, DataError, Record};

/// Lines longer than this are refused before they are parsed (a file that is not JSON lines,
/// or one record that would not fit any prompt).
pub const MAX_LINE_BYTES: usize = 64 << 20;

/// Every record of the JSON-lines file at `path`: one object per non-blank line. A line that
/// is not UTF-8, not JSON, or not an object is an error naming the line.
pub fn read_jsonl(path: &Path) -> Result<Vec<Record>, DataError> {
    let bytes = read_regular(path)?;
    if bytes.starts_with(b"PAR1") {
        let reason = "this is a Parquet file: give it the `.parquet` extension to read it as one".into();
        return Err(DataError::Format { path: path.to_path_buf(), reason });
    }
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
    use std::path::PathBuf;

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
