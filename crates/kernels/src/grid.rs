//! The grid emulator: every kernel in `device/` compiled by the host C++ compiler and run with a
//! device's execution model (`emulator/`): each block's threads are fibers with real
//! `__syncthreads` and warp-shuffle barriers, per-block shared memory, at warp width 32 (NVIDIA)
//! or 64 (AMD). It is how CI executes the device kernels' code without a GPU; it is not fast.

use std::ffi::{c_char, c_int, c_long, c_void, CStr, CString};
use std::fmt;

use crate::{Kernel, KernelArgs, Launch};

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

/// Why the emulator refused or failed a launch (the kernel and the reason).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GridError(pub String);

impl fmt::Display for GridError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for GridError {}

type LaunchFn = unsafe extern "C" fn(usize, *const u32, *const u32, u32, *mut *mut c_void, *mut c_char, usize) -> c_int;
type FindFn = unsafe extern "C" fn(*const c_char) -> c_long;
type KernelFn = unsafe extern "C" fn(usize, *mut usize, usize, *mut usize) -> *const c_char;

extern "C" {
    fn nereus_grid_w32_launch(
        index: usize,
        grid: *const u32,
        block: *const u32,
        shared_bytes: u32,
        args: *mut *mut c_void,
        error: *mut c_char,
        error_len: usize,
    ) -> c_int;
    fn nereus_grid_w64_launch(
        index: usize,
        grid: *const u32,
        block: *const u32,
        shared_bytes: u32,
        args: *mut *mut c_void,
        error: *mut c_char,
        error_len: usize,
    ) -> c_int;
    fn nereus_grid_w32_find(name: *const c_char) -> c_long;
    fn nereus_grid_w64_find(name: *const c_char) -> c_long;
    fn nereus_grid_w32_kernel(i: usize, sizes: *mut usize, max: usize, params: *mut usize) -> *const c_char;
    fn nereus_grid_w64_kernel(i: usize, sizes: *mut usize, max: usize, params: *mut usize) -> *const c_char;
}

fn entry_points(warp: WarpWidth) -> (LaunchFn, FindFn, KernelFn) {
    match warp {
        WarpWidth::W32 => (nereus_grid_w32_launch, nereus_grid_w32_find, nereus_grid_w32_kernel),
        WarpWidth::W64 => (nereus_grid_w64_launch, nereus_grid_w64_find, nereus_grid_w64_kernel),
    }
}

/// One kernel of the emulator's table: its name and its parameters' byte sizes, as the C++
/// compiler saw its signature.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GridKernel {
    /// The `extern "C"` name.
    pub name: String,
    /// Bytes of each parameter, in order.
    pub param_sizes: Vec<usize>,
}

/// Every kernel the emulator was built with at `warp`.
pub fn kernels(warp: WarpWidth) -> Vec<GridKernel> {
    let (_, _, kernel) = entry_points(warp);
    let mut out = Vec::new();
    for i in 0.. {
        let (mut sizes, mut params) = ([0usize; 32], 0usize);
        // SAFETY: `sizes` holds 32 values; the call returns a static C string or null past the end.
        let name = unsafe { kernel(i, sizes.as_mut_ptr(), sizes.len(), &mut params) };
        if name.is_null() {
            break;
        }
        // SAFETY: a non-null name is the emulator's static, NUL-terminated string.
        let name = unsafe { CStr::from_ptr(name) }.to_string_lossy().into_owned();
        out.push(GridKernel { name, param_sizes: sizes[..params.min(sizes.len())].to_vec() });
    }
    out
}

/// The emulator's table index of the kernel named `name`, if it has one.
pub fn find(warp: WarpWidth, name: &str) -> Option<usize> {
    let (_, find, _) = entry_points(warp);
    let name = CString::new(name).ok()?;
    // SAFETY: a NUL-terminated string that outlives the call.
    usize::try_from(unsafe { find(name.as_ptr()) }).ok()
}

/// The emulator at one warp width with every [`Kernel`] resolved to its table index once.
#[derive(Debug, Clone)]
pub struct GridKernels {
    warp: WarpWidth,
    index: Vec<usize>,
}

impl GridKernels {
    /// Resolves every kernel at `warp`; a kernel the emulator lacks is an error naming it.
    pub fn resolve(warp: WarpWidth) -> Result<GridKernels, GridError> {
        let index = Kernel::ALL
            .iter()
            .map(|k| find(warp, k.name()).ok_or_else(|| GridError(format!("the emulator has no kernel {}", k.name()))))
            .collect::<Result<_, _>>()?;
        Ok(GridKernels { warp, index })
    }

    /// The warp width.
    pub fn warp(&self) -> WarpWidth {
        self.warp
    }

    /// Runs a launch on the calling thread; returns when every block has finished.
    ///
    /// # Safety
    /// `args` must match the kernel's parameters in number and type, and every pointer among them
    /// must address host memory the kernel may read or write over the whole range it touches.
    pub unsafe fn launch(&self, launch: &Launch, args: &mut KernelArgs) -> Result<(), GridError> {
        launch_at(self.warp, self.index[launch.kernel.index()], launch.kernel.name(), launch, args)
    }
}

