//! `nereus reward FILE.jsonl --kind math|exact`: scores a file of responses against their
//! reference answers offline, with the rule a job uses, to check a reward before a run.

use clap::Args;
use serde::Serialize;
use std::io::Write;
use std::path::PathBuf;

use nereus_data::records::{read_jsonl, DataError};
use nereus_data::reward::{RuleKind, RuleReward, Score};

use super::simulate::write_file;
use crate::error::CommandError;
use crate::launch::{solo, Global};

/// `nereus reward`.
#[derive(Args, Debug, Clone)]
pub struct RewardArgs {
    /// JSON lines, one object per response: the response and its reference answer.
    pub file: PathBuf,
    /// The rule.
    #[arg(long, value_enum)]
    pub kind: RuleKind,
    /// Added to a response's reward when it gives its answer in `\boxed{…}`.
    #[arg(long, default_value_t = 0.0, allow_negative_numbers = true)]
    pub format_bonus: f64,
    /// The field holding the response (dotted for nested objects).
    #[arg(long, default_value = "response")]
    pub response_key: String,
    /// The field holding the reference answer (dotted: `reward_model.ground_truth`).
    #[arg(long, default_value = "answer")]
    pub answer_key: String,
    /// Also write every line's score as JSON.
    #[arg(long, value_name = "PATH")]
    pub json: Option<PathBuf>,
}

/// What `--json` writes.
#[derive(Debug, Serialize)]
struct Report {
    kind: RuleKind,
    format_bonus: f64,
    count: usize,
    mean_reward: f64,
    accuracy: f64,
    scores: Vec<LineScore>,
}

/// One line's score, with its line number in the file.
#[derive(Debug, Serialize)]
struct LineScore {
    line: usize,
    #[serde(flatten)]
    score: Score,
}

/// Runs `nereus reward` (this process alone).
pub fn exec(a: RewardArgs, global: &Global) -> u8 {
    solo(global, || {
        if !(a.format_bonus.is_finite() && a.format_bonus >= 0.0) {
            return Err(CommandError::Usage(format!("--format-bonus must be 0 or more, not {}", a.format_bonus)));
        }
        let rule = RuleReward { kind: a.kind, format_bonus: a.format_bonus };
        let scores = score_file(&a, &rule).map_err(|e| CommandError::Usage(e.to_string()))?;
        let count = scores.len();
        let mean_reward = scores.iter().map(|s| s.score.reward).sum::<f64>() / count as f64;
        let accuracy = scores.iter().filter(|s| s.score.correct).count() as f64 / count as f64;
        let report = Report { kind: a.kind, format_bonus: a.format_bonus, count, mean_reward, accuracy, scores };
        let mut out = std::io::stdout().lock();
        writeln!(out, "{count} responses: mean reward {mean_reward:.4}, accuracy {accuracy:.4}")
            .map_err(CommandError::Stdout)?;
        match &a.json {
            Some(path) => write_file(path, serde_json::to_string_pretty(&report).expect("a report serializes") + "\n"),
            None => Ok(()),
        }
    })
}

/// Every record's score, or the first line that cannot be scored.
fn score_file(a: &RewardArgs, rule: &RuleReward) -> Result<Vec<LineScore>, DataError> {
    read_jsonl(&a.file)?
        .iter()
        .map(|record| {
            let response = record.text(&a.file, &a.response_key)?;
            let answer = record.text(&a.file, &a.answer_key)?;
            Ok(LineScore { line: record.line, score: rule.score(&response, &answer) })
        })
        .collect()
}
