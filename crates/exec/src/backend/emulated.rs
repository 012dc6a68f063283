//! A GPU emulated in host memory: the device seam with synchronous streams, so the device data
//! path (device shard store, GPU data plane, kernel launches) runs where no GPU is — in unit
//! tests and under `--device emulated`. It is a test double, not a backend: nothing here is
//! faster than the host plane.
//!
//! Allocations are host buffers addressed by their host address; every copy and every launch's
//! extent is checked against them. Kernels are the device kernels themselves, run by the grid
//! emulator ([`nereus_kernels::grid`]) at the device's warp width, so a launch that strays out of
//! its allocation, reads what it writes, or diverges around a barrier fails here as it would
//! race or hang on a device.

use std::cell::{Cell, RefCell};
use std::collections::{BTreeMap, HashMap};
use std::ffi::c_void;
use std::time::Instant;

use super::blas::{gemm_on_host, Gemm};
use super::runtime::{GpuRuntime, RawHandle};
use super::{BackendError, DriverDevice};
use nereus_kernels::grid::{GridKernels, WarpWidth};
use nereus_kernels::pack::RectLaunch;
use nereus_kernels::DevicePtr;
use nereus_kernels::{KernelArgs, Launch};

/// An emulated device of a given capacity.
pub struct Emulated {
    device: DriverDevice,
    allocations: RefCell<BTreeMap<u64, Box<[u8]>>>,
    /// Bytes allocated now and the most since the last [`Emulated::reset_peak`] (the
    /// allocator's own count, which the ledger is checked against).
    live: Cell<u64>,
    peak: Cell<u64>,
    handles: Cell<usize>,
    /// The grid emulator at the device's warp width, every kernel resolved once (an emulator
    /// missing one fails every launch with its name).
    kernels: Result<GridKernels, nereus_kernels::grid::GridError>,
    /// When each event was recorded (work is synchronous, so that is when it happened).
    recorded: RefCell<HashMap<usize, Instant>>,
}

fn fault(reason: String) -> BackendError {
    BackendError::Driver { backend: "emulated", reason }
}

impl Emulated {
    /// Device `ordinal` with `memory_bytes` of capacity (allocated on demand), warp width 32.
    pub fn new(ordinal: u32, memory_bytes: u64) -> Emulated {
        let device = DriverDevice { ordinal, name: "emulated device (host memory)".into(), memory_bytes };
        let (allocations, recorded) = (RefCell::new(BTreeMap::new()), RefCell::new(HashMap::new()));
        let (live, peak) = (Cell::new(0), Cell::new(0));
        let kernels = GridKernels::resolve(WarpWidth::W32);
        Emulated { device, allocations, live, peak, handles: Cell::new(0), kernels, recorded }
    }

    /// The same device with another warp width (64 emulates AMD's CDNA).
    pub fn with_warp(self, warp: WarpWidth) -> Emulated {
        Emulated { kernels: GridKernels::resolve(warp), ..self }
    }

    fn warp(&self) -> WarpWidth {
        self.kernels.as_ref().map_or(WarpWidth::W32, GridKernels::warp)
    }

    /// Bytes allocated now (device and pinned).
    pub fn allocated_bytes(&self) -> u64 {
        self.live.get()
    }

    /// The most bytes allocated at once (device and pinned) since the last reset.
    pub fn peak_allocated_bytes(&self) -> u64 {
        self.peak.get()
    }

    /// Starts a new peak from what is allocated now.
    pub fn reset_peak(&self) {
        self.peak.set(self.live.get());
    }

    /// Forgets the allocation at `addr` (a double free or a foreign address is ignored, as the
    /// range checks have already refused any use of it).
    fn release(&self, addr: u64) {
        if let Some(buffer) = self.allocations.borrow_mut().remove(&addr) {
            self.live.set(self.live.get() - buffer.len() as u64);
        }
    }

    /// Checks that `[addr, addr + len)` lies inside one allocation.
    fn check(&self, addr: u64, len: u64, what: &str) -> Result<(), BackendError> {
        let allocations = self.allocations.borrow();
        let inside = allocations
            .range(..=addr)
            .next_back()
            .is_some_and(|(base, buffer)| addr + len <= base + buffer.len() as u64);
        if len == 0 || inside {
            Ok(())
        } else {
            Err(fault(format!("{what} of {len} bytes at {addr:#x} is outside every allocation")))
        }
    }

    fn handle(&self) -> RawHandle {
        self.handles.set(self.handles.get() + 1);
        RawHandle(self.handles.get() as *mut c_void)
    }

    fn allocate(&self, bytes: u64) -> u64 {
        let buffer = vec![0u8; bytes as usize].into_boxed_slice();
        let addr = buffer.as_ptr() as u64;
        self.allocations.borrow_mut().insert(addr, buffer);
        self.live.set(self.live.get() + bytes);
        self.peak.set(self.peak.get().max(self.live.get()));
        addr
    }

