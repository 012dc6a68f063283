//! Control-plane collectives over the world: agreement on a hash, and byte gathers.
//!
//! Every function here is entered by every rank of the world, whatever its local outcome, so a
//! rank that failed locally (say, could not read its config) still takes part and no rank waits
//! forever. Each runs under the [`Watchdog`].

use mpi::collective::SystemOperation;
use mpi::datatype::PartitionMut;
use mpi::topology::Communicator;
use mpi::traits::{CommunicatorCollectives, Root};

use super::{CommError, Watchdog, World};
use nereus_core::index_list::format_index_list;

/// What all ranks agreed on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Agreement {
    /// The value every rank holds.
    pub value: u64,
    /// Number of ranks that agreed (the world size).
    pub ranks: i32,
}

/// Checks that every rank holds the same `local` value, with one all-reduce.
///
/// `local` is `Err(message)` on a rank that could not compute its value. When ranks disagree or
/// fail, rank 0 gathers every rank's value or message and the returned error groups the ranks by
/// what they hold, e.g. `ranks 0-1: hash 9f…; ranks 2-3: hash 41…`.
pub fn agree(world: &World, watchdog: &Watchdog, op: &str, local: Result<u64, String>) -> Result<Agreement, CommError> {
    // min over [v, !v, ok] gives the smallest value, the largest value (negated) and whether
    // every rank succeeded; a failed rank sends neutral elements for the first two.
    let send = match &local {
        Ok(v) => [*v, !*v, 1],
        Err(_) => [u64::MAX, u64::MAX, 0],
    };
    let mut reduced = [0u64; 3];
    {
        let _guard = watchdog.guard(op, &world.describe());
        world.comm().all_reduce_into(&send[..], &mut reduced[..], SystemOperation::min());
    }
    let all_ok = reduced[2] == 1;
    if all_ok && reduced[0] == !reduced[1] {
        return Ok(Agreement { value: reduced[0], ranks: world.size() });
    }
    let verdict = match &local {
        Ok(v) => format!("hash {v:016x}"),
        Err(message) => format!("failed: {message}"),
    };
    let report = match gather_bytes_to_root(world, watchdog, &format!("{op} report"), verdict.as_bytes())? {
        Some(verdicts) => group_by_verdict(&verdicts),
        None => "see rank 0's report".into(),
    };
    Err(CommError::Disagreement { op: op.into(), group: world.describe(), report, local_failures: !all_ok })
}

/// A phase that failed on at least one rank, as every rank learns it from [`agree_outcome`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PhaseFailure {
    /// The phase, e.g. `checkpoint verification`.
    pub op: String,
    /// The highest exit status a failed rank asked for (2 usage/config, 1 runtime).
    pub status: u8,
    /// What failed where: the message alone when every rank failed the same way, else
    /// `rank 3: …; ranks 4-5: …` (complete on rank 0; a pointer to rank 0 elsewhere).
    pub report: String,
}

/// Ends a phase that every rank runs on its own (reading files, checking a plan, writing
/// output): one all-reduce tells every rank whether all succeeded, so a failure on some ranks
/// stops every rank at the same point with the same status instead of leaving the others in
/// the next collective. `local` is this rank's outcome: `Err((status, message))` on failure.
/// When any rank failed, rank 0 gathers the messages of the failed ranks into the report.
pub fn agree_outcome(
    world: &World,
    watchdog: &Watchdog,
    op: &str,
    local: Result<(), (u8, String)>,
) -> Result<Result<(), PhaseFailure>, CommError> {
    let send = match &local {
        Ok(()) => [0u64, 0],
        Err((status, _)) => [1, u64::from(*status)],
    };
    let mut reduced = [0u64; 2];
    {
        let _guard = watchdog.guard(op, &world.describe());
        world.comm().all_reduce_into(&send[..], &mut reduced[..], SystemOperation::max());
    }
    if reduced[0] == 0 {
        return Ok(Ok(()));
    }
    let verdict = match &local {
        Ok(()) => String::new(),
        Err((_, message)) => message.clone(),
    };
    let report = match gather_bytes_to_root(world, watchdog, &format!("{op} report"), verdict.as_bytes())? {
        Some(verdicts) => group_failures(&verdicts),
        None => "see rank 0's report".into(),
    };
    Ok(Err(PhaseFailure { op: op.into(), status: reduced[1].min(u64::from(u8::MAX)) as u8, report }))
}

