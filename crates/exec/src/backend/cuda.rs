//! CUDA through the driver API, loaded at run time by cudarc (no toolkit is needed to build;
//! `libcuda.so` is needed to run, and NVRTC to compile the `nereus-kernels` sources for the
//! device): device discovery, and [`Cuda`], the [`GpuRuntime`] of one device.

use std::ffi::CString;

use super::nvrtc;
use cudarc::driver::result::{self, stream::StreamKind};
use cudarc::driver::sys;

use super::blas::{Gemm, VendorBlas, CUBLAS};
use super::runtime::{replay_list, GpuRuntime, GraphExec, RawHandle, StreamOp};
use super::{BackendError, DriverDevice};
use nereus_kernels::DevicePtr;
use nereus_kernels::{Kernel, KernelArgs, Launch, Source};

fn driver_error(e: impl std::fmt::Debug) -> BackendError {
    BackendError::Driver { backend: "CUDA", reason: format!("{e:?}") }
}

/// Loads and initializes the driver, or says why there is no device to use.
fn init() -> Result<(), BackendError> {
    // SAFETY: only probes whether the shared library loads.
    if !unsafe { sys::is_culib_present() } {
        return Err(BackendError::NoDevice {
            backend: "CUDA",
            reason: "the CUDA driver (libcuda.so) is not installed on this machine".into(),
        });
    }
    result::init().map_err(|e| BackendError::NoDevice { backend: "CUDA", reason: format!("cuInit failed: {e:?}") })
}

/// Every visible CUDA device with its name and total memory.
pub fn devices() -> Result<Vec<DriverDevice>, BackendError> {
    init()?;
    let count = result::device::get_count().map_err(driver_error)?;
    (0..count).map(|ordinal| describe(ordinal as u32).map(|(d, _)| d)).collect()
}

/// A device's description and its PCI address (`0000:18:00.0`).
fn describe(ordinal: u32) -> Result<(DriverDevice, String), BackendError> {
    let device = result::device::get(ordinal as i32).map_err(driver_error)?;
    let attribute = |a| {
        // SAFETY: `device` is a valid handle just returned by cuDeviceGet.
        unsafe { result::device::get_attribute(device, a) }.map_err(driver_error)
    };
    // SAFETY: as above.
    let memory_bytes = unsafe { result::device::total_mem(device) }.map_err(driver_error)? as u64;
    let name = result::device::get_name(device).map_err(driver_error)?;
    let pci = format!(
        "{:04x}:{:02x}:{:02x}.0",
        attribute(sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_PCI_DOMAIN_ID)?,
        attribute(sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_PCI_BUS_ID)?,
        attribute(sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_PCI_DEVICE_ID)?
    );
    Ok((DriverDevice { ordinal, name, memory_bytes }, pci))
}

/// The CUDA ordinal of the device at `pci_address` among the visible ones, if any.
pub fn ordinal_of(pci_address: &str) -> Result<Option<u32>, BackendError> {
    init()?;
    let count = result::device::get_count().map_err(driver_error)?;
    for ordinal in 0..count as u32 {
        if describe(ordinal)?.1.eq_ignore_ascii_case(pci_address) {
            return Ok(Some(ordinal));
        }
    }
    Ok(None)
}

/// What NVRTC makes of a kernel source.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NvrtcOutput {
    /// PTX for a virtual architecture, e.g. `compute_80` (CI assembles it with ptxas).
    Ptx(&'static str),
    /// A cubin for a real architecture, e.g. `sm_90` (what a device loads: no PTX JIT, so a
    /// driver older than NVRTC still loads it).
    Cubin(u32),
}

/// Compiles one kernel source (with the prelude) by NVRTC, loaded at run time; the compiler's log
/// on failure.
pub fn compile_source(source: Source, output: NvrtcOutput) -> Result<Vec<u8>, BackendError> {
    compile(&source.with_prelude(), source.file(), output)
}

