//! `bench engine --device`'s kernel table: where one training step's device time goes. The step
//! runs once more with every launch bracketed by device events (`nereus_exec::backend::profile`),
//! and the launches are grouped into families: the GEMMs, attention forward and backward, the
//! norms (RMSNorm and the residual add), the LM head and its loss, AdamW with the gradient norm,
//! and the rest (SwiGLU, RoPE, the embedding, casts, copies).
//!
//! Each family is set beside its analytic work and roofline. GEMMs and attention count FLOPs
//! (the model's, as the step rows count them, plus the fused LM head's recomputed product; the
//! attention backward at twice the forward) over the device's dense peak; the memory-bound
//! families count the bytes their kernels must move at the least (below) over its HBM
//! bandwidth. The classes the cost model prices (GEMMs and attention, `OpClass::Gemm` and
//! `OpClass::Attention`) also get its prediction for the step: the roofline time its own
//! formula gives (`CostModel::latency`) over its uncalibrated efficiency, and the efficiency the
//! measurement implies (what calibration would set).
//!
//! Bytes counted per training step of `n` tokens (bf16 activations, `L` blocks):
//! - norms, `L·32·n·C + 12·n·C`: per block two RMSNorms forward, each reading `x` and the
//!   residual and writing the sum and `y` (the residual adds fused into them; the first block's
//!   first norm has no residual to add), and backward (reading `x`, `dy` and `dx`, writing `dx`);
//!   the final norm likewise, which adds the last block's residual in its own pass;
//! - the head and loss, `6·n·V`: the statistics read each chunk of logits, the backward reads
//!   and rewrites it;
//! - AdamW, `34·P`: f32 master, moments and gradient read, master and moments written, the bf16
//!   copy written, the gradient read again for its norm;
//! - the rest, `L·(16·n·F + 8·n·(Q+K)) + 8·n·C`: SwiGLU forward and backward, RoPE on q and k
//!   both ways, the embedding.

use nereus_core::cost::{CostModel, Efficiencies, EngineKind, Hardware, ModelStats, OpClass, OpSeconds, Workload};
use nereus_core::model::{Architecture, Catalogue, Layout};
use nereus_core::plan::{Candidate, ModelStage, Recompute, Role, Stage};
use nereus_exec::backend::profile::{Work, WorkTime};
use nereus_kernels::Source;

use super::measure::{attention_flops, step_gemms, Gemm as StepGemm, Peaks, Row};
use crate::bench::Floor;

/// The families a training step's device time is read in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Family {
    /// The vendor GEMM.
    Gemm,
    /// Attention's forward kernels (flash or scalar).
    AttentionForward,
    /// Attention's backward kernels.
    AttentionBackward,
    /// RMSNorm and the residual add.
    Norms,
    /// The LM head's statistics and backward, and the loss.
    HeadAndLoss,
    /// AdamW and the gradient norm's sum of squares.
    Adamw,
    /// SwiGLU, RoPE, the embedding, casts, copies, sampling.
    Other,
}

impl Family {
    /// Every family, in table order.
    pub const ALL: [Family; 7] = [
        Family::Gemm,
        Family::AttentionForward,
        Family::AttentionBackward,
        Family::Norms,
        Family::HeadAndLoss,
        Family::Adamw,
        Family::Other,
    ];

    /// The row's phase name.
    pub fn phase(self) -> &'static str {
        match self {
            Family::Gemm => "kernels:gemm",
            Family::AttentionForward => "kernels:attention_forward",
            Family::AttentionBackward => "kernels:attention_backward",
            Family::Norms => "kernels:norms",
            Family::HeadAndLoss => "kernels:head_and_loss",
            Family::Adamw => "kernels:adamw",
            Family::Other => "kernels:other",
        }
    }

    /// The family a launch belongs to.
    pub fn of(work: Work) -> Family {
        let kernel = match work {
            Work::Gemm => return Family::Gemm,
            Work::Kernel(kernel) => kernel,
        };
        let backward = kernel.name().contains("backward");
        match kernel.source() {
            Source::Attention | Source::FlashAttention if backward => Family::AttentionBackward,
            Source::Attention | Source::FlashAttention => Family::AttentionForward,
            Source::Norm => Family::Norms,
            Source::Logits => Family::HeadAndLoss,
            Source::Adamw => Family::Adamw,
            _ => Family::Other,
        }
    }

    /// The cost model's class for the family, where it prices one.
    fn class(self) -> Option<OpClass> {
        match self {
            Family::Gemm => Some(OpClass::Gemm),
            Family::AttentionForward | Family::AttentionBackward => Some(OpClass::Attention),
            _ => None,
        }
    }
}

