//! Batched autoregressive sampling with a KV cache sharded by TP heads, under PP too: the prompt
//! is prefilled in one pass, then one token per pass; the last stage samples from the whole
//! vocabulary (summed over TP shards).
//!
//! The decode's state (tokens, lengths, finished flags) lives where the compute keeps its
//! activations ([`Compute::decode_begin`]). Where one rank holds the whole replica (no TP, no
//! PP) a device draws, appends and embeds the next token without the host: the host reads the
//! finished flags every [`Sampling::stop_check_every`] steps and the tokens once at the end.
//! Under TP on one stage every rank draws, from the summed logits that are bit-identical on
//! every rank of the group, so no token crosses the host: at every flag check the ranks compare a
//! digest of what they drew (a small reduction) and stop together, or fail together where they
//! differ. Under PP the last stage's `(tp 0)` rank draws and every rank of the EMU receives each
//! step's tokens over the plane (one host round trip per token).
//!
//! Sampling is deterministic for a seed: the uniform draw of sequence `id` at position `pos` is a
//! function of `(seed, id, pos)` only ([`crate::engine::draw_uniform`]), so any layout and any DP
//! split samples the same tokens from the same logits.

use crate::comm::DataPlane;

use super::compute::{Compute, Neighbour, RowCopy};
use super::decode::{DecodeShape, Generated};
use super::ops::TensorGroup;
use super::sampling::Sampling;
use super::stage::{last_residual, KvCache, LastResidual, Rows};
use super::{EngineError, Replica};
use nereus_core::cost::MemoryItem;

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
        let shape = self.decode_shape(prompts, ids, s)?;
        let mut cache = KvCache::on(c, &self.model, shape.b, shape.t_cap)?;
        self.generate_into(c, plane, params, (prompts, starts, ids), s, &mut cache)
    }

    /// The shape of a decode of `prompts` for `ids` under `s`, if the model's positions hold it.
    fn decode_shape(&self, prompts: &[u32], ids: &[u64], s: &Sampling) -> Result<DecodeShape, EngineError> {
        let (b, r) = (ids.len(), s.max_new_tokens);
        let p = prompts.len() / b.max(1);
        let shape = DecodeShape { b, p, t_cap: p + r };
        if shape.t_cap > self.model.max_positions() {
            let most = self.model.max_positions();
            let what = format!("prompt {p} + response {r} tokens exceed the {most} positions prepared");
            return Err(EngineError::Shape { what });
        }
        Ok(shape)
    }

    /// [`Replica::generate_on`] into a KV cache the caller made for `p + r` positions (which a
    /// test reads afterwards).
    pub(crate) fn generate_into<C: Compute, P: DataPlane>(
        &self,
        c: &mut C,
        plane: &P,
        params: &C::Params,
        (prompts, starts, ids): (&[u32], &[usize], &[u64]),
        s: &Sampling,
        cache: &mut KvCache<C::Act>,
    ) -> Result<Generated, EngineError> {
        let shape = self.decode_shape(prompts, ids, s)?;
        let (b, p, r) = (shape.b, shape.p, s.max_new_tokens);
        let tp = self.groups.tp_group(plane);
        let mut decoding = c.decode_begin(prompts, ids, shape, s, &self.model.dims())?;
        let alone = self.groups.layout.tp == 1 && self.groups.layout.pp == 1;
        // On one stage every TP rank holds the same summed logits, so each draws the same tokens.
        let one_stage = self.groups.layout.pp == 1;
        let draws = one_stage || self.groups.speaks_for_outputs();
        // Step 0 is the prefill; every later step decodes one token per sequence.
        let outside = super::timers::set_decoding(false);
        let last_step = (|| {
            for step in 0..r {
                super::timers::set_decoding(step > 0);
                let pos = p + step;
                let rows =
                    if step == 0 { Rows { b, t: p, pos0: 0, starts } } else { Rows { b, t: 1, pos0: pos - 1, starts } };
                let mut token_step = |c: &mut C, decoding: &mut C::Decoding| {
                    let mark = c.mark();
                    self.step_on(c, plane, params, (prompts, step == 0), decoding, (rows, &mut *cache, &tp), s, draws)?;
                    let since = c.since(mark);
                    c.release(&since);
                    Ok(())
                };
                match (alone, step) {
                    // Nothing crosses the host inside a token step of a lone replica: a device
                    // records the first and replays it.
                    (true, 1..) => c.decode_step(&mut decoding, rows.pos0, token_step)?,
                    _ => token_step(c, &mut decoding)?,
                }
                if self.step_ends_decode(c, plane, &tp, &mut decoding, (s, draws), (step, pos, b))? {
                    return Ok(step);
                }
            }
            Ok::<_, EngineError>(r.saturating_sub(1))
        })();
        // Restored on every way out: a failed decode must not leave the op timers in decoding.
        super::timers::set_decoding(outside);
        let last_step = last_step?;
        let generated = c.decode_end(decoding)?;
        if !alone && one_stage {
            // Every token drawn, so a difference between two checks is caught too.
            agree_on_tokens(&tp, true, &generated.tokens, last_step)?;
        }
        Ok(generated)
    }

    /// After token step `step` (feeding position `pos`) of `b` sequences: under PP the drawn
    /// tokens go from the last stage to every rank; then, where the flags are read, whether
    /// every sequence has ended (TP ranks of one stage decide it together, checking that they
    /// drew alike).
    fn step_ends_decode<C: Compute, P: DataPlane, G: TensorGroup<f32>>(
        &self,
        c: &mut C,
        plane: &P,
        tp: &G,
        decoding: &mut C::Decoding,
        (s, draws): (&Sampling, bool),
        (step, pos, b): (usize, usize, usize),
    ) -> Result<bool, EngineError> {
        let layout = self.groups.layout;
        if layout.pp > 1 {
            let mut next = if draws { c.decode_last(decoding)? } else { vec![s.eos; b] };
            self.groups.broadcast_from_last(plane, bytemuck::cast_slice_mut(&mut next))?;
            if !draws {
                c.decode_advance(decoding, &next, pos)?;
            }
        }
        // After the last step the decode ends anyway: no flags to read.
        if step + 1 == s.max_new_tokens {
            return Ok(false);
        }
        if layout.tp == 1 || layout.pp > 1 {
            return c.decode_finished(decoding, step);
        }
        // TP ranks stop only where all of them check, and together.
        if !(step + 1).is_multiple_of(s.stop_check_every.max(1)) {
            return Ok(false);
        }
        let finished = c.decode_finished(decoding, step)?;
        agree_on_tokens(tp, finished, &c.decode_last(decoding)?, step)
    }

    /// One token step's work on this rank: the rows' input (embedded on the first stage,
    /// received elsewhere), every block with the cache, and on the last stage the logits and,
    /// where this rank draws, the draw and the advance; other stages pass `x` on.
    #[allow(clippy::too_many_arguments)]
    fn step_on<C: Compute, P: DataPlane, G: crate::engine::ops::TensorGroup<f32>>(
        &self,
        c: &mut C,
        plane: &P,
        params: &C::Params,
        (prompts, prefill): (&[u32], bool),
        decoding: &mut C::Decoding,
        (rows, cache, tp): (Rows, &mut KvCache<C::Act>, &G),
        s: &Sampling,
        draws: bool,
    ) -> Result<(), EngineError> {
        let b = rows.b;
        let x = match self.recv_input_on(c, plane, b * rows.t)? {
            Some(x) => x,
            None if prefill => self.model.embed_on(c, params, prompts, tp)?,
            None => self.model.embed_decoded_on(c, params, decoding, b, tp)?,
        };
        // A decode step's rows are the last positions: their final norm adds the residual.
        let last_rows = self.model.weights.is_last() && rows.t == 1;
        let last = if last_rows { LastResidual::ToFinalNorm } else { LastResidual::Added };
        let (mut x, acts) = self.model.blocks_forward_on(c, params, x, rows, Some(cache), tp, last)?;
        if self.model.weights.is_last() {
            let residual = last_residual(&acts).filter(|_| last_rows);
            let logits = self.last_logits_on(c, params, (&mut x, residual), rows, tp)?;
            if draws {
                c.decode_draw(decoding, &logits, s, rows.pos0 + rows.t)?;
            }
        } else {
            c.pipe(&self.groups.link(plane), Some((Neighbour::Next, &x)), None)?;
        }
        Ok(())
    }

    /// The whole vocabulary's logits `[B, V]` at each sequence's last position of `x[B, T, C]`
    /// (with the last block's residual where the blocks left it to the final norm: `T = 1`).
    fn last_logits_on<C: Compute, G: crate::engine::ops::TensorGroup<f32>>(
        &self,
        c: &mut C,
        params: &C::Params,
        (x, residual): (&mut C::Act, Option<&C::Act>),
        rows: Rows,
        tp: &G,
    ) -> Result<C::Act, EngineError> {
        let (b, width) = (rows.b, self.model.dims().c);
        if rows.t == 1 {
            return self.model.full_logits_on(c, params, (x, residual), b, tp); // the rows are the last
        }
        let mut last = c.overwritten(MemoryItem::Activations, b * width)?;
        let (t, src_offset) = (rows.t * width, (rows.t - 1) * width);
        let copy = RowCopy { src_offset, src_pitch: t, dst_offset: 0, dst_pitch: width, width, rows: b };
        c.copy_rows(&mut last, x, copy)?;
        self.model.full_logits_on(c, params, (&mut last, None), b, tp)
    }
}

