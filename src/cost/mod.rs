//! The analytic cost model: memory per rank and latency per model-stage for a candidate,
//! formula by formula in `docs/cost-model.md`. Pure: a function of hardware, shapes and
//! calibrated efficiencies.

mod calibration;
mod memory;
mod stats;

pub use calibration::{Efficiencies, Measurement, OpClass};
pub use memory::{
    activation_bytes_per_layer, kv_cache_bytes_per_sequence, training_state_bytes_per_param, MemoryBreakdown,
    GRADIENT_BYTES,
};
pub use stats::ModelStats;

use serde::Serialize;

use crate::config::ClusterSpec;
use crate::model::OutputHead;
use crate::plan::{Candidate, Recompute, Stage};

/// Per-message latency of a collective or send, seconds (launch and synchronization).
const MESSAGE_LATENCY_S: f64 = 10e-6;
/// Workspace per rank (library workspaces, communicator buffers, allocator slack), capped at
/// 5% of device memory so tiny CPU clusters are not swamped.
const WORKSPACE_BYTES: u64 = 1 << 30;

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
    /// Device-to-device bandwidth inside a node, bytes/s.
    pub intra_bytes_per_s: f64,
    /// Network bandwidth available to one device, bytes/s (node NICs shared by its devices).
    pub inter_bytes_per_s: f64,
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
}

impl Workload {
    /// Tokens per sequence.
    pub fn seq_len(&self) -> u64 {
        self.prompt_len + self.response_len
    }
}

/// Ideal (roofline, at peak) seconds per operation class.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize)]
pub struct LatencyBreakdown(pub [f64; 7]);

impl LatencyBreakdown {
    fn add(&mut self, class: OpClass, seconds: f64) {
        self.0[class.index()] += seconds;
    }

    /// Predicted seconds under `efficiencies`.
    pub fn seconds(&self, efficiencies: &Efficiencies) -> f64 {
        OpClass::ALL.iter().map(|c| self.0[c.index()] / efficiencies.of(*c)).sum()
    }
}

/// The cost model's verdict on one candidate.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Estimate {
    /// Peak memory of the heaviest rank.
    pub memory: MemoryBreakdown,
    /// Roofline time per class (slowest replica).
    pub ideal: LatencyBreakdown,
    /// Predicted seconds.
    pub seconds: f64,
    /// Whether the heaviest rank fits with headroom.
    pub feasible: bool,
}

/// Estimates memory and latency of candidates on one piece of hardware.
#[derive(Debug, Clone)]
pub struct CostModel {
    /// The hardware.
    pub hardware: Hardware,
    /// Calibrated efficiencies.
    pub efficiencies: Efficiencies,
}

impl CostModel {
    /// Estimates `candidate` for a model with `stats` under `workload`; `params_per_rank` is the
    /// heaviest rank's parameter count for the candidate's layout
    /// ([`ModelStats::max_params_per_rank`]) and `resident` the per-rank state of other
    /// model-stages kept on the same ranks. Infeasible candidates get infinite latency.
    pub fn estimate(
        &self,
        params_per_rank: u64,
        stats: &ModelStats,
        candidate: &Candidate,
        workload: &Workload,
        resident: u64,
    ) -> Estimate {
        let concurrent = self.concurrent_sequences(params_per_rank, stats, candidate, workload, resident);
        let memory = self.memory(params_per_rank, stats, candidate, workload, resident, concurrent);
        let feasible = memory.total() <= self.hardware.usable_bytes();
        if !feasible {
            return Estimate { memory, ideal: LatencyBreakdown::default(), seconds: f64::INFINITY, feasible };
        }
        let ideal = self.latency(stats, candidate, workload, concurrent);
        Estimate { memory, ideal, seconds: ideal.seconds(&self.efficiencies), feasible }
    }

    /// Sequences a replica decodes at once. Generation keeps as many sequences in flight as
    /// the KV cache left after everything else allows (like vLLM's scheduler) and decodes the
    /// rest in further waves; at least one. Other stages: the replica's whole share.
    pub fn concurrent_sequences(
        &self,
        params_per_rank: u64,
        stats: &ModelStats,
        c: &Candidate,
        w: &Workload,
        resident: u64,
    ) -> u64 {
        let b_rep = Self::per_replica(c, w);
        if c.model_stage.stage != Stage::Generation {
            return b_rep;
        }
        let fixed = self.memory(params_per_rank, stats, c, w, resident, 0).total();
        let (kv, logits) = Self::generation_bytes_per_sequence(stats, c, w);
        let room = self.hardware.usable_bytes().saturating_sub(fixed);
        (room / (kv + logits).max(1)).clamp(1, b_rep)
    }

