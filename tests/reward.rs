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
            "--format-bonus must be",
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
