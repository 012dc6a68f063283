//! What one rank at one pipeline position of a candidate holds: the formulas of
//! [`CostModel::position_memory`], split into what the layout fixes (the position's state and
//! the shapes its buffers scale with, [`PositionCost`]) and what a variant of it chooses (the
//! micro-batch or decode wave, the recomputation: [`PositionCost::memory`]). A search that
//! prices many variants of one layout derives the first once.

use super::memory::{
    activation_width, kv_cache_bytes_per_sequence, EngineKind, MemoryBreakdown, MemoryItem, GRADIENT_BYTES,
};
use super::reference::{self, Residence};
use super::{micro, per_replica, CostModel, ModelStats, PositionMemory, Workload};
use crate::model::catalogue::blocks_of_stage;
use crate::model::{Layout, LocalShape, OutputHead, Position};
use crate::plan::{Candidate, ModelStage, Recompute, Stage};

/// Workspace per rank of a GPU engine (library workspaces, communicator buffers, allocator
/// slack), capped at 5% of device memory.
const WORKSPACE_BYTES: u64 = 1 << 30;

/// One pipeline position of a layout of a model-stage, whatever the variant: its state and the
/// shapes of its transient buffers.
#[derive(Debug, Clone, Copy)]
pub struct PositionCost {
    /// The model-stage and the position's pipeline index `j` of `pp`.
    model_stage: ModelStage,
    j: u32,
    pp: u32,
    /// Parameters, optimizer state (and persistent gradients on GPU engines).
    state: MemoryBreakdown,
    /// Parameters held (elements).
    params: u64,
    /// What the engine's transient buffers scale with.
    buffers: Buffers,
}

/// The shapes an engine's transient buffers are sized from.
#[derive(Debug, Clone, Copy)]
enum Buffers {
    /// The reference engine sizes every buffer from the position's local shapes, with the
    /// element sizes of where it runs.
    Reference(LocalShape, Residence),
    /// A GPU engine's buffers.
    Gpu(GpuShape),
}

/// A GPU position's buffer shapes (Megatron-style activations per Korthikanti et al.).
#[derive(Debug, Clone, Copy)]
struct GpuShape {
    /// Tokens per sequence.
    seq: u64,
    /// Blocks of the position.
    layers: u64,
    /// Whether the position holds the head.
    last: bool,
    /// f32 outputs of the head per token: the vocabulary shard for LM heads, one value for
    /// value heads.
    head_width: u64,
    /// Residual width and bytes per element.
    hidden: u64,
    dtype_bytes: u64,
    /// The activation formula's width per recomputation choice (in [`Recompute`] order), so
    /// that one layer of a micro-batch of `b` stores `s·b·h·width` bytes.
    activation_width: [f64; 3],
    /// Library workspaces.
    workspace: u64,
    /// KV-cache and logit bytes one in-flight generated sequence adds.
    kv_per_sequence: u64,
    logits_per_sequence: u64,
}

impl CostModel {
    /// What the layout of `c` fixes at pipeline position `j` (only `c`'s model-stage and
    /// layout are read).
    pub fn position_cost(&self, stats: &ModelStats, c: &Candidate, w: &Workload, j: u32) -> PositionCost {
        let params = stats.params_of_stage(c.layout, j);
        let state = self.state_of(stats, c.model_stage, params);
        let buffers = match self.engine {
            EngineKind::Reference | EngineKind::Device => {
                let on = if self.engine == EngineKind::Device { Residence::Device } else { Residence::Host };
                Buffers::Reference(LocalShape::of(&stats.arch, c.layout, Position { tp: 0, pp: j }), on)
            }
            EngineKind::Gpu => Buffers::Gpu(self.gpu_shape(stats, c, w, j)),
        };
        PositionCost { model_stage: c.model_stage, j, pp: c.layout.pp, state, params, buffers }
    }

    /// The state a rank at pipeline position `j` of `layout` keeps for `ms` (what
    /// [`PositionCost::state`] holds, without the buffer shapes).
    pub fn position_state(&self, stats: &ModelStats, ms: ModelStage, layout: Layout, j: u32) -> MemoryBreakdown {
        self.state_of(stats, ms, stats.params_of_stage(layout, j))
    }

