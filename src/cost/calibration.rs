//! Calibration: one efficiency per operation class, refined from measured times.
//!
//! Predicted time of a class is `ideal / efficiency`, where `ideal` is the roofline time at the
//! hardware's peak. Measurements are operation-level, so every plan built from the same classes
//! benefits from what one plan taught.

use serde::{Deserialize, Serialize};

/// Operation classes of the latency model.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum OpClass {
    /// Dense matrix products (compute-bound).
    Gemm,
    /// Attention score and value products.
    Attention,
    /// Memory-bound decode steps (weights and KV cache read once per token).
    Decode,
    /// Tensor-parallel all-reduce inside a node.
    TpAllReduce,
    /// Data-parallel gradient all-reduce.
    DpAllReduce,
    /// Pipeline send/recv inside a node.
    PpP2pIntra,
    /// Pipeline send/recv across nodes.
    PpP2pInter,
    /// Point-to-point resharding: the weight sync and transitions.
    Reshard,
}

impl OpClass {
    /// Every class, in index order.
    pub const ALL: [OpClass; 8] = [
        OpClass::Gemm,
        OpClass::Attention,
        OpClass::Decode,
        OpClass::TpAllReduce,
        OpClass::DpAllReduce,
        OpClass::PpP2pIntra,
        OpClass::PpP2pInter,
        OpClass::Reshard,
    ];

    /// Index into per-class arrays.
    pub fn index(self) -> usize {
        self as usize
    }
}

/// One measured operation: its roofline time and the time it took.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Measurement {
    /// The class.
    pub class: OpClass,
    /// Roofline time at peak, seconds.
    pub ideal_seconds: f64,
    /// Measured time, seconds.
    pub measured_seconds: f64,
}

/// Achieved fraction of peak, per class.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Efficiencies(pub [f64; 8]);

impl Default for Efficiencies {
    /// Conservative starting points (below what tuned kernels and collectives reach), so the
    /// first plans are admitted on pessimistic estimates and calibration only speeds them up.
    fn default() -> Self {
        Efficiencies([0.45, 0.35, 0.5, 0.6, 0.6, 0.6, 0.6, 0.6])
    }
}

impl Efficiencies {
    /// Efficiency of `class`.
    pub fn of(&self, class: OpClass) -> f64 {
        self.0[class.index()]
    }

    /// Folds measurements in: per class, the efficiency that explains them
    /// (`Σ ideal / Σ measured`) is blended with the current value by `weight` (1 = replace).
    pub fn fit(&mut self, measurements: &[Measurement], weight: f64) {
        for class in OpClass::ALL {
            let (ideal, measured) = measurements
                .iter()
                .filter(|m| m.class == class && m.measured_seconds > 0.0)
                .fold((0.0, 0.0), |(i, m), x| (i + x.ideal_seconds, m + x.measured_seconds));
            if measured > 0.0 && ideal > 0.0 {
                let observed = (ideal / measured).clamp(1e-3, 1.0);
                let w = weight.clamp(0.0, 1.0);
                self.0[class.index()] = (1.0 - w) * self.0[class.index()] + w * observed;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fitting_recovers_the_efficiency_that_produced_the_measurements() {
        let mut e = Efficiencies::default();
        let ms: Vec<Measurement> = [1.0, 2.0, 4.0]
            .iter()
            .map(|&i| Measurement { class: OpClass::Gemm, ideal_seconds: i, measured_seconds: i / 0.72 })
            .collect();
        e.fit(&ms, 1.0);
        assert!((e.of(OpClass::Gemm) - 0.72).abs() < 1e-12);
        assert_eq!(e.of(OpClass::Decode), Efficiencies::default().of(OpClass::Decode), "other classes untouched");
        e.fit(&[Measurement { class: OpClass::Gemm, ideal_seconds: 1.0, measured_seconds: 2.0 }], 0.5);
        assert!((e.of(OpClass::Gemm) - (0.5 * 0.72 + 0.5 * 0.5)).abs() < 1e-12);
    }
}
