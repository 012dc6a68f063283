//! A device's recording in progress ([`Recording`]): the stream operations enqueued since it
//! began ([`StreamOp`]) and the blocks it owns. What a runtime makes of the list, and how a
//! kept list is replayed, are the runtime seam's ([`super::runtime`]). The decode step of
//! `engine::generate` is what is recorded (docs/engine.md, "Decode as a replayed graph").

use super::runtime::StreamOp;

/// A recording in progress on a device: the operations enqueued since it began, and the blocks
/// it allocated (the graph keeps them: a replay writes them again).
#[derive(Debug, Default)]
pub(super) struct Recording {
    /// The operations, in stream order.
    pub(super) ops: Vec<StreamOp>,
    /// Every block allocated while recording, by address, with its size (ordered, so blocks
    /// go back to the cache in the same order every run).
    pub(super) owned: std::collections::BTreeMap<u64, u64>,
    /// Owned blocks freed while recording, for its later allocations (stream order holds within
    /// the recording as it does eagerly).
    pub(super) freed: super::cache::BlockCache,
    /// Blocks allocated before the recording and freed inside it, with their sizes: a replay
    /// would use them after their owners let them go, so the recording fails (and they go to
    /// the cache then).
    pub(super) foreign_frees: Vec<(nereus_kernels::DevicePtr, u64)>,
}

impl Recording {
    /// Kernel launches among the operations.
    pub(super) fn kernels(&self) -> u64 {
        self.ops.iter().filter(|op| matches!(op, StreamOp::Launch { .. })).count() as u64
    }

    /// GEMM calls among the operations.
    pub(super) fn gemms(&self) -> u64 {
        self.ops.iter().filter(|op| matches!(op, StreamOp::Gemm { .. })).count() as u64
    }
}
