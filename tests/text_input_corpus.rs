//! A generated corpus of hostile input to the text side and the sizing flags: prompt files
//! (JSON lines, Parquet), paths that are not files, chat templates, special tokens, reward
//! flags and scorer commands, `--set`, GGUF files, `trace synth`, device flags, signals, and
//! text jobs on two ranks. Every case must end within its limit with a clear refusal (its
//! status, a message naming the problem) or correct behaviour (status 0): never a hang, an
//! abort, a panic, an exit 0 on nonsense, or a scorer process left running. Each test prints
//! its counts; the tests of the defects such a pass found are in the files named after them.
//! The corpus takes about a minute, past what CI can give every run, so its tests are ignored:
//! run them with `cargo test --release --test text_input_corpus -- --ignored`.

mod common;

use std::path::{Path, PathBuf};
use std::process::Output;
use std::time::{Duration, Instant};

use common::gguf::tiny_llama;
use common::{repo, run_single_within, set_key, small_text_job, text, write};
use serde_json::json;

/// What a case must end with.
#[derive(Clone, Copy, Debug)]
enum Expect {
    /// Status 0.
    Works,
    /// This status, and the message (stderr) names the problem.
    Refused(i32, &'static str),
}

/// One case: its name, arguments, what it must end with, and a file of pids (a scorer's and
/// its children's) that must all have ended when it has.
struct Case {
    name: String,
    args: Vec<String>,
    expect: Expect,
    pids: Option<PathBuf>,
}

fn case(name: impl Into<String>, args: &[&str], expect: Expect) -> Case {
    Case { name: name.into(), args: args.iter().map(|s| s.to_string()).collect(), expect, pids: None }
}

/// The pids in `file` whose processes still run (zombies have ended).
fn alive(file: &Path) -> Vec<u32> {
    let pids = std::fs::read_to_string(file).unwrap_or_default();
    pids.split_whitespace()
        .filter_map(|p| p.parse().ok())
        .filter(|pid| {
            let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
            !stat.is_empty() && stat.rsplit(')').next().and_then(|s| s.split_whitespace().next()) != Some("Z")
        })
        .collect()
}

/// One case's problems: empty when it ended as expected.
fn verdict(out: Option<&Output>, elapsed: Duration, expect: Expect, pids: Option<&Path>) -> Vec<String> {
    let Some(out) = out else { return vec![format!("hung (killed after {elapsed:?})")] };
    let (_, stderr) = text(out);
    let mut problems = Vec::new();
    if out.status.code().is_none() || out.status.code() == Some(134) {
        problems.push(format!("ended by a signal or an abort: {:?}", out.status));
    }
    if stderr.contains("panicked") || stderr.contains("RUST_BACKTRACE") {
        problems.push("panicked".into());
    }
    match expect {
        Expect::Works if !out.status.success() => problems.push(format!("status {:?}, want 0", out.status.code())),
        Expect::Refused(status, needle) => {
            if out.status.code() != Some(status) {
                problems.push(format!("status {:?}, want {status}", out.status.code()));
            }
            if !stderr.contains(needle) {
                problems.push(format!("message lacks {needle:?}"));
            }
        }
        Expect::Works => {}
    }
    if let Some(file) = pids {
        std::thread::sleep(Duration::from_millis(50)); // SIGKILL is delivered, not awaited
        let left = alive(file);
        if !left.is_empty() {
            problems.push(format!("scorer processes left running: {left:?}"));
        }
    }
    problems
}

/// Runs every case on four threads, each within `limit`; reports the counts and fails on any
/// misbehaviour.
fn run_corpus(kind: &str, cases: Vec<Case>, limit: Duration) -> usize {
    let n = cases.len();
    let queue = std::sync::Mutex::new(cases.into_iter());
    let failures = std::sync::Mutex::new(Vec::new());
    std::thread::scope(|scope| {
        for _ in 0..4 {
            scope.spawn(|| loop {
                let Some(c) = queue.lock().unwrap().next() else { break };
                let args: Vec<&str> = c.args.iter().map(String::as_str).collect();
                let start = Instant::now();
                let out = run_single_within(&args, limit);
                let problems = verdict(out.as_ref(), start.elapsed(), c.expect, c.pids.as_deref());
                if !problems.is_empty() {
                    let stderr = out.as_ref().map(|o| text(o).1).unwrap_or_default();
                    let message = format!("{}: {}\n  stderr: {}", c.name, problems.join("; "), stderr.trim());
                    failures.lock().unwrap().push(message);
                }
            });
        }
    });
    let failures = failures.into_inner().unwrap();
    eprintln!("hostile corpus, {kind}: {n} cases, {} misbehaved", failures.len());
    assert!(failures.is_empty(), "{} of {n} {kind} cases misbehaved:\n{}", failures.len(), failures.join("\n"));
    n
}

/// A copy of the shipped tokenizer directory at `dir/name`, with `files` written over it.
fn tokenizer(dir: &Path, name: &str, files: &[(&str, String)]) -> String {
    let out = dir.join(name);
    std::fs::create_dir_all(&out).unwrap();
    let shipped = repo().join("configs/data/tiny-math/tokenizer");
    for f in ["tokenizer.json", "tokenizer_config.json", "generation_config.json"] {
        std::fs::copy(shipped.join(f), out.join(f)).unwrap();
    }
    for (file, contents) in files {
        std::fs::write(out.join(file), contents).unwrap();
    }
    out.to_str().unwrap().to_string()
}

/// Prompt and response files: contents, and whether `data preview` and `reward --kind math`
/// take them.
fn record_files() -> Vec<(&'static str, Vec<u8>, Expect, Expect)> {
    let ok = Expect::Works;
    let r = |needle| Expect::Refused(2, needle);
    let deep = format!("{{\"prompt\": {}1{}}}", "[".repeat(200), "]".repeat(200));
    vec![
        ("ok.jsonl", br#"{"prompt": "hi", "response": "\\boxed{1}", "answer": "1"}"#.to_vec(), ok, ok),
        ("empty.jsonl", b"".to_vec(), r("no records"), r("no records")),
        ("blank.jsonl", b"\n \n\t\n".to_vec(), r("no records"), r("no records")),
        ("bom.jsonl", b"\xef\xbb\xbf{\"prompt\": \"a\", \"response\": \"1\", \"answer\": \"1\"}".to_vec(), ok, ok),
        ("crlf.jsonl", b"{\"prompt\": \"a\", \"response\": \"1\", \"answer\": \"1\"}\r\n".to_vec(), ok, ok),
        ("not-json.jsonl", b"{\"prompt\": \n".to_vec(), r(":1: not JSON"), r(":1: not JSON")),
        ("array.jsonl", b"[1, 2]\n".to_vec(), r("must be a JSON object"), r("must be a JSON object")),
        ("scalar.jsonl", b"42\n".to_vec(), r("must be a JSON object"), r("must be a JSON object")),
        ("latin1.jsonl", b"{\"prompt\": \"caf\xe9\"}\n".to_vec(), r("not UTF-8"), r("not UTF-8")),
        ("nul.jsonl", b"{\"prompt\": \"a\x00b\"}\n".to_vec(), r("not JSON"), r("not JSON")),
        ("no-prompt.jsonl", br#"{"response": "1", "answer": "1"}"#.to_vec(), r("no field `prompt`"), ok),
        ("prompt-number.jsonl", br#"{"prompt": 5, "response": "1", "answer": "1"}"#.to_vec(), r("`prompt`"), ok),
        ("prompt-null.jsonl", br#"{"prompt": null, "response": "1", "answer": "1"}"#.to_vec(), r("`prompt`"), ok),
        ("no-role.jsonl", br#"{"prompt": [{"content": "x"}], "response": "1", "answer": "1"}"#.to_vec(), r("role"), ok),
        (
            "no-content.jsonl",
            br#"{"prompt": [{"role": "user"}], "response": "1", "answer": "1"}"#.to_vec(),
            r("content"),
            ok,
        ),
        ("empty-chat.jsonl", br#"{"prompt": [], "response": "1", "answer": "1"}"#.to_vec(), r("`prompt`"), ok),
        ("response-list.jsonl", br#"{"prompt": "a", "response": ["1"], "answer": "1"}"#.to_vec(), ok, r("is a list")),
        ("answer-object.jsonl", br#"{"prompt": "a", "response": "1", "answer": {"x": 1}}"#.to_vec(), ok, r("`answer`")),
        ("deep.jsonl", deep.into_bytes(), r("not JSON"), r("not JSON")),
        ("parquet-in-jsonl.jsonl", b"PAR1\x00\x00garbage".to_vec(), r("this is a Parquet file"), r("Parquet")),
        ("json.parquet", br#"{"prompt": "a"}"#.to_vec(), r("not a readable Parquet file"), r("Parquet")),
        ("truncated.parquet", b"PAR1\x15\x04".to_vec(), r("not a readable Parquet file"), r("Parquet")),
    ]
}

#[test]
#[ignore = "the hostile corpus takes about a minute: cargo test --release --test text_input_corpus -- --ignored"]
fn prompt_files_paths_templates_and_special_tokens() {
    let root = tempfile::tempdir().unwrap();
    let dir = root.path();
    let tok = tokenizer(dir, "tok", &[]);
    let mut cases = Vec::new();
    for (name, bytes, preview, reward) in record_files() {
        let path = dir.join(name);
        std::fs::write(&path, bytes).unwrap();
        let p = path.to_str().unwrap();
        cases.push(case(format!("preview {name}"), &["data", "preview", p, "--model", &tok], preview));
        cases.push(case(format!("reward {name}"), &["reward", p, "--kind", "math"], reward));
    }
    cases.extend(paths(dir, &tok));
    cases.extend(templates(dir));
    cases.extend(special_tokens(dir));
    run_corpus("prompt files, paths, templates, special tokens", cases, Duration::from_secs(30));
}

/// Paths that are not regular files, missing ones and links, everywhere a file is read.
fn paths(dir: &Path, tok: &str) -> Vec<Case> {
    let fifo = dir.join("fifo");
    assert!(std::process::Command::new("mkfifo").arg(&fifo).status().unwrap().success());
    let link = dir.join("link-to-fifo");
    std::os::unix::fs::symlink(&fifo, &link).unwrap();
    let looped = dir.join("loop");
    std::os::unix::fs::symlink(&looped, &looped).unwrap();
    let (f, l, lp, d) =
        (fifo.to_str().unwrap(), link.to_str().unwrap(), looped.to_str().unwrap(), dir.to_str().unwrap());
    let mut cases = Vec::new();
    let targets = [
        (f, "named pipe"),
        (l, "named pipe"),
        (d, "a directory"),
        ("/dev/null", "character device"),
        ("/dev/zero", "character device"),
        ("/nonexistent/x", "No such file"),
        (lp, "symbolic links"),
    ];
    let out = dir.join("gguf-out");
    let o = out.to_str().unwrap();
    for (target, needle) in targets {
        let r = Expect::Refused(2, needle);
        cases.push(case(format!("preview {target}"), &["data", "preview", target, "--model", tok], r));
        cases.push(case(format!("reward {target}"), &["reward", target, "--kind", "exact"], r));
        cases.push(case(format!("import-gguf {target}"), &["model", "import-gguf", target, "--out", o], r));
        cases.push(case(format!("inspect config {target}"), &["inspect", "config", target], r));
        let sim = ["simulate", "configs/llama3.1-8b-ppo.toml", "--trace", target];
        cases.push(case(format!("simulate --trace {target}"), &sim, r));
    }
    cases
}

/// Chat templates that loop, grow, write without end, raise or compute nonsense; and ones
/// that are fine.
fn templates(dir: &Path) -> Vec<Case> {
    let prompts = write(dir, "one.jsonl", r#"{"prompt": [{"role": "user", "content": "hi"}]}"#);
    let p = prompts.to_str().unwrap().to_string();
    let doubled: String = (0..60).map(|_| "{% set s = s ~ s %}").collect();
    let r = |needle| Expect::Refused(2, needle);
    let fuel = "instructions";
    let memory = "at once while rendering";
    let output = "its output passed the limit";
    let templates: Vec<(&str, String, Expect)> = vec![
        ("loop", "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}".into(), r(fuel)),
        ("loop-in-loop-in-loop", "{% for a in range(1000) %}{% for b in range(1000) %}{% for c in range(1000) %}{% endfor %}{% endfor %}{% endfor %}".into(), r(fuel)),
        ("range-too-long", "{% for i in range(10**9) %}{% endfor %}".into(), r("range has too many elements")),
        ("recursive-macro", "{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}".into(), r("recursion")),
        ("doubling", "{% set ns = namespace(s='ab') %}{% for i in range(60) %}{% set ns.s = ns.s ~ ns.s %}{% endfor %}{{ ns.s|length }}".into(), r(memory)),
        ("doubling-unrolled", format!("{{% set s = 'ab' %}}{doubled}"), r(memory)),
        ("doubling-by-plus", "{% set ns = namespace(s='ab') %}{% for i in range(60) %}{% set ns.s = ns.s + ns.s %}{% endfor %}".into(), r(memory)),
        ("replace-squares", "{% set ns = namespace(s='abcdefgh') %}{% for i in range(8) %}{% set ns.s = ns.s.replace('', ns.s) %}{% endfor %}".into(), r(memory)),
        ("join-grows", "{% set ns = namespace(l=['x' * 1000]) %}{% for i in range(40) %}{% set ns.l = ns.l + ns.l %}{% endfor %}{{ ns.l|join|length }}".into(), r(memory)),
        ("repeat-large", "{{ 'x' * 100000000 }}".into(), r(output)),
        ("repeat-too-large", "{{ 'x' * 10**12 }}".into(), r("repeated string is too large")),
        ("writes-forever", "{% for i in range(100000) %}{{ 'y' * 10000 }}{% endfor %}".into(), r(output)),
        ("div-zero", "{{ 1 / 0 }}".into(), r("division by zero")),
        ("float-div-zero", "{{ 1.0 / 0.0 }}".into(), r("division by zero")),
        ("int-floordiv-zero", "{{ 1 // 0 }}".into(), r("unable to calculate 1 // 0")),
        ("float-floordiv-zero", "{{ 1.5 // 0 }}".into(), r("computed")),
        ("int-mod-zero", "{{ 1 % 0 }}".into(), r("unable to calculate 1 % 0")),
        ("float-mod-zero", "{{ 1.5 % 0 }}".into(), r("computed NaN")),
        ("pow-overflow", "{{ 10.0 ** 400 }}".into(), r("computed inf")),
        ("inf-in-tojson", "{{ {'x': 1 / 0}|tojson }}".into(), r("computed inf")),
        ("undefined-attr", "{{ nothing.here }}".into(), r("undefined")),
        ("raise", "{{ raise_exception('no system role') }}".into(), r("no system role")),
        ("syntax", "{% for %}".into(), r("does not compile")),
        ("unknown-filter", "{{ 'a'|frobnicate }}".into(), r("frobnicate")),
        ("empty", String::new(), Expect::Works),
        ("fine", "{% for m in messages %}{{ m.role }}: {{ m.content|trim }}{{ (10 / 4)|round }}{% endfor %}".into(), Expect::Works),
        ("big-but-fine", "{{ 'x' * 1000000 }}".into(), Expect::Works),
    ];
    templates
        .into_iter()
        .map(|(name, template, expect)| {
            let model = tokenizer(dir, &format!("template-{name}"), &[("chat_template.jinja", template)]);
            case(format!("template {name}"), &["data", "preview", &p, "--model", &model], expect)
        })
        .collect()
}

/// Files written over a tokenizer directory: name and contents.
type Files = Vec<(&'static str, String)>;

/// Special-token ids and names, and tokenizer files, that cannot be what they claim.
fn special_tokens(dir: &Path) -> Vec<Case> {
    let prompts = write(dir, "plain.jsonl", r#"{"prompt": "What is 1 + 1?"}"#);
    let p = prompts.to_str().unwrap().to_string();
    let generation = |value: serde_json::Value| ("generation_config.json", value.to_string());
    let r = |needle| Expect::Refused(2, needle);
    let model_config = |vocab: u32| {
        let c = json!({"model_type": "llama", "hidden_size": 8, "num_hidden_layers": 1, "num_attention_heads": 2,
            "intermediate_size": 16, "vocab_size": vocab});
        ("config.json", c.to_string())
    };
    let variants: Vec<(&str, Files, Expect)> = vec![
        ("eos-huge", vec![generation(json!({"eos_token_id": 999_999}))], r("`eos_token_id` is 999999")),
        ("eos-negative", vec![generation(json!({"eos_token_id": -1}))], r("`eos_token_id` is -1")),
        ("eos-empty", vec![generation(json!({"eos_token_id": []}))], r("an empty list")),
        ("eos-string", vec![generation(json!({"eos_token_id": "2"}))], r("a whole number")),
        ("eos-float", vec![generation(json!({"eos_token_id": 2.5}))], r("a whole number")),
        ("eos-bool", vec![generation(json!({"eos_token_id": true}))], r("a whole number")),
        ("eos-nested", vec![generation(json!({"eos_token_id": [[2]]}))], r("a whole number")),
        ("eos-u32-overflow", vec![generation(json!({"eos_token_id": 4_294_967_298u64}))], r("is not one of")),
        ("eos-null", vec![generation(json!({"eos_token_id": null}))], Expect::Works),
        ("pad-negative", vec![generation(json!({"eos_token_id": 2, "pad_token_id": -1}))], r("`pad_token_id` is -1")),
        (
            "bos-huge",
            vec![generation(json!({"eos_token_id": 2, "bos_token_id": 1_000_000_000_000u64}))],
            r("`bos_token_id`"),
        ),
        (
            "config-eos",
            vec![generation(json!({})), ("config.json", json!({"eos_token_id": 384}).to_string())],
            r("config.json"),
        ),
        ("generation-not-object", vec![("generation_config.json", "[1]".into())], r("not a JSON object")),
        ("generation-not-json", vec![("generation_config.json", "{".into())], r("not JSON")),
        ("tokenizer-config-array", vec![("tokenizer_config.json", "[]".into())], r("not a JSON object")),
        (
            "eos-name-unknown",
            vec![("tokenizer_config.json", json!({"eos_token": "</s>"}).to_string())],
            r("`eos_token` is \"</s>\""),
        ),
        (
            "pad-name-unknown",
            vec![("tokenizer_config.json", json!({"eos_token": "<|im_end|>", "pad_token": "<pad>"}).to_string())],
            r("`pad_token`"),
        ),
        (
            "no-eos-anywhere",
            vec![generation(json!({})), ("tokenizer_config.json", json!({}).to_string())],
            r("no end-of-sequence token"),
        ),
        (
            "template-number",
            vec![("tokenizer_config.json", json!({"eos_token": "<|im_end|>", "chat_template": 5}).to_string())],
            r("neither a string"),
        ),
        ("tokenizer-garbage", vec![("tokenizer.json", "{\"model\": 1}".into())], r("not a tokenizers file")),
        ("tokenizer-empty", vec![("tokenizer.json", String::new())], r("not a tokenizers file")),
        ("embedding-too-small", vec![model_config(100)], r("does not fit the model's embedding (100 rows)")),
        ("embedding-fits", vec![model_config(384)], Expect::Works),
    ];
    variants
        .into_iter()
        .map(|(name, files, expect)| {
            let model = tokenizer(dir, &format!("special-{name}"), &files);
            case(format!("special {name}"), &["data", "preview", &p, "--model", &model], expect)
        })
        .collect()
}

/// An executable scorer script `dir/name`: `body` after a line that records its pid in
/// `dir/name.pids` (children record theirs there too).
fn scorer(dir: &Path, name: &str, body: &str) -> (String, PathBuf) {
    let pids = dir.join(format!("{name}.pids"));
    let path = write(dir, name, &format!("#!/bin/sh\necho $$ >> {}\n{body}\n", pids.display()));
    assert!(std::process::Command::new("chmod").arg("+x").arg(&path).status().unwrap().success());
    (path.to_str().unwrap().to_string(), pids)
}

#[test]
#[ignore = "the hostile corpus takes about a minute: cargo test --release --test text_input_corpus -- --ignored"]
fn reward_flags_and_scorer_commands() {
    let root = tempfile::tempdir().unwrap();
    let dir = root.path();
    let line = r#"{"response": "\\boxed{7}", "answer": "7", "prompt": "p", "metadata": {"k": 1}}"#;
    let file = write(dir, "r.jsonl", &format!("{line}\n").repeat(3));
    let big = write(dir, "big.jsonl", &format!("{line}\n").repeat(3000));
    let f = file.to_str().unwrap().to_string();
    let mut cases = Vec::new();
    let r = |needle| Expect::Refused(2, needle);
    for (value, expect) in [
        ("nan", r("`--format-bonus` = NaN")),
        ("inf", r("`--format-bonus` = inf")),
        ("-inf", r("`--format-bonus`")),
        ("1e308", r("[0, 1000000]")),
        ("1000001", r("[0, 1000000]")),
        ("-0.5", r("`--format-bonus` = -0.5")),
        ("1e6", Expect::Works),
        ("0", Expect::Works),
        ("abc", r("--format-bonus")),
    ] {
        cases.push(case(
            format!("--format-bonus {value}"),
            &["reward", &f, "--kind", "math", "--format-bonus", value],
            expect,
        ));
    }
    for (value, expect) in [
        ("nan", r("`--timeout` = NaN")),
        ("0", r("`--timeout` = 0")),
        ("-1", r("`--timeout`")),
        ("1e300", r("[0.001, 604800]")),
        ("0.0001", r("[0.001, 604800]")),
        ("inf", r("`--timeout` = inf")),
    ] {
        cases.push(case(
            format!("--timeout {value}"),
            &["reward", &f, "--kind", "command", "--timeout", value, "--", "cat"],
            expect,
        ));
    }
    cases.push(case(
        "command without a program",
        &["reward", &f, "--kind", "command"],
        r("needs the scorer after `--`"),
    ));
    cases.push(case(
        "missing program",
        &["reward", &f, "--kind", "command", "--", "/nonexistent/s"],
        r("cannot start"),
    ));
    cases.push(case(
        "not executable",
        &["reward", &f, "--kind", "command", "--", file.to_str().unwrap()],
        r("cannot start"),
    ));
    cases.push(case(
        "--on-error maybe",
        &["reward", &f, "--kind", "command", "--on-error", "maybe", "--", "cat"],
        r("--on-error"),
    ));
    let answer = "while read l; do echo '{\"reward\": 0.5}'; done";
    let scorers: Vec<(&str, String, &[&str], Expect)> = vec![
        ("answers", answer.into(), &[], Expect::Works),
        ("forks-and-answers", format!("sleep 300 &\necho $! >> $0.pids\n{answer}"), &[], Expect::Works),
        ("forks-grandchild", format!("(sleep 300 & echo $! >> $0.pids; wait) &\n{answer}"), &[], Expect::Works),
        ("sleeps", "sleep 300".into(), &["--timeout", "0.5"], r("did not answer line 1 of the batch within 0.5 s")),
        ("sleeps-zero", "sleep 300".into(), &["--timeout", "0.5", "--on-error", "zero"], Expect::Works),
        ("sleeps-forks", "sleep 300 &\necho $! >> $0.pids\nsleep 300".into(), &["--timeout", "0.5"], r("within 0.5 s")),
        ("exits", "exit 3".into(), &[], r("exited (exit status: 3) before answering line 1")),
        ("exits-zero", "exit 0".into(), &["--on-error", "zero"], Expect::Works),
        ("garbage", "while read l; do echo nope; done".into(), &[], r("answered line 1 of the batch with \"nope\"")),
        ("nan-reward", "while read l; do echo '{\"reward\": NaN}'; done".into(), &[], r("<finite number>")),
        ("string-reward", "while read l; do echo '{\"reward\": \"1\"}'; done".into(), &[], r("<finite number>")),
        ("huge-reward", "while read l; do echo '{\"reward\": 1e308}'; done".into(), &[], Expect::Works),
        ("overflowing-reward", "while read l; do echo '{\"reward\": 1e999}'; done".into(), &[], r("<finite number>")),
        ("closes-stdout", "exec >&-\nsleep 300".into(), &["--timeout", "1"], r("closed its output")),
        (
            "stderr-flood",
            "head -c 1000000 /dev/zero | tr '\\0' x >&2\necho\nsleep 300".into(),
            &["--timeout", "0.5"],
            r("line 1"),
        ),
        (
            "answers-then-hangs",
            "read l; echo '{\"reward\": 1}'\nsleep 300".into(),
            &["--timeout", "0.5"],
            r("did not answer line 2"),
        ),
        ("never-reads-big", "sleep 300".into(), &["--timeout", "0.5", "--on-error", "zero"], Expect::Works),
        ("ignores-sigterm", format!("trap '' TERM\n{answer}"), &[], Expect::Works),
    ];
    for (name, body, flags, expect) in scorers {
        let (program, pids) = scorer(dir, name, &body.replace("$0.pids", &format!("{}/{name}.pids", dir.display())));
        let target = if name == "never-reads-big" { big.to_str().unwrap() } else { &f };
        let mut args = vec!["reward", target, "--kind", "command"];
        args.extend_from_slice(flags);
        args.extend(["--", program.as_str()]);
        let mut c = case(format!("scorer {name}"), &args, expect);
        c.pids = Some(pids);
        cases.push(c);
    }
    run_corpus("reward flags and scorers", cases, Duration::from_secs(20));
}

#[test]
#[ignore = "the hostile corpus takes about a minute: cargo test --release --test text_input_corpus -- --ignored"]
fn set_flags_gguf_files_trace_synth_and_device_flags() {
    let root = tempfile::tempdir().unwrap();
    let dir = root.path();
    let mut cases = Vec::new();
    let r = |needle| Expect::Refused(2, needle);
    let config = "configs/tiny-math-grpo.toml";
    for (set, expect) in [
        ("job.name=\"x\"\nsteps = 1", r("more than one key")),
        ("job.name=x\n[rl]\nepochs = 9", r("control character")),
        ("job.steps=1\njob.seed=2", r("more than one key (`job` after it)")),
        ("job.name=\"a\"\n", Expect::Works),
        ("job.name=a\tb", r("control character")),
        ("job.name=..", r("one file-name component")),
        ("job.name=.", r("one file-name component")),
        ("job.name=../x", r("job.name")),
        ("job.name=a/b", r("job.name")),
        ("job.name=", r("job.name")),
        ("job.name=x", Expect::Works),
        ("cluster.device_memory_gb=1e300", r("at most 65536")),
        ("cluster.device_memory_gb=nan", r("device_memory_gb")),
        ("cluster.device_memory_gb=-1", r("device_memory_gb")),
        ("cluster.device_memory_gb=0", r("device_memory_gb")),
        ("train.warmup_memory_gb=1e300", r("[0, 65536]")),
        ("reward.timeout_s=1e300", r("[0.001, 604800]")),
        ("reward.format_bonus=1e308", r("[0, 1000000]")),
        ("reward.format_bonus=-1", r("reward.format_bonus")),
        ("job.steps=-1", r("job.steps")),
        ("job.steps=1e9", r("job.steps")),
        ("job.seed=18446744073709551616", r("job.seed")),
        ("rl.prompts_per_step=4294967296", r("rl.prompts_per_step")),
        ("rl=1", r("not a dotted key")),
        ("=1", r("not a dotted key")),
        ("job..name=x", r("not a dotted key")),
        ("\"job.name\"=x", r("not a dotted key")),
        ("job.name.x=1", r("not a table")),
        ("nosuch.key=1", r("unknown field")),
        ("job.name=[1, 2]", r("job.name")),
        ("cluster.nodes=0", r("cluster.nodes")),
        ("cluster.nodes=2000000", r("cluster.nodes")),
        ("models.actor.vocab=1", r("models.actor.vocab")),
    ] {
        cases.push(case(format!("--set {set:?}"), &["inspect", "config", config, "--set", set], expect));
    }
    cases.extend(gguf_files(dir));
    cases.extend(trace_synth(dir));
    for (flags, expect) in [
        (&["train", config, "--device", "cuda"][..], r("set cluster.data_plane = \"nccl\"")),
        (&["train", config, "--device", "rocm"], r("set cluster.data_plane = \"rccl\"")),
        (&["train", config, "--device", "cuda", "--set", "cluster.data_plane=\"nccl\""], r("CUDA")),
        (&["train", config, "--device", "rocm", "--set", "cluster.data_plane=\"rccl\""], r("ROCm")),
        (&["plan", config, "--gpus", "0"], r("--gpus 0")),
        (&["plan", config, "--gpus", "2000000"], r("between 1 and 1048576")),
        (&["plan", config, "--gpus", "-1"], r("--gpus")),
        (&["plan", config, "--seq-len", "0"], r("--seq-len")),
        (&["plan", config, "--seq-len", "1e12"], r("--seq-len")),
        (&["plan", config, "--seq-len", "99999999999"], r("--seq-len 99999999999")),
        (&["train", config, "--device", "tpu"], r("--device")),
        (&["train", config, "--device", ""], r("--device")),
        (&["--collective-timeout", "nan", "inspect", "config", config], r("collective")),
        (&["--collective-timeout", "1e300", "inspect", "config", config], r("collective")),
        (&["inspect", "config", config, "--steps", "0"], r("job.steps")),
        (&["inspect", "config", config, "--nodes", "0"], r("cluster.nodes")),
        (&["inspect", "config", config, "--seed", "-1"], r("--seed")),
    ] {
        cases.push(case(format!("flags {flags:?}"), flags, expect));
    }
    run_corpus("--set, GGUF, trace synth, device flags", cases, Duration::from_secs(30));
}

/// GGUF files whose metadata, tensors or special ids do not make the model they claim.
fn gguf_files(dir: &Path) -> Vec<Case> {
    let r = |needle| Expect::Refused(2, needle);
    let mut files: Vec<(&str, Vec<u8>, Expect)> = vec![
        ("ok", tiny_llama(257, [8, 258], &[]), Expect::Works),
        ("zero-vocab-embedding", tiny_llama(257, [8, 0], &[]), r("has shape [0, 8]")),
        ("narrow-embedding", tiny_llama(257, [7, 258], &[]), r("`token_embd.weight` has shape [258, 7]")),
        ("eos-outside", tiny_llama(258, [8, 258], &[]), r("`tokenizer.ggml.eos_token_id` is 258")),
        ("bos-outside", tiny_llama(257, [8, 258], &[("tokenizer.ggml.bos_token_id", 1 << 30)]), r("bos_token_id")),
        ("no-layers", tiny_llama(257, [8, 258], &[("llama.block_count", 0)]), r("models.gguf.layers")),
        ("no-heads", tiny_llama(257, [8, 258], &[("llama.attention.head_count", 0)]), r("heads")),
        ("odd-head-dim", tiny_llama(257, [8, 258], &[("llama.attention.head_count", 8)]), r("head_dim")),
        ("kv-not-dividing", tiny_llama(257, [8, 258], &[("llama.attention.head_count_kv", 3)]), r("kv_heads")),
        ("ffn-mismatch", tiny_llama(257, [8, 258], &[("llama.feed_forward_length", 32)]), r("blk.0.ffn_gate.weight")),
        ("hidden-mismatch", tiny_llama(257, [8, 258], &[("llama.embedding_length", 16)]), r("has shape")),
        ("more-layers", tiny_llama(257, [8, 258], &[("llama.block_count", 2)]), r("no tensor `blk.1.")),
        ("no-context", tiny_llama(257, [8, 258], &[("llama.context_length", 0)]), r("`llama.context_length` is 0")),
    ];
    let mut truncated = tiny_llama(257, [8, 258], &[]);
    truncated.truncate(truncated.len() - 100);
    files.push(("truncated", truncated, r("runs past the end of the file")));
    files.push(("not-gguf", b"GGML\x03\x00\x00\x00".to_vec(), r("not a GGUF file")));
    files.push(("empty", Vec::new(), r("the file ends inside the magic number")));
    let mut version = tiny_llama(257, [8, 258], &[]);
    version[4] = 9;
    files.push(("version-9", version, r("GGUF version 9")));
    let mut counts = tiny_llama(257, [8, 258], &[]);
    counts[8..16].copy_from_slice(&u64::MAX.to_le_bytes()); // tensor count
    files.push(("huge-tensor-count", counts, r("")));
    let mut kv = tiny_llama(257, [8, 258], &[]);
    kv[16..24].copy_from_slice(&u64::MAX.to_le_bytes()); // metadata count
    files.push(("huge-metadata-count", kv, r("")));
    files
        .into_iter()
        .map(|(name, bytes, expect)| {
            let file = dir.join(format!("{name}.gguf"));
            std::fs::write(&file, bytes).unwrap();
            let out = dir.join(format!("gguf-{name}"));
            let args = ["model", "import-gguf", file.to_str().unwrap(), "--out", out.to_str().unwrap()];
            case(format!("gguf {name}"), &args, expect)
        })
        .collect()
}

/// `trace synth` sizes and lengths.
fn trace_synth(dir: &Path) -> Vec<Case> {
    let out = dir.join("t.csv");
    let o = out.to_str().unwrap().to_string();
    let r = |needle| Expect::Refused(2, needle);
    let flags: Vec<(&[&str], Expect)> = vec![
        (&["--steps", "1000000000"], r("--steps 1000000000")),
        (&["--steps", "10000001"], r("between 1 and 10000000")),
        (&["--steps", "0"], r("--steps 0")),
        (&["--steps", "-1"], r("--steps")),
        (&["--from", "1e308"], r("--from 1e308")),
        (&["--from", "0.5"], r("--from 0.5")),
        (&["--from", "nan"], r("--from NaN")),
        (&["--to", "inf"], r("--to inf")),
        (&["--to", "9000"], r("cut to --max-len")),
        (&["--max-len", "0"], r("--max-len 0")),
        (&["--max-len", "1e9", "--from", "10", "--to", "10"], r("[1, 1048576]")),
        (&["--gpus", "0"], r("--gpus 0")),
        (&["--gpus", "2000000"], r("between 1 and 1048576")),
        (&["--gpus", "8", "--gpus-per-node", "0"], r("--gpus-per-node 0")),
        (&["--gpus", "8", "--gpus-per-node", "9"], r("--gpus-per-node 9")),
        (&["--shape", "sideways"], r("--shape")),
        (&["--steps", "20", "--shape", "both"], Expect::Works),
        (&["--shape", "paper26"], Expect::Works),
        (&["--steps", "100", "--from", "8192", "--to", "1"], Expect::Works),
    ];
    flags
        .into_iter()
        .map(|(f, expect)| {
            case(format!("trace synth {f:?}"), &[&["trace", "synth", o.as_str()][..], f].concat(), expect)
        })
        .collect()
}

/// Keys set in a job file: section, key, value.
type Edits = Vec<(&'static str, &'static str, String)>;

/// The shipped text job on two ranks, small and without a warm-up, on `data`, with `edits`.
fn text_job(dir: &Path, data: &Path, name: &str, edits: &[(&str, &str, String)]) -> PathBuf {
    let out = dir.join(format!("out-{name}"));
    let mut toml = small_text_job("tiny-math-grpo.toml", data, &out, 1, 4, 0);
    for (section, key, value) in edits {
        toml = set_key(&toml, section, key, Some(value));
    }
    write(dir, &format!("{name}.toml"), &toml)
}

#[test]
#[ignore = "the hostile corpus takes about a minute: cargo test --release --test text_input_corpus -- --ignored"]
fn text_jobs_on_two_ranks() {
    let root = tempfile::tempdir().unwrap();
    let dir = root.path();
    let data = dir.join("data");
    let synth = run_single_within(
        &["data", "synth", data.to_str().unwrap(), "--train", "64", "--eval", "8"],
        Duration::from_secs(60),
    );
    assert!(synth.is_some_and(|o| o.status.success()));
    let bad_tokenizer = dir.join("bad-tokenizer");
    std::fs::create_dir_all(&bad_tokenizer).unwrap();
    for f in ["tokenizer.json", "tokenizer_config.json"] {
        std::fs::copy(data.join("tokenizer").join(f), bad_tokenizer.join(f)).unwrap();
    }
    write(&bad_tokenizer, "generation_config.json", &json!({"eos_token_id": 999_999}).to_string());
    let doubling = dir.join("doubling-template");
    std::fs::create_dir_all(&doubling).unwrap();
    for f in ["tokenizer.json", "tokenizer_config.json", "generation_config.json"] {
        std::fs::copy(data.join("tokenizer").join(f), doubling.join(f)).unwrap();
    }
    let grow: String = (0..60).map(|_| "{% set s = s ~ s %}").collect();
    write(&doubling, "chat_template.jinja", &format!("{{% set s = 'ab' %}}{grow}"));
    let (forks, forks_pids) = scorer(
        dir,
        "forks",
        &format!(
            "sleep 300 &\necho $! >> {}/forks.pids\nwhile read l; do echo '{{\"reward\": 1}}'; done",
            dir.display()
        ),
    );
    let (sleeps, sleeps_pids) = scorer(dir, "sleeps", "sleep 300");
    let command = |program: &str| format!("[{program:?}]");
    let r = |needle| Expect::Refused(2, needle);
    let jobs: Vec<(&str, Edits, Expect, Option<PathBuf>)> = vec![
        ("fine", vec![], Expect::Works, None),
        ("eos-outside", vec![("data", "tokenizer", format!("{bad_tokenizer:?}"))], r("`eos_token_id` is 999999"), None),
        ("template-grows", vec![("data", "tokenizer", format!("{doubling:?}"))], r("at once while rendering"), None),
        ("name-dotdot", vec![("job", "name", "\"..\"".into())], r("one file-name component"), None),
        ("memory-absurd", vec![("cluster", "device_memory_gb", "1e300".into())], r("at most 65536"), None),
        (
            "warm-up-oom",
            vec![("train", "warmup_actor_steps", "2".into()), ("train", "warmup_memory_gb", "0.00001".into())],
            Expect::Refused(1, "ran out of memory"),
            None,
        ),
        (
            "scorer-forks",
            vec![("reward", "kind", "\"command\"".into()), ("reward", "command", command(&forks))],
            Expect::Works,
            Some(forks_pids),
        ),
        (
            "scorer-sleeps-zero",
            vec![
                ("reward", "kind", "\"command\"".into()),
                ("reward", "command", command(&sleeps)),
                ("reward", "timeout_s", "0.5".into()),
                ("reward", "on_error", "\"zero\"".into()),
            ],
            Expect::Works,
            Some(sleeps_pids.clone()),
        ),
        (
            "scorer-sleeps-stop",
            vec![
                ("reward", "kind", "\"command\"".into()),
                ("reward", "command", command(&sleeps)),
                ("reward", "timeout_s", "0.5".into()),
            ],
            Expect::Refused(1, "within 0.5 s"),
            Some(sleeps_pids),
        ),
    ];
    let mut failures = Vec::new();
    let n = jobs.len();
    for (name, edits, expect, pids) in jobs {
        let job = text_job(dir, &data, name, &edits);
        let start = Instant::now();
        let run = common::mpirun()
            .args(["-n", "2"])
            .arg(common::nereus())
            .args(["train", job.to_str().unwrap()])
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        let out = common::wait_within(run, Duration::from_secs(90));
        common::kill_ranks_of(&job);
        let problems = verdict(out.as_ref(), start.elapsed(), expect, pids.as_deref());
        if !problems.is_empty() {
            let stderr = out.as_ref().map(|o| text(o).1).unwrap_or_default();
            failures.push(format!("{name}: {}\n  stderr: {}", problems.join("; "), stderr.trim()));
        }
    }
    eprintln!("hostile corpus, text jobs on two ranks: {n} cases, {} misbehaved", failures.len());
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}
