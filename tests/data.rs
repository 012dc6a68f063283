//! Prompt files through a model directory's tokenizer and chat template (`nereus data preview`),
//! checked against transformers' `apply_chat_template` on Llama-3-style and Qwen3-style
//! templates, and every bad input named.

mod common;

use std::path::{Path, PathBuf};

use common::{run_single, text, write};
use nereus_data::text::{save_tokenizer, train_byte_level_bpe};
use serde_json::{json, Value};

const LLAMA_SPECIAL: [&str; 4] = ["<|begin_of_text|>", "<|end_of_text|>", "<|start_header_id|>", "<|end_header_id|>"];
const QWEN_SPECIAL: [&str; 3] = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"];

/// Text the test tokenizers are trained on: English, numbers, accents, CJK and emoji, so that
/// byte-level merges, multi-byte characters and unseen text all occur in the prompts.
fn corpus() -> Vec<String> {
    let mut lines = Vec::new();
    for i in 0..200 {
        lines.push(format!("What is {i} + {}? The answer is {}.", i * 7 % 13, i + i * 7 % 13));
        lines.push(format!("Natalia sold clips to {i} of her friends in April, café naïve résumé."));
        lines.push("You are a helpful assistant. Think step by step. 数学 问题 🙂".to_string());
    }
    lines
}

/// A model directory with a trained byte-level BPE tokenizer, `style`'s template and special
/// tokens; `vocab` goes into config.json as the embedding size.
fn model_dir(root: &Path, style: &str, vocab: usize) -> PathBuf {
    let dir = root.join(style);
    std::fs::create_dir_all(&dir).unwrap();
    let (special, bos, eos, eos_ids): (&[&str], Value, &str, Value) = match style {
        "llama3" => (
            &[&LLAMA_SPECIAL[..], &["<|eot_id|>"]].concat(),
            json!("<|begin_of_text|>"),
            "<|end_of_text|>",
            json!([1, 4]),
        ),
        _ => (&QWEN_SPECIAL, Value::Null, "<|im_end|>", json!(2)),
    };
    let tokenizer = train_byte_level_bpe(corpus().into_iter(), 420, special).unwrap();
    save_tokenizer(&tokenizer, &dir.join("tokenizer.json")).unwrap();
    let template =
        std::fs::read_to_string(common::repo().join(format!("tests/fixtures/chat/{style}-style.jinja"))).unwrap();
    let mut config = json!({"tokenizer_class": "PreTrainedTokenizerFast", "bos_token": bos, "eos_token": eos, "model_max_length": 4096});
    if style == "llama3" {
        write(&dir, "chat_template.jinja", &template); // where recent transformers save it
    } else {
        config["chat_template"] = json!(template); // where older ones did
        config["pad_token"] = json!("<|endoftext|>");
    }
    write(&dir, "tokenizer_config.json", &config.to_string());
    write(&dir, "generation_config.json", &json!({"eos_token_id": eos_ids}).to_string());
    let model = json!({"model_type": "llama", "hidden_size": 8, "num_hidden_layers": 1, "num_attention_heads": 2,
        "intermediate_size": 16, "vocab_size": vocab});
    write(&dir, "config.json", &model.to_string());
    dir
}

/// Conversations with system, user and assistant turns, unicode, empty content and thinking.
fn conversations() -> Vec<Value> {
    vec![
        json!([{"role": "user", "content": "What is 12+7?"}]),
        json!([{"role": "system", "content": "  You are a helpful assistant.\n"},
               {"role": "user", "content": "Natalia sold clips to 48 friends; café 数学 🙂?"}]),
        json!([{"role": "system", "content": "Think step by step."},
               {"role": "user", "content": "What is 3 + 4?"},
               {"role": "assistant", "content": "<think>\n3 plus 4</think>\n\nThe answer is 7."},
               {"role": "user", "content": ""}]),
        json!([{"role": "user", "content": "résumé"}, {"role": "assistant", "content": ""},
               {"role": "user", "content": "naïve\n\n"}]),
    ]
}

fn preview(file: &Path, dir: &Path, json_out: &Path, extra: &[&str]) -> std::process::Output {
    let mut args = vec!["data", "preview", file.to_str().unwrap(), "--model", dir.to_str().unwrap(), "--count", "10"];
    args.extend_from_slice(&["--json", json_out.to_str().unwrap()]);
    args.extend_from_slice(extra);
    run_single(&args)
}

