//! Hugging Face's `config.json` in `[models.<role>]` terms, both ways: what a model directory's
//! `config.json` says about the architecture ([`parse_config`]), and the `config.json` and
//! `generation_config.json` that `from_pretrained` needs to rebuild a model ([`config_json`],
//! [`generation_config_json`]). One table ([`KEYS`]) maps the job's keys to Hugging Face's, so
//! reading, writing and the messages about disagreements use the same names.
//!
//! Two families are understood: Llama (`model_type = "llama"`: Llama 2, 3, 3.1, 3.2, 3.3) and
//! Qwen3 (`"qwen3"`: Llama's block plus a per-head RMSNorm of queries and keys). RoPE comes as
//! the top-level `rope_theta`/`rope_scaling` of released directories or as the
//! `rope_parameters` object newer transformers versions write; the scaling may be none
//! (`default`) or Llama 3.1's `llama3`.

use std::path::Path;

use serde_json::{json, Map, Value};

use super::models::{spec_map, DEFAULT_ROPE_THETA};
use super::{Dtype, ModelSpec, RopeScaling};

/// The architecture file of a model directory.
pub const CONFIG_JSON: &str = "config.json";

/// The generation defaults of a model directory.
pub const GENERATION_CONFIG_JSON: &str = "generation_config.json";

/// Hugging Face's ε when `rms_norm_eps` is absent (`LlamaConfig`, `Qwen3Config`).
const HF_DEFAULT_RMS_NORM_EPS: f64 = 1e-6;

/// The job's architecture keys and the `config.json` keys that carry them (`qk_norm` is the
/// family, so its key is `model_type`).
pub const KEYS: [(&str, &str); 12] = [
    ("layers", "num_hidden_layers"),
    ("hidden", "hidden_size"),
    ("heads", "num_attention_heads"),
    ("kv_heads", "num_key_value_heads"),
    ("ffn", "intermediate_size"),
    ("vocab", "vocab_size"),
    ("tie_embeddings", "tie_word_embeddings"),
    ("head_dim", "head_dim"),
    ("qk_norm", "model_type"),
    ("rope_theta", "rope_theta"),
    ("rms_norm_eps", "rms_norm_eps"),
    ("rope_scaling", "rope_scaling"),
];

/// `config.json` keys [`config_json`] writes itself; a source directory's values for them are
/// replaced, every other key of the source is kept.
const OWNED: [&str; 22] = [
    "architectures",
    "model_type",
    "hidden_size",
    "intermediate_size",
    "num_attention_heads",
    "num_hidden_layers",
    "num_key_value_heads",
    "head_dim",
    "vocab_size",
    "rms_norm_eps",
    "tie_word_embeddings",
    "rope_theta",
    "rope_scaling",
    "rope_parameters",
    "torch_dtype",
    "dtype",
    "hidden_act",
    "attention_bias",
    "mlp_bias",
    "id2label",
    "label2id",
    "num_labels",
];

/// A model family the engine implements.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Family {
    /// Llama 2/3 (`LlamaForCausalLM`, `LlamaForSequenceClassification`).
    Llama,
    /// Qwen3 (`Qwen3ForCausalLM`, `Qwen3ForSequenceClassification`): Llama plus QK-norm.
    Qwen3,
}

impl Family {
    /// The family of a resolved table: QK-norm makes it Qwen3.
    pub fn of(spec: &ModelSpec) -> Family {
        if spec.qk_norm {
            Family::Qwen3
        } else {
            Family::Llama
        }
    }

    /// `model_type` in `config.json`.
    pub fn model_type(self) -> &'static str {
        match self {
            Family::Llama => "llama",
            Family::Qwen3 => "qwen3",
        }
    }

    /// The transformers class for a causal LM or, with `value_head`, a one-label sequence
    /// classifier (the critic and reward models).
    pub fn class(self, value_head: bool) -> String {
        let prefix = match self {
            Family::Llama => "Llama",
            Family::Qwen3 => "Qwen3",
        };
        format!("{prefix}For{}", if value_head { "SequenceClassification" } else { "CausalLM" })
    }
}

/// What a `config.json` says about its model.
#[derive(Debug, Clone, PartialEq)]
pub struct HfModel {
    /// The architecture as a resolved table (`path` unset; `dtype` the weights' dtype).
    pub spec: ModelSpec,
    /// Whether the model is a one-label sequence classifier (a value model) rather than a
    /// causal LM.
    pub value_head: bool,
    /// The whole `config.json` object (keys the engine does not use are carried through when a
    /// checkpoint writes the model back).
    pub json: Map<String, Value>,
}

