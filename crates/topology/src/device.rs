//! Which device a rank drives, from the launcher's binding variables and its local rank.
//!
//! LUMI's documented binding gives each rank one GCD through `ROCR_VISIBLE_DEVICES` (a
//! `select_gpu` wrapper, or `srun --gpu-bind`); NVIDIA clusters use `CUDA_VISIBLE_DEVICES`, set
//! by `srun --gpus-per-task`/`--gpu-bind` or not at all. We follow the visible list when there is
//! one and fall back to `local rank mod GPUs on the node`.

use serde::{Deserialize, Serialize};

use super::pci::{GpuInfo, GpuVendor};
use super::MAX_DEVICE_INDEX;
use nereus_core::index_list::parse_index_list;

/// The device one rank drives.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct DeviceAssignment {
    /// Index of the GPU on its node, in PCI order; `None` for a CPU-only rank.
    pub gpu: Option<u32>,
    /// PCI address of that GPU.
    pub pci_address: Option<String>,
    /// Why this device: the variable that chose it, or the fallback rule.
    pub reason: String,
}

impl DeviceAssignment {
    /// `gpu 3 (0000:c1:00.0; ROCR_VISIBLE_DEVICES=3)` or `cpu (no GPU on this node)`.
    pub fn describe(&self) -> String {
        match (self.gpu, &self.pci_address) {
            (Some(g), Some(addr)) => format!("gpu {g} ({addr}; {})", self.reason),
            _ => format!("cpu ({})", self.reason),
        }
    }
}

/// Chooses the device of the rank with `local_rank` on a node with `gpus`.
pub fn assign_device(local_rank: usize, gpus: &[GpuInfo], env: &dyn Fn(&str) -> Option<String>) -> DeviceAssignment {
    let Some(first) = gpus.first() else {
        return DeviceAssignment { gpu: None, pci_address: None, reason: "no GPU on this node".into() };
    };
    let variables: &[&str] = match first.vendor {
        GpuVendor::Amd => &["ROCR_VISIBLE_DEVICES", "HIP_VISIBLE_DEVICES"],
        GpuVendor::Nvidia => &["CUDA_VISIBLE_DEVICES"],
    };
    let chosen = |index: usize, reason: String| DeviceAssignment {
        gpu: Some(index as u32),
        pci_address: gpus.get(index).map(|g| g.pci_address.clone()),
        reason,
    };
    for var in variables {
        let Some(value) = env(var) else { continue };
        return match parse_index_list(&value, MAX_DEVICE_INDEX) {
            Ok(visible) if !visible.is_empty() => {
                let index = visible[local_rank % visible.len()] as usize;
                if index >= gpus.len() {
                    DeviceAssignment {
                        gpu: None,
                        pci_address: None,
                        reason: format!("{var}={value} names GPU {index}, but the node has {}", gpus.len()),
                    }
                } else {
                    chosen(index, format!("{var}={value}"))
                }
            }
            _ => DeviceAssignment {
                gpu: None,
                pci_address: None,
                reason: format!("{var}={value:?} is not a list of GPU indices"),
            },
        };
    }
    chosen(
        local_rank % gpus.len(),
        format!("local rank {local_rank} of a node with {} GPUs; no visible-devices variable set", gpus.len()),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn gpus(vendor: GpuVendor, n: usize) -> Vec<GpuInfo> {
        (0..n)
            .map(|i| GpuInfo {
                vendor,
                pci_address: format!("0000:{:02x}:00.0", i + 1),
                device_id: 0,
                model: None,
                memory_bytes: None,
            })
            .collect()
    }

    #[test]
    fn visible_list_wins_over_local_rank() {
        let amd = gpus(GpuVendor::Amd, 8);
        let env = |k: &str| (k == "ROCR_VISIBLE_DEVICES").then(|| "6".to_string());
        let a = assign_device(1, &amd, &env);
        assert_eq!(a.gpu, Some(6));
        assert_eq!(a.pci_address.as_deref(), Some("0000:07:00.0"));
        let list = |k: &str| (k == "CUDA_VISIBLE_DEVICES").then(|| "2,3".to_string());
        assert_eq!(assign_device(1, &gpus(GpuVendor::Nvidia, 4), &list).gpu, Some(3));
    }

    #[test]
    fn fallback_is_local_rank_modulo_gpus_and_cpu_without_gpus() {
        let none = |_: &str| None;
        assert_eq!(assign_device(5, &gpus(GpuVendor::Nvidia, 4), &none).gpu, Some(1));
        assert_eq!(assign_device(0, &[], &none).gpu, None);
    }

    #[test]
    fn out_of_range_or_uuid_lists_are_reported_not_guessed() {
        let bad = |k: &str| (k == "CUDA_VISIBLE_DEVICES").then(|| "GPU-5a1b".to_string());
        let a = assign_device(0, &gpus(GpuVendor::Nvidia, 4), &bad);
        assert_eq!(a.gpu, None);
        assert!(a.reason.contains("GPU-5a1b"));
        let high = |k: &str| (k == "CUDA_VISIBLE_DEVICES").then(|| "9".to_string());
        assert!(assign_device(0, &gpus(GpuVendor::Nvidia, 4), &high).reason.contains("has 4"));
    }
}