#[test]
fn rendering_and_ids_match_transformers_on_llama3_and_qwen3_style_templates() {
    let root = tempfile::tempdir().unwrap();
    let lines: Vec<String> = conversations().iter().map(|c| json!({"prompt": c}).to_string()).collect();
    let file = write(root.path(), "prompts.jsonl", &lines.join("\n"));
    let python = common::reference_python();
    for style in ["llama3", "qwen3"] {
        let dir = model_dir(root.path(), style, 512);
        let json_out = root.path().join(format!("{style}.json"));
        let out = preview(&file, &dir, &json_out, &[]);
        let (stdout, stderr) = text(&out);
        assert_eq!(out.status.code(), Some(0), "{stdout}{stderr}");
        let ours: Value = serde_json::from_str(&std::fs::read_to_string(&json_out).unwrap()).unwrap();
        let prompts = ours["prompts"].as_array().unwrap();
        assert_eq!(prompts.len(), 4);
        let first = prompts[0]["text"].as_str().unwrap();
        let expected = match style {
            "llama3" => "<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\nWhat is 12+7?<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n",
            _ => "<|im_start|>user\nWhat is 12+7?<|im_end|>\n<|im_start|>assistant\n",
        };
        assert_eq!(first, expected, "{style}");
        if style == "qwen3" {
            let third = prompts[2]["text"].as_str().unwrap();
            assert!(third.contains("<|im_start|>assistant\nThe answer is 7.<|im_end|>"), "thinking dropped: {third}");
        }
        if let Some(python) = &python {
            let theirs = common::transformers_prompts(python, &dir, &conversations());
            for (k, (a, b)) in prompts.iter().zip(theirs["prompts"].as_array().unwrap()).enumerate() {
                assert_eq!(a["text"], b["text"], "{style} conversation {k}: rendering");
                assert_eq!(a["ids"], b["ids"], "{style} conversation {k}: ids");
            }
        }
    }
}

