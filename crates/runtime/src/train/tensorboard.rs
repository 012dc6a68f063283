//! TensorBoard event files (`<output_dir>/tensorboard/events.out.tfevents.*`): every numeric
//! field of every step record, the evaluations and the transitions as scalars, so that
//! `tensorboard --logdir <output_dir>/tensorboard` (and `wandb sync --sync-tensorboard`) shows a
//! run as it goes.
//!
//! The format is TensorFlow's record file of `Event` protocol buffers; both are small enough to
//! write by hand (no protobuf dependency): a record is its length (u64, little-endian), the
//! masked CRC-32C of the length, the bytes, and their masked CRC-32C; an event is `wall_time`
//! (field 1, double), `step` (2, int64), then `file_version` (3, string) or `summary` (5), whose
//! values are `tag` (1, string) and `simple_value` (2, float).

use std::fs::{File, OpenOptions};
use std::io::Write;
use std::path::{Path, PathBuf};

use serde_json::Value;

use crate::{io_error, RuntimeError};

/// A run's event file, appended to as the run goes.
#[derive(Debug)]
pub struct EventWriter {
    path: PathBuf,
    file: File,
}

impl EventWriter {
    /// A new event file in `dir` (created if needed), opened with TensorBoard's version record.
    pub fn create(dir: &Path) -> Result<EventWriter, RuntimeError> {
        std::fs::create_dir_all(dir).map_err(io_error("create", dir))?;
        let now = wall_time();
        let host = std::fs::read_to_string("/proc/sys/kernel/hostname").unwrap_or_default();
        let name = format!("events.out.tfevents.{}.{}.nereus", now as u64, host.trim());
        let path = dir.join(name);
        let file = OpenOptions::new().create(true).append(true).open(&path).map_err(io_error("open", &path))?;
        let mut writer = EventWriter { path, file };
        let mut version = Vec::new();
        put_bytes(&mut version, 3, b"brain.Event:2");
        writer.event(0, &version)?;
        Ok(writer)
    }

    /// The scalars `(tag, value)` at `step` (non-finite values are skipped: TensorBoard plots
    /// them as gaps anyway, and a NaN loss is in the step record).
    pub fn scalars(&mut self, step: u64, scalars: &[(String, f64)]) -> Result<(), RuntimeError> {
        let mut summary = Vec::new();
        for (tag, value) in scalars.iter().filter(|(_, v)| v.is_finite()) {
            let mut entry = Vec::new();
            put_bytes(&mut entry, 1, tag.as_bytes());
            put_key(&mut entry, 2, 5);
            entry.extend_from_slice(&(*value as f32).to_le_bytes());
            put_bytes(&mut summary, 1, &entry);
        }
        let mut body = Vec::new();
        put_bytes(&mut body, 5, &summary);
        self.event(step, &body)
    }

    /// Every number in `record` (a step line or an event, as JSON) as a scalar named by its
    /// path (`op_seconds/generation/gemm/measured`), prefixed by `prefix`.
    pub fn record(&mut self, step: u64, prefix: &str, record: &impl serde::Serialize) -> Result<(), RuntimeError> {
        let value = serde_json::to_value(record).expect("records serialize");
        let mut scalars = Vec::new();
        flatten(prefix, &value, &mut scalars);
        scalars.retain(|(tag, _)| tag != "step" && !tag.ends_with("/step"));
        self.scalars(step, &scalars)
    }

    /// Writes one event (`body` holds its fields after `wall_time` and `step`) as one record.
    fn event(&mut self, step: u64, body: &[u8]) -> Result<(), RuntimeError> {
        let mut event = Vec::with_capacity(body.len() + 20);
        put_key(&mut event, 1, 1);
        event.extend_from_slice(&wall_time().to_le_bytes());
        put_key(&mut event, 2, 0);
        put_varint(&mut event, step);
        event.extend_from_slice(body);
        let length = (event.len() as u64).to_le_bytes();
        let mut record = Vec::with_capacity(event.len() + 16);
        record.extend_from_slice(&length);
        record.extend_from_slice(&masked_crc32c(&length).to_le_bytes());
        record.extend_from_slice(&event);
        record.extend_from_slice(&masked_crc32c(&event).to_le_bytes());
        self.file.write_all(&record).map_err(io_error("append to", &self.path))
    }
}

/// Every numeric leaf of `value` (objects walked, arrays and strings left out), named by path.
fn flatten(prefix: &str, value: &Value, out: &mut Vec<(String, f64)>) {
    match value {
        Value::Number(n) => out.extend(n.as_f64().map(|x| (prefix.to_string(), x))),
        Value::Bool(b) => out.push((prefix.to_string(), f64::from(u8::from(*b)))),
        Value::Object(map) => {
            for (key, v) in map {
                let tag = if prefix.is_empty() { key.clone() } else { format!("{prefix}/{key}") };
                flatten(&tag, v, out);
            }
        }
        _ => {}
    }
}

fn wall_time() -> f64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0.0, |d| d.as_secs_f64())
}

fn put_varint(out: &mut Vec<u8>, mut n: u64) {
    while n >= 0x80 {
        out.push((n as u8) | 0x80);
        n >>= 7;
    }
    out.push(n as u8);
}

fn put_key(out: &mut Vec<u8>, field: u64, wire_type: u64) {
    put_varint(out, (field << 3) | wire_type);
}

fn put_bytes(out: &mut Vec<u8>, field: u64, bytes: &[u8]) {
    put_key(out, field, 2);
    put_varint(out, bytes.len() as u64);
    out.extend_from_slice(bytes);
}

/// CRC-32C (Castagnoli), as TFRecord frames use it, masked as TensorFlow masks it.
fn masked_crc32c(bytes: &[u8]) -> u32 {
    let crc = crc32c(bytes);
    crc.rotate_right(15).wrapping_add(0xa282_ead8)
}

fn crc32c(bytes: &[u8]) -> u32 {
    let mut crc = !0u32;
    for &b in bytes {
        crc ^= u32::from(b);
        for _ in 0..8 {
            crc = if crc & 1 == 1 { (crc >> 1) ^ 0x82F6_3B78 } else { crc >> 1 };
        }
    }
    !crc
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn crc_and_varints_match_their_specifications() {
        assert_eq!(crc32c(b"123456789"), 0xE306_9283); // RFC 3720's check value
        let mut v = Vec::new();
        put_varint(&mut v, 300);
        assert_eq!(v, [0xAC, 0x02]);
        let mut scalars = Vec::new();
        flatten("", &serde_json::json!({"a": 1, "b": {"c": 2.5, "d": "x", "e": [1]}, "f": true}), &mut scalars);
        assert_eq!(scalars, [("a".into(), 1.0), ("b/c".into(), 2.5), ("f".into(), 1.0)]);
    }
}