    /// Copies `bytes` between checked ranges.
    fn copy(&self, dst: u64, src: u64, bytes: u64) -> Result<(), BackendError> {
        self.check(src, bytes, "copy source")?;
        self.check(dst, bytes, "copy target")?;
        // SAFETY: both ranges lie inside live allocations (checked); they may overlap only for
        // an in-place slice, which `copy` (memmove) allows.
        unsafe { std::ptr::copy(src as *const u8, dst as *mut u8, bytes as usize) };
        Ok(())
    }
}

/// The byte span `[first row start, last row end)` of one side of a launch.
fn span(base: u64, pitch: u64, l: &RectLaunch) -> (u64, u64) {
    (base, base + ((l.rows.max(1) - 1) * pitch + l.row_vectors) * l.width)
}

impl GpuRuntime for Emulated {
    fn backend(&self) -> &'static str {
        "emulated"
    }

    fn synchronous(&self) -> bool {
        true
    }

    fn warp_width(&self) -> u32 {
        self.warp().lanes()
    }

    fn device(&self) -> &DriverDevice {
        &self.device
    }

    fn alloc(&self, bytes: u64, _stream: RawHandle) -> Result<DevicePtr, BackendError> {
        Ok(DevicePtr(self.allocate(bytes)))
    }

    unsafe fn free(&self, ptr: DevicePtr, _stream: RawHandle) {
        self.release(ptr.0);
    }

    fn alloc_pinned(&self, bytes: usize) -> Result<*mut u8, BackendError> {
        Ok(self.allocate(bytes as u64) as *mut u8)
    }

    unsafe fn free_pinned(&self, ptr: *mut u8) {
        self.release(ptr as u64);
    }

    fn create_stream(&self) -> Result<RawHandle, BackendError> {
        Ok(self.handle())
    }

    unsafe fn destroy_stream(&self, _stream: RawHandle) {}

    fn create_event(&self) -> Result<RawHandle, BackendError> {
        Ok(self.handle())
    }

    unsafe fn destroy_event(&self, event: RawHandle) {
        self.recorded.borrow_mut().remove(&(event.0 as usize));
    }

    unsafe fn record(&self, event: RawHandle, _stream: RawHandle) -> Result<(), BackendError> {
        self.recorded.borrow_mut().insert(event.0 as usize, Instant::now());
        Ok(())
    }

    unsafe fn wait_event(&self, _stream: RawHandle, _event: RawHandle) -> Result<(), BackendError> {
        Ok(())
    }

    unsafe fn event_done(&self, _event: RawHandle) -> Result<bool, BackendError> {
        Ok(true)
    }

    unsafe fn event_synchronize(&self, _event: RawHandle) -> Result<(), BackendError> {
        Ok(())
    }

    unsafe fn elapsed_ms(&self, start: RawHandle, end: RawHandle) -> Result<f32, BackendError> {
        let recorded = self.recorded.borrow();
        let at =
            |e: RawHandle| recorded.get(&(e.0 as usize)).copied().ok_or_else(|| fault("event never recorded".into()));
        Ok(at(end)?.duration_since(at(start)?).as_secs_f32() * 1e3)
    }

    unsafe fn copy_h2d(&self, dst: DevicePtr, src: *const u8, bytes: u64, _: RawHandle) -> Result<(), BackendError> {
        self.copy(dst.0, src as u64, bytes)
    }

    unsafe fn copy_d2h(&self, dst: *mut u8, src: DevicePtr, bytes: u64, _: RawHandle) -> Result<(), BackendError> {
        self.copy(dst as u64, src.0, bytes)
    }

    unsafe fn copy_d2d(&self, dst: DevicePtr, src: DevicePtr, bytes: u64, _: RawHandle) -> Result<(), BackendError> {
        if dst.0 < src.0 + bytes && src.0 < dst.0 + bytes {
            return Err(fault(format!("device-to-device copy of {bytes} bytes onto itself ({src:?} -> {dst:?})")));
        }
        self.copy(dst.0, src.0, bytes)
    }

    unsafe fn zero(&self, dst: DevicePtr, bytes: u64, _: RawHandle) -> Result<(), BackendError> {
        self.check(dst.0, bytes, "zeroed range")?;
        // SAFETY: the range lies inside a live allocation (checked).
        unsafe { std::ptr::write_bytes(dst.0 as *mut u8, 0, bytes as usize) };
        Ok(())
    }

    unsafe fn poison(&self, dst: DevicePtr, bytes: u64) -> Result<(), BackendError> {
        self.check(dst.0, bytes, "uninitialised range")?;
        // SAFETY: the range lies inside a live allocation (checked) that no work still uses
        // (the caller's contract; the emulated device runs work as it is enqueued).
        unsafe { std::ptr::write_bytes(dst.0 as *mut u8, 0xff, bytes as usize) };
        Ok(())
    }

    unsafe fn launch(&self, launch: &Launch, args: &mut KernelArgs, _stream: RawHandle) -> Result<(), BackendError> {
        // A null pointer is an absent optional argument (attention's `starts`), as on a device.
        for address in args.addresses().filter(|&a| a != 0) {
            self.check(address, 1, &format!("{} argument", launch.kernel.name()))?;
        }
        // SAFETY: the caller's contract ([`GpuRuntime::launch`]); every other address is in an
        // allocation.
        let kernels = self.kernels.as_ref().map_err(Clone::clone)?;
        Ok(unsafe { kernels.launch(launch, args) }?)
    }

    unsafe fn gemm(
        &self,
        g: &Gemm,
        a: DevicePtr,
        b: DevicePtr,
        c: DevicePtr,
        _: RawHandle,
    ) -> Result<(), BackendError> {
        let c_bytes = g.out.bytes();
        self.check(a.0, (g.m * g.k * 2) as u64, "GEMM operand A")?;
        self.check(b.0, (g.k * g.n * 2) as u64, "GEMM operand B")?;
        self.check(c.0, (g.m * g.n * c_bytes) as u64, "GEMM output C")?;
        // SAFETY: the three ranges lie inside allocations (checked above).
        unsafe { gemm_on_host(g, a.0, b.0, c.0) };
        Ok(())
    }

    fn check_rect(&self, l: &RectLaunch) -> Result<(), BackendError> {
        let (s, d) = (span(l.src, l.src_pitch, l), span(l.dst, l.dst_pitch, l));
        self.check(s.0, s.1 - s.0, &format!("{} source", l.kernel.name()))?;
        self.check(d.0, d.1 - d.0, &format!("{} target", l.kernel.name()))?;
        if d.0 < s.1 && s.0 < d.1 {
            return Err(fault(format!("{} launch reads what it writes: {l:?}", l.kernel.name())));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::gpu::Device;
    use nereus_kernels::pack::RectCopy;

    #[test]
    fn rectangle_copies_match_the_host_reference_at_both_warp_widths() {
        for warp in WarpWidth::ALL {
            let device = Device::new(Emulated::new(0, 1 << 30).with_warp(warp)).unwrap();
            crate::backend::gpu::check_rect_copies_against_host(&device);
        }
    }

    #[test]
    fn packed_rectangles_round_trip_through_the_device() {
        let device = Device::new(Emulated::new(0, 1 << 30)).unwrap();
        let host: Vec<u8> = (0..4096u32).map(|i| (i * 31 % 253) as u8).collect();
        let (a, b) = (device.alloc(4096).unwrap(), device.alloc(4096).unwrap());
        device.upload(&host, a).unwrap();
        // Pack 15 rows of 100 bytes (pitch 256) from offset 12, then unpack them one row lower.
        let pack = RectCopy { src_offset: 12, src_pitch: 256, dst_offset: 0, dst_pitch: 100, row_bytes: 100, rows: 15 };
        let unpack =
            RectCopy { src_offset: 0, src_pitch: 100, dst_offset: 268, dst_pitch: 256, row_bytes: 100, rows: 15 };
        let (mut back, c) = (vec![0u8; 4096], device.alloc(4096).unwrap());
        // SAFETY: every row lies inside the 4096-byte allocations.
        unsafe {
            device.copy_rects(a, b, &[pack]).unwrap();
            device.copy_rects(b, c, &[unpack]).unwrap();
        }
        device.download(c, &mut back).unwrap();
        for row in 0..15 {
            let (got, want) = (268 + row * 256, 12 + row * 256);
            assert_eq!(back[got..got + 100], host[want..want + 100], "row {row}");
        }
        let outside =
            RectCopy { src_offset: 4000, src_pitch: 256, dst_offset: 0, dst_pitch: 100, row_bytes: 100, rows: 2 };
        // SAFETY: the emulation checks bounds and refuses.
        assert!(unsafe { device.copy_rects(a, b, &[outside]) }.is_err());
    }

    /// An uninitialised buffer reads as NaN until written, also where a cached block held
    /// values before, so an engine op that reads one early fails the parity tests.
    #[test]
    fn an_uninitialised_buffer_reads_as_nan_even_from_a_reused_block() {
        use crate::backend::gpu::DeviceArray;
        let device = Device::new(Emulated::new(0, 1 << 30)).unwrap();
        let held = DeviceArray::from(&device, &[1.5f32; 64]).unwrap();
        drop(held);
        let fresh = DeviceArray::<f32>::uninit(&device, 64).unwrap();
        assert_eq!(device.counters().reuses, 1, "the freed block is handed out again");
        assert!(fresh.read().unwrap().iter().all(|x| x.is_nan()));
        let bf16 = DeviceArray::<u16>::uninit(&device, 8).unwrap();
        assert!(bf16.read().unwrap().iter().all(|&h| f32::from_bits(u32::from(h) << 16).is_nan()));
    }

    /// The recording's rules on the emulated device (the GPUs run the same body).
    #[test]
    fn a_recorded_graph_repeats_its_work_and_refuses_what_a_replay_could_not_repeat() {
        for warp in WarpWidth::ALL {
            crate::backend::gpu::check_recorded_graph(&Device::new(Emulated::new(0, 1 << 30).with_warp(warp)).unwrap());
        }
    }
}
