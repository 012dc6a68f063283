//! Test fixtures shared by the crate's unit tests.

use nereus_core::config::Dtype;
use nereus_core::model::{Architecture, OutputHead};

/// A model small enough for unit tests that still has every part the engine and the EMUs
/// shard: GQA (4 query heads over 2 KV heads), QK-norm, untied embeddings. Tests that need
/// another shape change fields with struct-update syntax.
pub fn tiny_architecture(dtype: Dtype) -> Architecture {
    Architecture {
        vocab: 48,
        hidden: 16,
        layers: 4,
        heads: 4,
        kv_heads: 2,
        head_dim: 4,
        ffn: 24,
        tie_embeddings: false,
        qk_norm: true,
        head: OutputHead::Lm,
        dtype,
    }
}
