//! The reference engine's transient memory, buffer by buffer as `crates/exec/src/engine/`
//! charges it to the ledger, on the host (f32) or on a device (the same code over the device
//! kernels: bf16 activations and activation gradients, f32 statistics, gradients and logits'
//! reductions). Legend: `b` sequences of `t` new positions attending to `tk` positions, `n =
//! b·t` token rows, local widths `C` (residual), `H·D` (queries), `K·D` (keys, values), `F`
//! (SwiGLU), `V` (vocabulary shard). Every function returns bytes.
//!
//! A micro-batch keeps every activation of its forward pass until its backward pass (training)
//! or its end (inference) releases them; the 1F1B schedule keeps at most `pp − j` micro-batches
//! in flight on stage `j`; generation keeps the KV cache of the whole replica's sequences,
//! sized for the longest response.

use super::memory::{optimizer_bytes_per_param, MemoryBreakdown, MemoryItem};
use crate::config::Dtype;
use crate::model::{LocalShape, OutputHead};

/// The widest head the device's flash attention kernels take (`crates/kernels/device/flash_attention.cu`);
/// wider heads run the scalar kernels, whose backward gathers `dk, dv` in f32 with atomics.
pub const FLASH_MAX_HEAD_DIM: usize = 128;

/// Keys flash-decoding stages at once (`crates/kernels/device/decode_attention.cu`): a split
/// holds a whole number of them.
pub const DECODE_TILE: usize = 32;
/// Most query heads a group, widest head and most outputs (heads of a group × width) a
/// flash-decoding block takes (`NEREUS_DECODE_MAX_*`).
pub const DECODE_MAX_GROUP: usize = 16;
/// See [`DECODE_MAX_GROUP`].
pub const DECODE_MAX_HEAD_DIM: usize = 256;
/// See [`DECODE_MAX_GROUP`].
pub const DECODE_MAX_OUTPUTS: usize = 1024;
/// Blocks flash-decoding aims to keep busy: two waves of a 132-SM H100 or H200 (no more splits
/// than that once the batch and the key/value heads give that many blocks).
pub const DECODE_BLOCKS_WANTED: usize = 264;

/// How flash-decoding splits each sequence's keys across blocks, and the f32 scratch its splits
/// leave for the combine (`engine::compute::OnDevice` keeps one for a whole decode).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DecodeSplit {
    /// Blocks per (sequence, key/value head).
    pub splits: usize,
    /// Keys per split, a multiple of [`DECODE_TILE`].
    pub split_keys: usize,
}

impl DecodeSplit {
    /// The split for `b` sequences' caches of `t_cap` positions and `kv_heads` groups, or
    /// `None` when the kernel does not take the heads (`group` query heads of width `d` a group:
    /// at most 16 heads, 256 wide, 1,024 outputs) or the cache is empty. It depends on the cache's capacity, not on
    /// how far the decode has come, so a recorded step's launches stay valid as it advances.
    pub fn for_cache(b: usize, t_cap: usize, kv_heads: usize, group: usize, d: usize) -> Option<DecodeSplit> {
        let takes = group > 0 && group <= DECODE_MAX_GROUP && d > 0 && d <= DECODE_MAX_HEAD_DIM;
        if !takes || group * d > DECODE_MAX_OUTPUTS || t_cap == 0 {
            return None;
        }
        let wanted = DECODE_BLOCKS_WANTED.div_ceil((b * kv_heads).max(1));
        let splits = wanted.clamp(1, t_cap.div_ceil(DECODE_TILE).max(1));
        let split_keys = t_cap.div_ceil(splits).div_ceil(DECODE_TILE) * DECODE_TILE;
        Some(DecodeSplit { splits: t_cap.div_ceil(split_keys).max(1), split_keys })
    }

    /// The split of a local shape's decode of `b` sequences over `t_cap` positions.
    pub fn of(s: &LocalShape, b: usize, t_cap: usize) -> Option<DecodeSplit> {
        DecodeSplit::for_cache(b, t_cap, s.kv_heads, s.heads / s.kv_heads.max(1), s.d)
    }

    /// Elements of the scratch for `b` sequences and `heads` query heads of width `d`: each
    /// split's outputs `[b, H, S, D]` and its `(max, Σ exp)` `[b, H, S, 2]` (f32).
    pub fn scratch_elements(&self, b: usize, heads: usize, d: usize) -> usize {
        b * heads * self.splits * (d + 2)
    }
}

