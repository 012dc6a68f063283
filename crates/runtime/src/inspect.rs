//! `nereus inspect topology`: where every rank of the job sits.

use serde::{Deserialize, Serialize};
use std::io::Write;

use nereus_exec::backend::{self, DriverDevice};
use nereus_exec::comm::{gather_bytes_to_root, CommError};
use nereus_topology::{assign_device, tp_within_node, CpuBinding, GpuVendor, NodeTopology, RankPlacement};

use super::{RuntimeError, Session};

/// What one rank reports to rank 0: its placement, and its node's hardware if it is the node's
/// first rank (so each node is described once).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct RankReport {
    /// Where the rank runs.
    pub placement: RankPlacement,
    /// The node's hardware (first rank of each node only).
    pub node: Option<NodeReport>,
}

/// A node's hardware, and its devices as the compiled-in driver sees them.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct NodeReport {
    /// hwloc and PCI view.
    pub topology: NodeTopology,
    /// Devices from the CUDA or HIP driver, when this binary has that backend and a driver loads.
    pub driver_devices: Option<Vec<DriverDevice>>,
    /// Why there are no driver devices, when a backend was expected to give some.
    pub driver_note: Option<String>,
}

/// The whole job's topology as rank 0 prints it (`--json` gives this object).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct TopologyReport {
    /// Number of ranks.
    pub world_size: i32,
    /// Number of nodes.
    pub nodes: usize,
    /// The MPI library.
    pub mpi: String,
    /// The largest TP group of consecutive ranks that stays inside one node under this launch.
    pub tp_within_node: usize,
    /// One entry per node, in node order.
    pub node_reports: Vec<NodeReport>,
    /// One entry per rank, in rank order.
    pub ranks: Vec<RankPlacement>,
}

/// Every rank discovers its placement; rank 0 gathers and prints the job's topology.
pub fn topology(session: &Session, json: bool) -> Result<(), RuntimeError> {
    let report = local_report(session)?;
    let bytes = serde_json::to_vec(&report).expect("rank reports always serialize");
    let gathered = gather_bytes_to_root(session.world(), session.watchdog(), "topology gather", &bytes)?;
    let Some(gathered) = gathered else { return Ok(()) };
    let mut node_reports = Vec::new();
    let mut ranks = Vec::new();
    for (rank, bytes) in gathered.iter().enumerate() {
        let r: RankReport = serde_json::from_slice(bytes).map_err(|e| CommError::Decode {
            op: "topology gather".into(),
            group: session.world().describe(),
            rank: rank as i32,
            reason: e.to_string(),
        })?;
        node_reports.extend(r.node);
        ranks.push(r.placement);
    }
    let report = TopologyReport {
        world_size: session.world().size(),
        nodes: session.layout().nodes(),
        mpi: session.world().library_version(),
        tp_within_node: tp_within_node(session.layout(), session.world().size() as usize),
        node_reports,
        ranks,
    };
    let mut out = std::io::stdout().lock();
    if json {
        writeln!(out, "{}", serde_json::to_string_pretty(&report).expect("reports always serialize"))
            .map_err(RuntimeError::Stdout)?;
    } else {
        print_topology(&mut out, &report).map_err(RuntimeError::Stdout)?;
    }
    Ok(())
}

fn local_report(session: &Session) -> Result<RankReport, RuntimeError> {
    let rank = session.rank();
    let local_rank = session.layout().local_rank(rank as usize);
    let node = NodeTopology::discover(session.hostname())?;
    let placement = RankPlacement {
        rank,
        hostname: session.hostname().to_string(),
        node: session.layout().node_of(rank as usize),
        local_rank,
        binding: CpuBinding::of_this_process()?,
        device: assign_device(local_rank, &node.gpus, &|k| std::env::var(k).ok()),
        launcher: session.launcher().clone(),
        closest: super::device::placement(session)?,
    };
    let node = (local_rank == 0).then(|| node_report(node));
    Ok(RankReport { placement, node })
}

fn node_report(topology: NodeTopology) -> NodeReport {
    let query = match topology.gpus.first().map(|g| g.vendor) {
        Some(GpuVendor::Nvidia) if cfg!(feature = "cuda") => Some(backend::cuda_devices()),
        Some(GpuVendor::Amd) if cfg!(feature = "rocm") => Some(backend::rocm_devices()),
        _ => None,
    };
    let (driver_devices, driver_note) = match query {
        Some(Ok(devices)) => (Some(devices), None),
        Some(Err(e)) => (None, Some(e.to_string())),
        None => (None, None),
    };
    NodeReport { topology, driver_devices, driver_note }
}

fn print_topology(out: &mut impl Write, report: &TopologyReport) -> std::io::Result<()> {
    let launcher = report.ranks.first().map_or_else(String::new, |r| r.launcher.describe());
    writeln!(out, "{} ranks on {} node(s), launched by {launcher}; {}", report.world_size, report.nodes, report.mpi)?;
    writeln!(
        out,
        "consecutive ranks share a node in runs of {}: TP groups of up to {} ranks stay on NVLink/xGMI",
        report.tp_within_node, report.tp_within_node
    )?;
    for (index, n) in report.node_reports.iter().enumerate() {
        let t = &n.topology;
        let gpus = if t.gpus.is_empty() {
            "no GPUs".to_string()
        } else {
            let model = t.gpus[0]
                .model
                .clone()
                .unwrap_or_else(|| format!("{:?} device {:04x}", t.gpus[0].vendor, t.gpus[0].device_id));
            format!("{} GPUs ({model})", t.gpus.len())
        };
        writeln!(
            out,
            "node {index} {}: {} package(s), {} NUMA domain(s), {} cores, {} hardware threads, {:.1} GiB, {gpus}",
            t.hostname,
            t.packages,
            t.numa_domains,
            t.cores,
            t.hardware_threads,
            t.memory_bytes as f64 / (1u64 << 30) as f64
        )?;
        for d in n.driver_devices.iter().flatten() {
            writeln!(out, "  driver device {}: {}, {:.1} GB", d.ordinal, d.name, d.memory_bytes as f64 / 1e9)?;
        }
        if let Some(note) = &n.driver_note {
            writeln!(out, "  driver: {note}")?;
        }
    }
    for r in &report.ranks {
        writeln!(
            out,
            "rank {}: node {} ({}), local rank {}, {}, device {}",
            r.rank,
            r.node,
            r.hostname,
            r.local_rank,
            r.binding.describe(),
            r.device.describe()
        )?;
        if let Some(p) = &r.closest {
            writeln!(out, "  closest to gpu {}: {}", p.gpu, p.describe())?;
        }
    }
    Ok(())
}
