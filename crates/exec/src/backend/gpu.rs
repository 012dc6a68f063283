//! The device seam: what the data plane and the device shard store need from one GPU —
//! stream-ordered allocations, pinned host memory, streams, events, copies and the
//! rectangle-copy kernels — as the CUDA driver ([`super::cuda`]), the HIP runtime
//! ([`super::rocm`]) or an emulation in host memory ([`super::emulated`]) provide it.
//!
//! [`Device`] wraps a runtime with the stream discipline of a transition: every operation is
//! enqueued on the current stream; [`Device::begin_transition`] starts a fresh stream ordered
//! after the previous one by an event; each DAG node ends with an event ([`Device::mark`]) so a
//! stall can be located; the host waits only where it reads device bytes ([`Device::synchronize`]).
//! Freed blocks are kept for reuse by size ([`super::cache`]) and uploads pass through a ring of
//! pinned memory with events ([`super::staging`]), so a step in steady state asks the driver for
//! nothing and waits for the device only where it reads a result.

use std::cell::{Cell, RefCell};
use std::time::{Duration, Instant};

use super::blas::Gemm;
use super::cache::BlockCache;
use super::profile::{OpenProfile, Work, WorkTime};
use super::recording::Recording;
use super::staging::{UploadRing, UPLOAD_RING_BYTES};
use super::BackendError;
use nereus_kernels::pack::{rect_launch, RectCopy};
use nereus_kernels::{KernelCall, Launch};

/// A device address (`CUdeviceptr`, `hipDeviceptr_t`).
pub use nereus_kernels::DevicePtr;

pub use super::runtime::{GpuRuntime, GraphExec, RawHandle, StreamOp};

/// Streams and events of the transition in flight, and the host staging memory.
struct Streams {
    current: RawHandle,
    /// Events recorded at the end of each DAG node of the current stream, with the node's label.
    marks: Vec<(String, RawHandle)>,
    /// Pinned host memory downloads land in, and its size.
    staging: Option<(*mut u8, usize)>,
    /// Pinned host memory uploads pass through (made on the first upload).
    uploads: Option<UploadRing>,
}

/// Bytes of pinned host memory used to stage one piece of a device-to-host copy.
pub const STAGING_BYTES: usize = 64 << 20;

/// What a wait does when the device stops making progress: it gets the first unfinished node
/// (or `None`) and ends the job (the GPU data plane aborts its communicators and the watchdog
/// exits with its status).
pub type StallHandler = Box<dyn Fn(Option<String>)>;

/// What a [`Device`] has done since it was opened: the engine's overheads that a profile of a
/// training step is read against (a launch per kernel, a GEMM per library call, a driver
/// allocation per buffer, a host wait per synchronization, the bytes crossing the host link).
/// [`DeviceCounters::since`] turns two readings into the work of the span between them.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
pub struct DeviceCounters {
    /// Kernel launches (the rectangle copies' kernels included).
    pub launches: u64,
    /// GEMM library calls.
    pub gemms: u64,
    /// Device allocations asked of the runtime (a block reused from the cache is not one).
    pub allocations: u64,
    /// Allocations served by a cached block of the same size, without the runtime.
    pub reuses: u64,
    /// Blocks returned to the runtime.
    pub frees: u64,
    /// Host waits for the stream ([`Device::synchronize`], once per staged chunk of a download).
    pub synchronizations: u64,
    /// Host waits for an upload's room in the pinned ring (the device had not yet copied what
    /// was there): 0 while a step uploads less than the ring holds.
    pub upload_waits: u64,
    /// Bytes copied host to device.
    pub h2d_bytes: u64,
    /// Bytes copied device to host.
    pub d2h_bytes: u64,
    /// Bytes the host had zeroed on the device: the memsets it enqueued (those a recorded graph
    /// replays are not counted).
    pub zeroed_bytes: u64,
    /// Recorded graphs launched ([`Device::launch_graph`]): one host call each.
    pub graph_launches: u64,
    /// Kernels those graph launches ran (not in `launches`, which the host issued one by one).
    pub graph_kernels: u64,
    /// GEMMs those graph launches ran (not in `gemms`).
    pub graph_gemms: u64,
}

impl DeviceCounters {
    /// The work done between `earlier` and this reading.
    pub fn since(&self, earlier: &DeviceCounters) -> DeviceCounters {
        DeviceCounters {
            launches: self.launches - earlier.launches,
            gemms: self.gemms - earlier.gemms,
            allocations: self.allocations - earlier.allocations,
            reuses: self.reuses - earlier.reuses,
            frees: self.frees - earlier.frees,
            synchronizations: self.synchronizations - earlier.synchronizations,
            upload_waits: self.upload_waits - earlier.upload_waits,
            h2d_bytes: self.h2d_bytes - earlier.h2d_bytes,
            d2h_bytes: self.d2h_bytes - earlier.d2h_bytes,
            zeroed_bytes: self.zeroed_bytes - earlier.zeroed_bytes,
            graph_launches: self.graph_launches - earlier.graph_launches,
            graph_kernels: self.graph_kernels - earlier.graph_kernels,
            graph_gemms: self.graph_gemms - earlier.graph_gemms,
        }
    }

    /// Every time the host waited for the device: stream synchronizations and upload waits.
    pub fn host_waits(&self) -> u64 {
        self.synchronizations + self.upload_waits
    }