#[test]
fn plain_prompts_go_through_the_template_unless_raw_and_stop_ids_are_read() {
    let root = tempfile::tempdir().unwrap();
    let dir = model_dir(root.path(), "llama3", 512);
    let file = write(root.path(), "p.jsonl", r#"{"question": {"text": "What is 12+7?"}}"#);
    let json_out = root.path().join("p.json");
    let out = preview(&file, &dir, &json_out, &["--prompt-key", "question.text", "--raw"]);
    let (stdout, stderr) = text(&out);
    assert_eq!(out.status.code(), Some(0), "{stdout}{stderr}");
    assert!(stdout.contains("eos ids [1, 4], pad id 1, bos Some(\"<|begin_of_text|>\")"), "{stdout}");
    let ours: Value = serde_json::from_str(&std::fs::read_to_string(&json_out).unwrap()).unwrap();
    assert_eq!(ours["prompts"][0]["text"], "What is 12+7?");
}

#[test]
fn bad_inputs_are_named() {
    let root = tempfile::tempdir().unwrap();
    let llama = model_dir(root.path(), "llama3", 512);
    let small = model_dir(&root.path().join("small"), "qwen3", 300);
    let good = write(root.path(), "good.jsonl", r#"{"prompt": "hi"}"#);
    let tool = write(root.path(), "tool.jsonl", r#"{"prompt": [{"role": "tool", "content": "x"}]}"#);
    let broken = write(root.path(), "broken.jsonl", "{\"prompt\": \"hi\"}\n{\"prompt\": [{\"role\": \"user\"}]}\n");
    let no_template = root.path().join("no-template");
    std::fs::create_dir_all(&no_template).unwrap();
    for f in ["tokenizer.json", "generation_config.json", "config.json"] {
        std::fs::copy(llama.join(f), no_template.join(f)).unwrap();
    }
    let bad_tokenizer = root.path().join("bad-tokenizer");
    std::fs::create_dir_all(&bad_tokenizer).unwrap();
    write(&bad_tokenizer, "tokenizer.json", "{\"model\": 3}");
    let missing = root.path().join("missing");
    let cases: Vec<(&Path, &Path, &str)> = vec![
        (
            &good,
            &small,
            "the tokenizer's vocabulary (420 ids, up to id 419) does not fit the model's embedding (300 rows)",
        ),
        (&tool, &llama, "Conversation roles must be user or assistant, not tool"),
        (&broken, &llama, "broken.jsonl:2: `prompt[0]` has no `content`"),
        (&good, &no_template, "no chat template"),
        (&good, &bad_tokenizer, "tokenizer.json: not a tokenizers file"),
        (&good, &missing, "cannot read"),
    ];
    for (file, dir, needle) in cases {
        common::assert_status(&preview(file, dir, &root.path().join("x.json"), &[]), 2, &[needle]);
    }
}

#[test]
fn the_shipped_text_job_is_what_data_synth_writes() {
    let dir = tempfile::tempdir().unwrap();
    let out = run_single(&["data", "synth", dir.path().to_str().unwrap()]);
    assert!(out.status.success(), "{:?}", text(&out));
    let shipped = common::repo().join("configs/data/tiny-math");
    for file in [
        "train.jsonl",
        "eval.jsonl",
        "tokenizer/tokenizer.json",
        "tokenizer/tokenizer_config.json",
        "tokenizer/generation_config.json",
    ] {
        let (ours, theirs) =
            (std::fs::read(dir.path().join(file)).unwrap(), std::fs::read(shipped.join(file)).unwrap());
        assert!(ours == theirs, "{file} differs from `nereus data synth`'s output");
    }
    // Half of the training answers guess; held-out answers are all worked out.
    let train = std::fs::read_to_string(shipped.join("train.jsonl")).unwrap();
    let guesses = train.lines().filter(|l| l.contains("\"solution\":\"The answer is")).count();
    assert!((900..1100).contains(&guesses), "{guesses} of 2000 guess");
    let bad = run_single(&["data", "synth", dir.path().to_str().unwrap(), "--vocab", "100"]);
    assert_eq!(bad.status.code(), Some(2));
    let stderr = text(&bad).1;
    assert!(stderr.contains("--vocab must lie in [260, ") && stderr.contains("got 100,"), "{stderr}");
}

/// verl's preprocessed rows: chat messages, the answer under `reward_model.ground_truth`, an
/// integer index in `extra_info`, and here a response to score.
fn verl_rows() -> Vec<Value> {
    let answers = ["19", "48", "7", "x"];
    let responses = ["12 + 7 = \\boxed{19}", "The answer is 47.", "so 7", "no idea"];
    conversations()
        .into_iter()
        .enumerate()
        .map(|(i, prompt)| {
            json!({"data_source": "test", "prompt": prompt, "ability": "math",
                   "reward_model": {"style": "rule", "ground_truth": answers[i]},
                   "extra_info": {"index": i, "split": "train"}, "response": responses[i]})
        })
        .collect()
}

/// A verl-style Parquet file written by pyarrow reads as its JSON lines do: the same rendered
/// prompts and ids through `data preview`, the same rewards from `nereus reward` with the
/// answer at `reward_model.ground_truth`; a column of the wrong type, a truncated file, an
/// unread codec and a Parquet file named as JSON lines are each named.
#[test]
fn verl_style_parquet_reads_as_its_json_lines() {
    let Some(python) = common::reference_python() else { return };
    let root = tempfile::tempdir().unwrap();
    let dir = model_dir(root.path(), "qwen3", 512);
    let rows = verl_rows();
    let parquet = root.path().join("train.parquet");
    common::write_parquet(&python, &parquet, &rows, "snappy");
    let lines: Vec<String> = rows.iter().map(Value::to_string).collect();
    let jsonl = write(root.path(), "train.jsonl", &lines.join("\n"));
    let read = |file: &Path, name: &str| {
        let json_out = root.path().join(name);
        let out = preview(file, &dir, &json_out, &[]);
        assert_eq!(out.status.code(), Some(0), "{:?}", text(&out));
        std::fs::read_to_string(json_out).unwrap()
    };
    assert_eq!(read(&parquet, "p.json"), read(&jsonl, "j.json"));
    let score = |file: &Path| {
        let json_out = root.path().join("scores.json");
        let file = file.to_str().unwrap();
        let args = ["reward", file, "--kind", "math", "--answer-key", "reward_model.ground_truth"];
        let out = run_single(&[&args[..], &["--json", json_out.to_str().unwrap()]].concat());
        assert_eq!(out.status.code(), Some(0), "{:?}", text(&out));
        let scores: Value = serde_json::from_str(&std::fs::read_to_string(json_out).unwrap()).unwrap();
        scores["scores"].as_array().unwrap().iter().map(|s| s["reward"].as_f64().unwrap()).collect::<Vec<_>>()
    };
    assert_eq!(score(&parquet), [1.0, 0.0, 1.0, 0.0]);
    assert_eq!(score(&parquet), score(&jsonl));

    let mut wrong = rows.clone();
    for (i, row) in wrong.iter_mut().enumerate() {
        row["reward_model"]["ground_truth"] = json!([i]);
    }
    let wrong_type = root.path().join("wrong.parquet");
    common::write_parquet(&python, &wrong_type, &wrong, "snappy");
    let truncated = root.path().join("truncated.parquet");
    let bytes = std::fs::read(&parquet).unwrap();
    std::fs::write(&truncated, &bytes[..bytes.len() - 40]).unwrap();
    let zstd = root.path().join("zstd.parquet");
    common::write_parquet(&python, &zstd, &rows, "zstd");
    let misnamed = root.path().join("misnamed.jsonl");
    std::fs::copy(&parquet, &misnamed).unwrap();
    for (file, needle) in [
        (&wrong_type, "wrong.parquet row 1: field `reward_model.ground_truth` is a list, not a string"),
        (&truncated, "truncated.parquet: not a readable Parquet file"),
        (&zstd, "zstd.parquet row 1: Disabled feature at compile time: zstd: Nereus reads snappy"),
        (&misnamed, "misnamed.jsonl: this is a Parquet file"),
    ] {
        let f = file.to_str().unwrap();
        let out = run_single(&["reward", f, "--kind", "math", "--answer-key", "reward_model.ground_truth"]);
        common::assert_status(&out, 2, &[needle]);
    }
}
