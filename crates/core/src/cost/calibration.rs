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
    /// Decode steps (weights and KV cache read once per token; priced at the larger of that
    /// read and the step's FLOPs).
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

    /// The class's name in reports and JSON (`gemm`, `tp-all-reduce`, …).
    pub fn name(self) -> &'static str {
        match self {
            OpClass::Gemm => "gemm",
            OpClass::Attention => "attention",
            OpClass::Decode => "decode",
            OpClass::TpAllReduce => "tp-all-reduce",
            OpClass::DpAllReduce => "dp-all-reduce",
            OpClass::PpP2pIntra => "pp-p2p-intra",
            OpClass::PpP2pInter => "pp-p2p-inter",
            OpClass::Reshard => "reshard",
        }
    }
}

/// Seconds per operation class: roofline seconds at peak (the cost model's `ideal`), or the
/// seconds an engine measured or a calibrated model predicts. Written as a map from class
/// name to seconds, classes with no time left out.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct OpSeconds(pub [f64; 8]);

impl std::ops::Index<OpClass> for OpSeconds {
    type Output = f64;
    fn index(&self, class: OpClass) -> &f64 {
        &self.0[class.index()]
    }
}

impl std::ops::IndexMut<OpClass> for OpSeconds {
    fn index_mut(&mut self, class: OpClass) -> &mut f64 {
        &mut self.0[class.index()]
    }
}

impl OpSeconds {
    /// Adds `seconds` to `class`.
    pub fn add(&mut self, class: OpClass, seconds: f64) {
        self.0[class.index()] += seconds;
    }

    /// Predicted seconds under `efficiencies`.
    pub fn seconds(&self, efficiencies: &Efficiencies) -> f64 {
        OpClass::ALL.iter().map(|c| self.0[c.index()] / efficiencies.of(*c)).sum()
    }

    /// This breakdown plus `other`, class by class.
    pub fn plus(&self, other: &OpSeconds) -> OpSeconds {
        let mut out = *self;
        for (a, b) in out.0.iter_mut().zip(other.0) {
            *a += b;
        }
        out
    }

    /// Per-class seconds as a name → seconds map (classes with no time left out).
    pub fn named(&self) -> std::collections::BTreeMap<&'static str, f64> {
        OpClass::ALL.iter().filter(|&&c| self[c] > 0.0).map(|&c| (c.name(), self[c])).collect()
    }

    /// Each class's seconds at `efficiencies` (roofline seconds over the fraction of peak).
    pub fn at(&self, efficiencies: &Efficiencies) -> OpSeconds {
        OpSeconds(std::array::from_fn(|k| self.0[k] / efficiencies.0[k]))
    }

    /// The larger of `self` and `other`, class by class.
    pub fn max(&self, other: &OpSeconds) -> OpSeconds {
        OpSeconds(std::array::from_fn(|k| self.0[k].max(other.0[k])))
    }
}

impl Serialize for OpSeconds {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        self.named().serialize(s)
    }
}