    /// Bytes that crossed the host link, both ways.
    pub fn host_device_bytes(&self) -> u64 {
        self.h2d_bytes + self.d2h_bytes
    }
}

/// A GPU with the stream discipline of transitions (see the module comment). The runtime is a
/// value chosen at run time (`--device`): CUDA, ROCm or the emulated device behind one
/// [`GpuRuntime`] object, so nothing above the backend carries the vendor in its type.
pub struct Device {
    runtime: Box<dyn GpuRuntime>,
    streams: RefCell<Streams>,
    stall: RefCell<Option<(Duration, StallHandler)>>,
    /// The allocator's own count: every live allocation's bytes, their sum, and the most that
    /// sum has been (the ledger is checked against it).
    allocations: RefCell<std::collections::HashMap<u64, u64>>,
    /// Freed blocks kept for reuse (their bytes are not in `live`).
    cache: RefCell<BlockCache>,
    live: Cell<u64>,
    peak: Cell<u64>,
    counters: Cell<DeviceCounters>,
    /// Event brackets of every launch, while a profile is open.
    profile: RefCell<Option<OpenProfile>>,
    /// The stream work being recorded instead of enqueued (see [`Device::begin_recording`]).
    recording: RefCell<Option<Recording>>,
    /// Bytes of blocks the live graphs keep.
    graph_bytes: Cell<u64>,
    /// Whether the engine may record and replay work (see [`Device::allow_graphs`]).
    graphs: Cell<bool>,
}

impl Device {
    /// Wraps `runtime` with a first stream.
    pub fn new(runtime: impl GpuRuntime + 'static) -> Result<Device, BackendError> {
        Device::from_boxed(Box::new(runtime))
    }

    /// Wraps a runtime chosen at run time with a first stream.
    pub fn from_boxed(runtime: Box<dyn GpuRuntime>) -> Result<Device, BackendError> {
        let current = runtime.create_stream()?;
        let streams = RefCell::new(Streams { current, marks: Vec::new(), staging: None, uploads: None });
        let (allocations, live, peak) = (RefCell::default(), Default::default(), Default::default());
        let (cache, counters, profile) = (RefCell::default(), Cell::default(), RefCell::default());
        let (recording, graph_bytes) = (RefCell::default(), Cell::default());
        Ok(Device {
            runtime,
            streams,
            stall: RefCell::new(None),
            allocations,
            cache,
            live,
            peak,
            counters,
            profile,
            recording,
            graph_bytes,
            graphs: Cell::new(true),
        })
    }

    /// What the device has done since it was opened (see [`DeviceCounters`]).
    pub fn counters(&self) -> DeviceCounters {
        self.counters.get()
    }

    fn count(&self, add: impl FnOnce(&mut DeviceCounters)) {
        let mut c = self.counters.get();
        add(&mut c);
        self.counters.set(c);
    }

    /// Makes every wait give up after `timeout` and call `handler` (see [`StallHandler`]).
    pub fn on_stall(&self, timeout: Duration, handler: StallHandler) {
        *self.stall.borrow_mut() = Some((timeout, handler));
    }

    /// The runtime.
    pub fn runtime(&self) -> &dyn GpuRuntime {
        self.runtime.as_ref()
    }

    /// The stream work is enqueued on now.
    pub fn stream(&self) -> RawHandle {
        self.streams.borrow().current
    }

    /// Starts the stream of a new transition, ordered after everything enqueued so far. The
    /// cached blocks go back to the runtime first: they were freed on the old stream, and the
    /// new layouts ask for other sizes.
    pub fn begin_transition(&self) -> Result<(), BackendError> {
        self.release_cached();
        let next = self.runtime.create_stream()?;
        let done = self.runtime.create_event()?;
        let mut s = self.streams.borrow_mut();
        // SAFETY: live handles; the old stream's pending work completes after it is destroyed.
        unsafe {
            self.runtime.record(done, s.current)?;
            self.runtime.wait_event(next, done)?;
            self.runtime.destroy_stream(s.current);
        }
        s.current = next;
        for (_, event) in s.marks.drain(..).chain(std::iter::once((String::new(), done))) {
            // SAFETY: the new stream's wait was enqueued; destroying a recorded event is allowed.
            unsafe { self.runtime.destroy_event(event) };
        }
        Ok(())
    }

    /// Records the end of DAG node `label` on the current stream.
    pub fn mark(&self, label: &str) -> Result<(), BackendError> {
        let event = self.runtime.create_event()?;
        let mut s = self.streams.borrow_mut();
        // SAFETY: live handles.
        unsafe { self.runtime.record(event, s.current)? };
        s.marks.push((label.to_string(), event));
        Ok(())
    }

    /// The first marked node the device has not finished, for a stall report.
    pub fn first_unfinished(&self) -> Option<String> {
        let s = self.streams.borrow();
        // SAFETY: marks hold live events.
        s.marks.iter().find(|(_, e)| !unsafe { self.runtime.event_done(*e) }.unwrap_or(false)).map(|(l, _)| l.clone())
    }

