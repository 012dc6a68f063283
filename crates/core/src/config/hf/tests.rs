use super::*;
use crate::config::RawModelSpec;
use std::path::Path;

/// `meta-llama/Llama-3.1-8B`'s config.json as released (top-level `rope_theta`/`rope_scaling`).
const LLAMA_3_1_8B: &str = r#"{
  "architectures": ["LlamaForCausalLM"], "attention_bias": false, "attention_dropout": 0.0,
  "bos_token_id": 128000, "eos_token_id": 128001, "hidden_act": "silu", "hidden_size": 4096,
  "initializer_range": 0.02, "intermediate_size": 14336, "max_position_embeddings": 131072,
  "mlp_bias": false, "model_type": "llama", "num_attention_heads": 32, "num_hidden_layers": 32,
  "num_key_value_heads": 8, "pretraining_tp": 1, "rms_norm_eps": 1e-05,
  "rope_scaling": {"factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                   "original_max_position_embeddings": 8192, "rope_type": "llama3"},
  "rope_theta": 500000.0, "tie_word_embeddings": false, "torch_dtype": "bfloat16",
  "transformers_version": "4.43.0.dev0", "use_cache": true, "vocab_size": 128256
}"#;

/// `Qwen/Qwen3-0.6B`'s config.json as released (QK-norm, head_dim 128, tied embeddings).
const QWEN3_0_6B: &str = r#"{
  "architectures": ["Qwen3ForCausalLM"], "attention_bias": false, "attention_dropout": 0.0,
  "bos_token_id": 151643, "eos_token_id": 151645, "head_dim": 128, "hidden_act": "silu",
  "hidden_size": 1024, "initializer_range": 0.02, "intermediate_size": 3072,
  "max_position_embeddings": 40960, "max_window_layers": 28, "model_type": "qwen3",
  "num_attention_heads": 16, "num_hidden_layers": 28, "num_key_value_heads": 8,
  "rms_norm_eps": 1e-06, "rope_scaling": null, "rope_theta": 1000000, "sliding_window": null,
  "tie_word_embeddings": true, "torch_dtype": "bfloat16", "transformers_version": "4.51.0",
  "use_cache": true, "use_sliding_window": false, "vocab_size": 151936
}"#;

fn llama3_scaling() -> RopeScaling {
    RopeScaling::Llama3 {
        factor: 8.0,
        low_freq_factor: 1.0,
        high_freq_factor: 4.0,
        original_max_position_embeddings: 8192,
    }
}

#[test]
fn released_llama_and_qwen3_configs_read_as_their_published_architectures() {
    let llama = parse_config(LLAMA_3_1_8B).unwrap();
    let s = &llama.spec;
    assert_eq!((s.layers, s.hidden, s.heads, s.kv_heads, s.ffn, s.vocab), (32, 4096, 32, 8, 14_336, 128_256));
    assert_eq!((s.rope_theta, s.rms_norm_eps, s.rope_scaling), (500_000.0, 1e-5, Some(llama3_scaling())));
    assert_eq!(
        (s.dtype, s.tie_embeddings, s.qk_norm, s.head_dim, llama.head),
        (Dtype::Bf16, false, false, None, OutputHead::Lm)
    );
    let qwen = parse_config(QWEN3_0_6B).unwrap();
    let s = &qwen.spec;
    assert_eq!((s.layers, s.hidden, s.heads, s.kv_heads, s.head_dim), (28, 1024, 16, 8, Some(128)));
    assert_eq!(
        (s.rope_theta, s.rms_norm_eps, s.rope_scaling, s.tie_embeddings, s.qk_norm),
        (1e6, 1e-6, None, true, true)
    );
}

