//! HIP device discovery through the HIP runtime (`libamdhip64`, linked at build time; build
//! with `HIP_PATH` pointing at a ROCm or Debian HIP installation, e.g. `HIP_PATH=/usr`).

use hip_sys::hiprt;
use std::ffi::CStr;
use std::os::raw::{c_char, c_int};

use super::{BackendError, DriverDevice};

fn check(status: hiprt::hipError_t, call: &str) -> Result<(), BackendError> {
    if status == hiprt::hipError_t::hipSuccess {
        Ok(())
    } else {
        Err(BackendError::Driver { backend: "ROCm", reason: format!("{call} returned {status:?}") })
    }
}

/// Every visible HIP device with its name and total memory.
pub fn devices() -> Result<Vec<DriverDevice>, BackendError> {
    let mut count: c_int = 0;
    // SAFETY: plain out-parameter calls into the HIP runtime with valid pointers.
    unsafe {
        check(hiprt::hipInit(0), "hipInit")?;
        check(hiprt::hipGetDeviceCount(&mut count), "hipGetDeviceCount")?;
    }
    (0..count)
        .map(|ordinal| {
            let mut name = [0 as c_char; 256];
            let mut memory_bytes: usize = 0;
            // SAFETY: `name` has the length we pass; `ordinal` is below the device count.
            let name = unsafe {
                check(hiprt::hipDeviceGetName(name.as_mut_ptr(), name.len() as c_int, ordinal), "hipDeviceGetName")?;
                check(hiprt::hipDeviceTotalMem(&mut memory_bytes, ordinal), "hipDeviceTotalMem")?;
                CStr::from_ptr(name.as_ptr()).to_string_lossy().into_owned()
            };
            Ok(DriverDevice { ordinal: ordinal as u32, name, memory_bytes: memory_bytes as u64 })
        })
        .collect()
}