/// Whether the TP group's ranks, each drawing its own tokens, agree: every rank gives whether
/// its decode has `finished` and the `tokens` it drew, and all learn the group's maximum and
/// minimum of both (one reduction of eight values), so they stop together or fail together
/// with [`EngineError::TokensDisagree`] — never one waiting in a collective the others left.
fn agree_on_tokens<G: TensorGroup<f32>>(
    tp: &G,
    finished: bool,
    tokens: &[u32],
    step: usize,
) -> Result<bool, EngineError> {
    let mut extremes = decode_extremes(finished, tokens);
    tp.max(&mut extremes)?;
    let half = extremes.len() / 2;
    if (0..half).any(|i| extremes[i] != -extremes[i + half]) {
        return Err(EngineError::TokensDisagree { step });
    }
    Ok(finished)
}

/// What [`agree_on_tokens`] reduces: the flag and an FNV-1a digest of the tokens in 16-bit
/// parts (exact in f32), then their negations, so one maximum gives the group's maximum and
/// minimum of each.
fn decode_extremes(finished: bool, tokens: &[u32]) -> Vec<f32> {
    let digest = tokens.iter().fold(0xcbf2_9ce4_8422_2325u64, |h, &t| (h ^ u64::from(t)).wrapping_mul(0x100_0000_01b3));
    let parts = [
        f32::from(u8::from(finished)),
        (digest & 0xffff) as f32,
        (digest >> 16 & 0xffff) as f32,
        (digest >> 32 & 0xffff) as f32,
    ];
    parts.iter().copied().chain(parts.iter().map(|x| -x)).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Two ranks of a TP group: the maximum with the other rank's values.
    struct WithOther(Vec<f32>);

    impl TensorGroup<f32> for WithOther {
        fn sum(&self, values: &mut [f32]) -> Result<(), EngineError> {
            values.iter_mut().zip(&self.0).for_each(|(v, o)| *v += o);
            Ok(())
        }
        fn max(&self, values: &mut [f32]) -> Result<(), EngineError> {
            values.iter_mut().zip(&self.0).for_each(|(v, o)| *v = v.max(*o));
            Ok(())
        }
    }

    /// Both ranks of a pair reach the same verdict from their own side: they stop together when
    /// their tokens and flags agree, and both fail when either differs (so neither waits in a
    /// collective the other has left).
    #[test]
    fn tp_ranks_stop_together_or_fail_together() {
        let (a, b) = ([5u32, 9, 2, 7], [5u32, 9, 3, 7]);
        let verdict = |mine: (bool, &[u32]), other: (bool, &[u32])| {
            agree_on_tokens(&WithOther(decode_extremes(other.0, other.1)), mine.0, mine.1, 3)
        };
        assert!(verdict((true, &a), (true, &a)).unwrap());
        assert!(!verdict((false, &a), (false, &a)).unwrap());
        for (mine, other) in [((true, &a[..]), (true, &b[..])), ((true, &a[..]), (false, &a[..]))] {
            for (x, y) in [(mine, other), (other, mine)] {
                assert!(matches!(verdict(x, y), Err(EngineError::TokensDisagree { step: 3 })), "{x:?} against {y:?}");
            }
        }
    }
}