    /// Blocks until everything enqueued so far has run. With a stall handler, polls instead
    /// and hands a wait that outlasts its timeout to the handler.
    pub fn synchronize(&self) -> Result<(), BackendError> {
        self.refuse_while_recording("a wait for the device")?;
        self.count(|c| c.synchronizations += 1);
        let event = self.runtime.create_event()?;
        let stream = self.stream();
        // SAFETY: live handles; the event is destroyed after it has happened (or the handler
        // has ended the job).
        unsafe {
            self.runtime.record(event, stream)?;
            let waited = self.wait_for(event);
            self.runtime.destroy_event(event);
            waited
        }
    }

    /// Blocks until `event` has happened; with a stall handler, polls and hands a wait that
    /// outlasts its timeout to the handler.
    ///
    /// # Safety
    /// `event` is live and recorded.
    unsafe fn wait_for(&self, event: RawHandle) -> Result<(), BackendError> {
        match &*self.stall.borrow() {
            None => self.runtime.event_synchronize(event),
            Some((timeout, handler)) => self.poll(event, *timeout).map(|done| {
                if !done {
                    handler(self.first_unfinished());
                }
            }),
        }
    }

    /// Polls `event` (spinning briefly, then sleeping up to a millisecond) until it has
    /// happened (`true`) or `timeout` has passed (`false`).
    ///
    /// # Safety
    /// `event` is live and recorded.
    unsafe fn poll(&self, event: RawHandle, timeout: Duration) -> Result<bool, BackendError> {
        let start = Instant::now();
        let mut pause = Duration::from_micros(10);
        while !self.runtime.event_done(event)? {
            let waited = start.elapsed();
            if waited > timeout {
                return Ok(false);
            }
            // Short waits spin (a copy of a few MiB takes microseconds); long ones sleep.
            if waited < Duration::from_micros(200) {
                std::thread::yield_now();
            } else {
                std::thread::sleep(pause);
                pause = (pause * 2).min(Duration::from_millis(1));
            }
        }
        Ok(true)
    }

    /// Device seconds of the work `op` enqueues, between two events on the current stream.
    pub fn time(&self, op: impl FnOnce() -> Result<(), BackendError>) -> Result<f64, BackendError> {
        let (start, end) = (self.runtime.create_event()?, self.runtime.create_event()?);
        // SAFETY: live handles, destroyed after both events have happened.
        unsafe {
            self.runtime.record(start, self.stream())?;
            let ran = op();
            self.runtime.record(end, self.stream())?;
            let waited = ran.and_then(|()| self.synchronize());
            let ms = waited.and_then(|()| self.runtime.elapsed_ms(start, end));
            self.runtime.destroy_event(start);
            self.runtime.destroy_event(end);
            Ok(f64::from(ms?) / 1e3)
        }
    }

    /// `bytes` of device memory in stream order: a cached block of that size if one was freed,
    /// else the runtime's (after returning the cache to it, if it refuses at first).
    pub fn alloc(&self, bytes: u64) -> Result<DevicePtr, BackendError> {
        let size = bytes.max(1);
        let recorded = self.recording.borrow_mut().as_mut().and_then(|r| r.freed.take(size));
        let cached = recorded.or_else(|| self.cache.borrow_mut().take(size));
        let ptr = match cached {
            Some(ptr) => {
                self.count(|c| c.reuses += 1);
                ptr
            }
            None => self.alloc_from_runtime(size)?,
        };
        if let Some(r) = self.recording.borrow_mut().as_mut() {
            r.owned.insert(ptr.0, size);
        }
        self.allocations.borrow_mut().insert(ptr.0, bytes);
        self.live.set(self.live.get() + bytes);
        self.peak.set(self.peak.get().max(self.live.get()));
        Ok(ptr)
    }

    /// A fresh block from the runtime; when it refuses and blocks are cached, they are given
    /// back and the runtime asked once more.
    fn alloc_from_runtime(&self, size: u64) -> Result<DevicePtr, BackendError> {
        let ptr = match self.runtime.alloc(size, self.stream()) {
            Ok(ptr) => ptr,
            Err(_) if self.cache.borrow().bytes() > 0 => {
                self.release_cached();
                self.runtime.alloc(size, self.stream())?
            }
            Err(e) => return Err(e),
        };
        self.count(|c| c.allocations += 1);
        Ok(ptr)
    }

    /// Returns every cached block to the runtime, in stream order.
    pub fn release_cached(&self) {
        let blocks = self.cache.borrow_mut().drain();
        self.count(|c| c.frees += blocks.len() as u64);
        for ptr in blocks {
            // SAFETY: a cached block was freed by its owner; nothing enqueued since names it.
            unsafe { self.runtime.free(ptr, self.stream()) };
        }
    }

    /// Bytes this process's live buffers hold now, and the most they have held: what Nereus
    /// asked for (libraries' own workspaces, NCCL's buffers and the cached blocks left out).
    pub fn allocated_bytes(&self) -> (u64, u64) {
        (self.live.get(), self.peak.get())
    }

    /// Bytes held from the runtime now: the live buffers, the cached blocks and the blocks live
    /// graphs keep.
    pub fn reserved_bytes(&self) -> u64 {
        self.live.get() + self.cache.borrow().bytes() + self.graph_bytes.get()
    }

    /// Starts a new peak of [`Device::allocated_bytes`] from what is held now.
    pub fn reset_peak(&self) {
        self.peak.set(self.live.get());
    }

