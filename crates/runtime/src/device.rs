//! `--device`: opening each rank's GPU and the GPU data plane for selftests and benchmarks.
//!
//! Every rank opens the device the topology layer assigns it (the GPU at its PCI address, found
//! among the driver's visible devices), the collective library, and then, together, the
//! [`GpuPlane`]. A rank that cannot open its device still joins one agreement, so all ranks stop
//! together: a binary without the backend says "not compiled with … support", a machine without
//! a usable GPU "no … device visible", both with exit status 2.

use std::path::Path;
use std::rc::Rc;

use nereus_exec::backend::emulated::Emulated;
use nereus_exec::backend::gpu::{Device, GpuRuntime};
use nereus_exec::backend::BackendError;
use nereus_exec::comm::collectives::CollectiveLib;
use nereus_exec::comm::emulated_collectives::MpiCollectives;
use nereus_exec::comm::gpu_plane::GpuPlane;
use nereus_exec::comm::{agree, all_gather_bytes, MpiPlane};
use nereus_exec::emu::DeviceMemory;
use nereus_topology::placement::{bind, cores, locality, scan_nics};
use nereus_topology::{assign_device, closest_cores, CpuBinding, NodeTopology, Placement};

use nereus_core::config::DeviceChoice;

use super::{RuntimeError, Session};

/// Capacity of an emulated device (allocated only as shards are made), unless
/// `NEREUS_EMULATED_DEVICE_BYTES` gives another: a smaller device than the job's
/// `cluster.device_memory_gb`, as a mis-sized cluster file meets on real GPUs.
const EMULATED_DEVICE_BYTES: u64 = 64 << 30;

fn emulated_device_bytes() -> u64 {
    std::env::var("NEREUS_EMULATED_DEVICE_BYTES").ok().and_then(|v| v.parse().ok()).unwrap_or(EMULATED_DEVICE_BYTES)
}

/// The GPU data plane over MPI control, as [`open_device`] opens it.
pub type Plane<'w> = GpuPlane<'w, MpiPlane<'w>>;

/// A runtime and a collective library that one rank opened, before every rank has agreed.
type Opened<'w> = Result<(Box<dyn GpuRuntime>, Box<dyn CollectiveLib + 'w>), BackendError>;

fn not_compiled(what: &str, backend: &'static str, feature: &'static str) -> RuntimeError {
    BackendError::NotCompiled { what: what.into(), backend, feature }.into()
}

/// Where this rank should run: the cores closest to the GPU the topology layer assigns it
/// (every rank calls it: the node's assignments are gathered, since each rank may see its own
/// visible-devices variable). `None` on a rank without a GPU.
pub fn placement(session: &Session) -> Result<Option<Placement>, RuntimeError> {
    let (rank, layout) = (session.rank() as usize, session.layout());
    let node = NodeTopology::discover(session.hostname())?;
    let mine = assign_device(layout.local_rank(rank), &node.gpus, &|k| std::env::var(k).ok()).gpu;
    let all = all_gather_bytes(
        session.world(),
        session.watchdog(),
        "GPU assignment exchange",
        &mine.unwrap_or(u32::MAX).to_le_bytes(),
    )?;
    let mut assigned = vec![None; layout.max_ranks_per_node()];
    for (r, bytes) in all.iter().enumerate().filter(|(r, _)| layout.node_of(*r) == layout.node_of(rank)) {
        let gpu = u32::from_le_bytes(bytes.as_slice().try_into().unwrap_or([0xff; 4]));
        assigned[layout.local_rank(r)] = (gpu != u32::MAX).then_some(gpu);
    }
    if mine.is_none() {
        return Ok(None);
    }
    let pci = Path::new("/sys/bus/pci/devices");
    let gpus: Vec<_> = node.gpus.iter().map(|g| locality(pci, &g.pci_address)).collect();
    let nics = scan_nics(Path::new("/sys/class"), pci);
    Ok(closest_cores(&cores()?, &gpus, &assigned, layout.local_rank(rank), &nics))
}

/// Binds this rank to the cores closest to its GPU, unless the launcher bound it already or
/// `NEREUS_BIND=none`; returns what it did, for the log.
fn bind_near_gpu(session: &Session) -> Result<Option<String>, RuntimeError> {
    let Some(p) = placement(session)? else { return Ok(None) };
    if std::env::var("NEREUS_BIND").is_ok_and(|v| v == "none") || !CpuBinding::of_this_process()?.unbound {
        return Ok(None);
    }
    bind(&p.threads)?;
    Ok(Some(p.describe()))
}

/// Opens the device of `choice` on every rank (together: a rank that cannot still joins the
/// agreement, so all stop), and returns this rank's GPU data plane and the shard store in the
/// plane's device memory.
pub fn open_device(session: &Session, choice: DeviceChoice) -> Result<(Plane<'_>, DeviceMemory), RuntimeError> {
    if matches!(choice, DeviceChoice::Emulated) || cfg!(any(feature = "cuda", feature = "rocm")) {
        if let Some(bound) = bind_near_gpu(session)? {
            log::info!("rank {} bound to {bound}", session.rank());
        }
    }
    let opened = open_runtime(session, choice)?;
    plane_on(session, opened)
}

