//! One training step of one replica: GPipe micro-batches through the pipeline, gradients
//! summed over the model-stage's data-parallel replicas, global-norm clipping and AdamW on the
//! EMU's own buffers.
//!
//! A model-stage's global batch is the same for every layout: replica `r` of `dp` takes the
//! `r`-th equal share of the sequences and walks it in micro-batches (gradient accumulation),
//! and the objective normalizes by global counts, so the summed gradient is the same sum over
//! the same sequences whatever `(tp, pp, dp)`.

use std::ops::Range;

use crate::comm::DataPlane;
use crate::emu::{EmuId, EmuSet};

use super::arena::Arena;
use super::optimizer::AdamW;
use super::output::HeadActs;
use super::stage::{BlockActs, Rows};
use super::{f32_sections, EngineError, Replica};

/// A training loss over per-position outputs of the model.
///
/// For an LM, row `(s, t)` holds `log p(tokens[s][t+1] | tokens[s][..=t])`; the last position
/// has no next token, and its row must get zero gradient. For a value model, row `(s, t)` is
/// the value after `tokens[s][..=t]`.
pub trait Objective {
    /// This micro-batch's share of the loss for sequences `seqs` (global indices), writing
    /// `d loss / d output` for each of their rows into `grad`.
    fn loss_and_grad(&self, seqs: Range<usize>, outputs: &[f32], grad: &mut [f32]) -> f64;
}

/// A model-stage's global batch: `sequences × seq_len` tokens, row-major.
#[derive(Debug, Clone, Copy)]
pub struct Batch<'a> {
    /// Tokens `[S, T]`.
    pub tokens: &'a [u32],
    /// Positions per sequence `T`.
    pub seq_len: usize,
}

impl Batch<'_> {
    /// Sequences `S`.
    pub fn sequences(&self) -> usize {
        self.tokens.len() / self.seq_len.max(1)
    }

    /// The sequences replica `r` of `dp` takes: contiguous, sizes differing by at most one.
    pub fn share(&self, (r, dp): (usize, usize)) -> Range<usize> {
        let s = self.sequences();
        r * s / dp..(r + 1) * s / dp
    }

    /// Tokens of `seqs`.
    pub fn tokens_of(&self, seqs: &Range<usize>) -> &[u32] {
        &self.tokens[seqs.start * self.seq_len..seqs.end * self.seq_len]
    }

    /// Next-token targets of `seqs` (the last position of each sequence repeats itself).
    pub fn targets_of(&self, seqs: &Range<usize>) -> Vec<u32> {
        let t = self.seq_len;
        self.tokens_of(seqs).chunks_exact(t).flat_map(|s| (0..t).map(move |i| s[(i + 1).min(t - 1)])).collect()
    }
}

/// What one training step reports (the same on every rank of the model-stage).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct StepReport {
    /// The objective over the whole global batch.
    pub loss: f64,
    /// Global gradient norm before clipping.
    pub grad_norm: f64,
}

impl Replica {
    /// Forward through this stage for sequences `seqs` of `batch`: receives from the previous
    /// stage or embeds, runs the blocks, then sends to the next stage or applies the head.
    /// Returns the blocks' saved activations and, on the last stage, the outputs and head state.
    #[allow(clippy::type_complexity)]
    fn forward_micro<P: DataPlane>(&self, plane: &P, params: &[f32], batch: &Batch, seqs: &Range<usize>, arena: &mut Arena) -> Result<(Vec<BlockActs>, Option<(Vec<f32>, HeadActs)>), EngineError> {
        let tp = self.groups.tp_group(plane);
        let rows = Rows { b: seqs.len(), t: batch.seq_len, pos0: 0 };
        let x = if self.model.weights.is_first() {
            self.model.embed(params, batch.tokens_of(seqs), &tp, arena)?
        } else {
            let mut x = arena.zeros("pipeline activations", rows.b * rows.t * self.model.dims().c)?;
            self.groups.recv_prev(plane, &mut x)?;
            x
        };
        let (x, acts) = self.model.blocks_forward(params, x, rows, None, &tp, arena)?;
        if self.model.weights.is_last() {
            let head = self.model.head_forward(params, x, &batch.targets_of(seqs), &tp, arena)?;
            Ok((acts, Some(head)))
        } else {
            self.groups.send_next(plane, &x)?;
            Ok((acts, None))
        }
    }

    fn micro_batches(&self, batch: &Batch, micro_batch: usize) -> Vec<Range<usize>> {
        let share = batch.share(self.groups.replica);
        let m = micro_batch.max(1);
        share.clone().step_by(m).map(|s| s..(s + m).min(share.end)).collect()
    }

    /// Forward only (inference): the outputs of this replica's share of `batch`, `[share × T]`,
    /// on the last pipeline stage (empty elsewhere).
    pub fn infer<P: DataPlane>(&self, plane: &P, params: &[f32], batch: &Batch, micro_batch: usize, arena: &mut Arena) -> Result<Vec<f32>, EngineError> {
        let mut outputs = Vec::new();
        for seqs in self.micro_batches(batch, micro_batch) {
            let mark = arena.mark();
            let (acts, head) = self.forward_micro(plane, params, batch, &seqs, arena)?;
            if let Some((out, _)) = head {
                outputs.extend_from_slice(&out);
            }
            drop(acts);
            arena.release_to(mark);
        }
        Ok(outputs)
    }

