//! Exact solvers beside Nereus's own searches, as the paper compares with SCIP (feature
//! `exact`; `nereus bench solver`). Each writes one of our decisions as a mixed-integer linear
//! program in `good_lp` and solves it with HiGHS:
//!
//! - [`plan`]: one stage's plan selection (Eq. 1), against the planner's frontiers and dynamic
//!   program (`planner::stage`);
//! - [`schedule`]: the order and timing of a transition DAG's primitives, against its list
//!   schedule (`transition::global`), whose critical path is `L_tran`.
//!
//! They live in one module above `planner` and `transition` so that those pure layers keep no
//! optional dependency: they expose their inputs (candidates, DAG nodes), and only this module
//! knows a solver. HiGHS is built from source by `highs-sys` (cmake and a C++ compiler).

pub mod plan;
pub mod schedule;

use std::num::NonZeroU32;

use good_lp::solvers::highs::HighsProblem;
use highs::HighsModelStatus;

/// What a solve found: the best objective and what HiGHS proved about it.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Optimum {
    /// The best solution's objective, seconds.
    pub seconds: f64,
    /// HiGHS's lower bound on the optimum (its MIP dual bound), seconds.
    pub bound: f64,
    /// Whether `seconds` is proved optimal (to HiGHS's default relative MIP gap, 0.01%); `false`
    /// when the time limit stopped the search first.
    pub proved: bool,
}

impl Optimum {
    /// An empty problem's optimum.
    const ZERO: Optimum = Optimum { seconds: 0.0, bound: 0.0, proved: true };

    /// The optimum of the same problem in units `unit` times larger.
    fn scaled(self, unit: f64) -> Optimum {
        Optimum { seconds: self.seconds * unit, bound: self.bound * unit, proved: self.proved }
    }

    /// Two independent problems' optima added (the stages of a plan).
    fn plus(self, other: Optimum) -> Optimum {
        Optimum {
            seconds: self.seconds + other.seconds,
            bound: self.bound + other.bound,
            proved: self.proved && other.proved,
        }
    }
}

/// Solves a minimisation built with `good_lp` on HiGHS, silent (the binding switches HiGHS's
/// output off) and on one thread, so its time compares with our single-threaded searches; stops
/// after `time_limit_s` when given. Returns the optimum and the value of every variable in the
/// order they were added (`good_lp` makes one column per variable, in that order); `None` when
/// the problem is infeasible, or the limit came before any solution.
///
/// The model is handed to the `highs` crate itself rather than through `SolverModel::solve`:
/// `good_lp` keeps the MIP dual bound to itself, and a time-limited solve is only worth
/// reporting with it.
fn solve(problem: HighsProblem, time_limit_s: Option<f64>) -> Option<(Optimum, Vec<f64>)> {
    let mut model = problem.try_into_inner().ok()?;
    model.set_threads(NonZeroU32::MIN);
    if let Some(limit) = time_limit_s {
        model.set_option("time_limit", limit);
    }
    let solved = model.try_solve().ok()?;
    let proved = match solved.status() {
        HighsModelStatus::Optimal => true,
        HighsModelStatus::ReachedTimeLimit => false,
        _ => return None,
    };
    if solved.primal_solution_status() != highs::HighsSolutionStatus::Feasible {
        return None;
    }
    let seconds = solved.objective_value();
    // A MIP always reports its bound; a model without integers (none here) would not.
    let bound = solved.double_info_value(c"mip_dual_bound").unwrap_or(seconds);
    let columns = solved.get_solution().columns().to_vec();
    Some((Optimum { seconds, bound: bound.min(seconds), proved }, columns))
}
