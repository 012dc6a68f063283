//! Opening a checkpoint to resume from: everything that could make a resumed run silently
//! wrong is checked before any state is created — the job, algorithm, seed and batch geometry
//! against the config, the step against the counters, every model's architecture, every
//! file's size, SHA-256, tensor set, shapes and finiteness.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use super::error::CheckpointError;
use super::sidecar::{sha256_hex, FileDigest, Sidecar};
use super::tensors::{TensorFile, MOMENT_PREFIXES};
use crate::config::{JobConfig, ModelSpec};
use crate::model::Catalogue;
use crate::plan::{model_stages, Role};

/// Changes a resume may make on purpose, each logged loudly.
#[derive(Debug, Clone, Copy, Default)]
pub struct ResumeOptions {
    /// Start the optimizers afresh (zero moments, update count 0): allowed without an
    /// optimizer file.
    pub reset_optimizer: bool,
}

/// A model's files, opened.
pub struct ModelFiles {
    /// Parameters.
    pub params: TensorFile,
    /// AdamW moments (`None` for models that do not train, or after `reset_optimizer`).
    pub optimizer: Option<TensorFile>,
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
        let params = open_file(dir, &saved.params, &sidecar, name, catalogue, &[""], hash_files)?;
        let trains = model_stages(config.rl.algorithm).iter().any(|ms| ms.role == role && ms.trains());
        let optimizer = match (&saved.optimizer, trains, options.reset_optimizer) {
            (_, false, _) | (_, true, true) => None,
            (Some(digest), true, false) => {
                Some(open_file(dir, digest, &sidecar, name, catalogue, &MOMENT_PREFIXES, hash_files)?)
            }
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
    if s.algorithm != config.rl.algorithm.name() {
        return Err(mismatch(dir, "rl.algorithm", quoted(&s.algorithm), quoted(config.rl.algorithm.name()), ""));
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
    if s.data_position != s.step * u64::from(s.prompts_per_step) {
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

/// The first architecture key that differs, as `(models.<role>.<key>, checkpoint, config)`.
fn first_difference(role: &str, saved: &ModelSpec, now: &ModelSpec) -> Option<(String, String, String)> {
    let (a, b) = (serde_json::to_value(saved).ok()?, serde_json::to_value(now).ok()?);
    let (a, b) = (a.as_object()?, b.as_object()?);
    let mut keys: Vec<&String> = a.keys().chain(b.keys()).collect();
    keys.sort();
    keys.dedup();
    let show = |v: Option<&serde_json::Value>| v.map_or("unset".to_string(), ToString::to_string);
    keys.into_iter()
        .find(|k| a.get(*k) != b.get(*k))
        .map(|k| (format!("models.{role}.{k}"), show(a.get(k)), show(b.get(k))))
}

/// Opens one file and checks it: size, tensor set and shapes, the header's model and step,
/// and with `hash` its SHA-256 and that every value is finite.
fn open_file(
    dir: &Path,
    digest: &FileDigest,
    sidecar: &Sidecar,
    model: &str,
    catalogue: &Catalogue,
    prefixes: &[&str],
    hash: bool,
) -> Result<TensorFile, CheckpointError> {
    let path = dir.join(&digest.file);
    let damaged = |reason: String| CheckpointError::Damaged { path: path.clone(), reason };
    let file = TensorFile::open(&path)?;
    if file.bytes().len() as u64 != digest.bytes {
        return Err(damaged(format!("{} bytes; the sidecar says {}", file.bytes().len(), digest.bytes)));
    }
    file.check_structure(catalogue, prefixes)?;
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
        let sha = sha256_hex(file.bytes());
        if sha != digest.sha256 {
            return Err(damaged(format!("SHA-256 {sha}, the sidecar recorded {}", digest.sha256)));
        }
        if let Some((tensor, count)) = file.first_non_finite()? {
            return Err(damaged(format!("{count} values of `{tensor}` are NaN or infinite")));
        }
    }
    Ok(file)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Dtype;

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
        };
        let b = ModelSpec { heads: 8, kv_heads: 4, ..a.clone() };
        assert_eq!(first_difference("actor", &a, &b), Some(("models.actor.heads".into(), "4".into(), "8".into())));
        assert_eq!(first_difference("actor", &a, &a), None);
        let c = ModelSpec { head_dim: Some(16), ..a.clone() };
        assert_eq!(
            first_difference("critic", &a, &c),
            Some(("models.critic.head_dim".into(), "unset".into(), "16".into()))
        );
    }
}
