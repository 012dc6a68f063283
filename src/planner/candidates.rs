//! The candidates of one search: per model-stage, every layout `(tp, pp)` with TP inside a node
//! and every replica count `dp`, each with its speed-for-memory variants — recomputation and
//! micro-batch size for training, micro-batch size for inference, decode-wave size for
//! generation — ordered from the fastest and largest to the slimmest, and estimated lazily: a
//! frontier takes, per layout and replica count, the first variant that fits (a rank on its
//! own, and the per-rank caps of a capped round), so most variants are never estimated.

use std::collections::BTreeMap;

use super::search::{Caps, Planner};
use crate::cost::{EngineKind, Estimate};
use crate::model::Layout;
use crate::plan::{Candidate, ModelStage, Recompute, Stage};

/// A candidate with its estimate.
pub type Scored = (Candidate, Estimate);

/// One layout and replica count of a model-stage.
struct Entry {
    layout: Layout,
    dp: u32,
    /// The variants estimated so far, in order.
    estimated: Vec<Scored>,
    /// Every variant, in order: `(micro_batch, recompute)`, micro-batch sizes descending and,
    /// for each, recomputation from none to full.
    order: Vec<(u32, Recompute)>,
    /// Whether the first fitting variant is the fastest fitting one: true for generation,
    /// whose larger decode waves are faster; not for training and inference, where a smaller
    /// micro-batch shrinks the pipeline bubble.
    first_is_fastest: bool,
}

/// Every model-stage's entries, estimated as far as the frontiers asked so far.
pub struct Pool<'p> {
    planner: &'p Planner,
    entries: BTreeMap<ModelStage, Vec<Entry>>,
    /// Uncapped frontiers already built, by model-stage, replica limit and preferred candidate.
    uncapped: BTreeMap<(ModelStage, u32, Option<Candidate>), Vec<Scored>>,
}

impl<'p> Pool<'p> {
    /// The entries of every model-stage of `planner`'s job (nothing estimated yet).
    pub fn new(planner: &'p Planner) -> Pool<'p> {
        let entries = planner.model_stages().iter().map(|&ms| (ms, entries_of(planner, ms))).collect();
        Pool { planner, entries, uncapped: BTreeMap::new() }
    }

    /// The latency-versus-ranks frontier of `ms` (ascending ranks, strictly falling latency)
    /// from the first fitting variant of every entry; among equally fast candidates with the
    /// same rank count, `prefer` (the current one) wins. Entries of more than `max_dp` replicas
    /// are left out.
    pub fn frontier(
        &mut self,
        ms: ModelStage,
        prefer: Option<&Candidate>,
        caps: Option<&Caps>,
        max_dp: u32,
    ) -> Vec<Scored> {
        let key = (ms, max_dp, prefer.copied());
        if caps.is_none() {
            if let Some(f) = self.uncapped.get(&key) {
                return f.clone();
            }
        }
        let usable = self.planner.cost().hardware.usable_bytes();
        let fits = |e: &Estimate| {
            e.feasible
                && e.memory.peak() <= usable
                && caps
                    .is_none_or(|c| e.memory.state.total() <= c.state(ms) && e.memory.transient.total() <= c.transient)
        };
        let mut best: BTreeMap<u32, Scored> = BTreeMap::new();
        let planner = self.planner;
        for entry in self.entries.get_mut(&ms).into_iter().flatten().filter(|e| e.dp <= max_dp) {
            // Uncapped, only the first fitting recomputation of each micro-batch size can be the
            // fastest; under caps, every variant is considered.
            let found = match caps {
                None => entry.quick_fitting(planner, ms, &fits),
                Some(_) => entry.fastest_fitting(planner, ms, &fits),
            };
            let Some((c, e)) = found else { continue };
            let slot = best.entry(c.ranks()).or_insert((c, e));
            if e.seconds < slot.1.seconds || (e.seconds == slot.1.seconds && Some(&c) == prefer) {
                *slot = (c, e);
            }
        }
        let mut frontier: Vec<Scored> = Vec::new();
        for (_, point) in best {
            if frontier.last().is_none_or(|last| point.1.seconds < last.1.seconds) {
                frontier.push(point);
            }
        }
        if caps.is_none() {
            self.uncapped.insert(key, frontier.clone());
        }
        frontier
    }

    /// Every variant of every entry of `ms` that fits a rank of its own, as the frontier counts
    /// fitting (the exact solver's input: nothing pruned).
    pub fn every_fitting(&mut self, ms: ModelStage) -> Vec<Scored> {
        let planner = self.planner;
        let usable = planner.cost().hardware.usable_bytes();
        let mut out = Vec::new();
        for entry in self.entries.get_mut(&ms).into_iter().flatten() {
            for k in 0..entry.order.len() {
                let (c, e) = entry.estimate(planner, ms, k);
                if e.feasible && e.memory.peak() <= usable {
                    out.push((c, e));
                }
            }
        }
        out
    }

    /// Every fitting first variant of `ms` (not reduced to a frontier), for brute-force checks.
    pub fn all_fitting(&mut self, ms: ModelStage) -> Vec<Scored> {
        let planner = self.planner;
        let fits = |e: &Estimate| e.feasible;
        self.entries
            .get_mut(&ms)
            .into_iter()
            .flatten()
            .filter_map(|entry| entry.first_fitting(planner, ms, &fits))
            .collect()
    }

    /// The smallest peak any variant of `ms` reaches (for the "does not fit" message).
    pub fn smallest_peak(&mut self, ms: ModelStage) -> u64 {
        let planner = self.planner;
        let never = |_: &Estimate| false;
        let mut least = u64::MAX;
        for entry in self.entries.get_mut(&ms).into_iter().flatten() {
            entry.first_fitting(planner, ms, &never);
            least = least.min(entry.estimated.iter().map(|(_, e)| e.memory.peak()).min().unwrap_or(u64::MAX));
        }
        if least == u64::MAX {
            0
        } else {
            least
        }
    }
}

impl Entry {
    /// The fastest variant that `fits` among the first fitting recomputation of each
    /// micro-batch size (recomputation only trades speed for memory), estimating only those.
    fn quick_fitting(&mut self, planner: &Planner, ms: ModelStage, fits: &dyn Fn(&Estimate) -> bool) -> Option<Scored> {
        if self.first_is_fastest {
            return self.first_fitting(planner, ms, fits);
        }
        let sizes: Vec<u32> = {
            let mut v: Vec<u32> = self.order.iter().map(|(m, _)| *m).collect();
            v.dedup();
            v
        };
        let mut best: Option<Scored> = None;
        for micro in sizes {
            for k in 0..self.order.len() {
                if self.order[k].0 != micro {
                    continue;
                }
                let (c, e) = self.estimate(planner, ms, k);
                if fits(&e) {
                    if best.is_none_or(|b| e.seconds < b.1.seconds) {
                        best = Some((c, e));
                    }
                    break;
                }
            }
        }
        best
    }

