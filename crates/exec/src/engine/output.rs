//! The last stage's output: final RMSNorm, then log-probabilities of target tokens (LM head,
//! vocabulary-parallel) or one scalar per position (value head).
//!
//! The LM head is fused with its log-softmax and computed a vocabulary chunk at a time
//! ([`nereus_core::model::LocalShape::vocab_chunks`]): the forward pass folds each chunk's
//! logits into running per-row statistics and keeps only `lse`; the backward pass computes
//! each chunk's logits again, turns them into their gradient in place and accumulates the
//! input gradient in f32. The logits `[N, V]` and their gradient never exist at once (a fused
//! linear cross-entropy, as Liger Kernel's, Hsu et al. 2024, chunked over the vocabulary rather
//! than the rows so that `W` is read once per pass).

use std::ops::Range;

use super::compute::{Compute, InputGrad, LogitStats, RowCopy, VocabChunk};
use super::ops::*;
use super::stage::StageModel;
use super::EngineError;
use nereus_core::cost::MemoryItem;
use nereus_core::model::OutputHead;

/// What the head's backward pass needs from its forward pass: activations `A` and statistics
/// `S` (host f32 buffers unless the types say otherwise).
pub struct HeadActs<A = Vec<f32>, S = Vec<f32>> {
    x: A,
    xf: A,
    rf: S,
    /// The LM head's log-sum-exp per row (absent for a value head).
    lse: Option<S>,
    targets: Vec<u32>,
}

/// The rows of `W[V, C]` (a tensor at `w` in the flat parameters) holding vocabulary columns
/// `cols`: a chunk of the LM head is a contiguous run of its rows.
fn chunk_rows(w: &Range<usize>, cols: &Range<usize>, width: usize) -> Range<usize> {
    w.start + cols.start * width..w.start + cols.end * width
}

impl StageModel {
    /// The final norm of `x[n, C]`, after adding the last block's residual to `x` in the same
    /// pass where it is given (see [`super::stage::LastResidual::ToFinalNorm`]).
    fn final_norm<C: Compute>(
        &self,
        c: &mut C,
        p: &C::Params,
        (x, residual): (&mut C::Act, Option<&C::Act>),
        n: usize,
    ) -> Result<(C::Act, C::Stat), EngineError> {
        let range = self
            .weights
            .final_norm
            .as_ref()
            .ok_or_else(|| EngineError::Shape { what: "output head on a stage without it".into() })?;
        let width = self.dims().c;
        let (mut xf, mut rf) =
            (c.overwritten(MemoryItem::Activations, n * width)?, c.stats(MemoryItem::Activations, n)?);
        match residual {
            Some(r) => c.add_rmsnorm_forward(x, r, &mut xf, &mut rf, (p, range), width, self.eps)?,
            None => c.rmsnorm_forward(&mut xf, &mut rf, x, (p, range), width, self.eps)?,
        }
        Ok((xf, rf))
    }

    /// Last stage, forward: per row `n`, `log p(targets[n])` for an LM or the value for a value
    /// model, from the last block's output `x[N,C]` (and its residual, where the blocks left it
    /// to the final norm: [`super::stage::LastResidual::ToFinalNorm`]).
    #[allow(clippy::type_complexity)]
    pub fn head_forward_on<C: Compute, G: TensorGroup<f32>>(
        &self,
        c: &mut C,
        p: &C::Params,
        (mut x, residual): (C::Act, Option<&C::Act>),
        targets: Vec<u32>,
        tp: &G,
    ) -> Result<(C::Stat, HeadActs<C::Act, C::Stat>), EngineError> {
        let n = targets.len();
        let (xf, rf) = self.final_norm(c, p, (&mut x, residual), n)?;
        let missing = |what: &str| EngineError::Shape { what: format!("{what} head missing") };
        match self.head {
            OutputHead::Lm => {
                let w = self.weights.lm_head.as_ref().ok_or_else(|| missing("LM"))?;
                let (logp, lse) = self.fused_log_probs(c, p, &xf, w, &targets, tp)?;
                Ok((logp, HeadActs { x, xf, rf, lse: Some(lse), targets }))
            }
            OutputHead::Value => {
                let w = self.weights.score.as_ref().ok_or_else(|| missing("value"))?;
                let mut value = c.stats(MemoryItem::Logits, n)?;
                c.value_forward(&mut value, &xf, (p, w))?;
                Ok((value, HeadActs { x, xf, rf, lse: None, targets }))
            }
        }
    }

