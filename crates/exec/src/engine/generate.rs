//! Batched autoregressive sampling with a KV cache sharded by TP heads, under PP too: the prompt
//! is prefilled in one pass, then one token per pass; the last stage samples from the whole
//! vocabulary (summed over TP shards) and every rank of the EMU receives the tokens.
//!
//! Sampling is deterministic for a seed: the uniform draw of sequence `id` at position `pos` is a
//! function of `(seed, id, pos)` only, so any layout and any DP split samples the same tokens
//! from the same logits.

use serde::{Deserialize, Serialize};

use crate::comm::DataPlane;

use super::compute::{Compute, Neighbour, RowCopy};
use super::init::uniform;
use super::stage::{KvCache, Rows};
use super::{EngineError, Replica};
use nereus_core::cost::MemoryItem;

/// How responses are sampled.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Sampling {
    /// Softmax temperature.
    pub temperature: f32,
    /// Nucleus: sample among the most likely tokens whose probabilities sum to at least this.
    pub top_p: f32,
    /// Longest response.
    pub max_new_tokens: usize,
    /// End-of-sequence token (also the padding after a response ends).
    pub eos: u32,
    /// Further ids a response ends at (Llama 3 and Qwen models stop at several).
    pub also_stop: StopIds,
    /// Take the most likely token instead of sampling (ReMax's baseline rollout).
    pub greedy: bool,
    /// Seed of the draws.
    pub seed: u64,
}

/// Up to four more token ids a response stops at, beside [`Sampling::eos`] (a fixed array, so
/// that [`Sampling`] stays `Copy`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct StopIds {
    ids: [u32; 4],
    len: u8,
}

impl StopIds {
    /// No further stop ids.
    pub const NONE: StopIds = StopIds { ids: [0; 4], len: 0 };

    /// `ids` (at most four), or `None` when there are more.
    pub fn new(ids: &[u32]) -> Option<StopIds> {
        let mut stop = StopIds::NONE;
        for &id in ids {
            *stop.ids.get_mut(stop.len as usize)? = id;
            stop.len += 1;
        }
        Some(stop)
    }

    /// The ids.
    pub fn as_slice(&self) -> &[u32] {
        &self.ids[..self.len as usize]
    }
}

impl Sampling {
    /// Whether `token` ends a response.
    pub fn stops_at(&self, token: u32) -> bool {
        token == self.eos || self.also_stop.as_slice().contains(&token)
    }
}

/// Sequences `[B, P + R]` (prompt, response, EOS padding) and response lengths (EOS included).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Generated {
    /// Tokens, row-major.
    pub tokens: Vec<u32>,
    /// Response tokens per sequence, up to and including EOS.
    pub lengths: Vec<usize>,
}

/// Picks a token from `logits` with the uniform draw `u ∈ [0, 1)`: greedy takes the arg-max
/// (lowest index on ties); otherwise softmax at `temperature`, keep the smallest set of most
/// likely tokens whose mass reaches `top_p`, and invert its cumulative distribution at `u`.
pub fn sample_token(logits: &[f32], s: &Sampling, u: f64) -> u32 {
    let argmax = (0..logits.len()).fold(0, |best, i| if logits[i] > logits[best] { i } else { best });
    if s.greedy || s.temperature <= 0.0 {
        return argmax as u32;
    }
    let t = f64::from(s.temperature);
    let max = f64::from(logits[argmax]);
    let mut probs: Vec<(usize, f64)> =
        logits.iter().enumerate().map(|(i, &z)| (i, ((f64::from(z) - max) / t).exp())).collect();
    let total: f64 = probs.iter().map(|p| p.1).sum();
    probs.sort_by(|a, b| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0)));
    let (mut kept, mut mass) = (0, 0.0);
    while kept < probs.len() && (kept == 0 || mass < f64::from(s.top_p) * total) {
        mass += probs[kept].1;
        kept += 1;
    }
    let target = u.clamp(0.0, 1.0) * mass;
    let mut acc = 0.0;
    for &(i, p) in &probs[..kept] {
        acc += p;
        if target < acc {
            return i as u32;
        }
    }
    probs[kept - 1].0 as u32
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

#[cfg(test)]
mod tests {
    use super::*;

    fn sampling(temperature: f32, top_p: f32) -> Sampling {
        Sampling { temperature, top_p, max_new_tokens: 4, eos: 0, also_stop: StopIds::NONE, greedy: false, seed: 1 }
    }

    #[test]
    fn sampling_inverts_the_nucleus_distribution() {
        // Probabilities ∝ e^{0}, e^{ln 2}, e^{ln 5}: 1/8, 2/8, 5/8.
        let logits = [0.0, 2f32.ln(), 5f32.ln()];
        let s = sampling(1.0, 1.0);
        assert_eq!(sample_token(&logits, &s, 0.0), 2);
        assert_eq!(sample_token(&logits, &s, 0.62), 2);
        assert_eq!(sample_token(&logits, &s, 0.63), 1);
        assert_eq!(sample_token(&logits, &s, 0.9), 0);
        // top_p = 0.8 keeps {2, 1} (mass 7/8): u = 0.9 lands in token 1.
        assert_eq!(sample_token(&logits, &sampling(1.0, 0.8), 0.9), 1);
        assert_eq!(sample_token(&logits, &Sampling { greedy: true, ..s }, 0.9), 2);
    }
}
