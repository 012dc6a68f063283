//! Models: architectures, layouts and the parameter catalogue (pure; no I/O, no MPI).

mod architecture;
pub mod catalogue;
mod layout;

pub use architecture::{Architecture, Numerics, OutputHead};
pub use catalogue::{Catalogue, LayoutError, LocalShape, Piece, Region, ShardTable, Sharding, StageOwner, TensorSpec};
pub use layout::{Layout, Position};
