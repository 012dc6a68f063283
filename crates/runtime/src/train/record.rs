//! The step line of `metrics.jsonl`: what the step measured beside what the cost model
//! predicted for the plan it ran under (digests and peak memory need every rank).

use std::collections::BTreeMap;

use nereus_core::cost::{MemoryBreakdown, MemoryItem};
use nereus_core::index_list::format_index_list;
use nereus_core::record::{placements, CountersRecord, ElasticRecord, Measured, RankMemory, StepLine};
use nereus_exec::comm::DataPlane;
use nereus_exec::emu::{EmuSet, Exchange, ShardMemory};
use nereus_exec::engine::EngineMemory;
use nereus_exec::rl::StepMetrics;

use super::console;
use super::fault::pool_ranks;
use super::gather::gather_u64s;
use super::metrics::MetricsLog;
use super::outcome::{Boundary, InForce};
use super::TrainJob;
use crate::RuntimeError;

impl<P, M> TrainJob<'_, P, M>
where
    P: Exchange<M>,
    M: EngineMemory + Clone,
{
    /// Records step `step`: its line built (every rank takes part), printed and appended by
    /// rank 0 with the boundary after it, and the timeline extended.
    pub fn record(
        &mut self,
        step: u64,
        m: &StepMetrics,
        in_force: &InForce,
        boundary: &Boundary,
    ) -> Result<(), RuntimeError> {
        let digest = self.digest_due(step);
        let mut line = step_line(&mut *self.plane, &self.set, in_force, step, m, boundary, digest)?;
        if self.elastic {
            line.elastic = Some(ElasticRecord {
                pool: format_index_list(&pool_ranks(in_force.pool, &in_force.lost)),
                held_bytes: in_force.held.clone(),
                lost_ranks: in_force.lost.clone(),
                rank_loss: boundary.rank_loss.clone(),
            });
        }
        let root = self.session.rank() == 0;
        if root {
            console::print_step(step, m, &in_force.plan, self.progress(step));
            console::print_boundary(boundary);
            let seconds = (m.step_seconds, in_force.predicted.step_seconds());
            let transition = boundary.transition.as_ref();
            self.timeline.push(step, seconds, m.stats.response_len_mean, m.generated_tokens, in_force.pool, transition);
        }
        let written = match root {
            true => self
                .metrics
                .append(&line)
                .and_then(|()| self.append_samples(step, m))
                .and_then(|()| self.tensorboard.as_mut().map_or(Ok(()), |events| events.record(step, "", &line))),
            false => Ok(()),
        };
        self.session.agree("metrics", written)
    }

    /// Whether step `step`'s record carries the state digests: every `train.digest_every`
    /// steps and after the last (never with 0). The config decides, so every rank agrees.
    fn digest_due(&self, step: u64) -> bool {
        let every = u64::from(self.config.train.digest_every);
        every > 0 && ((step + 1).is_multiple_of(every) || step + 1 == u64::from(self.config.job.steps))
    }

    /// How far the run is after step `step`: its seconds so far, and the rest at the mean
    /// seconds per step since this run's first step (warm-ups and set-up left out).
    fn progress(&self, step: u64) -> console::Progress {
        let elapsed_s = self.started.elapsed().as_secs_f64();
        let stepping_s = self.stepping_since.map_or(0.0, |t| t.elapsed().as_secs_f64());
        let done = (step + 1).saturating_sub(self.first_step()).max(1) as f64;
        let left = u64::from(self.config.job.steps).saturating_sub(step + 1) as f64;
        console::Progress { elapsed_s, eta_s: stepping_s / done * left }
    }

    /// Rank 0: the step's decoded responses, one line each, in `<output_dir>/samples.jsonl`.
    fn append_samples(&self, step: u64, m: &StepMetrics) -> Result<(), RuntimeError> {
        let log = MetricsLog::at(self.config.job.output_dir.join("samples.jsonl"));
        for sample in &m.samples {
            log.append(&SampleLine { step, sample })?;
        }
        Ok(())
    }
}

