//! `[data]` and `[reward]`: a text job's prompt files, its tokenizer, and how its responses are
//! scored. Without `[data]`, a job trains on the built-in arithmetic task over token ids.

use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};

use super::{check, ConfigError};

/// What happens to a prompt longer than `rl.prompt_len` tokens.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum TooLong {
    /// Leave it out and count it (reported when the job starts).
    #[default]
    Drop,
    /// Refuse the file, naming the line.
    Error,
}

/// The `[data]` section: prompt files (JSON lines) and the fields they are read from.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DataSection {
    /// Training prompts (relative paths against the job file's directory).
    pub train: PathBuf,
    /// Held-out prompts for evaluation (optional).
    #[serde(default)]
    pub eval: Option<PathBuf>,
    /// The model directory whose `tokenizer.json` and chat template render the prompts; by
    /// default the actor's (`models.actor.path`).
    #[serde(default)]
    pub tokenizer: Option<PathBuf>,
    /// The prompt's field: a string or a list of chat messages (dotted for nested fields).
    #[serde(default = "prompt_key")]
    pub prompt_key: String,
    /// The reference answer's field (verl's files: `reward_model.ground_truth`).
    #[serde(default = "answer_key")]
    pub answer_key: String,
    /// A field passed to the reward as it is (optional in each record: `null` when absent).
    #[serde(default = "metadata_key")]
    pub metadata_key: String,
    /// A worked answer's field, for the actor's supervised warm-up when it starts from random
    /// weights (optional: without it, a job from random weights has no warm-up data).
    #[serde(default)]
    pub solution_key: Option<String>,
    /// Render string prompts as one user message through the chat template (when false they
    /// are tokenized as they are).
    #[serde(default = "yes")]
    pub chat_template: bool,
    /// Shuffle the prompts, afresh every epoch, from `job.seed`.
    #[serde(default = "yes")]
    pub shuffle: bool,
    /// Prompts longer than `rl.prompt_len` tokens: `drop` (counted) or `error`.
    #[serde(default)]
    pub too_long: TooLong,
    /// Evaluate on the held-out prompts every this many steps (0: only before the first step
    /// and after the last).
    #[serde(default)]
    pub eval_every: u32,
    /// Held-out prompts per evaluation (0: all of them).
    #[serde(default)]
    pub eval_count: u32,
    /// Decoded responses written to `<output_dir>/samples.jsonl` per step.
    #[serde(default = "two")]
    pub samples_per_step: u32,
    /// Sampled answers per held-out prompt for pass@k in each evaluation (0: greedy only).
    #[serde(default)]
    pub pass_k: u32,
}

fn two() -> u32 {
    2
}

fn prompt_key() -> String {
    "prompt".into()
}
fn answer_key() -> String {
    "answer".into()
}
fn metadata_key() -> String {
    "metadata".into()
}
fn yes() -> bool {
    true
}

impl DataSection {
    /// Paths resolved against `base_dir` (the job file's directory).
    pub fn resolved(mut self, base_dir: &Path) -> DataSection {
        self.train = base_dir.join(&self.train);
        self.eval = self.eval.map(|p| base_dir.join(p));
        self.tokenizer = self.tokenizer.map(|p| base_dir.join(p));
        self
    }

    /// Checks the field names and pass@k; errors name the key under `data.`.
    pub fn validate(&self) -> Result<(), ConfigError> {
        if self.pass_k > 64 {
            return Err(ConfigError::invalid(
                "data.pass_k",
                self.pass_k,
                "must be at most 64 (0: greedy answers only)",
            ));
        }
        for (key, value) in [("data.prompt_key", &self.prompt_key), ("data.answer_key", &self.answer_key)] {
            if value.split('.').any(str::is_empty) {
                return Err(ConfigError::invalid(key, value, "a field name, dotted for nested fields (`a.b`)"));
            }
        }
        Ok(())
    }
}

