//! Timing a device's work by kernel: while a profile is open ([`super::gpu::Device::open_profile`])
//! every kernel launch and GEMM call is bracketed by two events on the stream, and closing it
//! waits once and reads each bracket's elapsed time. The events time the device's work (what
//! `nsys` would show per kernel) rather than the host's enqueueing; on the grid emulator, which
//! runs each kernel as it is launched, they time the emulation.
//!
//! Where the stream has run dry, a start event completes as soon as it is recorded, so the
//! span also holds the host's own launch latency (cuBLASLt's host-side work included): on a
//! GPU kept busy, as a training step keeps it, the two agree. Memsets and device-to-device
//! copies are not bracketed; their time is in no family.
//!
//! A profile adds two event records per launch and one wait at its close, so it is for a
//! dedicated measured step (`nereus bench engine`), never for training.

use super::runtime::{GpuRuntime, RawHandle};
use super::BackendError;
use nereus_kernels::Kernel;

/// What one bracketed piece of work was.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Work {
    /// A launch of one of the engine's kernels.
    Kernel(Kernel),
    /// A call of the vendor GEMM (cuBLASLt, hipBLAS, the emulator's).
    Gemm,
}

/// The brackets recorded so far (events in pairs, in launch order).
#[derive(Default)]
pub(super) struct OpenProfile {
    spans: Vec<(Work, RawHandle, RawHandle)>,
}

/// One piece of work's launches and the device seconds they took, summed.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct WorkTime {
    /// The kernel, or the GEMM.
    pub work: Work,
    /// Launches (or GEMM calls).
    pub launches: u64,
    /// Seconds between each launch's two events, summed.
    pub seconds: f64,
}

impl OpenProfile {
    /// Records an event before `enqueue` and one after it on `stream`.
    pub(super) fn bracket(
        &mut self,
        runtime: &dyn GpuRuntime,
        stream: RawHandle,
        work: Work,
        enqueue: impl FnOnce() -> Result<(), BackendError>,
    ) -> Result<(), BackendError> {
        let start = runtime.create_event()?;
        let end = match runtime.create_event() {
            Ok(end) => end,
            Err(e) => {
                // SAFETY: made above and never recorded.
                unsafe { runtime.destroy_event(start) };
                return Err(e);
            }
        };
        // SAFETY: live events on the current stream; kept until `close`, or destroyed here
        // when the work could not be enqueued between them.
        let bracketed = unsafe { runtime.record(start, stream) }
            .and_then(|()| enqueue())
            .and_then(|()| unsafe { runtime.record(end, stream) });
        match bracketed {
            Ok(()) => self.spans.push((work, start, end)),
            Err(_) => unsafe {
                runtime.destroy_event(start);
                runtime.destroy_event(end);
            },
        }
        bracketed
    }

    /// Each piece of work's launches and seconds, in the order each was first launched; every
    /// event is destroyed. The caller has waited for the stream.
    pub(super) fn close(self, runtime: &dyn GpuRuntime) -> Result<Vec<WorkTime>, BackendError> {
        let mut times: Vec<WorkTime> = Vec::new();
        let mut failed = None;
        for (work, start, end) in self.spans {
            // SAFETY: both events were recorded and the stream has been waited for.
            let elapsed = unsafe { runtime.elapsed_ms(start, end) };
            unsafe {
                runtime.destroy_event(start);
                runtime.destroy_event(end);
            }
            let seconds = match elapsed {
                Ok(ms) => f64::from(ms) / 1e3,
                Err(e) => {
                    failed.get_or_insert(e);
                    continue;
                }
            };
            match times.iter_mut().find(|t| t.work == work) {
                Some(t) => (t.launches, t.seconds) = (t.launches + 1, t.seconds + seconds),
                None => times.push(WorkTime { work, launches: 1, seconds }),
            }
        }
        failed.map_or(Ok(times), Err)
    }
}