/// A line of `samples.jsonl`.
#[derive(serde::Serialize)]
struct SampleLine<'a> {
    step: u64,
    #[serde(flatten)]
    sample: &'a nereus_exec::rl::TextSample,
}

/// The step's line (docs/operations.md); digests and peak memory need every rank.
fn step_line<M: ShardMemory, P: DataPlane>(
    plane: &mut P,
    set: &EmuSet<M>,
    in_force: &InForce,
    step: u64,
    m: &StepMetrics,
    boundary: &Boundary,
    digest: bool,
) -> Result<StepLine, RuntimeError> {
    // Every rank takes the same branch: the digest is a collective.
    let digests = if digest { set.digests(plane)? } else { BTreeMap::new() };
    let mut state_digest = BTreeMap::new();
    let mut counters = BTreeMap::new();
    for emu in set.emus() {
        let c = emu.counters;
        let name = emu.model_stage.to_string();
        if let Some(digest) = digests.get(&emu.id) {
            state_digest.entry(name.clone()).or_insert_with(|| digest.to_string());
        }
        let record =
            CountersRecord { updates: c.updates, policy_version: c.policy_version, data_position: c.data_position };
        counters.entry(name).or_insert(record);
    }
    let (measured, rank_allocator_peak_bytes) = measured_peaks(plane, set)?;
    let predicted = &in_force.predicted;
    let worst = (0..measured.len()).max_by_key(|&r| measured[r].total()).unwrap_or(0);
    let (predicted_peak, predicted_worst) = predicted.peaks.max();
    Ok(StepLine {
        step,
        stats: m.stats,
        step_seconds: m.step_seconds,
        predicted_step_seconds: predicted.step_seconds(),
        stage_seconds: m.stage_seconds,
        predicted_stage_seconds: predicted.seconds,
        op_seconds: Measured { measured: in_force.slowest_ops, predicted: predicted.op_seconds },
        tokens_per_second: m.generated_tokens as f64 / m.step_seconds.max(1e-9),
        generation_tokens_per_second: m.generated_tokens as f64 / m.stage_seconds.generation.max(1e-9),
        plan: placements(&in_force.plan),
        decision: boundary.decision.clone(),
        transition: boundary.transition.clone(),
        peak_memory_bytes: measured[worst].total(),
        predicted_peak_memory_bytes: predicted_peak,
        peak_memory: Measured {
            measured: RankMemory { rank: worst as i32, items: measured[worst] },
            predicted: RankMemory {
                rank: predicted_worst,
                items: predicted.peaks.ranks[predicted_worst as usize].at_peak(),
            },
        },
        rank_peak_memory_bytes: Measured {
            measured: measured.iter().map(|b| b.total()).collect(),
            predicted: predicted.peaks.ranks.iter().map(|r| r.peak()).collect(),
        },
        rank_allocator_peak_bytes,
        state_digest,
        counters,
        elastic: None,
        asynchronous: m.asynchronous.clone(),
    })
}

/// Every rank's ledger peak, item by item, and on a device each rank's peak by its allocator's
/// own count (one all-gather).
fn measured_peaks<M: ShardMemory, P: DataPlane>(
    plane: &mut P,
    set: &EmuSet<M>,
) -> Result<(Vec<MemoryBreakdown>, Option<Vec<u64>>), RuntimeError> {
    let mine = set.store().ledger().peak_breakdown();
    // Every rank holds the same memory kind, so all have an allocator's count or none do.
    let allocator = set.store().memory().allocator_peak();
    let mut local: Vec<u64> = MemoryItem::ALL.iter().map(|&i| mine.get(i)).collect();
    local.push(allocator.unwrap_or(0));
    let all = gather_u64s(plane, set.world_size(), &local)?;
    let ranks = all.chunks_exact(local.len());
    let ledger = ranks
        .clone()
        .map(|rank| {
            let mut b = MemoryBreakdown::default();
            for (item, bytes) in MemoryItem::ALL.iter().zip(rank) {
                b.add(*item, *bytes);
            }
            b
        })
        .collect();
    let allocators = allocator.map(|_| ranks.map(|rank| rank[MemoryItem::ALL.len()]).collect());
    Ok((ledger, allocators))
}
