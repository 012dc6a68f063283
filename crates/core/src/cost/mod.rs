//! The analytic cost model: memory per rank and latency per model-stage for a candidate,
//! formula by formula in `docs/cost-model.md`. Pure: a function of hardware, shapes and
//! calibrated efficiencies.
//!
//! Memory is counted per pipeline position of a candidate (placement-exact: the state a rank
//! keeps for every EMU it holds, plus the transient buffers of whatever runs there), under the
//! same [`MemoryItem`]s the engine's ledger charges ([`position`]: what a layout fixes and what
//! a variant of it chooses); [`placement`] adds them up rank by rank for a whole plan.

mod calibration;
mod memory;
pub mod placement;
pub mod position;
pub mod reference;
mod stats;

pub use calibration::{Efficiencies, Measurement, OpClass, OpSeconds, StageSample};
pub use memory::{
    activation_bytes_per_layer, kv_cache_bytes_per_sequence, optimizer_bytes_per_param, training_state_bytes_per_param,
    EngineKind, MemoryBreakdown, MemoryItem, GRADIENT_BYTES,
};
pub use placement::{RankMemory, RankPeaks};
pub use position::PositionCost;
pub use stats::ModelStats;

use serde::Serialize;

use crate::config::ClusterSpec;
use crate::model::OutputHead;

use crate::plan::{Candidate, Placement, Recompute, Stage};

/// Per-message latency of a collective or send, seconds (launch and synchronization).
const MESSAGE_LATENCY_S: f64 = 10e-6;

/// The hardware a plan runs on: a pool of `devices` devices of the cluster's kind.
#[derive(Debug, Clone, Serialize)]
pub struct Hardware {
    /// Devices in the pool.
    pub devices: u32,
    /// Devices per node.
    pub devices_per_node: u32,
    /// Device memory, bytes.
    pub memory_bytes: u64,
    /// Fraction of memory a plan leaves free.
    pub headroom: f64,
    /// Peak FLOP/s per device.
    pub peak_flops: f64,
    /// Memory bandwidth per device, bytes/s.
    pub hbm_bytes_per_s: f64,
    /// Device-to-device bandwidth inside a node, bytes/s per direction.
    pub intra_bytes_per_s: f64,
    /// Network bandwidth available to one device, bytes/s per direction (node NICs shared).
    pub inter_bytes_per_s: f64,
    /// CPU cores per node where ranks stand in for devices and may share them.
    pub cores_per_node: Option<u32>,
    /// Seconds to set up a communicator for a transition's rank set on the job's data plane.
    pub communicator_setup_s: f64,
}

impl Hardware {
    /// A pool of `devices` devices of `cluster`'s kind, keeping `headroom` of memory free.
    pub fn new(cluster: &ClusterSpec, devices: u32, headroom: f64) -> Hardware {
        Hardware {
            devices,
            devices_per_node: cluster.devices_per_node,
            memory_bytes: cluster.device_memory_bytes(),
            headroom,
            peak_flops: cluster.device_peak_tflops * 1e12,
            hbm_bytes_per_s: cluster.device_hbm_gbps * 1e9,
            intra_bytes_per_s: cluster.intra_node_gbps * 1e9,
            inter_bytes_per_s: cluster.inter_node_gbps() * 1e9 / f64::from(cluster.devices_per_node),
            cores_per_node: cluster.cores_per_node,
            communicator_setup_s: cluster.data_plane.communicator_setup_s(),
        }
    }

    /// Bytes a rank may use.
    pub fn usable_bytes(&self) -> u64 {
        (self.memory_bytes as f64 * (1.0 - self.headroom)) as u64
    }
}

/// What one RL step asks of a model-stage.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Workload {
    /// Sequences processed per step (all replicas together).
    pub sequences: u64,
    /// Prompt tokens per sequence.
    pub prompt_len: u64,
    /// Response tokens per sequence (the current length the plan is made for).
    pub response_len: u64,
    /// Largest sequences per micro-batch (training and inference); candidates may use fewer.
    pub micro_batch: u64,
    /// Sequences per optimizer update (training), split over the replicas.
    pub mini_batch: u64,
    /// Passes over the step's sequences (training).
    pub epochs: u64,
}

