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
//!
//! Reading deserializes the keys Nereus reads into a struct (`ConfigKeys`; the file's other
//! keys are carried along untouched), each value kept as written beside its typed reading, so
//! that a value of the wrong type is refused by a message naming its key and showing it.

use std::path::Path;

use serde::de::{self, DeserializeOwned, Deserializer};
use serde::Deserialize;
use serde_json::{json, Map, Value};

use super::models::{spec_map, DEFAULT_ROPE_THETA};
use super::{Dtype, ModelSpec, OutputHead, RopeScaling};

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

    /// The transformers class for a causal LM or, with a value head, a one-label sequence
    /// classifier (the critic and reward models).
    pub fn class(self, head: OutputHead) -> String {
        let prefix = match self {
            Family::Llama => "Llama",
            Family::Qwen3 => "Qwen3",
        };
        let kind = match head {
            OutputHead::Lm => "CausalLM",
            OutputHead::Value => "SequenceClassification",
        };
        format!("{prefix}For{kind}")
    }
}

/// What a `config.json` says about its model.
#[derive(Debug, Clone, PartialEq)]
pub struct HfModel {
    /// The architecture as a resolved table (`path` unset; `dtype` the weights' dtype).
    pub spec: ModelSpec,
    /// A value head for a one-label sequence classifier (a value model), else an LM head.
    pub head: OutputHead,
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
    let text = crate::file_error::read_regular_string(&path)
        .map_err(|e| format!("cannot read {CONFIG_JSON}: {}", e.source))?;
    parse_config(&text)
}

/// Parses the text of a `config.json`.
pub fn parse_config(text: &str) -> Result<HfModel, String> {
    let json: Value = serde_json::from_str(text).map_err(|e| format!("{CONFIG_JSON} is not JSON: {e}"))?;
    let Value::Object(obj) = json else { return Err(format!("{CONFIG_JSON} is not a JSON object")) };
    // Every key is read leniently (see `Written`), so any object deserializes; the keys' types
    // are checked below, in a fixed order, by messages that name them.
    let keys = ConfigKeys::deserialize(&obj).map_err(|e| format!("{CONFIG_JSON}: {e}"))?;
    let family = match read(&keys.model_type, "model_type")?.map(String::as_str) {
        Some("llama") => Family::Llama,
        Some("qwen3") => Family::Qwen3,
        Some(other) => return Err(format!("model_type `{other}` is not supported (supported: llama, qwen3)")),
        None => return Err(format!("{CONFIG_JSON} has no model_type")),
    };
    keys.check_unsupported()?;
    let heads = required(&keys.num_attention_heads, "num_attention_heads")?;
    let (rope_theta, rope_scaling) = keys.rope()?;
    let spec = ModelSpec {
        path: None,
        layers: required(&keys.num_hidden_layers, "num_hidden_layers")?,
        hidden: required(&keys.hidden_size, "hidden_size")?,
        heads,
        kv_heads: read(&keys.num_key_value_heads, "num_key_value_heads")?.copied().unwrap_or(heads),
        ffn: required(&keys.intermediate_size, "intermediate_size")?,
        vocab: required(&keys.vocab_size, "vocab_size")?,
        dtype: keys.weights_dtype()?,
        tie_embeddings: read(&keys.tie_word_embeddings, "tie_word_embeddings")?.copied().unwrap_or(false),
        head_dim: read(&keys.head_dim, "head_dim")?.copied(),
        qk_norm: family == Family::Qwen3,
        rope_theta,
        rms_norm_eps: read(&keys.rms_norm_eps, "rms_norm_eps")?.copied().unwrap_or(HF_DEFAULT_RMS_NORM_EPS),
        rope_scaling,
    };
    Ok(HfModel { spec, head: keys.head()?, json: obj })
}

