//! Placing a rank near the hardware it drives: the cores closest to its GPU (as
//! `srun --gpu-bind=closest` does on NVIDIA nodes, and LUMI's CCD masks do on MI250X nodes,
//! one L3 domain per GCD), the NIC that shares their locality, and whether consecutive ranks
//! — the TP groups the planner lays out — stay inside a node.
//!
//! Sources: sysfs for the PCI side (`local_cpulist` and `numa_node` of a GPU or NIC; NICs from
//! `/sys/class/infiniband` and `/sys/class/cxi`, Slingshot's driver) and hwloc for the CPUs
//! (cores, their hardware threads, their L3 cache). [`closest_cores`] is pure.

use hwloc2::{CpuBindFlags, CpuSet, ObjectType, Topology};
use serde::{Deserialize, Serialize};
use std::path::Path;

use super::device::DeviceAssignment;
use super::launcher::Launcher;
use super::node::CpuBinding;
use super::{TopologyError, WorldLayout, MAX_CPU_INDEX};
use nereus_core::index_list::{format_index_list, parse_index_list};

/// Where a PCI device sits: the CPUs its driver calls local, and its NUMA domain.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Locality {
    /// Hardware threads (OS indices) local to the device; empty when the driver does not say.
    pub cpus: Vec<u32>,
    /// NUMA domain, when known.
    pub numa: Option<u32>,
}

/// The locality of the PCI device at `address` under `pci_devices` (`/sys/bus/pci/devices`).
pub fn locality(pci_devices: &Path, address: &str) -> Locality {
    let dir = pci_devices.join(address);
    let read = |f: &str| std::fs::read_to_string(dir.join(f)).ok();
    Locality {
        cpus: read("local_cpulist").and_then(|t| parse_index_list(t.trim(), MAX_CPU_INDEX).ok()).unwrap_or_default(),
        numa: read("numa_node").and_then(|t| t.trim().parse::<i64>().ok()).and_then(|n| u32::try_from(n).ok()),
    }
}

/// A high-speed NIC (InfiniBand HCA or Slingshot CXI device).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Nic {
    /// `mlx5_0`, `cxi0`, …
    pub name: String,
    /// Its PCI address.
    pub pci_address: String,
    /// Where it sits.
    pub locality: Locality,
}

/// The NICs under `sys_class` (`/sys/class`), sorted by name.
pub fn scan_nics(sys_class: &Path, pci_devices: &Path) -> Vec<Nic> {
    let mut nics = Vec::new();
    for class in ["infiniband", "cxi"] {
        let Ok(entries) = std::fs::read_dir(sys_class.join(class)) else { continue };
        for entry in entries.flatten() {
            let Ok(device) = std::fs::read_link(entry.path().join("device")) else { continue };
            let Some(address) = device.file_name().map(|a| a.to_string_lossy().into_owned()) else { continue };
            let locality = locality(pci_devices, &address);
            nics.push(Nic { name: entry.file_name().to_string_lossy().into_owned(), pci_address: address, locality });
        }
    }
    nics.sort_by(|a, b| a.name.cmp(&b.name));
    nics
}

/// One core as hwloc sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Core {
    /// OS index.
    pub os_index: u32,
    /// Its hardware threads (OS indices).
    pub threads: Vec<u32>,
    /// Index of its L3 cache (a CCD on AMD EPYC); 0 when hwloc reports none.
    pub l3: usize,
}

