//! A file or directory the system refused, named with what was attempted: the one shape every
//! layer reports file errors in; and the reads of input files, which take regular files only.

use std::fs::File;
use std::path::{Path, PathBuf};
use thiserror::Error;

/// What was attempted on which path, and the operating system's error.
#[derive(Debug, Error)]
#[error("cannot {action} `{}`: {source}", path.display())]
pub struct FileError {
    /// `read`, `write`, `create directory`, …
    pub action: &'static str,
    /// The file or directory.
    pub path: PathBuf,
    /// The operating system's error.
    #[source]
    pub source: std::io::Error,
}

impl FileError {
    /// The error-mapping closure for a failed `action` on `path`.
    pub fn on(action: &'static str, path: &Path) -> impl FnOnce(std::io::Error) -> FileError {
        let path = path.to_path_buf();
        move |source| FileError { action, path, source }
    }

    /// Whether the path exists but is not a regular file (a directory, a named pipe, a device):
    /// the user named the wrong thing, rather than the system refusing a file.
    pub fn is_not_regular(&self) -> bool {
        self.source.kind() == std::io::ErrorKind::InvalidInput
    }

    /// Whether this is the read of an input file the user named (a job file, a prompt file, a
    /// trace) that failed, however: missing, unreadable or not a regular file. Every command
    /// reports that as a usage error (exit 2); exit 1 is for files the system refuses to write,
    /// or to read back while a job runs.
    pub fn is_wrong_input(&self) -> bool {
        self.action == "read"
    }
}

/// What `path` is when it is not a regular file (following symbolic links), as a message says
/// it: `None` for a regular file.
fn not_regular(kind: std::fs::FileType) -> Option<&'static str> {
    #[cfg(unix)]
    {
        use std::os::unix::fs::FileTypeExt;
        if kind.is_fifo() {
            return Some("a named pipe (FIFO)");
        }
        if kind.is_socket() {
            return Some("a socket");
        }
        if kind.is_char_device() {
            return Some("a character device");
        }
        if kind.is_block_device() {
            return Some("a block device");
        }
    }
    match () {
        _ if kind.is_file() => None,
        _ if kind.is_dir() => Some("a directory"),
        _ => Some("not a regular file"),
    }
}

/// An error unless `path` is a regular file (through symbolic links). Input files are checked
/// before they are opened: opening a named pipe blocks until someone writes to it, and reading
/// a device may never end, so either would hang the command instead of refusing it.
pub fn check_regular(path: &Path) -> Result<(), FileError> {
    let meta = std::fs::metadata(path).map_err(FileError::on("read", path))?;
    match not_regular(meta.file_type()) {
        None => Ok(()),
        Some(what) => Err(FileError {
            action: "read",
            path: path.to_path_buf(),
            source: std::io::Error::new(std::io::ErrorKind::InvalidInput, format!("it is {what}, not a regular file")),
        }),
    }
}

/// `path` opened for reading, once [`check_regular`] holds.
pub fn open_regular(path: &Path) -> Result<File, FileError> {
    check_regular(path)?;
    File::open(path).map_err(FileError::on("read", path))
}

/// The bytes of the regular file `path`.
pub fn read_regular(path: &Path) -> Result<Vec<u8>, FileError> {
    check_regular(path)?;
    std::fs::read(path).map_err(FileError::on("read", path))
}

/// The text of the regular file `path`.
pub fn read_regular_string(path: &Path) -> Result<String, FileError> {
    check_regular(path)?;
    std::fs::read_to_string(path).map_err(FileError::on("read", path))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn directories_pipes_and_devices_are_named_and_never_opened() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("f.txt");
        std::fs::write(&file, "x").unwrap();
        assert_eq!(read_regular_string(&file).unwrap(), "x");
        let e = read_regular(dir.path()).unwrap_err();
        assert!(e.is_not_regular() && e.to_string().ends_with("it is a directory, not a regular file"), "{e}");
        let e = read_regular(Path::new("/dev/null")).unwrap_err();
        assert!(e.to_string().contains("a character device"), "{e}");
        let fifo = dir.path().join("pipe");
        let made = std::process::Command::new("mkfifo").arg(&fifo).status().is_ok_and(|s| s.success());
        if made {
            let e = open_regular(&fifo).unwrap_err();
            assert!(e.to_string().contains("it is a named pipe (FIFO), not a regular file"), "{e}");
        }
        let e = read_regular(&dir.path().join("missing")).unwrap_err();
        assert!(!e.is_not_regular(), "{e}");
    }
}
