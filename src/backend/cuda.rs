//! CUDA device discovery through the driver API, loaded at run time by cudarc (no toolkit is
//! needed to build; `libcuda.so` is needed to run).

use cudarc::driver::result;

use super::{BackendError, DriverDevice};

fn driver_error(e: impl std::fmt::Debug) -> BackendError {
    BackendError::Driver { backend: "CUDA", reason: format!("{e:?}") }
}

/// Every visible CUDA device with its name and total memory.
pub fn devices() -> Result<Vec<DriverDevice>, BackendError> {
    result::init().map_err(driver_error)?;
    let count = result::device::get_count().map_err(driver_error)?;
    (0..count)
        .map(|ordinal| {
            let device = result::device::get(ordinal).map_err(driver_error)?;
            // SAFETY: `device` is a valid handle just returned by cuDeviceGet.
            let memory_bytes = unsafe { result::device::total_mem(device) }.map_err(driver_error)? as u64;
            let name = result::device::get_name(device).map_err(driver_error)?;
            Ok(DriverDevice { ordinal: ordinal as u32, name, memory_bytes })
        })
        .collect()
}
