//! The search: the fastest memory-feasible global plan, from the model-stages' frontiers, the
//! per-stage layout, rank assignment and the placement-exact memory check that closes the loop
//! (see the module doc of `planner`).

use std::collections::BTreeMap;

use super::assign::{assign, GroupToPlace};
use super::candidates::{CandidateCache, Caps, Fastest, Point, SHAVE};
use super::front::{Found, PlannedJob, Planner, PlannerError};
use super::predict::generation_apart;
use super::stage::{self, StageChoice};
use crate::cost::RankPeaks;
use crate::model::Layout;
use crate::plan::WEIGHT_SYNCS as SYNCS;
use crate::plan::{Candidate, ModelStage, Placement, Plan, Stage};

/// Stages in the order they run.
pub(super) const STAGES: [Stage; 3] = [Stage::Generation, Stage::Inference, Stage::Training];

/// Rounds of layout and placement check per rung of the transient ladder.
pub(super) const PLACEMENT_ROUNDS: usize = 4;
/// Shares of a rank's usable memory the transient buffers may take when the state has to be
/// capped (see `Planner::place`).
pub(super) const TRANSIENT_LADDER: [f64; 6] = [0.5, 0.35, 0.25, 0.15, 0.1, 0.05];
/// How far the rung ordering searches a rung's first stage past the fastest found so far: a rung
/// whose first stage alone takes longer than this multiple is tried last, and its own floor is
/// found only if the plans found by then do not cut it already (the order changes the work,
/// never the plan).
pub(super) const RUNG_ORDER_SPAN: f64 = 2.0;
/// The weight sync's share of the step above which fewer sync-filled replicas are tried.
pub(super) const SYNC_SWEEP_SHARE: f64 = 0.1;

impl Planner {
    /// The fastest plan whose every rank fits in memory (ties: the current plan's candidates
    /// and ranks).
    pub fn search(&self, current: Option<&Plan>) -> Result<PlannedJob, PlannerError> {
        self.search_kept(current).map(|(job, _)| job)
    }

    /// [`Planner::search`] from `current`, and `current`'s predicted step seconds: infinite
    /// when it no longer fits every rank (what a transition's `ΔL` starts from).
    pub fn search_from(&self, current: &Plan) -> Result<(PlannedJob, f64), PlannerError> {
        self.search_kept(Some(current))
    }

    pub(super) fn search_kept(&self, current: Option<&Plan>) -> Result<(PlannedJob, f64), PlannerError> {
        let gpus = self.cost().hardware.devices;
        let kept = current.and_then(|plan| self.still_fits(plan));
        let current_seconds = kept.as_ref().map_or(f64::INFINITY, Found::seconds);
        let keep = |k: Found| Ok((self.planned(k), current_seconds));
        match (self.place(current), kept) {
            // The search under caps is a heuristic: it never returns a plan slower than keeping
            // the current one when that still fits.
            (Ok(found), Some(k)) if k.seconds() <= found.seconds() => keep(k),
            (Ok(found), _) => Ok((self.planned(found), current_seconds)),
            (Err(_), Some(k)) => keep(k),
            (Err(Unfit::Model(ms)), None) => Err(self.does_not_fit(ms)),
            (Err(Unfit::Stage { stage, need }), None) => {
                Err(PlannerError::StageTooLarge { gpus, stage, need, hint: self.hint() })
            }
            (Err(Unfit::Placement { plan, peaks }), None) => {
                let (peak, rank) = peaks.max();
                let holders = plan
                    .placements
                    .iter()
                    .filter(|p| p.ranks.contains(&rank))
                    .map(|p| p.candidate.model_stage.to_string())
                    .collect();
                let usable_bytes = self.cost().hardware.usable_bytes();
                Err(PlannerError::Placement { gpus, rank, peak_bytes: peak, usable_bytes, holders, hint: self.hint() })
            }
        }
    }

    /// `plan` with its peaks and step, if it is valid on this pool and every rank still fits
    /// (so every position of it fits a rank of its own: a rank's peak is at least its own).
    pub(super) fn still_fits(&self, plan: &Plan) -> Option<Found> {
        plan.validate(self.cost().hardware.devices).ok()?;
        let overlapped = self.job.overlapped;
        if overlapped && !generation_apart(plan) {
            return None;
        }
        let peaks = self.rank_peaks(plan);
        let fits = peaks.max().0 <= self.cost().hardware.usable_bytes();
        fits.then(|| Found { step: self.job.fitting_step_seconds(plan), plan: plan.clone(), peaks, overlapped })
    }