/// A family's analytic work in one training step: FLOPs (compute-bound families) or bytes.
fn analytic(family: Family, a: &Architecture, (b, t): (usize, usize), params: u64) -> (f64, f64) {
    let n = (b * t) as f64;
    let (c, f, v, l) = (a.hidden as f64, a.ffn as f64, a.vocab as f64, a.layers as f64);
    let (q, k) = (a.q_width() as f64, a.kv_width() as f64);
    let attention = attention_flops(a, b, t);
    match family {
        Family::Gemm => {
            let model: f64 = step_gemms(a, b * t).iter().map(StepGemm::flops).sum();
            (model + 2.0 * n * c * v, 0.0)
        }
        Family::AttentionForward => (attention / 3.0, 0.0),
        Family::AttentionBackward => (2.0 * attention / 3.0, 0.0),
        Family::Norms => (0.0, l * 32.0 * n * c + 12.0 * n * c),
        Family::HeadAndLoss => (0.0, 6.0 * n * v),
        Family::Adamw => (0.0, 34.0 * params as f64),
        // SwiGLU both ways, the fused projection's split and merge (each reads and writes q, k
        // and v once), the embedding.
        Family::Other => (0.0, l * (16.0 * n * f + 8.0 * n * (q + 2.0 * k)) + 8.0 * n * c),
    }
}

/// The cost model's roofline seconds per class for one training step of `(b, t)` of `arch` on
/// one device of `peaks` (the planner's own formula, `CostModel::latency`).
fn cost_model_ideal(arch: &Architecture, (b, t): (usize, usize), peaks: Peaks) -> OpSeconds {
    let hardware = Hardware {
        devices: 1,
        devices_per_node: 1,
        memory_bytes: u64::MAX / 4,
        headroom: 0.0,
        peak_flops: peaks.flops,
        hbm_bytes_per_s: peaks.hbm_bytes_per_s,
        intra_bytes_per_s: peaks.hbm_bytes_per_s,
        inter_bytes_per_s: peaks.hbm_bytes_per_s,
        cores_per_node: None,
        communicator_setup_s: 0.0,
    };
    let cost = CostModel { hardware, efficiencies: Efficiencies::default(), engine: EngineKind::Device };
    let stats = ModelStats::new(&Catalogue::new(arch.clone()));
    let model_stage = ModelStage::new(Role::Actor, Stage::Training);
    let layout = Layout::new(1, 1);
    let candidate = Candidate { model_stage, layout, dp: 1, recompute: Recompute::None, micro_batch: b as u32 };
    let (sequences, seq) = (b as u64, t as u64);
    let workload = Workload {
        sequences,
        prompt_len: 0,
        response_len: seq,
        micro_batch: sequences,
        mini_batch: sequences,
        epochs: 1,
    };
    cost.latency(&stats, &candidate, &workload)
}

/// The cost model's prediction for one op class of the step beside the measurement.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ClassCheck {
    /// The class.
    pub class: OpClass,
    /// Its roofline seconds by the cost model's formula.
    pub ideal: f64,
    /// Its predicted seconds (roofline over the uncalibrated efficiency).
    pub predicted: f64,
    /// The event-timed seconds of the class's families.
    pub measured: f64,
}

impl ClassCheck {
    /// The floors that hold the prediction within `[0.67, 1.5]` of the measurement (GPUs only).
    pub fn floors(&self) -> [Floor; 2] {
        let name = format!("cost_model_{}_over_measured", self.class.name().replace('-', "_"));
        let ratio = self.predicted / self.measured;
        [
            Floor::at_least(&format!("{name}_low"), ratio, 0.67, "ratio"),
            Floor::at_most(&format!("{name}_high"), ratio, 1.5, "ratio"),
        ]
    }
}

