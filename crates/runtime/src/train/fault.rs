//! Rank loss (`--fail-rank R --at-step K`, `[faults]`): rank R is declared lost without warning
//! at the start of step K. Its state is gone (freed, never read); every replica that had a
//! shard there is dropped on every rank, the other DP replicas keep their live state, and a
//! model-stage left without a replica is restored from the latest complete checkpoint. The
//! controller then replans on the ranks that remain (an urgent pool change).
//!
//! Debian's OpenMPI has no ULFM: a process that really dies takes the job down, and the batch
//! scripts in `slurm/` restart it with `--resume latest` on the ranks that remain. This is the
//! in-job path for a rank that is lost while its process lives (a device fault, a drained node).

use nereus_core::config::{JobConfig, PolicyMode};
use nereus_core::plan::{Placement, Plan};

use crate::RuntimeError;

/// A declared rank loss.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RankFault {
    /// The rank lost.
    pub rank: u32,
    /// The step at whose start it is lost.
    pub at_step: u64,
}

/// The job's declared rank loss: `--fail-rank`/`--at-step` over `[faults]`; checked against the
/// world and the policy (only a controller can replan around it).
pub fn rank_fault(
    config: &JobConfig,
    cli: (Option<u32>, Option<u64>),
    world: u32,
) -> Result<Option<RankFault>, RuntimeError> {
    let rank = cli.0.or(config.faults.fail_rank);
    let at_step = cli.1.or(config.faults.at_step);
    let (rank, at_step) = match (rank, at_step) {
        (None, None) => return Ok(None),
        (Some(r), Some(k)) => (r, k),
        _ => {
            return Err(RuntimeError::Usage(
                "--fail-rank and --at-step (faults.fail_rank and faults.at_step) go together".into(),
            ))
        }
    };
    if rank >= world || world < 2 {
        return Err(RuntimeError::Usage(format!(
            "--fail-rank {rank}: the world has ranks 0 … {}, and one must remain",
            world - 1
        )));
    }
    if at_step == 0 {
        return Err(RuntimeError::Usage(
            "--at-step 0: a rank is lost at the start of a step after the first (K >= 1)".into(),
        ));
    }
    if at_step >= u64::from(config.job.steps) {
        return Err(RuntimeError::Usage(format!(
            "--at-step {at_step}: the job runs steps 0 … {} (job.steps = {}), so rank {rank} would never be lost",
            u64::from(config.job.steps).saturating_sub(1),
            config.job.steps
        )));
    }
    if config.policy.mode == PolicyMode::Off {
        return Err(RuntimeError::Usage(format!(
            "--fail-rank {rank}: policy.mode = \"off\" cannot replan around a lost rank; set policy.mode (or --policy)"
        )));
    }
    Ok(Some(RankFault { rank, at_step }))
}

/// The first `n` ranks of the world that are not `lost` (sorted).
pub fn pool_ranks(n: u32, lost: &[u32]) -> Vec<u32> {
    (0..).filter(|r| !lost.contains(r)).take(n as usize).collect()
}

/// What remains of `plan` when `gone` is lost: each model-stage keeps its replicas that did not
/// use it. The second list holds, for each model-stage left with none, where to restore one:
/// its first replica's ranks with `gone` replaced by the lowest rank that is not `lost` and that
/// replica did not use.
pub fn surviving(plan: &Plan, gone: i32, lost: &[u32], world: u32) -> Result<(Plan, Vec<Placement>), RuntimeError> {
    let mut kept = Vec::new();
    let mut restore = Vec::new();
    for p in &plan.placements {
        let replicas: Vec<&[i32]> =
            (0..p.candidate.dp as usize).map(|r| p.replica(r)).filter(|ranks| !ranks.contains(&gone)).collect();
        if replicas.is_empty() {
            let first = p.replica(0);
            let spare =
                (0..world as i32).find(|r| !lost.contains(&(*r as u32)) && !first.contains(r)).ok_or_else(|| {
                    RuntimeError::Usage(format!("{}: no rank left to restore it on", p.candidate.model_stage))
                })?;
            let ranks = first.iter().map(|&r| if r == gone { spare } else { r }).collect();
            let mut candidate = p.candidate;
            candidate.dp = 1;
            restore.push(Placement { candidate, ranks });
            continue;
        }
        let mut candidate = p.candidate;
        candidate.dp = replicas.len() as u32;
        kept.push(Placement { candidate, ranks: replicas.concat() });
    }
    Ok((Plan { placements: kept }, restore))
}

#[cfg(test)]
mod tests {
    use super::*;
    use nereus_core::model::Layout;
    use nereus_core::plan::{model_stages, Candidate, Recompute};

    #[test]
    fn replicas_on_the_lost_rank_go_and_a_model_stage_without_one_is_restored_elsewhere() {
        let stages = model_stages(nereus_core::config::Algorithm::Ppo);
        let placement = |i: usize, dp: u32, ranks: Vec<i32>| {
            let candidate = Candidate {
                model_stage: stages[i],
                layout: Layout { tp: 1, pp: 1 },
                dp,
                recompute: Recompute::None,
                micro_batch: 1,
            };
            Placement { candidate, ranks }
        };
        let plan = Plan { placements: vec![placement(0, 2, vec![0, 6]), placement(1, 1, vec![6])] };
        let (kept, restore) = surviving(&plan, 6, &[6], 8).unwrap();
        assert_eq!(kept.placements, vec![placement(0, 1, vec![0])]);
        assert_eq!(restore, vec![placement(1, 1, vec![0])]);
        assert_eq!(pool_ranks(4, &[1, 2]), [0, 3, 4, 5]);
    }
}