/// Runs the kernel at table index `index` (named `name` in errors) with `launch`'s geometry.
///
/// # Safety
/// As [`GridKernels::launch`].
unsafe fn launch_at(
    warp: WarpWidth,
    index: usize,
    name: &str,
    launch: &Launch,
    args: &mut KernelArgs,
) -> Result<(), GridError> {
    let (run, _, _) = entry_points(warp);
    let mut pointers = args.pointers();
    let mut error = [0 as c_char; 512];
    let status = run(
        index,
        launch.grid.as_ptr(),
        launch.block.as_ptr(),
        launch.shared_bytes,
        pointers.as_mut_ptr(),
        error.as_mut_ptr(),
        error.len(),
    );
    match status {
        0 => Ok(()),
        2 => Err(GridError(format!("no kernel at index {index} ({name})"))),
        _ => {
            let reason = CStr::from_ptr(error.as_ptr()).to_string_lossy();
            Err(GridError(format!("{name} (warp {}): {reason}", warp.lanes())))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::args::{fixed_samples, flash_samples};
    use crate::attention::FlashWidth;
    use crate::pack::{rect_launch, RectCopy};
    use crate::KernelArg;

    /// Launches a one-block probe named `name` of `threads` threads writing `out`.
    fn probe(warp: WarpWidth, name: &str, threads: u32, grid: [u32; 3], out: &mut [f32]) -> Result<(), GridError> {
        let index = find(warp, name).ok_or_else(|| GridError(format!("no kernel named {name}")))?;
        let mut args = KernelArgs::new([KernelArg::Ptr(out.as_mut_ptr() as u64)]);
        let shape = Launch { kernel: Kernel::ProbeBlockReverse, grid, block: [threads, 1, 1], shared_bytes: 0 };
        // SAFETY: every probe writes at most `out.len()` floats (2 per thread).
        unsafe { launch_at(warp, index, name, &shape, &mut args) }
    }

    #[test]
    fn the_emulator_holds_every_kernel_and_nothing_else_but_its_own_probe_at_both_widths() {
        for warp in WarpWidth::ALL {
            let built: Vec<String> = kernels(warp).into_iter().map(|k| k.name).collect();
            let named: Vec<&str> = Kernel::ALL.iter().map(|k| k.name()).collect();
            let extra: Vec<&String> = built.iter().filter(|b| !named.contains(&b.as_str())).collect();
            assert_eq!(extra, ["nereus_probe_divergent_barrier"], "warp {}", warp.lanes());
            GridKernels::resolve(warp).unwrap();
        }
    }

    #[test]
    fn every_typed_argument_struct_passes_the_parameters_its_kernel_declares() {
        let built = kernels(WarpWidth::W32);
        let rect = rect_launch(
            0,
            0,
            &RectCopy { src_offset: 0, src_pitch: 3, dst_offset: 0, dst_pitch: 3, row_bytes: 3, rows: 1 },
        );
        let mut calls = fixed_samples();
        calls.extend(FlashWidth::ALL.into_iter().flat_map(flash_samples));
        calls.push(Box::new(rect));
        for call in &calls {
            let k = call.kernel();
            let declared = &built.iter().find(|b| b.name == k.name()).unwrap().param_sizes;
            let passed: Vec<usize> = call.args().values().iter().map(KernelArg::size).collect();
            assert_eq!(&passed, declared, "{}", k.name());
        }
        let covered: std::collections::HashSet<Kernel> = calls.iter().map(|c| c.kernel()).collect();
        let pack = [Kernel::RectCopy16, Kernel::RectCopy8, Kernel::RectCopy4, Kernel::RectCopy2];
        let missing: Vec<&Kernel> = Kernel::ALL.iter().filter(|k| !covered.contains(k) && !pack.contains(k)).collect();
        assert!(missing.is_empty(), "kernels without a typed argument struct: {missing:?}");
    }

    #[test]
    fn syncthreads_waits_for_every_writer_of_shared_memory() {
        for warp in WarpWidth::ALL {
            let mut out = vec![-1.0; 256];
            probe(warp, "nereus_probe_block_reverse", 256, [1, 1, 1], &mut out).unwrap();
            assert!(out.iter().enumerate().all(|(t, &v)| v == (255 - t) as f32), "warp {}", warp.lanes());
        }
    }

    #[test]
    fn shuffles_reduce_over_the_warp_width_and_blocks_over_every_warp() {
        for warp in WarpWidth::ALL {
            let (threads, lanes) = (256usize, warp.lanes() as usize);
            let mut out = vec![0.0; 2 * threads];
            probe(warp, "nereus_probe_reductions", threads as u32, [1, 1, 1], &mut out).unwrap();
            let warp_sum = (lanes * (lanes + 1) / 2) as f32;
            assert!(out[..threads].iter().all(|&v| v == warp_sum), "warp {lanes}: {:?}", &out[..4]);
            let block_sum = (threads * (threads - 1) / 2) as f32;
            assert!(out[threads..].iter().all(|&v| v == block_sum), "warp {lanes}: {:?}", &out[threads..threads + 4]);
        }
    }

    #[test]
    fn a_barrier_that_only_some_threads_reach_is_an_error_not_a_hang() {
        let mut out = vec![0.0; 64];
        let err = probe(WarpWidth::W32, "nereus_probe_divergent_barrier", 64, [1, 1, 1], &mut out).unwrap_err();
        assert!(err.0.contains("exited without reaching a __syncthreads"), "{err}");
        let err = probe(WarpWidth::W64, "no_such_kernel", 64, [1, 1, 1], &mut out).unwrap_err();
        assert!(err.0.contains("no kernel named no_such_kernel"), "{err}");
        let err = probe(WarpWidth::W64, "nereus_probe_block_reverse", 2048, [1, 1, 1], &mut out).unwrap_err();
        assert!(err.0.contains("2048 threads"), "{err}");
        let err = probe(WarpWidth::W32, "nereus_probe_block_reverse", 64, [1, 70_000, 1], &mut out).unwrap_err();
        assert!(err.0.contains("65535"), "{err}");
    }
}
