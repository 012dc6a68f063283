//! Checkpoints that prove themselves (docs/operations.md, "Checkpoints"):
//!
//! ```text
//! <output_dir>/checkpoints/
//!   latest                      "step-N": the newest complete checkpoint, updated last
//!   step-N/                     one complete checkpoint, never rewritten in place
//!     state.json                the sidecar: job, algorithm, seed, step, data position,
//!                               counters, and per model its architecture and each file's
//!                               size and SHA-256
//!     <model>/                  a Hugging Face model directory (`from_pretrained` loads it):
//!       config.json             architecture (`architectures`, RoPE, ε, dtype, …)
//!       generation_config.json
//!       model.safetensors       whole tensors under Hugging Face names (any layout loads them),
//!                               or model-0000k-of-0000n.safetensors + model.safetensors.index.json
//!       tokenizer files         copied from the directory the model started from, if any
//!     <model>.optim.safetensors AdamW moments, `exp_avg.<name>` and `exp_avg_sq.<name>`
//!   step-N.partial/             a checkpoint being written; removed at the next start
//! ```
//!
//! Saving ([`save`]) gathers each model onto rank 0, which writes `step-N.partial/`, fsyncs
//! every file and the directory, renames it to `step-N/` and then points `latest` at it: a kill
//! at any moment leaves `latest` naming a complete checkpoint. Resuming ([`resume::open`])
//! checks the sidecar against the job and every file against the sidecar before any state is
//! created; each rank then copies only its rectangles out of the memory-mapped files.

mod error;
pub mod resume;
pub mod save;
pub mod sidecar;
pub mod tensors;

pub use error::CheckpointError;
pub use resume::{ModelFiles, ResumeOptions, Resumed};
pub use save::{
    save, save_params_file, snapshot, write, ModelToSave, PendingCheckpoint, SaveOptions, Snapshot, Writer,
};
pub use sidecar::{Lineage, SavedModel, Sidecar, FORMAT, SIDECAR};
pub use tensors::fill_shard;

use std::path::{Path, PathBuf};

use error::io;
use nereus_core::config::ResumeFrom;

/// The parameter file of model `model` among the warm-ups' outputs.
pub fn params_file(model: &str) -> String {
    format!("{model}.safetensors")
}

/// The optimizer file of model `model` in a checkpoint.
pub fn optimizer_file(model: &str) -> String {
    format!("{model}.optim.safetensors")
}

/// A checkpoint's lineage sequence as its sidecar records it (0 when it does not, or cannot be
/// read: a damaged checkpoint is refused when it is opened, not here).
fn sequence_of(dir: &Path) -> u64 {
    let Ok(text) = nereus_core::file_error::read_regular_string(&dir.join(SIDECAR)) else { return 0 };
    serde_json::from_str::<serde_json::Value>(&text)
        .ok()
        .and_then(|v| v.get("lineage")?.get("sequence")?.as_u64())
        .unwrap_or(0)
}

/// The checkpoints of one output directory.
#[derive(Debug, Clone)]
pub struct Checkpoints {
    root: PathBuf,
}

impl Checkpoints {
    /// The checkpoints under `<output_dir>/checkpoints`.
    pub fn of(output_dir: &Path) -> Checkpoints {
        Checkpoints { root: output_dir.join("checkpoints") }
    }

    /// `<output_dir>/checkpoints`.
    pub fn root(&self) -> &Path {
        &self.root
    }

    /// The complete checkpoint of step `step`.
    pub fn step_dir(&self, step: u64) -> PathBuf {
        self.root.join(format!("step-{step}"))
    }

    /// Where checkpoint `step` is written before it is complete.
    pub fn partial_dir(&self, step: u64) -> PathBuf {
        self.root.join(format!("step-{step}.partial"))
    }

    /// The file naming the newest complete checkpoint.
    pub fn latest_pointer(&self) -> PathBuf {
        self.root.join("latest")
    }

    /// Complete checkpoints (a `step-N` directory with a sidecar), by step.
    pub fn complete(&self) -> Vec<(u64, PathBuf)> {
        let Ok(entries) = std::fs::read_dir(&self.root) else { return Vec::new() };
        let mut out: Vec<(u64, PathBuf)> = entries
            .flatten()
            .filter_map(|e| {
                let name = e.file_name().into_string().ok()?;
                let step = name.strip_prefix("step-")?.parse::<u64>().ok()?;
                e.path().join(SIDECAR).is_file().then(|| (step, e.path()))
            })
            .collect();
        out.sort();
        out
    }

