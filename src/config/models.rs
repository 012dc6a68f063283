//! `[models.<role>]`: the architecture of each model in the RL job.
//!
//! All four roles share one Llama-style decoder description. The critic and the reward model
//! carry a scalar value head instead of the language-model head; that follows from the role, so
//! it is not a key.

use serde::{Deserialize, Serialize};

use super::{check, ConfigError};

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
}

/// One `[models.<role>]` table: a Llama-style decoder-only transformer.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ModelSpec {
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
    /// Parameter and activation dtype.
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
        Ok(())
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
