//! The step boundary of the live job: rank 0's [`Controller`] decides (pure,
//! `policy::controller`), every rank learns the [`Action`] and carries it out — a rank lost,
//! a transition DAG run on the live EMUs, a new pool or response cap, or a checkpoint and a
//! stop when nothing fits.

use std::collections::BTreeMap;
use std::time::Instant;

use nereus_core::config::PolicyMode;
use nereus_core::plan::Plan;
use nereus_core::planner::Planner;
use nereus_core::policy::controller::{Action, StepRecord};
use nereus_core::policy::TransitionKind;
use nereus_core::record::{RankLossRecord, TransitionRecord};
use nereus_core::transition::target::state_bytes;
use nereus_core::transition::{global::Links, Coordination, TransitionDag};
use nereus_exec::comm::{max_over_ranks, DataPlane};
use nereus_exec::emu::{EmuSet, Exchange, ShardMemory};
use nereus_exec::engine::EngineMemory;
use nereus_exec::rl::StepMetrics;

use super::fault::surviving;
use super::outcome::{Boundary, ControllerStop, InForce, Predicted};
use super::sources::{create_replica, from_checkpoint};
use super::start::{next_pool, rl_job};
use super::TrainJob;
use crate::{RuntimeError, Session};
use nereus_exec::emu::dag::{agree_on_dag, execute};

impl<P, M> TrainJob<'_, P, M>
where
    P: Exchange<M>,
    M: EngineMemory + Clone,
{
    /// A boundary failed with `e`: when every rank holds the error (an agreed failure, such as
    /// a rank loss nothing can restore), the step it followed is still recorded, so no
    /// completed step goes missing from the metrics; then `e` is returned. A failure only some
    /// ranks saw is returned as it is (the others may be inside a collective).
    pub fn record_before_failing(
        &mut self,
        step: u64,
        m: &StepMetrics,
        in_force: &InForce,
        e: RuntimeError,
    ) -> RuntimeError {
        if e.reported_by_root() {
            if let Err(also) = self.record(step, m, in_force, &Boundary::default()) {
                log::warn!("the record of step {step} could not be written either: {also}");
            }
        }
        e
    }

    /// The boundary after step `step`: a declared rank loss, the controller's decision on the
    /// step with the next step's pool, and what it asks for; a controller that finds nothing
    /// that fits checkpoints and stops the job.
    pub fn boundary(&mut self, step: u64, m: &StepMetrics, in_force: &InForce) -> Result<Boundary, RuntimeError> {
        if self.config.policy.mode == PolicyMode::Off {
            return Ok(Boundary::default());
        }
        let loss = match self.fault.filter(|f| f.at_step == step + 1) {
            Some(f) => Some(self.lose_rank(f.rank)?),
            None => None,
        };
        let world = self.session.world().size() as u32;
        let survivors = world - self.lost.len() as u32;
        let root = self.session.rank() == 0;
        let next_pool = root.then(|| next_pool(&self.pools, step + 1, self.pool).min(survivors));
        let mut record = observed(step, m, in_force, next_pool, &self.lost);
        if !self.set.store().memory().times_operations() {
            // A GPU's timers saw work issued, not run: calibration goes by stage totals.
            record.op_seconds = None;
        }
        let action = decide(self.session, self.controller.as_mut(), &record, &self.plan)?;
        self.pool = action.pool;
        let mut boundary = self.act(&action, loss.is_some())?;
        boundary.rank_loss = loss;
        if let (Some(c), Some(t)) = (self.controller.as_mut(), &boundary.transition) {
            c.transitioned(t.predicted_seconds, t.seconds);
        }
        if let Some(reason) = &action.stop {
            let checkpoint = self.checkpoint(step + 1)?;
            boundary.stop = Some(ControllerStop { step, reason: reason.clone(), checkpoint });
        }
        Ok(boundary)
    }

    /// Carries out the controller's `action` on every rank: the transition to its target (if
    /// any), then the RL job rebuilt over the EMUs for the new plan and response cap (or, when
    /// a rank was `lost`, over the replicas that remain) — the same parameters, moments,
    /// counters, data position and seeds, the same global batch.
    fn act(&mut self, action: &Action, lost: bool) -> Result<Boundary, RuntimeError> {
        let world = self.session.world().size() as u32;
        let cap = action.cap;
        let planner = Planner::new(self.config, world, Some(u64::from(cap)), action.efficiencies)?;
        let mut boundary = Boundary { decision: action.decision.clone(), ..Boundary::default() };
        let kind = action.decision.as_ref().and_then(|d| d.kind);
        if let Some(target) = &action.target {
            let host = self.config.cluster.host_link_gbps * 1e9;
            let moved = (&self.plan, target);
            let record = transition(self.session, &mut *self.plane, &mut self.set, &planner, host, moved, kind)?;
            boundary.transition = Some(record);
            self.plan = target.clone();
        }
        if lost || action.target.is_some() || self.settings.sampling.max_new_tokens != cap as usize {
            self.settings.sampling.max_new_tokens = cap as usize;
            self.rebuild_rl(&planner)?;
        }
        self.predicted = Predicted::of(&planner, &self.plan);
        Ok(boundary)
    }

    /// The RL job rebuilt over the live EMUs for the plan and settings in force, its weight
    /// syncs planned with `planner`.
    fn rebuild_rl(&mut self, planner: &Planner) -> Result<(), RuntimeError> {
        self.rl = rl_job(self.session, &mut *self.plane, &self.set, (&self.plan, &self.settings), planner)?;
        Ok(())
    }

    /// Rank `gone` is lost at this boundary: on every rank the replicas that had a shard there
    /// are dropped (freed, never read), and each model-stage left without a replica is restored
    /// from the latest complete checkpoint (`fault::surviving` says where). The live plan
    /// becomes what remains.
    fn lose_rank(&mut self, gone: u32) -> Result<RankLossRecord, RuntimeError> {
        let session = self.session;
        self.lost.push(gone);
        self.lost.sort_unstable();
        let world = session.world().size() as u32;
        let (mut plan, restore) = session.agree("rank loss", surviving(&self.plan, gone as i32, &self.lost, world))?;
        let dropped: Vec<_> = self.set.emus().filter(|e| e.ranks.contains(&(gone as i32))).map(|e| e.id).collect();
        for id in &dropped {
            self.set.lose(*id);
        }
        let mut checkpoint = None;
        if !restore.is_empty() {
            // A checkpoint still being written is the latest once it is sealed.
            self.finish_checkpoint()?;
            let latest = self.checkpoints.latest().ok_or_else(|| {
                RuntimeError::Usage(format!(
                    "rank {gone} was lost with the last replica of {} and there is no complete checkpoint to restore it from (train.checkpoint_every)",
                    restore[0].candidate.model_stage
                ))
            });
            let dir = session.agree("rank loss", latest)?;
            let sources = from_checkpoint(session, &dir, self.config, self.options)?;
            for p in &restore {
                create_replica(&mut *self.plane, &mut self.set, self.config, &sources, p, &p.ranks)?;
            }
            checkpoint = Some(dir);
        }
        plan.placements.extend(restore.iter().cloned());
        let order: Vec<_> = self.plan.placements.iter().map(|p| p.candidate.model_stage).collect();
        plan.placements.sort_by_key(|p| order.iter().position(|m| *m == p.candidate.model_stage));
        self.plan = plan;
        if session.rank() == 0 {
            log::warn!(
                "rank {gone} lost: {} replicas dropped, {} restored from {}",
                dropped.len(),
                restore.len(),
                checkpoint.as_ref().map_or("no checkpoint".into(), |d| d.display().to_string())
            );
        }
        Ok(RankLossRecord {
            rank: gone,
            replicas_dropped: dropped.len(),
            restored: restore.iter().map(|p| p.candidate.model_stage.to_string()).collect(),
            checkpoint,
        })
    }
}

