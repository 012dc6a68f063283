//! A decode's state between token steps, and its bookkeeping as the host defines it: the
//! tokens `[B, T_cap]` (prompts in place), each response's length, which sequences have
//! finished, and the tokens drawn last (what the next step embeds). A device keeps the same
//! state in its memory and advances it with `nereus_decode_advance` (`kernels/device/sample.cu`),
//! so that a token step needs no host round trip; [`HostDecoding::advance`] is the reference.

use super::sampling::Sampling;

/// The shape of one decode: `b` sequences of `p` prompt positions, `t_cap` positions in all.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DecodeShape {
    /// Sequences.
    pub b: usize,
    /// Prompt positions per sequence (left-padded prompts included).
    pub p: usize,
    /// Positions per sequence: prompt and longest response.
    pub t_cap: usize,
}

/// Sequences `[B, P + R]` (prompt, response, EOS padding) and response lengths (EOS included).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Generated {
    /// Tokens, row-major.
    pub tokens: Vec<u32>,
    /// Response tokens per sequence, up to and including EOS.
    pub lengths: Vec<usize>,
}

/// A decode's state on the host.
#[derive(Debug, Clone)]
pub struct HostDecoding {
    /// The shape decoded.
    pub shape: DecodeShape,
    /// Sequence ids (they seed the draws).
    pub ids: Vec<u64>,
    /// Tokens `[B, T_cap]`: the prompts, then what has been drawn, `eos` after the end.
    pub tokens: Vec<u32>,
    /// Response tokens so far per sequence.
    pub lengths: Vec<usize>,
    /// Whether each sequence has ended (a stop id, or the last position).
    pub done: Vec<bool>,
    /// The token each sequence holds at the last position written.
    pub last: Vec<u32>,
    /// The ids a response ends at (`eos` first).
    pub stops: Vec<u32>,
    /// What a finished sequence holds.
    pub eos: u32,
}

impl HostDecoding {
    /// A decode of `prompts[B, P]` (sequence ids `ids`) under `s`.
    pub fn new(prompts: &[u32], ids: &[u64], shape: DecodeShape, s: &Sampling) -> HostDecoding {
        let mut tokens = vec![s.eos; shape.b * shape.t_cap];
        if shape.p > 0 && shape.t_cap > 0 {
            for (row, prompt) in tokens.chunks_exact_mut(shape.t_cap).zip(prompts.chunks_exact(shape.p)) {
                row[..shape.p].copy_from_slice(prompt);
            }
        }
        HostDecoding {
            shape,
            ids: ids.to_vec(),
            tokens,
            lengths: vec![0; shape.b],
            done: vec![false; shape.b],
            last: vec![s.eos; shape.b],
            stops: stop_ids(s),
            eos: s.eos,
        }
    }

    /// Writes `drawn[B]` at position `pos` of every unfinished sequence, which grows by one and
    /// ends at a stop id or at the last position; a finished sequence holds `eos` there.
    pub fn advance(&mut self, drawn: &[u32], pos: usize) {
        let t_cap = self.shape.t_cap;
        for (i, &token) in drawn.iter().enumerate().take(self.shape.b) {
            let token = if self.done[i] { self.eos } else { token };
            if !self.done[i] {
                self.lengths[i] += 1;
                self.done[i] = pos + 1 >= t_cap || self.stops.contains(&token);
            }
            self.tokens[i * t_cap + pos] = token;
            self.last[i] = token;
        }
    }

    /// Whether every sequence has ended.
    pub fn finished(&self) -> bool {
        self.done.iter().all(|&d| d)
    }

    /// The tokens and response lengths.
    pub fn into_generated(self) -> Generated {
        Generated { tokens: self.tokens, lengths: self.lengths }
    }
}

/// The ids `s` stops at: `eos`, then the others.
pub fn stop_ids(s: &Sampling) -> Vec<u32> {
    std::iter::once(s.eos).chain(s.also_stop.as_slice().iter().copied()).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::StopIds;

    #[test]
    fn advancing_ends_sequences_at_stop_ids_and_at_the_cap() {
        let s = Sampling {
            temperature: 1.0,
            top_p: 1.0,
            min_p: 0.0,
            top_k: 0,
            max_new_tokens: 3,
            eos: 0,
            also_stop: StopIds::new(&[9]).unwrap(),
            greedy: false,
            seed: 1,
            stop_check_every: 1,
        };
        let shape = DecodeShape { b: 3, p: 1, t_cap: 4 };
        let mut d = HostDecoding::new(&[5, 6, 7], &[0, 1, 2], shape, &s);
        d.advance(&[9, 4, 0], 1);
        assert_eq!((d.lengths.clone(), d.done.clone()), (vec![1, 1, 1], vec![true, false, true]));
        d.advance(&[3, 3, 3], 2);
        d.advance(&[2, 2, 2], 3);
        assert_eq!(d.tokens, vec![5, 9, 0, 0, 6, 4, 3, 2, 7, 0, 0, 0]);
        assert_eq!(d.lengths, vec![1, 3, 1]);
        assert!(d.finished(), "the last position ends the middle sequence");
        assert_eq!(d.last, vec![0, 2, 0]);
    }
}
