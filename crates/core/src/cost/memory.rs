//! Memory per rank: the items every byte is charged under, and the formulas, each as its own
//! function (documented in `docs/cost-model.md`).
//!
//! The same [`MemoryItem`]s name the engine's ledger charges and the cost model's predictions,
//! so a measured peak and a predicted one can be compared item by item.

use serde::ser::SerializeMap;
use serde::{Deserialize, Serialize, Serializer};

use crate::config::{ClusterSpec, DataPlane, Dtype};
use crate::model::Architecture;
use crate::plan::Recompute;

/// Bytes per parameter of gradients in a GPU engine (bf16, accumulated in the parameter dtype).
pub const GRADIENT_BYTES: u64 = 2;

/// What a buffer on a rank holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum MemoryItem {
    /// Parameter shards θ of every EMU on the rank.
    Params,
    /// Optimizer state ω: Adam's moments (and an f32 master copy below f32).
    Optimizer,
    /// Parameter gradients of a training step.
    Gradients,
    /// Activations a forward pass keeps for its backward pass (or until the micro-batch ends).
    Activations,
    /// Gradients of activations during a backward pass.
    ActivationGradients,
    /// Output logits, log-sum-exps, outputs and their gradients.
    Logits,
    /// Keys and values of the sequences being generated.
    KvCache,
    /// Activations and gradients received from the neighbouring pipeline stages.
    PipelineBuffers,
    /// Buffers packing non-contiguous rectangles for transfers (resharding, weight sync).
    PackBuffers,
    /// Library workspaces and communication buffers (GPU engines).
    Workspace,
}

impl MemoryItem {
    /// Every item, in index order.
    pub const ALL: [MemoryItem; 10] = [
        MemoryItem::Params,
        MemoryItem::Optimizer,
        MemoryItem::Gradients,
        MemoryItem::Activations,
        MemoryItem::ActivationGradients,
        MemoryItem::Logits,
        MemoryItem::KvCache,
        MemoryItem::PipelineBuffers,
        MemoryItem::PackBuffers,
        MemoryItem::Workspace,
    ];

    /// The name in messages, ledgers and JSON.
    pub fn name(self) -> &'static str {
        match self {
            MemoryItem::Params => "params",
            MemoryItem::Optimizer => "optimizer",
            MemoryItem::Gradients => "gradients",
            MemoryItem::Activations => "activations",
            MemoryItem::ActivationGradients => "activation_gradients",
            MemoryItem::Logits => "logits",
            MemoryItem::KvCache => "kv_cache",
            MemoryItem::PipelineBuffers => "pipeline_buffers",
            MemoryItem::PackBuffers => "pack_buffers",
            MemoryItem::Workspace => "workspace",
        }
    }

    fn index(self) -> usize {
        self as usize
    }
}

/// Bytes per [`MemoryItem`] on one rank (serialized as `{"params": …, "optimizer": …, …}`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct MemoryBreakdown([u64; MemoryItem::ALL.len()]);

impl MemoryBreakdown {
    /// Bytes of `item`.
    pub fn get(&self, item: MemoryItem) -> u64 {
        self.0[item.index()]
    }

    /// Adds `bytes` to `item`.
    pub fn add(&mut self, item: MemoryItem, bytes: u64) {
        self.0[item.index()] += bytes;
    }

    /// Removes up to `bytes` from `item`.
    pub fn sub(&mut self, item: MemoryItem, bytes: u64) {
        self.0[item.index()] = self.0[item.index()].saturating_sub(bytes);
    }

    /// Item by item sum.
    pub fn plus(&self, other: &MemoryBreakdown) -> MemoryBreakdown {
        let mut out = *self;
        for (a, b) in out.0.iter_mut().zip(other.0) {
            *a += b;
        }
        out
    }

    /// Sum of all items.
    pub fn total(&self) -> u64 {
        self.0.iter().sum()
    }
}

impl Serialize for MemoryBreakdown {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let mut map = s.serialize_map(Some(MemoryItem::ALL.len()))?;
        for item in MemoryItem::ALL {
            map.serialize_entry(item.name(), &self.get(item))?;
        }
        map.end()
    }
}

impl<'de> Deserialize<'de> for MemoryBreakdown {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<MemoryBreakdown, D::Error> {
        let named = std::collections::BTreeMap::<String, u64>::deserialize(d)?;
        let mut out = MemoryBreakdown::default();
        for (name, bytes) in named {
            let item = MemoryItem::ALL
                .into_iter()
                .find(|i| i.name() == name)
                .ok_or_else(|| serde::de::Error::custom(format!("unknown memory item `{name}`")))?;
            out.add(item, bytes);
        }
        Ok(out)
    }
}

