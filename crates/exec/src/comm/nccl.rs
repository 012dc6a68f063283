//! NCCL through cudarc's bindings, loaded at run time (`cuda` feature): the
//! [`CollectiveLib`] of the NVIDIA data plane.

use std::sync::Arc;

use cudarc::nccl::{result, sys};

use super::collectives::{
    Aborter, CollectiveError, CollectiveLib, DataType, Elements, On, RawComm, UniqueId, SPLIT_SINCE_VERSION,
};
use crate::backend::gpu::{DevicePtr, RawHandle};
use crate::backend::BackendError;

/// The NCCL library loaded in this process.
pub struct Nccl {
    version: i32,
}

fn error(e: result::NcclError) -> CollectiveError {
    CollectiveError::Library { code: e.0 as i32, text: format!("{:?}", e.0) }
}

fn comm(c: RawComm) -> sys::ncclComm_t {
    c.0.cast()
}

fn stream(s: RawHandle) -> sys::cudaStream_t {
    s.0.cast()
}

fn data_type(ty: DataType) -> sys::ncclDataType_t {
    match ty {
        DataType::U8 => sys::ncclDataType_t::ncclUint8,
        DataType::U64 => sys::ncclDataType_t::ncclUint64,
        DataType::F32 => sys::ncclDataType_t::ncclFloat32,
        DataType::Bf16 => sys::ncclDataType_t::ncclBfloat16,
    }
}

impl Nccl {
    /// Loads NCCL, or says how to make it loadable.
    pub fn load() -> Result<Nccl, BackendError> {
        // SAFETY: only probes whether the shared library loads.
        if !unsafe { sys::is_culib_present() } {
            return Err(BackendError::Driver {
                backend: "CUDA",
                reason: "NCCL is not loadable: cudarc looks for libnccl.so (not libnccl.so.2 alone, which is what \
                         `pip install nvidia-nccl-cu12` installs); put a libnccl.so link to it on LD_LIBRARY_PATH \
                         (scripts/gpu-check.sh does)"
                    .into(),
            });
        }
        let version = result::get_nccl_version()
            .map_err(|e| BackendError::Driver { backend: "CUDA", reason: format!("ncclGetVersion: {}", error(e)) })?;
        Ok(Nccl { version })
    }
}

impl CollectiveLib for Nccl {
    fn name(&self) -> &'static str {
        "NCCL"
    }

    fn version(&self) -> Result<i32, CollectiveError> {
        Ok(self.version)
    }

    fn has_split(&self) -> bool {
        self.version >= SPLIT_SINCE_VERSION
    }

    fn unique_id(&self) -> Result<UniqueId, CollectiveError> {
        let id = result::get_uniqueid().map_err(error)?;
        Ok(UniqueId(id.internal.map(|c| c as u8)))
    }

    unsafe fn init_rank(&self, id: &UniqueId, rank: i32, members: &[i32]) -> Result<RawComm, CollectiveError> {
        let mut out = std::mem::MaybeUninit::uninit();
        let id = sys::ncclUniqueId { internal: id.0.map(|b| b as std::ffi::c_char) };
        result::comm_init_rank(out.as_mut_ptr(), members.len() as i32, id, rank).map_err(error)?;
        Ok(RawComm(out.assume_init().cast()))
    }

    unsafe fn split(
        &self,
        parent: RawComm,
        color: i32,
        key: i32,
        _members: &[i32],
    ) -> Result<Option<RawComm>, CollectiveError> {
        let mut out: sys::ncclComm_t = std::ptr::null_mut();
        sys::ncclCommSplit(comm(parent), color, key, &mut out, std::ptr::null_mut()).result().map_err(error)?;
        Ok((!out.is_null()).then_some(RawComm(out.cast())))
    }

    unsafe fn all_gather(&self, send: Elements, recv: DevicePtr, on: On) -> Result<(), CollectiveError> {
        let (src, dst) = (send.buf.0 as *const std::ffi::c_void, recv.0 as *mut std::ffi::c_void);
        let (ty, c, s) = (data_type(send.ty), comm(on.comm), stream(on.stream));
        result::all_gather(src, dst, send.count, ty, c, s).map(|_| ()).map_err(error)
    }

    unsafe fn broadcast(&self, data: Elements, root: i32, on: On) -> Result<(), CollectiveError> {
        let p = data.buf.0 as *mut std::ffi::c_void;
        let (ty, c, s) = (data_type(data.ty), comm(on.comm), stream(on.stream));
        result::broadcast(p, p, data.count, ty, root, c, s).map(|_| ()).map_err(error)
    }

    unsafe fn all_reduce_sum(&self, data: Elements, on: On) -> Result<(), CollectiveError> {
        let p = data.buf.0 as *mut std::ffi::c_void;
        let (ty, c, s) = (data_type(data.ty), comm(on.comm), stream(on.stream));
        result::all_reduce(p, p, data.count, ty, sys::ncclRedOp_t::ncclSum, c, s).map(|_| ()).map_err(error)
    }

    unsafe fn send(&self, buf: DevicePtr, bytes: usize, peer: i32, on: On) -> Result<(), CollectiveError> {
        let p = buf.0 as *const std::ffi::c_void;
        let (bytes_type, c, s) = (sys::ncclDataType_t::ncclUint8, comm(on.comm), stream(on.stream));
        result::send(p, bytes, bytes_type, peer, c, s).map(|_| ()).map_err(error)
    }

    unsafe fn recv(&self, buf: DevicePtr, bytes: usize, peer: i32, on: On) -> Result<(), CollectiveError> {
        let p = buf.0 as *mut std::ffi::c_void;
        let (bytes_type, c, s) = (sys::ncclDataType_t::ncclUint8, comm(on.comm), stream(on.stream));
        result::recv(p, bytes, bytes_type, peer, c, s).map(|_| ()).map_err(error)
    }

    fn group_start(&self) -> Result<(), CollectiveError> {
        result::group_start().map(|_| ()).map_err(error)
    }

    fn group_end(&self) -> Result<(), CollectiveError> {
        result::group_end().map(|_| ()).map_err(error)
    }

    fn aborter(&self) -> Aborter {
        Arc::new(|c: RawComm| {
            // SAFETY: the watchdog aborts communicators this plane created and never uses again.
            let _ = unsafe { result::comm_abort(comm(c)) };
        })
    }

    unsafe fn destroy(&self, c: RawComm) {
        let _ = result::comm_destroy(comm(c));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Where NCCL is loadable (scripts/kernel-env.sh links PyPI's), it answers without a GPU:
    /// its version, whether it splits, and a unique id the plane would broadcast.
    #[test]
    fn nccl_loads_at_run_time_or_says_how_to() {
        match Nccl::load() {
            Ok(nccl) => {
                assert!(nccl.version().unwrap() >= 20_000, "NCCL 2.x");
                assert_eq!(nccl.has_split(), nccl.version().unwrap() >= SPLIT_SINCE_VERSION);
                assert_ne!(nccl.unique_id().unwrap().0, [0u8; 128]);
            }
            Err(e) => assert!(e.to_string().contains("libnccl.so"), "{e}"),
        }
    }
}