    /// Why `ms` fits no candidate, with what would fit.
    fn does_not_fit(&self, ms: ModelStage) -> PlannerError {
        let hw = &self.cost().hardware;
        let need = self.candidates().smallest_peak(ms);
        PlannerError::DoesNotFit {
            gpus: hw.devices,
            model_stage: ms,
            need_bytes: need,
            usable_bytes: hw.usable_bytes(),
            headroom: hw.headroom * 100.0,
            hint: self.hint(),
        }
    }

    /// What would fit: more GPUs, or shorter responses (recomputation is already searched).
    fn hint(&self) -> String {
        let len = self.response_len();
        let feasible_with = |gpus: u32, response: u64| {
            self.replanned(gpus, response, self.cost().efficiencies).is_ok_and(|p| p.search_quiet())
        };
        let n = self.cost().hardware.devices;
        let mut hints = Vec::new();
        // The smallest pool that fits: doubling finds one, bisection the least below it.
        if let Some(k) = (1..=6).find(|&k| feasible_with(n << k, len)) {
            let (mut lo, mut hi) = (n << (k - 1), n << k);
            while hi - lo > 1 {
                let mid = lo + (hi - lo) / 2;
                if feasible_with(mid, len) {
                    hi = mid;
                } else {
                    lo = mid;
                }
            }
            hints.push(format!("{hi} GPUs would fit"));
        }
        if let Some(l) = (1..=6).map(|k| len >> k).filter(|&l| l > 0).find(|&l| feasible_with(n, l)) {
            hints.push(format!("responses of {l} tokens would fit (--seq-len {l})"));
        }
        if hints.is_empty() {
            "; neither 64x the GPUs nor 64x shorter responses would fit: use a larger device or a smaller model".into()
        } else {
            format!("; {} (activation recomputation was already considered)", hints.join(", or "))
        }
    }

    /// Whether a plan exists (the hints' probe: the same search, without a message).
    fn search_quiet(&self) -> bool {
        self.place(None).is_ok()
    }

    /// The fastest placement found. The stages are laid out one by one, but the weight sync
    /// couples them: every replica of the generation (and critic inference) layout receives a
    /// full copy of the trained weights, so the fastest generation alone can lose the step to
    /// its sync. When the sync is a noticeable part of the step, fewer replicas of the layouts
    /// it fills are tried (halving), until two halvings in a row bring nothing.
    pub(super) fn place(&self, current: Option<&Plan>) -> Result<Found, Unfit> {
        if self.job.overlapped {
            return self.place_overlapped(current);
        }
        let mut cache = self.candidates();
        let mut best = self.place_within(current, &mut cache, u32::MAX, f64::INFINITY)?;
        if best.step.weight_sync < SYNC_SWEEP_SHARE * best.seconds() {
            return Ok(best);
        }
        let mut cap = self.sync_replicas(&best.plan) / 2;
        let mut misses = 0;
        while cap >= 1 && misses < 2 {
            match self.place_within(current, &mut cache, cap, best.seconds()) {
                Ok(found) if found.seconds() < best.seconds() => {
                    best = found;
                    misses = 0;
                }
                _ => misses += 1,
            }
            cap /= 2;
        }
        Ok(best)
    }

    /// The most replicas among the layouts the weight sync fills in `plan`.
    pub(super) fn sync_replicas(&self, plan: &Plan) -> u32 {
        let filled = |p: &&Placement| SYNCS.iter().any(|(_, to)| *to == p.candidate.model_stage);
        plan.placements.iter().filter(filled).map(|p| p.candidate.dp).max().unwrap_or(1)
    }

