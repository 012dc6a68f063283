//! HIP through the HIP runtime (`libamdhip64`, linked at build time; build with `HIP_PATH`
//! pointing at a ROCm or Debian HIP installation, e.g. `HIP_PATH=/usr`): device discovery, and
//! [`Hip`], the [`GpuRuntime`] of one device, running the kernels from the code objects the
//! `nereus-kernels` crate embedded (`hipcc --genco --offload-arch=gfx90a`).

use hip_sys::hiprt;
use std::ffi::{c_void, CStr, CString};
use std::os::raw::{c_char, c_int};

use super::blas::{Gemm, VendorBlas, HIPBLAS};
use super::runtime::{replay_list, GpuRuntime, GraphExec, RawHandle, StreamOp};
use super::{BackendError, DriverDevice};
use nereus_kernels::hip::code_object;
use nereus_kernels::DevicePtr;
use nereus_kernels::{Kernel, KernelArgs, Launch, Source};

fn check(status: hiprt::hipError_t, call: &str) -> Result<(), BackendError> {
    if status == hiprt::hipError_t::hipSuccess {
        Ok(())
    } else {
        Err(BackendError::Driver { backend: "ROCm", reason: format!("{call} returned {status:?}") })
    }
}

/// Initializes the runtime and counts devices; none visible is [`BackendError::NoDevice`].
fn device_count() -> Result<c_int, BackendError> {
    let mut count: c_int = 0;
    // SAFETY: plain out-parameter calls into the HIP runtime with valid pointers.
    let status = unsafe {
        let init = hiprt::hipInit(0);
        if init == hiprt::hipError_t::hipSuccess {
            hiprt::hipGetDeviceCount(&mut count)
        } else {
            init
        }
    };
    if status != hiprt::hipError_t::hipSuccess || count == 0 {
        let reason = format!("the HIP runtime reports no device ({status:?})");
        return Err(BackendError::NoDevice { backend: "ROCm", reason });
    }
    Ok(count)
}

/// Every visible HIP device with its name and total memory.
pub fn devices() -> Result<Vec<DriverDevice>, BackendError> {
    (0..device_count()?).map(|ordinal| describe(ordinal).map(|(d, _)| d)).collect()
}

/// A device's description and its PCI address.
fn describe(ordinal: c_int) -> Result<(DriverDevice, String), BackendError> {
    let mut name = [0 as c_char; 256];
    let mut pci = [0 as c_char; 64];
    let mut memory_bytes: usize = 0;
    // SAFETY: the buffers have the lengths we pass; `ordinal` is below the device count.
    unsafe {
        check(hiprt::hipDeviceGetName(name.as_mut_ptr(), name.len() as c_int, ordinal), "hipDeviceGetName")?;
        check(hiprt::hipDeviceTotalMem(&mut memory_bytes, ordinal), "hipDeviceTotalMem")?;
        check(hiprt::hipDeviceGetPCIBusId(pci.as_mut_ptr(), pci.len() as c_int, ordinal), "hipDeviceGetPCIBusId")?;
        let text = |chars: &[c_char]| CStr::from_ptr(chars.as_ptr()).to_string_lossy().into_owned();
        let device = DriverDevice { ordinal: ordinal as u32, name: text(&name), memory_bytes: memory_bytes as u64 };
        Ok((device, text(&pci)))
    }
}

/// The HIP ordinal of the device at `pci_address` among the visible ones, if any.
pub fn ordinal_of(pci_address: &str) -> Result<Option<u32>, BackendError> {
    for ordinal in 0..device_count()? {
        if describe(ordinal)?.1.eq_ignore_ascii_case(pci_address) {
            return Ok(Some(ordinal as u32));
        }
    }
    Ok(None)
}

/// One HIP device (current on the thread that opened it) with the embedded kernels loaded.
pub struct Hip {
    device: DriverDevice,
    modules: Vec<hiprt::hipModule_t>,
    /// Every kernel's loaded function, indexed by [`Kernel::index`].
    kernels: Vec<hiprt::hipFunction_t>,
    /// The vendor BLAS, opened at the first GEMM (a job that never multiplies never needs it).
    blas: std::cell::OnceCell<VendorBlas>,
}