/// Where the reference engine computes, which sets its buffers' element sizes and what
/// attention saves for its backward pass.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Residence {
    /// The host f32 engine (`engine::compute::Host`): attention saves its probabilities.
    Host,
    /// The engine on a device (`engine::compute::OnDevice`, the emulator or a GPU): bf16
    /// activations, attention saving one log-sum-exp per query row (flash-style), f32 scratch
    /// where kernels gather with atomics or reduce across the tensor-parallel group.
    Device,
}

impl Residence {
    /// Bytes of one activation (or activation gradient) element.
    pub fn act(self) -> u64 {
        match self {
            Residence::Host => 4,
            Residence::Device => 2,
        }
    }

    /// Bytes attention keeps for its backward pass: the probabilities `[b, H, t, tk]` on the
    /// host, the log-sum-exps `[b, H, t]` on a device (both f32).
    fn attention_saved(self, b: u64, heads: u64, t: u64, tk: u64) -> u64 {
        match self {
            Residence::Host => 4 * b * heads * t * tk,
            Residence::Device => 4 * b * heads * t,
        }
    }

    /// The rotary tables a device uploads for each pass: f32 cosines and sines of `positions`
    /// (the host reads them where the model keeps them). The engine sizes them for its
    /// replica's longest sequence, which the RL step sets to the workload's prompt + response.
    fn rope_tables(self, s: &LocalShape, positions: u64) -> u64 {
        match self {
            Residence::Host => 0,
            Residence::Device => 4 * 2 * positions * (s.d / 2) as u64,
        }
    }
}

/// One block's forward pass (`engine::stage::block_forward`): `xn1, xmid, xn2, out` `[n, C]`,
/// the fused projection `qkv` `[n, H·D + 2·K·D]` (q, k and v, one GEMM), `q, att` `[n, H·D]`, and
/// `k, v` `[n, K·D]` unless `cached` (generation: the split writes them into the KV cache); `gu`
/// `[n, 2F]` (gate and up, one GEMM) and `h` `[n, F]`; the two RMS vectors (f32); what attention
/// saves. A model with q/k-norms splits into `q_raw, k_raw, v` first, keeps `k, v` in buffers
/// even when it caches them (it appends after the norms), and adds the per-head `1/rms` (f32).
pub fn block_forward(s: &LocalShape, b: u64, t: u64, tk: u64, cached: bool, on: Residence) -> u64 {
    let n = b * t;
    let (c, h, k, f) = (s.c as u64, s.heads as u64, s.kv_heads as u64, s.ffn as u64);
    let (qw, kw) = (h * s.d as u64, k * s.d as u64);
    let qkv = qw + 2 * kw;
    let (split, norm_stats) = match (s.qk_norm, cached) {
        (true, _) => (qkv + qw + kw, h + k),
        (false, true) => (qw, 0),
        (false, false) => (qkv, 0),
    };
    on.act() * n * (4 * c + qkv + split + qw + 3 * f) + 4 * n * (2 + norm_stats) + on.attention_saved(b, h, t, tk)
}

/// One block's backward pass (`engine::stage::block_backward`) at its highest moment: it frees
/// each temporary once read, so the largest of `dh, dgu` `[n, F]`, `[n, 2F]`; `dgu, dxn2`
/// (`[n, C]`); `datt, dq` `[n, H·D]` and `dk, dv` `[n, K·D]` while attention's backward runs,
/// with its scratch (a device's flash kernels keep one f32 `delta` per query row and head; its
/// scalar kernels, for heads wider than [`FLASH_MAX_HEAD_DIM`], gather `dk, dv` in f32);
/// `dq, dk, dv` and the fused `dqkv` `[n, H·D + 2·K·D]` at the merge; `dqkv, dxn1`. A model
/// with q/k-norms holds `dq, dk, dv` and two pre-norm gradients at most, less than the merge.
pub fn block_backward(s: &LocalShape, n: u64, on: Residence) -> u64 {
    let (c, f) = (s.c as u64, s.ffn as u64);
    let (qw, kw) = ((s.heads * s.d) as u64, (s.kv_heads * s.d) as u64);
    let scratch = match on {
        Residence::Host => 0,
        Residence::Device if s.d <= FLASH_MAX_HEAD_DIM => 4 * n * s.heads as u64,
        Residence::Device => 4 * 2 * n * kw,
    };
    let widths = [3 * f, 2 * f + c, 2 * (qw + 2 * kw), qw + 2 * kw + c];
    let widest = widths.into_iter().max().unwrap_or(0);
    (on.act() * n * widest).max(on.act() * n * (2 * qw + 2 * kw) + scratch)
}

