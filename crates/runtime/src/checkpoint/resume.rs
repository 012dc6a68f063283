//! Opening a checkpoint to resume from: everything that could make a resumed run silently
//! wrong is checked before any state is created — the job, algorithm, seed and batch geometry
//! against the config, the step against the counters, every model's architecture (in the
//! sidecar and in its `config.json`), every file's size, SHA-256, tensor set, shapes and
//! finiteness.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use super::error::CheckpointError;
use super::sidecar::{SavedModel, Sidecar};
use super::tensors::optimizer_prefixes;
use nereus_core::config::hf::{self, CONFIG_JSON};
use nereus_core::config::models::spec_map;
use nereus_core::config::{Dtype, JobConfig, ModelSpec};
use nereus_core::model::Catalogue;
use nereus_core::plan::{model_stages, Role};
use nereus_data::model_files::{digest_file, open_weights, FileDigest};
use nereus_data::model_files::{Expect, ModelWeights, TensorFile};

/// Changes a resume may make on purpose, each logged loudly.
#[derive(Debug, Clone, Copy, Default)]
pub struct ResumeOptions {
    /// Start the optimizers afresh (zero moments, update count 0): allowed without an
    /// optimizer file.
    pub reset_optimizer: bool,
}

/// A model's files, opened.
pub struct ModelFiles {
    /// Parameters (the model directory's weights).
    pub params: ModelWeights,
    /// AdamW moments (`None` for models that do not train, or after `reset_optimizer`).
    pub optimizer: Option<ModelWeights>,
}

/// A checkpoint checked against the job.
pub struct Resumed {
    /// Its directory.
    pub dir: PathBuf,
    /// Its sidecar.
    pub sidecar: Sidecar,
    /// Each model of the job, opened.
    pub models: BTreeMap<Role, ModelFiles>,
}

/// Opens checkpoint `dir` for `config`'s job. Every rank checks the sidecar and the files'
/// structure; with `hash_files` (one rank), every byte is also read for the SHA-256 digests and
/// the finiteness scan.
pub fn open(
    dir: &Path,
    config: &JobConfig,
    catalogues: &BTreeMap<Role, Catalogue>,
    options: ResumeOptions,
    hash_files: bool,
) -> Result<Resumed, CheckpointError> {
    let sidecar = Sidecar::read(dir)?;
    check_job(dir, &sidecar, config)?;
    check_counters(dir, &sidecar, config)?;
    let mut models = BTreeMap::new();
    for (name, spec) in config.models.roles() {
        let role = role_named(name);
        if !model_stages(config.rl.algorithm).iter().any(|ms| ms.role == role) {
            continue;
        }
        let saved = sidecar.models.get(name).ok_or_else(|| CheckpointError::Inconsistent {
            dir: dir.into(),
            reason: format!("the sidecar lists no {name} model, which this job needs"),
        })?;
        if let Some((key, was, now)) = first_difference(name, &saved.architecture, spec) {
            return Err(mismatch(dir, &key, was, now, ""));
        }
        let catalogue = &catalogues[&role];
        let params = open_model_dir(dir, saved, &sidecar, name, catalogue, hash_files)?;
        let trains = model_stages(config.rl.algorithm).iter().any(|ms| ms.role == role && ms.trains());
        let optimizer = match (&saved.optimizer, trains, options.reset_optimizer) {
            (_, false, _) | (_, true, true) => None,
            (Some(digest), true, false) => Some(open_optimizer(dir, digest, &sidecar, name, catalogue, hash_files)?),
            (None, true, false) => {
                return Err(CheckpointError::Inconsistent {
                    dir: dir.into(),
                    reason: format!(
                        "{name} trains but the checkpoint keeps no optimizer state for it; pass --resume-reset-optimizer to restart its optimizer from zero moments"
                    ),
                })
            }
        };
        models.insert(role, ModelFiles { params, optimizer });
    }
    Ok(Resumed { dir: dir.into(), sidecar, models })
}

fn role_named(name: &str) -> Role {
    match name {
        "actor" => Role::Actor,
        "critic" => Role::Critic,
        "reference" => Role::Reference,
        _ => Role::Reward,
    }
}

fn mismatch(dir: &Path, key: &str, was: String, now: String, hint: &str) -> CheckpointError {
    CheckpointError::Mismatch { dir: dir.into(), key: key.into(), checkpoint: was, config: now, hint: hint.into() }
}

