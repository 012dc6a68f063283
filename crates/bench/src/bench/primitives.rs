//! `nereus bench primitives`: Split, Merge, Extend and Destroy on units from 1 MiB up, with the
//! point-to-point bandwidth of the same run as the yardstick.
//!
//! Runs on ranks 0 and 1 (other ranks only join the allocation checks). The unit is an f32
//! inference replica of a 2-block model sized to the requested bytes. Per size and repetition:
//! Extend a `(1,1)` replica from rank 0 to rank 1 and Destroy the copy; Split a `(2,1)` replica
//! on ranks 0–1 into two `(1,1)` replicas and Merge them back.
//!
//! With `--device`, the shards are device-resident and move over the GPU data plane (NCCL,
//! RCCL): the yardstick is the library's own send of one unit, every row also reports the bytes
//! actually handed to `ncclSend` (all ranks), and each rank times its device's copy engine
//! (`d2d`) against the pack and unpack kernels on a rectangle of the unit's size (half the
//! columns of a matrix with 8 KiB rows, as a row-parallel weight's TP half). With one rank only
//! the kernel rows run.

use serde::Serialize;
use std::collections::BTreeMap;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::Instant;

use nereus_core::config::Dtype;
use nereus_core::model::{Architecture, Catalogue, Layout, OutputHead};
use nereus_core::plan::{ModelStage, Role, Stage};
use nereus_exec::backend::BackendError;
use nereus_exec::comm::DeviceTransfer;
use nereus_exec::comm::{calm_barrier, DataPlane, GroupId, MpiPlane, Transfer, Watchdog, World};
use nereus_exec::emu::{
    Counters, DeviceMemory, EmuId, EmuSet, Exchange, HostMemory, PrimitiveOptions, PrimitiveReport, ShardMemory,
};
use nereus_kernels::pack::RectCopy;

use super::{machine, median, BenchReport, Floor};
use nereus_core::config::DeviceChoice;
use nereus_runtime::device::{open_device, Plane};
use nereus_runtime::{RuntimeError, Session};

/// Bytes per row of the kernel rectangles: half of a 4096-wide f32 row.
const KERNEL_ROW_BYTES: u64 = 8 << 10;

/// One measurement.
#[derive(Debug, Clone, Serialize)]
pub struct Row {
    /// `extend`, `destroy`, `split`, `merge`, `p2p` (one unit sent point-to-point), or with
    /// `--device` `d2d`, `pack`, `unpack` (one rank's device).
    pub primitive: String,
    /// Bytes of one full copy of the unit's state.
    pub unit_bytes: u64,
    /// Bytes sent over the data plane (all ranks).
    pub bytes_sent: u64,
    /// Bytes the primitive must send: one unit for Extend, the missing shard bytes for Split,
    /// none for Merge (targets resident) and Destroy — what the host plane sends.
    pub expected_bytes: u64,
    /// Median wall time over the repetitions, seconds (between barriers; device work waited for).
    pub seconds: f64,
    /// `bytes_sent / seconds` (the rectangle's bytes for kernel rows), GB/s.
    pub bandwidth_gbps: f64,
    /// Point-to-point bandwidth for the same per-pair message size, GB/s.
    pub p2p_gbps: f64,
    /// `bandwidth_gbps / p2p_gbps` (0 when nothing is sent).
    pub fraction_of_p2p: f64,
    /// With `--device`: bytes handed to the library's send, all ranks.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub device_bytes_sent: Option<u64>,
    /// Kernel rows: the device-to-device copy bandwidth of the same bytes, GB/s.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub d2d_gbps: Option<f64>,
    /// Kernel rows: `bandwidth_gbps / d2d_gbps`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub fraction_of_d2d: Option<f64>,
}

/// A 2-block f32 model of about `bytes` bytes (48·h² parameters), TP-divisible by 2.
fn unit_architecture(bytes: u64) -> Architecture {
    let h = (((bytes as f64 / 4.0 / 48.0).sqrt() / 16.0).round() as u64).max(1) * 16;
    Architecture {
        vocab: 8 * h,
        hidden: h,
        layers: 2,
        heads: 8,
        kv_heads: 8,
        head_dim: h / 8,
        ffn: 4 * h,
        tie_embeddings: false,
        qk_norm: false,
        head: OutputHead::Lm,
        dtype: Dtype::F32,
    }
}

