//! A watchdog for blocking collectives: if one does not finish in time, the whole job is aborted
//! with a message naming the operation, the group and the rank — never a silent hang.

use std::sync::mpsc;
use std::thread::JoinHandle;
use std::time::Duration;

/// Exit status of a job aborted by the watchdog.
pub const WATCHDOG_EXIT_CODE: i32 = 3;

/// Arms one timer per guarded collective.
#[derive(Debug, Clone)]
pub struct Watchdog {
    timeout: Duration,
    rank: i32,
    abort_through_mpi: bool,
    fault: Option<FaultInjection>,
}

/// A deliberate stall for testing the watchdog: `NEREUS_FAULT_STALL=<rank>:<op>` makes `rank`
/// stop before entering collective `op` (e.g. `2:config agreement`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FaultInjection {
    /// The rank that stalls.
    pub rank: i32,
    /// The collective it never enters.
    pub op: String,
}

impl FaultInjection {
    /// Reads `NEREUS_FAULT_STALL` from the environment; `None` when unset or malformed.
    pub fn from_env() -> Option<FaultInjection> {
        let spec = std::env::var("NEREUS_FAULT_STALL").ok()?;
        let (rank, op) = spec.split_once(':')?;
        Some(FaultInjection { rank: rank.trim().parse().ok()?, op: op.trim().to_string() })
    }
}

/// Disarms the timer when dropped (the collective finished).
pub struct WatchGuard {
    done: Option<mpsc::Sender<()>>,
    timer: Option<JoinHandle<()>>,
}

impl Watchdog {
    /// A watchdog for `rank`; `abort_through_mpi` when MPI allows `MPI_Abort` from another thread.
    pub fn new(timeout: Duration, rank: i32, abort_through_mpi: bool) -> Watchdog {
        Watchdog { timeout, rank, abort_through_mpi, fault: FaultInjection::from_env() }
    }

    /// The same watchdog with another time limit (once the job config has set one).
    pub fn with_timeout(&self, timeout: Duration) -> Watchdog {
        Watchdog { timeout, ..self.clone() }
    }

    /// The time limit.
    pub fn timeout(&self) -> Duration {
        self.timeout
    }

    /// Arms a timer for collective `op` on `group`; the job aborts unless the guard drops in time.
    pub fn guard(&self, op: &str, group: &str) -> WatchGuard {
        self.guard_with(op, group, Box::new(|| {}))
    }

    /// [`Watchdog::guard`] that runs `on_expiry` before aborting: the GPU data plane aborts its
    /// NCCL/RCCL communicators there (`ncclCommAbort`), releasing a rank blocked in the library.
    pub fn guard_with(&self, op: &str, group: &str, on_expiry: Box<dyn FnOnce() + Send>) -> WatchGuard {
        let (done, expired) = mpsc::channel::<()>();
        let message = self.message(op, group);
        let (timeout, abort_through_mpi) = (self.timeout, self.abort_through_mpi);
        let timer = std::thread::spawn(move || {
            if let Err(mpsc::RecvTimeoutError::Timeout) = expired.recv_timeout(timeout) {
                eprintln!("{message}");
                on_expiry();
                super::world::abort_processes(WATCHDOG_EXIT_CODE, abort_through_mpi);
            }
        });
        self.stall_if_injected(op);
        WatchGuard { done: Some(done), timer: Some(timer) }
    }

    /// Ends the job now, as an expired guard would: for waits that poll (a device stream that
    /// stopped making progress) rather than block.
    pub fn expire(&self, op: &str, group: &str) -> ! {
        eprintln!("{}", self.message(op, group));
        super::world::abort_processes(WATCHDOG_EXIT_CODE, self.abort_through_mpi)
    }

    /// Stops here if fault injection names this rank and `op` (for waits that poll).
    pub fn checkpoint(&self, op: &str) {
        self.stall_if_injected(op);
    }

    fn message(&self, op: &str, group: &str) -> String {
        format!(
            "[r{}] watchdog: collective `{op}` on {group} did not complete within {} s on rank {}; \
             a rank is stalled, dead or in a different step. Aborting the whole job.",
            self.rank,
            nereus_core::config::check::show(self.timeout.as_secs_f64()),
            self.rank
        )
    }

    /// Test hook: the configured rank never enters the configured collective.
    fn stall_if_injected(&self, op: &str) {
        if let Some(fault) = &self.fault {
            if fault.rank == self.rank && fault.op == op {
                log::warn!("fault injection: rank {} stalls before `{op}`", self.rank);
                loop {
                    std::thread::sleep(Duration::from_secs(3600));
                }
            }
        }
    }
}

impl Drop for WatchGuard {
    fn drop(&mut self) {
        drop(self.done.take());
        if let Some(timer) = self.timer.take() {
            let _ = timer.join();
        }
    }
}