/// Reads and parses `dir/config.json`; the reason names the file's problem.
pub fn read_model_config(dir: &Path) -> Result<HfModel, String> {
    if !dir.is_dir() {
        return Err("not a directory (a Hugging Face model directory holds config.json and *.safetensors)".into());
    }
    let path = dir.join(CONFIG_JSON);
    let text = std::fs::read_to_string(&path).map_err(|e| format!("cannot read {CONFIG_JSON}: {e}"))?;
    parse_config(&text)
}

/// Parses the text of a `config.json`.
pub fn parse_config(text: &str) -> Result<HfModel, String> {
    let json: Value = serde_json::from_str(text).map_err(|e| format!("{CONFIG_JSON} is not JSON: {e}"))?;
    let Value::Object(obj) = json else { return Err(format!("{CONFIG_JSON} is not a JSON object")) };
    let family = match text_of(&obj, "model_type")? {
        Some("llama") => Family::Llama,
        Some("qwen3") => Family::Qwen3,
        Some(other) => return Err(format!("model_type `{other}` is not supported (supported: llama, qwen3)")),
        None => return Err(format!("{CONFIG_JSON} has no model_type")),
    };
    check_unsupported(&obj)?;
    let heads = count(&obj, "num_attention_heads")?;
    let (rope_theta, rope_scaling) = rope(&obj)?;
    let spec = ModelSpec {
        path: None,
        layers: count(&obj, "num_hidden_layers")?,
        hidden: count(&obj, "hidden_size")?,
        heads,
        kv_heads: optional_count(&obj, "num_key_value_heads")?.unwrap_or(heads),
        ffn: count(&obj, "intermediate_size")?,
        vocab: count(&obj, "vocab_size")?,
        dtype: dtype(&obj)?,
        tie_embeddings: flag(&obj, "tie_word_embeddings")?.unwrap_or(false),
        head_dim: optional_count(&obj, "head_dim")?,
        qk_norm: family == Family::Qwen3,
        rope_theta,
        rms_norm_eps: number(&obj, "rms_norm_eps")?.unwrap_or(HF_DEFAULT_RMS_NORM_EPS),
        rope_scaling,
    };
    Ok(HfModel { spec, value_head: value_head(&obj)?, json: obj })
}

fn present<'a>(obj: &'a Map<String, Value>, key: &str) -> Option<&'a Value> {
    obj.get(key).filter(|v| !v.is_null())
}

fn text_of<'a>(obj: &'a Map<String, Value>, key: &str) -> Result<Option<&'a str>, String> {
    present(obj, key).map(|v| v.as_str().ok_or_else(|| format!("{key} = {v} is not a string"))).transpose()
}

fn optional_count(obj: &Map<String, Value>, key: &str) -> Result<Option<u32>, String> {
    present(obj, key)
        .map(|v| {
            v.as_u64()
                .and_then(|n| u32::try_from(n).ok())
                .ok_or_else(|| format!("{key} = {v} is not a count below 2^32"))
        })
        .transpose()
}

fn count(obj: &Map<String, Value>, key: &str) -> Result<u32, String> {
    optional_count(obj, key)?.ok_or_else(|| format!("{CONFIG_JSON} has no {key}"))
}

fn number(obj: &Map<String, Value>, key: &str) -> Result<Option<f64>, String> {
    present(obj, key).map(|v| v.as_f64().ok_or_else(|| format!("{key} = {v} is not a number"))).transpose()
}

fn flag(obj: &Map<String, Value>, key: &str) -> Result<Option<bool>, String> {
    present(obj, key).map(|v| v.as_bool().ok_or_else(|| format!("{key} = {v} is not true or false"))).transpose()
}

/// Features of the families that the engine does not implement.
fn check_unsupported(obj: &Map<String, Value>) -> Result<(), String> {
    if let Some(act) = text_of(obj, "hidden_act")? {
        if act != "silu" {
            return Err(format!("hidden_act `{act}` is not supported (the engine's MLP is SwiGLU: silu)"));
        }
    }
    for (key, why) in [
        ("attention_bias", "the engine's projections have no bias"),
        ("mlp_bias", "the engine's projections have no bias"),
        ("use_sliding_window", "the engine's attention is full causal attention"),
    ] {
        if flag(obj, key)? == Some(true) {
            return Err(format!("{key} = true is not supported ({why})"));
        }
    }
    Ok(())
}

