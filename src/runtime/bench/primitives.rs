//! `nereus bench primitives`: Split, Merge, Extend and Destroy on units from 1 MiB up, with the
//! MPI point-to-point bandwidth of the same run as the yardstick.
//!
//! Runs on ranks 0 and 1 (other ranks only join the allocation checks). The unit is an f32
//! inference replica of a 2-block model sized to the requested bytes. Per size and repetition:
//! Extend a `(1,1)` replica from rank 0 to rank 1 and Destroy the copy; Split a `(2,1)` replica
//! on ranks 0–1 into two `(1,1)` replicas and Merge them back.

use serde::Serialize;
use std::collections::BTreeMap;
use std::io::Write;
use std::path::Path;
use std::time::Instant;

use crate::comm::{DataPlane, GroupId, MpiPlane, Transfer};
use crate::config::Dtype;
use crate::emu::{Counters, EmuId, EmuSet, PrimitiveReport};
use crate::model::{Architecture, Catalogue, Layout, OutputHead};
use crate::plan::{ModelStage, Role, Stage};

use super::{machine, BenchReport, Floor};
use crate::runtime::{RuntimeError, Session};

/// One measurement.
#[derive(Debug, Clone, Serialize)]
pub struct Row {
    /// `extend`, `destroy`, `split`, `merge`, or `p2p` (raw MPI send of one unit).
    pub primitive: String,
    /// Bytes of one full copy of the unit's state.
    pub unit_bytes: u64,
    /// Bytes sent over the data plane (all ranks).
    pub bytes_sent: u64,
    /// Bytes the primitive must send: one unit for Extend, the missing shard bytes for Split,
    /// none for Merge (targets resident) and Destroy.
    pub expected_bytes: u64,
    /// Median wall time over the repetitions, seconds (between barriers).
    pub seconds: f64,
    /// `bytes_sent / seconds`, GB/s.
    pub bandwidth_gbps: f64,
    /// MPI point-to-point bandwidth for the same per-pair message size, GB/s.
    pub p2p_gbps: f64,
    /// `bandwidth_gbps / p2p_gbps` (0 when nothing is sent).
    pub fraction_of_p2p: f64,
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

fn median(mut xs: Vec<f64>) -> f64 {
    xs.sort_by(f64::total_cmp);
    xs[xs.len() / 2]
}

/// Times `op` between two barriers of the world; returns seconds on this rank.
fn timed<'w, T>(
    plane: &mut MpiPlane<'w>,
    world: GroupId,
    op: impl FnOnce(&mut MpiPlane<'w>) -> Result<T, RuntimeError>,
) -> Result<(T, f64), RuntimeError> {
    plane.barrier(world)?;
    let start = Instant::now();
    let out = op(plane)?;
    plane.barrier(world)?;
    Ok((out, start.elapsed().as_secs_f64()))
}

/// Median time of sending `bytes` from rank 0 to rank 1 over the raw data plane.
fn p2p_seconds(plane: &mut MpiPlane<'_>, world: GroupId, bytes: usize, reps: usize) -> Result<f64, RuntimeError> {
    let mut buffer = vec![1u8; bytes];
    let mut times = Vec::new();
    for rep in 0..=reps {
        let ((), t) = timed(plane, world, |plane| {
            let mut transfers = match plane.rank() {
                0 => vec![Transfer::Send { peer: 1, data: &buffer }],
                1 => vec![Transfer::Recv { peer: 0, data: &mut buffer }],
                _ => vec![],
            };
            plane.exchange(&mut transfers).map_err(RuntimeError::from)
        })?;
        if rep > 0 {
            times.push(t); // repetition 0 warms up
        }
    }
    Ok(median(times))
}

/// Runs the benchmark; rank 0 prints the table and returns the report.
pub fn run(session: &Session, sizes_mib: &[u64], reps: usize, json: Option<&Path>) -> Result<(), RuntimeError> {
    let world_size = session.world().size();
    if world_size < 2 {
        return Err(RuntimeError::Usage("bench primitives needs at least 2 MPI ranks (mpirun -n 2 …)".into()));
    }
    let mut plane = MpiPlane::new(session.world(), session.watchdog().clone());
    let world = plane.group(&(0..world_size).collect::<Vec<_>>())?;
    let mut rows = Vec::new();
    for &mib in sizes_mib {
        let arch = unit_architecture(mib << 20);
        let catalogue = Catalogue::new(arch);
        let unit = catalogue.parameter_count() * 4;
        let p2p_unit = p2p_seconds(&mut plane, world, unit as usize, reps)?;
        let p2p_half = p2p_seconds(&mut plane, world, (unit / 2) as usize, reps)?;
        let mut set =
            EmuSet::new(plane.rank(), world_size, u64::MAX / 4, BTreeMap::from([(Role::Actor, catalogue.clone())]));
        let stage = ModelStage::new(Role::Actor, Stage::Inference);
        let single = set.create_synthetic(&mut plane, stage, Layout::new(1, 1), &[0], Counters::default())?;
        let pair = set.create_synthetic(
            &mut plane,
            ModelStage::new(Role::Actor, Stage::Generation),
            Layout::new(2, 1),
            &[0, 1],
            Counters::default(),
        )?;
        let mut samples: BTreeMap<&str, (Vec<f64>, u64)> = BTreeMap::new();
        let mut pair_id = pair;
        // Repetition 0 warms up (pages the buffers in; later ones reuse them through the
        // store's cache, as a long-running job does) and is not recorded.
        for rep in 0..=reps {
            let warm = rep > 0;
            let (ext, t) = timed(&mut plane, world, |plane| Ok(set.extend(plane, single, &[1])?))?;
            record(&mut samples, warm, "extend", t, &ext);
            let copy = ext.created[0];
            let (d, t) = timed(&mut plane, world, |_| Ok(set.destroy(copy)?))?;
            record(&mut samples, warm, "destroy", t, &d);
            let (split, t) = timed(&mut plane, world, |plane| Ok(set.split(plane, pair_id, Layout::new(1, 1))?))?;
            record(&mut samples, warm, "split", t, &split);
            let parts: Vec<EmuId> = split.created.clone();
            let (merge, t) = timed(&mut plane, world, |plane| Ok(set.merge(plane, &parts, Layout::new(2, 1))?))?;
            record(&mut samples, warm, "merge", t, &merge);
            pair_id = merge.created[0];
        }
        let split_missing = split_missing_bytes(&catalogue);
        for (name, (times, bytes)) in samples {
            let (expected, p2p) = match name {
                "extend" => (unit, unit as f64 / p2p_unit),
                "split" => (split_missing, (unit / 2) as f64 / p2p_half),
                _ => (0, unit as f64 / p2p_unit),
            };
            rows.push(row(name, unit, bytes, expected, median(times), p2p));
        }
        rows.push(row("p2p", unit, unit, unit, p2p_unit, unit as f64 / p2p_unit));
    }
    if session.rank() != 0 {
        return Ok(());
    }
    print_table(&rows).map_err(RuntimeError::Stdout)?;
    let report = BenchReport { bench: "primitives".into(), machine: machine(session), floors: floors(&rows), rows };
    report.finish(json)
}

fn record(
    samples: &mut BTreeMap<&'static str, (Vec<f64>, u64)>,
    warm: bool,
    name: &'static str,
    seconds: f64,
    report: &PrimitiveReport,
) {
    if !warm {
        return;
    }
    let entry = samples.entry(name).or_default();
    entry.0.push(seconds);
    entry.1 = report.bytes_sent;
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
        "{:<8} {:>10} {:>14} {:>14} {:>10} {:>9} {:>9} {:>7}",
        "prim", "unit MiB", "bytes sent", "expected", "seconds", "GB/s", "p2p GB/s", "frac"
    )?;
    for r in rows {
        writeln!(
            out,
            "{:<8} {:>10.1} {:>14} {:>14} {:>10.5} {:>9.3} {:>9.3} {:>7.3}",
            r.primitive,
            r.unit_bytes as f64 / (1u64 << 20) as f64,
            r.bytes_sent,
            r.expected_bytes,
            r.seconds,
            r.bandwidth_gbps,
            r.p2p_gbps,
            r.fraction_of_p2p
        )?;
    }
    Ok(())
}

