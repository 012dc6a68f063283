//! What a training step minimizes: an [`Objective`] over the model's per-position outputs,
//! computed on the host from the outputs, or by the device itself where it has a
//! [`DeviceObjective`] form (next-token cross-entropy; the RL losses stay on the host).

use std::ops::Range;

/// A training loss over per-position outputs of the model.
///
/// For an LM, row `(s, t)` holds `log p(tokens[s][t+1] | tokens[s][..=t])`; the last position
/// has no next token, and its row must get zero gradient. For a value model, row `(s, t)` is
/// the value after `tokens[s][..=t]`.
pub trait Objective {
    /// This micro-batch's share of the loss for sequences `seqs` (global indices), writing
    /// `d loss / d output` for each of their rows into `grad`.
    fn loss_and_grad(&self, seqs: Range<usize>, outputs: &[f32], grad: &mut [f32]) -> f64;

    /// The objective in a form a device computes without reading the outputs back, if it has
    /// one; objectives without one (the RL losses) are computed on the host from the outputs.
    fn on_device(&self) -> Option<DeviceObjective> {
        None
    }
}

/// An objective a device computes itself (`nereus_cross_entropy`): its loss is added to the
/// step's accumulator on the device and read once, with the gradient norm, at the step's end.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum DeviceObjective {
    /// Mean next-token cross-entropy over rows of log p of `seq_len` positions per sequence (the
    /// last has no next token), over the global batch's `1 / inv_count` counted positions.
    NextToken {
        /// Positions per sequence.
        seq_len: usize,
        /// One over the counted positions.
        inv_count: f32,
    },
}

/// Mean next-token cross-entropy over every position that has a next token, for a language model
/// trained on whole sequences (the engine's selftests and benchmarks).
pub struct CrossEntropy {
    /// Sequences in the global batch.
    pub sequences: usize,
    /// Positions per sequence.
    pub seq_len: usize,
}

impl Objective for CrossEntropy {
    fn loss_and_grad(&self, _seqs: Range<usize>, outputs: &[f32], grad: &mut [f32]) -> f64 {
        let norm = (self.sequences * (self.seq_len - 1)) as f64;
        let mut loss = 0.0;
        for (i, (&lp, g)) in outputs.iter().zip(grad.iter_mut()).enumerate() {
            let counted = i % self.seq_len != self.seq_len - 1;
            *g = if counted { (-1.0 / norm) as f32 } else { 0.0 };
            loss -= if counted { f64::from(lp) / norm } else { 0.0 };
        }
        loss
    }

    fn on_device(&self) -> Option<DeviceObjective> {
        let counted = (self.sequences * (self.seq_len - 1)) as f64;
        Some(DeviceObjective::NextToken { seq_len: self.seq_len, inv_count: (1.0 / counted) as f32 })
    }
}