    /// Frees `ptr` in stream order: into the cache, for the next allocation of its size.
    ///
    /// # Safety
    /// `ptr` came from [`Device::alloc`] and nothing enqueued later uses it.
    pub unsafe fn free(&self, ptr: DevicePtr) {
        let Some(bytes) = self.allocations.borrow_mut().remove(&ptr.0) else {
            return;
        };
        self.live.set(self.live.get() - bytes);
        if let Some(r) = self.recording.borrow_mut().as_mut() {
            match r.owned.contains_key(&ptr.0) {
                true => r.freed.put(bytes.max(1), ptr),
                false => r.foreign_frees.push((ptr, bytes.max(1))),
            }
            return;
        }
        self.cache.borrow_mut().put(bytes.max(1), ptr);
    }

    /// Enqueues the rectangle copies from the allocation at `src` to the one at `dst` (the same
    /// allocation for an in-place slice, whose schedule keeps every copy's rows apart):
    /// contiguous ones on the copy engine, others as kernels.
    ///
    /// # Safety
    /// Every row lies inside its allocation; for `src == dst`, each copy's rows do not overlap.
    pub unsafe fn copy_rects(&self, src: DevicePtr, dst: DevicePtr, copies: &[RectCopy]) -> Result<(), BackendError> {
        let stream = self.stream();
        for c in copies.iter().filter(|c| c.bytes() > 0) {
            if c.is_contiguous() {
                let (dst, src) = (dst.offset(c.dst_offset), src.offset(c.src_offset));
                self.enqueue(StreamOp::CopyD2D { dst, src, bytes: c.bytes() }, stream)?;
            } else {
                let l = rect_launch(src.0, dst.0, c);
                self.runtime.check_rect(&l)?;
                self.enqueue(StreamOp::Launch { launch: l.launch(), args: l.args() }, stream)?;
            }
        }
        Ok(())
    }

    /// Enqueues `call`'s kernel on the current stream over `grid` blocks of `block` threads.
    ///
    /// # Safety
    /// As [`GpuRuntime::launch`]: every address among `call`'s arguments lies, over the range the
    /// kernel touches, inside a live allocation.
    pub unsafe fn launch(&self, call: &impl KernelCall, grid: [u32; 3], block: [u32; 3]) -> Result<(), BackendError> {
        let launch = Launch { kernel: call.kernel(), grid, block, shared_bytes: 0 };
        self.enqueue(StreamOp::Launch { launch, args: call.args() }, self.stream())
    }

    /// Zeroes `bytes` at `dst` in stream order.
    ///
    /// # Safety
    /// The range lies inside a live allocation.
    pub unsafe fn zero(&self, dst: DevicePtr, bytes: u64) -> Result<(), BackendError> {
        self.enqueue(StreamOp::Zero { dst, bytes }, self.stream())
    }

    /// Enqueues `op` on `stream` (counted, and timed while a profile is open), or records it
    /// while a recording is open.
    ///
    /// # Safety
    /// As [`StreamOp::enqueue`].
    unsafe fn enqueue(&self, op: StreamOp, stream: RawHandle) -> Result<(), BackendError> {
        if let Some(r) = self.recording.borrow_mut().as_mut() {
            r.ops.push(op);
            return Ok(());
        }
        let work = match &op {
            StreamOp::Launch { launch, .. } => Work::Kernel(launch.kernel),
            StreamOp::Gemm { .. } => Work::Gemm,
            StreamOp::CopyD2D { .. } => return op.enqueue(self.runtime.as_ref(), stream),
            StreamOp::Zero { bytes, .. } => {
                self.count(|c| c.zeroed_bytes += bytes);
                return op.enqueue(self.runtime.as_ref(), stream);
            }
        };
        self.count(|c| match work {
            Work::Gemm => c.gemms += 1,
            Work::Kernel(_) => c.launches += 1,
        });
        self.bracketed(work, || op.enqueue(self.runtime.as_ref(), stream))
    }

    /// Starts recording: from now on the work this device is given is kept, in order, instead
    /// of enqueued, until [`Device::end_recording`] turns it into a [`Graph`]. Nothing may wait
    /// for the device or cross the host link meanwhile (a replay could not repeat it), and a
    /// buffer allocated before may not be freed inside (a replay would use it after its free).
    pub fn begin_recording(&self) -> Result<(), BackendError> {
        self.refuse_while_recording("a recording")?;
        *self.recording.borrow_mut() = Some(Recording::default());
        Ok(())
    }

