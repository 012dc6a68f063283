//! The candidates of one search: per model-stage, every layout `(tp, pp)` with TP inside a node
//! and every replica count `dp`, each with its speed-for-memory variants — recomputation and
//! micro-batch size for training, micro-batch size for inference, decode-wave size for
//! generation — ordered from the fastest and largest to the slimmest, and estimated lazily,
//! memory first: a frontier takes, per layout and replica count, the first variant that fits (a
//! rank on its own, and the per-rank caps of a capped round), so most variants are never
//! estimated, and only those that fit are priced. A layout's first and last positions are
//! derived once for all its replica counts and variants. An entry whose state alone is over the
//! limit is skipped before any estimate (variants differ in what their passes hold, not in the
//! state), and where memory falls from one variant to the next (one recomputation choice) the
//! first fitting variant is found by bisection. An entry whose floor (the cost model's bound
//! under all its variants; under caps its uncapped pick where an uncapped round found it, or its
//! pick under looser caps, see [`CappedPick`]) cannot beat the frontier's points with as many
//! ranks or fewer is not estimated at all. A stage of one model-stage needs only the frontier's
//! fastest point: the entries are then visited by ascending floor, and the search stops at the
//! first floor the fastest found, or a cutoff, beats.

use std::cmp::Reverse;
use std::collections::{BTreeMap, BinaryHeap};

use super::job::{JobModel, StageCost};
use crate::cost::position::last_is_heavier;
use crate::cost::{EngineKind, Estimate, PositionCost};
use crate::model::Layout;
use crate::plan::{Candidate, ModelStage, Recompute, Stage};

/// Per-rank limits on candidates when the uncapped plan does not fit every rank (a capped
/// round of the search).
pub(super) struct Caps {
    /// State per rank, per model-stage.
    pub(super) state: BTreeMap<ModelStage, u64>,
    /// Transient peak per rank.
    pub(super) transient: u64,
}

impl Caps {
    /// The state cap of `ms`.
    pub(super) fn state(&self, ms: ModelStage) -> u64 {
        self.state.get(&ms).copied().unwrap_or(u64::MAX)
    }
}

/// What a frontier is cached by: everything it depends on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
struct FrontierKey {
    model_stage: ModelStage,
    /// Entries of more replicas are left out.
    max_dp: u32,
    /// The candidate that wins ties (the current plan's).
    prefer: Option<Candidate>,
    /// The model-stage's (state, transient) caps in a capped round.
    caps: Option<(u64, u64)>,
    /// Whether only its last (fastest) point is asked.
    fastest: bool,
}

/// The fastest point of a frontier, asked for below a cutoff.
pub enum Fastest {
    /// The point; none when nothing fits.
    Found(Option<Point>),
    /// No point is faster than the cutoff (the rest was not searched).
    NotBelow,
}

/// What floors are multiplied by: a part in 10⁹ below, so that a floor is strictly under the
/// seconds it bounds.
pub(super) const SHAVE: f64 = 1.0 - 1e-9;

/// A candidate with its estimate.
pub type Scored = (Candidate, Estimate);

/// A frontier point: a candidate and its predicted seconds (all a stage's layout reads; the
/// estimate behind it is the planner's to recompute for the few candidates a plan keeps).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Point {
    /// The candidate.
    pub candidate: Candidate,
    /// Its predicted seconds.
    pub seconds: f64,
}

/// What the search reads of a variant's estimate: its memory first, and its seconds only
/// once asked (a variant that does not fit is never priced). The full [`Estimate`] (per-item
/// memory, per-class latency) is six times larger and is recomputed for the few variants a
/// frontier keeps: storing it for every variant estimated touched megabytes per search.
#[derive(Debug, Clone, Copy)]
pub(super) struct Summary {
    /// Whether the heaviest position fits a rank of its own.
    pub(super) feasible: bool,
    /// The heaviest position's peak, state and transient bytes.
    pub(super) peak: u64,
    pub(super) state: u64,
    pub(super) transient: u64,
    /// Predicted seconds, once asked (infinite when not feasible, as [`Estimate`] has them).
    seconds: Option<f64>,
}