impl Workload {
    /// Tokens per sequence.
    pub fn seq_len(&self) -> u64 {
        self.prompt_len + self.response_len
    }

    /// Optimizer updates per step.
    pub fn updates(&self) -> u64 {
        self.epochs * self.sequences.div_ceil(self.mini_batch.max(1))
    }
}

/// What one rank of a candidate holds: its share of the model-stage's state (kept from step to
/// step) and the peak of the buffers its passes allocate and release.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize)]
pub struct PositionMemory {
    /// Parameters, optimizer state (and persistent gradients on GPU engines).
    pub state: MemoryBreakdown,
    /// The largest set of transient buffers alive at once.
    pub transient: MemoryBreakdown,
}

impl PositionMemory {
    /// State and transient together: the rank's peak if it held nothing else.
    pub fn peak(&self) -> u64 {
        self.state.total() + self.transient.total()
    }
}

/// The cost model's verdict on one candidate.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Estimate {
    /// The heaviest position's memory.
    pub memory: PositionMemory,
    /// Roofline time per class (slowest replica).
    pub ideal: OpSeconds,
    /// Predicted seconds.
    pub seconds: f64,
    /// Whether the heaviest position fits with headroom on a rank of its own.
    pub feasible: bool,
}

/// Estimates memory and latency of candidates on one piece of hardware.
#[derive(Debug, Clone)]
pub struct CostModel {
    /// The hardware.
    pub hardware: Hardware,
    /// Calibrated efficiencies.
    pub efficiencies: Efficiencies,
    /// Whose buffers the memory model counts.
    pub engine: EngineKind,
}

impl CostModel {
    /// Estimates `candidate` for a model with `stats` under `workload`. A candidate that does
    /// not fit even alone gets infinite latency.
    pub fn estimate(&self, stats: &ModelStats, candidate: &Candidate, workload: &Workload) -> Estimate {
        let memory = self.heaviest_position(stats, candidate, workload);
        let feasible = self.fits_alone(memory.peak());
        if !feasible {
            return Estimate { memory, ideal: OpSeconds::default(), seconds: f64::INFINITY, feasible };
        }
        let ideal = self.latency(stats, candidate, workload);
        Estimate { memory, ideal, seconds: ideal.seconds(&self.efficiencies), feasible }
    }

    /// Whether a position peaking at `peak` bytes fits with headroom on a rank of its own (what
    /// [`CostModel::estimate`] calls feasible).
    pub fn fits_alone(&self, peak: u64) -> bool {
        peak <= self.hardware.usable_bytes()
    }

    /// [`CostModel::estimate`]'s seconds of a feasible candidate, without its memory: the
    /// search prices only the variants whose memory fits.
    pub fn seconds(&self, stats: &ModelStats, c: &Candidate, w: &Workload) -> f64 {
        self.latency(stats, c, w).seconds(&self.efficiencies)
    }

    /// The heaviest pipeline position ([`position::heavier`] of the first and the last).
    pub fn heaviest_position(&self, stats: &ModelStats, c: &Candidate, w: &Workload) -> PositionMemory {
        let first = self.position_memory(stats, c, w, 0);
        let last = (c.layout.pp > 1).then(|| self.position_memory(stats, c, w, c.layout.pp - 1));
        position::heavier(first, last)
    }

    /// What a rank at pipeline position `j` of `candidate` holds (every TP position of a stage
    /// holds the same): see [`position`].
    pub fn position_memory(&self, stats: &ModelStats, c: &Candidate, w: &Workload, j: u32) -> PositionMemory {
        self.position_cost(stats, c, w, j).memory(c, w)
    }

    /// Roofline seconds per class for the slowest replica.
    pub fn latency(&self, stats: &ModelStats, c: &Candidate, w: &Workload) -> OpSeconds {
        let ideal = self.latency_on_whole_devices(stats, c, w);
        self.on_shared_cores(ideal, c)
    }

