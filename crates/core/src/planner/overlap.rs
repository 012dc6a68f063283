//! Asynchronous jobs (`rl.mode = "async"`): the actor's generation runs on ranks of its own,
//! overlapping inference and training, so a plan is a split of the pool and the step is priced
//! as the slower of the two pipelines plus the weight sync, never as their sum.
//!
//! The split: with a pool of `P` ranks, generation takes the last `g` and every other
//! model-stage is planned on the first `P − g`, by the same search as a synchronous job
//! ([`Planner::place`]) on the smaller pool; generation takes the fastest candidate of its
//! frontier on `g` ranks. Every `g` in `1..P` is tried (a geometric ladder of them past
//! [`EXHAUSTIVE_SPLITS`] ranks) and the fastest overlapped step wins; ties keep the current
//! split. Worked example: `P = 8`, `g = 3` puts `actor/generation` on ranks 5–7 and the
//! reference, reward and actor training on ranks 0–4.

use super::front::{Found, Planner};
use super::predict::GENERATION;
use super::search::Unfit;
use crate::plan::{Placement, Plan, Stage};

/// Pools up to this many ranks try every split; larger ones a ladder of about 24.
pub(super) const EXHAUSTIVE_SPLITS: u32 = 64;

/// The generation ranks `g` tried on a pool of `pool` ranks, most first.
fn splits(pool: u32) -> Vec<u32> {
    if pool <= EXHAUSTIVE_SPLITS {
        return (1..pool).rev().collect();
    }
    let mut out: Vec<u32> = (1..24).map(|k| (u64::from(pool) * k / 24) as u32).filter(|&g| g >= 1).collect();
    out.dedup();
    out.reverse();
    out
}

impl Planner {
    /// The fastest overlapped plan over every split tried (see the module doc), or why none
    /// fits; the current plan's split wins ties.
    pub(super) fn place_overlapped(&self, current: Option<&Plan>) -> Result<Found, Unfit> {
        let pool = self.cost().hardware.devices;
        if pool < 2 {
            return Err(Unfit::Stage { stage: Stage::Generation, need: 2 });
        }
        let kept_split = current.and_then(|p| p.placements.iter().find(|p| p.candidate.model_stage == GENERATION));
        let kept_split = kept_split.and_then(|p| p.ranks.iter().min()).map(|&r| pool.saturating_sub(r as u32));
        let mut best: Option<Found> = None;
        let mut last_error = None;
        let mut order = splits(pool);
        if let Some(g) = kept_split.filter(|g| order.contains(g)) {
            order.retain(|&x| x != g);
            order.insert(0, g);
        }
        for g in order {
            match self.split_at(g, current) {
                Ok(found) if best.as_ref().is_none_or(|b| found.seconds() < b.seconds()) => best = Some(found),
                Ok(_) => {}
                Err(e) => last_error = Some(e),
            }
        }
        best.ok_or_else(|| last_error.expect("at least one split was tried"))
    }

    /// The plan with generation on the last `g` ranks of the pool and the rest on the others.
    fn split_at(&self, g: u32, current: Option<&Plan>) -> Result<Found, Unfit> {
        let pool = self.cost().hardware.devices;
        let (response, e) = (self.response_len(), self.cost().efficiencies);
        let sub = |n: u32| self.synchronous().replanned(n, response, e).expect("pools here are not empty");
        let rest_current = current.map(|p| within(p, pool - g));
        let rest = sub(pool - g).place(rest_current.as_ref())?;
        let prefer = current.and_then(|p| p.placements.iter().find(|p| p.candidate.model_stage == GENERATION));
        let fastest = sub(g).frontier(GENERATION, prefer.map(|p| &p.candidate)).pop();
        let (candidate, _) = fastest.ok_or(Unfit::Model(GENERATION))?;
        let first = (pool - g) as i32;
        let generation = Placement { candidate, ranks: (first..first + candidate.ranks() as i32).collect() };
        let mut plan = rest.plan;
        for p in plan.placements.iter_mut().filter(|p| p.candidate.model_stage == GENERATION) {
            *p = generation.clone();
        }
        let peaks = self.rank_peaks(&plan);
        if peaks.max().0 > self.cost().hardware.usable_bytes() {
            return Err(Unfit::Placement { plan, peaks });
        }
        Ok(Found { step: self.job.fitting_step_seconds(&plan), plan, peaks, overlapped: true })
    }
}

/// `plan`'s placements other than generation that lie on ranks below `first` (what the rest
/// of a split can keep of it).
fn within(plan: &Plan, first: u32) -> Plan {
    let keep = |p: &&Placement| p.candidate.model_stage != GENERATION && p.ranks.iter().all(|&r| (r as u32) < first);
    Plan { placements: plan.placements.iter().filter(keep).cloned().collect() }
}

#[cfg(test)]
mod tests {
    use super::super::predict::{generation_apart, overlapped_total};
    use super::*;
    use crate::plan::PerPhase;

    #[test]
    fn an_overlapped_step_is_the_slower_pipeline_plus_the_sync() {
        let step = PerPhase { generation: 3.0, inference: 1.0, training: 1.5, weight_sync: 0.25 };
        assert_eq!(overlapped_total(&step), 3.25);
        let step = PerPhase { generation: 1.0, ..step };
        assert_eq!(overlapped_total(&step), 2.75);
    }

    #[test]
    fn async_plans_keep_generation_apart_and_are_priced_overlapped() {
        use super::super::testing::tiny;
        use crate::config::{Algorithm, RlMode};
        use crate::cost::Efficiencies;
        let mut found = 0;
        for seed in 0..12 {
            let mut config = tiny(&mut crate::rng::Rng::new(seed));
            config.rl.mode = RlMode::Async;
            if config.rl.algorithm == Algorithm::Remax {
                continue;
            }
            let gpus = 2 + seed as u32 % 7;
            let Ok(planner) = Planner::new(&config, gpus, None, Efficiencies::default()) else { continue };
            let Ok(job) = planner.search(None) else { continue };
            let plan = job.plan();
            assert!(generation_apart(&plan), "seed {seed}: {plan}");
            assert_eq!(job.step_latency_s, overlapped_total(&job.step_seconds), "seed {seed}");
            assert_eq!(planner.predict(&plan), job.step_latency_s);
            // The controller may keep it (`still_fits` also checks that generation stays apart).
            assert!(planner.still_fits(&plan).is_some());
            found += 1;
        }
        assert!(found >= 4, "only {found} tiny async jobs had a plan");
    }

    #[test]
    fn small_pools_try_every_split_and_large_ones_a_ladder() {
        assert_eq!(splits(4), vec![3, 2, 1]);
        let ladder = splits(1024);
        assert!(ladder.len() <= 24 && ladder.contains(&512) && ladder.iter().all(|&g| (1..1024).contains(&g)));
    }
}