/// Job, algorithm, seed, prompts per step and the remaining steps.
fn check_job(dir: &Path, s: &Sidecar, config: &JobConfig) -> Result<(), CheckpointError> {
    let quoted = |x: &str| format!("\"{x}\"");
    if s.job != config.job.name {
        return Err(mismatch(dir, "job.name", quoted(&s.job), quoted(&config.job.name), ""));
    }
    if s.algorithm != config.rl.algorithm {
        let (saved, asked) = (quoted(s.algorithm.name()), quoted(config.rl.algorithm.name()));
        return Err(mismatch(dir, "rl.algorithm", saved, asked, ""));
    }
    if s.seed != config.job.seed {
        let hint = "; the seed fixes the prompts and every sampling draw, so another seed is another run";
        return Err(mismatch(dir, "job.seed", s.seed.to_string(), config.job.seed.to_string(), hint));
    }
    if s.prompts_per_step != config.rl.prompts_per_step {
        let hint = "; the data position advances by it, so changing it would skip or repeat prompts";
        let (was, now) = (s.prompts_per_step.to_string(), config.rl.prompts_per_step.to_string());
        return Err(mismatch(dir, "rl.prompts_per_step", was, now, hint));
    }
    if s.step >= u64::from(config.job.steps) {
        return Err(CheckpointError::NothingToRun { dir: dir.into(), step: s.step, steps: config.job.steps });
    }
    Ok(())
}

/// The step, the data position and every model-stage's counters must tell one story.
fn check_counters(dir: &Path, s: &Sidecar, config: &JobConfig) -> Result<(), CheckpointError> {
    let bad = |reason: String| CheckpointError::Inconsistent { dir: dir.into(), reason };
    // Dynamic sampling takes whole rounds of prompts_per_step prompts, at least one a step.
    let least = s.step * u64::from(s.prompts_per_step);
    let whole_rounds = s.data_position >= least && s.data_position.is_multiple_of(u64::from(s.prompts_per_step).max(1));
    if s.data_position != least && !(config.rl.dynamic_sampling() && whole_rounds) {
        return Err(bad(format!(
            "data position {} is not step {} × {} prompts per step",
            s.data_position, s.step, s.prompts_per_step
        )));
    }
    for ms in model_stages(config.rl.algorithm) {
        let name = ms.to_string();
        let c = s.counters.get(&name).ok_or_else(|| bad(format!("no counters for {name}")))?;
        if c.policy_version != s.step || c.data_position != s.data_position || c.seed != s.seed {
            return Err(bad(format!(
                "{name} is at policy version {}, data position {} with seed {}, but the checkpoint is step {} at data position {} with seed {}",
                c.policy_version, c.data_position, c.seed, s.step, s.data_position, s.seed
            )));
        }
    }
    Ok(())
}

/// The first architecture key that differs, as `(models.<role>.<key>, checkpoint, config)`
/// (`path` is where the model first came from, not what it is).
fn first_difference(role: &str, saved: &ModelSpec, now: &ModelSpec) -> Option<(String, String, String)> {
    let (a, b) = (saved.architecture_map(), now.architecture_map());
    let mut keys: Vec<&String> = a.keys().chain(b.keys()).collect();
    keys.sort();
    keys.dedup();
    let show = |v: Option<&serde_json::Value>| v.map_or("unset".to_string(), ToString::to_string);
    keys.into_iter()
        .find(|k| a.get(*k) != b.get(*k))
        .map(|k| (format!("models.{role}.{k}"), show(a.get(k)), show(b.get(k))))
}

/// Checks one listed file: present, of the recorded size, and with `hash` of the recorded
/// SHA-256.
fn check_file(dir: &Path, digest: &FileDigest, hash: bool) -> Result<(), CheckpointError> {
    let path = dir.join(&digest.file);
    let damaged = |reason: String| CheckpointError::Damaged { path: path.clone(), reason };
    let size = std::fs::metadata(&path).map_err(|_| damaged("the file is missing".into()))?.len();
    if size != digest.bytes {
        return Err(damaged(format!("{size} bytes; the sidecar says {}", digest.bytes)));
    }
    if hash {
        let found = digest_file(&path, &digest.file)?;
        if found.sha256 != digest.sha256 {
            return Err(damaged(format!("SHA-256 {}, the sidecar recorded {}", found.sha256, digest.sha256)));
        }
    }
    Ok(())
}

/// Checks the header of a tensor file (the model and step it was written for) and, with
/// `hash`, that every value is finite.
fn check_tensor_file(file: &TensorFile, sidecar: &Sidecar, model: &str, hash: bool) -> Result<(), CheckpointError> {
    let damaged = |reason: String| CheckpointError::Damaged { path: file.path().into(), reason };
    let meta = file.metadata();
    let claim = |key: &str| meta.get(key).map_or("none", String::as_str).to_string();
    if claim("nereus.model") != model || claim("nereus.step") != sidecar.step.to_string() {
        return Err(damaged(format!(
            "it was written for model {} at step {}, and is listed for {model} at step {}",
            claim("nereus.model"),
            claim("nereus.step"),
            sidecar.step
        )));
    }
    if hash {
        if let Some((tensor, count)) = file.first_non_finite()? {
            return Err(damaged(format!("{count} values of `{tensor}` are NaN or infinite")));
        }
    }
    Ok(())
}

