//! The sidecar `state.json`: what a checkpoint is (job, algorithm, seed, step, data position,
//! counters) and what it holds (per model its architecture and each file's size and SHA-256).

use std::collections::BTreeMap;
use std::path::Path;

use serde::{Deserialize, Serialize};

use super::error::CheckpointError;
use nereus_core::config::{Algorithm, ModelSpec};
use nereus_core::plan::Plan;
use nereus_core::policy::controller::ControllerState;
use nereus_data::model_files::{sha256_hex, write_durably, FileDigest};
use nereus_exec::emu::Counters;

/// Sidecar format version (2: architectures, file digests, atomic directories; 3: every model a
/// Hugging Face model directory, every file of it listed).
pub const FORMAT: u32 = 3;

/// The sidecar's file name inside a checkpoint directory.
pub const SIDECAR: &str = "state.json";

/// One model of a checkpoint.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SavedModel {
    /// The architecture it was trained with (`[models.<role>]`).
    pub architecture: ModelSpec,
    /// Its Hugging Face model directory inside the checkpoint (the model's name).
    pub dir: String,
    /// Every file of that directory: `config.json`, `generation_config.json`, the weights
    /// (shards and index), tokenizer files.
    pub files: Vec<FileDigest>,
    /// The optimizer file (AdamW moments) beside the directory, for models that train.
    pub optimizer: Option<FileDigest>,
}

/// The sidecar of a checkpoint.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Sidecar {
    /// Format version ([`FORMAT`]).
    pub format: u32,
    /// `job.name`.
    pub job: String,
    /// `rl.algorithm`.
    pub algorithm: Algorithm,
    /// `job.seed`.
    pub seed: u64,
    /// RL steps completed.
    pub step: u64,
    /// Prompts per step when it was written (the data position advances by it).
    pub prompts_per_step: u32,
    /// Prompts consumed (the data loader's position): `step × prompts_per_step`.
    pub data_position: u64,
    /// Counters per model-stage (`actor/training`, …).
    pub counters: BTreeMap<String, Counters>,
    /// Per model (`actor`, `critic`, `reference`, `reward`).
    pub models: BTreeMap<String, SavedModel>,
    /// How the random state is derived (nothing else to store: draws are counter-based).
    pub rng: String,
    /// Where this checkpoint stands among the output directory's checkpoints (absent from
    /// checkpoints written before lineages were recorded).
    #[serde(default, skip_serializing_if = "Lineage::is_unset")]
    pub lineage: Lineage,
    /// The plan the job ran under when it was written (absent from older checkpoints).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub plan: Option<Plan>,
    /// What the controller had learned (absent under `policy.mode = "off"` and from older
    /// checkpoints): a resumed run continues with it and decides as an uninterrupted one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub controller: Option<ControllerState>,
    /// SHA-256 of this sidecar as written with this field empty: an edited or damaged
    /// `state.json` is refused as such ([`Sidecar::seal`]).
    pub sha256: String,
}

/// A checkpoint's place in the history of its output directory: the order it was written in,
/// and the chain of checkpoints the run that wrote it continued from.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Lineage {
    /// 1 + the highest sequence among the directory's complete checkpoints when it was written:
    /// the newest checkpoint is the one with the highest sequence, whatever its step (after a
    /// resume from an earlier step, higher `step-N/` belong to the abandoned continuation).
    pub sequence: u64,
    /// The checkpoints this run continued from, oldest first (`step-N` names; empty for a run
    /// from a fresh start).
    pub resumed_from: Vec<String>,
}

impl Lineage {
    fn is_unset(&self) -> bool {
        self.sequence == 0 && self.resumed_from.is_empty()
    }
}

impl Sidecar {
    /// Reads `dir/state.json`.
    pub fn read(dir: &Path) -> Result<Sidecar, CheckpointError> {
        let path = dir.join(SIDECAR);
        let text = nereus_core::file_error::read_regular_string(&path).map_err(|e| match e.source.kind() {
            std::io::ErrorKind::NotFound => CheckpointError::NotFound {
                dir: dir.into(),
                reason: format!("`{SIDECAR}` is missing (not a complete checkpoint)"),
            },
            _ if e.is_not_regular() => CheckpointError::Damaged { path: path.clone(), reason: e.source.to_string() },
            _ => CheckpointError::Io { action: "read", path: path.clone(), source: e.source },
        })?;
        let format: serde_json::Value = serde_json::from_str(&text)
            .map_err(|e| CheckpointError::Damaged { path: path.clone(), reason: format!("not JSON: {e}") })?;
        if format.get("format").and_then(|f| f.as_u64()) != Some(u64::from(FORMAT)) {
            let found = format.get("format").map_or("none".into(), ToString::to_string);
            return Err(CheckpointError::Damaged {
                path,
                reason: format!("sidecar format {found}; this build reads format {FORMAT}"),
            });
        }
        let sidecar: Sidecar = serde_json::from_str(&text).map_err(|e| CheckpointError::Damaged {
            path: path.clone(),
            reason: format!("not a checkpoint sidecar: {e}"),
        })?;
        let expected = sidecar.digest();
        if sidecar.sha256 != expected {
            return Err(CheckpointError::Damaged {
                path,
                reason: format!("its content does not match its own SHA-256 (recorded {}, content {expected}): it was edited or damaged", sidecar.sha256),
            });
        }
        Ok(sidecar)
    }

    /// The SHA-256 of this sidecar with its `sha256` field empty.
    fn digest(&self) -> String {
        sha256_hex(&Sidecar { sha256: String::new(), ..self.clone() }.to_bytes())
    }

    /// Records the sidecar's own digest (the last change before it is written).
    pub fn seal(&mut self) {
        self.sha256 = self.digest();
    }

    /// Writes the sidecar, sealed, as `dir/state.json` (durably).
    pub fn write_sealed(&mut self, dir: &Path) -> Result<(), CheckpointError> {
        self.seal();
        Ok(write_durably(&dir.join(SIDECAR), &self.to_bytes())?)
    }

    /// The sidecar as written into the checkpoint.
    pub fn to_bytes(&self) -> Vec<u8> {
        let mut text = serde_json::to_string_pretty(self).expect("sidecars serialize");
        text.push('\n');
        text.into_bytes()
    }
}
