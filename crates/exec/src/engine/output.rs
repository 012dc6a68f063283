//! The last stage's output: final RMSNorm, then log-probabilities of target tokens (LM head,
//! vocabulary-parallel) or one scalar per position (value head).

use super::arena::Arena;
use super::ops::*;
use super::parallel::CopyToTp;
use super::stage::StageModel;
use super::EngineError;
use nereus_core::cost::MemoryItem;
use nereus_core::model::OutputHead;

/// What the head's backward pass needs from its forward pass.
pub struct HeadActs {
    x: Vec<f32>,
    xf: Vec<f32>,
    rf: Vec<f32>,
    logits: Vec<f32>,
    lse: Vec<f32>,
    targets: Vec<u32>,
}

impl StageModel {
    fn final_norm(&self, p: &[f32], x: &[f32], arena: &mut Arena) -> Result<(Vec<f32>, Vec<f32>), EngineError> {
        let c = self.dims().c;
        let range = self
            .weights
            .final_norm
            .clone()
            .ok_or_else(|| EngineError::Shape { what: "output head on a stage without it".into() })?;
        let (mut xf, mut rf) =
            (arena.zeros(MemoryItem::Activations, x.len())?, arena.zeros(MemoryItem::Activations, x.len() / c)?);
        rmsnorm_forward(&mut xf, &mut rf, x, &p[range], c, self.eps);
        Ok((xf, rf))
    }

    /// Last stage, forward: per row `n`, `log p(targets[n])` for an LM or the value for a value
    /// model, from the last block's output `x[N,C]`.
    pub fn head_forward<G: TensorGroup<f32>>(
        &self,
        p: &[f32],
        x: Vec<f32>,
        targets: Vec<u32>,
        tp: &G,
        arena: &mut Arena,
    ) -> Result<(Vec<f32>, HeadActs), EngineError> {
        let (d, n) = (self.dims(), x.len() / self.dims().c);
        let (mut xf, rf) = self.final_norm(p, &x, arena)?;
        let mut out = arena.zeros(MemoryItem::Logits, n)?;
        let (mut logits, mut lse) = (Vec::new(), Vec::new());
        match self.head {
            OutputHead::Lm => {
                let w = &p[self
                    .weights
                    .lm_head
                    .clone()
                    .ok_or_else(|| EngineError::Shape { what: "LM head missing".into() })?];
                CopyToTp::forward(&mut xf);
                logits = arena.zeros(MemoryItem::Logits, n * d.vocab)?;
                linear_forward(&mut logits, &xf, w, n, d.c, d.vocab);
                lse = arena.zeros(MemoryItem::Logits, n)?;
                log_probs_forward(&mut out, &mut lse, &logits, &targets, d.v0, tp)?;
            }
            OutputHead::Value => {
                let w = &p[self
                    .weights
                    .score
                    .clone()
                    .ok_or_else(|| EngineError::Shape { what: "value head missing".into() })?];
                value_forward(&mut out, &xf, w);
            }
        }
        Ok((out, HeadActs { x, xf, rf, logits, lse, targets }))
    }

    /// Last stage, backward: from `d loss / d output[N]` to `dx[N,C]`, accumulating the head's
    /// and the final norm's gradients.
    pub fn head_backward<G: TensorGroup<f32>>(
        &self,
        p: &[f32],
        grads: &mut [f32],
        a: &HeadActs,
        dout: &[f32],
        tp: &G,
        arena: &mut Arena,
    ) -> Result<Vec<f32>, EngineError> {
        let (d, n) = (self.dims(), dout.len());
        let mut dxf = arena.zeros(MemoryItem::ActivationGradients, n * d.c)?;
        match self.head {
            OutputHead::Lm => {
                let range = self.weights.lm_head.clone().unwrap_or_default();
                let mut dlogits = arena.zeros(MemoryItem::Logits, n * d.vocab)?;
                log_probs_backward(&mut dlogits, dout, &a.logits, &a.lse, &a.targets, d.v0);
                linear_backward(Some(&mut dxf), &mut grads[range.clone()], &dlogits, &a.xf, &p[range], n, d.c, d.vocab);
                CopyToTp::backward(tp, &mut dxf)?;
            }
            OutputHead::Value => {
                let range = self.weights.score.clone().unwrap_or_default();
                value_backward(&mut dxf, &mut grads[range.clone()], dout, &a.xf, &p[range]);
            }
        }
        let range = self.weights.final_norm.clone().unwrap_or_default();
        let mut dx = arena.zeros(MemoryItem::ActivationGradients, n * d.c)?;
        rmsnorm_backward(&mut dx, &mut grads[range.clone()], &dxf, &a.x, &p[range], &a.rf, d.c);
        Ok(dx)
    }

    /// Last stage, generation: the whole vocabulary's logits `[N, vocab]` of rows `x[N,C]`
    /// (each TP rank fills its columns and one sum over the group completes every row).
    pub fn full_logits<G: TensorGroup<f32>>(
        &self,
        p: &[f32],
        x: &[f32],
        tp: &G,
        arena: &mut Arena,
    ) -> Result<Vec<f32>, EngineError> {
        let (d, n) = (self.dims(), x.len() / self.dims().c);
        let (xf, _) = self.final_norm(p, x, arena)?;
        let w = &p[self
            .weights
            .lm_head
            .clone()
            .ok_or_else(|| EngineError::Shape { what: "sampling from a model without an LM head".into() })?];
        let mut local = arena.zeros(MemoryItem::Logits, n * d.vocab)?;
        linear_forward(&mut local, &xf, w, n, d.c, d.vocab);
        let mut full = arena.zeros(MemoryItem::Logits, n * d.vocab_total)?;
        for (row, src) in full.chunks_exact_mut(d.vocab_total).zip(local.chunks_exact(d.vocab)) {
            row[d.v0..d.v0 + d.vocab].copy_from_slice(src);
        }
        tp.sum(&mut full)?;
        Ok(full)
    }
}
