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
use crate::topology::format_index_list;

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
    let lines: Vec<String> = groups
        .iter()
        .map(|(verdict, ranks)| {
            let noun = if ranks.len() == 1 { "rank" } else { "ranks" };
            format!("{noun} {}: {verdict}", format_index_list(ranks))
        })
        .collect();
    lines.join("; ")
}

/// Sends rank 0's bytes to every rank (`local` is read on rank 0 only); returns them everywhere.
pub fn broadcast_bytes(world: &World, watchdog: &Watchdog, op: &str, local: &[u8]) -> Result<Vec<u8>, CommError> {
    let root = world.comm().process_at_rank(0);
    let _guard = watchdog.guard(op, &world.describe());
    let mut len = [if world.rank() == 0 { message_len(world, op, local)? as u64 } else { 0 }];
    root.broadcast_into(&mut len[..]);
    let mut data = if world.rank() == 0 { local.to_vec() } else { vec![0u8; len[0] as usize] };
    root.broadcast_into(&mut data[..]);
    Ok(data)
}

/// Gathers one byte string from every rank to rank 0: `Some(per-rank bytes)` there, `None` elsewhere.
pub fn gather_bytes_to_root(
    world: &World,
    watchdog: &Watchdog,
    op: &str,
    local: &[u8],
) -> Result<Option<Vec<Vec<u8>>>, CommError> {
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
    Ok(Some(split(&buffer, &counts, &displs)))
}

/// Gathers one byte string from every rank to every rank.
pub fn all_gather_bytes(world: &World, watchdog: &Watchdog, op: &str, local: &[u8]) -> Result<Vec<Vec<u8>>, CommError> {
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
    Ok(split(&buffer, &counts, &displs))
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
    fn displacements_are_exclusive_prefix_sums() {
        assert_eq!(displacements(&[3, 0, 2]), (vec![0, 3, 3], 5));
    }
}
