//! Communication errors, each naming the operation, the group and the rank that saw it.

use thiserror::Error;

/// Why a communication step failed.
#[derive(Debug, Error)]
pub enum CommError {
    /// MPI could not be initialized (already initialized, or the launcher environment is broken).
    #[error("MPI initialization failed: {reason}")]
    Init {
        /// What went wrong.
        reason: String,
    },
    /// Ranks did not agree on a value they must share (config hash, plan hash, DAG hash).
    #[error("{op} on {group}: ranks disagree: {report}")]
    Disagreement {
        /// The agreement step, e.g. `config agreement`.
        op: String,
        /// The group, e.g. `world (4 ranks)`.
        group: String,
        /// Which ranks hold what (complete on rank 0; a pointer to rank 0 elsewhere).
        report: String,
        /// True when at least one rank failed before it had a value (e.g. a config error),
        /// rather than holding a different one.
        local_failures: bool,
    },
    /// A rank sent bytes that do not decode (a bug or a version mismatch between binaries).
    #[error("{op} on {group}: rank {rank} sent an undecodable message: {reason}")]
    Decode {
        /// The collective.
        op: String,
        /// The group.
        group: String,
        /// The sending rank.
        rank: i32,
        /// The decoder's message.
        reason: String,
    },
    /// A message larger than MPI's 32-bit counts can carry.
    #[error("{op} on {group}: rank {rank} would send {bytes} bytes, more than one MPI message can carry")]
    TooLarge {
        /// The collective.
        op: String,
        /// The group.
        group: String,
        /// The rank with the large message.
        rank: i32,
        /// Its size.
        bytes: usize,
    },
    /// The GPU collective library (NCCL, RCCL) or the device under it failed.
    #[error("{lib} {op} on {group} failed on rank {rank}: {reason}")]
    Collective {
        /// `NCCL`, `RCCL` or `emulated`.
        lib: &'static str,
        /// The call, e.g. `ncclCommInitRank`.
        op: String,
        /// The group, e.g. `ranks [0, 1]`.
        group: String,
        /// The rank that saw it.
        rank: i32,
        /// The library's or driver's message.
        reason: String,
    },
}