    /// Forward and backward over this replica's share of `batch` (GPipe: every micro-batch
    /// forward, then every one backward, last first), accumulating into `grads`. Returns the
    /// loss over the share (non-zero on the last pipeline stage only).
    #[allow(clippy::too_many_arguments)]
    pub fn forward_backward<P: DataPlane>(&self, plane: &P, params: &[f32], grads: &mut [f32], batch: &Batch, micro_batch: usize, objective: &dyn Objective, arena: &mut Arena) -> Result<f64, EngineError> {
        let tp = self.groups.tp_group(plane);
        let micro = self.micro_batches(batch, micro_batch);
        let mut saved = Vec::with_capacity(micro.len());
        let mut loss = 0.0;
        // Activations are charged per micro-batch and released in reverse order, as they die.
        let mut marks = Vec::with_capacity(micro.len());
        for seqs in &micro {
            marks.push(arena.mark());
            let (acts, head) = self.forward_micro(plane, params, batch, seqs, arena)?;
            let head = match head {
                Some((out, head)) => {
                    let mut dout = arena.zeros("output gradients", out.len())?;
                    loss += objective.loss_and_grad(seqs.clone(), &out, &mut dout);
                    Some((head, dout))
                }
                None => None,
            };
            saved.push((acts, head));
        }
        for ((seqs, (acts, head)), mark) in micro.iter().zip(saved).zip(marks).rev() {
            let rows = Rows { b: seqs.len(), t: batch.seq_len, pos0: 0 };
            let dx = match head {
                Some((head, dout)) => self.model.head_backward(params, grads, &head, &dout, &batch.targets_of(seqs), &tp, arena)?,
                None => {
                    let mut dx = arena.zeros("pipeline gradients", rows.b * rows.t * self.model.dims().c)?;
                    self.groups.recv_next(plane, &mut dx)?;
                    dx
                }
            };
            let dx = self.model.blocks_backward(params, grads, &acts, dx, rows, &tp, arena)?;
            if self.model.weights.is_first() {
                self.model.embed_backward(grads, &dx, batch.tokens_of(seqs));
            } else {
                self.groups.send_prev(plane, &dx)?;
            }
            drop((acts, dx));
            arena.release_to(mark);
        }
        Ok(loss)
    }

    /// Sums `grads` over the data-parallel replicas, then returns the global gradient norm
    /// (tensors replicated over TP counted once) and the loss summed over the model-stage.
    fn reduce<P: DataPlane>(&self, plane: &P, grads: &mut [f32], loss: f64) -> Result<(f64, f64), EngineError> {
        if let Some(dp) = self.groups.dp {
            plane.all_reduce_sum_f32(dp, grads)?;
        }
        let counted = |(_, replicated): &(Range<usize>, bool)| !*replicated || self.groups.position.tp == 0;
        let sq: f64 = self.model.weights.tensors.iter().filter(|x| counted(x)).map(|(r, _)| grads[r.clone()].iter().map(|&g| f64::from(g) * f64::from(g)).sum::<f64>()).sum();
        let speaks = self.model.weights.is_last() && self.groups.position.tp == 0;
        let mut sums = [sq as f32, if speaks { loss as f32 } else { 0.0 }];
        if let Some(emu) = self.groups.emu {
            plane.all_reduce_sum_f32(emu, &mut sums)?;
        }
        let mut loss = [sums[1]];
        if let Some(dp) = self.groups.dp {
            plane.all_reduce_sum_f32(dp, &mut loss)?;
        }
        Ok((f64::from(sums[0]).sqrt(), f64::from(loss[0])))
    }
}

/// One optimizer step of replica `id` of a training model-stage on `batch` (every rank of every
/// replica of the model-stage calls it): forward, backward, DP all-reduce, clipping, AdamW on
/// the EMU's parameter and moment sections, and `updates += 1` in its counters on this rank
/// (ranks outside the model-stage learn the new counters from the caller, in lockstep).
#[allow(clippy::too_many_arguments)]
pub fn train_step<P: DataPlane>(plane: &P, set: &mut EmuSet, replica: &Replica, batch: &Batch, micro_batch: usize, objective: &dyn Objective, opt: &AdamW) -> Result<StepReport, EngineError> {
    let id: EmuId = replica.emu;
    let mut counters = set.emu(id).ok_or_else(|| EngineError::Shape { what: format!("{id} does not exist") })?.counters;
    let (shard, ledger) = set.store_mut().shard_and_ledger(id).ok_or_else(|| EngineError::Shape { what: format!("this rank holds no shard of {id}") })?;
    let mut arena = Arena::new(ledger);
    let (params, moments) = f32_sections(shard)?;
    let (m, v) = moments.ok_or_else(|| EngineError::Shape { what: format!("{id} keeps no optimizer state") })?;
    let mut grads = arena.zeros::<f32>("gradients", params.len())?;
    let loss = replica.forward_backward(plane, params, &mut grads, batch, micro_batch, objective, &mut arena)?;
    let (grad_norm, loss) = replica.reduce(plane, &mut grads, loss)?;
    let scale = opt.clip_scale(grad_norm);
    for (r, replicated) in &replica.model.weights.tensors {
        let r = r.clone();
        opt.update(&mut params[r.clone()], &mut m[r.clone()], &mut v[r.clone()], &grads[r], counters.updates + 1, scale, !replicated);
    }
    drop(arena);
    counters.updates += 1;
    counters.model_version += 1;
    set.set_counters(id, counters);
    Ok(StepReport { loss, grad_norm })
}