/// What a search has estimated: per layout it reached, its first and last pipeline positions
/// (their state and buffer shapes, derived once for every replica count and variant of the
/// layout: a variant's heaviest position is one of them); per entry it reached, a slot per
/// variant. One store for the whole search, so that reaching an entry costs no allocation of
/// its own.
struct Estimates {
    /// By the entries' `layout_slot`.
    positions: Vec<Option<Positions>>,
    /// `variants()` slots per entry reached, from its `slots`.
    summaries: Vec<Option<Summary>>,
}

/// A layout's first position and, with several, its last, with their state in bytes.
struct Positions {
    first: (PositionCost, u64),
    last: Option<(PositionCost, u64)>,
}

/// One layout and replica count of a model-stage.
#[derive(Clone)]
struct Entry {
    layout: Layout,
    /// The layout's index among every model-stage's layouts (where [`Estimates`] keeps its
    /// positions).
    layout_slot: usize,
    dp: u32,
    /// Where its variants' slots start in [`Estimates::summaries`], once one is estimated.
    slots: Option<usize>,
    /// The entry's pick in an uncapped round (inner `None`: nothing fits), once computed. Caps
    /// only take variants away, so a capped round's pick is no faster and, where the first
    /// fitting variant is the pick, no earlier.
    uncapped: Option<Option<usize>>,
    /// The cost model's floor under every variant's seconds, once computed.
    floor: Option<f64>,
    /// The entry's latest pick under caps, as a floor for tighter caps.
    capped: Option<CappedPick>,
    /// The variants, in order: micro-batch sizes from `largest_micro` halving down to 1 and,
    /// for each, `recomputes` from none to full (variant `k` is the `k / recomputes.len()`-th
    /// halving with `recomputes[k % recomputes.len()]`).
    largest_micro: u32,
    /// The recomputation choices of each micro-batch size.
    recomputes: &'static [Recompute],
    /// Whether the first fitting variant is the fastest fitting one: true for generation,
    /// whose larger decode waves are faster, and for inference without a pipeline; not for
    /// training and pipelined inference, where a smaller micro-batch shrinks the bubble.
    first_is_fastest: bool,
}

/// An entry's pick under (state, transient) caps: its seconds, infinite when nothing fit. Under
/// caps `(s', t')` with `t' ≤ transient` and either `s' ≤ state` or every position's state
/// within `state`, what fits is a subset of what fitted here, so the pick is no faster. An
/// entry keeps its pick under the tightest transient cap so far: the transient ladder's rungs,
/// ordered from the loosest cap, each start from the one before's picks, and a later round of
/// a rung (the same transient cap, less state) from its first's.
#[derive(Clone, Copy)]
struct CappedPick {
    state: u64,
    transient: u64,
    seconds: f64,
}

/// Every model-stage's entries with nothing estimated: what a pool's search starts from. They
/// depend on the pool size, the models and the batch, not on the response length or the
/// calibration, so a planner keeps them across replans on the same pool.
#[derive(Clone, Default)]
pub struct Skeleton {
    entries: BTreeMap<ModelStage, Vec<Entry>>,
    /// Layouts over every model-stage.
    layouts: usize,
}

impl Skeleton {
    /// The entries of every model-stage of `job` on its pool.
    pub(super) fn of(job: &JobModel) -> Skeleton {
        let mut layouts = 0;
        let entries = job.model_stages().iter().map(|&ms| (ms, entries_of(job, ms, &mut layouts))).collect();
        Skeleton { entries, layouts }
    }
}

/// Every model-stage's entries, estimated as far as the frontiers asked so far.
pub struct CandidateCache<'p> {
    job: &'p JobModel,
    entries: BTreeMap<ModelStage, Vec<Entry>>,
    estimates: Estimates,
    /// Frontiers already built (see [`FrontierKey`]).
    built: BTreeMap<FrontierKey, Vec<Point>>,
}

