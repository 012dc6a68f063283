//! One training step of one replica: 1F1B micro-batches through the pipeline, gradients
//! summed over the model-stage's data-parallel replicas, global-norm clipping and AdamW on the
//! EMU's own buffers.
//!
//! A model-stage's global batch is the same for every layout: replica `r` of `dp` takes the
//! `r`-th equal share of the sequences and walks it in micro-batches (gradient accumulation),
//! and the objective normalizes by global counts, so the summed gradient is the same sum over
//! the same sequences whatever `(tp, pp, dp)`.

use nereus_core::cost::{MemoryBreakdown, MemoryItem};
use std::collections::VecDeque;
use std::ops::Range;

use crate::comm::DataPlane;

use super::compute::{Compute, Neighbour};
use super::objective::Objective;
use super::output::HeadActs;
use super::stage::{last_residual, BlockActs, LastResidual, Rows};
use super::{EngineError, Replica};

/// The sequences of `sequences` that replica `r` of `dp` takes: contiguous, sizes differing by
/// at most one.
pub fn share(sequences: usize, (r, dp): (usize, usize)) -> Range<usize> {
    r * sequences / dp..(r + 1) * sequences / dp
}

/// A model-stage's global batch: `sequences × seq_len` tokens, row-major.
#[derive(Debug, Clone, Copy)]
pub struct Batch<'a> {
    /// Tokens `[S, T]`.
    pub tokens: &'a [u32],
    /// Positions per sequence `T`.
    pub seq_len: usize,
    /// Per sequence, the position of its first real token (left padding before it is masked);
    /// empty when no sequence is padded.
    pub starts: &'a [usize],
}

impl Batch<'_> {
    /// Sequences `S`.
    pub fn sequences(&self) -> usize {
        self.tokens.len() / self.seq_len.max(1)
    }

    /// The sequences replica `r` of `dp` takes (see [`share`]).
    pub fn share(&self, replica: (usize, usize)) -> Range<usize> {
        share(self.sequences(), replica)
    }

    /// The first real positions of `seqs` (empty when no sequence is padded).
    pub fn starts_of(&self, seqs: &Range<usize>) -> &[usize] {
        if self.starts.is_empty() {
            &[]
        } else {
            &self.starts[seqs.clone()]
        }
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

/// What a stage's forward pass hands on.
enum StageOut<A, S> {
    /// Hidden state for the next stage.
    Hidden(A),
    /// The last stage's outputs and head state.
    Head(S, HeadActs<A, S>),
}

/// A micro-batch between its forward and its backward pass.
struct InFlight<A, S> {
    seqs: Range<usize>,
    acts: Vec<BlockActs<A, S>>,
    head: Option<(HeadActs<A, S>, S)>,
    /// What its forward pass charged, its input included (released by its backward pass).
    charges: MemoryBreakdown,
}

/// The micro-batch state of a [`Compute`].
type Flight<C> = InFlight<<C as Compute>::Act, <C as Compute>::Stat>;

/// What one training step reports (the same on every rank of the model-stage).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct StepReport {
    /// The objective over the whole global batch.
    pub loss: f64,
    /// Global gradient norm before clipping.
    pub grad_norm: f64,
    /// Whether the update was refused because the loss or the gradient norm was not finite
    /// (parameters, moments and counters are then unchanged).
    pub skipped: bool,
}

impl StepReport {
    /// The report of a model-stage that did not train.
    pub const NONE: StepReport = StepReport { loss: 0.0, grad_norm: 0.0, skipped: false };
}

/// `elements` activations of a pipeline buffer, as a compute charges them.
fn pipeline_charge<C: Compute>(elements: usize) -> MemoryBreakdown {
    let mut m = MemoryBreakdown::default();
    m.add(MemoryItem::PipelineBuffers, C::ACT_BYTES * elements as u64);
    m
}

