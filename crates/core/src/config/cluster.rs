//! `[cluster]`: the machine the job runs on — nodes, devices, memory, compute and links.
//!
//! Values come in layers, later ones winning: detection (`detect = true`, from hwloc and the
//! launcher) < an included cluster file (`include = "clusters/h200.toml"`) < keys written in the
//! job file's own `[cluster]` section < CLI flags. [`ClusterSection`] is one such layer (every
//! key optional); [`ClusterSpec`] is the resolved, complete, validated result.

use serde::{Deserialize, Serialize};
use std::path::PathBuf;

use super::{check, ConfigError, DeviceChoice};

/// Which library moves tensors between ranks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum DataPlane {
    /// MPI over host memory: CPU-only machines and every test.
    Mpi,
    /// NCCL over device memory (NVIDIA GPUs, InfiniBand); needs the `cuda` feature.
    Nccl,
    /// RCCL over device memory (AMD GPUs, Slingshot); needs the `rocm` feature.
    Rccl,
}

impl DataPlane {
    /// Seconds a transition primitive is charged for setting up a communicator for its rank
    /// set. MPI's groups are sub-communicators of the world, made by one local collective over
    /// shared memory and cached per rank set (about 0.1 ms); NCCL and RCCL bootstrap a
    /// communicator (`ncclCommInitRank`) over the network, tens of milliseconds at scale (an
    /// assumption until measured on a device; docs/cost-model.md).
    pub fn communicator_setup_s(self) -> f64 {
        match self {
            DataPlane::Mpi => 1e-4,
            DataPlane::Nccl | DataPlane::Rccl => 0.05,
        }
    }
}

/// One layer of `[cluster]` values, as written in a TOML file; unset keys are `None`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ClusterSection {
    /// A cluster file (a TOML file holding one `[cluster]` table) whose values this section
    /// extends; relative paths resolve against the including file's directory.
    pub include: Option<PathBuf>,
    /// Fill every key left unset from hwloc and the launcher (node count, devices, memory).
    pub detect: Option<bool>,
    /// Cluster name, for logs and reports (e.g. `lumi-g`).
    pub name: Option<String>,
    /// Number of nodes.
    pub nodes: Option<u32>,
    /// Accelerators (GPUs, or GCDs on MI250X) per node; on CPU-only machines, ranks per node.
    pub devices_per_node: Option<u32>,
    /// Memory of one device in GB (10^9 bytes).
    pub device_memory_gb: Option<f64>,
    /// Dense peak of one device in TFLOP/s at the models' dtype.
    pub device_peak_tflops: Option<f64>,
    /// Memory bandwidth of one device in GB/s (HBM; decode is bound by it).
    pub device_hbm_gbps: Option<f64>,
    /// Device-to-device bandwidth inside a node in GB/s per direction (NVLink, Infinity Fabric).
    pub intra_node_gbps: Option<f64>,
    /// Network interfaces per node (Slingshot or InfiniBand NICs).
    pub nics_per_node: Option<u32>,
    /// Bandwidth of one NIC in GB/s per direction.
    pub nic_gbps: Option<f64>,
    /// Bandwidth between one device and its host's memory in GB/s per direction (PCIe, NVLink-C2C,
    /// Infinity Fabric): how fast a transition may stage state through host memory. Default: the
    /// device memory bandwidth on the MPI data plane (host memory is the device), else 25.
    pub host_link_gbps: Option<f64>,
    /// CPU cores per node, where ranks stand in for devices and may share cores (detected on
    /// CPU-only nodes): a pass on `r` ranks of a node gets `min(1, cores / r)` of a device's peak.
    pub cores_per_node: Option<u32>,
    /// Data plane for tensors: `mpi`, `nccl` or `rccl`.
    pub data_plane: Option<DataPlane>,
    /// The device `nereus train` keeps state on and computes with: `cuda`, `rocm`, `emulated`
    /// (host memory posing as a device, for tests) or `auto`. Unset: the host on `mpi`, CUDA on
    /// `nccl`, ROCm on `rccl`. `--device` replaces it.
    pub device: Option<DeviceChoice>,
}

