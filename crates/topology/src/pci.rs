//! GPU discovery from the PCI bus in Linux sysfs.
//!
//! This is the same source hwloc's Linux PCI backend reads. We read it directly because the
//! `hwloc2` 2.2 binding does not expose hwloc's I/O-device filters or object info attributes, so
//! through it a topology never contains PCI or OS devices.

use serde::{Deserialize, Serialize};
use std::path::Path;

/// GPU vendor, from the PCI vendor id.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum GpuVendor {
    /// PCI vendor 0x10de.
    Nvidia,
    /// PCI vendor 0x1002.
    Amd,
}

/// One GPU (or one MI250X GCD, which appears as its own PCI function) on this node.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct GpuInfo {
    /// Vendor.
    pub vendor: GpuVendor,
    /// PCI address, e.g. `0000:c1:00.0`.
    pub pci_address: String,
    /// PCI device id.
    pub device_id: u16,
    /// Marketing name when the device id is in [`KNOWN_GPUS`].
    pub model: Option<String>,
    /// Device memory in bytes when the driver exposes it in sysfs (amdgpu does).
    pub memory_bytes: Option<u64>,
}

/// Data-center GPUs Nereus knows the datasheet figures of.
pub struct KnownGpu {
    /// Vendor.
    pub vendor: GpuVendor,
    /// PCI device id (from the PCI ID repository).
    pub device_id: u16,
    /// Marketing name.
    pub model: &'static str,
    /// Dense bf16 peak per device in TFLOP/s (vendor datasheets; one GCD for MI250X).
    pub peak_tflops: f64,
    /// Device-to-device bandwidth inside a node in GB/s (NVLink, Infinity Fabric).
    pub intra_node_gbps: f64,
    /// Device memory in GB, for drivers that do not expose it in sysfs.
    pub memory_gb: f64,
    /// Memory bandwidth in GB/s.
    pub hbm_gbps: f64,
}

/// The table behind cluster detection for GPUs (figures as in `configs/clusters/*.toml`).
pub const KNOWN_GPUS: &[KnownGpu] = &[
    KnownGpu {
        vendor: GpuVendor::Nvidia,
        device_id: 0x2335,
        model: "H200 SXM 141GB",
        peak_tflops: 989.0,
        intra_node_gbps: 900.0,
        memory_gb: 141.0,
        hbm_gbps: 4800.0,
    },
    KnownGpu {
        vendor: GpuVendor::Nvidia,
        device_id: 0x2330,
        model: "H100 SXM5 80GB",
        peak_tflops: 989.0,
        intra_node_gbps: 900.0,
        memory_gb: 80.0,
        hbm_gbps: 3350.0,
    },
    KnownGpu {
        vendor: GpuVendor::Nvidia,
        device_id: 0x20b2,
        model: "A100 SXM4 80GB",
        peak_tflops: 312.0,
        intra_node_gbps: 600.0,
        memory_gb: 80.0,
        hbm_gbps: 2039.0,
    },
    KnownGpu {
        vendor: GpuVendor::Nvidia,
        device_id: 0x20b0,
        model: "A100 SXM4 40GB",
        peak_tflops: 312.0,
        intra_node_gbps: 600.0,
        memory_gb: 40.0,
        hbm_gbps: 1555.0,
    },
    KnownGpu {
        vendor: GpuVendor::Amd,
        device_id: 0x7408,
        model: "Instinct MI250X (one GCD)",
        peak_tflops: 191.5,
        intra_node_gbps: 400.0,
        memory_gb: 64.0,
        hbm_gbps: 1600.0,
    },
    KnownGpu {
        vendor: GpuVendor::Amd,
        device_id: 0x740c,
        model: "Instinct MI250X/MI250 (one GCD)",
        peak_tflops: 181.0,
        intra_node_gbps: 400.0,
        memory_gb: 64.0,
        hbm_gbps: 1600.0,
    },
    KnownGpu {
        vendor: GpuVendor::Amd,
        device_id: 0x74a1,
        model: "Instinct MI300X",
        peak_tflops: 1307.4,
        intra_node_gbps: 896.0,
        memory_gb: 192.0,
        hbm_gbps: 5300.0,
    },
];

