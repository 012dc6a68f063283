//! The reference engine: a Llama-style decoder on CPUs in f32 with hand-written forward and
//! backward passes (llm.c style), tensor, pipeline and data parallelism over the `comm` data
//! plane, AdamW, and KV-cache generation.
//!
//! Parameters and Adam moments are the EMU shard store's flat buffers, read in place through
//! the catalogue's size table ([`weights`]); gradients, activations, logits and the KV cache
//! are charged to the same rank's memory ledger ([`arena`]) before they are allocated.

pub mod ops;
mod real;

pub use real::{matmul, Op, Real};

use thiserror::Error;

use crate::comm::CommError;
use crate::emu::EmuError;

/// Why the engine stopped.
#[derive(Debug, Error)]
pub enum EngineError {
    /// A buffer would pass the rank's memory capacity (raised before allocating).
    #[error(transparent)]
    OutOfMemory(#[from] EmuError),
    /// A collective or transfer failed.
    #[error(transparent)]
    Comm(#[from] CommError),
    /// Inputs whose shapes do not fit the model.
    #[error("shape mismatch: {what}")]
    Shape {
        /// What did not fit.
        what: String,
    },
}