    /// The share of a device's peak each rank of `c` gets: ranks that stand in for devices on a
    /// CPU node share its cores, so a pass keeping `r` ranks of a node busy gives each
    /// `min(1, cores / r)` of a core (idle ranks yield their core while they wait).
    pub fn compute_share(&self, c: &Candidate) -> f64 {
        let hw = &self.hardware;
        match hw.cores_per_node {
            Some(cores) => {
                let busy = c.ranks().min(hw.devices_per_node).max(1);
                (f64::from(cores) / f64::from(busy)).min(1.0)
            }
            None => 1.0,
        }
    }

    /// `ideal` with its compute classes slowed to the share of a core `c`'s ranks get.
    fn on_shared_cores(&self, mut ideal: OpSeconds, c: &Candidate) -> OpSeconds {
        let share = self.compute_share(c);
        for class in [OpClass::Gemm, OpClass::Attention, OpClass::Decode] {
            ideal.0[class.index()] /= share;
        }
        ideal
    }

    fn latency_on_whole_devices(&self, stats: &ModelStats, c: &Candidate, w: &Workload) -> OpSeconds {
        self.scheduled_latency(stats, c, w, Schedule::of)
    }

    /// [`CostModel::latency_on_whole_devices`] with the passes' micro-batches laid out by
    /// `schedule` (`Schedule::of`: as `c` runs them; `Schedule::floor`: better than any).
    fn scheduled_latency(
        &self,
        stats: &ModelStats,
        c: &Candidate,
        w: &Workload,
        schedule: fn(&Candidate, u64, bool) -> Schedule,
    ) -> OpSeconds {
        match c.model_stage.stage {
            Stage::Training => {
                // Every update is one pipeline flush over the replica's share of a mini-batch,
                // then a DP all-reduce of the gradients (the actor's old log-probabilities are
                // an inference-stage pass, `old_logp_breakdown`).
                let share = per_replica(w.mini_batch, c.dp);
                let update = self.pass_latency(stats, c, share, w.seq_len(), &schedule(c, share, true));
                let mut out = OpSeconds::default();
                for _ in 0..w.updates() {
                    out = out.plus(&update);
                }
                out
            }
            Stage::Inference => {
                let share = per_replica(w.sequences, c.dp);
                self.pass_latency(stats, c, share, w.seq_len(), &schedule(c, share, false))
            }
            Stage::Generation => self.generation_latency(stats, c, w),
        }
    }

    /// A floor under the predicted seconds of every variant of `c`'s layout and replica count
    /// (any micro-batch or decode wave, any recomputation): the planner skips a layout whose
    /// floor already loses without estimating its variants. Generation's fastest variant is
    /// one wave of the whole share; a pass is never faster than with no bubble, no
    /// recomputation and each message cost paid once for the whole share
    /// ([`Schedule::floor`]).
    pub fn seconds_floor(&self, stats: &ModelStats, c: &Candidate, w: &Workload) -> f64 {
        let fastest = match c.model_stage.stage {
            Stage::Generation => {
                let one_wave = u32::try_from(per_replica(w.sequences, c.dp)).unwrap_or(u32::MAX);
                Candidate { micro_batch: one_wave, ..*c }
            }
            _ => *c,
        };
        let ideal = self.scheduled_latency(stats, &fastest, w, Schedule::floor);
        self.on_shared_cores(ideal, c).seconds(&self.efficiencies)
    }

    /// The old-log-probability pass of a training candidate (forward only over its share of
    /// the rollout, in the inference stage), at roofline per class.
    pub fn old_logp_breakdown(&self, stats: &ModelStats, c: &Candidate, w: &Workload) -> OpSeconds {
        let share = per_replica(w.sequences, c.dp);
        self.on_shared_cores(self.pass_latency(stats, c, share, w.seq_len(), &Schedule::of(c, share, false)), c)
    }

