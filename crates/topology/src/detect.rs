//! `[cluster] detect = true`: a cluster layer filled from this node and the world layout.
//!
//! GPU nodes: one device per GPU, memory from the driver's sysfs entry or the datasheet, peak
//! and intra-node bandwidth from [`KNOWN_GPUS`](super::pci::KNOWN_GPUS), NCCL or RCCL by vendor.
//! CPU-only nodes: one device per MPI rank on the node, the node's memory shared between them,
//! and assumed figures for what cannot be read (an f32 AVX2 FMA peak per core at 2 GHz, MPI
//! shared-memory and TCP bandwidths), which online calibration later replaces. Keys that cannot
//! be detected stay unset, so resolution names them.

use nereus_core::config::{ClusterSection, DataPlane};

use super::layout::WorldLayout;
use super::node::NodeTopology;
use super::pci::GpuVendor;

/// Assumed f32 FLOP per core per cycle on a CPU (2 AVX2 FMA units × 8 lanes × 2).
const CPU_FLOP_PER_CYCLE: f64 = 32.0;
/// Assumed CPU clock when none can be read, in GHz.
const CPU_ASSUMED_GHZ: f64 = 2.0;
/// Assumed memory bandwidth available to one rank, GB/s.
const CPU_MEMORY_GBPS: f64 = 10.0;
/// Assumed MPI shared-memory bandwidth between two ranks on a node, GB/s.
const CPU_INTRA_NODE_GBPS: f64 = 5.0;
/// Assumed bandwidth of one node's network link, GB/s.
const CPU_NIC_GBPS: f64 = 1.0;

/// The detected values for `node` in a job laid out as `layout`.
pub fn detect_cluster(node: &NodeTopology, layout: &WorldLayout) -> ClusterSection {
    let nodes = Some(layout.nodes() as u32);
    let Some(first) = node.gpus.first() else {
        let devices = layout.max_ranks_per_node().max(1) as u32;
        let cores_per_device = f64::from(node.cores.max(1)) / f64::from(devices);
        return ClusterSection {
            nodes,
            devices_per_node: Some(devices),
            // Whole megabytes, so the printed config stays readable.
            device_memory_gb: Some((node.memory_bytes / u64::from(devices) / 1_000_000) as f64 / 1e3),
            device_peak_tflops: Some(cores_per_device * CPU_ASSUMED_GHZ * CPU_FLOP_PER_CYCLE / 1e3),
            device_hbm_gbps: Some(CPU_MEMORY_GBPS),
            intra_node_gbps: Some(CPU_INTRA_NODE_GBPS),
            nics_per_node: Some(1),
            nic_gbps: Some(CPU_NIC_GBPS),
            cores_per_node: Some(node.cores.max(1)),
            data_plane: Some(DataPlane::Mpi),
            ..ClusterSection::default()
        };
    };
    let known = first.known();
    let memory_gb = first.memory_bytes.map(|b| b as f64 / 1e9).or(known.map(|k| k.memory_gb));
    ClusterSection {
        nodes,
        devices_per_node: Some(node.gpus.len() as u32),
        device_memory_gb: memory_gb,
        device_peak_tflops: known.map(|k| k.peak_tflops),
        device_hbm_gbps: known.map(|k| k.hbm_gbps),
        intra_node_gbps: known.map(|k| k.intra_node_gbps),
        data_plane: Some(match first.vendor {
            GpuVendor::Nvidia => DataPlane::Nccl,
            GpuVendor::Amd => DataPlane::Rccl,
        }),
        ..ClusterSection::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pci::GpuInfo;

    fn node(gpus: Vec<GpuInfo>) -> NodeTopology {
        NodeTopology {
            hostname: "n".into(),
            packages: 2,
            numa_domains: 2,
            cores: 16,
            hardware_threads: 32,
            memory_bytes: 64_000_000_000,
            gpus,
        }
    }

    #[test]
    fn cpu_nodes_have_one_device_per_rank() {
        let layout = WorldLayout::from_hostnames(&["a".into(), "a".into(), "a".into(), "a".into(), "b".into()]);
        let c = detect_cluster(&node(vec![]), &layout);
        assert_eq!((c.nodes, c.devices_per_node), (Some(2), Some(4)));
        assert_eq!(c.device_memory_gb, Some(16.0));
        assert_eq!(c.device_peak_tflops, Some(4.0 * 2.0 * 32.0 / 1e3));
        assert_eq!(c.data_plane, Some(DataPlane::Mpi));
    }

    #[test]
    fn known_gpus_fill_datasheet_figures_and_unknown_ones_leave_gaps() {
        let gpu = |id| GpuInfo {
            vendor: GpuVendor::Nvidia,
            pci_address: "x".into(),
            device_id: id,
            model: None,
            memory_bytes: None,
        };
        let layout = WorldLayout::from_hostnames(&["a".into()]);
        let h200 = detect_cluster(&node(vec![gpu(0x2335); 8]), &layout);
        assert_eq!((h200.devices_per_node, h200.device_peak_tflops), (Some(8), Some(989.0)));
        assert_eq!(h200.data_plane, Some(DataPlane::Nccl));
        let unknown = detect_cluster(&node(vec![gpu(0x1234)]), &layout);
        assert_eq!((unknown.device_memory_gb, unknown.device_peak_tflops), (None, None));
    }
}
