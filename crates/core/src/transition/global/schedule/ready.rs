//! The ready nodes of the list schedule, least key first: a key is a node's earliest start
//! (as bits: starts are non-negative, so their bits order like the numbers) and its tie rank,
//! and no two ready nodes share a tie rank.
//!
//! A transition's ready nodes share a handful of starts at any time (its nodes of one kind take
//! the same time), and most pops find a stale start and put the node back under a later one.
//! So the keys sit in one bucket of tie ranks per start: the least start's bucket sorted once
//! when it comes first, the others unsorted until then. A pop is then a step along a vector and
//! a refreshed key a push onto another, where a heap of thousands sifts each through its levels.

use std::cmp::Reverse;
use std::collections::{BTreeMap, BinaryHeap};

/// Tie ranks by start, least first.
#[derive(Default)]
pub(super) struct ReadyQueue {
    /// The least start's bucket, if taken out of `later`.
    current: Option<Current>,
    /// Every other start's bucket (an index into `buckets`); all later than `current`'s start.
    later: BTreeMap<u64, usize>,
    /// The tie ranks of each bucket in `later`, unsorted; emptied ones are kept for their storage.
    buckets: Vec<Vec<u64>>,
    /// Indices of emptied buckets.
    free: Vec<usize>,
    /// The bucket of `later` pushed onto last, and its start: refreshed keys come in runs of one
    /// start (the finish of the node just placed on their ranks).
    last: Option<(u64, usize)>,
}

/// The bucket of the least start.
struct Current {
    start: u64,
    /// Its tie ranks when it came first, least first; those before `next` are gone.
    sorted: Vec<u64>,
    next: usize,
    /// Tie ranks pushed at this start since (a node that takes no time readies its successors
    /// at its own start; a woken node may start then too).
    since: BinaryHeap<Reverse<u64>>,
}

impl Current {
    /// Removes and returns the least tie rank.
    fn pop(&mut self) -> Option<u64> {
        let sorted = self.sorted.get(self.next).copied();
        match (sorted, self.since.peek()) {
            (Some(a), Some(&Reverse(b))) if b < a => self.since.pop().map(|r| r.0),
            (Some(a), _) => {
                self.next += 1;
                Some(a)
            }
            (None, _) => self.since.pop().map(|r| r.0),
        }
    }
}

impl ReadyQueue {
    /// Adds the key `(start, tie)`.
    pub fn push(&mut self, start: u64, tie: u64) {
        if let Some((last, bucket)) = self.last {
            if last == start {
                self.buckets[bucket].push(tie);
                return;
            }
        }
        if let Some(current) = &mut self.current {
            if start == current.start {
                current.since.push(Reverse(tie));
                return;
            }
            if start < current.start {
                // Earlier than every key (a node woken by a release): the least start's bucket
                // goes back among the others, its order kept.
                let Current { start, mut sorted, next, since } = self.current.take().expect("matched above");
                sorted.drain(..next);
                sorted.extend(since.into_iter().map(|r| r.0));
                self.store(start, sorted);
            }
        }
        let bucket = match self.later.get(&start) {
            Some(&bucket) => bucket,
            None => self.store(start, Vec::new()),
        };
        self.buckets[bucket].push(tie);
        self.last = Some((start, bucket));
    }

    /// Files `ties` as the bucket of `start` (not yet in `later`); returns its index.
    fn store(&mut self, start: u64, ties: Vec<u64>) -> usize {
        let bucket = match self.free.pop() {
            Some(bucket) if ties.is_empty() => bucket,
            free => {
                self.free.extend(free);
                self.buckets.push(ties);
                self.buckets.len() - 1
            }
        };
        self.later.insert(start, bucket);
        bucket
    }

    /// Removes and returns the least key, `(start, tie)`.
    pub fn pop(&mut self) -> Option<(u64, u64)> {
        loop {
            if let Some(current) = &mut self.current {
                if let Some(tie) = current.pop() {
                    return Some((current.start, tie));
                }
            }
            // The least start's bucket is empty: the next start's comes first, sorted now. Its
            // storage changes places with the emptied one's.
            let (start, bucket) = self.later.pop_first()?;
            if self.last.is_some_and(|(_, b)| b == bucket) {
                self.last = None;
            }
            let emptied = self.current.take().map(|c| c.sorted).unwrap_or_default();
            let mut sorted = std::mem::replace(&mut self.buckets[bucket], emptied);
            self.buckets[bucket].clear();
            self.free.push(bucket);
            // Stale keys come back in the order they were popped, least first: a bucket is a
            // few ascending runs, which the (run-merging) stable sort takes in near-linear time.
            sorted.sort();
            self.current = Some(Current { start, sorted, next: 0, since: BinaryHeap::new() });
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rng::Rng;

    /// Against a sorted list: random pushes (earlier, equal and later starts) and pops.
    #[test]
    fn keys_come_out_least_first() {
        let mut rng = Rng::new(3);
        let (mut queue, mut model) = (ReadyQueue::default(), Vec::new());
        let mut tie = 0;
        for _ in 0..20_000 {
            if rng.below(3) > 0 || model.is_empty() {
                let start = rng.below(8) as u64;
                tie += 1 + rng.below(5) as u64;
                // Ties are distinct, in no particular order.
                let t = tie ^ 0x55;
                queue.push(start, t);
                model.push((start, t));
            } else {
                model.sort_unstable();
                assert_eq!(queue.pop(), Some(model.remove(0)));
            }
        }
        model.sort_unstable();
        for key in model {
            assert_eq!(queue.pop(), Some(key));
        }
        assert_eq!(queue.pop(), None);
    }
}