    /// KV-cache and logit bytes one in-flight sequence adds on the heaviest rank.
    fn generation_bytes_per_sequence(stats: &ModelStats, c: &Candidate, w: &Workload) -> (u64, u64) {
        let a = &stats.arch;
        let tp = u64::from(c.layout.tp);
        let kv = kv_cache_bytes_per_sequence(a, w.seq_len()) / tp * stats.max_layers_per_stage(c.layout.pp) / a.layers;
        (kv, Self::head_width(stats, c) * 4)
    }

    /// Outputs of the head per token on one rank: the vocabulary shard, or one value.
    fn head_width(stats: &ModelStats, c: &Candidate) -> u64 {
        if stats.arch.head == OutputHead::Lm {
            stats.arch.vocab / u64::from(c.layout.tp)
        } else {
            1
        }
    }

    /// Sequences of the slowest replica.
    fn per_replica(candidate: &Candidate, workload: &Workload) -> u64 {
        workload.sequences.div_ceil(u64::from(candidate.dp))
    }

    /// Memory of the heaviest rank; `concurrent` sequences in flight for generation.
    pub fn memory(
        &self,
        params_per_rank: u64,
        stats: &ModelStats,
        c: &Candidate,
        w: &Workload,
        resident: u64,
        concurrent: u64,
    ) -> MemoryBreakdown {
        let a = &stats.arch;
        let (tp, pp) = (u64::from(c.layout.tp), u64::from(c.layout.pp));
        let p = params_per_rank;
        let s = w.seq_len();
        let b_rep = Self::per_replica(c, w);
        let micro = u64::from(c.micro_batch).min(b_rep).max(1);
        let layers = stats.max_layers_per_stage(c.layout.pp);
        let mut m = MemoryBreakdown { params: p * a.dtype.bytes(), resident, ..MemoryBreakdown::default() };
        let one_layer = |recompute| {
            activation_bytes_per_layer(s as f64, micro as f64, a.hidden as f64, a.heads as f64, tp as f64, recompute)
                as u64
        };
        // f32 outputs of the head: the vocabulary shard for LM heads, one value for value heads.
        let logits = s * micro * Self::head_width(stats, c) * 4;
        match c.model_stage.stage {
            Stage::Training => {
                m.gradients = p * GRADIENT_BYTES;
                m.optimizer =
                    p * (training_state_bytes_per_param(a.dtype, GRADIENT_BYTES) - a.dtype.bytes() - GRADIENT_BYTES);
                // 1F1B: the first stage holds `pp` in-flight micro-batches of its layers.
                let in_flight = pp.min(b_rep.div_ceil(micro));
                m.activations = one_layer(c.recompute) * layers * in_flight;
                m.logits = 2 * logits;
            }
            Stage::Inference => {
                // Forward only, one layer live at a time, attention fused (scores never stored):
                // the selective-recomputation footprint.
                m.activations = one_layer(Recompute::Selective);
                m.logits = logits;
            }
            Stage::Generation => {
                // The heaviest stage keeps the KV cache of its layers for every sequence in flight.
                let (kv, logits) = Self::generation_bytes_per_sequence(stats, c, w);
                m.kv_cache = concurrent * kv;
                m.logits = concurrent * logits;
                m.activations = one_layer(Recompute::Selective); // prefill, one layer at a time
            }
        }
        let comm_buffers = 4 * s * micro * a.hidden * a.dtype.bytes();
        m.workspace = WORKSPACE_BYTES.min(self.hardware.memory_bytes / 20) + comm_buffers;
        m
    }

