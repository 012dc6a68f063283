//! Memory per rank: the formulas, each as its own function (documented in `docs/cost-model.md`).

use serde::Serialize;

use crate::config::Dtype;
use crate::model::Architecture;
use crate::plan::Recompute;

/// Bytes per parameter of gradients (bf16, accumulated in the parameter dtype).
pub const GRADIENT_BYTES: u64 = 2;

/// Bytes per parameter of mixed-precision Adam training state: parameters, gradients, an f32
/// master copy (when parameters are not f32) and two f32 moments. bf16 with bf16 gradients:
/// 2 + 2 + 4 + 8 = 16; with f32 gradient accumulation: 2 + 4 + 4 + 8 = 18 (ZeRO paper, §3.1).
pub fn training_state_bytes_per_param(dtype: Dtype, gradient_bytes: u64) -> u64 {
    let master = if dtype == Dtype::F32 { 0 } else { 4 };
    dtype.bytes() + gradient_bytes + master + 8
}

/// Activation bytes one transformer layer stores for one micro-batch (Korthikanti et al.,
/// "Reducing Activation Recomputation in Large Transformer Models", 2022, §4, 16-bit
/// activations, tensor parallelism without sequence parallelism):
/// no recomputation `s·b·h·(10 + 24/t + 5·a·s/(h·t))`; selective `s·b·h·(10 + 24/t)`;
/// full `2·s·b·h` (the layer input only).
pub fn activation_bytes_per_layer(s: f64, b: f64, h: f64, a: f64, t: f64, recompute: Recompute) -> f64 {
    match recompute {
        Recompute::None => s * b * h * (10.0 + 24.0 / t + 5.0 * a * s / (h * t)),
        Recompute::Selective => s * b * h * (10.0 + 24.0 / t),
        Recompute::Full => 2.0 * s * b * h,
    }
}

/// KV-cache bytes of one sequence of `tokens` tokens: keys and values of every layer and KV
/// head, `2 · layers · kv_heads · head_dim · tokens · bytes`.
pub fn kv_cache_bytes_per_sequence(arch: &Architecture, tokens: u64) -> u64 {
    2 * arch.layers * arch.kv_heads * arch.head_dim * tokens * arch.dtype.bytes()
}

/// What one rank holds at its peak while a model-stage runs.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize)]
pub struct MemoryBreakdown {
    /// Parameter shard.
    pub params: u64,
    /// Gradients (training).
    pub gradients: u64,
    /// Master weights and Adam moments (training).
    pub optimizer: u64,
    /// Stored activations (training: in-flight micro-batches; inference: one layer).
    pub activations: u64,
    /// KV cache (generation).
    pub kv_cache: u64,
    /// Output logits (f32) on the last stage.
    pub logits: u64,
    /// Library workspaces and communication buffers.
    pub workspace: u64,
    /// State of other model-stages resident on the same ranks.
    pub resident: u64,
}

impl MemoryBreakdown {
    /// Sum of all parts.
    pub fn total(&self) -> u64 {
        self.params
            + self.gradients
            + self.optimizer
            + self.activations
            + self.kv_cache
            + self.logits
            + self.workspace
            + self.resident
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mixed_precision_adam_is_16_to_18_bytes_per_parameter() {
        // Written out: bf16 θ (2) + grads (2 or 4) + f32 master (4) + f32 m (4) + f32 v (4).
        assert_eq!(training_state_bytes_per_param(Dtype::Bf16, 2), 2 + 2 + 4 + 4 + 4);
        assert_eq!(training_state_bytes_per_param(Dtype::Bf16, 4), 2 + 4 + 4 + 4 + 4);
        assert_eq!(training_state_bytes_per_param(Dtype::Bf16, 2), 16);
        assert_eq!(training_state_bytes_per_param(Dtype::Bf16, 4), 18);
    }

    #[test]
    fn korthikanti_formulas() {
        // GPT-3 175B row of the paper's Table 2 setting: s = 2048, b = 1, h = 12288, a = 96, t = 8.
        let (s, b, h, a, t) = (2048.0, 1.0, 12288.0, 96.0, 8.0);
        let none = activation_bytes_per_layer(s, b, h, a, t, Recompute::None);
        assert_eq!(none, s * b * h * 10.0 + s * b * h * 24.0 / t + 5.0 * a * s * s * b / t);
        let selective = activation_bytes_per_layer(s, b, h, a, t, Recompute::Selective);
        assert_eq!(selective, s * b * h * (10.0 + 3.0));
        assert_eq!(activation_bytes_per_layer(s, b, h, a, t, Recompute::Full), 2.0 * s * b * h);
        // Without parallelism the no-recompute formula is the paper's sbh(34 + 5as/h).
        assert_eq!(activation_bytes_per_layer(s, b, h, a, 1.0, Recompute::None), s * b * h * (34.0 + 5.0 * a * s / h));
    }

    #[test]
    fn llama_3_1_8b_kv_cache_at_8k_tokens_is_one_gib() {
        let arch = Architecture::llama3_1_8b();
        // 2 (K, V) × 32 layers × 8 KV heads × 128 dims × 8192 tokens × 2 bytes.
        assert_eq!(kv_cache_bytes_per_sequence(&arch, 8192), 2 * 32 * 8 * 128 * 8192 * 2);
        assert_eq!(kv_cache_bytes_per_sequence(&arch, 8192), 1 << 30);
    }
}