    /// Ends the recording and makes it a graph launchable with [`Device::launch_graph`]. The
    /// blocks it allocated stay the graph's until it is dropped; none may still be in use.
    pub fn end_recording(&self) -> Result<Graph<'_>, BackendError> {
        let Some(mut r) = self.recording.borrow_mut().take() else {
            return Err(self.refused("ending a recording that was never begun".into()));
        };
        // Blocks still in use stay their holders' ordinary allocations (nothing recorded has run);
        // the others, all freed inside, are the graph's from here on, whatever happens next.
        let live = |p: &u64| self.allocations.borrow().contains_key(p);
        let outliving = r.owned.keys().filter(|p| live(p)).count();
        let blocks: Vec<(DevicePtr, u64)> =
            r.owned.iter().filter(|(p, _)| !live(p)).map(|(&p, &size)| (DevicePtr(p), size)).collect();
        let (kernels, gemms) = (r.kernels(), r.gemms());
        let _ = r.freed.drain();
        self.graph_bytes.set(self.graph_bytes.get() + blocks.iter().map(|b| b.1).sum::<u64>());
        let mut graph = Graph { device: self, exec: None, blocks, kernels, gemms };
        if let Some(&(ptr, _)) = r.foreign_frees.first() {
            // Nothing recorded has run: the blocks are free as their owners asked.
            for (ptr, size) in r.foreign_frees.drain(..) {
                self.cache.borrow_mut().put(size, ptr);
            }
            let what = format!("a buffer allocated before the recording ({:#x}) was freed inside it", ptr.0);
            return Err(self.refused(what));
        }
        if outliving > 0 {
            return Err(self.refused(format!("{outliving} buffers made inside the recording outlive it")));
        }
        let ops = std::mem::take(&mut r.ops);
        // SAFETY: the graph keeps the blocks it names; everything else it names was allocated
        // before the recording and is the caller's to keep alive while the graph is.
        let exec = match unsafe { self.runtime.instantiate(&ops) } {
            Ok(exec) => exec,
            // The list replayed operation by operation does the same work: slower to launch,
            // never wrong.
            Err(e) => {
                log::warn!(
                    "{}: a recorded graph could not be instantiated ({e}); replaying its list",
                    self.runtime.backend()
                );
                GraphExec::Replayed(ops)
            }
        };
        graph.exec = Some(exec);
        Ok(graph)
    }

    /// Enqueues `graph` on the current stream: the recorded work, with the same arguments.
    ///
    /// # Safety
    /// Every buffer allocated before the recording that the graph names is still live (the
    /// graph keeps the blocks allocated inside it).
    pub unsafe fn launch_graph(&self, graph: &Graph<'_>) -> Result<(), BackendError> {
        debug_assert!(std::ptr::eq(graph.device, self), "a graph launched on another device");
        self.refuse_while_recording("launching a graph")?;
        let exec = graph.exec.as_ref().ok_or_else(|| self.refused("a graph that failed to instantiate".into()))?;
        self.count(|c| {
            c.graph_launches += 1;
            c.graph_kernels += graph.kernels;
            c.graph_gemms += graph.gemms;
        });
        // SAFETY: the graph's blocks are its own; its caller keeps what else it names alive.
        unsafe { self.runtime.launch_graph(exec, self.stream()) }
    }

    /// Lets the engine record its decode steps and replay them (the default), or makes it
    /// launch every step's kernels one by one (what replays are checked against).
    pub fn allow_graphs(&self, allowed: bool) {
        self.graphs.set(allowed);
    }

    /// Whether the engine may record and replay work.
    pub fn graphs_allowed(&self) -> bool {
        self.graphs.get()
    }

    /// Whether work is being recorded rather than enqueued.
    pub fn is_recording(&self) -> bool {
        self.recording.borrow().is_some()
    }

    fn refused(&self, reason: String) -> BackendError {
        BackendError::Driver { backend: self.runtime.backend(), reason: format!("graph recording: {reason}") }
    }

    /// An error when a recording is open: `what` cannot be part of a replayable step.
    fn refuse_while_recording(&self, what: &str) -> Result<(), BackendError> {
        match self.is_recording() {
            true => Err(self.refused(format!("{what} inside a recorded step (a replay could not repeat it)"))),
            false => Ok(()),
        }
    }

    /// Runs `enqueue` between two events when a profile is open (see [`super::profile`]).
    fn bracketed(&self, work: Work, enqueue: impl FnOnce() -> Result<(), BackendError>) -> Result<(), BackendError> {
        match self.profile.borrow_mut().as_mut() {
            Some(open) => open.bracket(self.runtime.as_ref(), self.stream(), work, enqueue),
            None => enqueue(),
        }
    }

    /// Starts timing every launch and GEMM by kernel (see [`super::profile`]); a profile
    /// already open is dropped with its events.
    pub fn open_profile(&self) {
        if let Some(old) = self.profile.borrow_mut().replace(OpenProfile::default()) {
            let _ = old.close(self.runtime.as_ref());
        }
    }

    /// Waits for the device and returns each kernel's (and the GEMM's) launches and device
    /// seconds since [`Device::open_profile`]; empty when none was open.
    pub fn close_profile(&self) -> Result<Vec<WorkTime>, BackendError> {
        let Some(open) = self.profile.borrow_mut().take() else {
            return Ok(Vec::new());
        };
        let waited = self.synchronize();
        let times = open.close(self.runtime.as_ref());
        waited.and(times)
    }

    /// Enqueues a GEMM on the current stream.
    ///
    /// # Safety
    /// As [`GpuRuntime::gemm`].
    pub unsafe fn gemm(&self, gemm: &Gemm, a: DevicePtr, b: DevicePtr, c: DevicePtr) -> Result<(), BackendError> {
        self.enqueue(StreamOp::Gemm { gemm: *gemm, a, b, c }, self.stream())
    }

    /// Copies `bytes.len()` bytes from the device at `src` into host memory, through pinned
    /// staging, and waits for them.
    pub fn download(&self, src: DevicePtr, bytes: &mut [u8]) -> Result<(), BackendError> {
        self.refuse_while_recording("a download")?;
        let (staging, size) = self.staging(bytes.len())?;
        self.count(|c| c.d2h_bytes += bytes.len() as u64);
        for (k, chunk) in bytes.chunks_mut(size).enumerate() {
            // SAFETY: staging holds `size` bytes; we wait before reading it.
            unsafe {
                self.runtime.copy_d2h(staging, src.offset((k * size) as u64), chunk.len() as u64, self.stream())?;
                self.synchronize()?;
                chunk.copy_from_slice(std::slice::from_raw_parts(staging, chunk.len()));
            }
        }
        Ok(())
    }

    /// Copies `bytes` from host memory to the device at `dst` in stream order, through the
    /// pinned upload ring: `bytes` is free again when this returns, and the host does not wait
    /// for the device unless the ring is full of copies it has not run.
    pub fn upload(&self, bytes: &[u8], dst: DevicePtr) -> Result<(), BackendError> {
        self.refuse_while_recording("an upload")?;
        self.count(|c| c.h2d_bytes += bytes.len() as u64);
        let stream = self.stream();
        // Out of `streams` while in use: a stalled wait reads the marks.
        let taken = self.streams.borrow_mut().uploads.take();
        let mut ring = match taken {
            Some(ring) => ring,
            None => UploadRing::new(self.runtime.as_ref(), UPLOAD_RING_BYTES)?,
        };
        let piece = ring.piece();
        let wait = |event| {
            // SAFETY: the ring's events are live and recorded.
            unsafe { self.wait_for(event) }
        };
        let mut uploaded = Ok(());
        for (k, chunk) in bytes.chunks(piece).enumerate() {
            let dst = dst.offset((k * piece) as u64);
            // SAFETY: `dst` has room for `bytes` (the caller's allocation).
            match unsafe { ring.upload(self.runtime.as_ref(), chunk, dst, stream, &wait) } {
                Ok(waits) => self.count(|c| c.upload_waits += waits),
                Err(e) => {
                    uploaded = Err(e);
                    break;
                }
            }
        }
        self.streams.borrow_mut().uploads = Some(ring);
        uploaded
    }

    /// Pinned staging of at least `want` bytes (at most [`STAGING_BYTES`]), grown on demand.
    fn staging(&self, want: usize) -> Result<(*mut u8, usize), BackendError> {
        let want = want.clamp(1, STAGING_BYTES);
        let mut s = self.streams.borrow_mut();
        match s.staging {
            Some(staging) if staging.1 >= want => return Ok(staging),
            // SAFETY: every copy through the old buffer was waited for.
            Some((old, _)) => unsafe { self.runtime.free_pinned(old) },
            None => {}
        }
        let staging = (self.runtime.alloc_pinned(want)?, want);
        s.staging = Some(staging);
        Ok(staging)
    }
}