impl Replica {
    /// Forward through this stage for sequences `seqs` of `batch`, from the embedding (first
    /// stage) or the previous stage's `input`: the blocks' saved activations, then either the
    /// hidden state for the next stage or, on the last stage, the head's outputs and state.
    #[allow(clippy::type_complexity)]
    fn stage_forward<C: Compute, P: DataPlane>(
        &self,
        c: &mut C,
        plane: &P,
        params: &C::Params,
        batch: &Batch,
        seqs: &Range<usize>,
        input: Option<C::Act>,
    ) -> Result<(Vec<BlockActs<C::Act, C::Stat>>, StageOut<C::Act, C::Stat>), EngineError> {
        let tp = self.groups.tp_group(plane);
        let rows = Rows { b: seqs.len(), t: batch.seq_len, pos0: 0, starts: batch.starts_of(seqs) };
        let x = match input {
            Some(x) => x,
            None => self.model.embed_on(c, params, batch.tokens_of(seqs), &tp)?,
        };
        if !self.model.weights.is_last() {
            let (x, acts) = self.model.blocks_forward_on(c, params, x, rows, None, &tp, LastResidual::Added)?;
            return Ok((acts, StageOut::Hidden(x)));
        }
        let (x, acts) = self.model.blocks_forward_on(c, params, x, rows, None, &tp, LastResidual::ToFinalNorm)?;
        let residual = last_residual(&acts);
        let (out, head) = self.model.head_forward_on(c, params, (x, residual), batch.targets_of(seqs), &tp)?;
        Ok((acts, StageOut::Head(out, head)))
    }

    /// The previous stage's activations for `rows` token rows (`None` on the first stage, which
    /// embeds).
    pub(super) fn recv_input_on<C: Compute, P: DataPlane>(
        &self,
        c: &mut C,
        plane: &P,
        rows: usize,
    ) -> Result<Option<C::Act>, EngineError> {
        if self.model.weights.is_first() {
            return Ok(None);
        }
        let mut x = c.zeros(MemoryItem::PipelineBuffers, rows * self.model.dims().c)?;
        c.pipe(&self.groups.link(plane), None, Some((Neighbour::Prev, &mut x)))?;
        Ok(Some(x))
    }

    fn micro_batches(&self, batch: &Batch, micro_batch: usize) -> Vec<Range<usize>> {
        let share = batch.share(self.groups.replica);
        let m = micro_batch.max(1);
        share.clone().step_by(m).map(|s| s..(s + m).min(share.end)).collect()
    }

    /// Forward only (inference): the outputs of this replica's share of `batch`, `[share × T]`,
    /// on the last pipeline stage (empty elsewhere).
    pub fn infer_on<C: Compute, P: DataPlane>(
        &self,
        c: &mut C,
        plane: &P,
        params: &C::Params,
        batch: &Batch,
        micro_batch: usize,
    ) -> Result<Vec<f32>, EngineError> {
        let mut outputs = Vec::new();
        for seqs in self.micro_batches(batch, micro_batch) {
            let mark = c.mark();
            let input = self.recv_input_on(c, plane, seqs.len() * batch.seq_len)?;
            match self.stage_forward(c, plane, params, batch, &seqs, input)?.1 {
                StageOut::Head(out, _) => outputs.extend(c.read_stats(&out, |o| Ok(o.to_vec()))?),
                StageOut::Hidden(x) => c.pipe(&self.groups.link(plane), Some((Neighbour::Next, &x)), None)?,
            }
            let since = c.since(mark);
            c.release(&since);
        }
        Ok(outputs)
    }