impl Hip {
    /// Opens device `ordinal` and loads the embedded code object of every kernel source.
    pub fn open(ordinal: u32) -> Result<Hip, BackendError> {
        let count = device_count()?;
        if ordinal as c_int >= count {
            let reason = format!("device {ordinal} was asked for, the runtime sees {count}");
            return Err(BackendError::NoDevice { backend: "ROCm", reason });
        }
        let missing: Vec<&str> =
            Source::ALL.iter().map(|s| s.file()).filter(|file| code_object(file).is_none()).collect();
        if !missing.is_empty() {
            return Err(BackendError::Kernels {
                backend: "ROCm",
                reason: format!(
                    "this binary was built without hipcc, so {} is not embedded; install hipcc and rebuild with \
                     `--features rocm`",
                    missing.join(", ")
                ),
            });
        }
        let (device, _) = describe(ordinal as c_int)?;
        // SAFETY: selects the device the modules are loaded on.
        check(unsafe { hiprt::hipSetDevice(ordinal as c_int) }, "hipSetDevice")?;
        let (mut modules, mut kernels) = (Vec::new(), vec![std::ptr::null_mut(); Kernel::ALL.len()]);
        for (source, image) in Source::ALL.iter().filter_map(|&s| code_object(s.file()).map(|image| (s, image))) {
            let mut module: hiprt::hipModule_t = std::ptr::null_mut();
            // SAFETY: `image` is a complete code object (an offload bundle) that outlives the call.
            check(unsafe { hiprt::hipModuleLoadData(&mut module, image.as_ptr().cast()) }, "hipModuleLoadData")?;
            modules.push(module);
            for kernel in source.kernels() {
                let mut f: hiprt::hipFunction_t = std::ptr::null_mut();
                let c_name = CString::new(kernel.name())
                    .map_err(|e| BackendError::Driver { backend: "ROCm", reason: format!("kernel name: {e}") })?;
                // SAFETY: `module` is loaded; `f` is an out-parameter.
                check(unsafe { hiprt::hipModuleGetFunction(&mut f, module, c_name.as_ptr()) }, kernel.name())?;
                kernels[kernel.index()] = f;
            }
        }
        Ok(Hip { device, modules, kernels, blas: std::cell::OnceCell::new() })
    }
}

impl Drop for Hip {
    fn drop(&mut self) {
        // SAFETY: our module.
        unsafe {
            for &module in &self.modules {
                hiprt::hipModuleUnload(module);
            }
        }
    }
}

fn stream(h: RawHandle) -> hiprt::hipStream_t {
    h.0.cast()
}

fn event(h: RawHandle) -> hiprt::hipEvent_t {
    h.0.cast()
}

