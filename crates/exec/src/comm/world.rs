//! MPI bring-up: one [`World`] per process, under `mpirun`, `srun --mpi=pmix`, or as a singleton.

use mpi::environment::Universe;
use mpi::topology::{Communicator, SimpleCommunicator};
use mpi::Threading;

use super::CommError;

/// The initialized MPI environment of this process. Dropping it finalizes MPI.
///
/// It is created once in `main` and passed by reference: there is no global communicator.
pub struct World {
    comm: SimpleCommunicator,
    /// Held so that dropping the world (after its communicator) finalizes MPI.
    _universe: Universe,
    threading: Threading,
}

impl World {
    /// Initializes MPI, asking for `MPI_THREAD_MULTIPLE` so the watchdog thread may call
    /// `MPI_Abort` while the main thread is blocked in a collective.
    pub fn init() -> Result<World, CommError> {
        let (universe, threading) = mpi::initialize_with_threading(Threading::Multiple)
            .ok_or_else(|| CommError::Init { reason: "MPI was already initialized in this process".into() })?;
        let comm = universe.world();
        Ok(World { comm, _universe: universe, threading })
    }

    /// The world communicator.
    pub fn comm(&self) -> &SimpleCommunicator {
        &self.comm
    }

    /// This process's world rank.
    pub fn rank(&self) -> i32 {
        self.comm.rank()
    }

    /// Number of ranks in the job.
    pub fn size(&self) -> i32 {
        self.comm.size()
    }

    /// `world (N ranks)`, for messages.
    pub fn describe(&self) -> String {
        format!("world ({} ranks)", self.size())
    }

    /// Whether another thread may call MPI (and so `MPI_Abort`) while this one is blocked.
    pub fn threads_may_call_mpi(&self) -> bool {
        self.threading == Threading::Multiple
    }

    /// The host name MPI reports for this rank (`MPI_Get_processor_name`).
    pub fn processor_name(&self) -> String {
        mpi::environment::processor_name().unwrap_or_else(|_| "unknown-host".into())
    }

    /// The MPI library's name and version, e.g. `Open MPI v4.1.4`.
    pub fn library_version(&self) -> String {
        let full = mpi::environment::library_version().unwrap_or_default();
        let first = full.lines().next().unwrap_or("unknown MPI");
        first.split(',').next().unwrap_or(first).trim().to_string()
    }

    /// Ends every process of the job with exit status `status`: a rank that cannot go on while
    /// the others may be waiting for it in a collective (an out-of-memory on some ranks, a
    /// failed write on rank 0) stops the whole job at once instead of leaving it to the
    /// watchdog. The caller prints the reason first.
    pub fn abort(&self, status: u8) -> ! {
        abort_processes(i32::from(status), self.threads_may_call_mpi())
    }
}

/// Ends every process of the job: `MPI_Abort` when allowed (the launcher then exits with
/// `status`), else this process exits and the launcher (mpirun, srun) tears down the others.
pub(super) fn abort_processes(status: i32, through_mpi: bool) -> ! {
    // No destructor runs past this point: a reward scorer's process group would outlive us.
    nereus_data::reward::end_all_scorers();
    if through_mpi {
        // SAFETY: MPI was initialized with MPI_THREAD_MULTIPLE, so any thread may call MPI_Abort.
        unsafe {
            mpi::ffi::MPI_Abort(mpi::ffi::RSMPI_COMM_WORLD, status);
        }
    }
    std::process::exit(status)
}