/// Work recorded on a device ([`Device::begin_recording`]), launchable again and again with
/// [`Device::launch_graph`]: a CUDA or HIP graph, or the emulated device's list of launches. It
/// keeps the blocks the recording allocated until it is dropped.
pub struct Graph<'d> {
    device: &'d Device,
    exec: Option<GraphExec>,
    blocks: Vec<(DevicePtr, u64)>,
    kernels: u64,
    gemms: u64,
}

impl Graph<'_> {
    /// Kernel launches one launch of the graph runs.
    pub fn kernels(&self) -> u64 {
        self.kernels
    }
}

impl Drop for Graph<'_> {
    fn drop(&mut self) {
        let d = self.device;
        if let Some(exec) = self.exec.take() {
            // SAFETY: our graph; its pending launches are on the device's stream, which lives on.
            unsafe { d.runtime.destroy_graph(exec) };
        }
        d.graph_bytes.set(d.graph_bytes.get() - self.blocks.iter().map(|b| b.1).sum::<u64>());
        for &(ptr, size) in &self.blocks {
            // Launches already enqueued use them before anything enqueued after this does.
            d.cache.borrow_mut().put(size, ptr);
        }
    }
}

/// A device allocation of `T`s, freed in stream order when dropped.
pub struct DeviceArray<'d, T: bytemuck::Pod> {
    device: &'d Device,
    ptr: DevicePtr,
    len: usize,
    _elements: std::marker::PhantomData<T>,
}

impl<'d, T: bytemuck::Pod> DeviceArray<'d, T> {
    /// `len` elements on `device` as the allocator hands them out (a cached block keeps what
    /// it held): the one place a buffer is made, for the constructors below.
    fn allocated(device: &'d Device, len: usize) -> Result<Self, BackendError> {
        let ptr = device.alloc((len * std::mem::size_of::<T>()) as u64)?;
        Ok(DeviceArray { device, ptr, len, _elements: std::marker::PhantomData })
    }

    /// The buffer's size in bytes.
    fn bytes(&self) -> u64 {
        (self.len * std::mem::size_of::<T>()) as u64
    }

    /// `len` zeroed elements on `device`.
    pub fn zeros(device: &'d Device, len: usize) -> Result<Self, BackendError> {
        let buffer = Self::allocated(device, len)?;
        // SAFETY: the allocation holds its bytes; the zeroing is ordered before any later work on
        // the stream, and the host does not wait for it.
        unsafe { device.zero(buffer.ptr, buffer.bytes())? };
        Ok(buffer)
    }