/// The failed ranks' messages (empty verdicts are ranks that succeeded), grouped by message;
/// one message shared by every rank is given alone.
fn group_failures(verdicts: &[Vec<u8>]) -> String {
    let failed: Vec<(usize, &Vec<u8>)> = verdicts.iter().enumerate().filter(|(_, v)| !v.is_empty()).collect();
    let alone = failed.len() == 1 && failed[0].0 == 0; // a phase only rank 0 runs
    if alone || (failed.len() == verdicts.len() && failed.iter().all(|(_, v)| *v == failed[0].1)) {
        return String::from_utf8_lossy(failed[0].1).into_owned();
    }
    let mut groups: Vec<(String, Vec<i32>)> = Vec::new();
    for (rank, bytes) in failed {
        let verdict = String::from_utf8_lossy(bytes).into_owned();
        match groups.iter_mut().find(|(v, _)| *v == verdict) {
            Some((_, ranks)) => ranks.push(rank as i32),
            None => groups.push((verdict, vec![rank as i32])),
        }
    }
    format_groups(&groups)
}

/// `rank 3: …; ranks 4-5: …`.
fn format_groups(groups: &[(String, Vec<i32>)]) -> String {
    let lines: Vec<String> = groups
        .iter()
        .map(|(verdict, ranks)| {
            let noun = if ranks.len() == 1 { "rank" } else { "ranks" };
            format!("{noun} {}: {verdict}", format_index_list(ranks))
        })
        .collect();
    lines.join("; ")
}

/// The largest of every rank's `local` value, on every rank (e.g. whether any rank received a
/// stop signal, so all of them stop after the same step).
pub fn max_over_ranks(world: &World, watchdog: &Watchdog, op: &str, local: u64) -> u64 {
    let mut out = 0u64;
    let _guard = watchdog.guard(op, &world.describe());
    world.comm().all_reduce_into(&local, &mut out, SystemOperation::max());
    out
}

/// A barrier of the world whose ranks sleep `poll` between tests instead of spinning, so ranks
/// that wait while another runs long local work (a child job it launched, say) leave the cores
/// to that work.
pub fn calm_barrier(world: &World, watchdog: &Watchdog, op: &str, poll: std::time::Duration) {
    let _guard = watchdog.guard(op, &world.describe());
    let mut request = world.comm().immediate_barrier();
    while let Err(pending) = request.test() {
        request = pending;
        std::thread::sleep(poll);
    }
}

/// `ranks 0-1: hash …; ranks 2-3: failed: …` from one verdict per rank.
fn group_by_verdict(verdicts: &[Vec<u8>]) -> String {
    let mut groups: Vec<(String, Vec<i32>)> = Vec::new();
    for (rank, bytes) in verdicts.iter().enumerate() {
        let verdict = String::from_utf8_lossy(bytes).into_owned();
        match groups.iter_mut().find(|(v, _)| *v == verdict) {
            Some((_, ranks)) => ranks.push(rank as i32),
            None => groups.push((verdict, vec![rank as i32])),
        }
    }
    if let [(verdict, ranks)] = groups.as_slice() {
        return format!("all {} ranks: {verdict}", ranks.len());
    }
    format_groups(&groups)
}

/// Sends rank 0's bytes to every rank (`local` is read on rank 0 only); returns them everywhere.
pub fn broadcast_bytes(world: &World, watchdog: &Watchdog, op: &str, local: &[u8]) -> Result<Vec<u8>, CommError> {
    let root = world.comm().process_at_rank(0);
    let _guard = watchdog.guard(op, &world.describe());
    let mut len = [if world.rank() == 0 { message_len(world, op, local)? as u64 } else { 0 }];
    root.broadcast_into(&mut len[..]);
    let mut data = if world.rank() == 0 { local.to_vec() } else { vec![0u8; len[0] as usize] };
    // An empty buffer is a null pointer to MPI, which Open MPI rejects: nothing to send anyway.
    if !data.is_empty() {
        root.broadcast_into(&mut data[..]);
    }
    Ok(data)
}

