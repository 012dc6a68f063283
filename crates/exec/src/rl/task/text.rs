//! The text task: prompts from the job's `[data]` file, rendered and tokenized once at start;
//! responses decoded with the same tokenizer and scored by the `[reward]` rule or scorer.
//!
//! Prompts shorter than `rl.prompt_len` are left-padded with the pad id so that every sequence
//! of a batch has the same prompt length (the engine's layout); each sequence's start travels
//! with it, and attention masks the padding out, so a model reads its prompt as transformers'
//! masked batches give it (docs/data.md).

use std::path::PathBuf;
use std::sync::Mutex;
use std::time::Duration;

use nereus_core::config::{JobConfig, OnScorerError, RewardKind, RewardSection};
use nereus_data::prompts::{PromptItem, PromptSet};
use nereus_data::reward::command::{CommandScorer, OnError, ScoreRequest};
use nereus_data::reward::{RuleKind, RuleReward};
use nereus_data::text::ModelText;

use super::{Rollout, Scores, Split};
use crate::engine::StopIds;

/// One term of a text job's reward.
#[derive(Debug, Clone, PartialEq)]
pub enum TextTerm {
    /// A rule over the decoded response and the reference answer.
    Rule(RuleReward),
    /// An external scorer: program and arguments, timeout per line, what a failure does.
    Command {
        /// Program and arguments.
        argv: Vec<String>,
        /// Per response.
        timeout: Duration,
        /// Stop or score 0.
        on_error: OnError,
    },
    /// The reward model's score, added by the RL step (which runs the reward model).
    Model,
}

/// How a text job's responses are scored: a weighted sum of terms.
#[derive(Debug, Clone, PartialEq)]
pub struct TextReward {
    /// `(weight, term)`, in the config's order.
    pub terms: Vec<(f64, TextTerm)>,
}

impl TextReward {
    /// The reward of `config`'s `[reward]` section.
    pub fn of(config: &RewardSection) -> TextReward {
        let terms = config
            .terms()
            .iter()
            .map(|t| {
                let term = match t.kind {
                    RewardKind::Math => {
                        TextTerm::Rule(RuleReward { kind: RuleKind::Math, format_bonus: t.format_bonus })
                    }
                    RewardKind::Exact => {
                        TextTerm::Rule(RuleReward { kind: RuleKind::Exact, format_bonus: t.format_bonus })
                    }
                    RewardKind::Command => TextTerm::Command {
                        argv: config.command.clone(),
                        timeout: Duration::from_secs_f64(config.timeout_s),
                        on_error: match config.on_error {
                            OnScorerError::Stop => OnError::Stop,
                            OnScorerError::Zero => OnError::Zero,
                        },
                    },
                    RewardKind::Model => TextTerm::Model,
                };
                (t.weight, term)
            })
            .collect();
        TextReward { terms }
    }

    /// The scorer command's term, if any (a job runs one).
    fn command(&self) -> Option<(f64, &Vec<String>, Duration, OnError)> {
        self.terms.iter().find_map(|(w, t)| match t {
            TextTerm::Command { argv, timeout, on_error } => Some((*w, argv, *timeout, *on_error)),
            _ => None,
        })
    }

    /// The weight of the reward model's score.
    pub fn model_weight(&self) -> f64 {
        self.terms.iter().filter(|(_, t)| *t == TextTerm::Model).map(|(w, _)| w).sum()
    }
}

/// One decoded response, as `samples.jsonl` records it.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct TextSample {
    /// The prompt as rendered.
    pub prompt: String,
    /// The response, decoded.
    pub response: String,
    /// The reference answer.
    pub answer: String,
    /// Its reward.
    pub reward: f32,
}

/// A job's prompts, tokenizer and reward.
pub struct TextTask {
    /// The training prompts.
    pub train: PromptSet,
    /// The held-out prompts, if any.
    pub eval: Option<PromptSet>,
    /// The tokenizer, template and special tokens.
    pub text: ModelText,
    /// Prompt tokens per sequence.
    pub prompt_len: usize,
    /// The reward.
    pub reward: TextReward,
    /// The scorer process, once started (on the rank that scores).
    scorer: Mutex<Option<CommandScorer>>,
}

impl std::fmt::Debug for TextTask {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TextTask")
            .field("train", &self.train.path)
            .field("prompts", &self.train.len())
            .field("prompt_len", &self.prompt_len)
            .field("reward", &self.reward)
            .finish_non_exhaustive()
    }
}