/// Which engine's buffers a plan is costed for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum EngineKind {
    /// The CPU reference engine of `src/engine/` (f32, every activation of a micro-batch kept,
    /// the KV cache sized for the longest response): what runs on the MPI data plane.
    Reference,
    /// The same engine on a device (`--device emulated|cuda|rocm`): bf16 activations, f32
    /// statistics, gradients and optimizer state, attention saving log-sum-exps rather than
    /// probabilities (`cost/reference.rs` with [`super::reference::Residence::Device`]).
    Device,
    /// A GPU engine in Megatron's style: mixed precision with persistent gradients, activations
    /// per Korthikanti et al. with the chosen recomputation, fused attention, workspaces.
    Gpu,
}

impl EngineKind {
    /// The engine that runs `cluster`'s job: Nereus's own engine on a device when the job
    /// names one (`cluster.device`, `--device`: what `nereus train` runs), else by data plane:
    /// the reference engine on MPI, a Megatron-style GPU engine on NCCL/RCCL (what `nereus plan`
    /// sizes for a job that only names its data plane).
    pub fn of(cluster: &ClusterSpec) -> EngineKind {
        match (cluster.device, cluster.data_plane) {
            (Some(_), _) => EngineKind::Device,
            (None, DataPlane::Mpi) => EngineKind::Reference,
            (None, DataPlane::Nccl | DataPlane::Rccl) => EngineKind::Gpu,
        }
    }
}

/// Bytes per parameter of mixed-precision Adam training state: parameters, gradients, an f32
/// master copy (when parameters are not f32) and two f32 moments. bf16 with bf16 gradients:
/// 2 + 2 + 4 + 8 = 16; with f32 gradient accumulation: 2 + 4 + 4 + 8 = 18 (ZeRO paper, §3.1).
pub fn training_state_bytes_per_param(dtype: Dtype, gradient_bytes: u64) -> u64 {
    let master = if dtype == Dtype::F32 { 0 } else { 4 };
    dtype.bytes() + gradient_bytes + master + 8
}

/// Optimizer bytes per parameter: two f32 moments, and an f32 master copy below f32 (the
/// sections an EMU keeps, `emu::Section::of`).
pub fn optimizer_bytes_per_param(dtype: Dtype) -> u64 {
    8 + if dtype == Dtype::F32 { 0 } else { 4 }
}

/// Activation bytes one transformer layer stores for one micro-batch (Korthikanti et al.,
/// "Reducing Activation Recomputation in Large Transformer Models", 2022, §4, 16-bit
/// activations, tensor parallelism without sequence parallelism):
/// no recomputation `s·b·h·(10 + 24/t + 5·a·s/(h·t))`; selective `s·b·h·(10 + 24/t)`;
/// full `2·s·b·h` (the layer input only).
pub fn activation_bytes_per_layer(s: f64, b: f64, h: f64, a: f64, t: f64, recompute: Recompute) -> f64 {
    s * b * h * activation_width(s, h, a, t, recompute)
}

/// The bracket of [`activation_bytes_per_layer`]: bytes per token and residual channel, whatever
/// the micro-batch (`10 + 24/t + 5·a·s/(h·t)`, `10 + 24/t`, or `2`).
pub fn activation_width(s: f64, h: f64, a: f64, t: f64, recompute: Recompute) -> f64 {
    match recompute {
        Recompute::None => 10.0 + 24.0 / t + 5.0 * a * s / (h * t),
        Recompute::Selective => 10.0 + 24.0 / t,
        Recompute::Full => 2.0,
    }
}

/// KV-cache bytes of one sequence of `tokens` tokens: keys and values of every layer and KV
/// head, `2 · layers · kv_heads · head_dim · tokens · bytes`.
pub fn kv_cache_bytes_per_sequence(arch: &Architecture, tokens: u64) -> u64 {
    2 * arch.layers * arch.kv_heads * arch.head_dim * tokens * arch.dtype.bytes()
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
        assert_eq!(optimizer_bytes_per_param(Dtype::F32), 8);
        assert_eq!(optimizer_bytes_per_param(Dtype::Bf16), 12);
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

    #[test]
    fn breakdowns_add_item_by_item_and_serialize_by_name() {
        let mut a = MemoryBreakdown::default();
        a.add(MemoryItem::Params, 10);
        a.add(MemoryItem::KvCache, 5);
        let mut b = MemoryBreakdown::default();
        b.add(MemoryItem::Params, 1);
        let c = a.plus(&b);
        assert_eq!((c.get(MemoryItem::Params), c.total()), (11, 16));
        let json = serde_json::to_value(c).unwrap();
        assert_eq!((json["params"].as_u64(), json["kv_cache"].as_u64()), (Some(11), Some(5)));
    }
}
