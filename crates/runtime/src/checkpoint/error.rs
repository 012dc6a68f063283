//! Why a checkpoint was refused or could not be written; every variant names the file or
//! directory and the value that did not match.

use std::path::PathBuf;

use thiserror::Error;

use nereus_core::exit::{EXIT_FAILURE, EXIT_USAGE};

/// A checkpoint problem.
#[derive(Debug, Error)]
pub enum CheckpointError {
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
    /// `--resume` found nothing to resume from.
    #[error("no checkpoint to resume in `{}`: {reason}", dir.display())]
    NotFound {
        /// Where it looked.
        dir: PathBuf,
        /// What it found instead.
        reason: String,
    },
    /// A fresh run would write into the output directory of another run.
    #[error("`{}` already holds a run ({found}); pass `--resume auto` to continue it (from its newest checkpoint, or afresh when it has none), or choose another --output-dir (or remove it) to start afresh", dir.display())]
    ExistingRun {
        /// The output directory.
        dir: PathBuf,
        /// What is there.
        found: String,
    },
    /// The checkpoint belongs to another job, algorithm, seed or architecture.
    #[error("checkpoint `{}` does not match this job: {key} is {checkpoint} in the checkpoint and {config} in the job{hint}", dir.display())]
    Mismatch {
        /// The checkpoint directory.
        dir: PathBuf,
        /// What differs, e.g. `models.actor.hidden`.
        key: String,
        /// Its value in the checkpoint.
        checkpoint: String,
        /// Its value in the job config.
        config: String,
        /// How to proceed, when a flag allows it.
        hint: String,
    },
    /// A file is missing, or its bytes are not what the sidecar promises.
    #[error("checkpoint file `{}` is damaged: {reason}", path.display())]
    Damaged {
        /// The file.
        path: PathBuf,
        /// What is wrong.
        reason: String,
    },
    /// A file of a model directory that is not part of a checkpoint (one a job starts from,
    /// or one `nereus logprobs` scores) is missing or damaged.
    #[error("model file `{}` is damaged: {reason}", path.display())]
    DamagedModelFile {
        /// The file.
        path: PathBuf,
        /// What is wrong.
        reason: String,
    },
    /// The sidecar contradicts itself (step, counters, data position).
    #[error("checkpoint `{}` is inconsistent: {reason}", dir.display())]
    Inconsistent {
        /// The checkpoint directory.
        dir: PathBuf,
        /// What does not add up.
        reason: String,
    },
    /// The checkpoint is at or past the last step of the job.
    #[error("checkpoint `{}` has completed {step} steps and the job runs {steps}: nothing to run (raise --steps to train further)", dir.display())]
    NothingToRun {
        /// The checkpoint directory.
        dir: PathBuf,
        /// Steps completed in the checkpoint.
        step: u64,
        /// `job.steps`.
        steps: u32,
    },
    /// State that is not finite is never written.
    #[error("{model} has {count} non-finite values in `{tensor}`; it is not checkpointed (the previous checkpoint stays the latest)")]
    NonFinite {
        /// The model.
        model: String,
        /// The first tensor with non-finite values.
        tensor: String,
        /// How many values are NaN or infinite there.
        count: usize,
    },
}

impl CheckpointError {
    /// An error about a model directory outside any checkpoint (one a job starts from, or one
    /// `nereus logprobs` scores): its damaged files are model files, not a checkpoint's.
    pub fn outside_checkpoint(e: nereus_data::model_files::ModelFileError) -> CheckpointError {
        match CheckpointError::from(e) {
            CheckpointError::Damaged { path, reason } => CheckpointError::DamagedModelFile { path, reason },
            e => e,
        }
    }

    /// 2 for a checkpoint the user must choose differently (refused, or another job's); 1 for
    /// failures of the machine (I/O) and of the run (non-finite state).
    pub fn exit_code(&self) -> u8 {
        match self {
            CheckpointError::Io { .. } | CheckpointError::NonFinite { .. } => EXIT_FAILURE,
            _ => EXIT_USAGE,
        }
    }
}

impl From<nereus_data::model_files::ModelFileError> for CheckpointError {
    fn from(e: nereus_data::model_files::ModelFileError) -> Self {
        use nereus_data::model_files::ModelFileError;
        match e {
            ModelFileError::Io { action, path, source } => CheckpointError::Io { action, path, source },
            ModelFileError::Damaged { path, reason } => CheckpointError::Damaged { path, reason },
        }
    }
}

/// The error-mapping closure for a failed file operation on `path`.
pub(super) fn io(action: &'static str, path: &std::path::Path) -> impl FnOnce(std::io::Error) -> CheckpointError {
    let path = path.to_path_buf();
    move |source| CheckpointError::Io { action, path, source }
}