impl<'p> CandidateCache<'p> {
    /// The entries of every model-stage of `job` (nothing estimated yet), from its `skeleton`
    /// on its pool.
    pub(super) fn new(job: &'p JobModel, skeleton: &Skeleton) -> CandidateCache<'p> {
        let entries = skeleton.entries.clone();
        // Room for every entry at once: growing the store would copy it over and over.
        let estimates = Estimates {
            positions: (0..skeleton.layouts).map(|_| None).collect(),
            summaries: Vec::with_capacity(entries.values().flatten().map(Entry::variants).sum()),
        };
        CandidateCache { job, entries, estimates, built: BTreeMap::new() }
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
    ) -> Vec<Point> {
        let key = frontier_key(ms, prefer, caps, max_dp, false);
        if let Some(f) = self.built.get(&key) {
            return f.clone();
        }
        let within = self.within(ms, key.caps);
        let entries = self.entries.get_mut(&ms).map_or(&mut [][..], |v| v.as_mut_slice());
        let frontier = running_minima(entries, &mut self.estimates, &within, max_dp, prefer);
        self.built.insert(key, frontier.clone());
        frontier
    }

    /// The last point of [`CandidateCache::frontier`] (what a stage of one model-stage takes), found
    /// without building the rest, when it is faster than `cutoff` seconds (the search stops
    /// once no entry left can be).
    pub fn fastest(
        &mut self,
        ms: ModelStage,
        prefer: Option<&Candidate>,
        caps: Option<&Caps>,
        max_dp: u32,
        cutoff: f64,
    ) -> Fastest {
        let key = frontier_key(ms, prefer, caps, max_dp, true);
        if let Some(f) = self.built.get(&key) {
            return Fastest::Found(f.first().copied());
        }
        let within = self.within(ms, key.caps);
        let entries = self.entries.get_mut(&ms).map_or(&mut [][..], |v| v.as_mut_slice());
        let found = fastest_point(entries, &mut self.estimates, &within, max_dp, prefer, cutoff);
        if let Fastest::Found(point) = &found {
            self.built.insert(key, point.iter().copied().collect());
        }
        found
    }

    /// What fits in a frontier of `ms` under a capped round's (state, transient) `limits`.
    fn within(&self, ms: ModelStage, limits: Option<(u64, u64)>) -> Within<'p> {
        Within { stage: self.job.stage_cost(ms), usable: self.job.cost().hardware.usable_bytes(), limits }
    }

    /// Every variant of every entry of `ms` that fits a rank of its own, as the frontier counts
    /// fitting (the exact solver's input: nothing pruned).
    pub fn every_fitting(&mut self, ms: ModelStage) -> Vec<Scored> {
        let job = self.job;
        let usable = job.cost().hardware.usable_bytes();
        let mut out = Vec::new();
        for entry in self.entries.get_mut(&ms).into_iter().flatten() {
            for k in 0..entry.variants() {
                let c = entry.candidate(ms, k);
                let e = job.estimate(&c);
                if e.feasible && e.memory.peak() <= usable {
                    out.push((c, e));
                }
            }
        }
        out
    }

    /// Every fitting first variant of `ms` (not reduced to a frontier), for brute-force checks.
    pub fn all_fitting(&mut self, ms: ModelStage) -> Vec<Scored> {
        let stage = self.job.stage_cost(ms);
        let fits = |e: &Summary| e.feasible;
        let est = &mut self.estimates;
        self.entries
            .get_mut(&ms)
            .into_iter()
            .flatten()
            .filter_map(|entry| {
                let k = entry.first_fitting(est, &stage, true, &fits)?;
                let c = entry.candidate(ms, k);
                Some((c, stage.estimate(&c)))
            })
            .collect()
    }

    /// The smallest peak any variant of `ms` reaches (for the "does not fit" message).
    pub fn smallest_peak(&mut self, ms: ModelStage) -> u64 {
        let stage = self.job.stage_cost(ms);
        let mut least = u64::MAX;
        for entry in self.entries.get_mut(&ms).into_iter().flatten() {
            for k in 0..entry.variants() {
                least = least.min(entry.estimate(&mut self.estimates, &stage, k).peak);
            }
        }
        if least == u64::MAX {
            0
        } else {
            least
        }
    }
}

