//! The seam a GPU runtime implements ([`GpuRuntime`]): stream-ordered allocations, pinned host
//! memory, streams, events, copies, launches and graphs (a recorded list of [`StreamOp`]s made
//! launchable whole: [`GraphExec`]), with the opaque handles they pass around. Kept
//! apart from [`super::gpu::Device`] so the pieces the device is built from (the upload ring,
//! the block cache) can name it without importing the device back.

use std::ffi::c_void;

use super::blas::Gemm;
use super::{BackendError, DriverDevice};
use nereus_kernels::pack::RectLaunch;
use nereus_kernels::{DevicePtr, KernelArgs, Launch};

/// An opaque stream or event handle (`CUstream`/`hipStream_t`, `CUevent`/`hipEvent_t`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RawHandle(pub *mut c_void);

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

/// One GPU as a runtime drives it. Every enqueueing call is `unsafe`: the caller keeps the
/// pointers valid until the stream has passed the operation.
pub trait GpuRuntime {
    /// `CUDA`, `ROCm` or `emulated`.
    fn backend(&self) -> &'static str;
    /// Whether work has run when the call that enqueued it returns (the emulated device); a
    /// GPU's stream runs it later, so a host timer around a launch measures its issue.
    fn synchronous(&self) -> bool {
        false
    }
    /// Lanes per warp: 32 on NVIDIA GPUs, 64 on AMD's CDNA (kernels whose blocks are counted in
    /// warps are launched with this many threads a warp).
    fn warp_width(&self) -> u32 {
        32
    }
    /// The device: ordinal, name and total memory as the driver reports them.
    fn device(&self) -> &DriverDevice;
    /// `bytes` of device memory, usable in `stream` order.
    fn alloc(&self, bytes: u64, stream: RawHandle) -> Result<DevicePtr, BackendError>;
    /// Returns `ptr` in `stream` order.
    ///
    /// # Safety
    /// `ptr` came from [`GpuRuntime::alloc`] and is not used by work enqueued after this.
    unsafe fn free(&self, ptr: DevicePtr, stream: RawHandle);
    /// Page-locked host memory for staging copies.
    fn alloc_pinned(&self, bytes: usize) -> Result<*mut u8, BackendError>;
    /// # Safety
    /// `ptr` came from [`GpuRuntime::alloc_pinned`] and no pending copy uses it.
    unsafe fn free_pinned(&self, ptr: *mut u8);
    /// A new non-blocking stream.
    fn create_stream(&self) -> Result<RawHandle, BackendError>;
    /// # Safety
    /// `stream` came from [`GpuRuntime::create_stream`]; pending work still completes.
    unsafe fn destroy_stream(&self, stream: RawHandle);
    /// A new event (with timing).
    fn create_event(&self) -> Result<RawHandle, BackendError>;
    /// # Safety
    /// `event` came from [`GpuRuntime::create_event`] and no stream waits on it any more.
    unsafe fn destroy_event(&self, event: RawHandle);
    /// Records `event` when `stream` reaches this point.
    ///
    /// # Safety
    /// Both handles are live.
    unsafe fn record(&self, event: RawHandle, stream: RawHandle) -> Result<(), BackendError>;
    /// Makes `stream` wait for `event`.
    ///
    /// # Safety
    /// Both handles are live.
    unsafe fn wait_event(&self, stream: RawHandle, event: RawHandle) -> Result<(), BackendError>;
    /// Whether the work before `event` has finished.
    ///
    /// # Safety
    /// `event` is live.
    unsafe fn event_done(&self, event: RawHandle) -> Result<bool, BackendError>;
    /// Blocks the host until `event` has happened.
    ///
    /// # Safety
    /// `event` is live.
    unsafe fn event_synchronize(&self, event: RawHandle) -> Result<(), BackendError>;
    /// Milliseconds between two recorded events.
    ///
    /// # Safety
    /// Both events are live and have happened.
    unsafe fn elapsed_ms(&self, start: RawHandle, end: RawHandle) -> Result<f32, BackendError>;
    /// Host to device.
    ///
    /// # Safety
    /// `src` (pinned) holds `bytes` and `dst` has room, until the stream passes the copy.
    unsafe fn copy_h2d(
        &self,
        dst: DevicePtr,
        src: *const u8,
        bytes: u64,
        stream: RawHandle,
    ) -> Result<(), BackendError>;
    /// Device to host.
    ///
    /// # Safety
    /// As [`GpuRuntime::copy_h2d`], the other way.
    unsafe fn copy_d2h(&self, dst: *mut u8, src: DevicePtr, bytes: u64, stream: RawHandle) -> Result<(), BackendError>;
    /// Device to device (the copy engine).
    ///
    /// # Safety
    /// Both ranges are valid, distinct allocations' bytes.
    unsafe fn copy_d2d(
        &self,
        dst: DevicePtr,
        src: DevicePtr,
        bytes: u64,
        stream: RawHandle,
    ) -> Result<(), BackendError>;
    /// Zeroes `bytes` at `dst` in stream order (`cuMemsetD8Async`, `hipMemsetAsync`).
    ///
    /// # Safety
    /// The range lies inside a live allocation.
    unsafe fn zero(&self, dst: DevicePtr, bytes: u64, stream: RawHandle) -> Result<(), BackendError>;
    /// Marks `bytes` at `dst` as never written, where the runtime can check it: the emulated
    /// device fills them with NaN (bytes of all ones) so a kernel that reads an element before
    /// any write shows it in every result downstream. A GPU does nothing (the point of an
    /// uninitialised buffer is to skip the memset).
    ///
    /// # Safety
    /// The range lies inside a live allocation that no enqueued work still uses.
    unsafe fn poison(&self, _dst: DevicePtr, _bytes: u64) -> Result<(), BackendError> {
        Ok(())
    }
    /// Enqueues one kernel launch on `stream`. A kernel the runtime did not load is an error.
    ///
    /// # Safety
    /// `args` match the kernel's parameters, and every address among them lies, over the range
    /// the kernel touches, inside a live allocation (with no overlap the kernel does not allow).
    unsafe fn launch(&self, launch: &Launch, args: &mut KernelArgs, stream: RawHandle) -> Result<(), BackendError>;
    /// Enqueues a GEMM on `stream` (bf16 inputs, f32 accumulation; see [`Gemm`]).
    ///
    /// # Safety
    /// `a`, `b` and `c` are live allocations of at least the sizes `g` implies.
    unsafe fn gemm(
        &self,
        g: &Gemm,
        a: DevicePtr,
        b: DevicePtr,
        c: DevicePtr,
        stream: RawHandle,
    ) -> Result<(), BackendError>;
    /// Makes the recorded `ops` launchable as one graph. By default the list is kept and a
    /// launch enqueues it operation by operation (the emulated device); CUDA and HIP capture one
    /// replay of it into a driver graph.
    ///
    /// # Safety
    /// Every address `ops` names stays live while the graph does.
    unsafe fn instantiate(&self, ops: &[StreamOp]) -> Result<GraphExec, BackendError> {
        Ok(keep_the_list(ops))
    }
    /// Enqueues `graph` on `stream`.
    ///
    /// # Safety
    /// `graph` came from this runtime's [`GpuRuntime::instantiate`] and what it names is live.
    unsafe fn launch_graph(&self, graph: &GraphExec, stream: RawHandle) -> Result<(), BackendError> {
        match graph {
            GraphExec::Replayed(ops) => replay_list(self, ops, stream),
            GraphExec::Native(_) => {
                Err(BackendError::Driver { backend: self.backend(), reason: "a driver graph it did not make".into() })
            }
        }
    }
    /// Gives a graph's driver resources back.
    ///
    /// # Safety
    /// No launch of `graph` is pending on a stream that is then destroyed unfinished.
    unsafe fn destroy_graph(&self, _graph: GraphExec) {}
    /// Checks a rectangle copy's extent before its launch, where the runtime can (the emulated
    /// device knows its allocations); devices check nothing here.
    fn check_rect(&self, _launch: &RectLaunch) -> Result<(), BackendError> {
        Ok(())
    }
}