/// What the benchmark needs from a plane besides moving bytes.
pub(crate) trait Measured: DataPlane {
    /// Waits for work queued on the device (nothing for host memory).
    fn settle(&self) -> Result<(), RuntimeError>;
    /// Bytes this rank has handed to the collective library's send (`None` over MPI).
    fn wire_bytes(&self) -> Option<u64>;
}

impl Measured for MpiPlane<'_> {
    fn settle(&self) -> Result<(), RuntimeError> {
        Ok(())
    }

    fn wire_bytes(&self) -> Option<u64> {
        None
    }
}

impl Measured for Plane<'_> {
    fn settle(&self) -> Result<(), RuntimeError> {
        Ok(self.synchronize()?)
    }

    fn wire_bytes(&self) -> Option<u64> {
        Some(self.bytes_sent())
    }
}

/// How the ranks that finish a measured operation first wait for the others.
#[derive(Clone, Copy)]
pub(crate) enum Wait<'w> {
    /// The plane's barrier (MPI's polls the whole time).
    Barrier,
    /// A barrier of the world whose ranks sleep between tests: where ranks share cores (8 ranks
    /// on 2 here), those done first leave them to the ranks still copying. It costs up to one
    /// poll (about 0.1 ms), nothing next to the transfers of hundreds of MB it is used for.
    Calm(&'w World, &'w Watchdog),
}

/// Times `op` between two barriers of the world (the closing one as `wait` says), its device
/// work included; returns seconds on this rank.
pub(crate) fn timed<P: Measured, T>(
    plane: &mut P,
    world: GroupId,
    wait: Wait<'_>,
    op: impl FnOnce(&mut P) -> Result<T, RuntimeError>,
) -> Result<(T, f64), RuntimeError> {
    plane.settle()?;
    plane.barrier(world)?;
    let start = Instant::now();
    let out = op(plane)?;
    plane.settle()?;
    match wait {
        Wait::Barrier => plane.barrier(world)?,
        Wait::Calm(all, watchdog) => {
            calm_barrier(all, watchdog, "end of a measurement", std::time::Duration::from_micros(50))
        }
    }
    Ok((out, start.elapsed().as_secs_f64()))
}

/// Median time of `send` (rank 0 to rank 1) over `reps` after one warm-up.
fn p2p_seconds<P: Measured>(
    plane: &mut P,
    world: GroupId,
    wait: Wait<'_>,
    reps: usize,
    mut send: impl FnMut(&mut P) -> Result<(), RuntimeError>,
) -> Result<f64, RuntimeError> {
    let mut times = Vec::new();
    for rep in 0..=reps {
        let ((), t) = timed(plane, world, wait, &mut send)?;
        if rep > 0 {
            times.push(t); // repetition 0 warms up
        }
    }
    Ok(median(times))
}

/// Split/Merge/Extend/Destroy bytes, time and bandwidth vs point-to-point (>= 2 ranks; with
/// --device, also the pack/unpack kernels vs the device's copy engine, from 1 rank).
#[derive(Debug, Clone)]
pub struct Options {
    /// Unit sizes in MiB, comma-separated.
    pub sizes_mib: Vec<u64>,
    /// Measured repetitions per size after one warm-up (the median is reported).
    pub reps: usize,
    /// Also write the report as JSON.
    pub json: Option<PathBuf>,
    pub device: Option<DeviceChoice>,
}

/// Runs the benchmark on every rank with `args`.
pub fn run(session: &mut Session, args: &Options) -> Result<(), RuntimeError> {
    benchmark(session, &args.sizes_mib, args.reps.max(1), args.json.as_deref(), args.device)
}