    /// Last stage, backward: from `d loss / d output[N]` to `dx[N,C]`, accumulating the head's
    /// and the final norm's gradients.
    pub fn head_backward_on<C: Compute, G: TensorGroup<f32>>(
        &self,
        c: &mut C,
        p: &C::Params,
        grads: &mut C::Grads,
        a: &HeadActs<C::Act, C::Stat>,
        dout: &C::Stat,
        tp: &G,
    ) -> Result<C::Act, EngineError> {
        let (d, n) = (self.dims(), a.targets.len());
        let none = std::ops::Range::default();
        let dxf = match &a.lse {
            Some(lse) => {
                let w = self.weights.lm_head.as_ref().unwrap_or(&none);
                let mut dxf = self.fused_log_probs_backward(c, p, grads, (&a.xf, w), lse, dout, &a.targets)?;
                // Each TP rank's input gradient covers its vocabulary columns: the copy's backward sums them.
                c.tp_sum(tp, &mut dxf)?;
                dxf
            }
            None => {
                let range = self.weights.score.as_ref().unwrap_or(&none);
                let mut dxf = c.zeros(MemoryItem::ActivationGradients, n * d.c)?;
                c.value_backward(&mut dxf, (grads, range), dout, &a.xf, (p, range))?;
                dxf
            }
        };
        let range = self.weights.final_norm.as_ref().unwrap_or(&none);
        let mut dx = c.zeros(MemoryItem::ActivationGradients, n * d.c)?;
        c.rmsnorm_backward(&mut dx, (grads, range), &dxf, &a.x, (p, range), &a.rf, d.c)?;
        c.free(MemoryItem::ActivationGradients, dxf);
        Ok(dx)
    }

    /// One vocabulary chunk's logits `[n, cols]` of the final norm's output `xf[n, C]` under the
    /// head `W` at `w`, charged as logits (the caller releases them with the chunk).
    fn chunk_logits<C: Compute>(
        &self,
        c: &mut C,
        p: &C::Params,
        (xf, w): (&C::Act, &Range<usize>),
        cols: &Range<usize>,
        n: usize,
    ) -> Result<C::Act, EngineError> {
        let width = self.dims().c;
        // Entering the vocabulary-parallel head is the identity forward (Megatron's copy region).
        let mut logits = c.overwritten(MemoryItem::Logits, n * cols.len())?;
        c.linear_forward(&mut logits, xf, (p, &chunk_rows(w, cols, width)), n, width, cols.len())?;
        Ok(logits)
    }

    /// The fused LM head's forward (see the module comment): `(logp[N], lse[N])` of `targets`
    /// from the final norm's output `xf[N, C]` and the head `W` at `w`, one vocabulary chunk of
    /// logits at a time. The chunk and the per-row scratch are released before it returns.
    fn fused_log_probs<C: Compute, G: TensorGroup<f32>>(
        &self,
        c: &mut C,
        p: &C::Params,
        xf: &C::Act,
        w: &Range<usize>,
        targets: &[u32],
        tp: &G,
    ) -> Result<(C::Stat, C::Stat), EngineError> {
        let (d, n) = (self.dims(), targets.len());
        let (logp, lse) = (c.stats(MemoryItem::Logits, n)?, c.stats(MemoryItem::Logits, n)?);
        let scratch = c.mark();
        let (max, sum, target) =
            (c.stats(MemoryItem::Logits, n)?, c.stats(MemoryItem::Logits, n)?, c.stats(MemoryItem::Logits, n)?);
        let mut acc = LogitStats { max, sum, target, lse, logp };
        let ids = c.ids(targets)?;
        let last = d.vocab_chunks().count() - 1;
        for (i, cols) in d.vocab_chunks().enumerate() {
            let chunk = c.mark();
            let logits = self.chunk_logits(c, p, (xf, w), &cols, n)?;
            let at = VocabChunk { col0: d.v0 + cols.start, first: i == 0, completes_rows: tp.is_single() && i == last };
            c.log_probs_fold(&mut acc, &logits, &ids, at)?;
            drop(logits);
            let released = c.since(chunk);
            c.release(&released);
        }
        c.log_probs_finish(&mut acc, tp)?;
        let LogitStats { max, sum, target, lse, logp } = acc;
        drop((max, sum, target, ids));
        let released = c.since(scratch);
        c.release(&released);
        Ok((logp, lse))
    }

