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

    /// Checks the field names; errors name the key under `data.`.
    pub fn validate(&self) -> Result<(), ConfigError> {
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

/// The `[reward]` section of a text job (with `train.reward = "rule"`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RewardSection {
    /// `math`, `exact` or `command`.
    #[serde(default)]
    pub kind: RewardKind,
    /// Added when a response gives its answer in `\boxed{…}` (rules only).
    #[serde(default)]
    pub format_bonus: f64,
    /// The scorer's program and arguments (`kind = "command"`).
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

impl Default for RewardSection {
    fn default() -> RewardSection {
        RewardSection {
            kind: RewardKind::default(),
            format_bonus: 0.0,
            command: Vec::new(),
            timeout_s: timeout_s(),
            on_error: OnScorerError::default(),
        }
    }
}

impl RewardSection {
    /// Checks the bonus, the timeout and the command; errors name the key under `reward.`.
    pub fn validate(&self) -> Result<(), ConfigError> {
        check::within("reward.format_bonus", self.format_bonus, 0.0, 1e6)?;
        check::positive("reward.timeout_s", self.timeout_s)?;
        match (self.kind, self.command.is_empty()) {
            (RewardKind::Command, true) => Err(ConfigError::Missing {
                key: "reward.command".into(),
                hint: "kind = \"command\" runs a scorer: command = [\"python3\", \"score.py\"]".into(),
            }),
            (RewardKind::Math | RewardKind::Exact, false) => Err(ConfigError::invalid(
                "reward.command",
                self.command.join(" "),
                "only kind = \"command\" runs a scorer",
            )),
            _ => Ok(()),
        }
    }
}
