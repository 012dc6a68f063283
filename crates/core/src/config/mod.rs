//! Job configuration: TOML files mapped one-to-one onto typed sections.
//!
//! A job file has the sections `[job]`, `[cluster]`, `[models.<role>]`, `[rl]`, `[policy]`, `[train]`, `[plan]`,
//! and for a text job `[data]` and `[reward]`
//! (see `configs/tiny-ppo.toml`). Loading is two steps so that every rank of an SPMD job can do
//! it the same way:
//!
//! 1. [`RawJobConfig::parse`] turns TOML text into typed sections (unknown keys, wrong types and
//!    syntax errors are reported with file, line, column and key);
//! 2. [`RawJobConfig::resolve`] applies the precedence *CLI flag > TOML > included cluster file >
//!    detected value > default* (and completes `[models.<role>]` tables from the model
//!    directories they name), then validates every section, so that the resulting
//!    [`JobConfig`] is complete and consistent.
//!
//! [`JobConfig::hash`] is what ranks compare to prove they run the same job.

pub mod algorithm;
pub mod check;
pub mod cluster;
pub mod data;
mod error;
pub mod faults;
pub mod hf;
pub mod job;
pub mod launch;
pub mod models;
pub mod plan;
pub mod policy;
pub mod pool;
pub mod provenance;
pub mod raw_models;
pub mod rl;
pub mod sets;
pub mod stepped_csv;
pub mod train;

pub use cluster::{ClusterSection, ClusterSpec, DataPlane};
pub use data::{DataSection, OnScorerError, RewardKind, RewardSection, RewardTerm, TooLong};
pub use error::ConfigError;
pub use faults::FaultsSection;
pub use job::JobSection;
pub use launch::{DeviceChoice, ResumeFrom};
pub use models::{Dtype, ModelSpec, ModelsSection, OutputHead, RopeScaling};
pub use plan::PlanEntry;
pub use policy::{PolicyMode, PolicySection, PLAN_ERROR};
pub use pool::PoolSection;
pub use raw_models::{RawModelSpec, RawModelsSection};
pub use rl::{Algorithm, KlEstimator, KlIn, LossAgg, Recipe, RlMode, RlSection};
pub use train::{OnNonFinite, RewardSource, TrainSection};

use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// The embedded default job (`configs/tiny-ppo.toml`), used when no config file is given.
pub const EMBEDDED_DEFAULT: &str = include_str!("../../../../configs/tiny-ppo.toml");

/// Name under which the embedded default appears in messages.
pub const EMBEDDED_DEFAULT_NAME: &str = "<embedded default: configs/tiny-ppo.toml>";

/// A job file as written: typed sections, `[cluster]` still partial, nothing cross-checked yet.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawJobConfig {
    /// `[job]`.
    pub job: JobSection,
    /// `[cluster]`, possibly partial (includes and detection complete it).
    #[serde(default)]
    pub cluster: ClusterSection,
    /// `[models.<role>]`, possibly naming model directories that complete them.
    pub models: RawModelsSection,
    /// `[rl]`.
    pub rl: RlSection,
    /// `[policy]` (optional; defaults apply).
    #[serde(default)]
    pub policy: PolicySection,
    /// `[train]` (optional; defaults apply).
    #[serde(default)]
    pub train: TrainSection,
    /// `[pool]` (optional: the whole world).
    #[serde(default)]
    pub pool: PoolSection,
    /// `[faults]` (optional: none).
    #[serde(default)]
    pub faults: FaultsSection,
    /// `[plan."<model-stage>"]` (optional: the planner chooses when absent).
    #[serde(default)]
    pub plan: BTreeMap<String, PlanEntry>,
    /// `[data]` (optional: without it, the built-in arithmetic task over token ids).
    #[serde(default)]
    pub data: Option<DataSection>,
    /// `[reward]` (optional; a text job's rule by default: `math`).
    #[serde(default)]
    pub reward: RewardSection,
}

/// A complete, validated job configuration: what every rank must agree on.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct JobConfig {
    /// `[job]`.
    pub job: JobSection,
    /// `[cluster]`, resolved.
    pub cluster: ClusterSpec,
    /// `[models.<role>]`.
    pub models: ModelsSection,
    /// `[rl]`.
    pub rl: RlSection,
    /// `[policy]`.
    pub policy: PolicySection,
    /// `[train]`.
    pub train: TrainSection,
    /// `[pool]`, its trace path resolved.
    #[serde(default)]
    pub pool: PoolSection,
    /// `[faults]`.
    #[serde(default)]
    pub faults: FaultsSection,
    /// `[plan."<model-stage>"]`, empty when the planner chooses.
    pub plan: BTreeMap<String, PlanEntry>,
    /// `[data]`, its paths resolved; `None` for the arithmetic task.
    #[serde(default)]
    pub data: Option<DataSection>,
    /// `[reward]`.
    #[serde(default)]
    pub reward: RewardSection,
}

