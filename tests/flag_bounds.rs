//! Numeric flags have the bounds of the config keys they stand for, and sizing flags a bound a
//! real cluster could mean, stated in the error: `trace synth --steps 1000000000` once tried to
//! allocate 48 GB and aborted, `--from 1e308` was silently cut to 8,192 tokens, and `reward
//! --format-bonus 1e308` printed a mean reward of `inf`.

mod common;

use std::time::Duration;

use common::{assert_status, run_single_within, write};

/// `args` exits 2 within 20 s, naming every one of `needles`.
fn refused(args: &[&str], needles: &[&str]) {
    let out = run_single_within(args, Duration::from_secs(20)).unwrap_or_else(|| panic!("{args:?} hung"));
    assert_status(&out, 2, needles);
}

#[test]
fn trace_synth_sizes_are_bounded_and_lengths_never_silently_cut() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("t.csv");
    let o = out.to_str().unwrap();
    for (flags, needles) in [
        (&["--steps", "1000000000"][..], &["--steps 1000000000", "between 1 and 10000000"][..]),
        (&["--steps", "0"], &["--steps 0"]),
        (&["--from", "1e308"], &["--from 1e308", "--max-len = 8192"]),
        (&["--to", "9000"], &["--to 9000", "cut to --max-len"]),
        (&["--max-len", "1e9", "--to", "100"], &["--max-len 1000000000", "[1, 1048576]"]),
        (&["--from", "nan"], &["--from NaN"]),
        (&["--gpus", "4000000000"], &["--gpus 4000000000", "between 1 and 1048576"]),
        (&["--gpus", "8", "--gpus-per-node", "16"], &["--gpus-per-node 16"]),
    ] {
        refused(&[&["trace", "synth", o][..], flags].concat(), needles);
        assert!(!out.exists(), "{flags:?} wrote a trace");
    }
    let ok = run_single_within(
        &["trace", "synth", o, "--steps", "50", "--from", "100", "--to", "8192"],
        Duration::from_secs(20),
    );
    assert_status(&ok.unwrap(), 0, &[]);
}

#[test]
fn reward_flags_have_their_config_keys_bounds() {
    let dir = tempfile::tempdir().unwrap();
    let file = write(dir.path(), "r.jsonl", r#"{"response": "\\boxed{1}", "answer": "1"}"#);
    let f = file.to_str().unwrap();
    for (flags, needles) in [
        (&["--kind", "math", "--format-bonus", "1e308"][..], &["`--format-bonus` = 1e308", "[0, 1000000]"][..]),
        (&["--kind", "math", "--format-bonus", "-1"], &["`--format-bonus` = -1"]),
        (&["--kind", "math", "--format-bonus", "inf"], &["`--format-bonus` = inf"]),
        (&["--kind", "command", "--timeout", "1e300", "--", "true"], &["`--timeout` = 1e300", "[0.001, 604800]"]),
        (&["--kind", "command", "--timeout", "0", "--", "true"], &["`--timeout` = 0"]),
    ] {
        refused(&[&["reward", f][..], flags].concat(), needles);
    }
    let ok = run_single_within(&["reward", f, "--kind", "math", "--format-bonus", "1000000"], Duration::from_secs(20));
    let ok = ok.unwrap();
    assert_status(&ok, 0, &[]);
    assert!(String::from_utf8_lossy(&ok.stdout).contains("mean reward 1000001.0000"));
}

#[test]
fn data_synth_sizes_are_bounded() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("d");
    let o = out.to_str().unwrap();
    for flags in [&["--train", "100000000000"][..], &["--vocab", "100000000"], &["--max-operand", "4000000000"]] {
        refused(&[&["data", "synth", o][..], flags].concat(), &[flags[0], "[1, 1000000]"]);
        assert!(!out.exists(), "{flags:?} wrote data");
    }
}