/// The keys of a `config.json` that Nereus reads, named as transformers names them; the file's
/// other keys are ignored here (they stay in [`HfModel::json`]). An absent or `null` key is
/// `None`, and [`parse_config`] fills in transformers' default where it has one.
#[derive(Default, Deserialize)]
#[serde(default)]
struct ConfigKeys {
    /// The family: `llama` or `qwen3`.
    model_type: Key<String>,
    /// The transformers classes; the first says causal LM or sequence classifier.
    architectures: Key<Vec<Value>>,
    /// A sequence classifier's labels (only their count is read) …
    id2label: Key<Map<String, Value>>,
    /// … or, without them, their count.
    num_labels: Key<u64>,
    /// The MLP's activation (`silu` only).
    hidden_act: Key<String>,
    /// Biases and sliding-window attention, which the engine does not implement.
    attention_bias: Key<bool>,
    mlp_bias: Key<bool>,
    use_sliding_window: Key<bool>,
    /// The shapes.
    num_hidden_layers: Key<u32>,
    hidden_size: Key<u32>,
    num_attention_heads: Key<u32>,
    num_key_value_heads: Key<u32>,
    intermediate_size: Key<u32>,
    vocab_size: Key<u32>,
    head_dim: Key<u32>,
    tie_word_embeddings: Key<bool>,
    rms_norm_eps: Key<f64>,
    /// The weights' dtype: `dtype` in newer transformers, `torch_dtype` before.
    dtype: Key<String>,
    torch_dtype: Key<String>,
    /// RoPE as released directories give it: θ and the scaling at the top level …
    rope_theta: Key<f64>,
    rope_scaling: Key<Object<RopeKeys>>,
    /// … or as newer transformers write it: θ and the scaling in one object.
    rope_parameters: Key<Object<RopeKeys>>,
}

/// The keys of `rope_scaling` or `rope_parameters` that Nereus reads.
#[derive(Default, Deserialize)]
#[serde(default)]
struct RopeKeys {
    /// The rule (`default`, `llama3`); older files call it `type`.
    rope_type: Key<String>,
    #[serde(rename = "type")]
    kind: Key<String>,
    /// θ, in `rope_parameters`.
    rope_theta: Key<f64>,
    /// Llama 3.1's parameters.
    factor: Key<f64>,
    low_freq_factor: Key<f64>,
    high_freq_factor: Key<f64>,
    original_max_position_embeddings: Key<u32>,
}

/// One key of a `config.json`: absent (or `null`), or as written.
type Key<T> = Option<Written<T>>;

/// A value as written, and as the type Nereus reads it when it is of that type. A wrong type is
/// not a deserialization error: [`parse_config`] refuses it by [`Written::get`], in its own order
/// of keys, with a message that names the key and shows the value.
struct Written<T> {
    value: Value,
    typed: Option<T>,
}

impl<'de, T: DeserializeOwned> Deserialize<'de> for Written<T> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let value = Value::deserialize(d)?;
        let typed = T::deserialize(&value).ok();
        Ok(Written { value, typed })
    }
}

impl<T: Expected> Written<T> {
    /// The value as a `T`, or why not, naming `key`.
    fn get(&self, key: &str) -> Result<&T, String> {
        self.typed.as_ref().ok_or_else(|| format!("{key} = {} is not {}", self.value, T::WHAT))
    }
}

/// A JSON object read as `T` (a derived struct alone would also take an array, by position).
struct Object<T>(T);

impl<'de, T: DeserializeOwned> Deserialize<'de> for Object<T> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let map = Map::<String, Value>::deserialize(d)?;
        T::deserialize(&map).map(Object).map_err(de::Error::custom)
    }
}

/// What a value read as `Self` must be, as a refusal says it.
trait Expected {
    /// `hidden_size = -1 is not` …
    const WHAT: &'static str;
}

impl Expected for String {
    const WHAT: &'static str = "a string";
}

impl Expected for u32 {
    const WHAT: &'static str = "a count below 2^32";
}

impl Expected for f64 {
    const WHAT: &'static str = "a number";
}

impl Expected for bool {
    const WHAT: &'static str = "true or false";
}

/// The value of `key` when it is present, refused when it is not a `T`.
fn read<'a, T: Expected>(written: &'a Key<T>, key: &str) -> Result<Option<&'a T>, String> {
    written.as_ref().map(|w| w.get(key)).transpose()
}

/// The value of a key the file must give.
fn required<T: Expected + Copy>(written: &Key<T>, key: &str) -> Result<T, String> {
    read(written, key)?.copied().ok_or_else(|| format!("{CONFIG_JSON} has no {key}"))
}

/// `key`'s value in a `config.json` object, unless absent or `null`.
fn present<'a>(obj: &'a Map<String, Value>, key: &str) -> Option<&'a Value> {
    obj.get(key).filter(|v| !v.is_null())
}

impl ConfigKeys {
    /// Features of the families that the engine does not implement.
    fn check_unsupported(&self) -> Result<(), String> {
        if let Some(act) = read(&self.hidden_act, "hidden_act")? {
            if act != "silu" {
                return Err(format!("hidden_act `{act}` is not supported (the engine's MLP is SwiGLU: silu)"));
            }
        }
        for (flag, key, why) in [
            (&self.attention_bias, "attention_bias", "the engine's projections have no bias"),
            (&self.mlp_bias, "mlp_bias", "the engine's projections have no bias"),
            (&self.use_sliding_window, "use_sliding_window", "the engine's attention is full causal attention"),
        ] {
            if read(flag, key)? == Some(&true) {
                return Err(format!("{key} = true is not supported ({why})"));
            }
        }
        Ok(())
    }

