//! Models: architectures, layouts and the parameter catalogue (pure; no I/O, no MPI).

mod architecture;
pub mod catalogue;
mod layout;
mod section;

pub use architecture::{Architecture, Numerics, OutputHead};
pub use catalogue::{Catalogue, LayoutError, LocalShape, Piece, Region, ShardTable, Sharding, StageOwner, TensorSpec};
pub use layout::{merge_ranks_of, split_ranks_of, Layout, Position};
pub use section::{shard_bytes, Section};