/// Values given as CLI flags; each replaces the TOML value of the key named in its doc.
#[derive(Debug, Clone, Default)]
pub struct Overrides {
    /// `job.seed`.
    pub seed: Option<u64>,
    /// `job.steps`.
    pub steps: Option<u32>,
    /// `job.output_dir`.
    pub output_dir: Option<PathBuf>,
    /// `rl.algorithm`.
    pub algorithm: Option<Algorithm>,
    /// `policy.mode`.
    pub policy: Option<PolicyMode>,
    /// A cluster file that replaces the job file's `[cluster]` table (path relative to the
    /// working directory).
    pub cluster_file: Option<PathBuf>,
    /// `cluster.nodes`.
    pub nodes: Option<u32>,
    /// `cluster.device` (`nereus train --device`).
    pub device: Option<DeviceChoice>,
    /// `--set section.key=value`, in order (later ones win), applied to the file before the
    /// flags above.
    pub sets: Vec<sets::KeySet>,
}

/// Where a job file came from; relative includes resolve against `base_dir`.
#[derive(Debug, Clone)]
pub struct ConfigSource {
    /// Name used in messages (the path, or [`EMBEDDED_DEFAULT_NAME`]).
    pub name: PathBuf,
    /// The TOML text.
    pub text: String,
    /// Directory that relative `include` paths are resolved against.
    pub base_dir: PathBuf,
}

impl ConfigSource {
    /// Reads a job file from disk.
    pub fn from_file(path: &Path) -> Result<Self, ConfigError> {
        let text = crate::file_error::read_regular_string(path)
            .map_err(|e| ConfigError::Read { path: path.to_path_buf(), source: e.source })?;
        let base_dir = path.parent().map(Path::to_path_buf).unwrap_or_default();
        Ok(ConfigSource { name: path.to_path_buf(), text, base_dir })
    }

    /// The embedded default job; its includes (none today) resolve against the working directory.
    pub fn embedded_default() -> Self {
        ConfigSource {
            name: PathBuf::from(EMBEDDED_DEFAULT_NAME),
            text: EMBEDDED_DEFAULT.to_string(),
            base_dir: PathBuf::new(),
        }
    }

    /// The given file, or the embedded default when `path` is `None`.
    pub fn file_or_default(path: Option<&Path>) -> Result<Self, ConfigError> {
        path.map_or_else(|| Ok(Self::embedded_default()), Self::from_file)
    }
}

/// Parses TOML text into `T`, reporting the key path, line and column of the first problem.
pub fn parse_toml<T: DeserializeOwned>(text: &str, name: &Path) -> Result<T, ConfigError> {
    let deserializer = toml::Deserializer::new(text);
    serde_path_to_error::deserialize(deserializer).map_err(|err| {
        let key = err.path().to_string();
        let inner = err.into_inner();
        let offset = inner.span().map_or(0, |span| span.start);
        let (line, column) = line_and_column(text, offset);
        ConfigError::Parse {
            path: name.to_path_buf(),
            line,
            column,
            key: (!key.is_empty() && key != ".").then_some(key),
            message: inner.message().trim().replace('\n', " "),
        }
    })
}

/// 1-based (line, column) of a byte offset.
fn line_and_column(text: &str, offset: usize) -> (usize, usize) {
    let before = &text[..offset.min(text.len())];
    let line = before.matches('\n').count() + 1;
    let column = before.rsplit('\n').next().map_or(0, |l| l.chars().count()) + 1;
    (line, column)
}

impl RawJobConfig {
    /// Parses a job file's text.
    pub fn parse(source: &ConfigSource) -> Result<Self, ConfigError> {
        parse_toml(&source.text, &source.name)
    }