/// This node's cores with their threads and L3 domains, from hwloc.
pub fn cores() -> Result<Vec<Core>, TopologyError> {
    let topo = Topology::new().ok_or_else(|| TopologyError::Hwloc { reason: "hwloc_topology_load failed".into() })?;
    let l3s: Vec<Vec<u32>> = topo
        .objects_with_type(&ObjectType::L3Cache)
        .unwrap_or_default()
        .iter()
        .map(|c| c.cpuset().map(|s| s.into_iter().collect()).unwrap_or_default())
        .collect();
    Ok(topo
        .objects_with_type(&ObjectType::Core)
        .unwrap_or_default()
        .iter()
        .map(|core| {
            let threads: Vec<u32> = core.cpuset().map(|s| s.into_iter().collect()).unwrap_or_default();
            let l3 = l3s.iter().position(|l3| threads.iter().all(|t| l3.contains(t))).unwrap_or(0);
            Core { os_index: core.os_index(), threads, l3 }
        })
        .collect())
}

/// Where one rank should run.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Placement {
    /// The GPU it drives (index on the node, PCI order).
    pub gpu: u32,
    /// The GPU's NUMA domain.
    pub gpu_numa: Option<u32>,
    /// Cores (OS indices) it should run on.
    pub cores: Vec<u32>,
    /// Their hardware threads: the binding.
    pub threads: Vec<u32>,
    /// The NIC sharing those cores' locality, if any.
    pub nic: Option<String>,
    /// How the cores were chosen.
    pub reason: String,
}

impl Placement {
    /// `cores 8-15 (L3 of gpu 1, NUMA 0), NIC mlx5_0`.
    pub fn describe(&self) -> String {
        let numa = self.gpu_numa.map_or_else(String::new, |n| format!(", NUMA {n}"));
        let nic = self.nic.as_ref().map_or_else(String::new, |n| format!(", NIC {n}"));
        format!("cores {} ({}{numa}){nic}", format_index_list(&self.cores), self.reason)
    }
}

/// The closest cores for the rank with `local_rank` on its node: among the cores local to its
/// GPU (all cores if the driver does not say), GPUs of the same locality share them out — one
/// L3 domain each when there are enough, else equal contiguous runs — and ranks sharing a GPU
/// share its cores the same way. `gpus[i]` is GPU `i`'s locality; `assigned[r]` the GPU of
/// local rank `r`. `None` for a rank without a GPU.
pub fn closest_cores(
    cores: &[Core],
    gpus: &[Locality],
    assigned: &[Option<u32>],
    local_rank: usize,
    nics: &[Nic],
) -> Option<Placement> {
    let gpu = (*assigned.get(local_rank)?)?;
    let local_to = |g: usize| -> Vec<&Core> {
        let cpus = &gpus[g].cpus;
        let near: Vec<&Core> = cores.iter().filter(|c| c.threads.iter().all(|t| cpus.contains(t))).collect();
        if near.is_empty() {
            cores.iter().collect()
        } else {
            near
        }
    };
    let candidates = local_to(gpu as usize);
    let ids = |cs: &[&Core]| cs.iter().map(|c| c.os_index).collect::<Vec<u32>>();
    let peers: Vec<usize> = (0..gpus.len()).filter(|&g| ids(&local_to(g)) == ids(&candidates)).collect();
    let (k, m) = (peers.iter().position(|&g| g == gpu as usize).unwrap_or(0), peers.len().max(1));
    let mut l3s: Vec<usize> = candidates.iter().map(|c| c.l3).collect();
    l3s.dedup();
    let (mine, reason): (Vec<&Core>, String) = if l3s.len() >= m && l3s.len().is_multiple_of(m) {
        let per = l3s.len() / m;
        let chosen = &l3s[k * per..(k + 1) * per];
        (candidates.iter().copied().filter(|c| chosen.contains(&c.l3)).collect(), format!("L3 domain of gpu {gpu}"))
    } else {
        (share(&candidates, k, m), format!("gpu {gpu}'s share of its local cores"))
    };
    let sharing: Vec<usize> = (0..assigned.len()).filter(|&r| assigned[r] == Some(gpu)).collect();
    let j = sharing.iter().position(|&r| r == local_rank).unwrap_or(0);
    let chosen = share(&mine, j, sharing.len());
    let threads: Vec<u32> = chosen.iter().flat_map(|c| c.threads.iter().copied()).collect();
    let nic = nics
        .iter()
        .find(|n| n.locality.cpus.iter().any(|t| threads.contains(t)))
        .or_else(|| nics.iter().find(|n| n.locality.numa.is_some() && n.locality.numa == gpus[gpu as usize].numa))
        .map(|n| n.name.clone());
    let reason = if sharing.len() > 1 { format!("{reason}, 1/{} per rank", sharing.len()) } else { reason };
    Some(Placement { gpu, gpu_numa: gpus[gpu as usize].numa, cores: ids(&chosen), threads, nic, reason })
}

