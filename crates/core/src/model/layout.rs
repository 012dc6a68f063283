//! Layouts `T = (tp, pp)` and positions inside them.

use serde::{Deserialize, Serialize};
use std::fmt;

/// The tightly coupled part of a parallel configuration: `tp` tensor-parallel ranks in each of
/// `pp` pipeline stages, `tp × pp` ranks in all.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct Layout {
    /// Tensor-parallel degree.
    pub tp: u32,
    /// Pipeline-parallel degree.
    pub pp: u32,
}

/// One rank's place in a layout: tensor-parallel index `i` and pipeline stage `j`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct Position {
    /// Tensor-parallel index, `0..tp`.
    pub tp: u32,
    /// Pipeline stage, `0..pp`.
    pub pp: u32,
}

impl Layout {
    /// `(tp, pp)`.
    pub const fn new(tp: u32, pp: u32) -> Layout {
        Layout { tp, pp }
    }

    /// Ranks one replica occupies.
    pub fn size(self) -> u32 {
        self.tp * self.pp
    }

    /// The position held by the `index`-th rank of a replica's ordered rank list.
    ///
    /// Ranks are ordered tensor-parallel-fastest, so a TP group is a contiguous run of the list
    /// (and lands inside one node when the list is). Example, `(tp, pp) = (2, 4)` on ranks
    /// `[8, 9, 10, 11, 12, 13, 14, 15]`: index 5 (rank 13) is `Position { tp: 1, pp: 2 }`; the TP
    /// group of stage 2 is ranks 12–13; the pipeline of TP index 0 is ranks 8, 10, 12, 14.
    pub fn position(self, index: usize) -> Position {
        let index = index as u32;
        Position { tp: index % self.tp, pp: index / self.tp }
    }

    /// Inverse of [`Layout::position`].
    pub fn index(self, position: Position) -> usize {
        (position.pp * self.tp + position.tp) as usize
    }

    /// Every position, in rank-list order.
    pub fn positions(self) -> impl Iterator<Item = Position> {
        (0..self.size() as usize).map(move |i| self.position(i))
    }
}

impl fmt::Display for Layout {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "(tp={}, pp={})", self.tp, self.pp)
    }
}

/// Ranks of the `k = a·b` units that `Split` makes from a unit with `layout` on `ranks` into
/// layout `sub` (`a = tp / sub.tp`, `b = pp / sub.pp`): sub-unit `w·a + u` takes the source
/// positions `(i'·a + u, j'·b + w)`, so each of its ranks already holds a `1/(a·b)` slice of
/// what it needs.
pub fn split_ranks_of(layout: Layout, ranks: &[i32], sub: Layout) -> Vec<Vec<i32>> {
    let (a, b) = (layout.tp / sub.tp, layout.pp / sub.pp);
    (0..a * b)
        .map(|k| {
            let (u, w) = (k % a, k / a);
            sub.positions().map(|p| ranks[layout.index(Position { tp: p.tp * a + u, pp: p.pp * b + w })]).collect()
        })
        .collect()
}

/// Ranks of the unit that `Merge` makes from `parts` (layout `sub`, ordered ranks) into
/// `layout` (the inverse of [`split_ranks_of`]): target position `(i'·a + u, j'·b + w)` is the
/// rank at `(i', j')` of part `w·a + u`, which already holds the target shard whenever stage
/// boundaries line up — then Merge sends no byte.
pub fn merge_ranks_of(sub: Layout, parts: &[&[i32]], layout: Layout) -> Vec<i32> {
    let (a, b) = (layout.tp / sub.tp, layout.pp / sub.pp);
    layout
        .positions()
        .map(|p| parts[((p.pp % b) * a + p.tp % a) as usize][sub.index(Position { tp: p.tp / a, pp: p.pp / b })])
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn positions_are_tensor_parallel_fastest_and_invert() {
        let l = Layout::new(2, 4);
        assert_eq!(l.position(5), Position { tp: 1, pp: 2 });
        for (i, p) in l.positions().enumerate() {
            assert_eq!(l.index(p), i);
        }
    }
}
