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