    /// The fused LM head's backward: `dxf[N, C]` (this rank's vocabulary columns' share) from
    /// `d loss / d logp` `dout`, each chunk's logits computed again from `xf` and turned into
    /// their gradient in place; `dW` accumulates, `dxf` is summed in f32 and rounded once.
    #[allow(clippy::too_many_arguments)]
    fn fused_log_probs_backward<C: Compute>(
        &self,
        c: &mut C,
        p: &C::Params,
        grads: &mut C::Grads,
        (xf, w): (&C::Act, &Range<usize>),
        lse: &C::Stat,
        dout: &C::Stat,
        targets: &[u32],
    ) -> Result<C::Act, EngineError> {
        let (d, n) = (self.dims(), targets.len());
        let mut dxf = c.overwritten(MemoryItem::ActivationGradients, n * d.c)?;
        let scratch = c.mark();
        let mut sum = c.stats(MemoryItem::ActivationGradients, n * d.c)?;
        let ids = c.ids(targets)?;
        for cols in d.vocab_chunks() {
            let chunk = c.mark();
            let rows = chunk_rows(w, &cols, d.c);
            let mut logits = self.chunk_logits(c, p, (xf, w), &cols, n)?;
            c.log_probs_backward(&mut logits, dout, lse, &ids, d.v0 + cols.start)?;
            c.linear_input_grad_f32(&mut sum, &logits, (p, &rows), n, d.c, cols.len())?;
            c.linear_backward(InputGrad::Skip, (grads, &rows), &logits, xf, (p, &rows), n, d.c, cols.len())?;
            drop(logits);
            let released = c.since(chunk);
            c.release(&released);
        }
        c.narrow(&mut dxf, &sum)?;
        drop((sum, ids));
        let released = c.since(scratch);
        c.release(&released);
        Ok(dxf)
    }

    /// Last stage, generation: the whole vocabulary's logits `[B, vocab]` of the rows `x[B,C]`
    /// (and their residual, where the blocks left it to the final norm; each TP rank fills its
    /// columns and one sum over the group completes every row; without TP the shard's logits
    /// are the rows, with no copy).
    pub fn full_logits_on<C: Compute, G: TensorGroup<f32>>(
        &self,
        c: &mut C,
        p: &C::Params,
        x: (&mut C::Act, Option<&C::Act>),
        b: usize,
        tp: &G,
    ) -> Result<C::Act, EngineError> {
        let d = self.dims();
        let (xf, _) = self.final_norm(c, p, x, b)?;
        let w = self
            .weights
            .lm_head
            .as_ref()
            .ok_or_else(|| EngineError::Shape { what: "sampling from a model without an LM head".into() })?;
        let mut local = c.overwritten(MemoryItem::Logits, b * d.vocab)?;
        c.linear_forward(&mut local, &xf, (p, w), b, d.c, d.vocab)?;
        if d.vocab == d.vocab_total {
            return Ok(local); // one shard holds the whole vocabulary
        }
        let mut full = c.zeros(MemoryItem::Logits, b * d.vocab_total)?;
        let columns = RowCopy {
            src_offset: 0,
            src_pitch: d.vocab,
            dst_offset: d.v0,
            dst_pitch: d.vocab_total,
            width: d.vocab,
            rows: b,
        };
        c.copy_rows(&mut full, &local, columns)?;
        c.tp_sum(tp, &mut full)?;
        Ok(full)
    }
}
