//! `[models.<role>]`: the architecture of each model in the RL job.
//!
//! All four roles share one Llama-style decoder description. The critic and the reward model
//! carry a scalar value head instead of the language-model head; that follows from the role, so
//! it is not a key. A table may name a Hugging Face model directory (`path`): its `config.json`
//! then supplies every architecture key the table leaves out, and a key given in both places
//! must agree ([`RawModelSpec::resolve`]).

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use super::{check, hf, ConfigError};

/// Number format of parameters and activations on the device.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Dtype {
    /// IEEE single precision (the CPU reference engine).
    F32,
    /// bfloat16 (mixed-precision training on GPUs, with f32 master weights and moments).
    Bf16,
    /// IEEE half precision.
    F16,
}

impl Dtype {
    /// Bytes per element.
    pub fn bytes(self) -> u64 {
        match self {
            Dtype::F32 => 4,
            Dtype::Bf16 | Dtype::F16 => 2,
        }
    }

    /// The name as written in the TOML (`f32`, `bf16`, `f16`).
    pub fn name(self) -> &'static str {
        match self {
            Dtype::F32 => "f32",
            Dtype::Bf16 => "bf16",
            Dtype::F16 => "f16",
        }
    }
}

/// Rotary-embedding frequency scaling (Hugging Face's `rope_scaling`, or the scaling part of
/// `rope_parameters`). Only Llama 3.1's rule exists among the supported families.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "lowercase", deny_unknown_fields)]
pub enum RopeScaling {
    /// Llama 3.1: wavelengths longer than `original_max_position_embeddings / low_freq_factor`
    /// are stretched by `factor`, those shorter than `… / high_freq_factor` are kept, and the
    /// band between is interpolated smoothly.
    Llama3 {
        /// How much longer the context gets (8 for Llama 3.1).
        factor: f64,
        /// Lower edge of the interpolated band, in wavelengths per original context (1).
        low_freq_factor: f64,
        /// Upper edge of the interpolated band (4).
        high_freq_factor: f64,
        /// The context length the model was pre-trained with (8192).
        original_max_position_embeddings: u32,
    },
}

impl RopeScaling {
    /// Checks the scaling's numbers; `key` is `models.<role>.rope_scaling`.
    fn validate(&self, key: &str) -> Result<(), ConfigError> {
        let RopeScaling::Llama3 { factor, low_freq_factor, high_freq_factor, original_max_position_embeddings } = *self;
        check::within(&format!("{key}.factor"), factor, 1.0, 1e6)?;
        check::positive(&format!("{key}.low_freq_factor"), low_freq_factor)?;
        check::positive(&format!("{key}.high_freq_factor"), high_freq_factor)?;
        if high_freq_factor <= low_freq_factor {
            return Err(ConfigError::invalid(
                format!("{key}.high_freq_factor"),
                check::show(high_freq_factor),
                format!("must be greater than low_freq_factor ({})", check::show(low_freq_factor)),
            ));
        }
        check::at_least_one(&format!("{key}.original_max_position_embeddings"), original_max_position_embeddings)
    }
}

/// The RoPE base of the tiny models (Llama 2's 10,000) when neither the table nor a model
/// directory gives one.
pub const DEFAULT_ROPE_THETA: f64 = 10_000.0;

/// The RMSNorm ε of the tiny models when neither the table nor a model directory gives one.
pub const DEFAULT_RMS_NORM_EPS: f64 = 1e-5;

fn default_rope_theta() -> f64 {
    DEFAULT_ROPE_THETA
}

fn default_rms_norm_eps() -> f64 {
    DEFAULT_RMS_NORM_EPS
}

/// One `[models.<role>]` table, resolved: a Llama-style decoder-only transformer, every key
/// known (from the table, the model directory's `config.json`, or the default).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ModelSpec {
    /// The Hugging Face model directory the model starts from (`config.json` and safetensors
    /// weights), relative paths resolved against the job file's directory; unset for a model
    /// initialized by the engine.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub path: Option<PathBuf>,
    /// Number of transformer blocks.
    pub layers: u32,
    /// Model (residual stream) width.
    pub hidden: u32,
    /// Attention (query) heads; must divide `hidden`, and `hidden / heads` must be even (rotary).
    pub heads: u32,
    /// Key/value heads for grouped-query attention; must divide `heads`.
    pub kv_heads: u32,
    /// Inner width of the SwiGLU feed-forward block.
    pub ffn: u32,
    /// Vocabulary size.
    pub vocab: u32,
    /// Parameter and activation dtype of the job (a model directory's weights are converted on
    /// load, so this is a choice of the job, not an architecture key).
    pub dtype: Dtype,
    /// Share the input embedding with the output (LM) head.
    #[serde(default)]
    pub tie_embeddings: bool,
    /// Width of one attention head; default `hidden / heads` (Qwen3 uses 128 at every size).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub head_dim: Option<u32>,
    /// Per-head RMSNorm of queries and keys (Qwen3).
    #[serde(default)]
    pub qk_norm: bool,
    /// Base θ of the rotary frequencies (Llama 3: 500,000; Qwen3: 1,000,000).
    #[serde(default = "default_rope_theta")]
    pub rope_theta: f64,
    /// ε of every RMSNorm (Llama 3: 1e-5; Qwen3: 1e-6).
    #[serde(default = "default_rms_norm_eps")]
    pub rms_norm_eps: f64,
    /// Rotary frequency scaling (Llama 3.1's `llama3`); none by default.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rope_scaling: Option<RopeScaling>,
}

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