    /// Variant `k`, estimated once.
    fn estimate(&mut self, planner: &Planner, ms: ModelStage, k: usize) -> Scored {
        while self.estimated.len() <= k {
            let (micro_batch, recompute) = self.order[self.estimated.len()];
            let c = Candidate { model_stage: ms, layout: self.layout, dp: self.dp, recompute, micro_batch };
            self.estimated.push((c, planner.estimate(&c)));
        }
        self.estimated[k]
    }

    /// The fastest variant that `fits`, estimating every variant.
    fn fastest_fitting(
        &mut self,
        planner: &Planner,
        ms: ModelStage,
        fits: &dyn Fn(&Estimate) -> bool,
    ) -> Option<Scored> {
        self.first_fitting(planner, ms, &|_| false);
        self.estimated.iter().filter(|(_, e)| fits(e)).min_by(|a, b| a.1.seconds.total_cmp(&b.1.seconds)).copied()
    }

    /// The first variant, in order, that `fits`, estimating variants as needed.
    fn first_fitting(&mut self, planner: &Planner, ms: ModelStage, fits: &dyn Fn(&Estimate) -> bool) -> Option<Scored> {
        (0..self.order.len()).map(|k| self.estimate(planner, ms, k)).find(|(_, e)| fits(e))
    }
}

/// The entries of `ms`: every power-of-two layout with TP inside a node that the model divides
/// into, every replica count that divides the batch (and, for training, the mini-batch), each
/// with its variants.
fn entries_of(planner: &Planner, ms: ModelStage) -> Vec<Entry> {
    let hw = &planner.cost().hardware;
    let workload = planner.workload(ms);
    let sequences = workload.sequences;
    let catalogue = planner.catalogue(ms.role);
    let layers = catalogue.arch.layers as u32;
    // The reference engine keeps every activation: recomputation is a GPU-engine option.
    let recomputes: &[Recompute] = match (ms.trains(), planner.cost().engine) {
        (true, EngineKind::Gpu) => &[Recompute::None, Recompute::Selective, Recompute::Full],
        _ => &[Recompute::None],
    };
    let halvings = |from: u64| -> Vec<u32> {
        std::iter::successors(Some(from.clamp(1, u64::from(u32::MAX)) as u32), |m| (*m > 1).then_some(m / 2)).collect()
    };
    // The paper's space: TP and PP powers of two, TP inside a node, and DP degrees that divide
    // the global batch (every replica takes the same share, as the accumulation steps assume).
    let powers = |limit: u32| std::iter::successors(Some(1u32), |x| x.checked_mul(2)).take_while(move |&x| x <= limit);
    let mut out = Vec::new();
    for tp in powers(hw.devices_per_node.min(hw.devices)).filter(|t| hw.devices_per_node.is_multiple_of(*t)) {
        for pp in powers((hw.devices / tp).min(layers)) {
            let layout = Layout::new(tp, pp);
            if catalogue.check_layout(layout).is_err() {
                continue;
            }
            let max_dp = (hw.devices / layout.size()).min(sequences.min(u64::from(u32::MAX)) as u32);
            let divides = |dp: &u32| {
                let dp = u64::from(*dp);
                sequences.is_multiple_of(dp) && (!ms.trains() || workload.mini_batch.max(1).is_multiple_of(dp))
            };
            for dp in (1..=max_dp).filter(divides) {
                let batch = sequences / u64::from(dp);
                // Training and inference: the configured micro-batch or smaller. Generation:
                // waves of the whole share or smaller (less KV cache, more decode steps).
                let micro =
                    if ms.stage == Stage::Generation { halvings(batch) } else { halvings(workload.micro_batch.max(1)) };
                let order = micro.iter().flat_map(|&m| recomputes.iter().map(move |&r| (m, r))).collect();
                let first_is_fastest = ms.stage == Stage::Generation;
                out.push(Entry { layout, dp, estimated: Vec::new(), order, first_is_fastest });
            }
        }
    }
    out
}
