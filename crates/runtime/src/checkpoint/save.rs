//! Writing a checkpoint so that it cannot be half-written: every file goes into
//! `step-N.partial/` and is fsynced with its directory, the directory is renamed to `step-N/`,
//! and only then does `latest` point at it. Each model becomes a Hugging Face model directory
//! (`step-N/<model>/`) with its optimizer file beside it (`step-N/<model>.optim.safetensors`).

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use super::error::{io, CheckpointError};
use super::sidecar::{SavedModel, Sidecar};
use super::tensors::model_tensors;
use super::Checkpoints;
use nereus_core::config::hf::{self, ConfigJsonOptions};
use nereus_core::config::{Dtype, ModelSpec, OutputHead};
use nereus_core::plan::Role;
use nereus_data::model_files::{
    first_non_finite, pause_before_each_file_for_tests, replace_durably, serialize, sync_dir, write_durably,
    write_model_dir, FileDigest, NamedTensor, WriteOptions,
};
use nereus_exec::comm::DataPlane;
use nereus_exec::emu::{EmuId, EmuSet, Exchange, ShardMemory};

/// One model to save: its role, the replica to save it from, its architecture.
pub struct ModelToSave<'a> {
    /// The model.
    pub role: Role,
    /// The replica gathered (a training replica carries the moments).
    pub emu: EmuId,
    /// `[models.<role>]`.
    pub architecture: &'a ModelSpec,
    /// Its head: a value model's (critic, reward) makes it a sequence classifier with
    /// `score.weight`.
    pub head: OutputHead,
    /// The model directory it started from: the keys of its `config.json` the job does not
    /// own, its generation config and its tokenizer files are carried into the checkpoint.
    pub source: Option<&'a Path>,
    /// Where its tokenizer files come from instead of `source` (a text job's tokenizer).
    pub tokenizer: Option<&'a Path>,
}

/// What every model directory of a checkpoint takes from the job.
#[derive(Debug, Clone)]
pub struct SaveOptions {
    /// Largest weight shard in bytes.
    pub max_shard_bytes: u64,
    /// `max_position_embeddings` of a model that did not come with one.
    pub max_position_embeddings: u64,
    /// `eos_token_id` of a model that did not come with one.
    pub eos_token_id: Option<u32>,
    /// Sampling temperature (`generation_config.json`).
    pub temperature: f64,
    /// Nucleus mass (`generation_config.json`).
    pub top_p: f64,
}

/// What every file of a checkpoint records about the run: job, model, step.
fn file_metadata(sidecar: &Sidecar, model: &str) -> HashMap<String, String> {
    HashMap::from([
        ("format".into(), "pt".into()),
        ("nereus.job".into(), sidecar.job.clone()),
        ("nereus.model".into(), model.into()),
        ("nereus.step".into(), sidecar.step.to_string()),
    ])
}

/// A checkpoint whose files rank 0's writer thread is still writing (every rank knows its step).
/// Dropped without [`PendingCheckpoint::wait`] (a job that stops on an error), it still waits
/// for the writer, so a checkpoint begun before the failure is sealed, not cut off by the exit.
pub struct PendingCheckpoint {
    /// The checkpoint's step.
    pub step: u64,
    /// Its directory once sealed.
    dir: PathBuf,
    /// Rank 0's writer (`None` on the other ranks).
    writer: Option<Writer>,
}

/// A checkpoint writer thread: the directory it sealed and how long writing took.
pub type Writer = std::thread::JoinHandle<Result<(PathBuf, std::time::Duration), CheckpointError>>;

impl PendingCheckpoint {
    /// Checkpoint `step` of `checkpoints`, written by `writer` on rank 0.
    pub fn new(step: u64, checkpoints: &Checkpoints, writer: Option<Writer>) -> PendingCheckpoint {
        PendingCheckpoint { step, dir: checkpoints.step_dir(step), writer }
    }

