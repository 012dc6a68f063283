//! Exit statuses of the `nereus` binary: a contract with the batch scripts
//! (`slurm/requeue.sh` requeues on [`EXIT_PREEMPTED`] and stops on [`EXIT_USAGE`]).

/// Usage and configuration errors: the user must change something before a retry.
pub const EXIT_USAGE: u8 = 2;
/// Runtime failures (MPI, hwloc, drivers, files the system refused).
pub const EXIT_FAILURE: u8 = 1;
/// A job stopped by a signal after checkpointing (sysexits' `EX_TEMPFAIL`: the batch scripts
/// requeue the job, which resumes from the checkpoint).
pub const EXIT_PREEMPTED: u8 = 75;
