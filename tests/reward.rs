//! `nereus reward`: rule-based rewards scored offline, as a user checks one before a run, and
//! every bad file named by its line and field.

mod common;

use common::{run_single, text, write};
use serde_json::Value;

#[test]
fn a_verl_style_file_is_scored_line_by_line() {
    let dir = tempfile::tempdir().unwrap();
    let lines = [
        r#"{"response": "12 + 7 = 19, so the answer is \\boxed{19}.", "reward_model": {"ground_truth": "19"}}"#,
        r#"{"response": "12 + 7 = 8", "reward_model": {"ground_truth": "19"}}"#,
        "",
        r#"{"response": "The answer is 2.50", "reward_model": {"ground_truth": "\\frac{5}{2}"}}"#,
        r#"{"response": "It costs $1,000.", "reward_model": {"ground_truth": 1000}}"#,
    ];
    let file = write(dir.path(), "scored.jsonl", &lines.join("\n"));
    let json = dir.path().join("scores.json");
    let out = run_single(&[
        "reward",
        file.to_str().unwrap(),
        "--kind",
        "math",
        "--format-bonus",
        "0.5",
        "--answer-key",
        "reward_model.ground_truth",
        "--json",
        json.to_str().unwrap(),
    ]);
    let (stdout, stderr) = text(&out);
    assert_eq!(out.status.code(), Some(0), "{stdout}{stderr}");
    assert!(stdout.contains("4 responses: mean reward 0.8750, accuracy 0.7500"), "{stdout}");
    let report: Value = serde_json::from_str(&std::fs::read_to_string(json).unwrap()).unwrap();
    let got: Vec<(u64, f64, &str)> = report["scores"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| (s["line"].as_u64().unwrap(), s["reward"].as_f64().unwrap(), s["extracted"].as_str().unwrap()))
        .collect();
    assert_eq!(got, [(1, 1.5, "19"), (2, 0.0, "8"), (4, 1.0, "2.50"), (5, 1.0, "1,000")]);
}

