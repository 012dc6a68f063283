//! `[models.<role>]`: the architecture of each model in the RL job, resolved.
//!
//! All four roles share one Llama-style decoder description. The critic and the reward model
//! carry a scalar value head instead of the language-model head; that follows from the role, so
//! it is not a key. A table may name a Hugging Face model directory (`path`): its `config.json`
//! then supplies every architecture key the table leaves out, and a key given in both places
//! must agree; the tables as written and that merge are in `raw_models.rs`
//! ([`RawModelSpec::resolve`](super::RawModelSpec::resolve)), above both this file and
//! `hf.rs`, which reads `config.json` into the types defined here.

use std::path::PathBuf;

use serde::{Deserialize, Serialize};

use super::{check, ConfigError};

/// What sits on top of the last block.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum OutputHead {
    /// Language-model head over the vocabulary (actor, reference).
    Lm,
    /// Scalar value head (critic, reward model), as Hugging Face's `score.weight`.
    Value,
}

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
