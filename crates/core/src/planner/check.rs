//! Checks of the search: the same space searched without frontiers or the stage solver
//! ([`Planner::exhaustive`]), and the inputs and optima an exact solver is compared with.

use super::candidates::Point;
use super::front::Planner;
use super::search::STAGES;
use super::stage;

impl Planner {
    /// Each stage's optimum by brute force over every candidate (the first fitting variant of
    /// every layout and replica count; small settings only: tests check the frontier and the
    /// stage solver against it), summed over the stages.
    pub fn exhaustive(&self) -> Option<f64> {
        let mut cache = self.candidates();
        let mut total = 0.0;
        for stage in STAGES {
            let lists: Vec<Vec<(u32, f64)>> = self
                .model_stages()
                .iter()
                .filter(|m| m.stage == stage)
                .map(|&m| cache.all_fitting(m).into_iter().map(|(c, e)| (c.ranks(), e.seconds)).collect())
                .collect();
            let refs: Vec<&stage::Frontier> = lists.iter().map(|l| l.as_slice()).collect();
            total += stage::solve_exhaustively(&refs, self.cost().hardware.devices)?;
        }
        Some(total)
    }

    /// Per stage (generation, inference, training), per model-stage of it: every fitting
    /// candidate as `(ranks, seconds)` — every variant (micro-batch, recomputation, decode
    /// wave) of every layout and replica count that fits a rank of its own, nothing pruned —
    /// the input of an exact solver.
    pub fn stage_candidates(&self) -> Vec<Vec<Vec<(u32, f64)>>> {
        let mut cache = self.candidates();
        STAGES
            .iter()
            .map(|&stage| {
                self.model_stages()
                    .iter()
                    .filter(|m| m.stage == stage)
                    .map(|&m| cache.every_fitting(m).into_iter().map(|(c, e)| (c.ranks(), e.seconds)).collect())
                    .collect()
            })
            .collect()
    }

    /// The sum of the stage solver's optima (what [`Planner::exhaustive`] checks).
    pub fn stage_optima(&self) -> Option<f64> {
        let mut cache = self.candidates();
        let mut total = 0.0;
        for stage in STAGES {
            let frontiers: Vec<Vec<Point>> = self
                .model_stages()
                .iter()
                .filter(|m| m.stage == stage)
                .map(|&m| cache.frontier(m, None, None, u32::MAX))
                .collect();
            total += self.solve_stage(&frontiers)?.seconds;
        }
        Some(total)
    }
}
