//! Special-token ids are checked against the tokenizer (and so the embedding it must fit): an
//! EOS of 999,999 beside a 384-id tokenizer once trained to exit 0 though it could never be
//! sampled, and an `eos_token_id` of -1 was silently replaced by `config.json`'s. Each is
//! refused, in `data preview` and `train` alike, naming the file, the key and the id.

mod common;

use std::path::{Path, PathBuf};

use common::{assert_status, run_mpi, run_single, set_key, shipped, text, write};
use serde_json::json;

/// The text job's data and tokenizer under `dir/data`.
fn synth(dir: &Path) -> PathBuf {
    let data = dir.join("data");
    let out = run_single(&["data", "synth", data.to_str().unwrap(), "--train", "32", "--eval", "8"]);
    assert!(out.status.success(), "{:?}", text(&out));
    data
}

/// `data preview` of one prompt through `tokenizer`.
fn preview(dir: &Path, tokenizer: &Path) -> std::process::Output {
    let prompts = write(dir, "p.jsonl", r#"{"prompt": "What is 1 + 2?"}"#);
    run_single(&["data", "preview", prompts.to_str().unwrap(), "--model", tokenizer.to_str().unwrap()])
}

#[test]
fn ids_outside_the_tokenizer_or_not_ids_are_refused_with_their_file() {
    let dir = tempfile::tempdir().unwrap();
    let tokenizer = synth(dir.path()).join("tokenizer");
    let generation = tokenizer.join("generation_config.json");
    let config = tokenizer.join("config.json");
    let g = generation.to_str().unwrap();
    let cases = [
        (&generation, json!({"eos_token_id": 999_999}), vec![g, "`eos_token_id` is 999999", "0 to 383"]),
        (&generation, json!({"eos_token_id": [2, 384]}), vec![g, "384 is not one of tokenizer.json's ids"]),
        (&generation, json!({"eos_token_id": -1}), vec![g, "`eos_token_id` is -1", "a whole number"]),
        (&generation, json!({"eos_token_id": []}), vec![g, "an empty list names no token"]),
        (&generation, json!({"eos_token_id": 2, "pad_token_id": 400}), vec![g, "`pad_token_id` is 400"]),
        (&generation, json!({"eos_token_id": 2, "bos_token_id": "x"}), vec![g, "`bos_token_id` is \"x\""]),
        (&config, json!({"eos_token_id": 1e9}), vec!["config.json", "`eos_token_id`"]),
    ];
    for (file, contents, needles) in cases {
        let saved = std::fs::read(&generation).unwrap();
        if file == &config {
            std::fs::write(&generation, "{}").unwrap(); // so config.json is the one read
        }
        std::fs::write(file, contents.to_string()).unwrap();
        assert_status(&preview(dir.path(), &tokenizer), 2, &needles);
        std::fs::write(&generation, saved).unwrap();
        std::fs::remove_file(&config).ok();
    }
    // A token tokenizer_config.json names that the tokenizer does not have.
    let named = tokenizer.join("tokenizer_config.json");
    let mut object: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&named).unwrap()).unwrap();
    object["eos_token"] = json!("</s>");
    std::fs::write(&named, object.to_string()).unwrap();
    assert_status(&preview(dir.path(), &tokenizer), 2, &["tokenizer_config.json", "`eos_token` is \"</s>\""]);
}

#[test]
fn a_job_whose_eos_cannot_be_generated_does_not_train() {
    let dir = tempfile::tempdir().unwrap();
    let data = synth(dir.path());
    let generation = data.join("tokenizer/generation_config.json");
    std::fs::write(&generation, json!({"eos_token_id": 999_999, "pad_token_id": 0}).to_string()).unwrap();
    let mut toml = shipped("tiny-math-grpo.toml");
    for (section, key, value) in [
        ("job", "steps", "1".to_string()),
        ("job", "output_dir", format!("{:?}", dir.path().join("out"))),
        ("data", "train", format!("{:?}", data.join("train.jsonl"))),
        ("data", "eval", format!("{:?}", data.join("eval.jsonl"))),
        ("data", "tokenizer", format!("{:?}", data.join("tokenizer"))),
        ("train", "warmup_actor_steps", "0".into()),
    ] {
        toml = set_key(&toml, section, key, Some(&value));
    }
    let job = write(dir.path(), "job.toml", &toml);
    let out = run_mpi(2, &["train", job.to_str().unwrap()]);
    assert_status(&out, 2, &[generation.to_str().unwrap(), "`eos_token_id` is 999999"]);
}
