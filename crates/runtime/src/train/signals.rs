//! The signals a training job answers, caught from the start of the process (before MPI is up,
//! so none of them can kill a rank that has not reached its handlers yet):
//!
//! - SIGTERM (Slurm's preemption and `scancel`, a forwarded `kill`), SIGUSR1 and SIGUSR2
//!   (`sbatch --signal` lead time; what `mpirun` forwards without killing the ranks) ask for a
//!   checkpoint and a stop: the handler only records the signal, the job checks at every step
//!   boundary with one all-reduce so every rank stops after the same step, checkpoints, and
//!   exits with status 75. A second SIGTERM ends the process at once.
//! - SIGHUP asks rank 0 to re-read the pool file now ([`super::pool::PoolSignal`]); the pool
//!   file is read at every step boundary anyway.
//!
//! Signal dispositions belong to the process, so the handlers are installed once per process
//! ([`install`]) and every caller shares them.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock};

use signal_hook::consts::{SIGHUP, SIGTERM, SIGUSR1, SIGUSR2};

use crate::RuntimeError;

/// The stop requests this process received.
pub struct StopSignals {
    received: Arc<AtomicUsize>,
}

/// Exit status on a second SIGTERM (the shell's `128 + SIGTERM`).
const SECOND_SIGNAL_EXIT: i32 = 143;

/// The signals that ask for a checkpoint and a stop.
pub const STOP_SIGNALS: [i32; 3] = [SIGTERM, SIGUSR1, SIGUSR2];

static INSTALLED: OnceLock<Result<StopSignals, String>> = OnceLock::new();

/// Installs the handlers of every signal a job answers, once per process; later calls return
/// the same handlers (and what they have received since the first).
pub fn install() -> Result<&'static StopSignals, RuntimeError> {
    INSTALLED.get_or_init(install_handlers).as_ref().map_err(|e| RuntimeError::Usage(e.clone()))
}

fn install_handlers() -> Result<StopSignals, String> {
    let failed = |signal: i32| move |e: std::io::Error| format!("cannot install a handler for signal {signal}: {e}");
    let received = Arc::new(AtomicUsize::new(0));
    let armed = Arc::new(AtomicBool::new(false));
    // Registered first, so it sees the flag before this signal sets it: a repeat exits.
    signal_hook::flag::register_conditional_shutdown(SIGTERM, SECOND_SIGNAL_EXIT, armed.clone())
        .map_err(failed(SIGTERM))?;
    signal_hook::flag::register(SIGTERM, armed).map_err(failed(SIGTERM))?;
    for signal in STOP_SIGNALS {
        signal_hook::flag::register_usize(signal, received.clone(), signal as usize).map_err(failed(signal))?;
    }
    // SIGHUP's default would end the process; the pool thread (rank 0) acts on it.
    signal_hook::flag::register(SIGHUP, Arc::new(AtomicBool::new(false))).map_err(failed(SIGHUP))?;
    Ok(StopSignals { received })
}

impl StopSignals {
    /// The stop signal received so far on this rank, if any.
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

/// The number of a stop signal's name (0 when it is none).
pub fn number(name: &str) -> u64 {
    STOP_SIGNALS.into_iter().find(|&s| self::name(s) == Some(name)).map_or(0, |s| s as u64)
}
