//! Where ranks run: nodes, their GPUs and NICs as hwloc and sysfs describe them, the launcher
//! that started the ranks, the device each rank drives, and the cores it is bound to (the cores
//! closest to its GPU and NIC: `placement.rs`). The runtime uses it at start-up and `nereus
//! inspect topology` reports it; nothing that moves tensors needs it.
//!
//! Rank arithmetic about *where* ranks run lives here ([`WorldLayout`]); which ranks a
//! model-stage uses lives in core's `plan`.

mod detect;
mod device;
mod launcher;
mod layout;
mod node;
pub mod pci;
pub mod placement;

/// The most hardware threads a node's cpulists may name (sysfs lists are bounded by the kernel's
/// `NR_CPUS`, at most 8,192 today; anything past this is a damaged file).
pub const MAX_CPU_INDEX: u32 = 1 << 16;
/// The most devices a `*_VISIBLE_DEVICES` list may name on one node.
pub const MAX_DEVICE_INDEX: u32 = 1 << 10;

pub use detect::detect_cluster;
pub use device::{assign_device, DeviceAssignment};
pub use launcher::Launcher;
pub use layout::WorldLayout;
pub use node::{CpuBinding, NodeTopology};
pub use pci::{GpuInfo, GpuVendor};
pub use placement::{closest_cores, tp_within_node, Placement, RankPlacement};

use thiserror::Error;

/// Why topology discovery failed.
#[derive(Debug, Error)]
pub enum TopologyError {
    /// hwloc could not load or query this node's topology.
    #[error("hwloc: {reason}")]
    Hwloc {
        /// What failed.
        reason: String,
    },
}