/// What the controller is shown of step `step` (the same fields its JSON line carries), with
/// the pool of the next step.
fn observed(step: u64, m: &StepMetrics, in_force: &InForce, pool_size: Option<u32>, lost_ranks: &[u32]) -> StepRecord {
    StepRecord {
        step,
        response_len_mean: m.stats.response_len_mean,
        response_len_p95: m.stats.response_len_p95,
        step_seconds: m.step_seconds,
        stage_seconds: Some(m.stage_seconds),
        op_seconds: Some(in_force.slowest_ops),
        pool_size,
        lost_ranks: lost_ranks.to_vec(),
        transition: None,
    }
}

/// Rank 0 decides (`controller` is rank 0's), every rank learns the action. A failure on rank 0
/// is agreed first, so nobody waits on a broadcast that never comes.
fn decide(
    session: &Session,
    controller: Option<&mut nereus_core::policy::controller::Controller>,
    m: &StepRecord,
    plan: &Plan,
) -> Result<Action, RuntimeError> {
    let local = match controller {
        Some(c) => c.decide(m, plan).map(|a| serde_json::to_vec(&a).expect("actions serialize")).map_err(Into::into),
        None => Ok(Vec::new()),
    };
    let agreed = session.from_root("controller decision", local)?;
    serde_json::from_slice(&agreed).map_err(|e| RuntimeError::Usage(format!("undecodable decision from rank 0: {e}")))
}

/// Runs the transition `from → to` on every rank: the DAG planned with the state bytes and
/// links of `planner`, agreed by hash, executed on the live EMUs; digests per model-stage
/// before and after (layout-independent), measured seconds and bytes beside the prediction.
fn transition<M: ShardMemory, P: Exchange<M>>(
    session: &Session,
    plane: &mut P,
    set: &mut EmuSet<M>,
    planner: &Planner,
    host_bytes_per_s: f64,
    (from, to): (&Plan, &Plan),
    kind: Option<TransitionKind>,
) -> Result<TransitionRecord, RuntimeError> {
    let links = Links::of(&planner.cost().hardware, Some(host_bytes_per_s));
    let dag = TransitionDag::plan(from, to, &state_bytes(planner), &links, Coordination::Global)?;
    agree_on_dag(session.world(), session.watchdog(), &dag)?;
    let digests_before = stage_digests(plane, set)?;
    let start = Instant::now();
    let (_, report) = execute(set, plane, &dag)?;
    let seconds = start.elapsed().as_secs_f64();
    let seconds =
        f64::from_bits(max_over_ranks(session.world(), session.watchdog(), "transition time", seconds.to_bits()));
    let digests_after = stage_digests(plane, set)?;
    Ok(TransitionRecord {
        kind,
        seconds,
        predicted_seconds: dag.schedule.seconds,
        bytes: report.bytes_sent, // already the total of every rank
        staged_bytes: dag.staged_bytes(),
        primitives: dag.graph.node_count(),
        from: from.to_string(),
        to: to.to_string(),
        digests_before,
        digests_after,
    })
}

/// Each model-stage's digest (its first replica's; every replica holds the same state).
fn stage_digests<M: ShardMemory, P: DataPlane>(
    plane: &mut P,
    set: &EmuSet<M>,
) -> Result<BTreeMap<String, String>, RuntimeError> {
    let digests = set.digests(plane)?;
    let mut out = BTreeMap::new();
    for emu in set.emus() {
        out.entry(emu.model_stage.to_string()).or_insert_with(|| digests[&emu.id].to_string());
    }
    Ok(out)
}
