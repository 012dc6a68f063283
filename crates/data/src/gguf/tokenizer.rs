//! A `tokenizers` file (`tokenizer.json`) from a GGUF file's GPT-2-style vocabulary: the tokens
//! by id, the merges, the control tokens as special added tokens, and the pre-tokenizer the file
//! names (`tokenizer.ggml.pre`).

use serde_json::{json, Map, Value};

use super::{Gguf, GgufError, GgufValue};

/// ggml's token types (`tokenizer.ggml.token_type`) that are special added tokens: control
/// and user-defined.
const SPECIAL_TYPES: [i64; 2] = [3, 4];

/// The strings of the array at `key`.
pub(super) fn strings<'a>(gguf: &'a Gguf, key: &str) -> Result<Vec<&'a str>, GgufError> {
    let Some(GgufValue::Array(items)) = gguf.get(key) else {
        return Err(gguf.invalid(format!("no string array `{key}`")));
    };
    items
        .iter()
        .map(|v| match v {
            GgufValue::Text(s) => Ok(s.as_str()),
            _ => Err(gguf.invalid(format!("`{key}` holds a value that is not a string"))),
        })
        .collect()
}

/// The pre-tokenizer of a byte-level BPE vocabulary, by llama.cpp's name for it.
fn pre_tokenizer(gguf: &Gguf) -> Result<Value, GgufError> {
    let byte_level = |prefix: bool| json!({"type": "ByteLevel", "add_prefix_space": prefix, "trim_offsets": true, "use_regex": true});
    let prefix = matches!(gguf.get("tokenizer.ggml.add_space_prefix"), Some(GgufValue::Bool(true)));
    match gguf.text("tokenizer.ggml.pre") {
        None | Some("gpt2" | "default") => Ok(byte_level(prefix)),
        // SmolLM's: every digit a word of its own, then GPT-2's split.
        Some("smollm") => Ok(json!({"type": "Sequence", "pretokenizers": [
            {"type": "Digits", "individual_digits": true}, byte_level(prefix)]})),
        Some(other) => Err(gguf.invalid(format!("pre-tokenizer `{other}` is not imported (gpt2 and smollm are)"))),
    }
}

/// The `tokenizer.json` of `gguf`'s vocabulary (`tokenizer.ggml.model = "gpt2"`).
pub(super) fn tokenizer_json(gguf: &Gguf) -> Result<Value, GgufError> {
    if gguf.text("tokenizer.ggml.model") != Some("gpt2") {
        let model = gguf.text("tokenizer.ggml.model").unwrap_or("(none)");
        return Err(gguf.invalid(format!("tokenizer model `{model}` is not imported (gpt2, byte-level BPE, is)")));
    }
    let tokens = strings(gguf, "tokenizer.ggml.tokens")?;
    let merges = strings(gguf, "tokenizer.ggml.merges")?;
    let types: Vec<i64> = match gguf.get("tokenizer.ggml.token_type") {
        Some(GgufValue::Array(t)) => t.iter().map(|v| if let GgufValue::Int(i) = v { *i } else { 1 }).collect(),
        _ => vec![1; tokens.len()],
    };
    let vocab: Map<String, Value> = tokens.iter().enumerate().map(|(id, t)| (t.to_string(), json!(id))).collect();
    if vocab.len() != tokens.len() {
        return Err(gguf.invalid("`tokenizer.ggml.tokens` repeats a token"));
    }
    let added: Vec<Value> = tokens
        .iter()
        .zip(&types)
        .enumerate()
        .filter(|(_, (_, kind))| SPECIAL_TYPES.contains(kind))
        .map(|(id, (t, _))| {
            json!({"id": id, "content": t, "single_word": false, "lstrip": false, "rstrip": false,
                   "normalized": false, "special": true})
        })
        .collect();
    Ok(json!({
        "version": "1.0",
        "truncation": null,
        "padding": null,
        "added_tokens": added,
        "normalizer": null,
        "pre_tokenizer": pre_tokenizer(gguf)?,
        "post_processor": {"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": false, "use_regex": false},
        "decoder": {"type": "ByteLevel", "add_prefix_space": true, "trim_offsets": true, "use_regex": true},
        "model": {"type": "BPE", "dropout": null, "unk_token": null, "continuing_subword_prefix": null,
                  "end_of_word_suffix": null, "fuse_unk": false, "byte_fallback": false, "ignore_merges": false,
                  "vocab": vocab, "merges": merges},
    }))
}