    /// Applies overrides and includes, fills detected cluster values where asked, validates.
    ///
    /// `detect` is called only when the merged `[cluster]` says `detect = true`; it returns the
    /// values hwloc and the launcher report, as a cluster layer.
    pub fn resolve(
        self,
        source: &ConfigSource,
        overrides: &Overrides,
        detect: &mut dyn FnMut() -> ClusterSection,
    ) -> Result<JobConfig, ConfigError> {
        let RawJobConfig {
            mut job,
            cluster,
            models,
            mut rl,
            mut policy,
            mut train,
            mut pool,
            faults,
            plan,
            data,
            reward,
        } = self;
        pool.trace = pool.trace.map(|t| source.base_dir.join(t));
        let data = data.map(|d| d.resolved(&source.base_dir));
        policy.mode = overrides.policy.unwrap_or(policy.mode);
        job.seed = overrides.seed.unwrap_or(job.seed);
        job.steps = overrides.steps.unwrap_or(job.steps);
        job.output_dir = overrides.output_dir.clone().unwrap_or(job.output_dir);
        rl.algorithm = overrides.algorithm.unwrap_or(rl.algorithm);
        rl.complete();
        train.complete(rl.algorithm);
        let cluster = resolve_cluster(cluster, source, overrides, detect)?;
        let models = models.resolve(&source.base_dir)?;
        let config = JobConfig { job, cluster, models, rl, policy, train, pool, faults, plan, data, reward };
        config.validate()?;
        Ok(config)
    }
}

/// Merges the cluster layers in precedence order and completes them.
fn resolve_cluster(
    written: ClusterSection,
    source: &ConfigSource,
    overrides: &Overrides,
    detect: &mut dyn FnMut() -> ClusterSection,
) -> Result<ClusterSpec, ConfigError> {
    // `--cluster FILE` replaces the job file's whole [cluster] table (CLI > TOML).
    let (include, written) = match &overrides.cluster_file {
        Some(path) => (Some(path.clone()), ClusterSection::default()),
        None => (written.include.as_ref().map(|p| source.base_dir.join(p)), written),
    };
    let included = match &include {
        Some(path) => load_cluster_file(path)?,
        None => ClusterSection::default(),
    };
    let cli = ClusterSection { nodes: overrides.nodes, device: overrides.device, ..ClusterSection::default() };
    let merged = included.overlaid_with(ClusterSection { include: None, ..written }).overlaid_with(cli);
    let merged = if merged.detect == Some(true) { detect().overlaid_with(merged) } else { merged };
    merged.resolve()
}

/// Reads a cluster file (one `[cluster]` table, no further includes).
pub fn load_cluster_file(path: &Path) -> Result<ClusterSection, ConfigError> {
    let source = ConfigSource::from_file(path)?;
    let file: cluster::ClusterFile = parse_toml(&source.text, &source.name)?;
    if let Some(nested) = &file.cluster.include {
        return Err(ConfigError::invalid(
            "cluster.include",
            format!("{:?} (in {})", nested, path.display()),
            "a cluster file may not include another cluster file",
        ));
    }
    Ok(file.cluster)
}

impl JobConfig {
    /// The job as `nereus train` runs it: `cluster.device` resolved by the data plane
    /// ([`ClusterSpec::train_device`]), so that a job naming only a GPU data plane is planned
    /// for Nereus's own device engine there, as it trains (`nereus plan` sizes such a job for a
    /// Megatron-style engine instead: `EngineKind::of`).
    pub fn as_trained(&self) -> JobConfig {
        let mut config = self.clone();
        config.cluster.device = config.cluster.train_device();
        config
    }

    /// The reward of a text job against the rest: pass@k needs a rule's verdicts, and a
    /// `model` term is for `train.reward = "rule"` (with `"model"` the score is the model's
    /// alone).
    fn check_text_reward(&self, data: &DataSection) -> Result<(), ConfigError> {
        let terms = self.reward.terms();
        if data.pass_k > 0 && !terms.iter().any(|t| matches!(t.kind, RewardKind::Math | RewardKind::Exact)) {
            let why = "pass@k counts correct answers, which only a rule (math, exact) in [reward] judges";
            return Err(ConfigError::invalid("data.pass_k", data.pass_k, why));
        }
        if self.reward.model_weight() != 0.0 && self.train.reward == RewardSource::Model {
            let why = "with a `model` term in [reward], the reward model's score is already part of the reward: keep train.reward = \"rule\"";
            return Err(ConfigError::invalid("train.reward", "model", why));
        }
        Ok(())
    }