/// This rank's runtime and collective library for `choice`; a backend the binary lacks is an
/// error every rank reaches alike (no agreement needed).
fn open_runtime(session: &Session, choice: DeviceChoice) -> Result<Opened<'_>, RuntimeError> {
    match choice {
        DeviceChoice::Emulated => {
            let ordinal = session.layout().local_rank(session.rank() as usize) as u32;
            let runtime: Box<dyn GpuRuntime> = Box::new(Emulated::new(ordinal, emulated_device_bytes()));
            Ok(Ok((runtime, Box::new(MpiCollectives::new(session.world())))))
        }
        DeviceChoice::Auto if cfg!(feature = "cuda") => open_runtime(session, DeviceChoice::Cuda),
        DeviceChoice::Auto if cfg!(feature = "rocm") => open_runtime(session, DeviceChoice::Rocm),
        DeviceChoice::Auto => Err(not_compiled("--device", "CUDA or ROCm", "cuda` or `--features rocm")),
        #[cfg(feature = "cuda")]
        DeviceChoice::Cuda => {
            use nereus_exec::backend::cuda::{devices, ordinal_of, Cuda};
            use nereus_exec::comm::nccl_api::{NcclApi, NCCL};
            Ok(ordinal(session, ordinal_of, devices).and_then(Cuda::open).and_then(|cuda| {
                let nccl = NcclApi::load(&NCCL)?;
                Ok((Box::new(cuda) as Box<dyn GpuRuntime>, Box::new(nccl) as Box<dyn CollectiveLib>))
            }))
        }
        #[cfg(not(feature = "cuda"))]
        DeviceChoice::Cuda => Err(not_compiled("--device cuda", "CUDA", "cuda")),
        #[cfg(feature = "rocm")]
        DeviceChoice::Rocm => {
            use nereus_exec::backend::rocm::{devices, ordinal_of, Hip};
            use nereus_exec::comm::nccl_api::{NcclApi, RCCL};
            Ok(ordinal(session, ordinal_of, devices).and_then(Hip::open).and_then(|hip| {
                let rccl = NcclApi::load(&RCCL)?;
                Ok((Box::new(hip) as Box<dyn GpuRuntime>, Box::new(rccl) as Box<dyn CollectiveLib>))
            }))
        }
        #[cfg(not(feature = "rocm"))]
        DeviceChoice::Rocm => Err(not_compiled("--device rocm", "ROCm", "rocm")),
    }
}

/// The driver ordinal of the GPU the topology layer assigns this rank: the one at its PCI
/// address among the visible devices, else (no PCI bus in sight, say in a container) the local
/// rank modulo the number of visible devices.
#[cfg(any(feature = "cuda", feature = "rocm"))]
fn ordinal(
    session: &Session,
    ordinal_of: fn(&str) -> Result<Option<u32>, BackendError>,
    visible: fn() -> Result<Vec<nereus_exec::backend::DriverDevice>, BackendError>,
) -> Result<u32, BackendError> {
    let local_rank = session.layout().local_rank(session.rank() as usize);
    let gpus = NodeTopology::discover(session.hostname()).map(|n| n.gpus).unwrap_or_default();
    let assigned = assign_device(local_rank, &gpus, &|k| std::env::var(k).ok());
    if let Some(found) = assigned.pci_address.as_deref().map(ordinal_of).transpose()?.flatten() {
        return Ok(found);
    }
    let count = visible()?.len();
    if count == 0 {
        return Err(BackendError::NoDevice { backend: "GPU", reason: "the driver lists no device".into() });
    }
    Ok((local_rank % count) as u32)
}

/// Agrees that every rank opened its device, then builds the plane.
fn plane_on<'w>(session: &'w Session, opened: Opened<'w>) -> Result<(Plane<'w>, DeviceMemory), RuntimeError> {
    let verdict = opened.as_ref().map(|_| 1).map_err(ToString::to_string);
    let agreed = agree(session.world(), session.watchdog(), "device bring-up", verdict);
    let (runtime, lib) = match (opened, agreed) {
        (Err(local), _) => return Err(local.into()),
        (Ok(_), Err(others)) => return Err(others.into()),
        (Ok(pair), Ok(_)) => pair,
    };
    let device = Rc::new(Device::from_boxed(runtime)?);
    let d = device.runtime().device();
    log::info!(
        "rank {} drives {} device {} ({}, {:.1} GB)",
        session.rank(),
        device.runtime().backend(),
        d.ordinal,
        d.name,
        d.memory_bytes as f64 / 1e9
    );
    let world = session.world().size();
    let plane = GpuPlane::new(session.control_plane(), lib, device.clone(), session.watchdog().clone(), world)?;
    Ok((plane, DeviceMemory::new(device)))
}