    /// One pass over `share` sequences of `seq` tokens through the pipeline, scheduled as
    /// `pass` says: forward only, or forward, backward and the DP gradient all-reduce.
    fn pass_latency(&self, stats: &ModelStats, c: &Candidate, share: u64, seq: u64, pass: &Schedule) -> OpSeconds {
        let hw = &self.hardware;
        let a = &stats.arch;
        let (tp, pp, dp) = (f64::from(c.layout.tp), f64::from(c.layout.pp), f64::from(c.dp));
        let s = seq as f64;
        let (layers, h, bytes) = (a.layers as f64, a.hidden as f64, a.dtype.bytes() as f64);
        let n = stats.matmul_params as f64;
        // The slowest (fullest) pipeline stage sets the pace: with `ceil(layers/pp)` blocks it
        // works as if the model were spread over `layers / ceil(layers/pp)` stages.
        let devices = tp * layers / stats.max_layers_per_stage(c.layout.pp) as f64;
        let flops_rate = hw.peak_flops * devices;
        let pp_class = if c.layout.size() <= hw.devices_per_node { OpClass::PpP2pIntra } else { OpClass::PpP2pInter };
        let pp_bw = if pp_class == OpClass::PpP2pIntra { hw.intra_bytes_per_s } else { hw.inter_bytes_per_s };
        let tokens = share as f64 * s;
        // Causal attention: 2·layers·s·q_width FLOPs per token forward (QKᵀ and AV, halved).
        let attention_fwd = 2.0 * layers * s * a.q_width() as f64 * tokens;
        let mut out = OpSeconds::default();
        let (gemm_passes, attn_passes, tp_passes, pp_passes) = if pass.training {
            let recompute_fwd = if pass.recompute == Recompute::Full { 1.0 } else { 0.0 };
            let attn = if pass.recompute == Recompute::None { 3.0 } else { 4.0 };
            (6.0 + 2.0 * recompute_fwd, attn, 4.0, 2.0)
        } else {
            (2.0, 1.0, 2.0, 1.0)
        };
        let bubble = pass.bubble;
        let head_recompute = if pass.training { self.head_recompute_params(stats) } else { 0.0 };
        out.add(OpClass::Gemm, (gemm_passes * n + 2.0 * head_recompute) * tokens / flops_rate * bubble);
        out.add(OpClass::Attention, attn_passes * attention_fwd / flops_rate * bubble);
        let tp_msg = s * pass.message_sequences * h * bytes;
        out.add(
            OpClass::TpAllReduce,
            pass.messages * (layers / pp) * tp_passes * ring(tp, tp_msg, hw.intra_bytes_per_s) * bubble,
        );
        if pp > 1.0 {
            let hop_msg = s * pass.hop_sequences * h * bytes;
            out.add(pp_class, pass.hops * pp_passes * (hop_msg / pp_bw + MESSAGE_LATENCY_S));
        }
        if pass.training {
            let ranks = c.ranks();
            let dp_bw = if ranks <= hw.devices_per_node { hw.intra_bytes_per_s } else { hw.inter_bytes_per_s };
            let grad_bytes = n / devices * self.gradient_bytes() as f64;
            out.add(OpClass::DpAllReduce, ring(dp, grad_bytes, dp_bw));
        }
        out
    }

    /// Parameters of the LM head whose product a training pass computes once more: the
    /// reference engine's fused head (on the host or a device) recomputes each vocabulary
    /// chunk's logits in the backward pass rather than keeping them (`engine/output.rs`).
    fn head_recompute_params(&self, stats: &ModelStats) -> f64 {
        let fused = matches!(self.engine, EngineKind::Reference | EngineKind::Device);
        if fused && stats.arch.head == OutputHead::Lm {
            (stats.arch.vocab * stats.arch.hidden) as f64
        } else {
            0.0
        }
    }

    /// Bytes per gradient element on the wire: f32 in the reference engine (on the host or a
    /// device), bf16 in a Megatron-style GPU engine.
    fn gradient_bytes(&self) -> u64 {
        match self.engine {
            EngineKind::Reference | EngineKind::Device => 4,
            EngineKind::Gpu => GRADIENT_BYTES,
        }
    }

