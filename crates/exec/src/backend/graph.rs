//! Stream work recorded once and replayed: the operations a [`super::gpu::Device`] enqueues while
//! it records ([`StreamOp`]), and what a runtime makes of the list ([`GraphExec`]): a CUDA or
//! HIP graph captured from one replay of it, or, on the emulated device, the list itself, whose
//! replay enqueues every operation again in order. Either way a replay does what the recorded
//! calls did, with the same arguments and the same addresses; the decode step of
//! `engine::generate` is what is recorded (docs/engine.md, "Decode as a replayed graph").

use super::blas::Gemm;
use super::runtime::{GpuRuntime, RawHandle};
use super::BackendError;
use nereus_kernels::{DevicePtr, KernelArgs, Launch};

/// One stream operation as a device enqueues it (the arguments owned, so it can be enqueued again).
#[derive(Debug, Clone, PartialEq)]
pub enum StreamOp {
    /// A kernel launch.
    Launch {
        /// The kernel and its geometry.
        launch: Launch,
        /// Its arguments.
        args: KernelArgs,
    },
    /// A GEMM library call.
    Gemm {
        /// Its shape.
        gemm: Gemm,
        /// Operand `A`.
        a: DevicePtr,
        /// Operand `B`.
        b: DevicePtr,
        /// Output `C`.
        c: DevicePtr,
    },
    /// A device-to-device copy on the copy engine.
    CopyD2D {
        /// Target.
        dst: DevicePtr,
        /// Source.
        src: DevicePtr,
        /// Bytes.
        bytes: u64,
    },
    /// Zeroing a range.
    Zero {
        /// Start.
        dst: DevicePtr,
        /// Bytes.
        bytes: u64,
    },
}

impl StreamOp {
    /// Enqueues the operation on `stream` of `runtime`.
    ///
    /// # Safety
    /// Every address the operation names is live, as when it was recorded.
    pub unsafe fn enqueue<R: GpuRuntime + ?Sized>(&self, runtime: &R, stream: RawHandle) -> Result<(), BackendError> {
        match self {
            StreamOp::Launch { launch, args } => runtime.launch(launch, &mut args.clone(), stream),
            StreamOp::Gemm { gemm, a, b, c } => runtime.gemm(gemm, *a, *b, *c, stream),
            StreamOp::CopyD2D { dst, src, bytes } => runtime.copy_d2d(*dst, *src, *bytes, stream),
            StreamOp::Zero { dst, bytes } => runtime.zero(*dst, *bytes, stream),
        }
    }
}

/// A recorded list made launchable by a runtime ([`GpuRuntime::instantiate`]).
#[derive(Debug)]
pub enum GraphExec {
    /// The list itself: a launch enqueues its operations one by one (the emulated device).
    Replayed(Vec<StreamOp>),
    /// A driver graph (`CUgraphExec`, `hipGraphExec_t`): a launch is one call.
    Native(RawHandle),
}

/// What [`GpuRuntime::instantiate`] does unless a runtime has graphs: keep the list.
pub fn keep_the_list(ops: &[StreamOp]) -> GraphExec {
    GraphExec::Replayed(ops.to_vec())
}

/// Enqueues a kept list on `stream` (a [`GraphExec::Replayed`] launch).
///
/// # Safety
/// As [`StreamOp::enqueue`], for every operation.
pub unsafe fn replay_list<R: GpuRuntime + ?Sized>(
    runtime: &R,
    ops: &[StreamOp],
    stream: RawHandle,
) -> Result<(), BackendError> {
    ops.iter().try_for_each(|op| op.enqueue(runtime, stream))
}

/// A recording in progress on a device: the operations enqueued since it began, and the blocks
/// it allocated (the graph keeps them: a replay writes them again).
#[derive(Debug, Default)]
pub(super) struct Recording {
    /// The operations, in stream order.
    pub(super) ops: Vec<StreamOp>,
    /// Every block allocated while recording, by address, with its size.
    pub(super) owned: std::collections::HashMap<u64, u64>,
    /// Owned blocks freed while recording, for its later allocations (stream order holds within
    /// the recording as it does eagerly).
    pub(super) freed: super::cache::BlockCache,
    /// A block allocated before the recording and freed inside it: a replay would use it after
    /// its owner let it go, so the recording fails.
    pub(super) foreign_free: Option<u64>,
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
