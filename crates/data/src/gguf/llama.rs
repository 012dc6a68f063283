//! A Llama-architecture GGUF file as a Hugging Face model directory's contents: the config,
//! the tensors under transformers' names and shapes (dequantized to f32), and the tokenizer
//! files. llama.cpp's converter stores the query and key projections with each head's rows
//! interleaved for its rotary embedding (pairs of adjacent dimensions); transformers rotates the
//! two halves of each head, so those rows are put back in halves here.

use serde_json::{json, Map, Value};

use nereus_core::config::hf::{config_json, ConfigJsonOptions};
use nereus_core::config::{Dtype, ModelSpec, OutputHead};

use super::tokenizer::{strings, tokenizer_json};
use super::{Gguf, GgufError, GgufValue};

/// One tensor: transformers' name, its shape (slowest first), its values.
pub type HfTensor = (String, Vec<usize>, Vec<f32>);

/// The special-token ids a GGUF file's metadata names (`tokenizer.ggml.*_token_id`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SpecialIds {
    /// Beginning of sequence.
    pub bos: Option<u32>,
    /// End of sequence.
    pub eos: Option<u32>,
    /// Padding.
    pub pad: Option<u32>,
}

/// A model directory's contents, from a GGUF file.
pub struct LlamaImport {
    /// The model.
    pub spec: ModelSpec,
    /// The special tokens (in `config.json` and `generation_config.json`).
    pub special: SpecialIds,
    /// Positions the model was trained for (`llama.context_length`: `max_position_embeddings`).
    pub context: u64,
    /// `tokenizer.json`.
    pub tokenizer: Value,
    /// `tokenizer_config.json` (special tokens and the chat template).
    pub tokenizer_config: Value,
    /// The weights, in transformers' names and shapes.
    pub tensors: Vec<HfTensor>,
}

/// GGUF tensor names (after `blk.N.`) and transformers' (after `model.layers.N.`).
const BLOCK_TENSORS: [(&str, &str); 9] = [
    ("attn_norm.weight", "input_layernorm.weight"),
    ("attn_q.weight", "self_attn.q_proj.weight"),
    ("attn_k.weight", "self_attn.k_proj.weight"),
    ("attn_v.weight", "self_attn.v_proj.weight"),
    ("attn_output.weight", "self_attn.o_proj.weight"),
    ("ffn_norm.weight", "post_attention_layernorm.weight"),
    ("ffn_gate.weight", "mlp.gate_proj.weight"),
    ("ffn_up.weight", "mlp.up_proj.weight"),
    ("ffn_down.weight", "mlp.down_proj.weight"),
];

impl LlamaImport {
    /// The Llama model in `gguf`, its weights stored as `dtype` by whoever writes them.
    pub fn from_gguf(gguf: &Gguf, dtype: Dtype) -> Result<LlamaImport, GgufError> {
        match gguf.text("general.architecture") {
            Some("llama") => {}
            other => {
                let why = format!("architecture `{}`: only `llama` is imported", other.unwrap_or("(none)"));
                return Err(gguf.invalid(why));
            }
        }
        if gguf.tensors.iter().any(|t| t.name == "rope_freqs.weight") || gguf.get("llama.rope.scaling.type").is_some() {
            return Err(gguf.invalid("RoPE scaling (llama3 frequency factors) is not imported"));
        }
        let spec = spec(gguf, dtype)?;
        spec.validate("gguf")
            .map_err(|e| gguf.invalid(format!("its metadata describes no model Nereus builds: {e}")))?;
        // A model trained for no position reads nothing (`max_position_embeddings` = 0).
        let context = match gguf.int("llama.context_length")? {
            n if n >= 1 => n as u64,
            n => {
                return Err(
                    gguf.invalid(format!("metadata `llama.context_length` is {n}: a model reads at least 1 position"))
                )
            }
        };
        let names = tensor_names(&spec);
        check_shapes(gguf, &spec, &names)?;
        let tensors = tensors(gguf, &spec, names)?;
        let (tokenizer, tokenizer_config, [bos, eos, pad]) = tokenizer_files(gguf)?;
        Ok(LlamaImport { spec, special: SpecialIds { bos, eos, pad }, context, tokenizer, tokenizer_config, tensors })
    }

    /// `generation_config.json`: the special-token ids.
    pub fn generation_config(&self) -> Map<String, Value> {
        let SpecialIds { bos, eos, pad } = self.special;
        let named = [("bos_token_id", bos), ("eos_token_id", eos), ("pad_token_id", pad)];
        named.into_iter().filter_map(|(key, id)| id.map(|id| (key.to_string(), json!(id)))).collect()
    }