fn floors(rows: &[Row]) -> Vec<Floor> {
    let of = |name: &'static str| rows.iter().filter(move |r| r.primitive == name);
    let max_dev =
        |name: &'static str| of(name).map(|r| r.bytes_sent.abs_diff(r.expected_bytes) as f64).fold(0.0, f64::max);
    let mut floors = vec![
        Floor::at_most(
            "merge_bytes_sent_with_resident_targets",
            of("merge").map(|r| r.bytes_sent as f64).fold(0.0, f64::max),
            0.0,
            "bytes",
        ),
        Floor::at_most("extend_bytes_sent_minus_one_unit", max_dev("extend"), 0.0, "bytes"),
        Floor::at_most("split_bytes_sent_minus_missing_bytes", max_dev("split"), 0.0, "bytes"),
    ];
    for name in ["extend", "split"] {
        let big: Vec<f64> = of(name).filter(|r| r.unit_bytes >= 64 << 20).map(|r| r.fraction_of_p2p).collect();
        if !big.is_empty() {
            let worst = big.iter().copied().fold(f64::INFINITY, f64::min);
            floors.push(Floor::at_least(&format!("{name}_fraction_of_p2p_bandwidth_64mib_plus"), worst, 0.70, "ratio"));
        }
    }
    floors
}