/// Part `k` of `m` contiguous, near-equal parts of `cores` (a core of its own to each when
/// there are fewer cores than parts).
fn share<'c>(cores: &[&'c Core], k: usize, m: usize) -> Vec<&'c Core> {
    if cores.is_empty() || m <= 1 {
        return cores.to_vec();
    }
    if cores.len() < m {
        return vec![cores[k % cores.len()]];
    }
    let (start, end) = (k * cores.len() / m, (k + 1) * cores.len() / m);
    cores[start..end].to_vec()
}

/// Binds this process to `threads` (hwloc, all its threads).
pub fn bind(threads: &[u32]) -> Result<(), TopologyError> {
    let mut topo =
        Topology::new().ok_or_else(|| TopologyError::Hwloc { reason: "hwloc_topology_load failed".into() })?;
    let mut set = CpuSet::new();
    threads.iter().for_each(|&t| set.set(t));
    topo.set_cpubind(set, CpuBindFlags::CPUBIND_PROCESS).map_err(|e| TopologyError::Hwloc {
        reason: format!("binding to threads {}: {e:?}", format_index_list(threads)),
    })
}

/// The largest `t` dividing the world such that every run of `t` consecutive ranks starting at
/// a multiple of `t` lies on one node: TP groups up to that size stay on NVLink/xGMI.
pub fn tp_within_node(layout: &WorldLayout, world: usize) -> usize {
    (1..=world.max(1))
        .filter(|t| world.is_multiple_of(*t))
        .filter(|&t| (0..world).all(|r| layout.node_of(r) == layout.node_of(r - r % t)))
        .max()
        .unwrap_or(1)
}

