//! The plan a job starts with, and the response cap it is made for: the config's fixed plan
//! (checked rank by rank against memory), or the planner's. Under a controller the first plan is
//! made for `policy.initial_response_len` (halved until some plan fits) and the cap then follows
//! the observed lengths. `nereus train` and `nereus simulate` start from this one function.

use super::front::{fixed_plan, Planner, PlannerError};
use crate::config::{JobConfig, PolicyMode};
use crate::cost::Efficiencies;
use crate::plan::Plan;
use crate::units::format_bytes;

/// The starting plan of `config`'s job on `gpus` ranks, the planner that predicts it (at
/// `rl.max_response_len`) and the response cap it is made for: `rl.max_response_len`, or under
/// a controller the longest halving of `policy.initial_response_len` some plan fits.
pub fn initial_plan(config: &JobConfig, gpus: u32) -> Result<(Plan, Planner, u32), PlannerError> {
    let max = config.rl.max_response_len;
    let first = match config.policy.initial_response_len {
        0 => max,
        len => len.min(max),
    };
    let at = |len: u32| Planner::new(config, gpus, Some(u64::from(len)), Efficiencies::default());
    let planner = at(max)?;
    let plan = match fixed_plan(config, gpus).map_err(PlannerError::Fixed)? {
        None if config.policy.mode != PolicyMode::Off => {
            let mut first_error = None;
            for len in std::iter::successors(Some(first), |l| (*l > 1).then_some(l / 2)) {
                let planner = at(len)?;
                match planner.search(None) {
                    Ok(job) => return Ok((job.plan(), planner, len)),
                    Err(e) => {
                        first_error.get_or_insert(e);
                    }
                }
            }
            return Err(first_error.expect("at least one length was tried"));
        }
        None => planner.search(None)?.plan(),
        Some(plan) => {
            check_fixed(config, &planner, &plan)?;
            plan
        }
    };
    Ok((plan, planner, max))
}

/// A fixed plan must fit every rank's device; one that eats into the headroom is only warned of.
fn check_fixed(config: &JobConfig, planner: &Planner, plan: &Plan) -> Result<(), PlannerError> {
    let peaks = planner.rank_peaks(plan);
    let (peak, rank) = peaks.max();
    let capacity = config.cluster.device_memory_bytes();
    if peak > capacity {
        return Err(PlannerError::Fixed(format!(
            "[plan] does not fit in memory: rank {rank} would hold {} at its peak ({}), and a device has {} (cluster.device_memory_gb); `nereus plan` finds a plan that fits",
            format_bytes(peak),
            peaks.ranks[rank as usize].busiest.map_or(String::new(), |ms| format!("while {ms} runs")),
            format_bytes(capacity)
        )));
    }
    if peak > planner.cost().hardware.usable_bytes() {
        log::warn!(
            "[plan] leaves less than policy.memory_headroom free: rank {rank} would hold {} of {}",
            format_bytes(peak),
            format_bytes(capacity)
        );
    }
    Ok(())
}
