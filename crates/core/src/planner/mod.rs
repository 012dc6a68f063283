//! Plan search: the fastest memory-feasible global plan.
//!
//! 1. Per model-stage, every `(tp, pp, dp, recompute)` candidate with TP inside a node is
//!    estimated; infeasible ones are dropped, and the rest reduced to a frontier: the fastest
//!    candidate per rank count, keeping only counts that are strictly faster than every smaller
//!    one.
//! 2. Stages (generation, inference, training) run one after another and their model-stages
//!    run concurrently on disjoint ranks, so each stage is a min-max knapsack over its
//!    frontiers under the pool size, solved exactly by dynamic programming over the budget.
//! 3. Ranks are assigned stage by stage: model-stages in decreasing TP order get contiguous,
//!    TP-aligned blocks (TP groups stay inside nodes); a model-stage whose candidate is unchanged
//!    from the current plan keeps its ranks when they are free, so transitions stay cheap.
//!
//! 4. An asynchronous job (`rl.mode = "async"`) splits the pool: generation on ranks of its
//!    own, the rest planned as above on the others, the step priced as the slower pipeline
//!    plus the weight sync (`overlap.rs`).
//!
//! [`Planner::exhaustive`] searches the same space without the frontier and the DP; tests
//! check that both find the same optimum.

mod assign;
mod candidates;
mod check;
mod front;
mod initial;
mod job;
mod overlap;
mod predict;
mod search;
pub mod stage;
#[cfg(test)]
mod testing;

pub use front::{fixed_plan, ModelStagePlan, PlannedJob, Planner, PlannerError};
pub use initial::initial_plan;
pub use job::catalogues;
pub use predict::{overlapped_total, StepSeconds};