/// Gathers one byte string from every rank to rank 0: `Some(per-rank bytes)` there, `None` elsewhere.
pub fn gather_bytes_to_root(
    world: &World,
    watchdog: &Watchdog,
    op: &str,
    local: &[u8],
) -> Result<Option<Vec<Vec<u8>>>, CommError> {
    // One leading byte per message: Open MPI rejects the null pointer of an empty buffer.
    let padded: Vec<u8> = std::iter::once(0).chain(local.iter().copied()).collect();
    let local = padded.as_slice();
    let count = message_len(world, op, local)?;
    let comm = world.comm();
    let root = comm.process_at_rank(0);
    let _guard = watchdog.guard(op, &world.describe());
    if world.rank() != 0 {
        root.gather_into(&count);
        root.gather_varcount_into(local);
        return Ok(None);
    }
    let mut counts = vec![0i32; world.size() as usize];
    root.gather_into_root(&count, &mut counts[..]);
    let (displs, total) = displacements(&counts);
    let mut buffer = vec![0u8; total];
    {
        let mut partition = PartitionMut::new(&mut buffer[..], &counts[..], &displs[..]);
        root.gather_varcount_into_root(local, &mut partition);
    }
    Ok(Some(unpadded(split(&buffer, &counts, &displs))))
}

/// Gathers one byte string from every rank to every rank.
pub fn all_gather_bytes(world: &World, watchdog: &Watchdog, op: &str, local: &[u8]) -> Result<Vec<Vec<u8>>, CommError> {
    // One leading byte per message, as in `gather_bytes_to_root`.
    let padded: Vec<u8> = std::iter::once(0).chain(local.iter().copied()).collect();
    let local = padded.as_slice();
    let count = message_len(world, op, local)?;
    let comm = world.comm();
    let _guard = watchdog.guard(op, &world.describe());
    let mut counts = vec![0i32; world.size() as usize];
    comm.all_gather_into(&count, &mut counts[..]);
    let (displs, total) = displacements(&counts);
    let mut buffer = vec![0u8; total];
    {
        let mut partition = PartitionMut::new(&mut buffer[..], &counts[..], &displs[..]);
        comm.all_gather_varcount_into(local, &mut partition);
    }
    Ok(unpadded(split(&buffer, &counts, &displs)))
}

fn message_len(world: &World, op: &str, local: &[u8]) -> Result<i32, CommError> {
    i32::try_from(local.len()).map_err(|_| CommError::TooLarge {
        op: op.into(),
        group: world.describe(),
        rank: world.rank(),
        bytes: local.len(),
    })
}

/// Exclusive prefix sums of `counts`, and their total.
fn displacements(counts: &[i32]) -> (Vec<i32>, usize) {
    let mut displs = Vec::with_capacity(counts.len());
    let mut offset = 0i32;
    for &c in counts {
        displs.push(offset);
        offset += c;
    }
    (displs, offset as usize)
}

/// The messages without the leading byte the gathers add.
fn unpadded(messages: Vec<Vec<u8>>) -> Vec<Vec<u8>> {
    messages.into_iter().map(|mut m| m.split_off(1.min(m.len()))).collect()
}

fn split(buffer: &[u8], counts: &[i32], displs: &[i32]) -> Vec<Vec<u8>> {
    counts.iter().zip(displs).map(|(&c, &d)| buffer[d as usize..(d + c) as usize].to_vec()).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn verdicts_are_grouped_by_rank_ranges() {
        let v = |s: &str| s.as_bytes().to_vec();
        let report = group_by_verdict(&[v("hash a"), v("hash a"), v("failed: x"), v("hash a")]);
        assert_eq!(report, "ranks 0-1,3: hash a; rank 2: failed: x");
        assert_eq!(group_by_verdict(&[v("failed: y"), v("failed: y")]), "all 2 ranks: failed: y");
    }

    #[test]
    fn failures_are_grouped_and_a_shared_message_stands_alone() {
        let v = |s: &str| s.as_bytes().to_vec();
        assert_eq!(group_failures(&[v(""), v("disk full"), v(""), v("disk full")]), "ranks 1,3: disk full");
        assert_eq!(group_failures(&[v("no plan"), v("no plan")]), "no plan");
        assert_eq!(group_failures(&[v("a"), v("b")]), "rank 0: a; rank 1: b");
        assert_eq!(group_failures(&[v("only rank 0 writes"), v("")]), "only rank 0 writes");
    }

    #[test]
    fn displacements_are_exclusive_prefix_sums() {
        assert_eq!(displacements(&[3, 0, 2]), (vec![0, 3, 3], 5));
    }
}