    /// Prefill and decode of the replica's share in waves of `micro_batch` sequences (a GPU
    /// engine's continuous batching keeps about that many in flight; the reference engine
    /// decodes wave after wave).
    fn generation_latency(&self, stats: &ModelStats, c: &Candidate, w: &Workload) -> OpSeconds {
        let hw = &self.hardware;
        let a = &stats.arch;
        let (tp, pp) = (f64::from(c.layout.tp), f64::from(c.layout.pp));
        let b_rep = per_replica(w.sequences, c.dp) as f64;
        let (layers, h, bytes) = (a.layers as f64, a.hidden as f64, a.dtype.bytes() as f64);
        let n = stats.matmul_params as f64;
        let q_width = a.q_width() as f64;
        let devices = tp * layers / stats.max_layers_per_stage(c.layout.pp) as f64;
        let flops_rate = hw.peak_flops * devices;
        let pp_class = if c.layout.size() <= hw.devices_per_node { OpClass::PpP2pIntra } else { OpClass::PpP2pInter };
        let pp_bw = if pp_class == OpClass::PpP2pIntra { hw.intra_bytes_per_s } else { hw.inter_bytes_per_s };
        let (prompt, response) = (w.prompt_len as f64, w.response_len as f64);
        let mut out = OpSeconds::default();
        // Prefill: compute-bound over the prompt.
        out.add(OpClass::Gemm, 2.0 * n * b_rep * prompt / flops_rate);
        out.add(OpClass::Attention, 2.0 * layers * prompt * q_width * b_rep * prompt / flops_rate);
        // Decode, in waves: every step reads the stage's weights and the KV cache (mean
        // context), stage after stage; compute-bound only for very large batches. Priced at
        // its roofline under `decode` either way, the class the engine times decode steps as,
        // so calibration fits one efficiency to what one timer measures.
        let batch = micro(c, per_replica(w.sequences, c.dp)) as f64;
        let steps = (b_rep / batch).ceil() * response;
        let kv_per_token = 2.0 * layers * (a.kv_heads * a.head_dim) as f64 * bytes;
        let context = prompt + response / 2.0;
        let read = (n * bytes + batch * context * kv_per_token) / devices;
        let memory_time = read / hw.hbm_bytes_per_s * pp;
        let compute_time = 2.0 * n * batch / flops_rate * pp;
        out.add(OpClass::Decode, steps * memory_time.max(compute_time));
        let step_msg = batch * h * bytes;
        out.add(OpClass::TpAllReduce, steps * layers * 2.0 * ring(tp, step_msg, hw.intra_bytes_per_s));
        if pp > 1.0 {
            out.add(pp_class, steps * (pp - 1.0) * (step_msg / pp_bw + MESSAGE_LATENCY_S));
        }
        out
    }
}