    /// A text job's warm-ups need data the arithmetic task makes up: worked answers for the
    /// actor, graded responses for the reward model (which a text job does not have).
    fn check_text_warm_ups(&self, data: &DataSection) -> Result<(), ConfigError> {
        let t = &self.train;
        if t.warmup_actor_steps > 0 && self.models.actor.path.is_none() && data.solution_key.is_none() {
            return Err(ConfigError::invalid(
                "train.warmup_actor_steps",
                t.warmup_actor_steps,
                "the actor's warm-up on a text job trains on worked answers: set data.solution_key, or set 0 (the actor then starts from models.actor.path or random weights)",
            ));
        }
        if t.warmup_reward_steps > 0 && self.models.reward.path.is_none() {
            return Err(ConfigError::invalid(
                "train.warmup_reward_steps",
                t.warmup_reward_steps,
                "a text job has no graded responses to warm a reward model up on: set 0 and score with [reward] (train.reward = \"rule\"), or start the reward model from models.reward.path",
            ));
        }
        Ok(())
    }

    /// Loads, resolves and validates a job file (or the embedded default) in one call.
    pub fn load(
        path: Option<&Path>,
        overrides: &Overrides,
        detect: &mut dyn FnMut() -> ClusterSection,
    ) -> Result<JobConfig, ConfigError> {
        let source = ConfigSource::file_or_default(path)?;
        let raw = RawJobConfig::parse(&source)?;
        let raw = if overrides.sets.is_empty() { raw } else { sets::apply(&source.text, &overrides.sets)? };
        raw.resolve(&source, overrides, detect)
    }

    /// Validates every section and the rules that span sections.
    pub fn validate(&self) -> Result<(), ConfigError> {
        self.job.validate()?;
        self.cluster.validate()?;
        self.models.validate()?;
        self.rl.validate()?;
        self.policy.validate()?;
        self.train.validate(self.rl.algorithm)?;
        self.reward.validate()?;
        if let Some(data) = &self.data {
            data.validate()?;
            if data.tokenizer.is_none() && self.models.actor.path.is_none() {
                return Err(ConfigError::Missing {
                    key: "data.tokenizer".into(),
                    hint: "a text job renders its prompts with a tokenizer: set data.tokenizer to a model directory holding tokenizer.json, or models.actor.path".into(),
                });
            }
            self.check_text_warm_ups(data)?;
            self.check_text_reward(data)?;
        }
        if self.reward.model_weight() != 0.0 && self.rl.algorithm == Algorithm::Remax {
            let why = "ReMax scores its greedy baseline without the reward model, so its samples must be scored without it too";
            return Err(ConfigError::invalid("reward.terms", "model", why));
        }
        if self.train.reward == RewardSource::Model && self.rl.algorithm == Algorithm::Remax {
            return Err(ConfigError::invalid("train.reward", "model", "ReMax scores its greedy baseline with the rule, so its samples must be scored by the rule too (reward = \"rule\")"));
        }
        if self.train.reward_cap > self.rl.max_response_len {
            return Err(ConfigError::invalid(
                "train.reward_cap",
                self.train.reward_cap,
                format!(
                    "must be at most rl.max_response_len ({}): a response cannot hold more correct terms than tokens",
                    self.rl.max_response_len
                ),
            ));
        }
        plan::validate(&self.plan, self.rl.mode)?;
        match (self.rl.algorithm.uses_critic(), &self.models.critic) {
            (true, None) => Err(ConfigError::Missing {
                key: "models.critic".into(),
                hint: format!(
                    "algorithm `{}` trains a value model; add a [models.critic] table",
                    self.rl.algorithm.name()
                ),
            }),
            (false, Some(_)) => Err(ConfigError::invalid(
                "models.critic",
                "[models.critic]",
                format!("algorithm `{}` has no critic; remove the table or use `ppo`", self.rl.algorithm.name()),
            )),
            _ => Ok(()),
        }
    }

    /// The resolved configuration as TOML, as rank 0 prints it.
    pub fn to_toml(&self) -> String {
        toml::to_string_pretty(self).expect("a validated JobConfig always serializes")
    }

    /// A 64-bit digest of the resolved configuration (SHA-256 of its canonical JSON, truncated):
    /// ranks compare it before doing anything together.
    pub fn hash(&self) -> u64 {
        let canonical = serde_json::to_vec(self).expect("a validated JobConfig always serializes");
        let digest = Sha256::digest(&canonical);
        u64::from_be_bytes(digest[..8].try_into().expect("SHA-256 has 32 bytes"))
    }
}

#[cfg(test)]
mod tests;