    /// Rounds of layout and placement check: a round that finds ranks over their memory makes
    /// each model-stage there leave room for what it shares the rank with (what the rank holds
    /// besides its own position), and plans again. Layouts the weight sync fills keep to at
    /// most `sync_dp` replicas. Capped rounds that cannot beat `beat` seconds are cut short.
    pub(super) fn place_within(
        &self,
        current: Option<&Plan>,
        cache: &mut CandidateCache,
        sync_dp: u32,
        beat: f64,
    ) -> Result<Found, Unfit> {
        let usable = self.cost().hardware.usable_bytes();
        let uncapped = self.stage_layouts(cache, &Round { current, caps: None, sync_dp }, f64::INFINITY, &[])?;
        let first = self.ranks_for(&uncapped.stages, current);
        let peaks = self.rank_peaks(&first);
        if peaks.max().0 <= usable {
            return Ok(Found { step: self.job.fitting_step_seconds(&first), plan: first, peaks, overlapped: false });
        }
        // Every rank holds a position of (nearly) every model-stage: its state adds up, and the
        // largest transient comes on top. So the transient is capped at a rung of a ladder, the
        // rest of the rank is shared out as state caps proportional to one replica's state (every
        // model-stage shards about as finely), the room shrinks by any overflow left, and the
        // fastest plan that fits over all rungs wins (on equal seconds, the earlier rung). (The
        // rungs' latencies are not unimodal — on A100, 0.35 can lose to 0.5 and 0.25 beat both —
        // so no rung is skipped unless its floor shows that it cannot win.)
        let rungs = self.rungs_in_order(current, cache, sync_dp);
        let mut ladder = Ladder { best: None, last: (first, peaks, None) };
        let ahead_of_first: f64 = uncapped.stage_floors.iter().skip(1).sum();
        for Rung { first_floor, index: rung, mut caps } in rungs {
            let mut room = usable - caps.transient;
            for _ in 0..PLACEMENT_ROUNDS {
                let to_beat = ladder.to_beat(rung, beat);
                // The rung's first-stage floor (under its first round's caps, so under every
                // round's) may show already that it cannot win.
                if first_floor + ahead_of_first >= to_beat {
                    break;
                }
                let round = Round { current, caps: Some(&caps), sync_dp };
                let laid = match self.stage_layouts(cache, &round, to_beat, &uncapped.stage_floors) {
                    Ok(laid) if laid.complete() => laid,
                    // Unfit, or no faster than the best so far: the rung's later rounds, under
                    // tighter caps, could do no better.
                    _ => break,
                };
                let plan = self.ranks_for(&laid.stages, current);
                let peaks = self.rank_peaks(&plan);
                let (worst, _) = peaks.max();
                if worst <= usable {
                    let found = Found { step: self.job.fitting_step_seconds(&plan), plan, peaks, overlapped: false };
                    ladder.offer(found, rung);
                    break;
                }
                room = room.saturating_sub(worst - usable);
                caps = Caps { state: self.state_caps(room), transient: caps.transient };
                ladder.unfit(plan, peaks, rung);
            }
        }
        match ladder.best {
            Some((found, _)) => Ok(found),
            None => Err(Unfit::Placement { plan: ladder.last.0, peaks: ladder.last.1 }),
        }
    }

    /// The rungs of the transient ladder, as (first-stage floor, rung, first round's caps), in
    /// the order they are tried: the rungs whose first stage alone promises the fastest plan
    /// first, so that the best plan found early cuts the others short (on equal seconds the
    /// earlier rung of the ladder still wins, see `place_within`). The floors are found from
    /// the loosest transient cap down, each rung's capped picks bounding the next one's, and
    /// only up to [`RUNG_ORDER_SPAN`] times the fastest so far.
    pub(super) fn rungs_in_order(&self, current: Option<&Plan>, cache: &mut CandidateCache, sync_dp: u32) -> Vec<Rung> {
        let usable = self.cost().hardware.usable_bytes();
        let mut fastest = f64::INFINITY;
        let mut rungs = Vec::with_capacity(TRANSIENT_LADDER.len());
        for (rung, &share) in TRANSIENT_LADDER.iter().enumerate() {
            let transient = (usable as f64 * share) as u64;
            let caps = Caps { state: self.state_caps(usable - transient), transient };
            let cutoff = RUNG_ORDER_SPAN * fastest;
            let round = Round { current, caps: Some(&caps), sync_dp };
            let floor = self.stage_members(STAGES[0]).try_fold(0.0, |floor: f64, (ms, alone)| {
                let f = self.member_frontier(cache, &round, ms, alone, cutoff)?;
                Some(floor.max(f.last().map_or(f64::INFINITY, |p| p.seconds)))
            });
            let floor = floor.unwrap_or(cutoff);
            fastest = fastest.min(floor);
            rungs.push(Rung { first_floor: floor, index: rung, caps });
        }
        rungs.sort_by(|a, b| a.first_floor.total_cmp(&b.first_floor).then(a.index.cmp(&b.index)));
        rungs
    }