    /// Parameters, optimizer state (training) and, on GPU engines, persistent gradients
    /// (training) of `params` elements.
    fn state_of(&self, stats: &ModelStats, ms: ModelStage, params: u64) -> MemoryBreakdown {
        let mut state = reference::state(params, stats.arch.dtype, ms.trains());
        if ms.trains() && self.engine == EngineKind::Gpu {
            state.add(MemoryItem::Gradients, params * GRADIENT_BYTES);
        }
        state
    }

    fn gpu_shape(&self, stats: &ModelStats, c: &Candidate, w: &Workload, j: u32) -> GpuShape {
        let a = &stats.arch;
        let tp = u64::from(c.layout.tp);
        let s = w.seq_len();
        let blocks = blocks_of_stage(a.layers, c.layout.pp, j);
        let layers = blocks.end - blocks.start;
        let last = j + 1 == c.layout.pp;
        let head_width = if a.head == OutputHead::Lm { a.vocab / tp } else { 1 };
        let width = |recompute| activation_width(s as f64, a.hidden as f64, a.heads as f64, tp as f64, recompute);
        GpuShape {
            seq: s,
            layers,
            last,
            head_width,
            hidden: a.hidden,
            dtype_bytes: a.dtype.bytes(),
            activation_width: [Recompute::None, Recompute::Selective, Recompute::Full].map(width),
            workspace: WORKSPACE_BYTES.min(self.hardware.memory_bytes / 20),
            kv_per_sequence: kv_cache_bytes_per_sequence(a, s) / tp * layers / a.layers,
            logits_per_sequence: if last { head_width * 4 } else { 0 },
        }
    }
}

impl PositionCost {
    /// The state the position keeps from step to step (the same for every variant).
    pub fn state(&self) -> &MemoryBreakdown {
        &self.state
    }

    /// What a rank at this position holds under `c`, a variant of the layout it was derived
    /// from (its micro-batch or decode wave, recomputation and replica count), for `w`.
    pub fn memory(&self, c: &Candidate, w: &Workload) -> PositionMemory {
        PositionMemory { state: self.state, transient: self.transient(c, w) }
    }

    /// The transient part of [`PositionCost::memory`]: the largest set of buffers the
    /// position's passes hold at once under `c`.
    // Inlined: a search reads only the total, and then the breakdown stays in registers
    // instead of being written out and read back (a stall per variant estimated).
    #[inline(always)]
    pub fn transient(&self, c: &Candidate, w: &Workload) -> MemoryBreakdown {
        debug_assert_eq!((c.model_stage, c.layout.pp), (self.model_stage, self.pp));
        match &self.buffers {
            Buffers::Reference(shape, on) => self.reference_transient(shape, *on, c, w),
            Buffers::Gpu(shape) => self.gpu_transient(shape, c, w),
        }
    }

    fn reference_transient(&self, s: &LocalShape, on: Residence, c: &Candidate, w: &Workload) -> MemoryBreakdown {
        let seq = w.seq_len();
        let rollout = per_replica(w.sequences, c.dp);
        match c.model_stage.stage {
            // Generation decodes in waves of `micro_batch` sequences.
            Stage::Generation => reference::generation(s, micro(c, rollout), w.prompt_len, w.response_len, on),
            Stage::Inference => reference::inference(s, micro(c, rollout), seq, on),
            Stage::Training => {
                let share = per_replica(w.mini_batch, c.dp);
                let micro = micro(c, share);
                let micro_batches = share.div_ceil(micro);
                let train = reference::training(s, self.params, micro, micro_batches, seq, self.pp, self.j, on);
                // The actor's old log-probabilities run forward-only on its training replicas.
                let old_logp = reference::inference(s, super::micro(c, rollout), seq, on);
                if old_logp.total() > train.total() {
                    old_logp
                } else {
                    train
                }
            }
        }
    }