/// Runs the benchmark; rank 0 prints the table and writes the report.
fn benchmark(
    session: &Session,
    sizes_mib: &[u64],
    reps: usize,
    json: Option<&Path>,
    device: Option<DeviceChoice>,
) -> Result<(), RuntimeError> {
    let world_size = session.world().size();
    let rows = match device {
        None if world_size < 2 => {
            return Err(RuntimeError::Usage("bench primitives needs at least 2 MPI ranks (mpirun -n 2 …)".into()))
        }
        None => {
            let mut plane = session.control_plane();
            host_rows(&mut plane, world_size, sizes_mib, reps)?
        }
        Some(choice) => {
            let (mut plane, memory) = open_device(session, choice)?;
            DeviceRows { world_size, sizes_mib, reps }.run(&mut plane, memory)?
        }
    };
    if session.rank() != 0 {
        return Ok(());
    }
    print_table(&rows).map_err(RuntimeError::Stdout)?;
    let report = BenchReport { bench: "primitives".into(), machine: machine(session), floors: floors(&rows), rows };
    report.finish(json)
}

fn host_rows(
    plane: &mut MpiPlane<'_>,
    world_size: i32,
    sizes_mib: &[u64],
    reps: usize,
) -> Result<Vec<Row>, RuntimeError> {
    let world = plane.group(&(0..world_size).collect::<Vec<_>>())?;
    let mut rows = Vec::new();
    for &mib in sizes_mib {
        let unit = unit_bytes(mib);
        let p2p = (
            host_p2p_seconds(plane, world, Wait::Barrier, reps, unit)?,
            host_p2p_seconds(plane, world, Wait::Barrier, reps, unit / 2)?,
        );
        rows.extend(primitive_rows(plane, &HostMemory, (world, world_size), mib, reps, p2p)?);
    }
    Ok(rows)
}

/// Median seconds of one MPI send of `bytes` host bytes from rank 0 to rank 1 (every rank of
/// `world` takes part in the barriers), over `reps` after one warm-up: the point-to-point
/// yardstick of the host benchmarks.
pub(crate) fn host_p2p_seconds(
    plane: &mut MpiPlane<'_>,
    world: GroupId,
    wait: Wait<'_>,
    reps: usize,
    bytes: u64,
) -> Result<f64, RuntimeError> {
    let mut buffer = vec![1u8; bytes as usize];
    p2p_seconds(plane, world, wait, reps, |plane| {
        let mut transfers = match plane.rank() {
            0 => vec![Transfer::Send { peer: 1, data: &buffer }],
            1 => vec![Transfer::Recv { peer: 0, data: &mut buffer }],
            _ => vec![],
        };
        Ok(plane.exchange(&mut transfers)?)
    })
}

/// Median seconds of one send of `bytes` device bytes from rank 0 to rank 1 over the GPU
/// plane's library (NCCL, RCCL), as [`host_p2p_seconds`] times MPI: the device benchmarks'
/// yardstick.
pub(crate) fn device_p2p_seconds(
    plane: &mut Plane<'_>,
    memory: &DeviceMemory,
    world: GroupId,
    wait: Wait<'_>,
    reps: usize,
    bytes: u64,
) -> Result<f64, RuntimeError> {
    let buffer = memory.allocate(bytes)?;
    let t = DeviceTransfer { peer: 1 - plane.rank().min(1), data: buffer.ptr(), bytes };
    p2p_seconds(plane, world, wait, reps, |plane| {
        let (sends, recvs): (&[DeviceTransfer], &[DeviceTransfer]) = match plane.rank() {
            0 => (&[t], &[]),
            1 => (&[], &[t]),
            _ => (&[], &[]),
        };
        Ok(plane.exchange_device(sends, recvs)?)
    })
}

/// Bytes of the unit for `mib` MiB.
fn unit_bytes(mib: u64) -> u64 {
    Catalogue::new(unit_architecture(mib << 20)).parameter_count() * 4
}

/// The device rows: kernels on every rank's device, primitives over the GPU plane with 2+ ranks.
struct DeviceRows<'a> {
    world_size: i32,
    sizes_mib: &'a [u64],
    reps: usize,
}

impl DeviceRows<'_> {
    /// Runs on this rank's device plane, with shards in `memory`.
    fn run(self, plane: &mut Plane<'_>, memory: DeviceMemory) -> Result<Vec<Row>, RuntimeError> {
        let world_size = self.world_size;
        let world = plane.group(&(0..world_size).collect::<Vec<_>>())?;
        let mut rows = Vec::new();
        for &mib in self.sizes_mib {
            let unit = unit_bytes(mib);
            rows.extend(kernel_rows(plane, &memory, world, unit, self.reps)?);
            if world_size < 2 {
                continue;
            }
            let time_send = |plane: &mut Plane<'_>, bytes| {
                device_p2p_seconds(plane, &memory, world, Wait::Barrier, self.reps, bytes)
            };
            let p2p = (time_send(plane, unit)?, time_send(plane, unit / 2)?);
            rows.extend(primitive_rows(plane, &memory, (world, world_size), mib, self.reps, p2p)?);
        }
        Ok(rows)
    }
}