impl CostModel {
    /// The weight sync from `src` (a training placement) into `dst` (generation or critic
    /// inference), as the engine runs it: destination replica `g` is filled from source replica
    /// `g mod dp`, every destination rank receives its parameter shard (nothing where the same
    /// rank already holds it in the same layout), each source replica's ranks send what its
    /// destinations receive, all transfers concurrent; the slowest rank sets the time.
    pub fn weight_sync(&self, stats: &ModelStats, src: &Placement, dst: &Placement) -> OpSeconds {
        let hw = &self.hardware;
        let (sl, dl) = (src.candidate.layout, dst.candidate.layout);
        let bytes = stats.arch.dtype.bytes();
        // Bytes each rank sends or receives, indexed by world rank.
        let pool = src.ranks.iter().chain(&dst.ranks).map(|&r| r.max(0) as usize + 1).max().unwrap_or(0);
        let mut traffic = vec![0u64; pool];
        let shard: Vec<u64> = (0..dl.pp).map(|j| stats.params_of_stage(dl, j) * bytes).collect();
        let mut cross_node = false;
        let sources: Vec<&[i32]> = src.ranks.chunks(sl.size().max(1) as usize).collect();
        for (g, target) in dst.ranks.chunks(dl.size().max(1) as usize).enumerate() {
            let source = sources[g % sources.len().max(1)];
            let mut sent = 0;
            for (k, &r) in target.iter().enumerate() {
                let local = sl == dl && source[k] == r;
                if !local {
                    let b = shard[dl.position(k).pp as usize];
                    traffic[r as usize] += b;
                    sent += b;
                }
            }
            for &s in source {
                traffic[s as usize] += sent.div_ceil(source.len() as u64);
            }
            let node = |r: i32| r as u32 / hw.devices_per_node.max(1);
            cross_node |= target.iter().chain(source).any(|&r| node(r) != node(target[0]));
        }
        let bw = if cross_node { hw.inter_bytes_per_s } else { hw.intra_bytes_per_s };
        let busiest = traffic.iter().copied().max().unwrap_or(0);
        let mut out = OpSeconds::default();
        if busiest > 0 {
            out.add(OpClass::Reshard, busiest as f64 / bw + MESSAGE_LATENCY_S);
        }
        out
    }
}

/// Ring all-reduce of `msg` bytes over `group` ranks at `bw` bytes/s per direction.
fn ring(group: f64, msg: f64, bw: f64) -> f64 {
    if group > 1.0 {
        2.0 * (group - 1.0) / group * msg / bw + 2.0 * (group - 1.0) * MESSAGE_LATENCY_S
    } else {
        0.0
    }
}

/// How a pass over a replica's share runs through the pipeline: what its micro-batches cost
/// beyond the work itself.
struct Schedule {
    /// Forward, backward and gradient all-reduce (else forward only).
    training: bool,
    /// Activation recomputation in the backward pass.
    recompute: Recompute,
    /// `(m + pp − 1) / m` for `m` micro-batches: the pipeline's idle share stretches compute
    /// and TP traffic alike.
    bubble: f64,
    /// TP all-reduces per layer and pass, each over `message_sequences` sequences.
    messages: f64,
    message_sequences: f64,
    /// Messages across each stage boundary per pass, each of `hop_sequences` sequences.
    hops: f64,
    hop_sequences: f64,
}

impl Schedule {
    /// `c`'s micro-batches over a share of `share` sequences: `m = ceil(share / micro)` of
    /// them, one TP all-reduce each per layer, `m + pp − 1` hops across each stage boundary.
    fn of(c: &Candidate, share: u64, training: bool) -> Schedule {
        let pp = f64::from(c.layout.pp);
        let micro = f64::from(c.micro_batch).min(share as f64).max(1.0);
        let m = (share as f64 / micro).ceil();
        Schedule {
            training,
            recompute: c.recompute,
            bubble: (m + pp - 1.0) / m,
            messages: m,
            message_sequences: micro,
            hops: m + pp - 1.0,
            hop_sequences: micro,
        }
    }

    /// Better than any variant of `c`'s layout: no bubble and no recomputation; the share in
    /// one TP all-reduce per layer (`m` all-reduces of `micro ≥ share / m` sequences cost
    /// more); `pp` hops carrying the share between them (`m + pp − 1 ≥ pp` hops, carrying
    /// `m · micro ≥ share` sequences).
    fn floor(c: &Candidate, share: u64, training: bool) -> Schedule {
        let (share, pp) = (share.max(1) as f64, f64::from(c.layout.pp));
        Schedule {
            training,
            recompute: Recompute::None,
            bubble: 1.0,
            messages: 1.0,
            message_sequences: share,
            hops: pp,
            hop_sequences: share / pp,
        }
    }
}
/// Sequences of the slowest replica.
fn per_replica(sequences: u64, dp: u32) -> u64 {
    sequences.div_ceil(u64::from(dp))
}

/// Sequences per micro-batch (or generation wave) of a replica holding `share` sequences.
fn micro(c: &Candidate, share: u64) -> u64 {
    u64::from(c.micro_batch).min(share).max(1)
}