    #[inline(always)]
    fn gpu_transient(&self, g: &GpuShape, c: &Candidate, w: &Workload) -> MemoryBreakdown {
        let s = g.seq;
        // Recompute's discriminants are the indices of `activation_width`.
        let one_layer = |micro: u64, recompute: Recompute| {
            (s as f64 * micro as f64 * g.hidden as f64 * g.activation_width[recompute as usize]) as u64
        };
        let mut m = MemoryBreakdown::default();
        let micro = match c.model_stage.stage {
            Stage::Training => micro(c, per_replica(w.mini_batch, c.dp)),
            _ => micro(c, per_replica(w.sequences, c.dp)),
        };
        match c.model_stage.stage {
            Stage::Training => {
                // 1F1B: stage j holds `pp − j` in-flight micro-batches of its layers.
                let share = per_replica(w.mini_batch, c.dp);
                let in_flight = u64::from(self.pp - self.j).min(share.div_ceil(micro));
                m.add(MemoryItem::Activations, one_layer(micro, c.recompute) * g.layers * in_flight);
                if g.last {
                    m.add(MemoryItem::Logits, 2 * s * micro * g.head_width * 4);
                }
            }
            Stage::Inference => {
                // Forward only, one layer live at a time, attention fused (scores never stored).
                m.add(MemoryItem::Activations, one_layer(micro, Recompute::Selective));
                if g.last {
                    m.add(MemoryItem::Logits, s * micro * g.head_width * 4);
                }
            }
            Stage::Generation => {
                // Prefill, one layer at a time; the KV cache is added below.
                m.add(MemoryItem::Activations, one_layer(micro, Recompute::Selective));
            }
        }
        let comm_buffers = 4 * s * micro * g.hidden * g.dtype_bytes;
        m.add(MemoryItem::Workspace, g.workspace + comm_buffers);
        if c.model_stage.stage == Stage::Generation {
            // The stage keeps the KV cache of its layers for the wave of sequences in flight.
            m.add(MemoryItem::KvCache, micro * g.kv_per_sequence);
            m.add(MemoryItem::Logits, micro * g.logits_per_sequence);
        }
        m
    }
}

/// The heavier (by peak) of a layout's first position and its last (`None` with one
/// position): the first stage holds the most blocks, the embedding and the most micro-batches
/// in flight, the last one the head and its logits, and middle stages hold no more than the
/// first.
pub fn heavier(first: PositionMemory, last: Option<PositionMemory>) -> PositionMemory {
    match last {
        Some(last) if last_is_heavier(first.peak(), last.peak()) => last,
        _ => first,
    }
}

/// Whether a last position peaking at `last` bytes is the heavier one against a first peaking
/// at `first` (on equal peaks, the first).
pub fn last_is_heavier(first: u64, last: u64) -> bool {
    last > first
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::{ConfigSource, Overrides, RawJobConfig};
    use crate::cost::Efficiencies;
    use crate::planner::Planner;

    /// `EngineKind::Device` prices a position with the reference engine's functions at a
    /// device's sizes (`Residence::Device`, which the engine's own test holds against the
    /// emulated device's ledger), and keeps the reference engine's state.
    #[test]
    fn the_device_engine_prices_the_reference_buffers_at_device_sizes() {
        let source = ConfigSource::embedded_default();
        let overrides = Overrides::default();
        let config =
            RawJobConfig::parse(&source).unwrap().resolve(&source, &overrides, &mut || unreachable!()).unwrap();
        let planner = Planner::new(&config, 4, None, Efficiencies::default()).unwrap();
        let ms = ModelStage::new(crate::plan::Role::Reference, Stage::Inference);
        let (layout, w) = (Layout::new(1, 1), *planner.workload(ms));
        let c = Candidate { model_stage: ms, layout, dp: 1, recompute: Recompute::None, micro_batch: 2 };
        let stats = ModelStats::new(planner.catalogue(ms.role));
        let priced = |engine| {
            let cost = CostModel { engine, ..planner.cost().clone() };
            cost.position_cost(&stats, &c, &w, 0).memory(&c, &w)
        };
        let (host, device) = (priced(EngineKind::Reference), priced(EngineKind::Device));
        let shape = LocalShape::of(&stats.arch, layout, Position { tp: 0, pp: 0 });
        assert_eq!(device.state, host.state);
        assert_eq!(host.transient, reference::inference(&shape, 2, w.seq_len(), Residence::Host));
        assert_eq!(device.transient, reference::inference(&shape, 2, w.seq_len(), Residence::Device));
        assert!(device.transient.total() < host.transient.total());
    }
}
