//! The last stage's output: final RMSNorm, then log-probabilities of target tokens (LM head,
//! vocabulary-parallel) or one scalar per position (value head).

use super::compute::{Compute, RowCopy};
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
    /// The LM head's logits and log-sum-exp (absent for a value head).
    lm: Option<(A, S)>,
    targets: Vec<u32>,
}

impl StageModel {
    fn final_norm<C: Compute>(
        &self,
        c: &mut C,
        p: &C::Params,
        x: &C::Act,
        n: usize,
    ) -> Result<(C::Act, C::Stat), EngineError> {
        let range = self
            .weights
            .final_norm
            .as_ref()
            .ok_or_else(|| EngineError::Shape { what: "output head on a stage without it".into() })?;
        let width = self.dims().c;
        let (mut xf, mut rf) = (c.zeros(MemoryItem::Activations, n * width)?, c.stats(MemoryItem::Activations, n)?);
        c.rmsnorm_forward(&mut xf, &mut rf, x, (p, range), width, self.eps)?;
        Ok((xf, rf))
    }

    /// Last stage, forward: per row `n`, `log p(targets[n])` for an LM or the value for a value
    /// model, from the last block's output `x[N,C]`.
    #[allow(clippy::type_complexity)]
    pub fn head_forward_on<C: Compute, G: TensorGroup<f32>>(
        &self,
        c: &mut C,
        p: &C::Params,
        x: C::Act,
        targets: Vec<u32>,
        tp: &G,
    ) -> Result<(C::Stat, HeadActs<C::Act, C::Stat>), EngineError> {
        let (d, n) = (self.dims(), targets.len());
        let (xf, rf) = self.final_norm(c, p, &x, n)?;
        let missing = |what: &str| EngineError::Shape { what: format!("{what} head missing") };
        match self.head {
            OutputHead::Lm => {
                let w = self.weights.lm_head.as_ref().ok_or_else(|| missing("LM"))?;
                // Entering the vocabulary-parallel head is the identity forward (Megatron's copy region).
                let mut logits = c.zeros(MemoryItem::Logits, n * d.vocab)?;
                c.linear_forward(&mut logits, &xf, (p, w), n, d.c, d.vocab)?;
                let (logp, lse) = c.log_probs_forward(&logits, &targets, d.v0, tp)?;
                Ok((logp, HeadActs { x, xf, rf, lm: Some((logits, lse)), targets }))
            }
            OutputHead::Value => {
                let w = self.weights.score.as_ref().ok_or_else(|| missing("value"))?;
                let mut value = c.stats(MemoryItem::Logits, n)?;
                c.value_forward(&mut value, &xf, (p, w))?;
                Ok((value, HeadActs { x, xf, rf, lm: None, targets }))
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
        let mut dxf = c.zeros(MemoryItem::ActivationGradients, n * d.c)?;
        let none = std::ops::Range::default();
        match &a.lm {
            Some((logits, lse)) => {
                let range = self.weights.lm_head.as_ref().unwrap_or(&none);
                let mut dlogits = c.zeros(MemoryItem::Logits, n * d.vocab)?;
                c.log_probs_backward(&mut dlogits, dout, logits, lse, &a.targets, d.v0)?;
                c.linear_backward(Some(&mut dxf), (grads, range), &dlogits, &a.xf, (p, range), n, d.c, d.vocab)?;
                // Each TP rank's input gradient covers its vocabulary columns: the copy's backward sums them.
                c.tp_sum(tp, &mut dxf)?;
            }
            None => {
                let range = self.weights.score.as_ref().unwrap_or(&none);
                c.value_backward(&mut dxf, (grads, range), dout, &a.xf, (p, range))?;
            }
        }
        let range = self.weights.final_norm.as_ref().unwrap_or(&none);
        let mut dx = c.zeros(MemoryItem::ActivationGradients, n * d.c)?;
        c.rmsnorm_backward(&mut dx, (grads, range), &dxf, &a.x, (p, range), &a.rf, d.c)?;
        Ok(dx)
    }

    /// Last stage, generation: the whole vocabulary's logits `[B, vocab]` of the rows `x[B,C]`
    /// (each TP rank fills its columns and one sum over the group completes every row).
    pub fn full_logits_on<C: Compute, G: TensorGroup<f32>>(
        &self,
        c: &mut C,
        p: &C::Params,
        x: &C::Act,
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
        let mut local = c.zeros(MemoryItem::Logits, b * d.vocab)?;
        c.linear_forward(&mut local, &xf, (p, w), b, d.c, d.vocab)?;
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
