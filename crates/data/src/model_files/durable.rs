//! Writes that survive a crash: each file fsynced, each directory's entries too, and a file that
//! replaces another written under a temporary name first.

use std::fs::File;
use std::io::Write;
use std::path::Path;

use super::error::{io, ModelFileError};

/// Writes `bytes` to `path` and waits until they are on disk. Files get the process's default
/// mode (0644 under the usual umask).
pub fn write_durably(path: &Path, bytes: &[u8]) -> Result<(), ModelFileError> {
    let mut file = File::create(path).map_err(io("create", path))?;
    file.write_all(bytes).map_err(io("write", path))?;
    file.sync_all().map_err(io("sync", path))
}

/// Flushes a directory's entries (new names, renames) to disk.
pub fn sync_dir(dir: &Path) -> Result<(), ModelFileError> {
    File::open(dir).and_then(|d| d.sync_all()).map_err(io("sync directory", dir))
}

/// Writes `bytes` as `path` atomically: a temporary name beside it, then a rename.
pub fn replace_durably(path: &Path, bytes: &[u8]) -> Result<(), ModelFileError> {
    let tmp = path.with_extension("tmp");
    write_durably(&tmp, bytes)?;
    std::fs::rename(&tmp, path).map_err(io("rename", &tmp))?;
    sync_dir(path.parent().unwrap_or(Path::new(".")))
}

/// Test hook: `NEREUS_FAULT_SLOW_SAVE_MS=<ms>` pauses before each file a checkpoint writes, so
/// that a test can kill a rank in the middle of a save (`tests/failures.rs`).
pub fn pause_before_each_file_for_tests() {
    if let Some(ms) = std::env::var("NEREUS_FAULT_SLOW_SAVE_MS").ok().and_then(|v| v.parse::<u64>().ok()) {
        std::thread::sleep(std::time::Duration::from_millis(ms));
    }
}