/// The resolved `[cluster]`: every value known and validated.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ClusterSpec {
    /// Cluster name.
    pub name: String,
    /// Number of nodes.
    pub nodes: u32,
    /// Devices per node.
    pub devices_per_node: u32,
    /// Memory of one device in GB (10^9 bytes).
    pub device_memory_gb: f64,
    /// Dense peak of one device in TFLOP/s.
    pub device_peak_tflops: f64,
    /// Memory bandwidth of one device, GB/s.
    pub device_hbm_gbps: f64,
    /// Intra-node device-to-device bandwidth, GB/s per direction.
    pub intra_node_gbps: f64,
    /// NICs per node.
    pub nics_per_node: u32,
    /// Bandwidth of one NIC, GB/s per direction.
    pub nic_gbps: f64,
    /// Device-to-host bandwidth, GB/s per direction.
    pub host_link_gbps: f64,
    /// CPU cores per node when ranks may share them (CPU-only nodes).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cores_per_node: Option<u32>,
    /// Data plane for tensors.
    pub data_plane: DataPlane,
    /// The device chosen in the job (`cluster.device` or `--device`); `None`: the host engine
    /// on `mpi`, see [`ClusterSpec::train_device`].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub device: Option<DeviceChoice>,
}

impl ClusterSpec {
    /// The device `nereus train` runs on: `cluster.device` when set (`auto` resolved by the data
    /// plane: CUDA on NCCL, ROCm on RCCL), else CUDA on NCCL, ROCm on RCCL, and `None` (the host
    /// reference engine) on MPI.
    pub fn train_device(&self) -> Option<DeviceChoice> {
        let by_plane = match self.data_plane {
            DataPlane::Mpi => None,
            DataPlane::Nccl => Some(DeviceChoice::Cuda),
            DataPlane::Rccl => Some(DeviceChoice::Rocm),
        };
        match self.device {
            Some(DeviceChoice::Auto) => by_plane.or(Some(DeviceChoice::Auto)),
            chosen => chosen.or(by_plane),
        }
    }

    /// Total devices (and so the largest rank count a plan may use; validation bounds the
    /// product, so it cannot wrap).
    pub fn devices(&self) -> u32 {
        self.nodes.saturating_mul(self.devices_per_node)
    }

    /// Bytes of memory per device.
    pub fn device_memory_bytes(&self) -> u64 {
        (self.device_memory_gb * 1e9) as u64
    }

    /// Injection bandwidth of one node into the network, GB/s per direction.
    pub fn inter_node_gbps(&self) -> f64 {
        f64::from(self.nics_per_node) * self.nic_gbps
    }
}

/// A cluster file: exactly one `[cluster]` table.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ClusterFile {
    /// The cluster's values.
    pub cluster: ClusterSection,
}

impl ClusterSection {
    /// Returns `self` with every key that `over` sets replaced by `over`'s value.
    pub fn overlaid_with(self, over: ClusterSection) -> ClusterSection {
        ClusterSection {
            include: over.include.or(self.include),
            detect: over.detect.or(self.detect),
            name: over.name.or(self.name),
            nodes: over.nodes.or(self.nodes),
            devices_per_node: over.devices_per_node.or(self.devices_per_node),
            device_memory_gb: over.device_memory_gb.or(self.device_memory_gb),
            device_peak_tflops: over.device_peak_tflops.or(self.device_peak_tflops),
            device_hbm_gbps: over.device_hbm_gbps.or(self.device_hbm_gbps),
            intra_node_gbps: over.intra_node_gbps.or(self.intra_node_gbps),
            nics_per_node: over.nics_per_node.or(self.nics_per_node),
            nic_gbps: over.nic_gbps.or(self.nic_gbps),
            host_link_gbps: over.host_link_gbps.or(self.host_link_gbps),
            cores_per_node: over.cores_per_node.or(self.cores_per_node),
            data_plane: over.data_plane.or(self.data_plane),
            device: over.device.or(self.device),
        }
    }