/// What a frontier of `ms` (its fastest point only, or all of it) is cached by.
fn frontier_key(
    ms: ModelStage,
    prefer: Option<&Candidate>,
    caps: Option<&Caps>,
    max_dp: u32,
    fastest: bool,
) -> FrontierKey {
    let caps = caps.map(|c| (c.state(ms), c.transient));
    FrontierKey { model_stage: ms, max_dp, prefer: prefer.copied(), caps, fastest }
}

/// What fits in one frontier: a rank of its own (`usable` bytes) and, in a capped round, the
/// model-stage's (state, transient) caps.
struct Within<'p> {
    stage: StageCost<'p>,
    usable: u64,
    limits: Option<(u64, u64)>,
}

impl Within<'_> {
    /// Whether a variant fits.
    fn fits(&self, e: &Summary) -> bool {
        self.alone(e) && self.limits.is_none_or(|(state, transient)| e.state <= state && e.transient <= transient)
    }

    /// Whether a variant fits a rank of its own.
    fn alone(&self, e: &Summary) -> bool {
        e.feasible && e.peak <= self.usable
    }
}

/// The frontier of `entries`. They come by ascending rank count, and a point enters the
/// frontier only when it is faster than every point with fewer ranks (`below`) and than the
/// best so far with as many (`at`): the running minimum, which is what an entry's floor must
/// beat to be estimated.
fn running_minima(
    entries: &mut [Entry],
    est: &mut Estimates,
    within: &Within,
    max_dp: u32,
    prefer: Option<&Candidate>,
) -> Vec<Point> {
    let ms = within.stage.model_stage();
    let mut frontier: Vec<Point> = Vec::new();
    // The fastest fitting variant with the current rank count, and the frontier it joins if
    // faster than every point with fewer ranks.
    let mut slot: Option<Point> = None;
    let join = |frontier: &mut Vec<Point>, point: Option<Point>| {
        if let Some(p) = point.filter(|p| frontier.last().is_none_or(|last| p.seconds < last.seconds)) {
            frontier.push(p);
        }
    };
    let (mut below, mut at, mut ranks) = (f64::INFINITY, f64::INFINITY, 0);
    for entry in entries.iter_mut().filter(|e| e.dp <= max_dp) {
        if entry.ranks() != ranks {
            join(&mut frontier, slot.take());
            (below, at, ranks) = (below.min(at), f64::INFINITY, entry.ranks());
        }
        let preferred = prefer.is_some_and(|p| p.layout == entry.layout && p.dp == entry.dp);
        let Some(k) = entry.pick(est, within, below.min(at), preferred) else { continue };
        let (c, seconds) = (entry.candidate(ms, k), entry.seconds(est, &within.stage, k));
        if slot.is_none_or(|best| seconds < best.seconds || (seconds == best.seconds && Some(&c) == prefer)) {
            slot = Some(Point { candidate: c, seconds });
        }
        at = slot.map_or(at, |best| best.seconds);
    }
    join(&mut frontier, slot);
    frontier
}