    /// `config.json`, as the runtime writes a causal LM's.
    pub fn config_json(&self) -> Map<String, Value> {
        let base = self.generation_config();
        let options =
            ConfigJsonOptions { base: Some(&base), max_position_embeddings: self.context, eos_token_id: None };
        config_json(&self.spec, OutputHead::Lm, &options)
    }
}

/// The model's shape from the `llama.*` metadata.
fn spec(gguf: &Gguf, dtype: Dtype) -> Result<ModelSpec, GgufError> {
    let count = |key: &str| -> Result<u32, GgufError> {
        u32::try_from(gguf.int(key)?).map_err(|_| gguf.invalid(format!("metadata `{key}` is out of range")))
    };
    let float = |key: &str, default: f64| match gguf.get(key) {
        Some(GgufValue::Float(x)) => *x,
        _ => default,
    };
    let (hidden, heads) = (count("llama.embedding_length")?, count("llama.attention.head_count")?);
    let head_dim = match gguf.get("llama.rope.dimension_count") {
        Some(GgufValue::Int(d)) => *d as u32,
        _ => hidden / heads.max(1),
    };
    let vocab = match count("llama.vocab_size") {
        Ok(v) => v,
        Err(_) => strings(gguf, "tokenizer.ggml.tokens")?.len() as u32,
    };
    Ok(ModelSpec {
        path: None,
        layers: count("llama.block_count")?,
        hidden,
        heads,
        kv_heads: count("llama.attention.head_count_kv").unwrap_or(heads),
        ffn: count("llama.feed_forward_length")?,
        vocab,
        dtype,
        tie_embeddings: !gguf.tensors.iter().any(|t| t.name == "output.weight"),
        head_dim: Some(head_dim),
        qk_norm: false,
        rope_theta: float("llama.rope.freq_base", 10_000.0),
        rms_norm_eps: float("llama.attention.layer_norm_rms_epsilon", 1e-5),
        rope_scaling: None,
    })
}

/// The GGUF and transformers names of every tensor the model has.
fn tensor_names(spec: &ModelSpec) -> Vec<(String, String)> {
    let mut names = vec![("token_embd.weight".to_string(), "model.embed_tokens.weight".to_string())];
    for layer in 0..spec.layers {
        names.extend(
            BLOCK_TENSORS.iter().map(|(g, h)| (format!("blk.{layer}.{g}"), format!("model.layers.{layer}.{h}"))),
        );
    }
    names.push(("output_norm.weight".into(), "model.norm.weight".into()));
    if !spec.tie_embeddings {
        names.push(("output.weight".into(), "lm_head.weight".into()));
    }
    names
}

/// The shape (slowest first) transformers' tensor `hf_name` has in `spec`'s architecture.
fn expected_shape(spec: &ModelSpec, hf_name: &str) -> Vec<usize> {
    let (hidden, ffn, vocab) = (spec.hidden as usize, spec.ffn as usize, spec.vocab as usize);
    let head_dim = spec.head_dim_or_default() as usize;
    let (q, kv) = (spec.heads as usize * head_dim, spec.kv_heads as usize * head_dim);
    let last = hf_name.rsplit('.').nth(1).unwrap_or_default();
    match last {
        "embed_tokens" | "lm_head" => vec![vocab, hidden],
        "q_proj" => vec![q, hidden],
        "k_proj" | "v_proj" => vec![kv, hidden],
        "o_proj" => vec![hidden, q],
        "gate_proj" | "up_proj" => vec![ffn, hidden],
        "down_proj" => vec![hidden, ffn],
        _ => vec![hidden], // the norms
    }
}

/// An error naming the first tensor whose shape is not the one the architecture in the
/// metadata needs: checked for every tensor before any is dequantized or written.
fn check_shapes(gguf: &Gguf, spec: &ModelSpec, names: &[(String, String)]) -> Result<(), GgufError> {
    for (gguf_name, hf_name) in names {
        let info = gguf.info(gguf_name)?;
        let shape: Vec<usize> = info.dims.iter().rev().map(|&d| d as usize).collect();
        let want = expected_shape(spec, hf_name);
        if shape != want {
            return Err(gguf.invalid(format!(
                "tensor `{gguf_name}` has shape {shape:?}, but the architecture its metadata describes (hidden {}, {} heads of {}, {} KV heads, ffn {}, vocab {}) needs {want:?}",
                spec.hidden,
                spec.heads,
                spec.head_dim_or_default(),
                spec.kv_heads,
                spec.ffn,
                spec.vocab
            )));
        }
    }
    Ok(())
}