/// A resolved table as a JSON object (the form the merge and the comparisons work on).
pub fn spec_map(spec: &ModelSpec) -> serde_json::Map<String, serde_json::Value> {
    match serde_json::to_value(spec) {
        Ok(serde_json::Value::Object(map)) => map,
        _ => unreachable!("a table of plain values serializes to a JSON object"),
    }
}

impl ModelSpec {
    /// Checks shapes; `role` prefixes the key (`models.<role>.<key>`).
    pub fn validate(&self, role: &str) -> Result<(), ConfigError> {
        let key = |k: &str| format!("models.{role}.{k}");
        check::at_least_one(&key("layers"), self.layers)?;
        check::at_least_one(&key("hidden"), self.hidden)?;
        check::at_least_one(&key("heads"), self.heads)?;
        check::at_least_one(&key("kv_heads"), self.kv_heads)?;
        check::at_least_one(&key("ffn"), self.ffn)?;
        match self.head_dim {
            Some(head_dim) => {
                if head_dim == 0 || head_dim % 2 != 0 {
                    return Err(ConfigError::invalid(
                        key("head_dim"),
                        head_dim,
                        "must be even and at least 2 (rotary embeddings rotate pairs)",
                    ));
                }
            }
            None => {
                check::divides(&key("heads"), self.heads, self.hidden, &format!("models.{role}.hidden"))?;
                let head_dim = self.hidden / self.heads;
                if !head_dim.is_multiple_of(2) {
                    return Err(ConfigError::invalid(
                        key("heads"),
                        self.heads,
                        format!(
                            "gives an odd head dimension {} / {} = {head_dim}; rotary embeddings need it even",
                            self.hidden, self.heads
                        ),
                    ));
                }
            }
        }
        check::divides(&key("kv_heads"), self.kv_heads, self.heads, &format!("models.{role}.heads"))?;
        if self.vocab < 2 {
            return Err(ConfigError::invalid(key("vocab"), self.vocab, "must be at least 2"));
        }
        check::positive(&key("rope_theta"), self.rope_theta)?;
        check::within(&key("rms_norm_eps"), self.rms_norm_eps, f64::MIN_POSITIVE, 1.0)?;
        if let Some(scaling) = &self.rope_scaling {
            scaling.validate(&key("rope_scaling"))?;
        }
        Ok(())
    }

    /// The table without `path` (which says where the model came from, not what it is), as a
    /// JSON object: what checkpoints and roles compare.
    pub fn architecture_map(&self) -> serde_json::Map<String, serde_json::Value> {
        let mut map = spec_map(self);
        map.remove("path");
        map
    }

    /// The width of one head: `head_dim`, else `hidden / heads`.
    pub fn head_dim_or_default(&self) -> u32 {
        self.head_dim.unwrap_or(self.hidden / self.heads.max(1))
    }
}

/// The `[models]` table: one architecture per role. Unknown roles are rejected by name.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ModelsSection {
    /// The policy being trained (generation and training model-stages).
    pub actor: ModelSpec,
    /// The frozen reference policy for the KL penalty (inference only).
    pub reference: ModelSpec,
    /// The reward model (inference only, scalar head).
    pub reward: ModelSpec,
    /// The value model (PPO only: inference and training, scalar head).
    pub critic: Option<ModelSpec>,
}

impl ModelsSection {
    /// Each role with its name, in a fixed order (actor, critic, reference, reward).
    pub fn roles(&self) -> Vec<(&'static str, &ModelSpec)> {
        let mut out = vec![("actor", &self.actor)];
        if let Some(c) = &self.critic {
            out.push(("critic", c));
        }
        out.push(("reference", &self.reference));
        out.push(("reward", &self.reward));
        out
    }

    /// Validates every role, then the cross-role rules (the reference must match the actor).
    pub fn validate(&self) -> Result<(), ConfigError> {
        for (role, spec) in self.roles() {
            spec.validate(role)?;
        }
        let scorers = [("critic", self.critic.as_ref()), ("reward", Some(&self.reward))];
        for (role, spec) in scorers.into_iter().filter_map(|(r, s)| s.map(|s| (r, s))) {
            if spec.vocab < self.actor.vocab {
                return Err(ConfigError::invalid(
                    format!("models.{role}.vocab"),
                    spec.vocab,
                    format!(
                        "must be at least models.actor.vocab ({}): the {role} model reads the actor's tokens",
                        self.actor.vocab
                    ),
                ));
            }
        }
        if self.reference.vocab != self.actor.vocab {
            return Err(ConfigError::invalid(
                "models.reference.vocab",
                self.reference.vocab,
                format!(
                    "must equal models.actor.vocab ({}): the KL penalty compares their token distributions",
                    self.actor.vocab
                ),
            ));
        }
        Ok(())
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
