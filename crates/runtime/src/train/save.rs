//! Checkpoints of the live job: every model, its optimizer state and the job's counters.

use std::collections::BTreeMap;
use std::path::PathBuf;

use nereus_core::model::OutputHead;
use nereus_core::plan::{ModelStage, Stage};

use super::sources::spec;
use super::TrainJob;
use nereus_exec::emu::Exchange;
use nereus_exec::engine::EngineMemory;

use crate::checkpoint::{self, Lineage, ModelToSave, PendingCheckpoint, SaveOptions, Sidecar, Writer};
use crate::RuntimeError;

impl<'s, P, M> TrainJob<'s, P, M>
where
    P: Exchange<M>,
    M: EngineMemory + Clone,
{
    /// Saves every model as checkpoint `step` and returns when it is on disk (every rank calls
    /// it; see [`checkpoint::save`]), after the one being written in the background, if any;
    /// every rank learns where it went, or every rank fails.
    pub fn checkpoint(&mut self, step: u64) -> Result<PathBuf, RuntimeError> {
        self.finish_checkpoint()?;
        let (models, sidecar, options) = (self.models_to_save(), self.sidecar(step), self.save_options());
        let saved = checkpoint::save(&mut *self.plane, &self.set, &models, sidecar, &self.checkpoints, &options);
        self.session.agree("checkpoint", saved.map_err(RuntimeError::from))
    }

    /// Starts checkpoint `step` and returns once every model is gathered onto rank 0's host
    /// memory (every rank agrees it arrived); a thread of rank 0 writes the files while the job
    /// trains on, and [`TrainJob::finish_checkpoint`] (the next checkpoint, the run's end) waits
    /// for it. Until it is sealed, `latest` names the previous checkpoint.
    pub fn checkpoint_in_background(&mut self, step: u64) -> Result<(), RuntimeError> {
        self.finish_checkpoint()?;
        let models = self.models_to_save();
        let snapshot = checkpoint::snapshot(&mut *self.plane, &self.set, &models, &self.checkpoints, step);
        let snapshot = self.session.agree("checkpoint snapshot", snapshot.map_err(RuntimeError::from))?;
        // A writer that cannot start fails every rank, not rank 0 alone.
        let writer = snapshot.map(|snapshot| self.spawn_writer(snapshot, step)).transpose();
        let writer = self.session.agree("checkpoint writer", writer)?;
        self.pending_checkpoint = Some(PendingCheckpoint::new(step, &self.checkpoints, writer));
        Ok(())
    }

    /// Rank 0's thread that writes `snapshot` as checkpoint `step`, timing itself.
    fn spawn_writer(&self, snapshot: checkpoint::Snapshot, step: u64) -> Result<Writer, RuntimeError> {
        let (sidecar, checkpoints, options) = (self.sidecar(step), self.checkpoints.clone(), self.save_options());
        let write = move || {
            let start = std::time::Instant::now();
            checkpoint::write(snapshot, sidecar, &checkpoints, &options).map(|dir| (dir, start.elapsed()))
        };
        let spawned = std::thread::Builder::new().name("checkpoint-writer".into()).spawn(write);
        spawned.map_err(crate::io_error("start the checkpoint writer for", &self.checkpoints.step_dir(step)))
    }

    /// Waits for the checkpoint being written in the background, if any (every rank calls it):
    /// every rank learns where it went, or every rank fails with rank 0's error.
    pub fn finish_checkpoint(&mut self) -> Result<(), RuntimeError> {
        let Some(pending) = self.pending_checkpoint.take() else { return Ok(()) };
        let step = pending.step;
        let written = pending.wait();
        let (dir, took) = self.session.agree("checkpoint", written.map_err(RuntimeError::from))?;
        if self.session.rank() == 0 {
            let bytes = bytes_under(&dir);
            let rate = bytes as f64 / took.as_secs_f64().max(1e-9) / 1e6;
            log::info!(
                "checkpoint of step {} written to {} in the background: {bytes} bytes in {:.2} s ({rate:.0} MB/s)",
                step,
                dir.display(),
                took.as_secs_f64()
            );
        }
        Ok(())
    }

    /// What every model directory of a checkpoint takes from the job.
    fn save_options(&self) -> SaveOptions {
        let config = self.config;
        SaveOptions {
            max_shard_bytes: config.train.checkpoint_shard_bytes(),
            max_position_embeddings: (config.rl.prompt_len + config.rl.max_response_len).into(),
            eos_token_id: Some(self.settings.sampling.eos),
            temperature: config.train.temperature,
            top_p: config.train.top_p,
        }
    }

    /// Each model once: from its first training replica (with Adam's moments) when it trains,
    /// else its first replica.
    fn models_to_save(&self) -> Vec<ModelToSave<'s>> {
        let (config, replicas) = (self.config, &self.rl.replicas);
        let mut models: Vec<ModelToSave> = Vec::new();
        for (ms, ids) in replicas {
            let role = ms.role;
            let training = ModelStage::new(role, Stage::Training);
            if models.iter().any(|m| m.role == role) || (!ms.trains() && replicas.contains_key(&training)) {
                continue;
            }
            // A model that started from a directory carries what the job does not own of it.
            let source = spec(config, role).path.as_deref();
            let head = role.head();
            // A text job's language models carry the tokenizer they were trained with, so that
            // the checkpoint is a model directory transformers (and a later job) can use as is.
            let tokenizer =
                (head == OutputHead::Lm).then(|| config.data.as_ref().and_then(|d| d.tokenizer.as_deref())).flatten();
            models.push(ModelToSave { role, emu: ids[0], architecture: spec(config, role), head, source, tokenizer });
        }
        models
    }

    /// The checkpoint's sidecar: the job, the step, the data position (the counters', where
    /// the next step's prompts start) and every counter. A model is saved once, as trained, and
    /// every stage of it resumes from those weights: a generation stage that lagged them (an
    /// asynchronous job's, docs/engine.md) is recorded at the trained policy version.
    fn sidecar(&self, step: u64) -> Sidecar {
        let config = self.config;
        let replicas = &self.rl.replicas;
        let first = |ms: &ModelStage| replicas.get(ms).and_then(|ids| self.set.emu(ids[0]));
        let counters: BTreeMap<String, _> = replicas
            .keys()
            .filter_map(|ms| {
                let mut c = first(ms)?.counters;
                let trained = first(&ModelStage::new(ms.role, Stage::Training));
                if let (Stage::Generation, Some(t)) = (ms.stage, trained) {
                    c.policy_version = t.counters.policy_version;
                }
                Some((ms.to_string(), c))
            })
            .collect();
        let data_position =
            counters.values().next().map_or(step * u64::from(config.rl.prompts_per_step), |c| c.data_position);
        Sidecar {
            format: checkpoint::FORMAT,
            job: config.job.name.clone(),
            algorithm: config.rl.algorithm,
            seed: config.job.seed,
            step,
            prompts_per_step: config.rl.prompts_per_step,
            data_position,
            counters,
            models: BTreeMap::new(),
            rng: "counter-based: draws are functions of (seed, sequence id, position)".into(),
            // The sequence is the writer's to give (rank 0, when it writes).
            lineage: Lineage { sequence: 0, resumed_from: self.resumed_from.clone() },
            plan: Some(self.plan.clone()),
            // Rank 0's, the writer's.
            controller: self.controller.as_ref().map(|c| c.state().clone()),
            sha256: String::new(),
        }
    }
}

/// Bytes of every file under `dir` (what a checkpoint wrote; 0 for what cannot be read).
fn bytes_under(dir: &std::path::Path) -> u64 {
    let Ok(entries) = std::fs::read_dir(dir) else { return 0 };
    let size = |e: std::fs::DirEntry| match e.file_type() {
        Ok(t) if t.is_dir() => bytes_under(&e.path()),
        _ => e.metadata().map_or(0, |m| m.len()),
    };
    entries.flatten().map(size).sum()
}