/// The kernel table's rows (one per family with launches) and, with peaks, the cost model's
/// prediction for each class it prices beside the measurement.
pub fn table(
    times: &[WorkTime],
    arch: &Architecture,
    batch: (usize, usize),
    params: u64,
    reference: f64,
    peaks: Option<Peaks>,
) -> (Vec<Row>, Vec<ClassCheck>) {
    let tokens = (batch.0 * batch.1) as u64;
    let mut rows = Vec::new();
    let mut measured = OpSeconds::default();
    for family in Family::ALL {
        let mine = times.iter().filter(|w| Family::of(w.work) == family);
        let (launches, seconds) = mine.fold((0, 0.0), |(l, s), w| (l + w.launches, s + w.seconds));
        if launches == 0 {
            continue;
        }
        let (flops, bytes) = analytic(family, arch, batch, params);
        let mut row = Row::new(family.phase(), tokens, seconds, flops, reference);
        row.fraction_of_peak = peaks.filter(|_| flops > 0.0).map(|pk| flops / seconds / pk.flops);
        row.fraction_of_roofline = peaks.filter(|_| bytes > 0.0).map(|pk| bytes / pk.hbm_bytes_per_s / seconds);
        (row.kernel_launches, row.bytes) = (Some(launches), (bytes > 0.0).then_some(bytes));
        if let Some(class) = family.class() {
            measured.add(class, seconds);
        }
        rows.push(row);
    }
    let Some(peaks) = peaks else { return (rows, Vec::new()) };
    let ideal = cost_model_ideal(arch, batch, peaks);
    let efficiencies = Efficiencies::default();
    let checks = [OpClass::Gemm, OpClass::Attention]
        .into_iter()
        .map(|class| {
            let ideal = ideal.0[class.index()];
            ClassCheck { class, ideal, predicted: ideal / efficiencies.of(class), measured: measured.0[class.index()] }
        })
        .filter(|c| c.measured > 0.0)
        .collect();
    (rows, checks)
}

#[cfg(test)]
mod tests {
    use super::*;
    use nereus_kernels::Kernel;

    #[test]
    fn every_kernel_falls_in_the_family_its_source_and_direction_say() {
        assert_eq!(Family::of(Work::Gemm), Family::Gemm);
        assert_eq!(Family::of(Work::Kernel(Kernel::FlashForward64)), Family::AttentionForward);
        assert_eq!(Family::of(Work::Kernel(Kernel::FlashBackwardDkv64)), Family::AttentionBackward);
        assert_eq!(Family::of(Work::Kernel(Kernel::AttentionBackward)), Family::AttentionBackward);
        assert_eq!(Family::of(Work::Kernel(Kernel::LogitsRowStats)), Family::HeadAndLoss);
        assert_eq!(Family::of(Work::Kernel(Kernel::Adamw)), Family::Adamw);
        assert_eq!(Family::of(Work::Kernel(Kernel::CastF32ToBf16)), Family::Other);
    }

    /// The kernel table's FLOPs, enumerated product by product (`step_gemms`, plus the fused
    /// head's recompute) and from attention's causal count, against the cost model's own
    /// formula for the same step (`CostModel::latency` at a peak of 1 FLOP/s gives FLOPs): the
    /// GEMMs agree exactly, attention within `(T + 1) / T` (the model counts `T²/2` scores, the
    /// kernels `T(T + 1)/2`). Prints the table's analytic work for the Llama-3.2-1B step.
    #[test]
    fn the_tables_flops_are_the_cost_models_for_the_same_step() {
        let (arch, batch) = (super::super::device::EngineShape::Llama1b.arch(), (1, 4096));
        let params = Catalogue::new(arch.clone()).parameter_count();
        let ideal = cost_model_ideal(&arch, batch, Peaks { flops: 1.0, hbm_bytes_per_s: 1.0 });
        let work = |f| analytic(f, &arch, batch, params);
        let gemm = work(Family::Gemm).0;
        assert!((ideal.0[OpClass::Gemm.index()] / gemm - 1.0).abs() < 1e-12, "{ideal:?} against {gemm}");
        let attention = work(Family::AttentionForward).0 + work(Family::AttentionBackward).0;
        let ratio = attention / ideal.0[OpClass::Attention.index()];
        assert!((ratio - 4097.0 / 4096.0).abs() < 1e-9, "attention {attention} over the model's: {ratio}");
        for f in Family::ALL {
            let (flops, bytes) = work(f);
            eprintln!("{:<28} {:>10.1} TFLOP {:>8.2} GB", f.phase(), flops / 1e12, bytes / 1e9);
        }
    }
}
