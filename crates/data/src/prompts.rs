//! A text job's prompts: every record of the prompt file rendered through the chat template and
//! tokenized once when the job starts, with an exact cursor. Position `n` of the run is prompt
//! `order(epoch)[n mod N]` of epoch `n div N`, where each epoch's order is a seeded shuffle: any
//! rank, any layout, and a job resumed at position `n` read the same prompt.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use serde_json::Value;

use nereus_core::config::{DataSection, TooLong};
use nereus_core::rng::Rng;

use crate::records::{read_records, DataError, Record};
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
#[derive(Debug)]
pub struct PromptSet {
    /// The file.
    pub path: PathBuf,
    items: Vec<PromptItem>,
    dropped: Vec<usize>,
    shuffle: Option<u64>,
    /// The last epoch's order drawn: a step reads its prompts several times (prompt, start,
    /// reward, samples), and drawing an order is O(N).
    last_order: Mutex<Option<(u64, Arc<[usize]>)>>,
}

impl Clone for PromptSet {
    fn clone(&self) -> Self {
        PromptSet {
            path: self.path.clone(),
            items: self.items.clone(),
            dropped: self.dropped.clone(),
            shuffle: self.shuffle,
            last_order: Mutex::new(None),
        }
    }
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
        for record in read_records(path)? {
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
        Ok(PromptSet {
            path: path.to_path_buf(),
            items,
            dropped,
            shuffle: data.shuffle.then_some(seed),
            last_order: Mutex::new(None),
        })
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
        let n = self.items.len() as u64;
        let (epoch, k) = (position / n, (position % n) as usize);
        match self.shuffle {
            None => &self.items[k],
            Some(seed) => &self.items[self.order(seed, epoch)[k]],
        }
    }

    /// Epoch `epoch`'s order of the prompts: a Fisher–Yates shuffle seeded by the job and the
    /// epoch, drawn once and kept until another epoch is asked for.
    fn order(&self, seed: u64, epoch: u64) -> Arc<[usize]> {
        // A poisoned lock only means another thread panicked mid-draw; the cache is rebuilt.
        let mut last = self.last_order.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        if let Some((_, order)) = last.as_ref().filter(|(e, _)| *e == epoch) {
            return Arc::clone(order);
        }
        let mut order: Vec<usize> = (0..self.items.len()).collect();
        Rng::new(seed ^ epoch.wrapping_mul(0xD1B5_4A32_D192_ED03)).shuffle(&mut order);
        let order: Arc<[usize]> = order.into();
        *last = Some((epoch, Arc::clone(&order)));
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

#[cfg(test)]
mod tests {
    use super::*;

    fn set(n: usize, shuffle: Option<u64>) -> PromptSet {
        let item = |line| PromptItem {
            line,
            text: String::new(),
            ids: vec![1],
            answer: String::new(),
            metadata: Value::Null,
            solution: None,
        };
        let items = (1..=n).map(item).collect();
        PromptSet { path: "p.jsonl".into(), items, dropped: Vec::new(), shuffle, last_order: Mutex::new(None) }
    }

    /// Each epoch reads every prompt once, in an order that depends on the seed and the epoch
    /// alone: not on which positions were asked for before (the cached order), nor on the copy.
    #[test]
    fn each_epoch_is_a_seeded_permutation_whatever_was_read_before() {
        let (a, n) = (set(50, Some(7)), 50u64);
        let epoch = |s: &PromptSet, e: u64| (e * n..(e + 1) * n).map(|p| s.at(p).line).collect::<Vec<_>>();
        let (first, second) = (epoch(&a, 0), epoch(&a, 1));
        let mut sorted = first.clone();
        sorted.sort_unstable();
        assert_eq!(sorted, (1..=50).collect::<Vec<_>>());
        assert_ne!(first, second);
        assert_ne!(first, sorted, "a 50-prompt shuffle left the file order");
        // Out of order, alternating epochs, on a fresh copy: the same prompts.
        let b = a.clone();
        let lines: Vec<usize> = [3, n + 3, 4, 2 * n, n + 4].iter().map(|&p| b.at(p).line).collect();
        assert_eq!(lines, [first[3], second[3], first[4], epoch(&a, 2)[0], second[4]]);
        assert_ne!(epoch(&set(50, Some(8)), 0), first);
        let unshuffled = set(5, None);
        assert_eq!((5..10).map(|p| unshuffled.at(p).line).collect::<Vec<_>>(), [1, 2, 3, 4, 5]);
    }
}
