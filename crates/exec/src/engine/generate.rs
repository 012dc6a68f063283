//! Batched autoregressive sampling with a KV cache sharded by TP heads, under PP too: the prompt
//! is prefilled in one pass, then one token per pass; the last stage samples from the whole
//! vocabulary (summed over TP shards) and every rank of the EMU receives the tokens.
//!
//! Sampling is deterministic for a seed: the uniform draw of sequence `id` at position `pos` is a
//! function of `(seed, id, pos)` only, so any layout and any DP split samples the same tokens
//! from the same logits.

use crate::comm::DataPlane;

use super::compute::{Compute, Neighbour, RowCopy};
use super::init::uniform;
use super::sampling::Sampling;
use super::stage::{KvCache, Rows};
use super::{EngineError, Replica};
use nereus_core::cost::MemoryItem;

/// Sequences `[B, P + R]` (prompt, response, EOS padding) and response lengths (EOS included).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Generated {
    /// Tokens, row-major.
    pub tokens: Vec<u32>,
    /// Response tokens per sequence, up to and including EOS.
    pub lengths: Vec<usize>,
}

impl Replica {
    /// Generates responses to `prompts[B, P]` (sequence ids `ids` seed the draws; `starts[i]`
    /// is where sequence `i`'s left-padded prompt begins, empty when none is padded). Every rank
    /// of the EMU calls it and returns the same tokens.
    #[allow(clippy::too_many_arguments)]
    pub fn generate_on<C: Compute, P: DataPlane>(
        &self,
        c: &mut C,
        plane: &P,
        params: &C::Params,
        prompts: &[u32],
        starts: &[usize],
        ids: &[u64],
        s: &Sampling,
    ) -> Result<Generated, EngineError> {
        let (b, r) = (ids.len(), s.max_new_tokens);
        let p = prompts.len() / b.max(1);
        let t_cap = p + r;
        if t_cap > self.model.max_positions() {
            return Err(EngineError::Shape {
                what: format!(
                    "prompt {p} + response {r} tokens exceed the {} positions prepared",
                    self.model.max_positions()
                ),
            });
        }
        let tp = self.groups.tp_group(plane);
        let width = self.model.dims().c;
        let mut cache = KvCache::on(c, &self.model, b, t_cap)?;
        let mut tokens = vec![s.eos; b * t_cap];
        for (row, prompt) in tokens.chunks_exact_mut(t_cap).zip(prompts.chunks_exact(p)) {
            row[..p].copy_from_slice(prompt);
        }
        let (mut lengths, mut done) = (vec![0usize; b], vec![false; b]);
        let (mut input, mut rows) = (prompts.to_vec(), Rows { b, t: p, pos0: 0, starts });
        // Step 0 is the prefill; every later step decodes one token per sequence.
        let outside = super::timers::set_decoding(false);
        for step in 0..r {
            super::timers::set_decoding(step > 0);
            let mark = c.mark();
            let x = match self.recv_input_on(c, plane, b * rows.t)? {
                Some(x) => x,
                None => self.model.embed_on(c, params, &input, &tp)?,
            };
            let (x, _) = self.model.blocks_forward_on(c, params, x, rows, Some(&mut cache), &tp)?;
            let mut next = vec![s.eos; b];
            if self.model.weights.is_last() {
                let mut last = c.zeros(MemoryItem::Activations, b * width)?;
                let (t, src_offset) = (rows.t * width, (rows.t - 1) * width);
                let copy = RowCopy { src_offset, src_pitch: t, dst_offset: 0, dst_pitch: width, width, rows: b };
                c.copy_rows(&mut last, &x, copy)?;
                let logits = self.model.full_logits_on(c, params, &last, b, &tp)?;
                let u: Vec<f64> = (0..b).map(|i| uniform(s.seed, ids[i], (p + step) as u64)).collect();
                let active: Vec<bool> = done.iter().map(|&d| !d).collect();
                next = c.sample(&logits, s, &u, &active)?;
            } else {
                c.pipe(&self.groups.link(plane), Some((Neighbour::Next, &x)), None)?;
            }
            let since = c.since(mark);
            c.release(&since);
            self.groups.broadcast_from_last(plane, bytemuck::cast_slice_mut(&mut next))?;
            for i in 0..b {
                if done[i] {
                    continue;
                }
                tokens[i * t_cap + p + step] = next[i];
                lengths[i] += 1;
                done[i] = s.stops_at(next[i]);
            }
            if done.iter().all(|&d| d) {
                break;
            }
            input = next;
            rows = Rows { b, t: 1, pos0: p + step, starts };
        }
        super::timers::set_decoding(outside);
        Ok(Generated { tokens, lengths })
    }
}