    /// One micro-batch forward; on the last stage the objective's loss and output gradient too.
    /// Returns what its backward pass needs and the hidden state to send on (other stages).
    #[allow(clippy::too_many_arguments)]
    fn forward_one<C: Compute, P: DataPlane>(
        &self,
        c: &mut C,
        plane: &P,
        params: &C::Params,
        batch: &Batch,
        seqs: &Range<usize>,
        input: Option<C::Act>,
        objective: &dyn Objective,
        loss: &mut f64,
    ) -> Result<(Flight<C>, Option<C::Act>), EngineError> {
        let before = c.mark();
        // A received input is part of the micro-batch: it becomes the first block's saved `x`.
        let received = if input.is_some() { seqs.len() * batch.seq_len * self.model.dims().c } else { 0 };
        let (acts, out) = self.stage_forward(c, plane, params, batch, seqs, input)?;
        let (head, hidden) = match out {
            StageOut::Head(out, head) => {
                let mut dout = c.stats(MemoryItem::Logits, seqs.len() * batch.seq_len)?;
                *loss += c.objective(objective, seqs.clone(), &out, &mut dout)?;
                (Some((head, dout)), None)
            }
            StageOut::Hidden(x) => (None, Some(x)),
        };
        let charges = c.since(before).plus(&pipeline_charge::<C>(received));
        Ok((InFlight { seqs: seqs.clone(), acts, head, charges }, hidden))
    }

    /// One micro-batch backward from the head (last stage) or the next stage's `grad`;
    /// releases its charges and returns the input gradient to send back (other than stage 0).
    #[allow(clippy::too_many_arguments)]
    fn backward_one<C: Compute, P: DataPlane>(
        &self,
        c: &mut C,
        plane: &P,
        params: &C::Params,
        grads: &mut C::Grads,
        batch: &Batch,
        f: Flight<C>,
        grad: Option<C::Act>,
    ) -> Result<Option<C::Act>, EngineError> {
        let tp = self.groups.tp_group(plane);
        let before = c.mark();
        let rows = Rows { b: f.seqs.len(), t: batch.seq_len, pos0: 0, starts: batch.starts_of(&f.seqs) };
        let dx = match (f.head, grad) {
            (Some((head, dout)), _) => self.model.head_backward_on(c, params, grads, &head, &dout, &tp)?,
            (None, Some(g)) => g,
            (None, None) => {
                return Err(EngineError::Shape {
                    what: "pipeline backward without a gradient from the next stage".into(),
                })
            }
        };
        let dx = self.model.blocks_backward_on(c, params, grads, &f.acts, dx, rows, &tp)?;
        let done = c.since(before).plus(&f.charges);
        c.release(&done);
        if self.model.weights.is_first() {
            self.model.embed_backward_on(c, grads, &dx, batch.tokens_of(&f.seqs))?;
            return Ok(None);
        }
        Ok(Some(dx))
    }