#[test]
fn the_rope_parameters_object_of_newer_transformers_reads_the_same() {
    let mut v: Value = serde_json::from_str(LLAMA_3_1_8B).unwrap();
    let obj = v.as_object_mut().unwrap();
    let mut params = obj.remove("rope_scaling").unwrap();
    params["rope_theta"] = obj.remove("rope_theta").unwrap();
    obj.insert("rope_parameters".into(), params);
    let dtype = obj.remove("torch_dtype").unwrap();
    obj.insert("dtype".into(), dtype);
    let newer = parse_config(&v.to_string()).unwrap();
    assert_eq!(newer.spec, parse_config(LLAMA_3_1_8B).unwrap().spec);
    let default = r#"{"model_type": "llama", "hidden_size": 8, "num_hidden_layers": 1, "num_attention_heads": 2,
        "intermediate_size": 16, "vocab_size": 8, "rope_parameters": {"rope_type": "default", "rope_theta": 20000.0}}"#;
    let d = parse_config(default).unwrap().spec;
    assert_eq!(
        (d.rope_theta, d.rope_scaling, d.kv_heads, d.rms_norm_eps, d.dtype),
        (20_000.0, None, 2, 1e-6, Dtype::F32)
    );
}

#[test]
fn what_the_engine_does_not_implement_is_refused_by_name() {
    let edit = |key: &str, value: Value| {
        let mut v: Value = serde_json::from_str(LLAMA_3_1_8B).unwrap();
        v[key] = value;
        parse_config(&v.to_string()).unwrap_err()
    };
    assert!(edit("model_type", json!("mistral")).contains("model_type `mistral` is not supported"));
    assert!(edit("attention_bias", json!(true)).contains("attention_bias = true"));
    assert!(edit("hidden_act", json!("gelu")).contains("hidden_act `gelu`"));
    assert!(edit("rope_scaling", json!({"rope_type": "yarn", "factor": 4.0})).contains("`yarn` is not supported"));
    assert!(edit("rope_scaling", json!({"rope_type": "llama3", "factor": 8.0})).contains("needs low_freq_factor"));
    assert!(edit("architectures", json!(["LlamaForSequenceClassification"])).contains("with 2 labels"));
    assert!(edit("hidden_size", json!(-1)).contains("hidden_size = -1 is not a count"));
    assert!(parse_config("{").unwrap_err().contains("not JSON"));
}

#[test]
fn a_written_config_reads_back_as_the_same_architecture_and_keeps_the_source_keys() {
    let llama = parse_config(LLAMA_3_1_8B).unwrap();
    for head in [OutputHead::Lm, OutputHead::Value] {
        let options = ConfigJsonOptions { base: Some(&llama.json), max_position_embeddings: 64, eos_token_id: Some(0) };
        let written = config_json(&llama.spec, head, &options);
        let back = parse_config(&Value::Object(written.clone()).to_string()).unwrap();
        assert_eq!(back.spec, ModelSpec { head_dim: Some(128), ..llama.spec.clone() });
        assert_eq!(back.head, head);
        assert_eq!(
            (written["bos_token_id"].clone(), written["eos_token_id"].clone()),
            (json!(128_000), json!(128_001))
        );
        assert_eq!(written["max_position_embeddings"], json!(131_072), "the source's value is kept");
        if head == OutputHead::Value {
            assert_eq!(written["architectures"], json!(["LlamaForSequenceClassification"]));
            assert_eq!(written["pad_token_id"], json!(128_001));
        }
    }
    // A Qwen3 model in the newer RoPE form keeps that form.
    let qwen = parse_config(QWEN3_0_6B).unwrap();
    let mut base = qwen.json.clone();
    base.insert("rope_parameters".into(), json!({"rope_type": "default", "rope_theta": 1e6}));
    let options = ConfigJsonOptions { base: Some(&base), ..ConfigJsonOptions::default() };
    let written = config_json(&qwen.spec, OutputHead::Lm, &options);
    assert!(written.get("rope_scaling").is_none() && written["rope_parameters"]["rope_theta"] == json!(1e6));
    assert_eq!(parse_config(&Value::Object(written).to_string()).unwrap().spec, qwen.spec);
    let generation = generation_config_json(&qwen.json, 0.7, 0.9);
    assert_eq!(
        generation,
        json!({"bos_token_id": 151_643, "eos_token_id": 151_645, "do_sample": true, "temperature": 0.7, "top_p": 0.9})
    );
}

