//! Where each resolved value of a job came from, for `inspect config`: a named flag, `--set`,
//! the job file, the cluster file it includes (or `--cluster`), the launcher's and hwloc's
//! detection, a model directory's `config.json`, or the default. The layers are the ones
//! [`super::RawJobConfig::resolve`] merges, in its precedence order.

use std::fmt;
use std::path::PathBuf;

use super::{ConfigSource, JobConfig, Overrides};

/// The layer a resolved value came from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ValueSource {
    /// A named flag (`--steps`).
    Flag(&'static str),
    /// `--set`.
    Set,
    /// The job file (or the embedded default).
    JobFile,
    /// A cluster file (`cluster.include` or `--cluster`).
    ClusterFile(PathBuf),
    /// The launcher's and hwloc's detection (`cluster.detect = true`).
    Detected,
    /// A model directory's `config.json` (`models.<role>.path`).
    ModelDirectory(PathBuf),
    /// The default the job's algorithm gives a key it shapes (`config::algorithm::Recipe`).
    Recipe(&'static str),
    /// The schema's default.
    Default,
}

impl fmt::Display for ValueSource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ValueSource::Flag(flag) => write!(f, "{flag}"),
            ValueSource::Set => write!(f, "--set"),
            ValueSource::JobFile => write!(f, "job file"),
            ValueSource::ClusterFile(path) => write!(f, "cluster file {}", path.display()),
            ValueSource::Detected => write!(f, "detected"),
            ValueSource::ModelDirectory(path) => write!(f, "{}", path.join("config.json").display()),
            ValueSource::Recipe(algorithm) => write!(f, "default for {algorithm}"),
            ValueSource::Default => write!(f, "default"),
        }
    }
}

/// The flags that name one key each.
const FLAGS: [(&str, &str); 7] = [
    ("job.seed", "--seed"),
    ("job.steps", "--steps"),
    ("job.output_dir", "--output-dir"),
    ("rl.algorithm", "--algorithm"),
    ("policy.mode", "--policy"),
    ("cluster.nodes", "--nodes"),
    ("cluster.device", "--device"),
];

/// The keys whose defaults come from the algorithm's recipe.
const RECIPE_KEYS: [&str; 7] = [
    "rl.loss_agg",
    "rl.kl_in",
    "rl.kl_estimator",
    "rl.dynamic_sampling",
    "rl.overlong_buffer",
    "train.clip_low",
    "train.clip_high",
];

/// The layers of one resolution, read back for lookups.
pub struct Provenance {
    file: toml::Table,
    sets: Vec<Vec<String>>,
    flags: Vec<(&'static str, &'static str)>,
    cluster_file: Option<(PathBuf, toml::Table)>,
    /// `--cluster FILE` replaced the job file's `[cluster]` table.
    cluster_replaced: bool,
    detected: bool,
    model_dirs: Vec<(String, PathBuf)>,
    /// The job's algorithm, whose recipe gives the [`RECIPE_KEYS`] their defaults.
    algorithm: &'static str,
}

impl Provenance {
    /// The layers that resolved `config` from `source` under `overrides` (the files already
    /// read once by the resolution; one unreadable now counts as absent).
    pub fn of(config: &JobConfig, source: &ConfigSource, overrides: &Overrides) -> Provenance {
        let file: toml::Table = toml::from_str(&source.text).unwrap_or_default();
        let given = [
            overrides.seed.is_some(),
            overrides.steps.is_some(),
            overrides.output_dir.is_some(),
            overrides.algorithm.is_some(),
            overrides.policy.is_some(),
            overrides.nodes.is_some(),
            overrides.device.is_some(),
        ];
        let flags = FLAGS.iter().zip(given).filter(|(_, g)| *g).map(|(f, _)| *f).collect();
        let include = file.get("cluster").and_then(|c| c.get("include")).and_then(toml::Value::as_str);
        let cluster_path = overrides.cluster_file.clone().or_else(|| include.map(|p| source.base_dir.join(p)));
        let cluster_file = cluster_path.map(|path| {
            let table = std::fs::read_to_string(&path).ok().and_then(|t| toml::from_str(&t).ok()).unwrap_or_default();
            (path, table)
        });
        let m = &config.models;
        let roles = [("actor", Some(&m.actor)), ("reference", Some(&m.reference)), ("reward", Some(&m.reward))];
        let model_dirs = roles
            .into_iter()
            .chain([("critic", m.critic.as_ref())])
            .filter_map(|(role, spec)| Some((role.to_string(), spec?.path.clone()?)))
            .collect();
        let replaced = overrides.cluster_file.is_some();
        let detect = |t: &toml::Table| t.get("cluster").and_then(|c| c.get("detect")).and_then(toml::Value::as_bool);
        let written = if replaced { None } else { detect(&file) };
        let detected = written.or_else(|| cluster_file.as_ref().and_then(|(_, t)| detect(t))) == Some(true);
        Provenance {
            file,
            sets: overrides.sets.iter().filter_map(|s| s.path()).collect(),
            flags,
            cluster_file,
            cluster_replaced: replaced,
            detected,
            model_dirs,
            algorithm: config.rl.algorithm.name(),
        }
    }

