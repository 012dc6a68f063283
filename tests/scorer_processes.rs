//! A reward scorer command runs in a process group of its own, within its timeout, and leaves
//! nothing behind: offline (`nereus reward`, which once ignored `--timeout` on a scorer that
//! sleeps, under `--on-error stop` and `zero` alike) and in a training job (where a scorer's
//! `sleep 300 &` once outlived a run that exited 0).

mod common;

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use common::{
    assert_status, mpirun, nereus, run_single, run_single_within, set_key, small_text_job, text, wait_within, write,
};

/// An executable shell script `dir/name` holding `body`.
fn script(dir: &Path, name: &str, body: &str) -> PathBuf {
    let path = write(dir, name, &format!("#!/bin/sh\n{body}\n"));
    let made = std::process::Command::new("chmod").arg("+x").arg(&path).status().unwrap();
    assert!(made.success());
    path
}

/// How long a group's SIGKILL may take to land: a signal is delivered when its target next
/// runs, so on a loaded machine a killed process can show as running for a moment after `kill`
/// returns (one such run failed here), while a process never signalled lives for minutes.
const KILL_GRACE: Duration = Duration::from_secs(5);

/// The processes (pids written to `file` by a scorer) still running once [`KILL_GRACE`] has
/// passed or none is left; a zombie left for init to reap has ended.
fn still_running(file: &Path) -> Vec<u32> {
    let start = Instant::now();
    loop {
        let running = running_now(file);
        if running.is_empty() || start.elapsed() >= KILL_GRACE {
            return running;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// The processes (pids written to `file`) running at this moment.
fn running_now(file: &Path) -> Vec<u32> {
    let pids = std::fs::read_to_string(file).unwrap_or_default();
    pids.split_whitespace()
        .filter_map(|p| p.parse::<u32>().ok())
        .filter(|pid| {
            let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
            let state = stat.rsplit(')').next().unwrap_or("").split_whitespace().next().unwrap_or("");
            !stat.is_empty() && state != "Z"
        })
        .collect()
}

/// A scorer that forks `sleep 300 &` (its pid appended to `pids`) and answers reward 1.
fn forking_scorer(dir: &Path, pids: &Path) -> PathBuf {
    let body =
        format!("sleep 300 &\necho $! >> {}\nwhile read line; do echo '{{\"reward\": 1}}'; done", pids.display());
    script(dir, "forks.sh", &body)
}

#[test]
fn offline_scoring_keeps_its_timeout_and_ends_the_scorers_group() {
    let dir = tempfile::tempdir().unwrap();
    // Past a pipe's 64 KiB: the batch writer blocked on a scorer that never read it.
    let line = format!("{{\"response\": \"{}\", \"answer\": \"1\"}}\n", "x".repeat(200));
    let file = write(dir.path(), "big.jsonl", &line.repeat(2000));
    let pids = dir.path().join("sleeper.pids");
    let sleeper = script(dir.path(), "sleeps.sh", &format!("sleep 300 &\necho $! >> {}\nsleep 300", pids.display()));
    for (on_error, status, needle) in [
        ("stop", 2, "did not answer line 1 of the batch within 1 s"),
        ("zero", 0, "2000 scored 0 after a scorer failure"),
    ] {
        let started = Instant::now();
        let args = [
            "reward",
            file.to_str().unwrap(),
            "--kind",
            "command",
            "--timeout",
            "1",
            "--on-error",
            on_error,
            "--",
            sleeper.to_str().unwrap(),
        ];
        let out = run_single_within(&args, Duration::from_secs(60)).unwrap_or_else(|| panic!("{on_error} hung"));
        let (stdout, stderr) = text(&out);
        assert_eq!(out.status.code(), Some(status), "{on_error}: {stdout}{stderr}");
        assert!(stdout.contains(needle) || stderr.contains(needle), "{on_error}: {stdout}{stderr}");
        assert!(started.elapsed() < Duration::from_secs(10), "{on_error} took {:?}", started.elapsed());
        assert_eq!(still_running(&pids), Vec::<u32>::new(), "{on_error}: the scorer's children live on");
    }
    // A scorer that answers and forks: exit 0, its child ended with it.
    let forks_pids = dir.path().join("forks.pids");
    let forks = forking_scorer(dir.path(), &forks_pids);
    let out = run_single(&["reward", file.to_str().unwrap(), "--kind", "command", "--", forks.to_str().unwrap()]);
    assert_status(&out, 0, &[]);
    assert!(!std::fs::read_to_string(&forks_pids).unwrap().trim().is_empty(), "the scorer ran");
    assert_eq!(still_running(&forks_pids), Vec::<u32>::new(), "the scorer's `sleep 300 &` outlived `reward`");
    // Interrupted (Ctrl-C): the group ends too, though the terminal's signal no longer reaches it.
    let pids = dir.path().join("interrupted.pids");
    let sleeper = script(dir.path(), "waits.sh", &format!("echo $$ >> {}\nsleep 300", pids.display()));
    let child = std::process::Command::new(nereus())
        .args(["reward", file.to_str().unwrap(), "--kind", "command", "--timeout", "100", "--"])
        .arg(&sleeper)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let start = Instant::now();
    while std::fs::read_to_string(&pids).unwrap_or_default().is_empty() && start.elapsed() < Duration::from_secs(10) {
        std::thread::sleep(Duration::from_millis(20));
    }
    common::send_signal(child.id(), "-INT");
    let out = wait_within(child, Duration::from_secs(10)).expect("SIGINT ends `reward`");
    assert_eq!(out.status.code(), Some(130), "{:?}", text(&out));
    assert_eq!(still_running(&pids), Vec::<u32>::new(), "the scorer outlived an interrupted `reward`");
}

#[test]
fn a_training_job_ends_its_scorers_group_when_it_ends() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let out = run_single(&["data", "synth", data.to_str().unwrap(), "--train", "64", "--eval", "8"]);
    assert!(out.status.success(), "{:?}", text(&out));
    let pids = dir.path().join("scorer.pids");
    let scorer = forking_scorer(dir.path(), &pids);
    let mut toml = small_text_job("tiny-math-grpo.toml", &data, &dir.path().join("out"), 1, 4, 0);
    for (key, value) in [("kind", "\"command\"".to_string()), ("command", format!("[{:?}]", scorer.to_str().unwrap()))]
    {
        toml = set_key(&toml, "reward", key, Some(&value));
    }
    let job = write(dir.path(), "job.toml", &toml);
    let run = mpirun()
        .arg("-n")
        .arg("2")
        .arg(nereus())
        .args(["train", job.to_str().unwrap()])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let run = wait_within(run, Duration::from_secs(120)).expect("the job ends");
    assert_eq!(run.status.code(), Some(0), "{:?}", text(&run));
    assert!(!std::fs::read_to_string(&pids).unwrap_or_default().trim().is_empty(), "the scorer ran");
    assert_eq!(still_running(&pids), Vec::<u32>::new(), "the scorer's `sleep 300 &` outlived the job");
}