/// Whether `architectures` names a sequence classifier (a value model) or a causal LM.
fn value_head(obj: &Map<String, Value>) -> Result<bool, String> {
    let Some(list) = present(obj, "architectures") else { return Ok(false) };
    let first = list.as_array().and_then(|a| a.first()).and_then(Value::as_str);
    match first {
        Some(class) if class.ends_with("ForCausalLM") => Ok(false),
        Some(class) if class.ends_with("ForSequenceClassification") => {
            let labels = match (present(obj, "id2label"), present(obj, "num_labels")) {
                (Some(Value::Object(m)), _) => m.len() as u64,
                (_, Some(n)) => n.as_u64().unwrap_or(0),
                _ => 2, // transformers' default
            };
            if labels != 1 {
                return Err(format!(
                    "{class} with {labels} labels: a value model (critic, reward) has one (`num_labels = 1`)"
                ));
            }
            Ok(true)
        }
        _ => Err(format!("architectures = {list} names no causal LM or sequence classifier")),
    }
}

/// θ and the scaling, from `rope_parameters` (newer transformers) or the top-level keys.
fn rope(obj: &Map<String, Value>) -> Result<(f64, Option<RopeScaling>), String> {
    let (source, theta) = match present(obj, "rope_parameters") {
        Some(p) => (Some(p), p.get("rope_theta").filter(|v| !v.is_null()).or(present(obj, "rope_theta"))),
        None => (present(obj, "rope_scaling"), present(obj, "rope_theta")),
    };
    let theta = match theta {
        Some(v) => v.as_f64().ok_or_else(|| format!("rope_theta = {v} is not a number"))?,
        None => DEFAULT_ROPE_THETA,
    };
    let Some(Value::Object(s)) = source else {
        return match source {
            None => Ok((theta, None)),
            Some(v) => Err(format!("rope scaling {v} is not an object")),
        };
    };
    let kind = text_of(s, "rope_type")?.or(text_of(s, "type")?).unwrap_or("default");
    match kind {
        "default" => Ok((theta, None)),
        "llama3" => {
            let need = |k: &str| number(s, k)?.ok_or_else(|| format!("rope scaling `llama3` needs {k}"));
            let (factor, low_freq_factor, high_freq_factor) =
                (need("factor")?, need("low_freq_factor")?, need("high_freq_factor")?);
            let original = optional_count(s, "original_max_position_embeddings")?
                .ok_or("rope scaling `llama3` needs original_max_position_embeddings")?;
            let scaling = RopeScaling::Llama3 {
                factor,
                low_freq_factor,
                high_freq_factor,
                original_max_position_embeddings: original,
            };
            Ok((theta, Some(scaling)))
        }
        other => Err(format!("rope scaling `{other}` is not supported (supported: default, llama3)")),
    }
}

fn dtype(obj: &Map<String, Value>) -> Result<Dtype, String> {
    let name = text_of(obj, "dtype")?.or(text_of(obj, "torch_dtype")?);
    match name.map(|n| n.trim_start_matches("torch.")) {
        None | Some("float32") => Ok(Dtype::F32),
        Some("bfloat16") => Ok(Dtype::Bf16),
        Some("float16") => Ok(Dtype::F16),
        Some(other) => Err(format!("dtype `{other}` is not supported (float32, bfloat16, float16)")),
    }
}

/// The name of a dtype in `config.json` (`torch_dtype`, `dtype`).
pub fn hf_dtype_name(dtype: Dtype) -> &'static str {
    match dtype {
        Dtype::F32 => "float32",
        Dtype::Bf16 => "bfloat16",
        Dtype::F16 => "float16",
    }
}

/// One key on which a job's table and a `config.json` disagree.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Disagreement {
    /// The job's key (`hidden`).
    pub key: &'static str,
    /// The `config.json` key (`hidden_size`).
    pub hf_key: &'static str,
    /// The job's value, as JSON.
    pub ours: String,
    /// The `config.json` value, as JSON.
    pub theirs: String,
}

/// The first architecture key set in `ours` (a table as a JSON object: written keys only, or a
/// whole resolved table) whose value differs from `theirs`; `path` and `dtype` are not
/// architecture keys. `head_dim` compares the widths in effect (`hidden / heads` when unset).
pub fn disagreement(ours: &Map<String, Value>, theirs: &ModelSpec) -> Option<Disagreement> {
    let their_map = spec_map(theirs);
    KEYS.iter().find_map(|&(key, hf_key)| {
        let mine = ours.get(key).filter(|v| !v.is_null())?;
        let theirs_value = match key {
            "head_dim" => json!(theirs.head_dim_or_default()),
            _ => their_map.get(key).cloned().unwrap_or(Value::Null),
        };
        if *mine == theirs_value {
            return None;
        }
        let shown = match key {
            "qk_norm" => json!(Family::of(theirs).model_type()).to_string(),
            _ if theirs_value.is_null() => "none".into(),
            _ => theirs_value.to_string(),
        };
        Some(Disagreement { key, hf_key, ours: mine.to_string(), theirs: shown })
    })
}

