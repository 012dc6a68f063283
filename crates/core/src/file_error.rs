//! A file or directory the system refused, named with what was attempted: the one shape every
//! layer reports file errors in.

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
}
