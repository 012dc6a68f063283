//! The JSON-lines file of a run (`<output_dir>/metrics.jsonl`): every record is one whole line,
//! written with one `write`; a line cut short (a full disk, a kill) is removed, never joined.

use std::fs::OpenOptions;
use std::io::{Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};

use nereus_core::file_error::FileError;
use nereus_core::record::StepLine;

use crate::{io_error, RuntimeError};

/// A run's JSON-lines file.
#[derive(Debug, Clone)]
pub struct MetricsLog {
    path: PathBuf,
}

impl MetricsLog {
    /// `<output_dir>/metrics.jsonl`.
    pub fn of(output_dir: &Path) -> MetricsLog {
        MetricsLog { path: output_dir.join("metrics.jsonl") }
    }

    /// Another JSON-lines file of the run (`samples.jsonl`), written the same way.
    pub fn at(path: PathBuf) -> MetricsLog {
        MetricsLog { path }
    }

    /// The file.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Cuts a torn last line (no newline) off the file; returns the bytes removed.
    pub fn repair(&self) -> Result<u64, RuntimeError> {
        // Only a regular file can hold a torn line (and reading /dev/zero would never end).
        if !std::fs::metadata(&self.path).is_ok_and(|m| m.is_file()) {
            return Ok(0);
        }
        let text = std::fs::read(&self.path).map_err(io_error("read", &self.path))?;
        let keep = text.iter().rposition(|&b| b == b'\n').map_or(0, |i| i + 1);
        if keep == text.len() {
            return Ok(0);
        }
        let file = OpenOptions::new().write(true).open(&self.path).map_err(io_error("open", &self.path))?;
        file.set_len(keep as u64).map_err(io_error("truncate", &self.path))?;
        Ok((text.len() - keep) as u64)
    }

    /// The steps already recorded at `step` or later (what a resume from `step` supersedes).
    pub fn steps_from(&self, step: u64) -> Vec<u64> {
        if !std::fs::metadata(&self.path).is_ok_and(|m| m.is_file()) {
            return Vec::new();
        }
        let Ok(text) = std::fs::read_to_string(&self.path) else { return Vec::new() };
        text.lines()
            .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
            .filter(|r| r.get("event").is_none())
            .filter_map(|r| r.get("step").and_then(|s| s.as_u64()))
            .filter(|&s| s >= step)
            .collect()
    }

    /// Every step line of the file, in file order (events and lines that are not step lines
    /// are skipped).
    pub fn step_lines(&self) -> Result<Vec<StepLine>, RuntimeError> {
        let text = std::fs::read_to_string(&self.path).map_err(io_error("read", &self.path))?;
        Ok(text.lines().filter_map(|l| serde_json::from_str::<StepLine>(l).ok()).collect())
    }

    /// Appends `record` as one line with a single `write`. If the write fails or is cut short,
    /// the file is truncated back to where it was, so no half line remains.
    pub fn append(&self, record: &impl serde::Serialize) -> Result<(), RuntimeError> {
        let mut line = serde_json::to_vec(record).expect("records serialize");
        line.push(b'\n');
        let mut file =
            OpenOptions::new().create(true).append(true).open(&self.path).map_err(io_error("open", &self.path))?;
        let before = file.seek(SeekFrom::End(0)).map_err(io_error("seek", &self.path))?;
        let written = file.write(&line);
        match written {
            Ok(n) if n == line.len() => Ok(()),
            outcome => {
                // A short write: writing the rest tells why (usually a full disk).
                let source = match outcome {
                    Err(e) => e,
                    Ok(n) => file.write_all(&line[n..]).err().unwrap_or_else(|| {
                        std::io::Error::new(std::io::ErrorKind::WriteZero, format!("wrote {n} of {} bytes", line.len()))
                    }),
                };
                let _ = file.set_len(before);
                Err(FileError { action: "append to", path: self.path.clone(), source }.into())
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn a_torn_line_is_cut_and_later_records_stay_whole() {
        let dir = tempfile::tempdir().unwrap();
        let log = MetricsLog::of(dir.path());
        log.append(&json!({"step": 0})).unwrap();
        log.append(&json!({"step": 1})).unwrap();
        let mut f = OpenOptions::new().append(true).open(log.path()).unwrap();
        f.write_all(b"{\"step\": 2, \"rew").unwrap();
        assert_eq!(log.repair().unwrap(), 16);
        log.append(&json!({"event": "resume", "from_step": 1})).unwrap();
        log.append(&json!({"step": 1})).unwrap();
        let text = std::fs::read_to_string(log.path()).unwrap();
        assert!(text.lines().all(|l| serde_json::from_str::<serde_json::Value>(l).is_ok()), "{text}");
        assert_eq!(log.steps_from(1), vec![1, 1]);
        assert_eq!(log.repair().unwrap(), 0);
    }

    #[test]
    fn a_failed_append_leaves_no_partial_line() {
        // /dev/full accepts the open and fails every write with ENOSPC.
        let log = MetricsLog { path: "/dev/full".into() };
        let err = log.append(&json!({"step": 0})).unwrap_err();
        assert!(err.to_string().contains("/dev/full"), "{err}");
    }
}