impl TextTask {
    /// The task of `config` (which has `[data]`): the tokenizer checked against the actor's
    /// vocabulary, every prompt rendered and tokenized. The error names the file and the line.
    pub fn load(config: &JobConfig) -> Result<TextTask, String> {
        let data = config.data.as_ref().ok_or("the job has no [data] section")?;
        let dir = data.tokenizer.as_ref().or(config.models.actor.path.as_ref()).ok_or("no tokenizer directory")?;
        let text = ModelText::load(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
        text.check_fits(config.models.actor.vocab as usize).map_err(|e| format!("{}: {e}", dir.display()))?;
        if text.special().eos_ids.len() > 5 {
            return Err(format!("{}: more than 5 end-of-sequence ids", dir.display()));
        }
        let prompt_len = config.rl.prompt_len as usize;
        let load =
            |path: &PathBuf| PromptSet::load(path, data, &text, prompt_len, config.job.seed).map_err(|e| e.to_string());
        let train = load(&data.train)?;
        let eval = data.eval.as_ref().map(load).transpose()?;
        let reward = TextReward::of(&config.reward);
        Ok(TextTask { train, eval, text, prompt_len, reward, scorer: Mutex::new(None) })
    }

    /// Whether the reward runs an external scorer.
    pub fn runs_a_command(&self) -> bool {
        self.reward.command().is_some()
    }

    /// The first EOS id (also the padding after a response) and the others.
    pub fn stop(&self) -> (u32, StopIds) {
        let eos = &self.text.special().eos_ids;
        (eos[0], StopIds::new(&eos[1..]).expect("at most 5 EOS ids, checked at load"))
    }

    /// The training prompt at run position `position`, left-padded to the prompt length.
    pub fn prompt(&self, position: u64) -> Vec<u32> {
        self.padded(&self.train.at(position).ids)
    }

    /// Where the training prompt at run position `position` begins after its padding.
    pub fn prompt_start(&self, position: u64) -> usize {
        self.start_of(&self.train.at(position).ids)
    }

    /// Where prompt `ids` begins once left-padded to the prompt length (loading dropped or
    /// refused every longer prompt).
    fn start_of(&self, ids: &[u32]) -> usize {
        self.prompt_len - ids.len()
    }

    fn padded(&self, ids: &[u32]) -> Vec<u32> {
        let pad = self.text.special().pad_id;
        std::iter::repeat_n(pad, self.start_of(ids)).chain(ids.iter().copied()).collect()
    }

    /// The text of a response: its stop token dropped, special tokens skipped.
    pub fn decode_response(&self, response: &[u32]) -> Result<String, String> {
        let special = self.text.special();
        let body = match response.split_last() {
            Some((last, body)) if special.is_eos(*last) => body,
            _ => response,
        };
        self.text.decode(body).map_err(|e| e.to_string())
    }

    /// The rewards of `rollout`: sequence `i` answers the training prompt at run position
    /// `positions[i]`, or with [`Split::Eval`] held-out prompt number `positions[i]`.
    pub fn score(&self, rollout: &Rollout, split: Split, positions: &[u64]) -> Result<Scores, String> {
        let items: Vec<&PromptItem> = match (split, &self.eval) {
            (Split::Train, _) => positions.iter().map(|&p| self.train.at(p)).collect(),
            (Split::Eval, Some(eval)) => positions.iter().map(|&i| &eval.items()[i as usize]).collect(),
            (Split::Eval, None) => return Err("the job has no held-out prompts (data.eval)".into()),
        };
        let responses = (0..rollout.sequences())
            .map(|i| self.decode_response(rollout.prompt_and_response(i).1))
            .collect::<Result<Vec<_>, _>>()?;
        let mut scores = Scores { rewards: vec![0.0; responses.len()], correct: Vec::new(), failures: 0 };
        for (weight, term) in &self.reward.terms {
            let TextTerm::Rule(rule) = term else { continue };
            let verdicts: Vec<_> = responses.iter().zip(&items).map(|(r, item)| rule.score(r, &item.answer)).collect();
            for (total, v) in scores.rewards.iter_mut().zip(&verdicts) {
                *total += (weight * v.reward) as f32;
            }
            if scores.correct.is_empty() {
                scores.correct = verdicts.iter().map(|v| v.correct).collect();
            }
        }
        if let Some((weight, argv, timeout, on_error)) = self.reward.command() {
            let requests: Vec<ScoreRequest> = responses
                .iter()
                .zip(&items)
                .map(|(response, item)| ScoreRequest {
                    prompt: &item.text,
                    response,
                    answer: &item.answer,
                    metadata: &item.metadata,
                })
                .collect();
            let mut scorer = self.scorer.lock().map_err(|_| "the scorer's lock is poisoned")?;
            if scorer.is_none() {
                *scorer = Some(CommandScorer::start(argv, timeout, on_error).map_err(|e| e.to_string())?);
            }
            let batch = scorer.as_mut().expect("started above").score(&requests).map_err(|e| e.to_string())?;
            for (index, why) in &batch.failures {
                log::warn!("{}:{}: scored 0: {why}", self.train.path.display(), items[*index].line);
            }
            for (total, x) in scores.rewards.iter_mut().zip(&batch.rewards) {
                *total += (weight * x) as f32;
            }
            scores.failures = batch.failures.len() as u64;
        }
        Ok(scores)
    }

    /// Held-out prompt `index`, left-padded to the prompt length, and where it begins.
    pub fn eval_prompt(&self, index: usize) -> (Vec<u32>, usize) {
        let eval = self.eval.as_ref().expect("callers count the held-out prompts first");
        let ids = &eval.items()[index].ids;
        (self.padded(ids), self.start_of(ids))
    }

    /// Held-out prompts.
    pub fn eval_len(&self) -> usize {
        self.eval.as_ref().map_or(0, PromptSet::len)
    }

    /// A decoded sample: sequence `i` of `rollout` with the training prompt at `position`.
    pub fn sample_record(&self, rollout: &Rollout, i: usize, position: u64, reward: f32) -> TextSample {
        let item = self.train.at(position);
        let response = self.decode_response(rollout.prompt_and_response(i).1).unwrap_or_else(|e| format!("<{e}>"));
        TextSample { prompt: item.text.clone(), response, answer: item.answer.clone(), reward }
    }

    /// Warm-up example `index`: a training prompt, where it begins, and its worked solution,
    /// then EOS.
    pub fn warmup_example(&self, index: u64) -> Result<(Vec<u32>, usize, Vec<u32>), String> {
        let item = self.train.at(index);
        let solution = item.solution.as_ref().ok_or_else(|| {
            format!(
                "{}: the actor's warm-up needs worked answers: set data.solution_key, or start the actor from a model directory (models.actor.path) with train.warmup_actor_steps = 0",
                self.train.path.display()
            )
        })?;
        let mut response = self.text.encode(solution).map_err(|e| e.to_string())?;
        response.push(self.stop().0);
        Ok((self.padded(&item.ids), self.start_of(&item.ids), response))
    }
}
