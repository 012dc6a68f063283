//! Stop requests by signal: SIGTERM (Slurm's preemption and `scancel`, a forwarded `kill`) and
//! optionally SIGUSR1/SIGUSR2 (`job.checkpoint_on_signal`, for `sbatch --signal` lead time and
//! for `mpirun`, which forwards them without killing the ranks). The handler only records the
//! signal; the training loop checks at every step boundary, with one all-reduce so every rank
//! stops after the same step, checkpoints, and exits with status 75. A second signal of the
//! same kind ends the process at once.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;

use signal_hook::consts::{SIGTERM, SIGUSR1, SIGUSR2};

use crate::RuntimeError;

/// The signals that ask for a checkpoint and a stop, once installed.
pub struct StopSignals {
    received: Arc<AtomicUsize>,
}

/// Exit status on a second signal (the shell's `128 + SIGTERM`).
const SECOND_SIGNAL_EXIT: i32 = 143;

impl StopSignals {
    /// Handles SIGTERM and, when named (`"SIGUSR1"` or `"SIGUSR2"`), one more signal.
    pub fn install(extra: Option<&str>) -> Result<StopSignals, RuntimeError> {
        let received = Arc::new(AtomicUsize::new(0));
        let extra = match extra {
            Some("SIGUSR1") => Some(SIGUSR1),
            Some("SIGUSR2") => Some(SIGUSR2),
            _ => None,
        };
        for signal in std::iter::once(SIGTERM).chain(extra) {
            let armed = Arc::new(AtomicBool::new(false));
            let failed =
                |e: std::io::Error| RuntimeError::Usage(format!("cannot install a handler for signal {signal}: {e}"));
            // Registered first, so it sees the flag before this signal sets it: a repeat exits.
            signal_hook::flag::register_conditional_shutdown(signal, SECOND_SIGNAL_EXIT, armed.clone())
                .map_err(failed)?;
            signal_hook::flag::register(signal, armed).map_err(failed)?;
            signal_hook::flag::register_usize(signal, received.clone(), signal as usize).map_err(failed)?;
        }
        Ok(StopSignals { received })
    }

    /// The signal received so far on this rank, if any.
    pub fn received(&self) -> Option<&'static str> {
        name(self.received.load(Ordering::SeqCst) as i32)
    }
}

/// The name of a stop signal.
pub fn name(signal: i32) -> Option<&'static str> {
    match signal {
        SIGTERM => Some("SIGTERM"),
        SIGUSR1 => Some("SIGUSR1"),
        SIGUSR2 => Some("SIGUSR2"),
        _ => None,
    }
}