/// How a text job's responses are scored.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum RewardKind {
    /// The final answer extracted and compared with the reference (numbers as numbers).
    #[default]
    Math,
    /// The whole response, normalised, against the reference.
    Exact,
    /// An external scorer command (JSON lines in, `{"reward": x}` out).
    Command,
    /// The reward model's score of the response (a term of a combination).
    Model,
}

impl RewardKind {
    /// Its name in the config.
    pub fn name(self) -> &'static str {
        match self {
            RewardKind::Math => "math",
            RewardKind::Exact => "exact",
            RewardKind::Command => "command",
            RewardKind::Model => "model",
        }
    }
}

/// What a scorer command's failure does.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum OnScorerError {
    /// Checkpoint the last complete step and stop, naming the line.
    #[default]
    Stop,
    /// Score 0 and count the failure in the step record.
    Zero,
}

/// One weighted term of a combined reward (`[[reward.terms]]`).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RewardTerm {
    /// `math`, `exact`, `command` (the scorer of `reward.command`) or `model` (the reward
    /// model's score).
    pub kind: RewardKind,
    /// Its weight in the sum.
    #[serde(default = "one")]
    pub weight: f64,
    /// Added when a response gives its answer in `\boxed{…}` (rules only).
    #[serde(default)]
    pub format_bonus: f64,
}

fn one() -> f64 {
    1.0
}

/// The `[reward]` section of a text job (with `train.reward = "rule"`): one kind, or a
/// weighted sum of `terms`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RewardSection {
    /// `math`, `exact`, `command` or `model` (when `terms` is empty; `math` when neither is
    /// given).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kind: Option<RewardKind>,
    /// Added when a response gives its answer in `\boxed{…}` (rules only; with `terms`, each
    /// term has its own).
    #[serde(default)]
    pub format_bonus: f64,
    /// Weighted terms summed into the reward (instead of `kind`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub terms: Vec<RewardTerm>,
    /// The scorer's program and arguments (a `command` kind or term).
    #[serde(default)]
    pub command: Vec<String>,
    /// Seconds the scorer may take per response.
    #[serde(default = "timeout_s")]
    pub timeout_s: f64,
    /// `stop` or `zero`.
    #[serde(default)]
    pub on_error: OnScorerError,
}

fn timeout_s() -> f64 {
    30.0
}

/// Most a rule's format bonus may add to a reward.
pub const MAX_FORMAT_BONUS: f64 = 1e6;
/// Shortest time a scorer may be given per response, in seconds.
pub const MIN_SCORER_TIMEOUT_S: f64 = 0.001;

/// A format bonus (`reward.format_bonus`, a term's, `nereus reward --format-bonus`) in
/// `[0, MAX_FORMAT_BONUS]`.
pub fn check_format_bonus(key: &str, value: f64) -> Result<(), ConfigError> {
    check::within(key, value, 0.0, MAX_FORMAT_BONUS)
}

/// A scorer's time per response (`reward.timeout_s`, `nereus reward --timeout`) in
/// `[MIN_SCORER_TIMEOUT_S, check::MAX_TIMEOUT_S]`: a week is past any scorer, and a longer
/// time does not fit the clock it is measured on.
pub fn check_scorer_timeout(key: &str, value: f64) -> Result<(), ConfigError> {
    check::within(key, value, MIN_SCORER_TIMEOUT_S, check::MAX_TIMEOUT_S)
}

impl Default for RewardSection {
    fn default() -> RewardSection {
        RewardSection {
            kind: None,
            format_bonus: 0.0,
            terms: Vec::new(),
            command: Vec::new(),
            timeout_s: timeout_s(),
            on_error: OnScorerError::default(),
        }
    }
}

impl RewardSection {
    /// The reward as weighted terms: `terms`, or `kind` (by default `math`) with weight 1.
    pub fn terms(&self) -> Vec<RewardTerm> {
        if !self.terms.is_empty() {
            return self.terms.clone();
        }
        let kind = self.kind.unwrap_or_default();
        vec![RewardTerm { kind, weight: 1.0, format_bonus: self.format_bonus }]
    }