/// The last point of the frontier of `entries` (the fastest; on equal seconds the fewest ranks,
/// then the preferred candidate, then layout order), if it is faster than `cutoff`. Entries are
/// visited by ascending floor, so once a floor reaches the fastest found (or the cutoff), every
/// later entry loses too.
fn fastest_point(
    entries: &mut [Entry],
    est: &mut Estimates,
    within: &Within,
    max_dp: u32,
    prefer: Option<&Candidate>,
    cutoff: f64,
) -> Fastest {
    let ms = within.stage.model_stage();
    // A min-heap by floor (its bits: floors are never negative), as the search stops after
    // the first few.
    let key = |floor: f64| if floor > 0.0 { floor.to_bits() } else { 0 };
    let mut order = Vec::with_capacity(entries.len());
    for (i, e) in entries.iter_mut().enumerate().filter(|(_, e)| e.dp <= max_dp && e.uncapped != Some(None)) {
        order.push(Reverse((key(e.floor_within(est, within)), i)));
    }
    let mut order = BinaryHeap::from(order);
    // (seconds, ranks, not preferred, layout order) orders the ties; then the entry's variant.
    let mut best: Option<((f64, u32, bool, usize), usize)> = None;
    while let Some(Reverse((floor, i))) = order.pop() {
        // Only a strictly slower floor loses: an entry as fast as the best may win the tie.
        let to_beat = best.map_or(cutoff, |((seconds, ..), _)| seconds.next_up().min(cutoff));
        if f64::from_bits(floor) >= to_beat {
            break;
        }
        let entry = &mut entries[i];
        let Some(k) = entry.pick(est, within, to_beat, false) else { continue };
        let c = entry.candidate(ms, k);
        let rank = (entry.seconds(est, &within.stage, k), entry.ranks(), Some(&c) != prefer, i);
        if best.is_none_or(|(b, _)| rank.0.total_cmp(&b.0).then((rank.1, rank.2, rank.3).cmp(&(b.1, b.2, b.3))).is_lt())
        {
            best = Some((rank, k));
        }
    }
    match best {
        Some(((seconds, .., i), k)) if seconds < cutoff => {
            Fastest::Found(Some(Point { candidate: entries[i].candidate(ms, k), seconds }))
        }
        _ if cutoff < f64::INFINITY => Fastest::NotBelow,
        _ => Fastest::Found(None),
    }
}

impl Entry {
    /// The variant the frontier takes from this entry under `within`, unless the entry's floor
    /// shows that it is no faster than `to_beat` (then nothing is estimated; floors are shaved,
    /// so one that reaches `to_beat` is strictly slower and loses even a tie, the `preferred`
    /// entry aside). Under caps the entry's uncapped pick, where an uncapped round found it, is
    /// a tighter floor, and an entry that fits nothing uncapped fits nothing. (Where no round
    /// found it, it is not searched for: its variants would cost as many estimates as the
    /// capped pick itself.)
    fn pick(&mut self, est: &mut Estimates, within: &Within, to_beat: f64, preferred: bool) -> Option<usize> {
        let stage = &within.stage;
        let loses = |floor: f64| !preferred && floor >= to_beat;
        if self.uncapped == Some(None) || (to_beat < f64::INFINITY && loses(self.floor(stage))) {
            return None;
        }
        let Some((state, transient)) = within.limits else {
            // Uncapped, fitting is a bound on the heaviest position's peak, which falls with the
            // micro-batch.
            let found = self.quick_fitting(est, stage, within.usable, true, &|e| within.alone(e));
            self.uncapped = Some(found);
            return found;
        };
        if let Some(Some(k)) = self.uncapped {
            if loses(self.seconds(est, stage, k)) {
                return None;
            }
        }
        if self.capped_floor(est, within).is_some_and(loses) {
            return None;
        }
        let found = self.capped_pick(est, within);
        let seconds = found.map_or(f64::INFINITY, |k| self.seconds(est, stage, k));
        if self.capped.is_none_or(|c| transient <= c.transient) {
            self.capped = Some(CappedPick { state, transient, seconds });
        }
        found
    }

    /// The variant the entry gives under `within`'s caps: its uncapped pick where that fits
    /// them (the fastest variant that fits alone, and the first of the fastest), else the
    /// fastest that fits, searched for.
    fn capped_pick(&mut self, est: &mut Estimates, within: &Within) -> Option<usize> {
        if let Some(Some(k)) = self.uncapped {
            if within.fits(&self.estimate(est, &within.stage, k)) {
                return Some(k);
            }
        }
        // Under caps, fitting bounds the heaviest position's state and transient too: with one
        // pipeline position the state is the same for every variant and the transient falls
        // with the peak, but with several, which position is heaviest may change from one
        // variant to the next.
        let state_limit = within.limits.map_or(within.usable, |(state, _)| state.min(within.usable));
        self.quick_fitting(est, &within.stage, state_limit, self.layout.pp == 1, &|e| within.fits(e))
    }