    /// Where the value at `path` (`["rl", "prompts_per_step"]`) came from.
    pub fn source(&self, path: &[String]) -> ValueSource {
        let dotted = path.join(".");
        if let Some((_, flag)) = self.flags.iter().find(|(key, _)| *key == dotted) {
            return ValueSource::Flag(flag);
        }
        if self.sets.iter().any(|set| path.starts_with(set) || set.starts_with(path)) {
            return ValueSource::Set;
        }
        if path[0] == "cluster" {
            return self.cluster_source(path);
        }
        if holds(&self.file, path) {
            return ValueSource::JobFile;
        }
        if let [models, role, ..] = path {
            let dir = self.model_dirs.iter().find(|(r, _)| r == role).filter(|_| models == "models");
            if let Some((_, dir)) = dir {
                return ValueSource::ModelDirectory(dir.clone());
            }
        }
        if RECIPE_KEYS.contains(&dotted.as_str()) {
            return ValueSource::Recipe(self.algorithm);
        }
        ValueSource::Default
    }

    /// A `[cluster]` key: the job file's table over the cluster file's over detection (a
    /// `--cluster` file replaces the job file's table).
    fn cluster_source(&self, path: &[String]) -> ValueSource {
        if !self.cluster_replaced && holds(&self.file, path) {
            return ValueSource::JobFile;
        }
        if let Some((file, table)) = &self.cluster_file {
            if holds(table, path) {
                return ValueSource::ClusterFile(file.clone());
            }
        }
        if self.detected {
            ValueSource::Detected
        } else {
            ValueSource::Default
        }
    }
}

/// Whether `table` holds `path` (an array of tables holds every path below it).
fn holds(table: &toml::Table, path: &[String]) -> bool {
    let mut value = match table.get(&path[0]) {
        Some(v) => v,
        None => return false,
    };
    for key in &path[1..] {
        value = match value {
            toml::Value::Table(t) => match t.get(key) {
                Some(v) => v,
                None => return false,
            },
            toml::Value::Array(_) => return true,
            _ => return false,
        };
    }
    true
}

/// `config`'s resolved TOML with each value's source as a comment at the end of its line.
pub fn annotated_toml(config: &JobConfig, provenance: &Provenance) -> String {
    let mut table: Vec<String> = Vec::new();
    let mut out = String::new();
    for line in config.to_toml().lines() {
        let trimmed = line.trim_start();
        if trimmed.starts_with('[') {
            table = header_path(trimmed).unwrap_or_default();
        } else if let (false, Some(key)) = (line.starts_with(char::is_whitespace), line_key(line)) {
            let path: Vec<String> = table.iter().cloned().chain([key]).collect();
            out += &format!("{line}  # {}\n", provenance.source(&path));
            continue;
        }
        out += line;
        out.push('\n');
    }
    out
}

/// The key path of a table header (`[plan."actor/training"]`, `[[reward.terms]]`), read by
/// the TOML parser itself.
fn header_path(header: &str) -> Option<Vec<String>> {
    let mut value = toml::Value::Table(toml::from_str(header).ok()?);
    let mut path = Vec::new();
    loop {
        value = match value {
            toml::Value::Table(t) if t.len() == 1 => {
                let (key, inner) = t.into_iter().next()?;
                path.push(key);
                inner
            }
            _ => return Some(path),
        };
    }
}

/// The key of a `key = value` line (possibly quoted), or `None` for other lines.
fn line_key(line: &str) -> Option<String> {
    let (key, _) = line.split_once(" = ")?;
    let table: toml::Table = toml::from_str(&format!("{key} = 0")).ok()?;
    table.keys().next().cloned()
}
