//! NCCL's C API as both NCCL (through cudarc, `cuda` feature) and RCCL (our binding, `rocm`
//! feature) expose it: the calls the GPU data plane makes, behind one trait so that one plane
//! ([`super::gpu_plane::GpuPlane`]) serves both. Data type and reduction codes are NCCL's, which
//! RCCL shares.

use std::ffi::c_void;
use std::sync::Arc;

use crate::backend::gpu::{DevicePtr, RawHandle};
use nereus_core::half::{bf16_to_f32, f32_to_bf16};

/// `ncclUniqueId`: 128 opaque bytes the root of a communicator makes and every member receives
/// (over the MPI control plane).
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct UniqueId(pub [u8; 128]);

impl std::fmt::Debug for UniqueId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "UniqueId({:02x?}…)", &self.0[..8])
    }
}

/// An `ncclComm_t`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RawComm(pub *mut c_void);

// SAFETY: a communicator handle crosses to the watchdog thread only to be passed to
// `ncclCommAbort`, which NCCL and RCCL allow from another thread.
unsafe impl Send for RawComm {}

/// Element types the plane moves, with their `ncclDataType_t` codes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DataType {
    /// `ncclUint8`: raw bytes.
    U8 = 1,
    /// `ncclUint64`: counters.
    U64 = 5,
    /// `ncclFloat32`: gradients.
    F32 = 7,
    /// `ncclBfloat16`: activations (tensor-parallel sums).
    Bf16 = 9,
}

impl DataType {
    /// Bytes per element.
    pub fn bytes(self) -> usize {
        match self {
            DataType::U8 => 1,
            DataType::U64 => 8,
            DataType::F32 => 4,
            DataType::Bf16 => 2,
        }
    }
}

/// Element-wise sum of every member's bytes (`parts`, in member order) into `out`, as the
/// emulated and test libraries reduce: in member order, so every member gets the same bits;
/// bf16 widened to f32, summed, rounded once (NCCL's ring rounds after each hop, so for more
/// than two members its bits may differ; the host engine's sum rounds once, as here).
pub fn sum_members(ty: DataType, parts: &[&[u8]], out: &mut [u8]) {
    let width = ty.bytes();
    for (i, chunk) in out.chunks_exact_mut(width).enumerate() {
        let at = i * width..(i + 1) * width;
        let each = parts.iter().map(|p| &p[at.clone()]);
        match ty {
            DataType::F32 => {
                let sum: f32 = each.map(|p| f32::from_le_bytes(p.try_into().expect("4 bytes"))).sum();
                chunk.copy_from_slice(&sum.to_le_bytes());
            }
            DataType::Bf16 => {
                let sum: f32 = each.map(|p| bf16_to_f32(u16::from_le_bytes(p.try_into().expect("2 bytes")))).sum();
                chunk.copy_from_slice(&f32_to_bf16(sum).to_le_bytes());
            }
            DataType::U64 => {
                let sum = each.fold(0u64, |a, p| a.wrapping_add(u64::from_le_bytes(p.try_into().expect("8 bytes"))));
                chunk.copy_from_slice(&sum.to_le_bytes());
            }
            DataType::U8 => chunk[0] = each.fold(0u8, |a, p| a.wrapping_add(p[0])),
        }
    }
}

/// `ncclSum`.
pub const REDUCE_SUM: i32 = 0;
/// `NCCL_SPLIT_NOCOLOR`: the rank joins no communicator of the split.
pub const SPLIT_NO_COLOR: i32 = -1;
/// The first NCCL version with `ncclCommSplit` (2.18.0); RCCL numbers its releases alike.
pub const SPLIT_SINCE_VERSION: i32 = 21_800;

/// Why a call of a collective library failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CollectiveError {
    /// The library answered with an error code (`ncclResult_t`) and its own text.
    #[error("{text} (ncclResult_t {code})")]
    Library {
        /// The `ncclResult_t` code.
        code: i32,
        /// The library's text for it.
        text: String,
    },
    /// The call is not one this library can make (a split without `ncclCommSplit`, a nested
    /// group in the emulation).
    #[error("{0}")]
    Unsupported(&'static str),
}

