//! Special tokens from the three files Hugging Face spreads them over: the token strings the
//! chat template writes (`tokenizer_config.json`), and the ids generation stops and pads at
//! (`generation_config.json` first, as `generate` reads them, then `config.json`).

use std::path::Path;

use serde::Serialize;
use serde_json::{Map, Value};

use nereus_core::file_error::FileError;

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
    /// Reads the special tokens of `dir`, whose tokenizer is `tokenizer`.
    pub fn load(dir: &Path, tokenizer: &tokenizers::Tokenizer) -> Result<Self, TextError> {
        let tokenizer_config = read_object(&dir.join("tokenizer_config.json"))?;
        let generation = read_object(&dir.join("generation_config.json"))?;
        let config = read_object(&dir.join("config.json"))?;
        let token = |key: &str| tokenizer_config.as_ref().and_then(|c| token_text(c.get(key)?));
        let (bos_token, mut eos_token, pad_token, unk_token) =
            (token("bos_token"), token("eos_token"), token("pad_token"), token("unk_token"));

        let ids_in = |object: &Option<Map<String, Value>>, key: &str| object.as_ref().and_then(|o| ids(o.get(key)?));
        let by_name = |name: &Option<String>| name.as_deref().and_then(|n| tokenizer.token_to_id(n)).map(|id| vec![id]);
        let eos_ids = ids_in(&generation, "eos_token_id")
            .or_else(|| ids_in(&config, "eos_token_id"))
            .or_else(|| by_name(&eos_token))
            .filter(|ids| !ids.is_empty())
            .ok_or_else(|| TextError::Invalid {
                path: dir.to_path_buf(),
                reason: "no end-of-sequence token: none of generation_config.json, config.json (eos_token_id) \
                         or tokenizer_config.json (eos_token) names one, so generation would never stop"
                    .into(),
            })?;
        if eos_token.is_none() {
            eos_token = tokenizer.id_to_token(eos_ids[0]);
        }
        let pad_id = ids_in(&generation, "pad_token_id")
            .or_else(|| ids_in(&config, "pad_token_id"))
            .or_else(|| by_name(&pad_token))
            .and_then(|ids| ids.first().copied())
            .unwrap_or(eos_ids[0]);
        Ok(Self { bos_token, eos_token, pad_token, unk_token, eos_ids, pad_id })
    }

    /// Whether `id` ends a response.
    pub fn is_eos(&self, id: u32) -> bool {
        self.eos_ids.contains(&id)
    }
}

/// The JSON object in `path`, or `None` when there is no such file.
pub(super) fn read_object(path: &Path) -> Result<Option<Map<String, Value>>, TextError> {
    let text = match std::fs::read_to_string(path) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        other => other.map_err(FileError::on("read", path))?,
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

/// Token ids as configs write them: one id or a list (`null` is none).
fn ids(value: &Value) -> Option<Vec<u32>> {
    let id = |v: &Value| v.as_u64().and_then(|n| u32::try_from(n).ok());
    match value {
        Value::Array(list) => list.iter().map(id).collect(),
        other => id(other).map(|i| vec![i]),
    }
}