    /// The model-stages `stage` runs, each with whether it is the stage's only one.
    pub(super) fn stage_members(&self, stage: Stage) -> impl Iterator<Item = (ModelStage, bool)> + '_ {
        let of_stage = move || self.model_stages().iter().copied().filter(move |m| m.stage == stage);
        let alone = of_stage().count() == 1;
        of_stage().map(move |ms| (ms, alone))
    }

    /// The frontier of `ms` in `round`, `alone` in its stage or not: a stage of one model-stage
    /// takes its fastest point, so the rest is not built, nor the point searched for at or past
    /// `cutoff` (`None`: nothing fits below it).
    pub(super) fn member_frontier(
        &self,
        cache: &mut CandidateCache,
        round: &Round,
        ms: ModelStage,
        alone: bool,
        cutoff: f64,
    ) -> Option<Vec<Point>> {
        let max_dp = if SYNCS.iter().any(|(_, to)| *to == ms) { round.sync_dp } else { u32::MAX };
        let prefer = round.current.and_then(|p| p.placements.iter().find(|x| x.candidate.model_stage == ms));
        let prefer = prefer.map(|p| &p.candidate);
        if !alone {
            return Some(cache.frontier(ms, prefer, round.caps, max_dp));
        }
        match cache.fastest(ms, prefer, round.caps, max_dp, cutoff) {
            Fastest::Found(point) => Some(point.into_iter().collect()),
            Fastest::NotBelow => None,
        }
    }

    /// Per model-stage, its share of `room` bytes of state per rank, proportional to the
    /// state of one of its replicas.
    pub(super) fn state_caps(&self, room: u64) -> BTreeMap<ModelStage, u64> {
        let replica_state = |ms: &ModelStage| self.position_state(*ms, Layout::new(1, 1), 0).total() as f64;
        let total: f64 = self.model_stages().iter().map(replica_state).sum::<f64>().max(1.0);
        self.model_stages().iter().map(|ms| (*ms, (room as f64 * replica_state(ms) / total) as u64)).collect()
    }

    /// One round: every stage's layout, stage by stage, and a floor under the step any plan
    /// from them gives: a stage takes at least as long as its slowest member's fastest frontier
    /// point, and once solved, its solution's seconds. Caps only take points away, so the floor
    /// only rises under tighter caps. Once the floor, with `ahead[i]` standing in for each stage
    /// `i` not yet laid out (an uncapped round's stage floors; none: 0), reaches `beat`, the
    /// stages left are not laid out: the round cannot give a faster plan.
    pub(super) fn stage_layouts(
        &self,
        cache: &mut CandidateCache,
        round: &Round,
        beat: f64,
        ahead: &[f64],
    ) -> Result<StageLayouts, Unfit> {
        let mut laid = StageLayouts { stages: Vec::new(), stage_floors: Vec::new() };
        for (i, stage) in STAGES.into_iter().enumerate() {
            let ahead_rest: f64 = ahead.iter().skip(i + 1).sum();
            let cut = |laid: &StageLayouts| laid.floor() + ahead_rest >= beat;
            // A stage of one model-stage is not searched past what could still beat `beat` (with a
            // margin over the rounding of the sums).
            let cutoff = beat - laid.floor() - ahead_rest + 1e-9 * beat;
            let mut frontiers = Vec::new();
            for (ms, alone) in self.stage_members(stage) {
                let Some(f) = self.member_frontier(cache, round, ms, alone, cutoff) else {
                    laid.stage_floors.push(cutoff);
                    return Ok(laid);
                };
                let Some(&Point { seconds: fastest, .. }) = f.last() else { return Err(Unfit::Model(ms)) };
                frontiers.push((f, fastest));
            }
            laid.stage_floors.push(frontiers.iter().map(|(_, fastest)| *fastest).fold(0.0, f64::max));
            if cut(&laid) {
                return Ok(laid);
            }
            let frontiers: Vec<Vec<Point>> = frontiers.into_iter().map(|(f, _)| f).collect();
            let choice = self.solve_stage(&frontiers).ok_or_else(|| Unfit::Stage {
                stage,
                need: frontiers.iter().map(|f| f[0].candidate.ranks()).max().unwrap_or(0),
            })?;
            // The stage takes at least its solution's seconds (its groups run on disjoint rank
            // sets; shaved, as the plan adds them up in another order), a tighter floor than
            // its slowest member alone.
            laid.stage_floors[i] = laid.stage_floors[i].max(choice.seconds * SHAVE);
            if cut(&laid) {
                return Ok(laid);
            }
            let groups = choice
                .groups
                .iter()
                .zip(&choice.group_ranks)
                .map(|(g, &ranks)| GroupToPlace {
                    members: g.iter().map(|&m| frontiers[m][choice.picks[m]].candidate).collect(),
                    ranks,
                })
                .collect();
            laid.stages.push(groups);
        }
        Ok(laid)
    }

    /// The ranks of every stage's groups (see [`assign`]), in model-stage order.
    pub(super) fn ranks_for(&self, stages: &[Vec<GroupToPlace>], current: Option<&Plan>) -> Plan {
        let state_of = |c: &Candidate, j: u32| self.position_state(c.model_stage, c.layout, j).total();
        let mut placements = assign(stages, self.cost().hardware.devices, current, &state_of);
        placements.sort_by_key(|p| self.model_stages().iter().position(|&m| m == p.candidate.model_stage));
        Plan { placements }
    }

    pub(super) fn solve_stage(&self, frontiers: &[Vec<Point>]) -> Option<StageChoice> {
        let points: Vec<Vec<(u32, f64)>> =
            frontiers.iter().map(|f| f.iter().map(|p| (p.candidate.ranks(), p.seconds)).collect()).collect();
        let refs: Vec<&stage::Frontier> = points.iter().map(|p| p.as_slice()).collect();
        stage::solve(&refs, self.cost().hardware.devices)
    }
}