impl GpuRuntime for Hip {
    fn backend(&self) -> &'static str {
        "ROCm"
    }

    fn warp_width(&self) -> u32 {
        64
    }

    fn device(&self) -> &DriverDevice {
        &self.device
    }

    fn alloc(&self, bytes: u64, s: RawHandle) -> Result<DevicePtr, BackendError> {
        let mut ptr: *mut c_void = std::ptr::null_mut();
        // SAFETY: out-parameter; a live stream.
        check(unsafe { hiprt::hipMallocAsync(&mut ptr, bytes as usize, stream(s)) }, "hipMallocAsync")?;
        Ok(DevicePtr(ptr as u64))
    }

    unsafe fn free(&self, ptr: DevicePtr, s: RawHandle) {
        hiprt::hipFreeAsync(ptr.0 as *mut c_void, stream(s));
    }

    fn alloc_pinned(&self, bytes: usize) -> Result<*mut u8, BackendError> {
        let mut ptr: *mut c_void = std::ptr::null_mut();
        // SAFETY: out-parameter; freed by free_pinned.
        check(unsafe { hiprt::hipHostMalloc(&mut ptr, bytes, 0) }, "hipHostMalloc")?;
        Ok(ptr.cast())
    }

    unsafe fn free_pinned(&self, ptr: *mut u8) {
        hiprt::hipHostFree(ptr.cast());
    }

    fn create_stream(&self) -> Result<RawHandle, BackendError> {
        let mut s: hiprt::hipStream_t = std::ptr::null_mut();
        // SAFETY: out-parameter. 1 = hipStreamNonBlocking.
        check(unsafe { hiprt::hipStreamCreateWithFlags(&mut s, 1) }, "hipStreamCreateWithFlags")?;
        Ok(RawHandle(s.cast()))
    }

    unsafe fn destroy_stream(&self, s: RawHandle) {
        hiprt::hipStreamDestroy(stream(s));
    }

    fn create_event(&self) -> Result<RawHandle, BackendError> {
        let mut e: hiprt::hipEvent_t = std::ptr::null_mut();
        // SAFETY: out-parameter.
        check(unsafe { hiprt::hipEventCreate(&mut e) }, "hipEventCreate")?;
        Ok(RawHandle(e.cast()))
    }

    unsafe fn destroy_event(&self, e: RawHandle) {
        hiprt::hipEventDestroy(event(e));
    }

    unsafe fn record(&self, e: RawHandle, s: RawHandle) -> Result<(), BackendError> {
        check(hiprt::hipEventRecord(event(e), stream(s)), "hipEventRecord")
    }

    unsafe fn wait_event(&self, s: RawHandle, e: RawHandle) -> Result<(), BackendError> {
        check(hiprt::hipStreamWaitEvent(stream(s), event(e), 0), "hipStreamWaitEvent")
    }

    unsafe fn event_done(&self, e: RawHandle) -> Result<bool, BackendError> {
        match hiprt::hipEventQuery(event(e)) {
            hiprt::hipError_t::hipSuccess => Ok(true),
            hiprt::hipError_t::hipErrorNotReady => Ok(false),
            other => check(other, "hipEventQuery").map(|()| false),
        }
    }

    unsafe fn event_synchronize(&self, e: RawHandle) -> Result<(), BackendError> {
        check(hiprt::hipEventSynchronize(event(e)), "hipEventSynchronize")
    }

    unsafe fn elapsed_ms(&self, start: RawHandle, end: RawHandle) -> Result<f32, BackendError> {
        let mut ms = 0f32;
        check(hiprt::hipEventElapsedTime(&mut ms, event(start), event(end)), "hipEventElapsedTime").map(|()| ms)
    }

    unsafe fn copy_h2d(&self, dst: DevicePtr, src: *const u8, bytes: u64, s: RawHandle) -> Result<(), BackendError> {
        let status = hiprt::hipMemcpyHtoDAsync(dst.0 as *mut c_void, src as *mut c_void, bytes as usize, stream(s));
        check(status, "hipMemcpyHtoDAsync")
    }

    unsafe fn copy_d2h(&self, dst: *mut u8, src: DevicePtr, bytes: u64, s: RawHandle) -> Result<(), BackendError> {
        let status = hiprt::hipMemcpyDtoHAsync(dst.cast(), src.0 as *mut c_void, bytes as usize, stream(s));
        check(status, "hipMemcpyDtoHAsync")
    }

    unsafe fn copy_d2d(&self, dst: DevicePtr, src: DevicePtr, bytes: u64, s: RawHandle) -> Result<(), BackendError> {
        let status = hiprt::hipMemcpyDtoDAsync(dst.0 as *mut c_void, src.0 as *mut c_void, bytes as usize, stream(s));
        check(status, "hipMemcpyDtoDAsync")
    }

    unsafe fn zero(&self, dst: DevicePtr, bytes: u64, s: RawHandle) -> Result<(), BackendError> {
        check(hiprt::hipMemsetAsync(dst.0 as *mut c_void, 0, bytes as usize, stream(s)), "hipMemsetAsync")
    }

    unsafe fn gemm(
        &self,
        g: &Gemm,
        a: DevicePtr,
        b: DevicePtr,
        c: DevicePtr,
        s: RawHandle,
    ) -> Result<(), BackendError> {
        VendorBlas::opened(&self.blas, HIPBLAS)?.gemm(g, a.0, b.0, c.0, stream(s).cast())
    }

    unsafe fn launch(&self, l: &Launch, args: &mut KernelArgs, s: RawHandle) -> Result<(), BackendError> {
        let f = self.kernels[l.kernel.index()];
        let mut params = args.pointers();
        let status = hiprt::hipModuleLaunchKernel(
            f,
            l.grid[0],
            l.grid[1],
            l.grid[2],
            l.block[0],
            l.block[1],
            l.block[2],
            l.shared_bytes,
            stream(s),
            params.as_mut_ptr(),
            std::ptr::null_mut(),
        );
        check(status, l.kernel.name())
    }

    /// Captures one replay of `ops` on a stream of its own (relaxed mode, as on CUDA) and
    /// instantiates the graph.
    unsafe fn instantiate(&self, ops: &[StreamOp]) -> Result<GraphExec, BackendError> {
        let capture = self.create_stream()?;
        if let Err(e) =
            check(graphs::hipStreamBeginCapture(stream(capture), graphs::CAPTURE_RELAXED), "hipStreamBeginCapture")
        {
            self.destroy_stream(capture);
            return Err(e);
        }
        let replayed = replay_list(self, ops, capture);
        let mut graph: *mut c_void = std::ptr::null_mut();
        let ended = check(graphs::hipStreamEndCapture(stream(capture), &mut graph), "hipStreamEndCapture");
        self.destroy_stream(capture);
        if let Err(e) = replayed.and(ended) {
            if !graph.is_null() {
                let _ = graphs::hipGraphDestroy(graph);
            }
            return Err(e);
        }
        let mut exec: *mut c_void = std::ptr::null_mut();
        let made = graphs::hipGraphInstantiate(&mut exec, graph, std::ptr::null_mut(), std::ptr::null_mut(), 0);
        let _ = graphs::hipGraphDestroy(graph);
        check(made, "hipGraphInstantiate").map(|()| GraphExec::Native(RawHandle(exec)))
    }

    unsafe fn launch_graph(&self, graph: &GraphExec, s: RawHandle) -> Result<(), BackendError> {
        match graph {
            GraphExec::Native(exec) => check(graphs::hipGraphLaunch(exec.0, stream(s)), "hipGraphLaunch"),
            GraphExec::Replayed(ops) => replay_list(self, ops, s),
        }
    }

    unsafe fn destroy_graph(&self, graph: GraphExec) {
        if let GraphExec::Native(exec) = graph {
            let _ = graphs::hipGraphExecDestroy(exec.0);
        }
    }
}