/// What a micro-batch of `b` sequences of `t` positions keeps after its forward pass on this
/// stage: the input (embedded on the first stage, received elsewhere), every block's
/// activations, and on the last stage the final norm, the outputs, and for an LM the rows'
/// log-sum-exps (the fused head keeps no logits); `training` adds the output gradients.
pub fn micro_batch_forward(s: &LocalShape, b: u64, t: u64, training: bool, on: Residence) -> MemoryBreakdown {
    let n = b * t;
    let c = s.c as u64;
    let mut m = MemoryBreakdown::default();
    let input = if s.first { MemoryItem::Activations } else { MemoryItem::PipelineBuffers };
    m.add(input, on.act() * n * c);
    m.add(MemoryItem::Activations, s.blocks as u64 * block_forward(s, b, t, t, false, on));
    if s.last {
        m.add(MemoryItem::Activations, on.act() * n * c + 4 * n);
        let lse = if s.head == OutputHead::Lm { 4 * n } else { 0 };
        m.add(MemoryItem::Logits, 4 * n + lse + if training { 4 * n } else { 0 });
    }
    m
}

/// One chunk of the fused LM head's logits (`engine/output.rs`): `n` rows of
/// [`LocalShape::vocab_chunk`] columns, the most of them that ever exist at once.
pub fn logits_chunk(s: &LocalShape, n: u64, on: Residence) -> u64 {
    on.act() * n * s.vocab_chunk() as u64
}

/// What the fused LM head's forward holds while it runs, above what it keeps: the rows'
/// running maximum, sum and target logit (f32) and one chunk of logits.
fn head_forward_scratch(s: &LocalShape, n: u64, on: Residence) -> MemoryBreakdown {
    let mut m = MemoryBreakdown::default();
    if s.last && s.head == OutputHead::Lm {
        m.add(MemoryItem::Logits, 3 * 4 * n + logits_chunk(s, n, on));
    }
    m
}

/// The temporaries of one micro-batch's backward pass at their peak. Every block frees its own
/// before the next begins, so one block's highest moment is held above the gradient flowing
/// between blocks: the head's input gradient on the last stage (a value head's own are freed
/// first), the one received from the next stage elsewhere. The fused LM head's backward peaks
/// before the blocks' begin, with its input gradient, that gradient's f32 sum and one chunk of
/// logits (turned into their gradient in place): the peak is the larger of the two moments.
pub fn micro_batch_backward(s: &LocalShape, n: u64, on: Residence) -> MemoryBreakdown {
    let flowing = on.act() * n * s.c as u64;
    let mut held = MemoryBreakdown::default();
    held.add(MemoryItem::ActivationGradients, block_backward(s, n, on));
    if !s.last {
        held.add(MemoryItem::PipelineBuffers, flowing);
        return held;
    }
    held.add(MemoryItem::ActivationGradients, flowing);
    if s.head == OutputHead::Lm {
        let mut head = MemoryBreakdown::default();
        head.add(MemoryItem::ActivationGradients, flowing + 4 * n * s.c as u64);
        head.add(MemoryItem::Logits, logits_chunk(s, n, on));
        // The ledger remembers the first of two equal peaks: the head's comes first.
        if head.total() >= held.total() {
            return head;
        }
    }
    held
}

/// What a rank keeps from step to step for `params` elements of `dtype`: the parameters and,
/// when it trains, the optimizer's state (`optimizer_bytes_per_param`: f32 masters and moments
/// where the parameters are narrower).
pub fn state(params: u64, dtype: Dtype, trains: bool) -> MemoryBreakdown {
    let mut state = MemoryBreakdown::default();
    state.add(MemoryItem::Params, params * dtype.bytes());
    if trains {
        state.add(MemoryItem::Optimizer, params * optimizer_bytes_per_param(dtype));
    }
    state
}