    /// The head `architectures` names: a sequence classifier's value head, or a causal LM's.
    fn head(&self) -> Result<OutputHead, String> {
        let Some(list) = &self.architectures else { return Ok(OutputHead::Lm) };
        let first = list.typed.as_ref().and_then(|a| a.first()).and_then(Value::as_str);
        match first {
            Some(class) if class.ends_with("ForCausalLM") => Ok(OutputHead::Lm),
            Some(class) if class.ends_with("ForSequenceClassification") => {
                // Anything but an object of labels or a count of them counts as no label.
                let labels = match (&self.id2label, &self.num_labels) {
                    (Some(Written { typed: Some(m), .. }), _) => m.len() as u64,
                    (_, Some(n)) => n.typed.unwrap_or(0),
                    _ => 2, // transformers' default
                };
                if labels != 1 {
                    return Err(format!(
                        "{class} with {labels} labels: a value model (critic, reward) has one (`num_labels = 1`)"
                    ));
                }
                Ok(OutputHead::Value)
            }
            _ => Err(format!("architectures = {} names no causal LM or sequence classifier", list.value)),
        }
    }

    /// θ and the scaling, from `rope_parameters` (newer transformers) or the top-level keys.
    fn rope(&self) -> Result<(f64, Option<RopeScaling>), String> {
        let (source, theta) = match &self.rope_parameters {
            Some(p) => {
                let inner = p.typed.as_ref().and_then(|Object(r)| r.rope_theta.as_ref());
                (Some(p), inner.or(self.rope_theta.as_ref()))
            }
            None => (self.rope_scaling.as_ref(), self.rope_theta.as_ref()),
        };
        let theta = match theta {
            Some(theta) => *theta.get("rope_theta")?,
            None => DEFAULT_ROPE_THETA,
        };
        let Some(source) = source else { return Ok((theta, None)) };
        let Some(Object(scaling)) = &source.typed else {
            return Err(format!("rope scaling {} is not an object", source.value));
        };
        let kind = read(&scaling.rope_type, "rope_type")?.or(read(&scaling.kind, "type")?);
        match kind.map_or("default", String::as_str) {
            "default" => Ok((theta, None)),
            "llama3" => Ok((theta, Some(scaling.llama3()?))),
            other => Err(format!("rope scaling `{other}` is not supported (supported: default, llama3)")),
        }
    }

    /// The weights' dtype (`float32` when the file gives none, as transformers loads it).
    fn weights_dtype(&self) -> Result<Dtype, String> {
        let name = read(&self.dtype, "dtype")?.or(read(&self.torch_dtype, "torch_dtype")?);
        match name.map(|n| n.trim_start_matches("torch.")) {
            None | Some("float32") => Ok(Dtype::F32),
            Some("bfloat16") => Ok(Dtype::Bf16),
            Some("float16") => Ok(Dtype::F16),
            Some(other) => Err(format!("dtype `{other}` is not supported (float32, bfloat16, float16)")),
        }
    }
}

impl RopeKeys {
    /// Llama 3.1's scaling, every parameter given.
    fn llama3(&self) -> Result<RopeScaling, String> {
        let need = |written: &Key<f64>, key: &str| {
            read(written, key)?.copied().ok_or_else(|| format!("rope scaling `llama3` needs {key}"))
        };
        let (factor, low_freq_factor, high_freq_factor) = (
            need(&self.factor, "factor")?,
            need(&self.low_freq_factor, "low_freq_factor")?,
            need(&self.high_freq_factor, "high_freq_factor")?,
        );
        let original = read(&self.original_max_position_embeddings, "original_max_position_embeddings")?
            .copied()
            .ok_or("rope scaling `llama3` needs original_max_position_embeddings")?;
        Ok(RopeScaling::Llama3 {
            factor,
            low_freq_factor,
            high_freq_factor,
            original_max_position_embeddings: original,
        })
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
/// with a value head), in the form transformers' `from_pretrained` reads.
pub fn config_json(spec: &ModelSpec, head: OutputHead, options: &ConfigJsonOptions) -> Map<String, Value> {
    let family = Family::of(spec);
    let mut out = options.base.cloned().unwrap_or_default();
    let parameters_form = out.get("rope_parameters").is_some_and(|v| !v.is_null());
    for key in OWNED {
        out.remove(key);
    }
    out.insert("architectures".into(), json!([family.class(head)]));
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
    if head == OutputHead::Value {
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