    /// The entry's latest capped pick as a floor under `within`'s caps, where it is one (see
    /// [`CappedPick`]), shaved as the other floors are.
    fn capped_floor(&self, est: &mut Estimates, within: &Within) -> Option<f64> {
        let (state, transient) = within.limits?;
        let pick = self.capped?;
        let mut states_fit = || {
            let Positions { first, last } = self.positions(est, &within.stage);
            first.1.max(last.as_ref().map_or(0, |l| l.1)) <= pick.state
        };
        (transient <= pick.transient && (state <= pick.state || states_fit())).then_some(pick.seconds * SHAVE)
    }

    /// The tightest floor known without estimating: under caps the uncapped pick's seconds
    /// or an earlier capped pick's (shaved), else the cost model's floor.
    fn floor_within(&mut self, est: &mut Estimates, within: &Within) -> f64 {
        let floor = match (within.limits, self.uncapped) {
            (Some(_), Some(Some(k))) => self.seconds(est, &within.stage, k) * SHAVE,
            _ => self.floor(&within.stage),
        };
        self.capped_floor(est, within).map_or(floor, |capped| capped.max(floor))
    }

    /// The fastest variant that `fits` among the first fitting recomputation of each
    /// micro-batch size (recomputation only trades speed for memory), estimating only those.
    /// Nothing is estimated when the state alone is over `state_limit`: the variants differ in
    /// what their passes hold, never in the state. `monotone`: see [`Entry::first_fitting`].
    fn quick_fitting(
        &mut self,
        est: &mut Estimates,
        stage: &StageCost,
        state_limit: u64,
        monotone: bool,
        fits: &dyn Fn(&Summary) -> bool,
    ) -> Option<usize> {
        if self.least_state(est, stage) > state_limit {
            return None;
        }
        if self.first_is_fastest {
            return self.first_fitting(est, stage, monotone, fits);
        }
        let mut best: Option<usize> = None;
        let per_size = self.recomputes.len();
        for size in 0..self.variants() / per_size {
            let block = size * per_size..(size + 1) * per_size;
            if let Some(k) = block.into_iter().find(|&k| fits(&self.estimate(est, stage, k))) {
                if best.is_none_or(|b| self.seconds(est, stage, k) < self.seconds(est, stage, b)) {
                    best = Some(k);
                }
            }
        }
        best
    }

    /// The state of the entry's lightest pipeline position (first or last; every variant of
    /// the entry holds at least this).
    fn least_state(&mut self, est: &mut Estimates, stage: &StageCost) -> u64 {
        let Positions { first, last } = self.positions(est, stage);
        last.as_ref().map_or(first.1, |last| first.1.min(last.1))
    }