    /// `len` elements on `device` whose contents are unspecified until written: for outputs the
    /// next operation writes whole (a GEMM that overwrites, an element-wise kernel), so no
    /// memset runs first. The emulated device fills them with NaN, so a read before the write
    /// shows in CI (see [`GpuRuntime::poison`]).
    pub fn uninit(device: &'d Device, len: usize) -> Result<Self, BackendError> {
        let buffer = Self::allocated(device, len)?;
        // SAFETY: the allocation holds its bytes and is fresh from the allocator: work enqueued
        // before on the stream no longer uses it (a cached block is handed out in stream order,
        // and the emulated device, the one runtime that writes here, has run that work already).
        unsafe { device.runtime().poison(buffer.ptr, buffer.bytes())? };
        Ok(buffer)
    }

    /// A copy of `values` on `device`.
    pub fn from(device: &'d Device, values: &[T]) -> Result<Self, BackendError> {
        let buffer = Self::allocated(device, values.len())?;
        device.upload(bytemuck::cast_slice(values), buffer.ptr)?;
        Ok(buffer)
    }

    /// The elements, copied back to the host once the work enqueued before has run.
    pub fn read(&self) -> Result<Vec<T>, BackendError> {
        self.view().read(self.device)
    }

    /// The address of element `index`.
    pub fn at(&self, index: usize) -> DevicePtr {
        self.ptr.offset((index * std::mem::size_of::<T>()) as u64)
    }

    /// The address of the first element.
    pub fn ptr(&self) -> DevicePtr {
        self.ptr
    }

    /// A view of the whole array (which must outlive the work that uses it).
    pub fn view(&self) -> DeviceView<T> {
        DeviceView::new(self.ptr, self.len)
    }

    /// Elements held.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether it holds no element.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
}

/// A typed window of device memory owned elsewhere (a section of an EMU's shard, a
/// [`DeviceArray`]): `len` elements of `T` from `ptr`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DeviceView<T> {
    ptr: DevicePtr,
    len: usize,
    _elements: std::marker::PhantomData<T>,
}

impl<T> DeviceView<T> {
    /// `len` elements from `ptr`.
    pub fn new(ptr: DevicePtr, len: usize) -> DeviceView<T> {
        DeviceView { ptr, len, _elements: std::marker::PhantomData }
    }

    /// The address of element `index`.
    pub fn at(&self, index: usize) -> DevicePtr {
        self.ptr.offset((index * std::mem::size_of::<T>()) as u64)
    }

    /// The address of the first element.
    pub fn ptr(&self) -> DevicePtr {
        self.ptr
    }

    /// Elements in the window.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the window is empty.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
}

impl<T: bytemuck::Pod> DeviceView<T> {
    /// The elements, copied to the host once the work enqueued before on `device` has run.
    pub fn read(&self, device: &Device) -> Result<Vec<T>, BackendError> {
        let mut out = vec![T::zeroed(); self.len];
        device.download(self.ptr, bytemuck::cast_slice_mut(&mut out))?;
        Ok(out)
    }

    /// Overwrites the window with `values` (as many as it holds) from the host.
    pub fn write(&self, device: &Device, values: &[T]) -> Result<(), BackendError> {
        if values.len() != self.len {
            let reason = format!("writing {} elements into a view of {}", values.len(), self.len);
            return Err(BackendError::Driver { backend: "device", reason });
        }
        device.upload(bytemuck::cast_slice(values), self.ptr)
    }
}

impl<T: bytemuck::Pod> Drop for DeviceArray<'_, T> {
    fn drop(&mut self) {
        // SAFETY: our allocation; work enqueued later on this stream cannot name it any more.
        unsafe { self.device.free(self.ptr) };
    }
}

impl Drop for Device {
    fn drop(&mut self) {
        // A recording left open (its step failed or panicked) runs nothing; the wait is allowed.
        self.recording.get_mut().take();
        // A profile left open (its step failed) gives its events back after the wait inside.
        let _ = self.close_profile();
        let _ = self.synchronize();
        let s = self.streams.get_mut();
        // SAFETY: everything enqueued has run; the handles are ours.
        unsafe {
            for (_, event) in s.marks.drain(..) {
                self.runtime.destroy_event(event);
            }
            if let Some((ptr, _)) = s.staging.take() {
                self.runtime.free_pinned(ptr);
            }
            if let Some(ring) = s.uploads.take() {
                ring.release(self.runtime.as_ref());
            }
            for ptr in self.cache.get_mut().drain() {
                self.runtime.free(ptr, s.current);
            }
            self.runtime.destroy_stream(s.current);
        }
    }
}