    /// Waits for the writer: rank 0's outcome (the directory and how long writing took; a
    /// panicked writer is a damaged checkpoint); the directory at once on the other ranks.
    pub fn wait(mut self) -> Result<(PathBuf, std::time::Duration), CheckpointError> {
        match self.writer.take() {
            Some(writer) => joined(writer, self.dir.clone()),
            None => Ok((self.dir.clone(), std::time::Duration::ZERO)),
        }
    }
}

impl Drop for PendingCheckpoint {
    fn drop(&mut self) {
        let Some(writer) = self.writer.take() else { return };
        match joined(writer, self.dir.clone()) {
            Ok((dir, _)) => log::info!("checkpoint of step {} written to {}", self.step, dir.display()),
            Err(e) => log::error!("checkpoint of step {} was not written: {e}", self.step),
        }
    }
}

/// `writer`'s outcome once it has finished; a panicked writer left `dir` damaged.
fn joined(writer: Writer, dir: PathBuf) -> Result<(PathBuf, std::time::Duration), CheckpointError> {
    writer
        .join()
        .unwrap_or_else(|_| Err(CheckpointError::Damaged { path: dir, reason: "its writer thread panicked".into() }))
}

/// Every model of a checkpoint gathered onto rank 0's host memory, owned: what a writer thread
/// turns into files while the job trains on.
pub struct Snapshot {
    models: Vec<GatheredModel>,
}

/// One model gathered onto rank 0: what [`ModelToSave`] says of it, and its tensors.
struct GatheredModel {
    role: Role,
    architecture: ModelSpec,
    head: OutputHead,
    source: Option<PathBuf>,
    tokenizer: Option<PathBuf>,
    params: Vec<NamedTensor>,
    moments: Option<Vec<NamedTensor>>,
}

/// Saves `models` as checkpoint `sidecar.step` under `checkpoints` (every rank calls it): each
/// model is gathered onto rank 0, which writes it before the next is gathered (rank 0 holds one
/// model at a time) and keeps taking part in every gather after a local failure, so the caller
/// can end the phase with an agreement. Returns rank 0's first failure, or the directory.
pub fn save<M: ShardMemory, P: Exchange<M>>(
    plane: &mut P,
    set: &EmuSet<M>,
    models: &[ModelToSave],
    sidecar: Sidecar,
    checkpoints: &Checkpoints,
    options: &SaveOptions,
) -> Result<PathBuf, CheckpointError> {
    let step = sidecar.step;
    let mut files = (plane.rank() == 0).then(|| Files::start(checkpoints, sidecar, options));
    for m in models {
        let gathered = gather(plane, set, m, checkpoints, step)?;
        if let (Some(files), Some(gathered)) = (files.as_mut(), gathered) {
            files.add(&gathered);
        }
    }
    match files {
        Some(files) => files.seal(checkpoints),
        None => Ok(checkpoints.step_dir(step)),
    }
}

/// Gathers `models` onto rank 0 for checkpoint `step` (every rank calls it): rank 0 gets the
/// snapshot, the other ranks `None`. Rank 0 holds every model at once (its parameters, and its
/// moments when it trains), in host memory, until the snapshot is written.
pub fn snapshot<M: ShardMemory, P: Exchange<M>>(
    plane: &mut P,
    set: &EmuSet<M>,
    models: &[ModelToSave],
    checkpoints: &Checkpoints,
    step: u64,
) -> Result<Option<Snapshot>, CheckpointError> {
    let mut gathered = Vec::with_capacity(models.len());
    for m in models {
        gathered.extend(gather(plane, set, m, checkpoints, step)?);
    }
    Ok((plane.rank() == 0).then_some(Snapshot { models: gathered }))
}

