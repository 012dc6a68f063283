//! `[models.<role>]` tables as written, and their resolution: a table may name a Hugging Face
//! model directory (`path`), whose `config.json` ([`hf`]) then supplies every architecture key
//! the table leaves out; a key given in both places must agree. The resolved types are in
//! `models.rs`, which `hf.rs` reads `config.json` into, so both sit below this file.

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use super::models::{spec_map, Dtype, ModelSpec, ModelsSection, RopeScaling};
use super::{hf, ConfigError};

/// One `[models.<role>]` table as written: every key optional, because a model directory
/// (`path`) may supply them. [`RawModelSpec::resolve`] makes it a [`ModelSpec`].
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawModelSpec {
    /// A Hugging Face model directory (see [`ModelSpec::path`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub path: Option<PathBuf>,
    /// See [`ModelSpec::layers`].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub layers: Option<u32>,
    /// See [`ModelSpec::hidden`].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hidden: Option<u32>,
    /// See [`ModelSpec::heads`].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub heads: Option<u32>,
    /// See [`ModelSpec::kv_heads`].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kv_heads: Option<u32>,
    /// See [`ModelSpec::ffn`].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ffn: Option<u32>,
    /// See [`ModelSpec::vocab`].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub vocab: Option<u32>,
    /// See [`ModelSpec::dtype`]; with `path`, the directory's dtype by default.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dtype: Option<Dtype>,
    /// See [`ModelSpec::tie_embeddings`].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tie_embeddings: Option<bool>,
    /// See [`ModelSpec::head_dim`].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub head_dim: Option<u32>,
    /// See [`ModelSpec::qk_norm`].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub qk_norm: Option<bool>,
    /// See [`ModelSpec::rope_theta`].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rope_theta: Option<f64>,
    /// See [`ModelSpec::rms_norm_eps`].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rms_norm_eps: Option<f64>,
    /// See [`ModelSpec::rope_scaling`].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rope_scaling: Option<RopeScaling>,
}

/// Keys a table must give when it names no model directory.
const REQUIRED: [&str; 7] = ["layers", "hidden", "heads", "kv_heads", "ffn", "vocab", "dtype"];

impl RawModelSpec {
    /// The complete table of role `role`: with `path` (relative to `base_dir`), the model
    /// directory's `config.json` supplies the keys the table leaves out, and a key given in both
    /// must agree (`dtype` excepted: it is the job's precision); keys neither gives take their
    /// defaults.
    pub fn resolve(&self, role: &str, base_dir: &Path) -> Result<ModelSpec, ConfigError> {
        let key = |k: &str| format!("models.{role}.{k}");
        let written = match serde_json::to_value(self) {
            Ok(serde_json::Value::Object(map)) => map,
            _ => unreachable!("a table of plain values serializes to a JSON object"),
        };
        let mut merged = serde_json::Map::new();
        if let Some(path) = &self.path {
            let dir = base_dir.join(path);
            let bad = |reason: String| ConfigError::ModelDirectory { key: key("path"), path: dir.clone(), reason };
            let found = hf::read_model_config(&dir).map_err(bad)?;
            if let Some(d) = hf::disagreement(&written, &found.spec) {
                return Err(ConfigError::Conflict {
                    key: key(d.key),
                    value: d.ours,
                    file: dir.join(hf::CONFIG_JSON),
                    file_key: d.hf_key.into(),
                    file_value: d.theirs,
                });
            }
            merged = spec_map(&found.spec);
            merged.insert("path".into(), serde_json::json!(dir));
        }
        merged.extend(written.into_iter().filter(|(k, _)| k != "path"));
        if let Some(missing) = REQUIRED.iter().find(|k| !merged.contains_key(**k)) {
            return Err(ConfigError::Missing {
                key: key(missing),
                hint: "set it in the table, or set `path` to a Hugging Face model directory whose config.json gives it"
                    .into(),
            });
        }
        serde_json::from_value(serde_json::Value::Object(merged))
            .map_err(|e| ConfigError::invalid(format!("models.{role}"), "the merged table", e.to_string()))
    }
}

/// The `[models]` table as written (see [`RawModelSpec`]).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawModelsSection {
    /// `[models.actor]`.
    pub actor: RawModelSpec,
    /// `[models.reference]`.
    pub reference: RawModelSpec,
    /// `[models.reward]`.
    pub reward: RawModelSpec,
    /// `[models.critic]` (PPO only).
    pub critic: Option<RawModelSpec>,
}

impl RawModelsSection {
    /// Every table resolved ([`RawModelSpec::resolve`]); relative `path`s against `base_dir`.
    pub fn resolve(&self, base_dir: &Path) -> Result<ModelsSection, ConfigError> {
        Ok(ModelsSection {
            actor: self.actor.resolve("actor", base_dir)?,
            reference: self.reference.resolve("reference", base_dir)?,
            reward: self.reward.resolve("reward", base_dir)?,
            critic: self.critic.as_ref().map(|c| c.resolve("critic", base_dir)).transpose()?,
        })
    }
}