/// Copy engine, pack and unpack on this rank's device, one rectangle of `unit` bytes, timed on
/// the device.
fn kernel_rows(
    plane: &mut Plane<'_>,
    memory: &DeviceMemory,
    world: GroupId,
    unit: u64,
    reps: usize,
) -> Result<Vec<Row>, RuntimeError> {
    let row_bytes = KERNEL_ROW_BYTES.min(unit);
    let rows = (unit / row_bytes).max(1);
    let bytes = rows * row_bytes;
    // A matrix of `rows` rows of 2·row_bytes, its packed left half, and a copy target.
    let (mut matrix, mut packed, mut copy) =
        (memory.allocate(2 * bytes)?, memory.allocate(bytes)?, memory.allocate(bytes)?);
    let contiguous =
        RectCopy { src_offset: 0, src_pitch: bytes, dst_offset: 0, dst_pitch: bytes, row_bytes: bytes, rows: 1 };
    let pack =
        RectCopy { src_offset: 0, src_pitch: 2 * row_bytes, dst_offset: 0, dst_pitch: row_bytes, row_bytes, rows };
    let unpack = RectCopy { src_pitch: row_bytes, dst_pitch: 2 * row_bytes, ..pack };
    // Device time between two events around each launch: host-side timing would add the
    // wait's own latency to copies of microseconds.
    let device = plane.device().clone();
    let seconds = |op: &mut dyn FnMut() -> Result<(), nereus_exec::emu::EmuError>| -> Result<f64, RuntimeError> {
        plane.barrier(world)?;
        let mut times = Vec::new();
        for rep in 0..=reps {
            let t =
                device.time(|| op().map_err(|e| BackendError::Driver { backend: "bench", reason: e.to_string() }))?;
            if rep > 0 {
                times.push(t);
            }
        }
        Ok(median(times))
    };
    let d2d = seconds(&mut || memory.copy_rects(&packed, &mut copy, &[contiguous]))?;
    let packing = seconds(&mut || memory.copy_rects(&matrix, &mut packed, &[pack]))?;
    let unpacking = seconds(&mut || memory.copy_rects(&packed, &mut matrix, &[unpack]))?;
    let d2d_gbps = bytes as f64 / d2d / 1e9;
    Ok([("d2d", d2d), ("pack", packing), ("unpack", unpacking)]
        .into_iter()
        .map(|(name, t)| {
            let gbps = bytes as f64 / t / 1e9;
            Row {
                primitive: name.into(),
                unit_bytes: bytes,
                bytes_sent: 0,
                expected_bytes: 0,
                seconds: t,
                bandwidth_gbps: gbps,
                p2p_gbps: 0.0,
                fraction_of_p2p: 0.0,
                device_bytes_sent: None,
                d2d_gbps: Some(d2d_gbps),
                fraction_of_d2d: Some(gbps / d2d_gbps),
            }
        })
        .collect())
}