/// Writes `snapshot` as checkpoint `sidecar.step` under `checkpoints` (rank 0, on any thread),
/// as [`save`] writes.
pub fn write(
    snapshot: Snapshot,
    sidecar: Sidecar,
    checkpoints: &Checkpoints,
    options: &SaveOptions,
) -> Result<PathBuf, CheckpointError> {
    let mut files = Files::start(checkpoints, sidecar, options);
    for m in &snapshot.models {
        files.add(m);
    }
    files.seal(checkpoints)
}

/// Model `m` gathered onto rank 0 (every rank calls it; `Some` on rank 0).
fn gather<M: ShardMemory, P: Exchange<M>>(
    plane: &mut P,
    set: &EmuSet<M>,
    m: &ModelToSave,
    checkpoints: &Checkpoints,
    step: u64,
) -> Result<Option<GatheredModel>, CheckpointError> {
    let whole = set.gather(plane, m.emu, 0).map_err(|e| CheckpointError::Damaged {
        path: checkpoints.partial_dir(step),
        reason: format!("gathering {} failed: {e}", m.role.name()),
    })?;
    Ok(whole.map(|whole| {
        let (params, moments) = model_tensors(&whole, set.catalogue(m.role));
        GatheredModel {
            role: m.role,
            architecture: m.architecture.clone(),
            head: m.head,
            source: m.source.map(Path::to_path_buf),
            tokenizer: m.tokenizer.map(Path::to_path_buf),
            params,
            moments,
        }
    }))
}

/// A checkpoint being written by rank 0: every file into `step-N.partial/`, then sealed — the
/// sidecar written, the directory renamed to `step-N/`, then `latest`. After the first failure
/// it writes nothing more and the seal returns that failure.
struct Files<'o> {
    partial: PathBuf,
    sidecar: Sidecar,
    options: &'o SaveOptions,
    outcome: Result<(), CheckpointError>,
}