    /// Completes this layer into a [`ClusterSpec`], naming the first missing or invalid key.
    pub fn resolve(&self) -> Result<ClusterSpec, ConfigError> {
        fn need<T: Clone>(key: &str, v: &Option<T>) -> Result<T, ConfigError> {
            v.clone().ok_or_else(|| ConfigError::Missing {
                key: format!("cluster.{key}"),
                hint: "set it in [cluster], include a cluster file (`include = \"clusters/h200.toml\"` \
                       or `--cluster FILE`), or set `cluster.detect = true`"
                    .into(),
            })
        }
        let data_plane = self.data_plane.unwrap_or(DataPlane::Mpi);
        let device_hbm_gbps = need("device_hbm_gbps", &self.device_hbm_gbps)?;
        // Host memory is the device's own on the MPI data plane; a GPU's host link defaults to
        // what a PCIe 4.0 x16 slot carries in practice.
        let host_link_gbps =
            self.host_link_gbps.unwrap_or(if data_plane == DataPlane::Mpi { device_hbm_gbps } else { 25.0 });
        let spec = ClusterSpec {
            name: self.name.clone().unwrap_or_else(|| "unnamed".into()),
            nodes: need("nodes", &self.nodes)?,
            devices_per_node: need("devices_per_node", &self.devices_per_node)?,
            device_memory_gb: need("device_memory_gb", &self.device_memory_gb)?,
            device_peak_tflops: need("device_peak_tflops", &self.device_peak_tflops)?,
            device_hbm_gbps,
            intra_node_gbps: need("intra_node_gbps", &self.intra_node_gbps)?,
            nics_per_node: need("nics_per_node", &self.nics_per_node)?,
            nic_gbps: need("nic_gbps", &self.nic_gbps)?,
            host_link_gbps,
            cores_per_node: self.cores_per_node,
            data_plane,
            device: self.device,
        };
        spec.validate()?;
        Ok(spec)
    }
}

impl ClusterSpec {
    /// Checks ranges; errors name the key under `cluster.`.
    pub fn validate(&self) -> Result<(), ConfigError> {
        check::at_least_one("cluster.nodes", self.nodes)?;
        check::at_least_one("cluster.devices_per_node", self.devices_per_node)?;
        let devices = u64::from(self.nodes) * u64::from(self.devices_per_node);
        if devices > u64::from(check::MAX_DEVICES) {
            return Err(ConfigError::invalid(
                "cluster.nodes",
                self.nodes,
                format!(
                    "times cluster.devices_per_node ({}) gives {devices} devices; at most {} are supported",
                    self.devices_per_node,
                    check::MAX_DEVICES
                ),
            ));
        }
        if !(self.device_memory_gb > 0.0 && self.device_memory_gb <= check::MAX_DEVICE_MEMORY_GB) {
            return Err(ConfigError::invalid(
                "cluster.device_memory_gb",
                check::show(self.device_memory_gb),
                format!(
                    "must be greater than 0 and at most {} (GB per device: no accelerator or node holds more)",
                    check::show(check::MAX_DEVICE_MEMORY_GB)
                ),
            ));
        }
        check::positive("cluster.device_peak_tflops", self.device_peak_tflops)?;
        check::positive("cluster.device_hbm_gbps", self.device_hbm_gbps)?;
        check::positive("cluster.intra_node_gbps", self.intra_node_gbps)?;
        check::at_least_one("cluster.nics_per_node", self.nics_per_node)?;
        check::positive("cluster.nic_gbps", self.nic_gbps)?;
        check::positive("cluster.host_link_gbps", self.host_link_gbps)?;
        if let Some(cores) = self.cores_per_node {
            check::at_least_one("cluster.cores_per_node", cores)?;
        }
        Ok(())
    }
}