/// Compiles one CUDA source text with NVRTC (loaded at run time); the compiler's log on failure.
pub fn compile(source: &str, name: &str, output: NvrtcOutput) -> Result<Vec<u8>, BackendError> {
    let arch = match output {
        NvrtcOutput::Ptx(virtual_arch) => format!("--gpu-architecture={virtual_arch}"),
        NvrtcOutput::Cubin(sm) => format!("--gpu-architecture=sm_{sm}"),
    };
    nvrtc::compile(source, name, &[arch.as_str(), "--std=c++17"], matches!(output, NvrtcOutput::Cubin(_)))
}

/// One CUDA device: its primary context (current on the thread that opened it) and every kernel
/// compiled for it.
pub struct Cuda {
    device: DriverDevice,
    cu_device: sys::CUdevice,
    modules: Vec<sys::CUmodule>,
    /// Every kernel's loaded function, indexed by [`Kernel::index`].
    kernels: Vec<sys::CUfunction>,
    /// The vendor BLAS, opened at the first GEMM (a job that never multiplies never needs it).
    blas: std::cell::OnceCell<VendorBlas>,
}

impl Cuda {
    /// Opens device `ordinal`, makes its primary context current, and compiles and loads every
    /// kernel source for its architecture.
    pub fn open(ordinal: u32) -> Result<Cuda, BackendError> {
        init()?;
        let count = result::device::get_count().map_err(driver_error)?;
        if ordinal as i32 >= count {
            let reason = format!("device {ordinal} was asked for, the driver sees {count}");
            return Err(BackendError::NoDevice { backend: "CUDA", reason });
        }
        let (device, _) = describe(ordinal)?;
        let cu_device = result::device::get(ordinal as i32).map_err(driver_error)?;
        // SAFETY: a valid device handle; the context is released in Drop.
        let major = unsafe {
            let context = result::primary_ctx::retain(cu_device).map_err(driver_error)?;
            result::ctx::set_current(context).map_err(driver_error)?;
            result::device::get_attribute(
                cu_device,
                sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR,
            )
        };
        // SAFETY: as above.
        let minor = unsafe {
            result::device::get_attribute(
                cu_device,
                sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR,
            )
        };
        let sm = (major.map_err(driver_error)? * 10 + minor.map_err(driver_error)?) as u32;
        keep_freed_memory(cu_device)?;
        let mut modules = Vec::new();
        let mut kernels = vec![std::ptr::null_mut(); Kernel::ALL.len()];
        for &source in Source::ALL {
            let image = compile_source(source, NvrtcOutput::Cubin(sm))?;
            // SAFETY: `image` is a complete cubin; the module lives until Drop.
            let module = unsafe { result::module::load_data(image.as_ptr().cast()) }.map_err(driver_error)?;
            modules.push(module);
            for kernel in source.kernels() {
                let name = CString::new(kernel.name())
                    .map_err(|e| BackendError::Kernels { backend: "CUDA", reason: format!("kernel name: {e}") })?;
                // SAFETY: `module` is loaded.
                kernels[kernel.index()] =
                    unsafe { result::module::get_function(module, name) }.map_err(driver_error)?;
            }
        }
        Ok(Cuda { device, cu_device, modules, kernels, blas: std::cell::OnceCell::new() })
    }
}

/// Stream-ordered allocations come from the device's default memory pool, whose release
/// threshold is 0 unless set: every synchronization then hands the pool's free memory back to the
/// driver, and the next step's allocations map it afresh. At the maximum, memory freed in one step
/// serves the next (`cuMemPoolSetAttribute`, CUDA programming guide, "Stream Ordered Memory
/// Allocator": physical page caching behavior).
fn keep_freed_memory(device: sys::CUdevice) -> Result<(), BackendError> {
    let mut pool: sys::CUmemoryPool = std::ptr::null_mut();
    let mut threshold = u64::MAX;
    // SAFETY: a valid device; the attribute's value is a u64, as the driver reads it.
    unsafe {
        sys::cuDeviceGetDefaultMemPool(&mut pool, device).result().map_err(driver_error)?;
        let attribute = sys::CUmemPool_attribute::CU_MEMPOOL_ATTR_RELEASE_THRESHOLD;
        sys::cuMemPoolSetAttribute(pool, attribute, (&mut threshold as *mut u64).cast()).result().map_err(driver_error)
    }
}