    /// The layout's positions, derived the first time one of its entries asks.
    fn positions<'e>(&self, est: &'e mut Estimates, stage: &StageCost) -> &'e Positions {
        est.positions[self.layout_slot].get_or_insert_with(|| {
            let c = self.candidate(stage.model_stage(), 0);
            let pp = self.layout.pp;
            let position = |j: u32| {
                let cost = stage.position_cost(&c, j);
                let state = cost.state().total();
                (cost, state)
            };
            Positions { first: position(0), last: (pp > 1).then(|| position(pp - 1)) }
        })
    }

    /// Where this entry's variant slots start in `est`, taken the first time.
    fn slots(&mut self, est: &mut Estimates) -> usize {
        let variants = self.variants();
        *self.slots.get_or_insert_with(|| {
            let start = est.summaries.len();
            est.summaries.resize(start + variants, None);
            start
        })
    }

    /// The cost model's floor under every variant's seconds, shaved so that rounding never
    /// lifts it over a variant's; computed once.
    fn floor(&mut self, stage: &StageCost) -> f64 {
        let c = self.candidate(stage.model_stage(), 0);
        *self.floor.get_or_insert_with(|| stage.seconds_floor(&c) * SHAVE)
    }

    /// Ranks of each of its candidates.
    fn ranks(&self) -> u32 {
        self.layout.size() * self.dp
    }

    /// How many variants the entry has.
    fn variants(&self) -> usize {
        (self.largest_micro.ilog2() as usize + 1) * self.recomputes.len()
    }

    /// Variant `k`'s candidate.
    fn candidate(&self, ms: ModelStage, k: usize) -> Candidate {
        let (micro_batch, recompute) =
            (self.largest_micro >> (k / self.recomputes.len()), self.recomputes[k % self.recomputes.len()]);
        Candidate { model_stage: ms, layout: self.layout, dp: self.dp, recompute, micro_batch }
    }

    /// Variant `k`'s memory, estimated once.
    fn estimate(&mut self, est: &mut Estimates, stage: &StageCost, k: usize) -> Summary {
        let slot = self.slots(est) + k;
        if let Some(summary) = est.summaries[slot] {
            return summary;
        }
        let positions = self.positions(est, stage);
        // The heavier of the first and last positions (`CostModel::heaviest_position`).
        let c = self.candidate(stage.model_stage(), k);
        let at = |(position, state): &(PositionCost, u64)| (*state, stage.transient_bytes(position, &c));
        let (mut state, mut transient) = at(&positions.first);
        if let Some((last_state, last_transient)) = positions.last.as_ref().map(at) {
            if last_is_heavier(state + transient, last_state + last_transient) {
                (state, transient) = (last_state, last_transient);
            }
        }
        let peak = state + transient;
        let summary = Summary { feasible: stage.fits_alone(peak), peak, state, transient, seconds: None };
        est.summaries[slot] = Some(summary);
        summary
    }

    /// Variant `k`'s predicted seconds ([`crate::cost::CostModel::estimate`]'s), priced once.
    fn seconds(&mut self, est: &mut Estimates, stage: &StageCost, k: usize) -> f64 {
        let feasible = self.estimate(est, stage, k).feasible;
        let slot = self.slots(est) + k;
        let candidate = self.candidate(stage.model_stage(), k);
        let summary = est.summaries[slot].as_mut().expect("estimated above");
        *summary.seconds.get_or_insert_with(|| if feasible { stage.seconds(&candidate) } else { f64::INFINITY })
    }

    /// The first variant, in order, that `fits`, estimating variants as needed. When `fits`
    /// is `monotone` (once a variant fits, every later one does) and there is one recomputation
    /// choice, every variant holds less than the one before it (a smaller micro-batch or decode
    /// wave), so what fits is a suffix and a bisection finds its start.
    fn first_fitting(
        &mut self,
        est: &mut Estimates,
        stage: &StageCost,
        monotone: bool,
        fits: &dyn Fn(&Summary) -> bool,
    ) -> Option<usize> {
        // Where the pick is the first fitting variant, nothing before the uncapped pick fits
        // without caps, so nothing there fits with them.
        let start = if self.first_is_fastest { self.uncapped.flatten().unwrap_or(0) } else { 0 };
        if !monotone || self.recomputes.len() > 1 {
            return (start..self.variants()).find(|&k| fits(&self.estimate(est, stage, k)));
        }
        let (mut lo, mut hi) = (start, self.variants());
        while lo < hi {
            let mid = lo + (hi - lo) / 2;
            if fits(&self.estimate(est, stage, mid)) {
                hi = mid;
            } else {
                lo = mid + 1;
            }
        }
        (lo < self.variants()).then_some(lo)
    }
}