impl<'de> Deserialize<'de> for OpSeconds {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<OpSeconds, D::Error> {
        let named = std::collections::BTreeMap::<String, f64>::deserialize(d)?;
        let mut out = OpSeconds::default();
        for (name, seconds) in named {
            let class = OpClass::ALL
                .into_iter()
                .find(|c| c.name() == name)
                .ok_or_else(|| serde::de::Error::custom(format!("unknown operation class `{name}`")))?;
            out[class] = seconds;
        }
        Ok(out)
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

/// One measured stage of one plan: the roofline seconds per class along its critical path
/// (`Planner::stage_parts`), the wall seconds it took and, where the engine timed its
/// operations, the seconds per class (the slowest rank's).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct StageSample {
    /// Roofline seconds per class.
    pub ideal: OpSeconds,
    /// Measured seconds.
    pub measured: f64,
    /// Measured seconds per class (`None`: only the stage's total is known).
    #[serde(default)]
    pub timed: Option<OpSeconds>,
}

impl StageSample {
    /// The rows this sample adds to a fit, each `(row, target)` to be explained by
    /// `Σ_c row_c · x_c = target`, in units of the stage's wall time (so short stages count as
    /// much as long ones, and a class's error counts as its relative error times its share of
    /// the stage). Where the engine timed its operations, one row per class the model prices
    /// and the engine timed, whose seconds are scaled by the stage's wall over its timed
    /// seconds (time no timer saw — elementwise work, waiting on a slower rank — is shared in
    /// proportion); otherwise one row for the whole stage. Why shares and not each class's own
    /// relative error: a class is then fitted to the stages where it takes much of the time.
    /// Weighted alike, the stages where a class is a sliver pulled it as hard as those it
    /// dominates, toward its fastest showing (an over-prediction's relative error is unbounded,
    /// an under-prediction's at most 1), and `bench calibration` predicted nearly every plan's
    /// step short.
    fn rows(&self) -> Vec<([f64; 8], f64)> {
        if self.measured <= 0.0 || !self.ideal.0.iter().any(|&v| v > 0.0) {
            return Vec::new();
        }
        let timed_total = self.timed.map_or(0.0, |t| t.0.iter().sum::<f64>());
        let Some(timed) = self.timed.filter(|_| timed_total > 0.0) else {
            return vec![(self.ideal.0.map(|v| v / self.measured), 1.0)];
        };
        let scale = self.measured / timed_total;
        OpClass::ALL
            .iter()
            .map(|c| c.index())
            .filter(|&k| self.ideal.0[k] > 0.0 && timed.0[k] > 0.0)
            .map(|k| {
                let mut row = [0.0; 8];
                row[k] = self.ideal.0[k] / self.measured;
                (row, timed.0[k] * scale / self.measured)
            })
            .collect()
    }
}

/// How strongly a fit keeps a class near its current efficiency (relative to one sample).
const FIT_PRIOR_WEIGHT: f64 = 1e-6;
/// The range a fitted efficiency may take: above 1 where the roofline overstates the work
/// (a probe-measured peak), far below where time the model does not price (elementwise work,
/// waiting for a slower rank) shows up in a class.
const EFFICIENCY_RANGE: (f64, f64) = (1e-4, 10.0);

impl Efficiencies {
    /// Fits every class's efficiency to measured stages: the inverse efficiencies `x_c ≥ 0`
    /// that minimize the squared errors of the samples' rows in units of each stage's wall time
    /// (each class's share of it where the engine timed its operations, the stage's total
    /// otherwise; see [`StageSample`]), with a weak pull toward the current values so a class
    /// no sample exercises keeps its efficiency. The normal equations of eight unknowns are
    /// solved exactly, with an active set for the bound.
    pub fn fit_stages(&mut self, samples: &[StageSample]) {
        let rows: Vec<([f64; 8], f64)> = samples.iter().flat_map(StageSample::rows).collect();
        if rows.is_empty() {
            return;
        }
        let prior: [f64; 8] = self.0.map(|e| 1.0 / e);
        // Normal equations A x = b of the weighted least squares plus the prior term.
        let mut a = [[0.0f64; 8]; 8];
        let mut b = [0.0f64; 8];
        for (f, y) in &rows {
            for i in 0..8 {
                b[i] += f[i] * y;
                for j in 0..8 {
                    a[i][j] += f[i] * f[j];
                }
            }
        }
        for i in 0..8 {
            // Scaled to the class's own curvature, the pull barely moves a class the data
            // determines; a class no sample exercises is held at its current value.
            let w = if a[i][i] > 0.0 { FIT_PRIOR_WEIGHT * a[i][i] } else { 1.0 };
            a[i][i] += w;
            b[i] += w * prior[i];
        }
        // Active set: solve the free classes exactly; any below the bound is fixed there and
        // the rest solved again (at most eight rounds).
        let floor = 1.0 / EFFICIENCY_RANGE.1;
        let mut fixed = [false; 8];
        let mut x = prior;
        for _ in 0..8 {
            let free: Vec<usize> = (0..8).filter(|&i| !fixed[i]).collect();
            let m: Vec<Vec<f64>> = free.iter().map(|&i| free.iter().map(|&j| a[i][j]).collect()).collect();
            let rhs: Vec<f64> = free
                .iter()
                .map(|&i| b[i] - (0..8).filter(|&j| fixed[j]).map(|j| a[i][j] * floor).sum::<f64>())
                .collect();
            let Some(solved) = solve_linear(m, rhs) else { return };
            for (k, &i) in free.iter().enumerate() {
                x[i] = solved[k];
            }
            let below: Vec<usize> = free.iter().copied().filter(|&i| x[i] < floor).collect();
            if below.is_empty() {
                break;
            }
            for i in below {
                fixed[i] = true;
                x[i] = floor;
            }
        }
        self.0 = x.map(|v| (1.0 / v).clamp(EFFICIENCY_RANGE.0, EFFICIENCY_RANGE.1));
    }
}

/// `m · x = rhs` by Gaussian elimination with partial pivoting (`None` when singular).
fn solve_linear(mut m: Vec<Vec<f64>>, mut rhs: Vec<f64>) -> Option<Vec<f64>> {
    let n = rhs.len();
    for col in 0..n {
        let pivot = (col..n).max_by(|&p, &q| m[p][col].abs().total_cmp(&m[q][col].abs()))?;
        if m[pivot][col].abs() < 1e-300 {
            return None;
        }
        m.swap(col, pivot);
        rhs.swap(col, pivot);
        let (top, below) = m.split_at_mut(col + 1);
        let pivot_row = &top[col];
        for (r, row) in below.iter_mut().enumerate() {
            let f = row[col] / pivot_row[col];
            for (x, p) in row[col..].iter_mut().zip(&pivot_row[col..]) {
                *x -= f * p;
            }
            rhs[col + 1 + r] -= f * rhs[col];
        }
    }
    let mut x = vec![0.0; n];
    for row in (0..n).rev() {
        let rest: f64 = (row + 1..n).map(|k| m[row][k] * x[k]).sum();
        x[row] = (rhs[row] - rest) / m[row][row];
    }
    Some(x)
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

    #[test]
    fn a_stage_fit_recovers_the_efficiencies_that_produced_the_stages() {
        // Stages mixing GEMM, attention and DP all-reduce in varied proportions, timed at
        // efficiencies 0.8, 0.2 and 0.05; decode never appears and keeps its prior.
        let truth = [0.8, 0.2, 0.5, 0.6, 0.05, 0.6, 0.6, 0.6];
        let samples: Vec<StageSample> = (0..12)
            .map(|k| {
                let mut ideal = [0.0; 8];
                ideal[OpClass::Gemm.index()] = 1.0 + k as f64;
                ideal[OpClass::Attention.index()] = 0.3 * ((k * 7) % 5) as f64;
                ideal[OpClass::DpAllReduce.index()] = 0.01 * ((k * 3) % 4) as f64;
                let measured = (0..8).map(|c| ideal[c] / truth[c]).sum();
                StageSample { ideal: OpSeconds(ideal), measured, timed: None }
            })
            .collect();
        let mut e = Efficiencies::default();
        e.fit_stages(&samples);
        for c in [OpClass::Gemm, OpClass::Attention, OpClass::DpAllReduce] {
            assert!((e.of(c) / truth[c.index()] - 1.0).abs() < 0.01, "{c:?}: {} vs {}", e.of(c), truth[c.index()]);
        }
        assert!((e.of(OpClass::Decode) - Efficiencies::default().of(OpClass::Decode)).abs() < 1e-9);
    }

    #[test]
    fn per_class_timers_separate_classes_whose_stage_totals_cannot() {
        // Every stage mixes GEMM and attention in the same proportion, so stage totals only
        // fix a blend; the per-class timers (which saw 90% of the wall time, the rest shared
        // in proportion) recover each class: GEMM at 0.5, attention at 0.1.
        let truth = [0.5, 0.1];
        let samples: Vec<StageSample> = (1..6)
            .map(|k| {
                let mut ideal = OpSeconds::default();
                ideal[OpClass::Gemm] = k as f64;
                ideal[OpClass::Attention] = 0.5 * k as f64;
                let mut timed = OpSeconds::default();
                timed[OpClass::Gemm] = 0.9 * ideal[OpClass::Gemm] / truth[0];
                timed[OpClass::Attention] = 0.9 * ideal[OpClass::Attention] / truth[1];
                let measured = (timed[OpClass::Gemm] + timed[OpClass::Attention]) / 0.9;
                StageSample { ideal, measured, timed: Some(timed) }
            })
            .collect();
        let mut e = Efficiencies::default();
        e.fit_stages(&samples);
        assert!((e.of(OpClass::Gemm) / truth[0] - 1.0).abs() < 1e-3, "{:?}", e);
        assert!((e.of(OpClass::Attention) / truth[1] - 1.0).abs() < 1e-3, "{:?}", e);
        // The stage totals alone explain the same walls with other efficiencies.
        let mut totals_only = Efficiencies::default();
        let untimed: Vec<StageSample> = samples.iter().map(|s| StageSample { timed: None, ..*s }).collect();
        totals_only.fit_stages(&untimed);
        assert!((totals_only.of(OpClass::Attention) / truth[1] - 1.0).abs() > 0.05, "{:?}", totals_only);
    }

    #[test]
    fn a_class_is_fitted_to_the_stages_it_dominates() {
        // GEMM takes 90% of stage A at 20x its roofline and 1% of stage B at 2x; the other
        // 10% and 99% are DP all-reduce at 4x. Fitted by each class's own relative error,
        // GEMM would land near 2x and stage A come out five times short.
        let stage = |gemm_ideal: f64, gemm_ratio: f64, dp_ideal: f64| {
            let mut ideal = OpSeconds::default();
            ideal[OpClass::Gemm] = gemm_ideal;
            ideal[OpClass::DpAllReduce] = dp_ideal;
            let mut timed = OpSeconds::default();
            timed[OpClass::Gemm] = gemm_ideal * gemm_ratio;
            timed[OpClass::DpAllReduce] = dp_ideal * 4.0;
            StageSample { ideal, measured: timed.0.iter().sum(), timed: Some(timed) }
        };
        let samples = [stage(0.9 / 20.0, 20.0, 0.1 / 4.0), stage(0.01 / 2.0, 2.0, 0.99 / 4.0)];
        let mut e = Efficiencies::default();
        e.fit_stages(&samples);
        let a = &samples[0];
        let predicted = a.ideal.seconds(&e);
        assert!((predicted / a.measured - 1.0).abs() < 0.05, "stage A: {predicted} against {}", a.measured);
        assert!((e.of(OpClass::DpAllReduce) - 0.25).abs() < 1e-3, "{e:?}");
    }
}