/// HIP's graph API (since HIP 4.3; not among hip-sys's bindings), from `hip_runtime_api.h`.
#[allow(non_snake_case)]
mod graphs {
    use super::hiprt::{hipError_t, hipStream_t};
    use std::ffi::c_void;

    /// `hipStreamCaptureModeRelaxed`.
    pub const CAPTURE_RELAXED: i32 = 2;

    extern "C" {
        pub fn hipStreamBeginCapture(stream: hipStream_t, mode: i32) -> hipError_t;
        pub fn hipStreamEndCapture(stream: hipStream_t, graph: *mut *mut c_void) -> hipError_t;
        pub fn hipGraphInstantiate(
            exec: *mut *mut c_void,
            graph: *mut c_void,
            error_node: *mut *mut c_void,
            log: *mut std::ffi::c_char,
            log_bytes: usize,
        ) -> hipError_t;
        pub fn hipGraphLaunch(exec: *mut c_void, stream: hipStream_t) -> hipError_t;
        pub fn hipGraphExecDestroy(exec: *mut c_void) -> hipError_t;
        pub fn hipGraphDestroy(graph: *mut c_void) -> hipError_t;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The rectangle-copy kernels on a real AMD GPU against the host reference, and a driver
    /// graph recorded and replayed.
    #[test]
    #[ignore = "needs an AMD GPU"]
    fn gpu_rectangle_copies_match_the_host_reference() {
        let device = crate::backend::gpu::Device::new(Hip::open(0).unwrap()).unwrap();
        crate::backend::gpu::check_rect_copies_against_host(&device);
        // A driver graph recorded and replayed, on a fresh device (its counters start at 0).
        crate::backend::gpu::check_recorded_graph(&crate::backend::gpu::Device::new(Hip::open(0).unwrap()).unwrap());
    }

    /// hipBLAS is not in Debian: where it is missing, opening it names the libraries and the
    /// variable to set, and resolving against a library that lacks the symbols names the symbol.
    #[test]
    fn a_missing_hipblas_is_a_clear_error() {
        use crate::backend::blas::{open_library, HIPBLAS};
        if let Err(e) = open_library(&HIPBLAS) {
            let text = e.to_string();
            assert!(text.contains("libhipblas.so") && text.contains("NEREUS_HIPBLAS_LIBRARY"), "{text}");
        }
    }

    /// Debian has no hipBLAS library, so CI checks the engine's hipBLAS ABI against hipBLAS's
    /// declarations instead (`NEREUS_HIPBLAS_API`: hipblas-sys 0.1.0's bindgen output of
    /// hipblas.h, hipBLAS 0.53, whose legacy GEMM API hipBLAS 2 keeps): every symbol is declared,
    /// the GEMM's 23 arguments have the widths of the engine's function type (pointer, 32-bit
    /// integer or enum, 64-bit stride), and the enum values the engine passes are hipBLAS's.
    #[test]
    fn the_engines_hipblas_symbols_argument_widths_and_constants_are_hipblas_declarations() {
        use crate::backend::blas::HIPBLAS;
        let Some(path) = std::env::var_os("NEREUS_HIPBLAS_API") else {
            assert!(!crate::backend::tools_required(), "NEREUS_REQUIRE_KERNEL_TOOLS=1 but NEREUS_HIPBLAS_API is unset");
            return eprintln!("skipped: NEREUS_HIPBLAS_API unset (NEREUS_WITH_KERNEL_TOOLS=1 bash scripts/setup.sh)");
        };
        let api = std::fs::read_to_string(path).unwrap();
        let declared = |symbol: &str| {
            let start = api.find(&format!("pub fn {symbol}(")).unwrap_or_else(|| panic!("{symbol} is not declared"));
            let params = &api[start..][..api[start..].find(") ->").unwrap()];
            params
                .split(',')
                .filter(|p| !p.trim().is_empty())
                .map(|p| p.split_once(':').map_or("", |(_, t)| t).trim().to_string())
                .collect::<Vec<_>>()
        };
        for symbol in HIPBLAS.symbols {
            declared(symbol);
        }
        assert!(api.contains("pub type hipblasHandle_t = *mut ::libc::c_void;"));
        assert!(api.contains("pub type hipblasStride = i64;"));
        // `blas::GemmStridedBatched`, argument by argument: pointers, 32-bit integers and enums
        // (i32 in the engine's type), the 64-bit strides.
        let (int, ptr, dtype, stride) =
            ("::libc::c_int", "*const ::libc::c_void", "hipblasDatatype_t", "hipblasStride");
        let op = "hipblasOperation_t";
        let want = [
            "hipblasHandle_t",
            op,
            op,
            int,
            int,
            int,
            ptr,
            ptr,
            dtype,
            int,
            stride,
            ptr,
            dtype,
            int,
            stride,
            ptr,
            "*mut ::libc::c_void",
            dtype,
            int,
            stride,
            int,
            dtype,
            "hipblasGemmAlgo_t",
        ];
        assert_eq!(declared(HIPBLAS.symbols[3]), want);
        for e in [op, dtype, "hipblasGemmAlgo_t"] {
            let at = api.find(&format!("pub enum {e} {{")).unwrap_or_else(|| panic!("{e} is not an enum"));
            assert!(api[..at].trim_end().rsplit('\n').take(4).any(|l| l.trim() == "#[repr(u32)]"), "{e} is not 32-bit");
        }
        let value = |name: &str| {
            let at = api.find(&format!("    {name} = ")).unwrap_or_else(|| panic!("{name} is not declared"));
            let text = &api[at + name.len() + 7..];
            text[..text.find(',').unwrap()].parse::<i32>().unwrap()
        };
        assert_eq!(HIPBLAS.ops, (value("HIPBLAS_OP_N"), value("HIPBLAS_OP_T")));
        assert_eq!(HIPBLAS.types, (value("HIPBLAS_R_16B"), value("HIPBLAS_R_32F")));
        assert_eq!(HIPBLAS.compute_and_algo, (value("HIPBLAS_R_32F"), value("HIPBLAS_GEMM_DEFAULT")));
    }

    /// CI builds with hipcc (NEREUS_REQUIRE_KERNEL_TOOLS=1 makes the kernels crate's build.rs
    /// insist); then every source's code object is a clang offload bundle holding each of its
    /// kernels.
    #[test]
    fn the_embedded_code_object_holds_every_kernel() {
        for &source in Source::ALL {
            let Some(image) = code_object(source.file()) else {
                assert!(!crate::backend::tools_required(), "no code object for {}", source.file());
                eprintln!("skipped: built without hipcc");
                return;
            };
            assert!(image.starts_with(b"__CLANG_OFFLOAD_BUNDLE__"), "an offload bundle");
            let text = String::from_utf8_lossy(image);
            for kernel in source.kernels() {
                let name = kernel.name();
                assert!(
                    text.contains(&format!("{name}.kd")),
                    "{name}'s kernel descriptor missing from {}",
                    source.file()
                );
            }
        }
    }
}