/// Extend, Destroy, Split and Merge of the `mib` unit, and the point-to-point row; `p2p` holds
/// the seconds of sending one unit and half a unit.
fn primitive_rows<M: ShardMemory + Clone, P: Exchange<M> + Measured>(
    plane: &mut P,
    memory: &M,
    (world, world_size): (GroupId, i32),
    mib: u64,
    reps: usize,
    (p2p_unit, p2p_half): (f64, f64),
) -> Result<Vec<Row>, RuntimeError> {
    let catalogue = Catalogue::new(unit_architecture(mib << 20));
    let unit = catalogue.parameter_count() * 4;
    let catalogues = BTreeMap::from([(Role::Actor, catalogue.clone())]);
    let mut set = EmuSet::in_memory(plane.rank(), world_size, u64::MAX / 4, catalogues, memory.clone());
    let stage = ModelStage::new(Role::Actor, Stage::Inference);
    let single = set.create_synthetic(plane, stage, Layout::new(1, 1), &[0], Counters::default())?;
    let generation = ModelStage::new(Role::Actor, Stage::Generation);
    let mut pair_id = set.create_synthetic(plane, generation, Layout::new(2, 1), &[0, 1], Counters::default())?;
    let mut samples: BTreeMap<&str, Sample> = BTreeMap::new();
    // Repetition 0 warms up (pages the buffers in; later ones reuse them through the store's
    // cache, as a long-running job does) and is not recorded.
    for rep in 0..=reps {
        let warm = rep > 0;
        let ext = measure(plane, world, warm, "extend", &mut samples, |plane| {
            Ok(set.extend(plane, single, &[1], PrimitiveOptions::default())?)
        })?;
        let copy = ext.created[0];
        measure(plane, world, warm, "destroy", &mut samples, |_| Ok(set.destroy(copy)?))?;
        let split = measure(plane, world, warm, "split", &mut samples, |plane| {
            Ok(set.split(plane, pair_id, Layout::new(1, 1), PrimitiveOptions::default())?)
        })?;
        let parts: Vec<EmuId> = split.created.clone();
        let merge = measure(plane, world, warm, "merge", &mut samples, |plane| {
            Ok(set.merge(plane, &parts, Layout::new(2, 1), PrimitiveOptions::default())?)
        })?;
        pair_id = merge.created[0];
    }
    let split_missing = split_missing_bytes(&catalogue);
    let mut rows = Vec::new();
    for (name, sample) in samples {
        let (expected, p2p) = match name {
            "extend" => (unit, unit as f64 / p2p_unit),
            "split" => (split_missing, (unit / 2) as f64 / p2p_half),
            _ => (0, unit as f64 / p2p_unit),
        };
        let mut r = row(name, unit, sample.bytes, expected, median(sample.times), p2p);
        r.device_bytes_sent = sample.wire;
        rows.push(r);
    }
    let mut p2p = row("p2p", unit, unit, unit, p2p_unit, unit as f64 / p2p_unit);
    p2p.device_bytes_sent = plane.wire_bytes().map(|_| unit);
    rows.push(p2p);
    Ok(rows)
}

/// Timings of one primitive, the bytes its report gives, and the bytes handed to the library.
#[derive(Default)]
struct Sample {
    times: Vec<f64>,
    bytes: u64,
    wire: Option<u64>,
}

/// Times one primitive and, when `warm`, records it with the bytes every rank handed to send.
fn measure<P: Measured>(
    plane: &mut P,
    world: GroupId,
    warm: bool,
    name: &'static str,
    samples: &mut BTreeMap<&'static str, Sample>,
    op: impl FnOnce(&mut P) -> Result<PrimitiveReport, RuntimeError>,
) -> Result<PrimitiveReport, RuntimeError> {
    let before = plane.wire_bytes();
    let (report, seconds) = timed(plane, world, Wait::Barrier, op)?;
    let mut wire = [plane.wire_bytes().zip(before).map_or(0, |(after, before)| after - before)];
    plane.all_reduce_sum_u64(world, &mut wire)?;
    if warm {
        let entry = samples.entry(name).or_default();
        entry.times.push(seconds);
        entry.bytes = report.bytes_sent;
        entry.wire = before.map(|_| wire[0]);
    }
    Ok(report)
}

fn row(name: &str, unit: u64, bytes_sent: u64, expected: u64, seconds: f64, p2p_bytes_per_s: f64) -> Row {
    let bandwidth = bytes_sent as f64 / seconds / 1e9;
    let p2p = p2p_bytes_per_s / 1e9;
    Row {
        primitive: name.into(),
        unit_bytes: unit,
        bytes_sent,
        expected_bytes: expected,
        seconds,
        bandwidth_gbps: bandwidth,
        p2p_gbps: p2p,
        fraction_of_p2p: if bytes_sent == 0 { 0.0 } else { bandwidth / p2p },
        device_bytes_sent: None,
        d2d_gbps: None,
        fraction_of_d2d: None,
    }
}