    /// Roofline seconds per class for the slowest replica, decoding `concurrent` sequences at
    /// a time.
    pub fn latency(&self, stats: &ModelStats, c: &Candidate, w: &Workload, concurrent: u64) -> LatencyBreakdown {
        let hw = &self.hardware;
        let a = &stats.arch;
        let (tp, pp, dp) = (f64::from(c.layout.tp), f64::from(c.layout.pp), f64::from(c.dp));
        let b_rep = Self::per_replica(c, w) as f64;
        let micro = f64::from(c.micro_batch).min(b_rep).max(1.0);
        let m = (b_rep / micro).ceil();
        let bubble = (m + pp - 1.0) / m;
        let s = w.seq_len() as f64;
        let (layers, h, bytes) = (a.layers as f64, a.hidden as f64, a.dtype.bytes() as f64);

        let n = stats.matmul_params as f64;
        let q_width = a.q_width() as f64;
        // The slowest (fullest) pipeline stage sets the pace: with `ceil(layers/pp)` blocks it
        // works as if the model were spread over `layers / ceil(layers/pp)` stages.
        let devices = tp * layers / stats.max_layers_per_stage(c.layout.pp) as f64;
        let flops_rate = hw.peak_flops * devices;
        let ranks = c.ranks();
        let pp_class = if c.layout.size() <= hw.devices_per_node { OpClass::PpP2pIntra } else { OpClass::PpP2pInter };
        let pp_bw = if pp_class == OpClass::PpP2pIntra { hw.intra_bytes_per_s } else { hw.inter_bytes_per_s };
        let activation_msg = s * micro * h * bytes;
        let ring = |group: f64, msg: f64, bw: f64| {
            if group > 1.0 {
                2.0 * (group - 1.0) / group * msg / bw + 2.0 * (group - 1.0) * MESSAGE_LATENCY_S
            } else {
                0.0
            }
        };
        let mut out = LatencyBreakdown::default();
        let tokens = b_rep * s;
        // Causal attention: 2·layers·s·q_width FLOPs per token forward (QKᵀ and AV, halved).
        let attention_fwd = 2.0 * layers * s * q_width * tokens;
        match c.model_stage.stage {
            Stage::Training => {
                let recompute_fwd = match c.recompute {
                    Recompute::Full => 1.0,
                    _ => 0.0,
                };
                let attn_passes = match c.recompute {
                    Recompute::None => 3.0,
                    _ => 4.0,
                };
                out.add(OpClass::Gemm, (6.0 + 2.0 * recompute_fwd) * n * tokens / flops_rate * bubble);
                out.add(OpClass::Attention, attn_passes * attention_fwd / flops_rate * bubble);
                out.add(
                    OpClass::TpAllReduce,
                    m * (layers / pp) * 4.0 * ring(tp, activation_msg, hw.intra_bytes_per_s) * bubble,
                );
                if pp > 1.0 {
                    out.add(pp_class, (m + pp - 1.0) * 2.0 * (activation_msg / pp_bw + MESSAGE_LATENCY_S));
                }
                let dp_bw = if ranks <= hw.devices_per_node { hw.intra_bytes_per_s } else { hw.inter_bytes_per_s };
                let grad_bytes = n / devices * GRADIENT_BYTES as f64;
                out.add(OpClass::DpAllReduce, ring(dp, grad_bytes, dp_bw));
            }
            Stage::Inference => {
                out.add(OpClass::Gemm, 2.0 * n * tokens / flops_rate * bubble);
                out.add(OpClass::Attention, attention_fwd / flops_rate * bubble);
                out.add(
                    OpClass::TpAllReduce,
                    m * (layers / pp) * 2.0 * ring(tp, activation_msg, hw.intra_bytes_per_s) * bubble,
                );
                if pp > 1.0 {
                    out.add(pp_class, (m + pp - 1.0) * (activation_msg / pp_bw + MESSAGE_LATENCY_S));
                }
            }
            Stage::Generation => {
                let (prompt, response) = (w.prompt_len as f64, w.response_len as f64);
                // Prefill: compute-bound over the prompt.
                out.add(OpClass::Gemm, 2.0 * n * b_rep * prompt / flops_rate);
                out.add(OpClass::Attention, 2.0 * layers * prompt * q_width * b_rep * prompt / flops_rate);
                // Decode, in waves of `concurrent` sequences: every step reads the stage's
                // weights and the KV cache (mean context), stage after stage; compute-bound only
                // for very large batches.
                let batch = concurrent.max(1) as f64;
                let steps = (b_rep / batch).ceil() * response;
                let kv_per_token = 2.0 * layers * (a.kv_heads * a.head_dim) as f64 * bytes;
                let context = prompt + response / 2.0;
                let read = (n * bytes + batch * context * kv_per_token) / devices;
                let memory_time = read / hw.hbm_bytes_per_s * pp;
                let compute_time = 2.0 * n * batch / flops_rate * pp;
                if memory_time >= compute_time {
                    out.add(OpClass::Decode, steps * memory_time);
                } else {
                    out.add(OpClass::Gemm, steps * compute_time);
                }
                let step_msg = batch * h * bytes;
                out.add(OpClass::TpAllReduce, steps * layers * 2.0 * ring(tp, step_msg, hw.intra_bytes_per_s));
                if pp > 1.0 {
                    out.add(pp_class, steps * (pp - 1.0) * (step_msg / pp_bw + MESSAGE_LATENCY_S));
                }
            }
        }
        out
    }
}