impl<'o> Files<'o> {
    fn start(checkpoints: &Checkpoints, sidecar: Sidecar, options: &'o SaveOptions) -> Files<'o> {
        let partial = checkpoints.partial_dir(sidecar.step);
        let outcome = start_partial(&partial);
        Files { partial, sidecar, options, outcome }
    }

    /// Writes model `m`'s directory (and optimizer file), unless an earlier write failed.
    fn add(&mut self, m: &GatheredModel) {
        if self.outcome.is_ok() {
            self.outcome = write_model(&self.partial, m, &self.sidecar, self.options)
                .map(|saved| drop(self.sidecar.models.insert(m.role.name().into(), saved)));
        }
    }

    /// The sidecar sealed, the directory renamed into place, then `latest`; `sidecar.models`
    /// was filled by [`Files::add`].
    fn seal(mut self, checkpoints: &Checkpoints) -> Result<PathBuf, CheckpointError> {
        self.outcome?;
        let (step, dir) = (self.sidecar.step, checkpoints.step_dir(self.sidecar.step));
        self.sidecar.lineage.sequence = checkpoints.next_sequence();
        self.sidecar.write_sealed(&self.partial)?;
        sync_dir(&self.partial)?;
        commit(&self.partial, &dir, checkpoints.root())?;
        replace_durably(&checkpoints.latest_pointer(), format!("step-{step}\n").as_bytes())?;
        Ok(dir)
    }
}

fn start_partial(partial: &Path) -> Result<(), CheckpointError> {
    if partial.exists() {
        std::fs::remove_dir_all(partial).map_err(io("remove", partial))?;
    }
    std::fs::create_dir_all(partial).map_err(io("create directory", partial))
}

/// Writes one model's directory (and optimizer file), refusing non-finite state.
fn write_model(
    dir: &Path,
    m: &GatheredModel,
    sidecar: &Sidecar,
    options: &SaveOptions,
) -> Result<SavedModel, CheckpointError> {
    let (name, params, moments) = (m.role.name(), &m.params, m.moments.as_deref());
    let all = params.iter().chain(moments.into_iter().flatten());
    if let Some((tensor, count)) = first_non_finite(all.map(|(n, _, d)| (n.as_str(), d.as_slice()))) {
        return Err(CheckpointError::NonFinite { model: name.into(), tensor, count });
    }
    // The source's config.json was read when the job started; a source that vanished since
    // only loses its extra keys, never the architecture.
    let base = m.source.as_deref().and_then(|s| hf::read_model_config(s).ok()).map(|found| found.json);
    let config = hf::config_json(
        &m.architecture,
        m.head,
        &ConfigJsonOptions {
            base: base.as_ref(),
            max_position_embeddings: options.max_position_embeddings,
            eos_token_id: options.eos_token_id,
        },
    );
    let generation = hf::generation_config_json(&config, options.temperature, options.top_p);
    let write = WriteOptions {
        dtype: m.architecture.dtype,
        max_shard_bytes: options.max_shard_bytes,
        metadata: file_metadata(sidecar, name),
        config: &config,
        generation_config: &generation,
        source: m.source.as_deref(),
        tokenizer: m.tokenizer.as_deref(),
    };
    let files = write_model_dir(&dir.join(name), params, &write)?
        .into_iter()
        .map(|d| FileDigest { file: format!("{name}/{}", d.file), ..d })
        .collect();
    let optimizer = moments
        .map(|t| -> Result<FileDigest, CheckpointError> {
            pause_before_each_file_for_tests();
            let file = super::optimizer_file(name);
            let path = dir.join(&file);
            let bytes = serialize(t, Dtype::F32, file_metadata(sidecar, name), &path)?;
            write_durably(&path, &bytes)?;
            Ok(FileDigest::of(&file, &bytes))
        })
        .transpose()?;
    Ok(SavedModel { architecture: m.architecture.clone(), dir: name.into(), files, optimizer })
}

/// Renames the finished `partial` to `dir`. A checkpoint already at `dir` (from a run resumed
/// at an earlier step) is renamed aside first and removed after: at every moment either the
/// old or the new `dir` is complete, or only the aside copy is (which the next start removes).
fn commit(partial: &Path, dir: &Path, root: &Path) -> Result<(), CheckpointError> {
    let aside = dir.with_extension("replaced");
    let replacing = dir.exists();
    if replacing {
        if aside.exists() {
            std::fs::remove_dir_all(&aside).map_err(io("remove", &aside))?;
        }
        std::fs::rename(dir, &aside).map_err(io("rename", dir))?;
    }
    std::fs::rename(partial, dir).map_err(io("rename", partial))?;
    sync_dir(root)?;
    if replacing {
        std::fs::remove_dir_all(&aside).map_err(io("remove", &aside))?;
    }
    Ok(())
}

/// Saves one replica as a lone parameter file at `path` (the supervised warm-ups' output; every
/// rank calls it, rank 0 writes it atomically). Rank 0 returns the first failure after taking
/// part in the gather.
pub fn save_params_file<P: DataPlane>(
    plane: &mut P,
    set: &EmuSet,
    role: Role,
    emu: EmuId,
    path: &Path,
) -> Result<(), CheckpointError> {
    let Some(whole) = set.gather(plane, emu, 0).map_err(|e| CheckpointError::Damaged {
        path: path.into(),
        reason: format!("gathering {} failed: {e}", role.name()),
    })?
    else {
        return Ok(());
    };
    let (params, _) = model_tensors(&whole, set.catalogue(role));
    if let Some((tensor, count)) = first_non_finite(params.iter().map(|(n, _, d)| (n.as_str(), d.as_slice()))) {
        return Err(CheckpointError::NonFinite { model: role.name().into(), tensor, count });
    }
    if let Some(parent) = path.parent() {
        std::fs::create_dir_all(parent).map_err(io("create directory", parent))?;
    }
    let meta = HashMap::from([("format".to_string(), "pt".to_string()), ("nereus.model".into(), role.name().into())]);
    Ok(replace_durably(path, &serialize(&params, Dtype::F32, meta, path)?)?)
}
