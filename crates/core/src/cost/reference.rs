//! The reference engine's transient memory, buffer by buffer as `src/engine/` charges it to the
//! ledger (every count is in f32 elements; `×4` makes bytes). Legend: `b` sequences of `t` new
//! positions attending to `tk` positions, `n = b·t` token rows, local widths `C` (residual),
//! `H·D` (queries), `K·D` (keys, values), `F` (SwiGLU), `V` (vocabulary shard).
//!
//! A micro-batch keeps every activation of its forward pass until its backward pass (training)
//! or its end (inference) releases them; the 1F1B schedule keeps at most `pp − j` micro-batches
//! in flight on stage `j`; generation keeps the KV cache of the whole replica's sequences,
//! sized for the longest response.

use super::memory::{MemoryBreakdown, MemoryItem};
use crate::model::{LocalShape, OutputHead};

/// One block's forward pass (`engine::stage::block_forward`): `xn1, xmid, xn2, out` `[n, C]`,
/// the two RMS vectors, `q_raw, q, att` `[n, H·D]`, `k_raw, k, v` `[n, K·D]`, the q/k-norm RMS
/// vectors, `gate, up, h` `[n, F]`, and the attention probabilities `[b, H, t, tk]`.
pub fn block_forward(s: &LocalShape, b: u64, t: u64, tk: u64) -> u64 {
    let n = b * t;
    let (c, h, k, f) = (s.c as u64, s.heads as u64, s.kv_heads as u64, s.ffn as u64);
    let (qw, kw) = (h * s.d as u64, k * s.d as u64);
    n * (4 * c + 2 + 3 * qw + 3 * kw + h + k + 3 * f) + b * h * t * tk
}

/// One block's backward pass (`engine::stage::block_backward`): `dh, dg, du` `[n, F]`, `dxn2,
/// dxn1` `[n, C]`, `datt, dq` `[n, H·D]`, `dk, dv` `[n, K·D]`, and two more for q/k-norm.
pub fn block_backward(s: &LocalShape, n: u64) -> u64 {
    let (c, f) = (s.c as u64, s.ffn as u64);
    let (qw, kw) = ((s.heads * s.d) as u64, (s.kv_heads * s.d) as u64);
    n * (3 * f + 2 * c + 2 * qw + 2 * kw) + if s.qk_norm { n * (qw + kw) } else { 0 }
}

/// What a micro-batch of `b` sequences of `t` positions keeps after its forward pass on this
/// stage: the input (embedded on the first stage, received elsewhere), every block's
/// activations, and on the last stage the final norm, the outputs, and for an LM the logits
/// and log-sum-exps; `training` adds the output gradients.
pub fn micro_batch_forward(s: &LocalShape, b: u64, t: u64, training: bool) -> MemoryBreakdown {
    let n = b * t;
    let c = s.c as u64;
    let mut m = MemoryBreakdown::default();
    let input = if s.first { MemoryItem::Activations } else { MemoryItem::PipelineBuffers };
    m.add(input, 4 * n * c);
    m.add(MemoryItem::Activations, 4 * s.blocks as u64 * block_forward(s, b, t, t));
    if s.last {
        m.add(MemoryItem::Activations, 4 * (n * c + n));
        let lm = if s.head == OutputHead::Lm { n * s.vocab as u64 + n } else { 0 };
        m.add(MemoryItem::Logits, 4 * (n + lm + if training { n } else { 0 }));
    }
    m
}

/// The temporaries of one micro-batch's backward pass, held until it ends: every block's
/// activation gradients, the head's on the last stage, and the gradient received from the next
/// stage elsewhere.
pub fn micro_batch_backward(s: &LocalShape, n: u64) -> MemoryBreakdown {
    let c = s.c as u64;
    let mut m = MemoryBreakdown::default();
    m.add(MemoryItem::ActivationGradients, 4 * s.blocks as u64 * block_backward(s, n));
    if s.last {
        m.add(MemoryItem::ActivationGradients, 4 * 2 * n * c);
        if s.head == OutputHead::Lm {
            m.add(MemoryItem::Logits, 4 * n * s.vocab as u64);
        }
    } else {
        m.add(MemoryItem::PipelineBuffers, 4 * n * c);
    }
    m
}