/// What one round of layouts is asked under: the current plan (whose candidates win ties),
/// per-rank caps (none: uncapped) and the most replicas of a layout the weight sync fills.
pub(super) struct Round<'a> {
    current: Option<&'a Plan>,
    caps: Option<&'a Caps>,
    sync_dp: u32,
}

/// One rung of the transient ladder: its caps, its place in the ladder, and a floor under its
/// first stage's seconds (the order rungs are tried in).
pub(super) struct Rung {
    first_floor: f64,
    index: usize,
    caps: Caps,
}

/// What the capped search over the transient ladder has found (see `Planner::place_within`):
/// the fastest plan that fits and its rung, and the unfit plan of the rung latest in the ladder
/// (what the error reports).
struct Ladder {
    best: Option<(Found, usize)>,
    last: (Plan, RankPeaks, Option<usize>),
}

impl Ladder {
    /// The seconds a plan of `rung` must beat: the best's (strictly, on a later rung: the
    /// earlier rung wins ties) and `beat`'s.
    fn to_beat(&self, rung: usize, beat: f64) -> f64 {
        match &self.best {
            Some((b, b_rung)) if rung < *b_rung => b.seconds().next_up().min(beat),
            Some((b, _)) => b.seconds().min(beat),
            None => beat,
        }
    }

    /// Keeps `found`, a plan of `rung` that fits, if it is the fastest so far (on equal
    /// seconds, the earlier rung's).
    fn offer(&mut self, found: Found, rung: usize) {
        let seconds = found.seconds();
        let better = |(b, b_rung): &(Found, usize)| seconds < b.seconds() || (seconds == b.seconds() && rung < *b_rung);
        if self.best.as_ref().is_none_or(better) {
            self.best = Some((found, rung));
        }
    }

    /// Keeps `plan`, a plan of `rung` over memory, as the one to report if no rung later in
    /// the ladder left one.
    fn unfit(&mut self, plan: Plan, peaks: RankPeaks, rung: usize) {
        if self.last.2.is_none_or(|latest| rung >= latest) {
            self.last = (plan, peaks, Some(rung));
        }
    }
}

/// One round's stage layouts: per stage, its groups; and per stage laid out, a floor under
/// its seconds in any plan from them (see [`Planner::stage_layouts`]).
pub(super) struct StageLayouts {
    stages: Vec<Vec<GroupToPlace>>,
    stage_floors: Vec<f64>,
}

impl StageLayouts {
    /// A floor under the step seconds of any plan from these layouts: the stages' floors.
    pub(super) fn floor(&self) -> f64 {
        self.stage_floors.iter().sum()
    }

    /// Whether every stage was laid out (not cut short by its floor).
    pub(super) fn complete(&self) -> bool {
        self.stages.len() == STAGES.len()
    }
}

/// Why a round of planning found nothing (turned into a [`PlannerError`] with a hint).
pub(super) enum Unfit {
    /// A model-stage fits no candidate.
    Model(ModelStage),
    /// A stage's smallest layouts need more ranks than the pool.
    Stage { stage: Stage, need: u32 },
    /// Every placement tried leaves some rank over its memory; the last one.
    Placement { plan: Plan, peaks: RankPeaks },
}

#[cfg(test)]
pub(super) mod tests;