/// The entries of `ms`: every power-of-two layout with TP inside a node that the model divides
/// into, every replica count that divides the batch (and, for training, the mini-batch), each
/// with its variants; by ascending rank count.
fn entries_of(job: &JobModel, ms: ModelStage, layout_slots: &mut usize) -> Vec<Entry> {
    let hw = &job.cost().hardware;
    let workload = job.workload(ms);
    let sequences = workload.sequences;
    let catalogue = job.catalogue(ms.role);
    let layers = catalogue.arch.layers as u32;
    // The reference engine keeps every activation: recomputation is a GPU-engine option.
    let recomputes: &'static [Recompute] = match (ms.trains(), job.cost().engine) {
        (true, EngineKind::Gpu) => &[Recompute::None, Recompute::Selective, Recompute::Full],
        _ => &[Recompute::None],
    };
    let largest = |micro: u64| micro.clamp(1, u64::from(u32::MAX)) as u32;
    // The paper's space: TP and PP powers of two, TP inside a node, and DP degrees that divide
    // the global batch (every replica takes the same share, as the accumulation steps assume).
    let powers = |limit: u32| std::iter::successors(Some(1u32), |x| x.checked_mul(2)).take_while(move |&x| x <= limit);
    let mut out = Vec::new();
    for tp in powers(hw.devices_per_node.min(hw.devices)).filter(|t| hw.devices_per_node.is_multiple_of(*t)) {
        for pp in powers((hw.devices / tp).min(layers)) {
            let layout = Layout::new(tp, pp);
            if catalogue.check_layout(layout).is_err() || job.fixed_layout(ms).is_some_and(|l| l != layout) {
                continue;
            }
            let layout_slot = *layout_slots;
            *layout_slots += 1;
            let max_dp = (hw.devices / layout.size()).min(sequences.min(u64::from(u32::MAX)) as u32);
            let divides = |dp: &u32| {
                let dp = u64::from(*dp);
                sequences.is_multiple_of(dp) && (!ms.trains() || workload.mini_batch.max(1).is_multiple_of(dp))
            };
            for dp in (1..=max_dp).filter(divides) {
                let batch = sequences / u64::from(dp);
                // Training and inference: the configured micro-batch or smaller. Generation:
                // waves of the whole share or smaller (less KV cache, more decode steps).
                let largest_micro =
                    if ms.stage == Stage::Generation { largest(batch) } else { largest(workload.micro_batch) };
                // Inference with one pipeline stage has no bubble to shrink: when every
                // micro-batch size of the entry divides the replica's share (no padded last
                // micro-batch), a smaller one only adds TP messages, so the first that fits is
                // the fastest.
                let halvings = std::iter::successors(Some(largest_micro), |m| (*m > 1).then_some(m / 2));
                let no_bubble = ms.stage == Stage::Inference
                    && pp == 1
                    && halvings.into_iter().all(|m| batch.is_multiple_of(u64::from(m)));
                let first_is_fastest = ms.stage == Stage::Generation || no_bubble;
                out.push(Entry {
                    layout,
                    layout_slot,
                    dp,
                    slots: None,
                    uncapped: None,
                    floor: None,
                    capped: None,
                    largest_micro,
                    recomputes,
                    first_is_fastest,
                });
            }
        }
    }
    // By rank count (stable: ties keep the layout order), as the frontier's pruning needs.
    out.sort_by_key(Entry::ranks);
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::DataPlane;
    use crate::cost::Efficiencies;
    use crate::planner::testing::tiny_jobs_and_llama;

    #[test]
    fn a_variants_summary_is_the_cost_models_estimate_of_it() {
        // Every variant of every entry of random tiny jobs and of Llama-3.1-8B on 32 H200, on
        // both engines: the memory the search reads (from its layout's position costs, derived
        // once per layout) and the seconds it prices are the cost model's estimate.
        let mut checked = 0;
        for (mut config, gpus) in tiny_jobs_and_llama(2000, 30, 32) {
            for plane in [DataPlane::Mpi, DataPlane::Nccl] {
                config.cluster.data_plane = plane;
                let job = JobModel::new(&config, gpus, None, Efficiencies::default());
                let skeleton = Skeleton::of(&job);
                let mut cache = CandidateCache::new(&job, &skeleton);
                for &ms in job.model_stages() {
                    let stage = job.stage_cost(ms);
                    for entry in cache.entries.get_mut(&ms).into_iter().flatten() {
                        for k in 0..entry.variants() {
                            let c = entry.candidate(ms, k);
                            let e = job.estimate(&c);
                            let s = entry.estimate(&mut cache.estimates, &stage, k);
                            let memory = (e.memory.peak(), e.memory.state.total(), e.memory.transient.total());
                            assert_eq!(
                                (s.peak, s.state, s.transient, s.feasible),
                                (memory.0, memory.1, memory.2, e.feasible),
                                "{c:?}"
                            );
                            assert_eq!(entry.seconds(&mut cache.estimates, &stage, k), e.seconds, "{c:?}");
                            checked += 1;
                        }
                    }
                }
            }
        }
        assert!(checked > 5_000, "only {checked} variants checked");
    }
}
