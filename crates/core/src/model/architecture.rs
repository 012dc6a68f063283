//! Architectures: a Llama-style decoder described by its shape, the numbers that are not
//! shapes (RoPE and RMSNorm constants), and the published models.

use serde::{Deserialize, Serialize};

use crate::config::models::{DEFAULT_RMS_NORM_EPS, DEFAULT_ROPE_THETA};
use crate::config::{Dtype, ModelSpec, RopeScaling};

pub use crate::config::OutputHead;

/// The shape of a decoder-only transformer (Llama 3 / Qwen3 family).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Architecture {
    /// Vocabulary size.
    pub vocab: u64,
    /// Residual width.
    pub hidden: u64,
    /// Transformer blocks.
    pub layers: u64,
    /// Query heads.
    pub heads: u64,
    /// Key/value heads (grouped-query attention).
    pub kv_heads: u64,
    /// Width of one head (`hidden / heads` for Llama; 128 for every Qwen3 size).
    pub head_dim: u64,
    /// SwiGLU inner width.
    pub ffn: u64,
    /// The LM head reuses the embedding matrix.
    pub tie_embeddings: bool,
    /// Per-head RMSNorm on queries and keys (Qwen3).
    pub qk_norm: bool,
    /// LM or value head.
    pub head: OutputHead,
    /// Parameter dtype.
    pub dtype: Dtype,
}

impl Architecture {
    /// The architecture a `[models.<role>]` table describes, with `head` on top (a value head
    /// for critic and reward).
    pub fn from_spec(spec: &ModelSpec, head: OutputHead) -> Architecture {
        Architecture {
            vocab: spec.vocab.into(),
            hidden: spec.hidden.into(),
            layers: spec.layers.into(),
            heads: spec.heads.into(),
            kv_heads: spec.kv_heads.into(),
            head_dim: spec.head_dim_or_default().into(),
            ffn: spec.ffn.into(),
            tie_embeddings: spec.tie_embeddings,
            qk_norm: spec.qk_norm,
            head,
            dtype: spec.dtype,
        }
    }

    /// Meta Llama-3.1-8B (model card: 32 layers, 4096 wide, 32/8 heads, SwiGLU 14336, 128,256 tokens).
    pub fn llama3_1_8b() -> Architecture {
        Self::llama(128_256, 4096, 32, 32, 8, 14_336)
    }

    /// Meta Llama-3.3-70B (80 layers, 8192 wide, 64/8 heads, SwiGLU 28672, 128,256 tokens).
    pub fn llama3_3_70b() -> Architecture {
        Self::llama(128_256, 8192, 80, 64, 8, 28_672)
    }

    /// Qwen3-14B (40 layers, 5120 wide, 40/8 heads of 128, SwiGLU 17408, 151,936 tokens, QK-norm).
    pub fn qwen3_14b() -> Architecture {
        Self::qwen3(5120, 40, 40, 17_408)
    }

    /// Qwen3-32B (64 layers, 5120 wide, 64/8 heads of 128, SwiGLU 25600, 151,936 tokens, QK-norm).
    pub fn qwen3_32b() -> Architecture {
        Self::qwen3(5120, 64, 64, 25_600)
    }

    fn llama(vocab: u64, hidden: u64, layers: u64, heads: u64, kv_heads: u64, ffn: u64) -> Architecture {
        Architecture {
            vocab,
            hidden,
            layers,
            heads,
            kv_heads,
            head_dim: hidden / heads,
            ffn,
            tie_embeddings: false,
            qk_norm: false,
            head: OutputHead::Lm,
            dtype: Dtype::Bf16,
        }
    }

    fn qwen3(hidden: u64, layers: u64, heads: u64, ffn: u64) -> Architecture {
        Architecture { head_dim: 128, qk_norm: true, ..Self::llama(151_936, hidden, layers, heads, 8, ffn) }
    }

    /// The same architecture with a scalar value head instead of the LM head.
    pub fn with_value_head(self) -> Architecture {
        Architecture { head: OutputHead::Value, tie_embeddings: false, ..self }
    }

    /// Query projection width (`heads × head_dim`).
    pub fn q_width(&self) -> u64 {
        self.heads * self.head_dim
    }

    /// Key (and value) projection width (`kv_heads × head_dim`).
    pub fn kv_width(&self) -> u64 {
        self.kv_heads * self.head_dim
    }
}

/// The numbers of a model that are not shapes: the rotary frequencies and the RMSNorm ε. The
/// catalogue, the planner and the cost model never depend on them; the engine computes with
/// them. Kept beside [`Architecture`] rather than in it, so that the shape stays the planner's
/// whole description of a model.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Numerics {
    /// Base θ of the rotary frequencies `θ^(−2i/D)`.
    pub rope_theta: f64,
    /// Frequency scaling of the rotary embedding (Llama 3.1's), if any.
    pub rope_scaling: Option<RopeScaling>,
    /// ε of every RMSNorm (the blocks', QK-norm's and the final one).
    pub rms_norm_eps: f64,
}

// Validated configs hold finite values only, on which `==` is an equivalence.
impl Eq for Numerics {}

impl Default for Numerics {
    /// The tiny models' numbers: θ = 10,000, no scaling, ε = 1e-5.
    fn default() -> Numerics {
        Numerics { rope_theta: DEFAULT_ROPE_THETA, rope_scaling: None, rms_norm_eps: DEFAULT_RMS_NORM_EPS }
    }
}

impl Numerics {
    /// The numbers a `[models.<role>]` table gives.
    pub fn from_spec(spec: &ModelSpec) -> Numerics {
        Numerics { rope_theta: spec.rope_theta, rope_scaling: spec.rope_scaling, rms_norm_eps: spec.rms_norm_eps }
    }
}
