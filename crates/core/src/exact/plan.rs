//! One stage's plan selection (Eq. 1) as a mixed-integer linear program over every fitting
//! candidate, solved by HiGHS: the exact answer the planner's dynamic program is checked against.
//!
//! Variables: `x[m][k]` = 1 when model-stage `m` takes its `k`-th candidate `(r, t)`;
//! `y[p]` = 1 when the stage's model-stages are grouped by partition `p` (a group shares one
//! rank set and runs its members one after another, groups run concurrently: the DP's
//! space, [`crate::planner::stage`]); `R[p][g] ≥ 0` the ranks of group `g`; `T` the stage's latency.
//!
//! ```text
//! minimize T
//! Σ_k x[m][k] = 1                                  every model-stage one candidate
//! Σ_p y[p] = 1                                     one grouping
//! R[p][g] ≥ Σ_k r[m][k]·x[m][k] − M_r·(1 − y[p])   m ∈ g: the group holds its widest member
//! Σ_g R[p][g] ≤ N + M_n·(1 − y[p])                 the groups fit the pool
//! T ≥ Σ_{m∈g} Σ_k t[m][k]·x[m][k] − M_t·(1 − y[p]) the slowest group's sum
//! ```
//! (`M_r` the widest candidate, `M_n = |p|·M_r`, `M_t` the sum of every member's slowest
//! candidate: big-M terms that switch a partition's constraints off when it is not chosen.)

use good_lp::{constraint, highs, variable, Expression, ProblemVariables, SolverModel, Variable};

use super::{solve, Optimum};
use crate::planner::stage::partitions;

/// The optimum of one stage over `members` (per model-stage: every candidate as `(ranks,
/// seconds)`) on `budget` ranks; `None` when nothing fits.
pub fn stage_optimum(members: &[Vec<(u32, f64)>], budget: u32) -> Option<Optimum> {
    if members.is_empty() {
        return Some(Optimum::ZERO);
    }
    if members.iter().any(Vec::is_empty) {
        return None;
    }
    let mut vars = ProblemVariables::new();
    let x: Vec<Vec<Variable>> =
        members.iter().map(|c| c.iter().map(|_| vars.add(variable().binary())).collect()).collect();
    let parts = partitions(members.len());
    let y: Vec<Variable> = parts.iter().map(|_| vars.add(variable().binary())).collect();
    let r: Vec<Vec<Variable>> =
        parts.iter().map(|p| p.iter().map(|_| vars.add(variable().min(0.0))).collect()).collect();
    let t = vars.add(variable().min(0.0));
    let m_r = members.iter().flatten().map(|c| f64::from(c.0)).fold(0.0, f64::max);
    let m_t: f64 = members.iter().map(|c| c.iter().map(|p| p.1).fold(0.0, f64::max)).sum();
    let ranks = |m: usize| -> Expression { members[m].iter().zip(&x[m]).map(|(c, v)| f64::from(c.0) * *v).sum() };
    let seconds = |m: usize| -> Expression { members[m].iter().zip(&x[m]).map(|(c, v)| c.1 * *v).sum() };
    let mut problem = vars.minimise(t).using(highs);
    for xm in &x {
        problem = problem.with(constraint!(xm.iter().copied().sum::<Expression>() == 1.0));
    }
    problem = problem.with(constraint!(y.iter().copied().sum::<Expression>() == 1.0));
    for (p, groups) in parts.iter().enumerate() {
        let off = |big: f64| big * (1.0 - y[p]);
        for (g, members_of_g) in groups.iter().enumerate() {
            for &m in members_of_g {
                problem = problem.with(constraint!(r[p][g] >= ranks(m) - off(m_r)));
            }
            let sum: Expression = members_of_g.iter().map(|&m| seconds(m)).sum();
            problem = problem.with(constraint!(t >= sum - off(m_t)));
        }
        let used: Expression = r[p].iter().copied().sum();
        problem = problem.with(constraint!(used <= f64::from(budget) + off(groups.len() as f64 * m_r)));
    }
    // No time limit: these models are small and their relaxations nearly integral.
    solve(problem, None).map(|(optimum, _)| optimum)
}

/// The sum over the stages of their optima (what `Planner::stage_optima` finds by the DP), for
/// the candidates of [`Planner::stage_candidates`](crate::planner::Planner::stage_candidates).
pub fn plan_optimum(stages: &[Vec<Vec<(u32, f64)>>], budget: u32) -> Option<Optimum> {
    stages.iter().try_fold(Optimum::ZERO, |sum, members| Some(sum.plus(stage_optimum(members, budget)?)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::planner::stage::{solve as stage_dp, Frontier};

    #[test]
    fn the_milp_agrees_with_the_stage_dp_on_small_stages() {
        // Two model-stages; sharing 4 ranks (1 + 1.5 s) beats splitting them (2 + 2 = 4 ranks, 3 s).
        let a = vec![(2, 3.0), (4, 1.0)];
        let b = vec![(2, 3.0), (4, 1.5)];
        let exact = stage_optimum(&[a.clone(), b.clone()], 4).unwrap();
        assert!(exact.proved);
        let exact = exact.seconds;
        assert!((exact - 2.5).abs() < 1e-6, "{exact}");
        let dp = stage_dp(&[a.as_slice() as &Frontier, b.as_slice()], 4).unwrap().seconds;
        assert!((dp - exact).abs() < 1e-6);
        assert!(stage_optimum(&[vec![(8, 1.0)]], 4).is_none());
        // Disjoint is best when the pool is wide.
        let exact = stage_optimum(&[a, b], 8).unwrap().seconds;
        assert!((exact - 1.5).abs() < 1e-6, "{exact}");
    }
}