/// Peak of one training step on stage `j` of `pp` (1F1B): the f32 gradient buffer of the
/// position's `params` elements, `min(pp − j, micro_batches)` micro-batches in flight, and one
/// backward pass's temporaries.
#[allow(clippy::too_many_arguments)]
pub fn training(
    s: &LocalShape,
    params: u64,
    micro: u64,
    micro_batches: u64,
    seq: u64,
    pp: u32,
    j: u32,
    on: Residence,
) -> MemoryBreakdown {
    let in_flight = u64::from(pp - j).min(micro_batches.max(1));
    let one = micro_batch_forward(s, micro, seq, true, on);
    let mut m = MemoryBreakdown::default();
    m.add(MemoryItem::Gradients, 4 * params);
    m.add(MemoryItem::Activations, on.rope_tables(s, seq));
    for _ in 0..in_flight {
        m = m.plus(&one);
    }
    m.plus(&micro_batch_backward(s, micro * seq, on))
}

/// Peak of a forward-only pass (inference, and the actor's old log-probabilities): one
/// micro-batch's activations and, at its end, the fused LM head's scratch.
pub fn inference(s: &LocalShape, micro: u64, seq: u64, on: Residence) -> MemoryBreakdown {
    let mut m = micro_batch_forward(s, micro, seq, false, on);
    m.add(MemoryItem::Activations, on.rope_tables(s, seq));
    m.plus(&head_forward_scratch(s, micro * seq, on))
}