/// Bytes a `(2,1) → 2 × (1,1)` Split must send: each rank needs the whole model and holds its
/// `(2,1)` shard; the difference, summed over both ranks. Computed from the catalogue alone.
fn split_missing_bytes(c: &Catalogue) -> u64 {
    let mut missing = 0;
    for i in 0..2 {
        for (t, spec) in c.tensors.iter().enumerate() {
            missing += spec.elements() - c.region(t, 2, i).elements();
        }
    }
    missing * 4
}

fn print_table(rows: &[Row]) -> std::io::Result<()> {
    let mut out = std::io::stdout().lock();
    writeln!(
        out,
        "{:<8} {:>10} {:>14} {:>14} {:>14} {:>10} {:>9} {:>9} {:>7} {:>9} {:>7}",
        "prim",
        "unit MiB",
        "bytes sent",
        "expected",
        "on device",
        "seconds",
        "GB/s",
        "p2p GB/s",
        "frac",
        "d2d GB/s",
        "frac"
    )?;
    for r in rows {
        let device = r.device_bytes_sent.map_or_else(|| "-".into(), |b| b.to_string());
        let (d2d, of_d2d) = match (r.d2d_gbps, r.fraction_of_d2d) {
            (Some(g), Some(f)) => (format!("{g:.3}"), format!("{f:.3}")),
            _ => ("-".into(), "-".into()),
        };
        writeln!(
            out,
            "{:<8} {:>10.1} {:>14} {:>14} {:>14} {:>10.5} {:>9.3} {:>9.3} {:>7.3} {:>9} {:>7}",
            r.primitive,
            r.unit_bytes as f64 / (1u64 << 20) as f64,
            r.bytes_sent,
            r.expected_bytes,
            device,
            r.seconds,
            r.bandwidth_gbps,
            r.p2p_gbps,
            r.fraction_of_p2p,
            d2d,
            of_d2d
        )?;
    }
    Ok(())
}

fn floors(rows: &[Row]) -> Vec<Floor> {
    let of = |name: &'static str| rows.iter().filter(move |r| r.primitive == name);
    let worst = |xs: Vec<f64>| xs.iter().copied().fold(f64::INFINITY, f64::min);
    let max_dev =
        |name: &'static str| of(name).map(|r| r.bytes_sent.abs_diff(r.expected_bytes) as f64).fold(0.0, f64::max);
    let mut floors = Vec::new();
    if of("merge").next().is_some() {
        floors.extend([
            Floor::at_most(
                "merge_bytes_sent_with_resident_targets",
                of("merge").map(|r| r.bytes_sent.max(r.device_bytes_sent.unwrap_or(0)) as f64).fold(0.0, f64::max),
                0.0,
                "bytes",
            ),
            Floor::at_most("extend_bytes_sent_minus_one_unit", max_dev("extend"), 0.0, "bytes"),
            Floor::at_most("split_bytes_sent_minus_missing_bytes", max_dev("split"), 0.0, "bytes"),
        ]);
    }
    for name in ["extend", "split"] {
        // On a device: what really went to ncclSend against what the host plane sends.
        let device: Vec<f64> =
            of(name).filter_map(|r| r.device_bytes_sent.map(|d| d.abs_diff(r.expected_bytes) as f64)).collect();
        if !device.is_empty() {
            let value = device.iter().copied().fold(0.0, f64::max);
            floors.push(Floor::at_most(&format!("{name}_device_bytes_minus_host_bytes"), value, 0.0, "bytes"));
        }
        let big: Vec<f64> = of(name).filter(|r| r.unit_bytes >= 64 << 20).map(|r| r.fraction_of_p2p).collect();
        if !big.is_empty() {
            floors.push(Floor::at_least(
                &format!("{name}_fraction_of_p2p_bandwidth_64mib_plus"),
                worst(big),
                0.70,
                "ratio",
            ));
        }
    }
    for name in ["pack", "unpack"] {
        let big: Vec<f64> = of(name).filter(|r| r.unit_bytes >= 64 << 20).filter_map(|r| r.fraction_of_d2d).collect();
        if !big.is_empty() {
            floors.push(Floor::at_least(&format!("{name}_fraction_of_d2d_64mib_plus"), worst(big), 0.70, "ratio"));
        }
    }
    floors
}