/// Peak of one training step on stage `j` of `pp` (1F1B): the f32 gradient buffer of the
/// position's `params` elements, `min(pp − j, micro_batches)` micro-batches in flight, and one
/// backward pass's temporaries.
pub fn training(
    s: &LocalShape,
    params: u64,
    micro: u64,
    micro_batches: u64,
    seq: u64,
    pp: u32,
    j: u32,
) -> MemoryBreakdown {
    let in_flight = u64::from(pp - j).min(micro_batches.max(1));
    let one = micro_batch_forward(s, micro, seq, true);
    let mut m = MemoryBreakdown::default();
    m.add(MemoryItem::Gradients, 4 * params);
    for _ in 0..in_flight {
        m = m.plus(&one);
    }
    m.plus(&micro_batch_backward(s, micro * seq))
}

/// Peak of a forward-only pass (inference, and the actor's old log-probabilities): one
/// micro-batch's activations.
pub fn inference(s: &LocalShape, micro: u64, seq: u64) -> MemoryBreakdown {
    micro_batch_forward(s, micro, seq, false)
}

/// Peak of generating `r` tokens after a prompt of `p` for `b` sequences: the KV cache for
/// `p + r` positions, and the larger of the prefill pass and the last decode step (the input,
/// every block's activations, and on the last stage the whole vocabulary's logits).
pub fn generation(s: &LocalShape, b: u64, p: u64, r: u64) -> MemoryBreakdown {
    let (c, blocks) = (s.c as u64, s.blocks as u64);
    let mut m = MemoryBreakdown::default();
    m.add(MemoryItem::KvCache, 4 * blocks * 2 * b * (p + r) * (s.kv_heads * s.d) as u64);
    let pass = |t: u64, tk: u64| {
        let mut x = MemoryBreakdown::default();
        let input = if s.first { MemoryItem::Activations } else { MemoryItem::PipelineBuffers };
        x.add(input, 4 * b * t * c);
        x.add(MemoryItem::Activations, 4 * blocks * block_forward(s, b, t, tk));
        if s.last {
            // Each sequence's last row, the final norm's output and its 1/rms.
            x.add(MemoryItem::Activations, 4 * (2 * b * c + b));
            x.add(MemoryItem::Logits, 4 * b * (s.vocab + s.vocab_total) as u64);
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
        // n = 2·3 rows: 4·64 + 2 + 3·64 + 3·32 + 4 + 2 + 3·176 per row, and probs 2·4·3·5.
        let per_row = 4 * 64 + 2 + 3 * 64 + 3 * 32 + 4 + 2 + 3 * 176;
        assert_eq!(block_forward(&s, 2, 3, 5), 6 * per_row + 2 * 4 * 3 * 5);
        assert_eq!(block_backward(&s, 6), 6 * (3 * 176 + 2 * 64 + 2 * 64 + 2 * 32));
    }

    #[test]
    fn inner_stages_receive_their_input_and_the_first_stage_holds_the_most_in_flight() {
        let (first, inner) = (shape(true, false), shape(false, false));
        let f = micro_batch_forward(&inner, 2, 8, true);
        assert_eq!(f.get(MemoryItem::PipelineBuffers), 4 * 16 * 64);
        assert_eq!(f.get(MemoryItem::Logits), 0);
        let (p0, p1) = (training(&first, 1000, 2, 8, 8, 4, 0), training(&first, 1000, 2, 8, 8, 4, 3));
        assert!(p0.total() > p1.total());
        assert_eq!(p0.get(MemoryItem::Gradients), 4000);
    }

    #[test]
    fn generation_holds_the_cache_for_the_longest_response() {
        let s = shape(true, true);
        let g = generation(&s, 4, 8, 24);
        assert_eq!(g.get(MemoryItem::KvCache), 4 * 2 * 2 * 4 * 32 * 32);
        assert!(g.get(MemoryItem::Logits) == 4 * 4 * 64);
    }
}