    /// The weight of the reward model's score in the sum (0 without a `model` term).
    pub fn model_weight(&self) -> f64 {
        self.terms().iter().filter(|t| t.kind == RewardKind::Model).map(|t| t.weight).sum()
    }

    /// Checks the terms, bonuses, timeout and command; errors name the key under `reward.`.
    pub fn validate(&self) -> Result<(), ConfigError> {
        if let (Some(kind), false) = (self.kind, self.terms.is_empty()) {
            let why = "give either one kind or weighted [[reward.terms]], not both";
            return Err(ConfigError::invalid("reward.kind", kind.name(), why));
        }
        if !self.terms.is_empty() && self.format_bonus != 0.0 {
            let why = "with [[reward.terms]], each rule term has its own format_bonus";
            return Err(ConfigError::invalid("reward.format_bonus", check::show(self.format_bonus), why));
        }
        check_scorer_timeout("reward.timeout_s", self.timeout_s)?;
        let terms = self.terms();
        for (i, term) in terms.iter().enumerate() {
            let key = |field: &str| match self.terms.is_empty() {
                true => format!("reward.{field}"),
                false => format!("reward.terms[{i}].{field}"),
            };
            check_format_bonus(&key("format_bonus"), term.format_bonus)?;
            check::within(&key("weight"), term.weight, -1e6, 1e6)?;
            if term.format_bonus != 0.0 && matches!(term.kind, RewardKind::Command | RewardKind::Model) {
                let why = "a format bonus belongs to a rule (math, exact)";
                return Err(ConfigError::invalid(key("format_bonus"), check::show(term.format_bonus), why));
            }
            if terms[..i].iter().any(|t| t.kind == term.kind && !matches!(t.kind, RewardKind::Math | RewardKind::Exact))
            {
                let why = "one job runs one scorer and one reward model: give this kind one term";
                return Err(ConfigError::invalid(key("kind"), term.kind.name(), why));
            }
        }
        let scorer = terms.iter().any(|t| t.kind == RewardKind::Command);
        match (scorer, self.command.is_empty()) {
            (true, true) => Err(ConfigError::Missing {
                key: "reward.command".into(),
                hint: "kind = \"command\" runs a scorer: command = [\"python3\", \"score.py\"]".into(),
            }),
            (false, false) => Err(ConfigError::invalid(
                "reward.command",
                self.command.join(" "),
                "only a `command` kind or term runs a scorer",
            )),
            _ => Ok(()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn section(toml: &str) -> RewardSection {
        toml::from_str(toml).unwrap()
    }

    /// One kind is a single term of weight 1; terms are summed as given, the reward model's
    /// weight read from its term.
    #[test]
    fn a_reward_is_weighted_terms() {
        let single = section("kind = \"exact\"\nformat_bonus = 0.1");
        assert_eq!(single.terms(), [RewardTerm { kind: RewardKind::Exact, weight: 1.0, format_bonus: 0.1 }]);
        assert_eq!(section("").terms()[0].kind, RewardKind::Math);
        let combined = section("terms = [{kind = \"math\", format_bonus = 0.2}, {kind = \"model\", weight = -0.5}]");
        combined.validate().unwrap();
        assert_eq!(combined.terms()[0], RewardTerm { kind: RewardKind::Math, weight: 1.0, format_bonus: 0.2 });
        assert_eq!((combined.model_weight(), single.model_weight()), (-0.5, 0.0));
        for (toml, key) in [
            ("format_bonus = 0.1\nterms = [{kind = \"math\"}]", "reward.format_bonus"),
            ("terms = [{kind = \"model\", format_bonus = 1.0}]", "reward.terms[0].format_bonus"),
            ("terms = [{kind = \"model\"}, {kind = \"model\"}]", "reward.terms[1].kind"),
            ("terms = [{kind = \"command\"}]", "reward.command"),
            ("kind = \"math\"\ncommand = [\"s\"]", "reward.command"),
        ] {
            let e = section(toml).validate().unwrap_err().to_string();
            assert!(e.contains(&format!("`{key}`")), "{toml}: {e}");
        }
    }
}