/// Opens a model directory of the checkpoint and checks it: every listed file (size, and with
/// `hash` its SHA-256), weights only from listed files, the tensor set, shapes and dtype, each
/// weight file's header, finiteness (with `hash`), and that `config.json` describes the
/// sidecar's architecture.
fn open_model_dir(
    dir: &Path,
    saved: &SavedModel,
    sidecar: &Sidecar,
    model: &str,
    catalogue: &Catalogue,
    hash: bool,
) -> Result<ModelWeights, CheckpointError> {
    for digest in &saved.files {
        check_file(dir, digest, hash)?;
    }
    let model_dir = dir.join(&saved.dir);
    let weights = open_weights(&model_dir)?;
    for file in weights.files() {
        if !saved.files.iter().any(|d| dir.join(&d.file) == file.path()) {
            return Err(CheckpointError::Damaged {
                path: file.path().into(),
                reason: "the weights name it, and the sidecar does not list it".into(),
            });
        }
    }
    weights.check(catalogue, &[""], Expect::Exactly(saved.architecture.dtype))?;
    for file in weights.files() {
        check_tensor_file(file, sidecar, model, hash)?;
    }
    let config = model_dir.join(CONFIG_JSON);
    let damaged = |reason: String| CheckpointError::Damaged { path: config.clone(), reason };
    let found = hf::read_model_config(&model_dir).map_err(damaged)?;
    if let Some(d) = hf::disagreement(&spec_map(&saved.architecture), &found.spec) {
        return Err(damaged(format!(
            "it has {} = {}, the sidecar's {model} has {} = {}",
            d.hf_key, d.theirs, d.key, d.ours
        )));
    }
    if found.head != catalogue.arch.head {
        return Err(damaged(format!("it describes {}, which is not the {model} model", found.json["architectures"])));
    }
    Ok(weights)
}

/// Opens an optimizer file and checks it like the weights: size, digest, exactly the moments
/// of every tensor in f32, header, finiteness.
fn open_optimizer(
    dir: &Path,
    digest: &FileDigest,
    sidecar: &Sidecar,
    model: &str,
    catalogue: &Catalogue,
    hash: bool,
) -> Result<ModelWeights, CheckpointError> {
    let path = dir.join(&digest.file);
    if !path.exists() {
        return Err(CheckpointError::Damaged {
            path,
            reason: format!(
                "the optimizer file of {model} is missing; pass --resume-reset-optimizer to resume with AdamW restarted from zero moments"
            ),
        });
    }
    check_file(dir, digest, hash)?;
    let file = TensorFile::open(&path)?;
    check_tensor_file(&file, sidecar, model, hash)?;
    let moments = ModelWeights::single(file)?;
    moments.check(catalogue, optimizer_prefixes(catalogue.arch.dtype), Expect::Exactly(Dtype::F32))?;
    Ok(moments)
}

#[cfg(test)]
mod tests {
    use super::*;
    use nereus_core::config::Dtype;

    #[test]
    fn the_first_architecture_difference_is_named_with_both_values() {
        let a = ModelSpec {
            layers: 2,
            hidden: 64,
            heads: 4,
            kv_heads: 2,
            ffn: 176,
            vocab: 32,
            dtype: Dtype::F32,
            tie_embeddings: false,
            head_dim: None,
            qk_norm: false,
            path: Some("somewhere".into()),
            rope_theta: 10_000.0,
            rms_norm_eps: 1e-5,
            rope_scaling: None,
        };
        let b = ModelSpec { heads: 8, kv_heads: 4, ..a.clone() };
        assert_eq!(first_difference("actor", &a, &b), Some(("models.actor.heads".into(), "4".into(), "8".into())));
        assert_eq!(first_difference("actor", &a, &a), None);
        let moved = ModelSpec { path: Some("elsewhere".into()), ..a.clone() };
        assert_eq!(first_difference("actor", &a, &moved), None, "where the model came from is not its architecture");
        let eps = ModelSpec { rms_norm_eps: 1e-6, ..a.clone() };
        assert_eq!(
            first_difference("actor", &a, &eps),
            Some(("models.actor.rms_norm_eps".into(), "0.00001".into(), "1e-6".into()))
        );
        let c = ModelSpec { head_dim: Some(16), ..a.clone() };
        assert_eq!(
            first_difference("critic", &a, &c),
            Some(("models.critic.head_dim".into(), "unset".into(), "16".into()))
        );
    }
}