fn model_dir(text: &str) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join(CONFIG_JSON), text).unwrap();
    dir
}

#[test]
fn a_table_naming_a_model_directory_takes_its_keys_and_refuses_disagreements() {
    let dir = model_dir(LLAMA_3_1_8B);
    let base = dir.path().parent().unwrap();
    let name = dir.path().file_name().unwrap();
    let raw = RawModelSpec {
        path: Some(name.into()),
        dtype: Some(Dtype::F32),
        hidden: Some(4096),
        ..RawModelSpec::default()
    };
    let spec = raw.resolve("actor", base).unwrap();
    assert_eq!(spec.path.as_deref(), Some(dir.path()), "relative to the job file's directory");
    assert_eq!(
        (spec.dtype, spec.layers, spec.rope_scaling),
        (Dtype::F32, 32, Some(llama3_scaling())),
        "dtype is the job's"
    );
    let wrong = RawModelSpec { hidden: Some(2048), ..raw.clone() };
    let err = wrong.resolve("actor", base).unwrap_err().to_string();
    assert!(err.contains("`models.actor.hidden` = 2048 in the job disagrees with `hidden_size` = 4096"), "{err}");
    assert!(err.contains("config.json"), "{err}");
    let qk = RawModelSpec { qk_norm: Some(true), ..raw.clone() };
    assert!(qk.resolve("actor", base).unwrap_err().to_string().contains("`model_type` = \"llama\""));
    let theta = RawModelSpec { rope_theta: Some(10_000.0), ..raw.clone() };
    assert!(theta.resolve("actor", base).unwrap_err().to_string().contains("rope_theta` = 500000.0"));
    let head_dim = RawModelSpec { head_dim: Some(128), ..raw.clone() };
    assert!(head_dim.resolve("actor", base).is_ok(), "4096 / 32 = 128 is the head width in effect");
    let missing = RawModelSpec { path: Some("no-such-dir".into()), ..RawModelSpec::default() };
    let err = missing.resolve("critic", base).unwrap_err();
    assert_eq!(err.key(), Some("models.critic.path"));
    let bare = RawModelSpec { layers: Some(2), ..RawModelSpec::default() };
    let err = bare.resolve("reward", base).unwrap_err().to_string();
    assert!(err.contains("models.reward.hidden") && err.contains("path"), "{err}");
}

#[test]
fn rope_keys_read_from_toml_and_print_back() {
    let text = r#"
        layers = 32
        hidden = 4096
        heads = 32
        kv_heads = 8
        ffn = 14336
        vocab = 128256
        dtype = "bf16"
        rope_theta = 500000.0
        rms_norm_eps = 1e-5
        rope_scaling = { type = "llama3", factor = 8.0, low_freq_factor = 1.0, high_freq_factor = 4.0, original_max_position_embeddings = 8192 }
    "#;
    let raw: RawModelSpec = toml::from_str(text).unwrap();
    let spec = raw.resolve("actor", Path::new(".")).unwrap();
    assert_eq!(spec, ModelSpec { path: None, ..parse_config(LLAMA_3_1_8B).unwrap().spec });
    let printed = toml::to_string(&spec).unwrap();
    assert_eq!(toml::from_str::<ModelSpec>(&printed).unwrap(), spec);
    let unknown = text.replace("\"llama3\"", "\"yarn\"");
    assert!(toml::from_str::<RawModelSpec>(&unknown).unwrap_err().to_string().contains("yarn"));
    let bad = RawModelSpec {
        rope_scaling: Some(RopeScaling::Llama3 {
            factor: 8.0,
            low_freq_factor: 4.0,
            high_freq_factor: 1.0,
            original_max_position_embeddings: 8192,
        }),
        ..raw
    };
    let err = bad.resolve("actor", Path::new(".")).unwrap().validate("actor").unwrap_err().to_string();
    assert!(
        err.contains("models.actor.rope_scaling.high_freq_factor") && err.contains("greater than low_freq_factor (4)"),
        "{err}"
    );
}