    /// The newest complete checkpoint: the one `latest` names when it is complete, else the one
    /// written last (the highest lineage sequence, then the highest step). Either way a higher
    /// `step-N/` of a continuation that a resume from an earlier step abandoned is not taken.
    pub fn latest(&self) -> Option<PathBuf> {
        let named =
            nereus_core::file_error::read_regular_string(&self.latest_pointer()).ok().map(|s| self.root.join(s.trim()));
        match named {
            Some(dir) if dir.join(SIDECAR).is_file() => Some(dir),
            _ => self.newest_written(),
        }
    }

    /// The complete checkpoint written last, by its sidecar's lineage sequence (checkpoints
    /// without one count as sequence 0), then by step.
    pub fn newest_written(&self) -> Option<PathBuf> {
        self.complete().into_iter().max_by_key(|(step, dir)| (sequence_of(dir), *step)).map(|(_, dir)| dir)
    }

    /// The sequence the next checkpoint of this directory takes.
    pub fn next_sequence(&self) -> u64 {
        self.complete().iter().map(|(_, dir)| sequence_of(dir)).max().unwrap_or(0) + 1
    }

    /// Removes what an interrupted save left behind (`*.partial`, `*.replaced`, temporary
    /// pointer files); returns what was removed.
    pub fn clean_stale(&self) -> Result<Vec<PathBuf>, CheckpointError> {
        let Ok(entries) = std::fs::read_dir(&self.root) else { return Ok(Vec::new()) };
        let mut removed = Vec::new();
        for entry in entries.flatten() {
            let path = entry.path();
            let name = entry.file_name().to_string_lossy().into_owned();
            if name.ends_with(".partial") || name.ends_with(".replaced") {
                std::fs::remove_dir_all(&path).map_err(io("remove", &path))?;
                removed.push(path);
            } else if name.ends_with(".tmp") {
                std::fs::remove_file(&path).map_err(io("remove", &path))?;
                removed.push(path);
            }
        }
        Ok(removed)
    }

    /// The checkpoint `from` names, or `None` for a fresh start.
    pub fn resolve(&self, from: Option<&ResumeFrom>) -> Result<Option<PathBuf>, CheckpointError> {
        match from {
            None => Ok(None),
            Some(ResumeFrom::Dir(dir)) if dir.is_file() => Err(CheckpointError::NotFound {
                dir: dir.clone(),
                reason: format!(
                    "is a file; --resume takes a checkpoint directory{}",
                    dir.parent().filter(|_| dir.ends_with(SIDECAR)).map_or(String::new(), |d| format!(
                        " (`{}`)",
                        d.display()
                    ))
                ),
            }),
            Some(ResumeFrom::Dir(dir)) => Ok(Some(dir.clone())),
            Some(ResumeFrom::Auto) => Ok(self.latest()),
            Some(ResumeFrom::Latest) => self.latest().map(Some).ok_or_else(|| CheckpointError::NotFound {
                dir: self.root.clone(),
                reason: "no complete checkpoint (a `step-N/` with a state.json) is there; `--resume auto` starts fresh when there is none".into(),
            }),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn complete(root: &Path, step: u64) {
        let dir = root.join(format!("step-{step}"));
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join(SIDECAR), "{}").unwrap();
    }

    #[test]
    fn latest_is_the_pointer_or_the_newest_complete_step_and_stale_writes_are_removed() {
        let out = tempfile::tempdir().unwrap();
        let c = Checkpoints::of(out.path());
        assert_eq!(c.latest(), None);
        assert!(matches!(c.resolve(Some(&ResumeFrom::Latest)), Err(CheckpointError::NotFound { .. })));
        assert_eq!(c.resolve(Some(&ResumeFrom::Auto)).unwrap(), None);
        complete(c.root(), 2);
        complete(c.root(), 10);
        std::fs::create_dir_all(c.partial_dir(12)).unwrap();
        std::fs::create_dir_all(c.root().join("step-11")).unwrap(); // no sidecar: incomplete
        assert_eq!(c.latest(), Some(c.step_dir(10)), "the highest complete step without a pointer");
        std::fs::write(c.latest_pointer(), "step-2\n").unwrap();
        assert_eq!(c.latest(), Some(c.step_dir(2)), "the pointer wins: step 10 is an abandoned continuation");
        std::fs::write(c.latest_pointer(), "step-11\n").unwrap();
        assert_eq!(c.latest(), Some(c.step_dir(10)), "a pointer to an incomplete directory is ignored");
        std::fs::write(c.root().join("latest.tmp"), "step-12").unwrap();
        let removed = c.clean_stale().unwrap();
        assert_eq!(removed.len(), 2);
        assert!(!c.partial_dir(12).exists() && c.step_dir(10).exists());
        assert_eq!("latest".parse::<ResumeFrom>().unwrap(), ResumeFrom::Latest);
        assert_eq!("runs/x".parse::<ResumeFrom>().unwrap(), ResumeFrom::Dir("runs/x".into()));
    }
}