/// Every tensor under transformers' name and shape, the query and key rows put back in halves
/// (the shapes already checked).
fn tensors(gguf: &Gguf, spec: &ModelSpec, names: Vec<(String, String)>) -> Result<Vec<HfTensor>, GgufError> {
    let head_dim = spec.head_dim_or_default() as usize;
    names
        .into_iter()
        .map(|(gguf_name, hf_name)| {
            let (dims, mut values) = gguf.tensor(&gguf_name)?;
            let shape: Vec<usize> = dims.iter().rev().map(|&d| d as usize).collect();
            let heads = match () {
                _ if hf_name.ends_with("q_proj.weight") => Some(spec.heads),
                _ if hf_name.ends_with("k_proj.weight") => Some(spec.kv_heads),
                _ => None,
            };
            if let Some(heads) = heads {
                values = halves_from_pairs(&values, heads as usize, head_dim, shape[1]);
            }
            Ok((hf_name, shape, values))
        })
        .collect()
}

/// Rows of a `[heads · head_dim, cols]` projection reordered from llama.cpp's rotary layout
/// (row `2i + j` of a head holds pair `i`, member `j`) to transformers' (row `j · head_dim/2 +
/// i`): the inverse of the permutation llama.cpp's converter applies.
pub fn halves_from_pairs(values: &[f32], heads: usize, head_dim: usize, cols: usize) -> Vec<f32> {
    let half = head_dim / 2;
    let mut out = vec![0.0; values.len()];
    for h in 0..heads {
        for i in 0..half {
            for j in 0..2 {
                let from = (h * head_dim + 2 * i + j) * cols;
                let to = (h * head_dim + j * half + i) * cols;
                out[to..to + cols].copy_from_slice(&values[from..from + cols]);
            }
        }
    }
    out
}

/// `tokenizer.json`, `tokenizer_config.json`, and the BOS, EOS and pad ids.
fn tokenizer_files(gguf: &Gguf) -> Result<(Value, Value, [Option<u32>; 3]), GgufError> {
    let tokenizer = tokenizer_json(gguf)?;
    let tokens = strings(gguf, "tokenizer.ggml.tokens")?;
    // A special id outside the vocabulary is refused, not dropped: the model could never
    // generate it, and dropping it would silently change where generation stops.
    let id = |key: &str| match gguf.get(key) {
        None => Ok(None),
        Some(GgufValue::Int(i)) if (0..tokens.len() as i64).contains(i) => Ok(Some(*i as u32)),
        Some(other) => {
            let shown = if let GgufValue::Int(i) = other { i.to_string() } else { "not an integer".into() };
            Err(gguf.invalid(format!("metadata `{key}` is {shown}, not the id of one of its {} tokens", tokens.len())))
        }
    };
    let ids = [
        id("tokenizer.ggml.bos_token_id")?,
        id("tokenizer.ggml.eos_token_id")?,
        id("tokenizer.ggml.padding_token_id")?,
    ];
    let token = |i: Option<u32>| i.map(|i| json!(tokens[i as usize])).unwrap_or(Value::Null);
    let mut config = json!({
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": token(ids[0]),
        "eos_token": token(ids[1]),
        "pad_token": token(ids[2]),
        "unk_token": token(id("tokenizer.ggml.unknown_token_id")?),
        "add_bos_token": matches!(gguf.get("tokenizer.ggml.add_bos_token"), Some(GgufValue::Bool(true))),
        "clean_up_tokenization_spaces": false,
    });
    if let Some(GgufValue::Text(template)) = gguf.get("tokenizer.chat_template") {
        config["chat_template"] = json!(template);
    }
    Ok((tokenizer, config, ids))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Two heads of 4 dimensions, one column: llama.cpp's interleaved rows go back to halves.
    #[test]
    fn rotary_rows_go_back_to_halves() {
        // HF rows per head: [a0 a1 | b0 b1] (halves); llama.cpp stores [a0 b0 a1 b1].
        let gguf = [0., 10., 1., 11., 20., 30., 21., 31.];
        assert_eq!(halves_from_pairs(&gguf, 2, 4, 1), [0., 1., 10., 11., 20., 21., 30., 31.]);
    }
}