/// What [`config_json`] needs besides the table.
#[derive(Debug, Clone, Default)]
pub struct ConfigJsonOptions<'a> {
    /// The `config.json` of the directory the model was loaded from: its other keys
    /// (`bos_token_id`, `max_position_embeddings`, …) are kept, and its RoPE form.
    pub base: Option<&'a Map<String, Value>>,
    /// `max_position_embeddings` when the base has none.
    pub max_position_embeddings: u64,
    /// `eos_token_id` when the base has none.
    pub eos_token_id: Option<u32>,
}

/// The `config.json` of a model directory holding the model `spec` describes (a value model
/// with `value_head`), in the form transformers' `from_pretrained` reads.
pub fn config_json(spec: &ModelSpec, value_head: bool, options: &ConfigJsonOptions) -> Map<String, Value> {
    let family = Family::of(spec);
    let mut out = options.base.cloned().unwrap_or_default();
    let parameters_form = out.get("rope_parameters").is_some_and(|v| !v.is_null());
    for key in OWNED {
        out.remove(key);
    }
    out.insert("architectures".into(), json!([family.class(value_head)]));
    out.insert("model_type".into(), json!(family.model_type()));
    for (key, value) in [
        ("hidden_size", spec.hidden),
        ("intermediate_size", spec.ffn),
        ("num_attention_heads", spec.heads),
        ("num_hidden_layers", spec.layers),
        ("num_key_value_heads", spec.kv_heads),
        ("head_dim", spec.head_dim_or_default()),
        ("vocab_size", spec.vocab),
    ] {
        out.insert(key.into(), json!(value));
    }
    out.insert("rms_norm_eps".into(), json!(spec.rms_norm_eps));
    out.insert("tie_word_embeddings".into(), json!(spec.tie_embeddings));
    let scaling = spec.rope_scaling.map(|RopeScaling::Llama3 { factor, low_freq_factor, high_freq_factor, original_max_position_embeddings }| {
        json!({"rope_type": "llama3", "factor": factor, "low_freq_factor": low_freq_factor, "high_freq_factor": high_freq_factor, "original_max_position_embeddings": original_max_position_embeddings})
    });
    if parameters_form {
        let mut p = scaling.unwrap_or_else(|| json!({"rope_type": "default"}));
        p["rope_theta"] = json!(spec.rope_theta);
        out.insert("rope_parameters".into(), p);
    } else {
        out.insert("rope_theta".into(), json!(spec.rope_theta));
        out.insert("rope_scaling".into(), scaling.unwrap_or(Value::Null));
    }
    out.insert("torch_dtype".into(), json!(hf_dtype_name(spec.dtype)));
    out.insert("dtype".into(), json!(hf_dtype_name(spec.dtype)));
    out.insert("hidden_act".into(), json!("silu"));
    out.insert("attention_bias".into(), json!(false));
    if family == Family::Llama {
        out.insert("mlp_bias".into(), json!(false));
    }
    out.entry("max_position_embeddings").or_insert(json!(options.max_position_embeddings));
    if let Some(eos) = options.eos_token_id {
        out.entry("eos_token_id").or_insert(json!(eos));
    }
    if value_head {
        out.insert("id2label".into(), json!({"0": "LABEL_0"}));
        out.insert("label2id".into(), json!({"LABEL_0": 0}));
        // Sequence classifiers find each sequence's last token through the pad token.
        let pad = out.get("eos_token_id").and_then(|e| e.as_array().and_then(|a| a.first()).or(Some(e))).cloned();
        out.entry("pad_token_id").or_insert(pad.unwrap_or(json!(0)));
    }
    out
}

/// A `generation_config.json` for a model whose `config.json` is `config`: its BOS, EOS and
/// pad tokens, and the job's sampling.
pub fn generation_config_json(config: &Map<String, Value>, temperature: f64, top_p: f64) -> Value {
    let mut out = Map::new();
    for key in ["bos_token_id", "eos_token_id", "pad_token_id"] {
        if let Some(v) = present(config, key) {
            out.insert(key.into(), v.clone());
        }
    }
    out.insert("do_sample".into(), json!(true));
    out.insert("temperature".into(), json!(temperature));
    out.insert("top_p".into(), json!(top_p));
    Value::Object(out)
}

#[cfg(test)]
mod tests;
