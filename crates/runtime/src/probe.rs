//! Start-up probes for `[cluster] detect = true` on CPU-only nodes: what the ranks of this job
//! really get, measured with every rank busy at once (ranks that share cores see their share).
//!
//! - `device_peak_tflops`: the engine's own f32 GEMM on a 128³ product, best of repeated runs;
//! - `device_hbm_gbps`: a 16 MiB copy (read and write), best of repeated runs;
//! - `intra_node_gbps`: MPI exchanges of 4 MiB between rank pairs `(2i, 2i + 1)`, per direction.
//!
//! Every rank probes; the slowest rank's figure is the job's (a plan runs at its slowest rank),
//! so every rank resolves the same config. A probe's best run is a rank on a core of its own:
//! the figures are per core, and the cost model shares a node's cores (`cluster.cores_per_node`)
//! among the ranks a pass keeps busy there.

use std::time::{Duration, Instant};

use mpi::traits::{Communicator, Destination, Source};

use nereus_core::config::ClusterSection;
use nereus_exec::comm::{max_over_ranks, Watchdog, World};
use nereus_exec::engine::{matmul, Op};

/// How long each probe runs, at least.
const PROBE_TIME: Duration = Duration::from_millis(40);
/// GEMM probe size.
const GEMM_N: usize = 128;
/// Copy probe size, bytes.
const COPY_BYTES: usize = 16 << 20;
/// Exchange probe size, bytes.
const EXCHANGE_BYTES: usize = 4 << 20;

/// What the probes measured (agreed over the world).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Probed {
    /// GEMM rate of one rank, TFLOP/s.
    pub peak_tflops: f64,
    /// Copy bandwidth of one rank, GB/s.
    pub memory_gbps: f64,
    /// Exchange bandwidth between two ranks, GB/s per direction (`None` alone).
    pub link_gbps: Option<f64>,
}

impl Probed {
    /// `detected` with the measured figures in place of the assumed ones.
    pub fn apply(&self, mut detected: ClusterSection) -> ClusterSection {
        detected.device_peak_tflops = Some(self.peak_tflops);
        detected.device_hbm_gbps = Some(self.memory_gbps);
        if let Some(link) = self.link_gbps {
            detected.intra_node_gbps = Some(link);
        }
        detected
    }
}

/// Runs the probes on every rank (collective) and agrees on the slowest rank's figures.
pub fn measure(world: &World, watchdog: &Watchdog) -> Probed {
    let gemm = best_rate(|| {
        let (a, b) = (vec![1.0f32; GEMM_N * GEMM_N], vec![0.5f32; GEMM_N * GEMM_N]);
        let mut c = vec![0.0f32; GEMM_N * GEMM_N];
        move || {
            matmul(&mut c, &a, Op::N, &b, Op::N, GEMM_N, GEMM_N, GEMM_N, false);
            std::hint::black_box(&c);
            2.0 * (GEMM_N as f64).powi(3)
        }
    });
    let copy = best_rate(|| {
        let (src, mut dst) = (vec![1u8; COPY_BYTES], vec![0u8; COPY_BYTES]);
        move || {
            dst.copy_from_slice(&src);
            std::hint::black_box(&dst);
            2.0 * COPY_BYTES as f64
        }
    });
    let link = exchange_rate(world, watchdog);
    // The slowest rank's rate: the largest of `u64::MAX - rate`, in whole kilo-units.
    let slowest = |op: &str, rate: f64| {
        let worst = max_over_ranks(world, watchdog, op, u64::MAX - (rate / 1e3) as u64);
        (u64::MAX - worst) as f64 * 1e3
    };
    Probed {
        peak_tflops: slowest("GEMM probe", gemm) / 1e12,
        memory_gbps: slowest("memory probe", copy) / 1e9,
        link_gbps: link.map(|rate| slowest("exchange probe", rate) / 1e9),
    }
}

/// The best rate (units per second) of repeated calls of the closure `make()` returns, each
/// returning the units it did, over at least [`PROBE_TIME`].
fn best_rate<F: FnMut() -> f64>(make: impl FnOnce() -> F) -> f64 {
    let mut run = make();
    run(); // warm caches and pages
    let start = Instant::now();
    let mut best: f64 = 0.0;
    while start.elapsed() < PROBE_TIME {
        let t = Instant::now();
        let units = run();
        best = best.max(units / t.elapsed().as_secs_f64().max(1e-9));
    }
    best
}

/// Bytes per second one way between partners `(2i, 2i + 1)`, exchanging at once (`None` when
/// the world has a single rank; an unpaired last rank reports its partner-less rate as
/// infinite, so it never is the slowest).
fn exchange_rate(world: &World, watchdog: &Watchdog) -> Option<f64> {
    let (rank, size) = (world.rank(), world.size());
    if size < 2 {
        return None;
    }
    let partner = rank ^ 1;
    let _guard = watchdog.guard("exchange probe", &world.describe());
    if partner >= size {
        return Some(f64::MAX / 2.0);
    }
    let comm = world.comm();
    let send = vec![7u8; EXCHANGE_BYTES];
    let mut recv = vec![0u8; EXCHANGE_BYTES];
    let mut best: f64 = 0.0;
    for _ in 0..6 {
        let t = Instant::now();
        mpi::request::scope(|scope| {
            let peer = comm.process_at_rank(partner);
            let sent = peer.immediate_send(scope, &send[..]);
            peer.receive_into(&mut recv[..]);
            sent.wait();
        });
        best = best.max(EXCHANGE_BYTES as f64 / t.elapsed().as_secs_f64().max(1e-9));
    }
    Some(best)
}
