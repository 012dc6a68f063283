//! Special tokens from the three files Hugging Face spreads them over: the token strings the
//! chat template writes (`tokenizer_config.json`), and the ids generation stops and pads at
//! (`generation_config.json` first, as `generate` reads them, then `config.json`).

use std::path::{Path, PathBuf};

use serde::Serialize;
use serde_json::{Map, Value};

use nereus_core::file_error::read_regular_string;

use super::TextError;

/// The special tokens of a model directory.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct SpecialTokens {
    /// The beginning-of-sequence token as the template writes it, if the model has one.
    pub bos_token: Option<String>,
    /// The end-of-sequence token as the template writes it.
    pub eos_token: Option<String>,
    /// The padding token's text, if named.
    pub pad_token: Option<String>,
    /// The unknown token's text, if named.
    pub unk_token: Option<String>,
    /// Generation stops at any of these ids (Llama 3 and Qwen have several).
    pub eos_ids: Vec<u32>,
    /// The id sequences are padded with after they stop.
    pub pad_id: u32,
}

impl SpecialTokens {
    /// Reads the special tokens of `dir`, whose tokenizer is `tokenizer`. Every id and token
    /// the three files name must be one of the tokenizer's (so one the model can embed and
    /// generate, once the tokenizer fits the embedding): an id that is not is refused with its
    /// file, key and value, never replaced by another file's.
    pub fn load(dir: &Path, tokenizer: &tokenizers::Tokenizer) -> Result<Self, TextError> {
        let files = ["tokenizer_config.json", "generation_config.json", "config.json"]
            .map(|name| read_object(&dir.join(name)).map(|o| o.map(|o| (dir.join(name), o))));
        let [tokenizer_config, generation, config] = files;
        let (tokenizer_config, generation, config) = (tokenizer_config?, generation?, config?);
        let space = tokenizer.get_vocab(true).values().max().map_or(0, |&m| m as usize + 1);
        let named = |key: &str| named_token(&tokenizer_config, key, tokenizer);
        let (bos_token, mut eos_token, pad_token) = (named("bos_token")?, named("eos_token")?, named("pad_token")?);
        let unk_token = tokenizer_config.as_ref().and_then(|(_, c)| token_text(c.get("unk_token")?));
        // generate() reads generation_config.json first, then config.json.
        let first = |key: &str| -> Result<Option<Vec<u32>>, TextError> {
            Ok(match ids_at(&generation, key, space)? {
                Some(ids) => Some(ids),
                None => ids_at(&config, key, space)?,
            })
        };
        first("bos_token_id")?;
        let by_name = |token: &Option<(String, u32)>| token.as_ref().map(|(_, id)| vec![*id]);
        let eos_ids = first("eos_token_id")?.or_else(|| by_name(&eos_token)).ok_or_else(|| TextError::Invalid {
            path: dir.to_path_buf(),
            reason: "no end-of-sequence token: none of generation_config.json, config.json (eos_token_id) \
                     or tokenizer_config.json (eos_token) names one, so generation would never stop"
                .into(),
        })?;
        if eos_token.is_none() {
            eos_token = tokenizer.id_to_token(eos_ids[0]).map(|text| (text, eos_ids[0]));
        }
        let pad_id = first("pad_token_id")?.or_else(|| by_name(&pad_token)).map_or(eos_ids[0], |ids| ids[0]);
        let text = |token: Option<(String, u32)>| token.map(|(text, _)| text);
        Ok(Self {
            bos_token: text(bos_token),
            eos_token: text(eos_token),
            pad_token: text(pad_token),
            unk_token,
            eos_ids,
            pad_id,
        })
    }

    /// Whether `id` ends a response.
    pub fn is_eos(&self, id: u32) -> bool {
        self.eos_ids.contains(&id)
    }
}

/// A JSON file's path and object, when the file exists.
type JsonFile = Option<(PathBuf, Map<String, Value>)>;

/// The token `tokenizer_config.json` names at `key` and its id; an error naming the file when
/// the tokenizer has no such token.
fn named_token(
    file: &JsonFile,
    key: &str,
    tokenizer: &tokenizers::Tokenizer,
) -> Result<Option<(String, u32)>, TextError> {
    let Some((path, object)) = file else { return Ok(None) };
    let Some(text) = object.get(key).and_then(token_text) else { return Ok(None) };
    match tokenizer.token_to_id(&text) {
        Some(id) => Ok(Some((text, id))),
        None => Err(TextError::Invalid {
            path: path.clone(),
            reason: format!("`{key}` is {text:?}, which is not a token of tokenizer.json"),
        }),
    }
}

/// The ids at `key` of a JSON file (one id or a non-empty list; absent or `null`: none), each
/// below `space`, the tokenizer's id count; anything else is an error naming the file, the key
/// and the value.
fn ids_at(file: &JsonFile, key: &str, space: usize) -> Result<Option<Vec<u32>>, TextError> {
    let Some((path, object)) = file else { return Ok(None) };
    let value = match object.get(key) {
        None | Some(Value::Null) => return Ok(None),
        Some(value) => value,
    };
    let bad = |why: String| TextError::Invalid { path: path.clone(), reason: format!("`{key}` is {value}: {why}") };
    let id = |v: &Value| match v.as_u64() {
        Some(n) if (n as usize) < space => Ok(n as u32),
        Some(n) => Err(bad(format!(
            "{n} is not one of tokenizer.json's ids (0 to {}), so the model could never read or generate it",
            space.saturating_sub(1)
        ))),
        None => Err(bad("a token id is a whole number from 0".into())),
    };
    match value {
        Value::Array(list) if list.is_empty() => Err(bad("an empty list names no token".into())),
        Value::Array(list) => list.iter().map(id).collect::<Result<_, _>>().map(Some),
        other => id(other).map(|i| Some(vec![i])),
    }
}

/// The JSON object in `path`, or `None` when there is no such file.
pub(super) fn read_object(path: &Path) -> Result<Option<Map<String, Value>>, TextError> {
    let text = match read_regular_string(path) {
        Err(e) if e.source.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        other => other?,
    };
    let invalid = |reason: String| TextError::Invalid { path: path.to_path_buf(), reason };
    match serde_json::from_str(&text).map_err(|e| invalid(format!("not JSON: {e}")))? {
        Value::Object(object) => Ok(Some(object)),
        _ => Err(invalid("not a JSON object".into())),
    }
}

/// A token as `tokenizer_config.json` writes it: a string, or an added-token object's `content`.
fn token_text(value: &Value) -> Option<String> {
    match value {
        Value::String(s) => Some(s.clone()),
        Value::Object(o) => o.get("content")?.as_str().map(str::to_string),
        _ => None,
    }
}