impl GpuInfo {
    /// The datasheet entry for this device, if known.
    pub fn known(&self) -> Option<&'static KnownGpu> {
        KNOWN_GPUS.iter().find(|k| k.vendor == self.vendor && k.device_id == self.device_id)
    }
}

/// Lists the GPUs under a sysfs PCI device directory (normally `/sys/bus/pci/devices`), sorted
/// by PCI address, which is the order CUDA (`CUDA_DEVICE_ORDER=PCI_BUS_ID`) and ROCm enumerate.
pub fn scan_gpus(pci_devices: &Path) -> Vec<GpuInfo> {
    let Ok(entries) = std::fs::read_dir(pci_devices) else {
        return Vec::new();
    };
    let mut gpus: Vec<GpuInfo> =
        entries.flatten().filter_map(|entry| read_gpu(&entry.path(), &entry.file_name().to_string_lossy())).collect();
    gpus.sort_by(|a, b| a.pci_address.cmp(&b.pci_address));
    gpus
}

fn read_gpu(dir: &Path, address: &str) -> Option<GpuInfo> {
    let hex = |file: &str| -> Option<u32> {
        let text = std::fs::read_to_string(dir.join(file)).ok()?;
        u32::from_str_radix(text.trim().trim_start_matches("0x"), 16).ok()
    };
    let vendor = match hex("vendor")? {
        0x10de => GpuVendor::Nvidia,
        0x1002 => GpuVendor::Amd,
        _ => return None,
    };
    let class = hex("class")?;
    // 0x03xxxx: display controllers (VGA, 3D); 0x1200xx: processing accelerators.
    if class >> 16 != 0x03 && class >> 8 != 0x1200 {
        return None;
    }
    let device_id = u16::try_from(hex("device")?).ok()?;
    let memory_bytes =
        std::fs::read_to_string(dir.join("mem_info_vram_total")).ok().and_then(|t| t.trim().parse().ok());
    let mut gpu = GpuInfo { vendor, pci_address: address.to_string(), device_id, model: None, memory_bytes };
    gpu.model = gpu.known().map(|k| k.model.to_string());
    Some(gpu)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fake_device(root: &Path, address: &str, vendor: &str, class: &str, device: &str, vram: Option<&str>) {
        let dir = root.join(address);
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("vendor"), vendor).unwrap();
        std::fs::write(dir.join("class"), class).unwrap();
        std::fs::write(dir.join("device"), device).unwrap();
        if let Some(v) = vram {
            std::fs::write(dir.join("mem_info_vram_total"), v).unwrap();
        }
    }

    #[test]
    fn finds_gpus_and_skips_other_devices_in_pci_order() {
        let root = tempfile::tempdir().unwrap();
        let r = root.path();
        fake_device(r, "0000:d1:00.0", "0x1002\n", "0x038000\n", "0x7408\n", Some("68702699520\n"));
        fake_device(r, "0000:c1:00.0", "0x1002\n", "0x038000\n", "0x7408\n", Some("68702699520\n"));
        fake_device(r, "0000:02:00.0", "0x1a03\n", "0x030000\n", "0x2000\n", None); // BMC VGA
        fake_device(r, "0000:41:00.0", "0x10de\n", "0x020700\n", "0x1021\n", None); // NVIDIA NIC-class
        fake_device(r, "0000:18:00.0", "0x10de\n", "0x030200\n", "0x2335\n", None);
        let gpus = scan_gpus(r);
        let addresses: Vec<&str> = gpus.iter().map(|g| g.pci_address.as_str()).collect();
        assert_eq!(addresses, ["0000:18:00.0", "0000:c1:00.0", "0000:d1:00.0"]);
        assert_eq!(gpus[0].model.as_deref(), Some("H200 SXM 141GB"));
        assert_eq!(gpus[0].memory_bytes, None);
        assert_eq!(gpus[1].vendor, GpuVendor::Amd);
        assert_eq!(gpus[1].memory_bytes, Some(68_702_699_520));
    }

    #[test]
    fn missing_sysfs_means_no_gpus() {
        assert!(scan_gpus(Path::new("/nonexistent/pci")).is_empty());
    }
}
