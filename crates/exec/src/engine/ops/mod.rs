//! The layers of a Llama-style decoder, each a `<layer>_forward` / `<layer>_backward` pair over
//! flat row-major slices (llm.c style). Backward passes *accumulate* into input gradients
//! (`dx += …`), because every activation in a residual network feeds more than one consumer.
//!
//! Dimension legend (local to this rank after tensor parallelism):
//!
//! | letter | meaning |
//! |---|---|
//! | `N` | token rows of a micro-batch, `B·T` |
//! | `B`, `T` | sequences, positions per sequence |
//! | `C` | residual width (`hidden`) |
//! | `H`, `K`, `D` | query heads, key/value heads, head width |
//! | `F` | SwiGLU inner width |
//! | `V` | vocabulary rows held by this rank |

pub mod attention;
pub mod embedding;
pub mod head;
pub mod linear;
pub mod rmsnorm;
pub mod rope;
pub mod swiglu;

#[cfg(test)]
mod tests;

pub use attention::{attention_backward, attention_forward, AttentionShape};
pub use embedding::{embedding_backward, embedding_forward};
pub use head::{log_probs_backward, log_probs_finish, log_probs_fold, value_backward, value_forward, RowStats};
pub use linear::{linear_backward, linear_forward, linear_input_grad};
pub use rmsnorm::{rmsnorm_backward, rmsnorm_forward};
pub use rope::{frequencies, QkvLayout, Rope};
pub use swiglu::{swiglu_backward, swiglu_forward};

use super::Real;
use crate::backend::gpu::DevicePtr;

/// A reduction over the tensor-parallel group of a layer. The vocabulary-parallel head needs
/// the sum and the maximum across shards; one rank (`Local`) reduces over nothing.
pub trait TensorGroup<T: Real> {
    /// Element-wise sum over the group, in place.
    fn sum(&self, values: &mut [T]) -> Result<(), super::EngineError>;
    /// Element-wise maximum over the group, in place.
    fn max(&self, values: &mut [T]) -> Result<(), super::EngineError>;
    /// Whether the group is this rank alone (its reductions are the identity).
    fn is_single(&self) -> bool {
        false
    }
    /// Element-wise sum of `count` bf16 values at `data` in device memory, in place, over the
    /// plane's device collective; `false` where there is none (the caller sums through the
    /// host).
    fn sum_bf16_on_device(&self, _data: DevicePtr, _count: usize) -> Result<bool, super::EngineError> {
        Ok(false)
    }
}

/// The group of one rank: reductions are the identity.
pub struct Local;

impl<T: Real> TensorGroup<T> for Local {
    fn sum(&self, _values: &mut [T]) -> Result<(), super::EngineError> {
        Ok(())
    }
    fn max(&self, _values: &mut [T]) -> Result<(), super::EngineError> {
        Ok(())
    }
    fn is_single(&self) -> bool {
        true
    }
}
