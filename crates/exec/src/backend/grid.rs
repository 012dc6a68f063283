//! The grid emulator: every kernel in `kernels/` compiled by the host C++ compiler and run with a
//! device's execution model (`kernels/emulator/`): each block's threads are fibers with real
//! `__syncthreads` and warp-shuffle barriers, per-block shared memory, at warp width 32 (NVIDIA)
//! or 64 (AMD). It is how CI executes the device kernels' code without a GPU; it is not fast.

use std::ffi::{c_char, c_int, c_void, CStr, CString};

use super::sources::{KernelArgs, Launch};
use super::BackendError;

/// Threads per warp: 32 on NVIDIA GPUs, 64 on AMD's CDNA (MI250X, MI300).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum WarpWidth {
    /// 32 lanes.
    W32,
    /// 64 lanes.
    W64,
}

impl WarpWidth {
    /// Both widths, as CI runs them.
    pub const ALL: [WarpWidth; 2] = [WarpWidth::W32, WarpWidth::W64];

    /// Lanes per warp.
    pub fn lanes(self) -> u32 {
        match self {
            WarpWidth::W32 => 32,
            WarpWidth::W64 => 64,
        }
    }
}

type LaunchFn =
    unsafe extern "C" fn(*const c_char, *const u32, *const u32, u32, *mut *mut c_void, *mut c_char, usize) -> c_int;
type KernelFn = unsafe extern "C" fn(usize) -> *const c_char;

extern "C" {
    fn nereus_grid_w32_launch(
        name: *const c_char,
        grid: *const u32,
        block: *const u32,
        shared_bytes: u32,
        args: *mut *mut c_void,
        error: *mut c_char,
        error_len: usize,
    ) -> c_int;
    fn nereus_grid_w64_launch(
        name: *const c_char,
        grid: *const u32,
        block: *const u32,
        shared_bytes: u32,
        args: *mut *mut c_void,
        error: *mut c_char,
        error_len: usize,
    ) -> c_int;
    fn nereus_grid_w32_kernel(i: usize) -> *const c_char;
    fn nereus_grid_w64_kernel(i: usize) -> *const c_char;
}

fn entry_points(warp: WarpWidth) -> (LaunchFn, KernelFn) {
    match warp {
        WarpWidth::W32 => (nereus_grid_w32_launch, nereus_grid_w32_kernel),
        WarpWidth::W64 => (nereus_grid_w64_launch, nereus_grid_w64_kernel),
    }
}

fn fault(reason: String) -> BackendError {
    BackendError::Kernels { backend: "grid emulator", reason }
}

/// The kernels the emulator was built with, by name.
pub fn kernels(warp: WarpWidth) -> Vec<String> {
    let (_, kernel) = entry_points(warp);
    (0..)
        // SAFETY: returns a static C string, or null past the last kernel.
        .map(|i| unsafe { kernel(i) })
        .take_while(|p| !p.is_null())
        // SAFETY: non-null pointers are the emulator's static, NUL-terminated names.
        .map(|p| unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned())
        .collect()
}

/// Runs a launch on the calling thread; returns when every block has finished.
///
/// # Safety
/// `args` must match the kernel's parameters in number and type, and every pointer among them
/// must address host memory the kernel may read or write over the whole range it touches.
pub unsafe fn launch(warp: WarpWidth, launch: &Launch, args: &mut KernelArgs) -> Result<(), BackendError> {
    let Launch { kernel, grid, block, shared_bytes } = *launch;
    let (run, _) = entry_points(warp);
    let name = CString::new(kernel).map_err(|_| fault(format!("kernel name {kernel:?} has a NUL byte")))?;
    let mut pointers = args.pointers();
    let mut error = [0 as c_char; 512];
    let status = run(
        name.as_ptr(),
        grid.as_ptr(),
        block.as_ptr(),
        shared_bytes,
        pointers.as_mut_ptr(),
        error.as_mut_ptr(),
        error.len(),
    );
    match status {
        0 => Ok(()),
        2 => Err(fault(format!("no kernel named {kernel}"))),
        _ => {
            let reason = CStr::from_ptr(error.as_ptr()).to_string_lossy();
            Err(fault(format!("{kernel} (warp {}): {reason}", warp.lanes())))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::sources::{KernelArg, SOURCES};

    /// Launches a one-block probe of `threads` threads writing `out`.
    fn probe(warp: WarpWidth, kernel: &'static str, threads: u32, out: &mut [f32]) -> Result<(), BackendError> {
        let mut args = KernelArgs::new([KernelArg::Ptr(out.as_mut_ptr() as u64)]);
        // SAFETY: every probe writes at most `out.len()` floats (2 per thread).
        let shape = Launch { kernel, grid: [1, 1, 1], block: [threads, 1, 1], shared_bytes: 0 };
        unsafe { launch(warp, &shape, &mut args) }
    }

    #[test]
    fn the_emulator_holds_every_kernel_of_every_source_at_both_widths() {
        for warp in WarpWidth::ALL {
            let built = kernels(warp);
            for name in SOURCES.iter().flat_map(|s| s.entry_points) {
                assert!(built.iter().any(|b| b == name), "{name} is not in the warp-{} emulator", warp.lanes());
            }
        }
    }

    #[test]
    fn syncthreads_waits_for_every_writer_of_shared_memory() {
        for warp in WarpWidth::ALL {
            let mut out = vec![-1.0; 256];
            probe(warp, "nereus_probe_block_reverse", 256, &mut out).unwrap();
            assert!(out.iter().enumerate().all(|(t, &v)| v == (255 - t) as f32), "warp {}", warp.lanes());
        }
    }

    #[test]
    fn shuffles_reduce_over_the_warp_width_and_blocks_over_every_warp() {
        for warp in WarpWidth::ALL {
            let (threads, lanes) = (256usize, warp.lanes() as usize);
            let mut out = vec![0.0; 2 * threads];
            probe(warp, "nereus_probe_reductions", threads as u32, &mut out).unwrap();
            let warp_sum = (lanes * (lanes + 1) / 2) as f32;
            assert!(out[..threads].iter().all(|&v| v == warp_sum), "warp {lanes}: {:?}", &out[..4]);
            let block_sum = (threads * (threads - 1) / 2) as f32;
            assert!(out[threads..].iter().all(|&v| v == block_sum), "warp {lanes}: {:?}", &out[threads..threads + 4]);
        }
    }

    #[test]
    fn a_barrier_that_only_some_threads_reach_is_an_error_not_a_hang() {
        let mut out = vec![0.0; 64];
        let err = probe(WarpWidth::W32, "nereus_probe_divergent_barrier", 64, &mut out).unwrap_err().to_string();
        assert!(err.contains("exited without reaching a __syncthreads"), "{err}");
        let err = probe(WarpWidth::W64, "no_such_kernel", 64, &mut out).unwrap_err().to_string();
        assert!(err.contains("no kernel named no_such_kernel"), "{err}");
        let err = probe(WarpWidth::W64, "nereus_probe_block_reverse", 2048, &mut out).unwrap_err().to_string();
        assert!(err.contains("2048 threads"), "{err}");
        let mut args = KernelArgs::new([KernelArg::Ptr(out.as_mut_ptr() as u64)]);
        let tall =
            Launch { kernel: "nereus_probe_block_reverse", grid: [1, 70_000, 1], block: [64, 1, 1], shared_bytes: 0 };
        // SAFETY: refused before any block runs.
        let err = unsafe { launch(WarpWidth::W32, &tall, &mut args) }.unwrap_err().to_string();
        assert!(err.contains("65535"), "{err}");
    }
}