/// One test body for every runtime (candle's `test_device!` idea): rectangle copies on the
/// device — pack, unpack, pitched slices at every vector width, and an in-place slice schedule
/// — must leave exactly the bytes the host reference leaves. Runs on the emulated device in
/// every test run and on a real GPU in `scripts/gpu-check.sh` (the ignored tests of `cuda.rs`
/// and `rocm.rs`).
#[cfg(test)]
pub(crate) fn check_rect_copies_against_host(device: &Device) {
    use nereus_kernels::pack::in_place_schedule;
    let bytes = 1 << 20;
    let host: Vec<u8> = (0..bytes).map(|i| ((i * 2_654_435_761usize) >> 13) as u8).collect();
    let copy = |src_offset, src_pitch, dst_offset, dst_pitch, row_bytes, rows| RectCopy {
        src_offset,
        src_pitch,
        dst_offset,
        dst_pitch,
        row_bytes,
        rows,
    };
    let cases = [
        copy(0, 8192, 0, 4096, 4096, 64),          // pack a TP half, 16-byte vectors
        copy(0, 4096, 4096, 8192, 4096, 64),       // unpack it
        copy(6, 100, 2, 34, 34, 500),              // bf16 rows of 17: 2-byte vectors
        copy(4, 44, 8, 12, 12, 1000),              // f32 rows of 3: 4-byte vectors
        copy(1, 7, 3, 5, 5, 333),                  // odd everything: bytes
        copy(64, 1 << 16, 0, 1 << 16, 1 << 16, 3), // whole rows: the copy engine
    ];
    let (src, dst) = (device.alloc(bytes as u64).unwrap(), device.alloc(bytes as u64).unwrap());
    device.upload(&host, src).unwrap();
    for c in cases {
        let mut expected = vec![0u8; bytes];
        device.upload(&expected, dst).unwrap();
        c.copy_on_host(&host, &mut expected);
        // SAFETY: every case lies inside the 1 MiB allocations.
        unsafe { device.copy_rects(src, dst, &[c]).unwrap() };
        let mut got = vec![0u8; bytes];
        device.download(dst, &mut got).unwrap();
        assert!(got == expected, "{} {c:?}", device.runtime().backend());
    }
    // Merge's in-place slice: a column half compacted to the front, then a shifted run.
    let slices = [copy(4096, 8192, 0, 4096, 4096, 100), copy(900_000, 8192, 409_600, 8192, 8192, 10)];
    let schedule = in_place_schedule(&slices).expect("rows move down in order");
    device.upload(&host, src).unwrap();
    // SAFETY: the schedule keeps each launch's targets apart from its sources.
    unsafe { device.copy_rects(src, src, &schedule).unwrap() };
    let mut got = vec![0u8; bytes];
    device.download(src, &mut got).unwrap();
    for c in slices {
        for row in 0..c.rows {
            let (d, s) = (c.dst_row(row), c.src_row(row));
            assert_eq!(
                got[d.start as usize..d.end as usize],
                host[s.start as usize..s.end as usize],
                "{c:?} row {row}"
            );
        }
    }
    // SAFETY: nothing uses them any more.
    unsafe {
        device.free(src);
        device.free(dst);
    }
    device.synchronize().unwrap();
}

/// One test body for every runtime: a recording runs nothing; each launch of its graph repeats
/// the recorded work (a rectangle-copy kernel and a copy-engine copy through a block the
/// recording owns) on what the buffers hold then; a wait, an upload, or freeing a buffer
/// allocated before the recording inside it is refused. Runs on the emulated device in every
/// test run and, as a driver graph, on a real GPU in `scripts/gpu-check.sh`.
#[cfg(test)]
pub(crate) fn check_recorded_graph(device: &Device) {
    let (a, b) = (device.alloc(4096).unwrap(), device.alloc(4096).unwrap());
    let first: Vec<u8> = (0..4096u32).map(|i| (i * 31 % 253) as u8).collect();
    device.upload(&first, a).unwrap();
    device.upload(&[0u8; 4096], b).unwrap();
    let pack = RectCopy { src_offset: 12, src_pitch: 256, dst_offset: 0, dst_pitch: 100, row_bytes: 100, rows: 15 };
    let whole = RectCopy { src_offset: 0, src_pitch: 1500, dst_offset: 0, dst_pitch: 1500, row_bytes: 1500, rows: 1 };
    device.begin_recording().unwrap();
    let scratch = device.alloc(1500).unwrap();
    // SAFETY: every row lies inside the allocations.
    unsafe {
        device.copy_rects(a, scratch, &[pack]).unwrap();
        device.copy_rects(scratch, b, &[whole]).unwrap();
        device.free(scratch);
    }
    assert!(device.upload(&first, a).is_err() && device.synchronize().is_err());
    let graph = device.end_recording().unwrap();
    let read = |at| {
        let mut out = vec![0u8; 4096];
        device.download(at, &mut out).unwrap();
        out
    };
    assert!(read(b).iter().all(|&x| x == 0), "recording ran nothing");
    let packed = |host: &[u8]| -> Vec<u8> { (0..15).flat_map(|r| host[12 + r * 256..][..100].to_vec()).collect() };
    // SAFETY: `a` and `b` are live.
    unsafe { device.launch_graph(&graph).unwrap() };
    assert_eq!(read(b)[..1500], packed(&first)[..]);
    let second: Vec<u8> = first.iter().map(|x| x.wrapping_add(1)).collect();
    device.upload(&second, a).unwrap();
    // SAFETY: as above.
    unsafe { device.launch_graph(&graph).unwrap() };
    assert_eq!(read(b)[..1500], packed(&second)[..]);
    assert_eq!((device.counters().graph_launches, graph.kernels()), (2, 1));
    drop(graph);
    device.begin_recording().unwrap();
    // SAFETY: nothing uses `a` afterwards.
    unsafe { device.free(a) };
    let refused = device.end_recording().err().expect("a buffer from before the recording was freed in it");
    assert!(refused.to_string().contains("allocated before the recording"), "{refused}");
}