#[test]
fn bad_files_and_flags_are_refused_with_their_line_and_field() {
    let dir = tempfile::tempdir().unwrap();
    let cases: [(&str, &[u8], &[&str], &str); 7] = [
        (
            "broken.jsonl",
            b"{\"response\": \"1\", \"answer\": \"1\"}\n{\"response\": \n",
            &[],
            "broken.jsonl:2: not JSON",
        ),
        ("missing.jsonl", b"{\"response\": \"1\"}\n", &[], "missing.jsonl:1: no field `answer`"),
        (
            "list.jsonl",
            b"{\"response\": [\"1\"], \"answer\": \"1\"}\n",
            &[],
            "field `response` is a list, not a string",
        ),
        ("latin1.jsonl", b"{\"response\": \"caf\xe9\", \"answer\": \"1\"}\n", &[], "latin1.jsonl:1: not UTF-8 text"),
        ("empty.jsonl", b"", &[], "empty.jsonl: no records"),
        (
            "ok.jsonl",
            b"{\"response\": \"1\", \"answer\": \"1\"}\n",
            &["--format-bonus", "-1"],
            "`--format-bonus` = -1: must lie in [0, 1000000]",
        ),
        ("ok2.jsonl", b"{\"response\": \"1\", \"answer\": \"1\"}\n", &["--answer-key", "a.b"], ":1: no field `a.b`"),
    ];
    for (name, contents, flags, needle) in cases {
        let path = dir.path().join(name);
        std::fs::write(&path, contents).unwrap();
        let mut args = vec!["reward", path.to_str().unwrap(), "--kind", "exact"];
        args.extend_from_slice(flags);
        let out = run_single(&args);
        let (_, stderr) = text(&out);
        assert_eq!(out.status.code(), Some(2), "{name}: {stderr}");
        assert!(stderr.contains(needle), "{name}: {stderr}");
        assert!(!stderr.contains("panicked"), "{stderr}");
    }
    let out = run_single(&["reward", "/nonexistent/file.jsonl", "--kind", "math"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(text(&out).1.contains("cannot read `/nonexistent/file.jsonl`"));
}

/// A scorer a user might write: partial credit for the digits of the answer found in the
/// response, from the record's metadata weight; `crash`, `hang` and `garbage` misbehave.
const SCORER: &str = r#"import json, sys, time
for line in sys.stdin:
    r = json.loads(line)
    if r["response"] in ("crash", "hang", "garbage"):
        if r["response"] == "crash":
            raise SystemExit("scorer: cannot score " + r["prompt"])
        if r["response"] == "hang":
            time.sleep(60)
        print("oops", flush=True)
        continue
    hit = sum(c in r["response"] for c in r["answer"]) / len(r["answer"])
    print(json.dumps({"reward": hit * r["metadata"]["weight"]}), flush=True)
"#;

fn scored_file(dir: &std::path::Path, responses: &[&str]) -> std::path::PathBuf {
    let lines: Vec<String> = responses
        .iter()
        .map(|r| {
            serde_json::json!({"prompt": "q", "response": r, "answer": "19", "metadata": {"weight": 2.0}}).to_string()
        })
        .collect();
    write(dir, "responses.jsonl", &lines.join("\n"))
}

#[test]
fn a_scorer_command_scores_a_file_and_its_failures_are_named() {
    let dir = tempfile::tempdir().unwrap();
    let scorer = write(dir.path(), "score.py", SCORER);
    let json = dir.path().join("scores.json");
    let run = |responses: &[&str], extra: &[&str]| {
        let file = scored_file(dir.path(), responses);
        let mut args = vec!["reward", file.to_str().unwrap(), "--kind", "command", "--timeout", "2"];
        args.extend_from_slice(extra);
        args.extend_from_slice(&["--json", json.to_str().unwrap(), "--", "python3", scorer.to_str().unwrap()]);
        let out = run_single(&args);
        let (stdout, stderr) = text(&out);
        (out.status.code(), stdout, stderr)
    };
    let (code, stdout, stderr) = run(&["19", "it is 9", "none"], &[]);
    assert_eq!(code, Some(0), "{stdout}{stderr}");
    assert!(stdout.contains("3 responses: mean reward 1.0000\n"), "{stdout}");
    let report: Value = serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    let rewards: Vec<f64> =
        report["scores"].as_array().unwrap().iter().map(|s| s["reward"].as_f64().unwrap()).collect();
    assert_eq!(rewards, [2.0, 1.0, 0.0]);
    for (bad, needle) in [
        ("crash", "line 2 of the batch; its stderr ended: scorer: cannot score q"),
        ("hang", "did not answer line 2 of the batch within 2 s"),
        ("garbage", "answered line 2 of the batch with \"oops\""),
    ] {
        let started = std::time::Instant::now();
        let (code, _, stderr) = run(&["19", bad, "19"], &[]);
        assert_eq!(code, Some(2), "{bad}: {stderr}");
        assert!(stderr.contains("responses.jsonl: reward command `python3 ") && stderr.contains(needle), "{stderr}");
        assert!(started.elapsed().as_secs() < 15, "{bad} took {:?}", started.elapsed());
    }
    let (code, stdout, stderr) = run(&["19", "garbage", "crash", "hang", "19"], &["--on-error", "zero"]);
    assert_eq!(code, Some(0), "{stderr}");
    assert!(stdout.contains("5 responses: mean reward 0.8000, 3 scored 0 after a scorer failure"), "{stdout}");
    for (argv, needle) in [
        (vec!["/nonexistent/score"], "reward command `/nonexistent/score` cannot start"),
        (vec![], "--kind command needs the scorer after `--`"),
    ] {
        let file = scored_file(dir.path(), &["19"]);
        let mut args = vec!["reward", file.to_str().unwrap(), "--kind", "command", "--"];
        args.extend_from_slice(&argv);
        let out = run_single(&args);
        let (_, stderr) = text(&out);
        assert_eq!(out.status.code(), Some(2), "{stderr}");
        assert!(stderr.contains(needle), "{stderr}");
    }
}
