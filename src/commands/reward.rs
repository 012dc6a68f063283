//! `nereus reward FILE.jsonl --kind math|exact|command`: scores a file of responses against
//! their reference answers offline, with the code a job uses, to check a reward before a run.

use clap::Args;
use serde::Serialize;
use std::io::Write;
use std::path::PathBuf;

use nereus_core::config::data::{check_format_bonus, check_scorer_timeout};
use nereus_data::records::Record;
use nereus_data::records::{read_records, DataError};
use nereus_data::reward::command::{CommandScorer, OnError, ScoreRequest};
use nereus_data::reward::end_scorers_on_signals;
use nereus_data::reward::{RuleKind, RuleReward, Score};

use super::simulate::write_file;
use crate::error::CommandError;
use crate::launch::{solo, Global};

/// `nereus reward`.
#[derive(Args, Debug, Clone)]
pub struct RewardArgs {
    /// JSON lines, one object per response: the response and its reference answer.
    pub file: PathBuf,
    /// The reward: a rule (math, exact) or an external scorer (command, given after `--`).
    #[arg(long, value_enum)]
    pub kind: KindArg,
    /// Added to a response's reward when it gives its answer in `\boxed{…}`.
    #[arg(long, default_value_t = 0.0, allow_hyphen_values = true)]
    pub format_bonus: f64,
    /// The field holding the response (dotted for nested objects).
    #[arg(long, default_value = "response")]
    pub response_key: String,
    /// The field holding the reference answer (dotted: `reward_model.ground_truth`).
    #[arg(long, default_value = "answer")]
    pub answer_key: String,
    /// The field holding the prompt, sent to a scorer command (optional: "" when absent).
    #[arg(long, default_value = "prompt")]
    pub prompt_key: String,
    /// The field holding metadata, sent to a scorer command (optional: null when absent).
    #[arg(long, default_value = "metadata")]
    pub metadata_key: String,
    /// Seconds a scorer command may take per line.
    #[arg(long, default_value_t = 30.0, allow_hyphen_values = true)]
    pub timeout: f64,
    /// What a scorer failure does: stop (exit naming the line) or zero (score 0, count it).
    #[arg(long, value_parser = super::named::<OnError>(), default_value = "stop")]
    pub on_error: OnError,
    /// Also write every line's score as JSON.
    #[arg(long, value_name = "PATH")]
    pub json: Option<PathBuf>,
    /// The scorer command and its arguments (`--kind command -- python3 score.py`).
    #[arg(last = true, value_name = "COMMAND")]
    pub command: Vec<String>,
}

/// `--kind`'s values.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum KindArg {
    /// The final answer, normalised, against the reference.
    Math,
    /// The whole response, normalised, against the reference.
    Exact,
    /// An external scorer reading JSON lines and answering {"reward": x} per line.
    Command,
}

/// What `--json` writes.
#[derive(Debug, Serialize)]
struct Report {
    kind: KindArg,
    format_bonus: f64,
    count: usize,
    mean_reward: f64,
    accuracy: Option<f64>,
    failures: usize,
    scores: Vec<LineScore>,
}

/// One line's score, with its line number in the file (a scorer command's has no `correct`
/// or `extracted`: its reward is all it says).
#[derive(Debug, Serialize)]
struct LineScore {
    line: usize,
    reward: f64,
    #[serde(skip_serializing_if = "Option::is_none")]
    correct: Option<bool>,
    #[serde(skip_serializing_if = "Option::is_none")]
    extracted: Option<String>,
}

impl LineScore {
    fn of_rule(line: usize, score: Score) -> LineScore {
        LineScore { line, reward: score.reward, correct: Some(score.correct), extracted: score.extracted }
    }
}