/// Peak of generating `r` tokens after a prompt of `p` for `b` sequences: the KV cache for
/// `p + r` positions, on a device flash-decoding's scratch for the whole decode, and the larger
/// of the prefill pass and the last decode step (the input, every block's activations, and on
/// the last stage the whole vocabulary's logits, which a device's sampler reads as they are).
pub fn generation(s: &LocalShape, b: u64, p: u64, r: u64, on: Residence) -> MemoryBreakdown {
    let (c, blocks) = (s.c as u64, s.blocks as u64);
    let mut m = MemoryBreakdown::default();
    m.add(MemoryItem::KvCache, on.act() * blocks * 2 * b * (p + r) * (s.kv_heads * s.d) as u64);
    m.add(MemoryItem::Activations, on.rope_tables(s, p + r));
    if let (Residence::Device, Some(split)) = (on, DecodeSplit::of(s, b as usize, (p + r) as usize)) {
        m.add(MemoryItem::Activations, 4 * split.scratch_elements(b as usize, s.heads, s.d) as u64);
    }
    let pass = |t: u64, tk: u64| {
        let mut x = MemoryBreakdown::default();
        let input = if s.first { MemoryItem::Activations } else { MemoryItem::PipelineBuffers };
        x.add(input, on.act() * b * t * c);
        x.add(MemoryItem::Activations, blocks * block_forward(s, b, t, tk, true, on));
        if s.last {
            // Each sequence's last row (a decode step's rows are theirs already), the final
            // norm's output and its 1/rms; the shard's logits, and the whole vocabulary's where
            // the shards are gathered (TP).
            let last_rows = if t == 1 { 0 } else { on.act() * b * c };
            x.add(MemoryItem::Activations, last_rows + on.act() * b * c + 4 * b);
            let gathered = if s.vocab < s.vocab_total { s.vocab_total as u64 } else { 0 };
            x.add(MemoryItem::Logits, on.act() * b * (s.vocab as u64 + gathered));
        }
        x
    };
    let (prefill, decode) = (pass(p, p), pass(1, p + r));
    m.plus(if prefill.total() >= decode.total() { &prefill } else { &decode })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn shape(first: bool, last: bool) -> LocalShape {
        LocalShape {
            c: 64,
            heads: 4,
            kv_heads: 2,
            d: 16,
            ffn: 176,
            vocab: 32,
            v0: 0,
            vocab_total: 32,
            blocks: 2,
            first,
            last,
            head: OutputHead::Lm,
            qk_norm: false,
        }
    }

    #[test]
    fn a_block_forward_counts_every_buffer_it_keeps() {
        let s = shape(true, true);
        // n = 2·3 rows of C = 64, H·D = 64, K·D = 32, F = 176, and probs 2·4·3·5: per row the
        // four [C] buffers, two 1/rms, qkv (128), q, k, v (128), att (64), gu and h.
        let per_row = 4 * 64 + 2 + 128 + 128 + 64 + 3 * 176;
        assert_eq!(block_forward(&s, 2, 3, 5, false, Residence::Host), 4 * (6 * per_row + 2 * 4 * 3 * 5));
        // Generation's split writes k and v into the cache: 64 fewer per row.
        assert_eq!(block_forward(&s, 2, 3, 5, true, Residence::Host), 4 * (6 * (per_row - 64) + 2 * 4 * 3 * 5));
        let qk_norm = LocalShape { qk_norm: true, ..s };
        // q_raw, k_raw, v, then q, k (224 where 128) and the per-head 1/rms (4 + 2).
        let normed = per_row + 96 + 4 + 2;
        assert_eq!(block_forward(&qk_norm, 2, 3, 5, true, Residence::Host), 4 * (6 * normed + 2 * 4 * 3 * 5));
    }

    #[test]
    fn a_block_backward_holds_its_highest_moment_not_every_temporary() {
        let s = shape(true, true);
        // n = 6 rows; C = 64, H·D = 64, K·D = 32: `dh` and `dgu` (3F = 528) are the most, on the
        // host and on a device (the flash scratch, 4 bytes a row and head, is held with 192).
        assert_eq!(block_backward(&s, 6, Residence::Host), 4 * 6 * 3 * 176);
        assert_eq!(block_backward(&s, 6, Residence::Device), 2 * 6 * 3 * 176);
        // A narrow MLP shard: `dq, dk, dv` beside `dqkv` (2 · 128) are the most.
        let narrow = LocalShape { ffn: 32, ..s };
        assert_eq!(block_backward(&narrow, 6, Residence::Host), 4 * 6 * 256);
        // Heads wider than flash takes: the scalar kernels' f32 `dk, dv` (8 bytes a K·D column)
        // beside `datt, dq, dk, dv` (H·D = K·D·2 = 512 here) outgrow the merge.
        let wide = LocalShape { d: 256, ..narrow };
        let (qw, kw) = (4 * 256, 2 * 256);
        assert_eq!(block_backward(&wide, 6, Residence::Device), 2 * 6 * (2 * qw + 2 * kw) + 8 * 6 * kw);
        assert!(block_backward(&wide, 6, Residence::Device) > 2 * 6 * 2 * (qw + 2 * kw));
    }

    #[test]
    fn inner_stages_receive_their_input_and_the_first_stage_holds_the_most_in_flight() {
        let (first, inner) = (shape(true, false), shape(false, false));
        let f = micro_batch_forward(&inner, 2, 8, true, Residence::Host);
        assert_eq!(f.get(MemoryItem::PipelineBuffers), 4 * 16 * 64);
        assert_eq!(f.get(MemoryItem::Logits), 0);
        let train = |j| training(&first, 1000, 2, 8, 8, 4, j, Residence::Host);
        let (p0, p1) = (train(0), train(3));
        assert!(p0.total() > p1.total());
        assert_eq!(p0.get(MemoryItem::Gradients), 4000);
    }

    #[test]
    fn decode_splits_cover_the_cache_in_tiles_and_fill_the_device_for_small_batches() {
        let one = DecodeSplit::for_cache(1, 4096, 8, 4, 64).unwrap();
        assert_eq!((one.splits, one.split_keys), (32, 128));
        let many = DecodeSplit::for_cache(64, 256, 8, 4, 64).unwrap();
        assert_eq!((many.splits, many.split_keys), (1, 256), "64 × 8 blocks fill it already");
        let tiny = DecodeSplit::for_cache(2, 5, 2, 2, 8).unwrap();
        assert_eq!((tiny.splits, tiny.split_keys), (1, 32));
        for (b, t_cap) in [(1, 1), (3, 100), (7, 1000), (64, 384)] {
            let s = DecodeSplit::for_cache(b, t_cap, 8, 4, 64).unwrap();
            assert!(s.split_keys.is_multiple_of(DECODE_TILE) && s.splits * s.split_keys >= t_cap, "{s:?}");
            assert!((s.splits - 1) * s.split_keys < t_cap, "no split is empty: {s:?}");
        }
        assert!(DecodeSplit::for_cache(1, 64, 2, 32, 64).is_none(), "32 query heads a group");
        assert!(DecodeSplit::for_cache(1, 64, 8, 1, 512).is_none(), "a head wider than 256");
    }

    #[test]
    fn generation_holds_the_cache_for_the_longest_response() {
        let s = shape(true, true);
        let g = generation(&s, 4, 8, 24, Residence::Host);
        assert_eq!(g.get(MemoryItem::KvCache), 4 * 2 * 2 * 4 * 32 * 32);
        // One shard: its logits are the rows; under TP the whole vocabulary's are gathered too.
        assert_eq!(g.get(MemoryItem::Logits), 4 * 4 * 32);
        let tp = LocalShape { vocab: 16, ..s };
        assert_eq!(generation(&tp, 4, 8, 24, Residence::Host).get(MemoryItem::Logits), 4 * 4 * (16 + 32));
    }
}
