//! A text job's prompts: every record of the prompt file rendered through the chat template and
//! tokenized once when the job starts, with an exact cursor. Position `n` of the run is prompt
//! `order(epoch)[n mod N]` of epoch `n div N`, where each epoch's order is a seeded shuffle: any
//! rank, any layout, and a job resumed at position `n` read the same prompt.

use std::path::{Path, PathBuf};

use serde_json::Value;

use nereus_core::config::{DataSection, TooLong};
use nereus_core::rng::Rng;

use crate::records::{read_jsonl, DataError, Record};
use crate::text::ModelText;

/// One prompt, ready to generate from.
#[derive(Debug, Clone, PartialEq)]
pub struct PromptItem {
    /// Its line in the file.
    pub line: usize,
    /// The prompt as the model reads it (the template rendered).
    pub text: String,
    /// Its token ids.
    pub ids: Vec<u32>,
    /// The reference answer.
    pub answer: String,
    /// The record's metadata (`null` when the field is absent).
    pub metadata: Value,
    /// A worked answer for the supervised warm-up, when the file has one.
    pub solution: Option<String>,
}

/// The prompts of one file, and the cursor over them.
#[derive(Debug, Clone)]
pub struct PromptSet {
    /// The file.
    pub path: PathBuf,
    items: Vec<PromptItem>,
    dropped: Vec<usize>,
    shuffle: Option<u64>,
}

impl PromptSet {
    /// Reads `path` with `data`'s fields, renders and tokenizes every prompt with `text`, and
    /// applies `data.too_long` to prompts over `max_tokens`. `seed` orders the epochs.
    pub fn load(
        path: &Path,
        data: &DataSection,
        text: &ModelText,
        max_tokens: usize,
        seed: u64,
    ) -> Result<Self, DataError> {
        let mut items = Vec::new();
        let mut dropped = Vec::new();
        for record in read_jsonl(path)? {
            let item = prompt_item(path, &record, data, text)?;
            if item.ids.len() <= max_tokens {
                items.push(item);
            } else if data.too_long == TooLong::Drop {
                dropped.push(record.line);
            } else {
                let reason = format!(
                    "the prompt is {} tokens, longer than rl.prompt_len = {max_tokens} (data.too_long = \"error\"; \"drop\" leaves such prompts out)",
                    item.ids.len()
                );
                return Err(DataError::Line { path: path.to_path_buf(), line: record.line, reason });
            }
        }
        if items.is_empty() {
            let reason = format!("every prompt is longer than rl.prompt_len = {max_tokens} tokens");
            return Err(DataError::Line { path: path.to_path_buf(), line: dropped[0], reason });
        }
        Ok(PromptSet { path: path.to_path_buf(), items, dropped, shuffle: data.shuffle.then_some(seed) })
    }

    /// Prompts kept.
    pub fn len(&self) -> usize {
        self.items.len()
    }

    /// Whether no prompt was kept (never, once loaded).
    pub fn is_empty(&self) -> bool {
        self.items.is_empty()
    }

    /// Lines of the prompts left out for length.
    pub fn dropped(&self) -> &[usize] {
        &self.dropped
    }

    /// Every prompt, in file order.
    pub fn items(&self) -> &[PromptItem] {
        &self.items
    }

    /// The prompt at run position `position`.
    pub fn at(&self, position: u64) -> &PromptItem {
        self.range(position, 1)[0]
    }

    /// The prompts at run positions `start..start + count` (each epoch's order drawn once).
    pub fn range(&self, start: u64, count: usize) -> Vec<&PromptItem> {
        let n = self.items.len() as u64;
        let mut order: Option<(u64, Vec<usize>)> = None;
        (start..start + count as u64)
            .map(|position| {
                let (epoch, k) = (position / n, (position % n) as usize);
                let Some(seed) = self.shuffle else { return &self.items[k] };
                if order.as_ref().is_none_or(|(e, _)| *e != epoch) {
                    order = Some((epoch, self.order(seed, epoch)));
                }
                &self.items[order.as_ref().expect("drawn above").1[k]]
            })
            .collect()
    }

    /// Epoch `epoch`'s order of the prompts: a Fisher–Yates shuffle seeded by the job and the
    /// epoch.
    fn order(&self, seed: u64, epoch: u64) -> Vec<usize> {
        let mut order: Vec<usize> = (0..self.items.len()).collect();
        Rng::new(seed ^ epoch.wrapping_mul(0xD1B5_4A32_D192_ED03)).shuffle(&mut order);
        order
    }
}

/// Record `record` of `path` as a prompt: its fields read, its prompt rendered and tokenized.
fn prompt_item(path: &Path, record: &Record, data: &DataSection, text: &ModelText) -> Result<PromptItem, DataError> {
    let at_line = |reason: String| DataError::Line { path: path.to_path_buf(), line: record.line, reason };
    let prompt = record.prompt(path, &data.prompt_key)?;
    let answer = record.text(path, &data.answer_key)?;
    let solution = data.solution_key.as_deref().map(|key| record.text(path, key)).transpose()?;
    let metadata = crate::records::field(&record.value, &data.metadata_key).cloned().unwrap_or(Value::Null);
    let rendered = text.render(&prompt, data.chat_template).map_err(|e| at_line(e.to_string()))?;
    let ids = text.encode(&rendered).map_err(|e| at_line(e.to_string()))?;
    if ids.is_empty() {
        return Err(at_line("the prompt renders to no tokens".into()));
    }
    Ok(PromptItem { line: record.line, text: rendered, ids, answer, metadata, solution })
}
