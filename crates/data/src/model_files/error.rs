//! Why a model file could not be read or written: the file and the reason.

use std::path::{Path, PathBuf};

use thiserror::Error;

/// A model-file problem.
#[derive(Debug, Error)]
pub enum ModelFileError {
    /// A file or directory could not be read or written.
    #[error("cannot {action} `{}`: {source}", path.display())]
    Io {
        /// What was attempted.
        action: &'static str,
        /// The path.
        path: PathBuf,
        /// The operating system's error.
        source: std::io::Error,
    },
    /// A file is missing, or its bytes are not what a model file holds.
    #[error("model file `{}` is damaged: {reason}", path.display())]
    Damaged {
        /// The file.
        path: PathBuf,
        /// What is wrong.
        reason: String,
    },
}

/// The error-mapping closure for a failed file operation on `path`.
pub(crate) fn io(action: &'static str, path: &Path) -> impl FnOnce(std::io::Error) -> ModelFileError {
    let path = path.to_path_buf();
    move |source| ModelFileError::Io { action, path, source }
}
