//! What one node has (hwloc for CPUs and memory, sysfs for GPUs) and where this rank is bound.

use hwloc2::{CpuBindFlags, ObjectType, Topology};
use serde::{Deserialize, Serialize};
use std::path::Path;

use super::pci::{scan_gpus, GpuInfo};
use super::{TopologyError, MAX_CPU_INDEX};
use nereus_core::index_list::{format_index_list, parse_index_list};

/// The hardware of the node this process runs on.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct NodeTopology {
    /// Host name (as MPI reports it, so it matches the world layout).
    pub hostname: String,
    /// CPU packages (sockets).
    pub packages: u32,
    /// NUMA memory domains.
    pub numa_domains: u32,
    /// Physical cores.
    pub cores: u32,
    /// Hardware threads (hwloc PUs).
    pub hardware_threads: u32,
    /// Host memory in bytes.
    pub memory_bytes: u64,
    /// GPUs in PCI order.
    pub gpus: Vec<GpuInfo>,
}

/// Where this process may run: its CPU binding as the OS reports it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CpuBinding {
    /// Hardware threads (OS indices) the process may run on.
    pub hardware_threads: Vec<u32>,
    /// Physical cores (OS indices) whose every thread is in the binding.
    pub cores: Vec<u32>,
    /// NUMA domains whose CPUs overlap the binding.
    pub numa_domains: Vec<u32>,
    /// True when the binding covers every hardware thread (the process is not bound).
    pub unbound: bool,
}

impl CpuBinding {
    /// `cores 0-3 (threads 0-7), NUMA 0`, or with `unbound` when it spans the node.
    pub fn describe(&self) -> String {
        format!(
            "cores {} (threads {}), NUMA {}{}",
            or_none(format_index_list(&self.cores)),
            or_none(format_index_list(&self.hardware_threads)),
            or_none(format_index_list(&self.numa_domains)),
            if self.unbound { ", unbound" } else { "" }
        )
    }
}

fn or_none(list: String) -> String {
    if list.is_empty() {
        "none".into()
    } else {
        list
    }
}

/// Loads the hwloc topology of this node.
fn load_hwloc() -> Result<Topology, TopologyError> {
    Topology::new().ok_or_else(|| TopologyError::Hwloc { reason: "hwloc_topology_load failed".into() })
}

impl NodeTopology {
    /// Discovers this node: CPUs and memory from hwloc, GPUs from the PCI bus.
    pub fn discover(hostname: &str) -> Result<NodeTopology, TopologyError> {
        let topo = load_hwloc()?;
        let count = |t: ObjectType| topo.objects_with_type(&t).map_or(0, |v| v.len() as u32);
        let root = topo.object_at_root();
        Ok(NodeTopology {
            hostname: hostname.to_string(),
            packages: count(ObjectType::Package).max(1),
            // The binding maps hwloc's virtual NUMA depth wrongly, so count the root's nodeset.
            numa_domains: root.nodeset().map_or(1, |set| set.weight().max(1) as u32),
            cores: count(ObjectType::Core),
            hardware_threads: count(ObjectType::PU),
            memory_bytes: root.total_memory(),
            gpus: scan_gpus(Path::new("/sys/bus/pci/devices")),
        })
    }
}

impl CpuBinding {
    /// This process's binding (`hwloc_get_cpubind`), with the cores and NUMA domains it covers.
    pub fn of_this_process() -> Result<CpuBinding, TopologyError> {
        let topo = load_hwloc()?;
        let bound = topo
            .get_cpubind(CpuBindFlags::CPUBIND_PROCESS)
            .ok_or_else(|| TopologyError::Hwloc { reason: "hwloc_get_cpubind failed".into() })?;
        let threads: Vec<u32> = bound.clone().into_iter().collect();
        let all_threads = topo.objects_with_type(&ObjectType::PU).map_or(0, |v| v.len());
        let cores = topo
            .objects_with_type(&ObjectType::Core)
            .unwrap_or_default()
            .into_iter()
            .filter(|core| core.cpuset().is_some_and(|set| set.into_iter().all(|t| threads.contains(&t))))
            .map(|core| core.os_index())
            .collect();
        Ok(CpuBinding {
            numa_domains: numa_domains_of(&threads, Path::new("/sys/devices/system/node")),
            unbound: threads.len() >= all_threads,
            hardware_threads: threads,
            cores,
        })
    }
}

/// NUMA domains (from `nodeN/cpulist` in sysfs) whose CPUs overlap `threads`.
fn numa_domains_of(threads: &[u32], sysfs_nodes: &Path) -> Vec<u32> {
    let Ok(entries) = std::fs::read_dir(sysfs_nodes) else {
        return vec![0];
    };
    let mut domains: Vec<u32> = entries
        .flatten()
        .filter_map(|e| {
            let name = e.file_name().to_string_lossy().into_owned();
            let id: u32 = name.strip_prefix("node")?.parse().ok()?;
            let cpus =
                parse_index_list(&std::fs::read_to_string(e.path().join("cpulist")).ok()?, MAX_CPU_INDEX).ok()?;
            cpus.iter().any(|c| threads.contains(c)).then_some(id)
        })
        .collect();
    domains.sort_unstable();
    domains
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hwloc_sees_this_machine() {
        let node = NodeTopology::discover("here").unwrap();
        assert!(node.cores >= 1 && node.hardware_threads >= node.cores);
        assert!(node.memory_bytes > 0);
        let binding = CpuBinding::of_this_process().unwrap();
        assert!(!binding.hardware_threads.is_empty());
        assert!(binding.hardware_threads.len() as u32 <= node.hardware_threads);
    }

    #[test]
    fn numa_domains_come_from_sysfs_cpulists() {
        let root = tempfile::tempdir().unwrap();
        for (node, list) in [("node0", "0-3\n"), ("node1", "4-7\n")] {
            std::fs::create_dir_all(root.path().join(node)).unwrap();
            std::fs::write(root.path().join(node).join("cpulist"), list).unwrap();
        }
        assert_eq!(numa_domains_of(&[2, 3], root.path()), vec![0]);
        assert_eq!(numa_domains_of(&[3, 4], root.path()), vec![0, 1]);
    }
}
