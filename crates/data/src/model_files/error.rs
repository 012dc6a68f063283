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

/// `path` opened for reading. A missing file, or a path that is not a regular file (opening a
/// named pipe would block for ever), is a damaged model directory.
pub(crate) fn open_model_file(path: &Path) -> Result<std::fs::File, ModelFileError> {
    let damaged = |reason: String| ModelFileError::Damaged { path: path.into(), reason };
    match nereus_core::file_error::open_regular(path) {
        Ok(file) => Ok(file),
        Err(e) if e.source.kind() == std::io::ErrorKind::NotFound => Err(damaged("the file is missing".into())),
        Err(e) if e.is_not_regular() => Err(damaged(e.source.to_string())),
        Err(e) => Err(ModelFileError::Io { action: "open", path: path.into(), source: e.source }),
    }
}