impl Drop for Cuda {
    fn drop(&mut self) {
        // SAFETY: our module and our retain of the primary context.
        unsafe {
            for &module in &self.modules {
                let _ = result::module::unload(module);
            }
            let _ = result::primary_ctx::release(self.cu_device);
        }
    }
}

fn stream(h: RawHandle) -> sys::CUstream {
    h.0.cast()
}

fn event(h: RawHandle) -> sys::CUevent {
    h.0.cast()
}

impl GpuRuntime for Cuda {
    fn backend(&self) -> &'static str {
        "CUDA"
    }

    fn device(&self) -> &DriverDevice {
        &self.device
    }

    fn alloc(&self, bytes: u64, s: RawHandle) -> Result<DevicePtr, BackendError> {
        // SAFETY: a live stream; the memory is used only in its order.
        unsafe { result::malloc_async(stream(s), bytes as usize) }.map(DevicePtr).map_err(driver_error)
    }

    unsafe fn free(&self, ptr: DevicePtr, s: RawHandle) {
        let _ = result::free_async(ptr.0, stream(s));
    }

    fn alloc_pinned(&self, bytes: usize) -> Result<*mut u8, BackendError> {
        // SAFETY: plain page-locked allocation, freed by free_pinned.
        unsafe { result::malloc_host(bytes, 0) }.map(|p| p.cast()).map_err(driver_error)
    }

    unsafe fn free_pinned(&self, ptr: *mut u8) {
        let _ = result::free_host(ptr.cast());
    }

    fn create_stream(&self) -> Result<RawHandle, BackendError> {
        result::stream::create(StreamKind::NonBlocking).map(|s| RawHandle(s.cast())).map_err(driver_error)
    }

    unsafe fn destroy_stream(&self, s: RawHandle) {
        let _ = result::stream::destroy(stream(s));
    }

    fn create_event(&self) -> Result<RawHandle, BackendError> {
        result::event::create(sys::CUevent_flags::CU_EVENT_DEFAULT).map(|e| RawHandle(e.cast())).map_err(driver_error)
    }

    unsafe fn destroy_event(&self, e: RawHandle) {
        let _ = result::event::destroy(event(e));
    }

    unsafe fn record(&self, e: RawHandle, s: RawHandle) -> Result<(), BackendError> {
        result::event::record(event(e), stream(s)).map_err(driver_error)
    }

    unsafe fn wait_event(&self, s: RawHandle, e: RawHandle) -> Result<(), BackendError> {
        result::stream::wait_event(stream(s), event(e), sys::CUevent_wait_flags::CU_EVENT_WAIT_DEFAULT)
            .map_err(driver_error)
    }

    unsafe fn event_done(&self, e: RawHandle) -> Result<bool, BackendError> {
        match result::event::query(event(e)) {
            Ok(()) => Ok(true),
            Err(result::DriverError(sys::cudaError_enum::CUDA_ERROR_NOT_READY)) => Ok(false),
            Err(other) => Err(driver_error(other)),
        }
    }

    unsafe fn event_synchronize(&self, e: RawHandle) -> Result<(), BackendError> {
        result::event::synchronize(event(e)).map_err(driver_error)
    }

    unsafe fn elapsed_ms(&self, start: RawHandle, end: RawHandle) -> Result<f32, BackendError> {
        result::event::elapsed(event(start), event(end)).map_err(driver_error)
    }

    unsafe fn copy_h2d(&self, dst: DevicePtr, src: *const u8, bytes: u64, s: RawHandle) -> Result<(), BackendError> {
        let host = std::slice::from_raw_parts(src, bytes as usize);
        result::memcpy_htod_async(dst.0, host, stream(s)).map_err(driver_error)
    }

    unsafe fn copy_d2h(&self, dst: *mut u8, src: DevicePtr, bytes: u64, s: RawHandle) -> Result<(), BackendError> {
        let host = std::slice::from_raw_parts_mut(dst, bytes as usize);
        result::memcpy_dtoh_async(host, src.0, stream(s)).map_err(driver_error)
    }

    unsafe fn copy_d2d(&self, dst: DevicePtr, src: DevicePtr, bytes: u64, s: RawHandle) -> Result<(), BackendError> {
        result::memcpy_dtod_async(dst.0, src.0, bytes as usize, stream(s)).map_err(driver_error)
    }

    unsafe fn zero(&self, dst: DevicePtr, bytes: u64, s: RawHandle) -> Result<(), BackendError> {
        result::memset_d8_async(dst.0, 0, bytes as usize, stream(s)).map_err(driver_error)
    }

    unsafe fn gemm(
        &self,
        g: &Gemm,
        a: DevicePtr,
        b: DevicePtr,
        c: DevicePtr,
        s: RawHandle,
    ) -> Result<(), BackendError> {
        VendorBlas::opened(&self.blas, CUBLAS)?.gemm(g, a.0, b.0, c.0, stream(s).cast())
    }

    unsafe fn launch(&self, l: &Launch, args: &mut KernelArgs, s: RawHandle) -> Result<(), BackendError> {
        let f = self.kernels[l.kernel.index()];
        let mut params = args.pointers();
        let (grid, block) = ((l.grid[0], l.grid[1], l.grid[2]), (l.block[0], l.block[1], l.block[2]));
        result::launch_kernel(f, grid, block, l.shared_bytes, stream(s), &mut params).map_err(driver_error)
    }

    /// Captures one replay of `ops` on a stream of its own (relaxed mode: the GEMM library may
    /// ask the driver for its workspace) and instantiates the graph.
    unsafe fn instantiate(&self, ops: &[StreamOp]) -> Result<GraphExec, BackendError> {
        let capture = self.create_stream()?;
        let mode = sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_RELAXED;
        if let Err(e) = sys::cuStreamBeginCapture_v2(stream(capture), mode).result() {
            self.destroy_stream(capture);
            return Err(driver_error(e));
        }
        let replayed = replay_list(self, ops, capture);
        let mut graph: sys::CUgraph = std::ptr::null_mut();
        let ended = sys::cuStreamEndCapture(stream(capture), &mut graph).result().map_err(driver_error);
        self.destroy_stream(capture);
        if let Err(e) = replayed.and(ended) {
            if !graph.is_null() {
                let _ = sys::cuGraphDestroy(graph);
            }
            return Err(e);
        }
        let mut exec: sys::CUgraphExec = std::ptr::null_mut();
        let made = sys::cuGraphInstantiateWithFlags(&mut exec, graph, 0).result().map_err(driver_error);
        let _ = sys::cuGraphDestroy(graph);
        made.map(|()| GraphExec::Native(RawHandle(exec.cast())))
    }

    unsafe fn launch_graph(&self, graph: &GraphExec, s: RawHandle) -> Result<(), BackendError> {
        match graph {
            GraphExec::Native(exec) => sys::cuGraphLaunch(exec.0.cast(), stream(s)).result().map_err(driver_error),
            GraphExec::Replayed(ops) => replay_list(self, ops, s),
        }
    }

    unsafe fn destroy_graph(&self, graph: GraphExec) {
        if let GraphExec::Native(exec) = graph {
            let _ = sys::cuGraphExecDestroy(exec.0.cast());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::tools_required;
    use std::path::PathBuf;
    use std::process::Command;

    /// NVRTC compiles every kernel source to PTX for sm_80 and sm_90 (and to cubins directly),
    /// and ptxas assembles that PTX without spilling a register: a kernel that does not compile,
    /// or spills, fails here, with no GPU.
    #[test]
    fn cuda_kernels_compile_with_nvrtc_and_assemble_with_ptxas_without_spills() {
        if !nvrtc::is_present() {
            assert!(!tools_required(), "NEREUS_REQUIRE_KERNEL_TOOLS=1 but NVRTC is not on LD_LIBRARY_PATH");
            eprintln!("skipped: NVRTC not found (scripts/compile-kernels.sh sets it up)");
            return;
        }
        let dir = tempfile::tempdir().unwrap();
        let ptxas = std::env::var("NEREUS_PTXAS").map(PathBuf::from).unwrap_or_else(|_| "ptxas".into());
        for (source, (virtual_arch, sm)) in
            Source::ALL.iter().flat_map(|&s| [(s, ("compute_80", 80)), (s, ("compute_90", 90))])
        {
            let ptx = compile_source(source, NvrtcOutput::Ptx(virtual_arch)).unwrap();
            let text = String::from_utf8(ptx.clone()).unwrap();
            for kernel in source.kernels() {
                let name = kernel.name();
                assert!(text.contains(&format!(".entry {name}(")), "{name} missing from the {virtual_arch} PTX");
            }
            assert!(!compile_source(source, NvrtcOutput::Cubin(sm)).unwrap().is_empty());
            let path = dir.path().join(format!("{}.{virtual_arch}.ptx", source.file()));
            std::fs::write(&path, &ptx).unwrap();
            let cubin = path.with_extension("cubin");
            match Command::new(&ptxas).arg(format!("-arch=sm_{sm}")).arg("-v").arg(&path).arg("-o").arg(cubin).output()
            {
                Ok(out) => {
                    let log = String::from_utf8_lossy(&out.stderr);
                    assert!(out.status.success(), "ptxas sm_{sm}: {log}");
                    assert!(log.contains("spill stores"), "ptxas -v printed no register usage: {log}");
                    let spills: Vec<&str> = log
                        .lines()
                        .filter(|l| {
                            l.contains("spill stores") && !l.contains(" 0 bytes spill stores, 0 bytes spill loads")
                        })
                        .collect();
                    assert!(spills.is_empty(), "{} spills registers on sm_{sm}:\n{}", source.file(), spills.join("\n"));
                }
                Err(e) => {
                    assert!(
                        !tools_required(),
                        "NEREUS_REQUIRE_KERNEL_TOOLS=1 but ptxas ({}) did not run: {e}",
                        ptxas.display()
                    );
                    eprintln!("ptxas not found ({e}); NVRTC's own cubin for sm_{sm} was checked");
                }
            }
        }
    }

    /// Every cuBLAS symbol the engine's GEMMs use resolves from the library (CI: the PyPI wheel
    /// `nvidia-cublas-cu12`, put on LD_LIBRARY_PATH by scripts/kernel-env.sh); no GPU needed.
    #[test]
    fn every_cublas_symbol_the_engine_uses_resolves() {
        use crate::backend::blas::{open_library, resolve_symbols, CUBLAS};
        match open_library(&CUBLAS) {
            Ok(library) => resolve_symbols(&CUBLAS, &library).unwrap(),
            Err(e) => {
                assert!(!tools_required(), "NEREUS_REQUIRE_KERNEL_TOOLS=1 but cuBLAS does not load: {e}");
                eprintln!("skipped: {e}");
            }
        }
    }

    /// The rectangle-copy kernels on a real GPU against the host reference, and a driver graph
    /// recorded and replayed (`scripts/gpu-check.sh` runs it).
    #[test]
    #[ignore = "needs an NVIDIA GPU; scripts/gpu-check.sh runs it"]
    fn gpu_rectangle_copies_match_the_host_reference() {
        let device = crate::backend::gpu::Device::new(Cuda::open(0).unwrap()).unwrap();
        crate::backend::gpu::check_rect_copies_against_host(&device);
        // A driver graph recorded and replayed, on a fresh device (its counters start at 0).
        crate::backend::gpu::check_recorded_graph(&crate::backend::gpu::Device::new(Cuda::open(0).unwrap()).unwrap());
    }

    #[test]
    fn without_a_driver_opening_a_device_is_an_error_not_a_panic() {
        // SAFETY: only probes whether the shared library loads.
        if unsafe { sys::is_culib_present() } {
            return; // a machine with a driver: nothing to check here
        }
        assert!(matches!(Cuda::open(0), Err(BackendError::NoDevice { .. })));
        assert!(matches!(devices(), Err(BackendError::NoDevice { .. })));
    }
}