/// Runs `nereus reward` (this process alone).
pub fn exec(a: RewardArgs, global: &Global) -> u8 {
    solo(global, || {
        // The same bounds as the config keys the flags stand for.
        check_format_bonus("--format-bonus", a.format_bonus)?;
        check_scorer_timeout("--timeout", a.timeout)?;
        let usage = |e: &dyn std::fmt::Display| CommandError::Usage(e.to_string());
        let records = read_records(&a.file).map_err(|e| usage(&e))?;
        let (scores, failures) = match a.kind {
            KindArg::Math | KindArg::Exact => (rule_scores(&a, &records).map_err(|e| usage(&e))?, 0),
            KindArg::Command => command_scores(&a, &records)?,
        };
        let count = scores.len();
        // Each reward divided first: a scorer's finite rewards near f64::MAX sum to inf.
        let mean_reward = scores.iter().map(|s| s.reward / count as f64).sum::<f64>();
        // A scorer command says nothing of correctness: its reward is all there is.
        let accuracy = (a.kind != KindArg::Command)
            .then(|| scores.iter().filter(|s| s.correct == Some(true)).count() as f64 / count as f64);
        let report =
            Report { kind: a.kind, format_bonus: a.format_bonus, count, mean_reward, accuracy, failures, scores };
        let mut out = std::io::stdout().lock();
        let accuracy = accuracy.map(|x| format!(", accuracy {x:.4}")).unwrap_or_default();
        let failed = if failures > 0 { format!(", {failures} scored 0 after a scorer failure") } else { String::new() };
        writeln!(out, "{count} responses: mean reward {mean_reward:.4}{accuracy}{failed}")
            .map_err(CommandError::Stdout)?;
        match &a.json {
            Some(path) => write_file(path, serde_json::to_string_pretty(&report).expect("a report serializes") + "\n"),
            None => Ok(()),
        }
    })
}

/// Every record's score under the rule `--kind` names, or the first line that cannot be scored.
fn rule_scores(a: &RewardArgs, records: &[Record]) -> Result<Vec<LineScore>, DataError> {
    let kind = if a.kind == KindArg::Math { RuleKind::Math } else { RuleKind::Exact };
    let rule = RuleReward { kind, format_bonus: a.format_bonus };
    records
        .iter()
        .map(|record| {
            let response = record.text(&a.file, &a.response_key)?;
            let answer = record.text(&a.file, &a.answer_key)?;
            Ok(LineScore::of_rule(record.line, rule.score(&response, &answer)))
        })
        .collect()
}

/// Every record scored by the command after `--`, in one batch; and the failures scored 0.
fn command_scores(a: &RewardArgs, records: &[Record]) -> Result<(Vec<LineScore>, usize), CommandError> {
    if a.command.is_empty() {
        return Err(CommandError::Usage(
            "--kind command needs the scorer after `--` (… --kind command -- python3 score.py)".into(),
        ));
    }
    let usage = |e: &dyn std::fmt::Display| CommandError::Usage(e.to_string());
    let mut fields = Vec::with_capacity(records.len());
    for record in records {
        let response = record.text(&a.file, &a.response_key).map_err(|e| usage(&e))?;
        let answer = record.text(&a.file, &a.answer_key).map_err(|e| usage(&e))?;
        let prompt = record.text(&a.file, &a.prompt_key).unwrap_or_default();
        let metadata = nereus_data::records::field(&record.value, &a.metadata_key).cloned().unwrap_or_default();
        fields.push((prompt, response, answer, metadata));
    }
    let requests: Vec<ScoreRequest> = fields
        .iter()
        .map(|(prompt, response, answer, metadata)| ScoreRequest { prompt, response, answer, metadata })
        .collect();
    end_scorers_on_signals().map_err(|e| CommandError::Usage(format!("cannot install signal handlers: {e}")))?;
    let timeout = std::time::Duration::from_secs_f64(a.timeout);
    let mut scorer = CommandScorer::start(&a.command, timeout, a.on_error).map_err(|e| usage(&e))?;
    let batch = scorer.score(&requests).map_err(|e| usage(&format!("{}: {e}", a.file.display())))?;
    for (index, why) in &batch.failures {
        log::warn!("{}:{}: scored 0: {why}", a.file.display(), records[*index].line);
    }
    let scores = records
        .iter()
        .zip(&batch.rewards)
        .map(|(record, &reward)| LineScore { line: record.line, reward, correct: None, extracted: None })
        .collect();
    Ok((scores, batch.failures.len()))
}