/// The elements of a collective: `count` of `ty` at device address `buf`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Elements {
    /// Device address.
    pub buf: DevicePtr,
    /// Elements.
    pub count: usize,
    /// Their type.
    pub ty: DataType,
}

impl Elements {
    /// Bytes they span.
    pub fn bytes(&self) -> usize {
        self.count * self.ty.bytes()
    }
}

/// Where a call runs: a communicator, and the stream its work is ordered on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct On {
    /// The communicator.
    pub comm: RawComm,
    /// The stream.
    pub stream: RawHandle,
}

/// Aborts a communicator from any thread (the watchdog's).
pub type Aborter = Arc<dyn Fn(RawComm) + Send + Sync>;

/// The calls of NCCL's C API the GPU data plane uses. Errors carry the library's code and text.
///
/// `members` (the world ranks of a new communicator, in its rank order) is what the plane
/// already knows; NCCL and RCCL ignore it, and the emulation over MPI needs it to address peers.
pub trait CollectiveLib {
    /// `NCCL`, `RCCL` or `emulated`.
    fn name(&self) -> &'static str;
    /// `ncclGetVersion`: e.g. 22305 for 2.23.5.
    fn version(&self) -> Result<i32, CollectiveError>;
    /// Whether `ncclCommSplit` can be called (the symbol is there and the version has it).
    fn has_split(&self) -> bool;
    /// `ncclGetUniqueId`.
    fn unique_id(&self) -> Result<UniqueId, CollectiveError>;
    /// `ncclCommInitRank`: blocks until all `members` have joined.
    ///
    /// # Safety
    /// The rank's device is current on this thread.
    unsafe fn init_rank(&self, id: &UniqueId, rank: i32, members: &[i32]) -> Result<RawComm, CollectiveError>;
    /// `ncclCommSplit` of `comm` (every member of `comm` calls it); `None` for
    /// [`SPLIT_NO_COLOR`]. `members` are the world ranks of this rank's new communicator.
    ///
    /// # Safety
    /// `comm` is live.
    unsafe fn split(
        &self,
        comm: RawComm,
        color: i32,
        key: i32,
        members: &[i32],
    ) -> Result<Option<RawComm>, CollectiveError>;
    /// `ncclAllGather` of `send`'s elements from every rank into `recv` (rank order).
    ///
    /// # Safety
    /// Both buffers are device memory of the right sizes, live until the stream passes.
    unsafe fn all_gather(&self, send: Elements, recv: DevicePtr, on: On) -> Result<(), CollectiveError>;
    /// `ncclBroadcast` of `data` in place from comm rank `root`.
    ///
    /// # Safety
    /// As [`CollectiveLib::all_gather`].
    unsafe fn broadcast(&self, data: Elements, root: i32, on: On) -> Result<(), CollectiveError>;
    /// `ncclAllReduce` with `ncclSum` of `data`, in place.
    ///
    /// # Safety
    /// As [`CollectiveLib::all_gather`].
    unsafe fn all_reduce_sum(&self, data: Elements, on: On) -> Result<(), CollectiveError>;
    /// `ncclSend` of `bytes` bytes at `buf` to comm rank `peer`.
    ///
    /// # Safety
    /// As [`CollectiveLib::all_gather`].
    unsafe fn send(&self, buf: DevicePtr, bytes: usize, peer: i32, on: On) -> Result<(), CollectiveError>;
    /// `ncclRecv` of `bytes` bytes into `buf` from comm rank `peer`.
    ///
    /// # Safety
    /// As [`CollectiveLib::all_gather`].
    unsafe fn recv(&self, buf: DevicePtr, bytes: usize, peer: i32, on: On) -> Result<(), CollectiveError>;
    /// `ncclGroupStart`.
    fn group_start(&self) -> Result<(), CollectiveError>;
    /// `ncclGroupEnd`: issues the grouped calls (blocking while connections are set up).
    fn group_end(&self) -> Result<(), CollectiveError>;
    /// A function calling `ncclCommAbort` that the watchdog thread may hold.
    fn aborter(&self) -> Aborter;
    /// `ncclCommDestroy`.
    ///
    /// # Safety
    /// `comm` is live and no work on it is pending.
    unsafe fn destroy(&self, comm: RawComm);
}