    /// Forward and backward over this replica's share of `batch`, accumulating into `grads`,
    /// on the 1F1B schedule (Narayanan et al. 2021, Megatron's non-interleaved schedule): stage
    /// `j` of `pp` runs `pp − 1 − j` warm-up forwards, then alternates one forward and one
    /// backward, then drains the backwards — so it holds at most `pp − j` micro-batches of
    /// activations instead of all of them. Sends and receives that cross in the steady phase
    /// are posted together. Returns the loss over the share (non-zero on the last stage only).
    #[allow(clippy::too_many_arguments)]
    pub fn forward_backward_on<C: Compute, P: DataPlane>(
        &self,
        c: &mut C,
        plane: &P,
        params: &C::Params,
        grads: &mut C::Grads,
        batch: &Batch,
        micro_batch: usize,
        objective: &dyn Objective,
    ) -> Result<f64, EngineError> {
        let micro = self.micro_batches(batch, micro_batch);
        let (pp, j) = (self.groups.layout.pp as usize, self.groups.position.pp as usize);
        let warmup = (pp - 1 - j).min(micro.len());
        let width = self.model.dims().c;
        let elements = |seqs: &Range<usize>| seqs.len() * batch.seq_len * width;
        let mut loss = 0.0;
        let link = self.groups.link(plane);
        let mut inflight: VecDeque<Flight<C>> = VecDeque::new();
        for seqs in &micro[..warmup] {
            let input = self.recv_input_on(c, plane, seqs.len() * batch.seq_len)?;
            let (f, hidden) = self.forward_one(c, plane, params, batch, seqs, input, objective, &mut loss)?;
            if let Some(x) = hidden {
                c.pipe(&link, Some((Neighbour::Next, &x)), None)?;
            }
            inflight.push_back(f);
        }
        let steady = &micro[warmup..];
        let mut input = match steady.first() {
            Some(seqs) => self.recv_input_on(c, plane, seqs.len() * batch.seq_len)?,
            None => None,
        };
        for (i, seqs) in steady.iter().enumerate() {
            let (f, hidden) = self.forward_one(c, plane, params, batch, seqs, input.take(), objective, &mut loss)?;
            inflight.push_back(f);
            let oldest =
                inflight.pop_front().ok_or_else(|| EngineError::Shape { what: "1F1B: nothing in flight".into() })?;
            let (grad, received) = match hidden {
                Some(x) => {
                    let mut g = c.zeros(MemoryItem::PipelineBuffers, elements(&oldest.seqs))?;
                    c.pipe(&link, Some((Neighbour::Next, &x)), Some((Neighbour::Next, &mut g)))?;
                    (Some(g), elements(&oldest.seqs))
                }
                None => (None, 0),
            };
            let next = steady.get(i + 1);
            match (self.backward_one(c, plane, params, grads, batch, oldest, grad)?, next) {
                (Some(dx), Some(seqs)) => {
                    let mut x = c.zeros(MemoryItem::PipelineBuffers, elements(seqs))?;
                    c.pipe(&link, Some((Neighbour::Prev, &dx)), Some((Neighbour::Prev, &mut x)))?;
                    input = Some(x);
                }
                (Some(dx), None) => c.pipe(&link, Some((Neighbour::Prev, &dx)), None)?,
                (None, _) => {}
            }
            c.release(&pipeline_charge::<C>(received));
        }
        while let Some(f) = inflight.pop_front() {
            let (grad, received) = if self.model.weights.is_last() {
                (None, 0)
            } else {
                let mut g = c.zeros(MemoryItem::PipelineBuffers, elements(&f.seqs))?;
                c.pipe(&link, None, Some((Neighbour::Next, &mut g)))?;
                (Some(g), elements(&f.seqs))
            };
            if let Some(dx) = self.backward_one(c, plane, params, grads, batch, f, grad)? {
                c.pipe(&link, Some((Neighbour::Prev, &dx)), None)?;
            }
            c.release(&pipeline_charge::<C>(received));
        }
        Ok(loss)
    }

    /// Sums `grads` over the data-parallel replicas, then returns the global gradient norm
    /// (tensors replicated over TP counted once) and the loss summed over the model-stage.
    pub(super) fn reduce<P: DataPlane>(
        &self,
        plane: &P,
        grads: &mut [f32],
        loss: f64,
    ) -> Result<(f64, f64), EngineError> {
        if let Some(dp) = self.groups.dp {
            super::timers::timed(nereus_core::cost::OpClass::DpAllReduce, || plane.all_reduce_sum_f32(dp, grads))?;
        }
        let sq = self
            .counted_runs()
            .into_iter()
            .map(|r| grads[r].iter().map(|&g| f64::from(g) * f64::from(g)).sum::<f64>())
            .sum();
        self.norm_and_loss(plane, sq, loss)
    }

    /// The runs of the gradient buffer the global norm counts: every tensor, but replicated
    /// ones (norm gains, the value head) only on the first TP rank, adjacent tensors merged.
    pub(super) fn counted_runs(&self) -> Vec<Range<usize>> {
        let counted = |(_, replicated): &&(Range<usize>, bool)| !*replicated || self.groups.position.tp == 0;
        let mut runs: Vec<Range<usize>> = Vec::new();
        for (r, _) in self.model.weights.tensors.iter().filter(counted) {
            match runs.last_mut() {
                Some(last) if last.end == r.start => last.end = r.end,
                _ => runs.push(r.clone()),
            }
        }
        runs
    }

    /// The global gradient norm from this rank's sum of squares `sq` of its counted gradients
    /// (summed over the replica's ranks), and the loss (from the replica's last stage, summed
    /// over the replicas).
    pub(super) fn norm_and_loss<P: DataPlane>(&self, plane: &P, sq: f64, loss: f64) -> Result<(f64, f64), EngineError> {
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