/// Everything `nereus inspect topology` reports about one rank.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RankPlacement {
    /// World rank.
    pub rank: i32,
    /// Host name.
    pub hostname: String,
    /// Node index in the world layout.
    pub node: usize,
    /// Position among the ranks of its node.
    pub local_rank: usize,
    /// CPU binding.
    pub binding: CpuBinding,
    /// Device this rank drives.
    pub device: DeviceAssignment,
    /// How the rank was started.
    pub launcher: Launcher,
    /// The cores closest to its GPU and NIC (`None` for a rank without a GPU).
    #[serde(default)]
    pub closest: Option<Placement>,
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A LUMI-G node in small: 2 NUMA domains of 2 L3 domains of 2 cores (one thread each),
    /// 4 GCDs, two per NUMA domain.
    fn lumi_like() -> (Vec<Core>, Vec<Locality>) {
        let cores = (0..8).map(|i| Core { os_index: i, threads: vec![i], l3: i as usize / 2 }).collect();
        let numa = |n: u32| Locality { cpus: (4 * n..4 * n + 4).collect(), numa: Some(n) };
        (cores, vec![numa(0), numa(0), numa(1), numa(1)])
    }

    #[test]
    fn each_gpu_gets_its_own_l3_domain_near_it() {
        let (cores, gpus) = lumi_like();
        let assigned: Vec<Option<u32>> = (0..4).map(Some).collect();
        let placed: Vec<Vec<u32>> =
            (0..4).map(|r| closest_cores(&cores, &gpus, &assigned, r, &[]).unwrap().cores).collect();
        assert_eq!(placed, [vec![0, 1], vec![2, 3], vec![4, 5], vec![6, 7]]);
        let p = closest_cores(&cores, &gpus, &assigned, 2, &[]).unwrap();
        assert_eq!((p.gpu_numa, p.reason.as_str()), (Some(1), "L3 domain of gpu 2"));
    }

    #[test]
    fn ranks_sharing_a_gpu_split_its_cores_and_cpu_ranks_get_none() {
        let (cores, gpus) = lumi_like();
        let assigned = [Some(3), Some(3), None];
        let a = closest_cores(&cores, &gpus, &assigned, 0, &[]).unwrap();
        let b = closest_cores(&cores, &gpus, &assigned, 1, &[]).unwrap();
        assert_eq!((a.cores, b.cores), (vec![6], vec![7]));
        assert!(closest_cores(&cores, &gpus, &assigned, 2, &[]).is_none());
    }

    #[test]
    fn without_l3_structure_gpus_share_local_cores_evenly_and_find_their_nic() {
        let cores: Vec<Core> = (0..12).map(|i| Core { os_index: i, threads: vec![i, i + 12], l3: 0 }).collect();
        let local = Locality { cpus: (0..24).collect(), numa: Some(0) };
        let gpus = vec![local.clone(), local.clone(), local];
        let nic = Nic {
            name: "mlx5_0".into(),
            pci_address: "0000:41:00.0".into(),
            locality: Locality { cpus: vec![5], numa: Some(0) },
        };
        let assigned = [Some(0), Some(1), Some(2)];
        let p = closest_cores(&cores, &gpus, &assigned, 1, std::slice::from_ref(&nic)).unwrap();
        assert_eq!(p.cores, [4, 5, 6, 7]);
        assert_eq!(p.threads, [4, 16, 5, 17, 6, 18, 7, 19]);
        assert_eq!(p.nic.as_deref(), Some("mlx5_0"));
    }

    #[test]
    fn sysfs_locality_and_nics_are_read() {
        let root = tempfile::tempdir().unwrap();
        let (pci, class) = (root.path().join("pci"), root.path().join("class"));
        std::fs::create_dir_all(pci.join("0000:c1:00.0")).unwrap();
        std::fs::write(pci.join("0000:c1:00.0/local_cpulist"), "48-63\n").unwrap();
        std::fs::write(pci.join("0000:c1:00.0/numa_node"), "3\n").unwrap();
        std::fs::create_dir_all(class.join("cxi/cxi0")).unwrap();
        std::os::unix::fs::symlink("../../../devices/pci0000:c0/0000:c1:00.0", class.join("cxi/cxi0/device")).unwrap();
        let l = locality(&pci, "0000:c1:00.0");
        assert_eq!((l.cpus.len(), l.cpus[0], l.numa), (16, 48, Some(3)));
        let nics = scan_nics(&class, &pci);
        assert_eq!(nics.len(), 1);
        assert_eq!((nics[0].name.as_str(), nics[0].locality.numa), ("cxi0", Some(3)));
        assert_eq!(locality(&pci, "0000:00:00.0"), Locality::default());
    }

    #[test]
    fn consecutive_ranks_on_one_node_bound_the_tp_size() {
        let hosts = |h: &[&str]| WorldLayout::from_hostnames(&h.iter().map(|s| s.to_string()).collect::<Vec<_>>());
        assert_eq!(tp_within_node(&hosts(&["a", "a", "a", "a", "b", "b", "b", "b"]), 8), 4);
        assert_eq!(tp_within_node(&hosts(&["a", "b", "a", "b"]), 4), 1, "round-robin mapping splits every pair");
        assert_eq!(tp_within_node(&hosts(&["a", "a", "a"]), 3), 3);
    }

    #[test]
    fn this_machine_has_cores_with_threads() {
        let cores = cores().unwrap();
        assert!(!cores.is_empty() && cores.iter().all(|c| !c.threads.is_empty()));
    }
}
