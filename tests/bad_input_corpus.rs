//! A generated corpus of bad input: bad pools and pool files, fail-rank
//! variants, resume variants, simulate and logprobs inputs, signals at seeded random times, and
//! small, inode-limited and read-only file systems. Every case ends with a clear error (a
//! non-zero status, a message naming the problem) or correct behaviour (status 0, every step
//! recorded): never an abort, a panic, a hang, an exit 0 on nonsense, or a lost step.
//! Each test prints its counts; `tests/pools_resume_signals.rs` holds one test per defect found.

mod common;

use std::path::{Path, PathBuf};
use std::process::{Output, Stdio};
use std::time::{Duration, Instant};

use common::{fast_ppo, run_mpi, run_single, send_signal, set_key, step_records, text, write};

/// What a case must end with.
#[derive(Clone, Copy, Debug)]
enum Expect {
    /// Status 0.
    Works,
    /// This status, and the message names the problem.
    Refused(i32, &'static str),
}

/// A case: its name, what it must end with, and how to run it.
type Case<'a> = (String, Expect, Box<dyn FnOnce() -> Output + 'a>);

/// One case's verdict: `None` when it ended as expected.
fn verdict(name: &str, out: &Output, elapsed: Duration, expect: Expect) -> Option<String> {
    let (stdout, stderr) = text(out);
    let mut problems = Vec::new();
    if out.status.code().is_none() || out.status.code() == Some(134) {
        problems.push(format!("ended by a signal or an abort: {:?}", out.status));
    }
    if stderr.contains("panicked") || stderr.contains("RUST_BACKTRACE") {
        problems.push("panicked".into());
    }
    if elapsed > Duration::from_secs(60) {
        problems.push(format!("took {elapsed:?}"));
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
    (!problems.is_empty())
        .then(|| format!("{name}: {}\n  stdout: {}\n  stderr: {}", problems.join("; "), stdout.trim(), stderr.trim()))
}

/// Runs every case, reports the counts, fails on any misbehaviour.
fn run_corpus(kind: &str, cases: Vec<Case<'_>>) -> usize {
    let n = cases.len();
    let mut failures = Vec::new();
    for (name, expect, run) in cases {
        let start = Instant::now();
        let out = run();
        failures.extend(verdict(&name, &out, start.elapsed(), expect));
    }
    eprintln!("hostile corpus, {kind}: {n} cases, {} misbehaved", failures.len());
    assert!(failures.is_empty(), "{} of {n} {kind} cases misbehaved:\n{}", failures.len(), failures.join("\n"));
    n
}

fn single(args: Vec<String>) -> Box<dyn FnOnce() -> Output> {
    Box::new(move || run_single(&args.iter().map(String::as_str).collect::<Vec<_>>()))
}

fn strings(args: &[&str]) -> Vec<String> {
    args.iter().map(|s| s.to_string()).collect()
}

const LLAMA: &str = "configs/llama3.1-8b-ppo.toml";
const P26: &str = "configs/traces/paper-26.csv";

#[test]
fn simulate_flags_and_traces() {
    let dir = tempfile::tempdir().unwrap();
    let mut cases: Vec<Case<'static>> = Vec::new();
    for flag in ["--restart-s", "--fs-gbps", "--noise", "--op-error", "--gamma", "--gpus", "--seeds"] {
        for value in ["nan", "inf", "-1", "-1e300", "1e300", "", "abc"] {
            // A file system of 1e300 GB/s is absurd but harmless: any positive bandwidth is taken.
            let expect = if (flag, value) == ("--fs-gbps", "1e300") { Expect::Works } else { Expect::Refused(2, flag) };
            let args = strings(&["simulate", LLAMA, "--trace", P26, flag, value]);
            cases.push((format!("simulate {flag} {value:?}"), expect, single(args)));
        }
    }
    let traces: [(&str, &[u8], Expect); 12] = [
        ("bom", b"\xef\xbb\xbfstep,seq_len_mean\n0,100\n", Expect::Works),
        ("crlf", b"step,seq_len_mean\r\n0,100\r\n1,200\r\n", Expect::Works),
        ("empty", b"", Expect::Refused(2, "empty file")),
        ("header only", b"step,seq_len_mean\n", Expect::Refused(2, "no rows")),
        ("bad step", b"step,seq_len_mean\nx,100\n", Expect::Refused(2, "not a step number")),
        ("step backwards", b"step,seq_len_mean\n3,100\n2,100\n", Expect::Refused(2, "does not follow")),
        ("negative length", b"step,seq_len_mean\n0,-5\n", Expect::Refused(2, "seq_len_mean")),
        ("huge length", b"step,seq_len_mean\n0,1e12\n", Expect::Refused(2, "at most")),
        ("huge pool", b"step,available_gpus\n0,4000000000\n", Expect::Refused(2, "between 1 and")),
        ("zero pool", b"step,available_gpus\n0,0\n", Expect::Refused(2, "between 1 and")),
        ("not UTF-8", b"step,seq_len_mean\n0,\xff\xfe\n", Expect::Refused(2, "line 2: not UTF-8")),
        ("twice", b"step,step\n0,0\n", Expect::Refused(2, "appears twice")),
    ];
    for (name, bytes, expect) in traces {
        let path = dir.path().join(format!("{}.csv", name.replace(' ', "-")));
        std::fs::write(&path, bytes).unwrap();
        let args = strings(&["simulate", LLAMA, "--trace", path.to_str().unwrap(), "--policies", "static"]);
        cases.push((format!("trace {name}"), expect, single(args)));
    }
    let missing = strings(&["simulate", LLAMA, "--trace", "/nonexistent/t.csv"]);
    cases.push(("missing trace".into(), Expect::Refused(2, "/nonexistent/t.csv"), single(missing)));
    run_corpus("simulate", cases);
}

/// A tiny model directory (the actor of a one-step run).
fn model_dir(dir: &Path) -> PathBuf {
    let job = write(dir, "m.toml", &set_key(&fast_ppo(), "job", "steps", Some("1")));
    let out = dir.join("m");
    let run = run_mpi(2, &["train", job.to_str().unwrap(), "--output-dir", out.to_str().unwrap()]);
    assert!(run.status.success(), "{}", text(&run).1);
    out.join("checkpoints/step-1/actor")
}

#[test]
fn logprobs_inputs() {
    let dir = tempfile::tempdir().unwrap();
    let model = model_dir(dir.path());
    let checkpoint = model.parent().unwrap().to_path_buf();
    let long: String = format!("[[{}]]", (0..40).map(|i| (i % 30 + 1).to_string()).collect::<Vec<_>>().join(","));
    let token_files: [(&str, &[u8], Expect); 12] = [
        ("ok", b"[[1,2,3],[4,5]]", Expect::Works),
        ("no sequence", b"[]", Expect::Refused(2, "holds no sequence")),
        ("empty sequence", b"[[]]", Expect::Refused(2, "sequence 0 is empty")),
        ("not JSON", b"[[1,2", Expect::Refused(2, "expected a JSON list")),
        ("negative id", b"[[1,-2]]", Expect::Refused(2, "expected a JSON list")),
        ("float id", b"[[1.5]]", Expect::Refused(2, "expected a JSON list")),
        ("outside vocabulary", b"[[1,32]]", Expect::Refused(2, "outside the vocabulary")),
        ("huge id", b"[[99999999999999999999]]", Expect::Refused(2, "expected a JSON list")),
        ("object", b"{\"tokens\": [1]}", Expect::Refused(2, "expected a JSON list")),
        ("flat list", b"[1,2,3]", Expect::Refused(2, "expected a JSON list")),
        ("not UTF-8", b"[[1,\xff]]", Expect::Refused(2, "not UTF-8")),
        ("longer than the model", long.as_bytes(), Expect::Refused(2, "max_position_embeddings")),
    ];
    let mut cases: Vec<Case<'static>> = Vec::new();
    for (name, bytes, expect) in token_files {
        let path = dir.path().join(format!("{}.json", name.replace(' ', "-")));
        std::fs::write(&path, bytes).unwrap();
        let args = strings(&["logprobs", model.to_str().unwrap(), "--tokens", path.to_str().unwrap()]);
        cases.push((format!("tokens {name}"), expect, single(args)));
    }
    let ok = dir.path().join("ok.json");
    for (flags, expect) in [
        (vec!["--tp", "0"], Expect::Refused(2, "tp")),
        (vec!["--pp", "0"], Expect::Refused(2, "pp")),
        (vec!["--tp", "3"], Expect::Refused(2, "")),
        (vec!["--micro-batch", "0"], Expect::Refused(2, "--micro-batch 0")),
        (vec!["--tp", "-1"], Expect::Refused(2, "--tp")),
    ] {
        let mut args = strings(&["logprobs", model.to_str().unwrap(), "--tokens", ok.to_str().unwrap()]);
        args.extend(strings(&flags));
        cases.push((format!("logprobs {flags:?}"), expect, single(args)));
    }
    for (name, target, expect) in [
        ("missing directory", PathBuf::from("/nonexistent/model"), Expect::Refused(2, "/nonexistent/model")),
        ("a checkpoint", checkpoint, Expect::Refused(2, "this is a checkpoint")),
        ("a file", ok.clone(), Expect::Refused(2, "")),
    ] {
        let args = strings(&["logprobs", target.to_str().unwrap(), "--tokens", ok.to_str().unwrap()]);
        cases.push((format!("model {name}"), expect, single(args)));
    }
    run_corpus("logprobs", cases);
}

/// `train JOB --output-dir OUT ARGS…` on two ranks.
fn train2(job: &Path, out: &Path, args: &[&str]) -> Output {
    let mut all = vec!["train", job.to_str().unwrap(), "--output-dir", out.to_str().unwrap()];
    all.extend_from_slice(args);
    run_mpi(2, &all)
}

/// A case that trains on two ranks in its own output directory under `dir`; a run that works
/// must have recorded every one of its `steps`.
fn train_case(dir: &Path, job: &Path, name: &str, args: &[&str], expect: Expect, steps: usize) -> Case<'static> {
    let out = dir.join(name.replace(|c: char| !c.is_ascii_alphanumeric(), "_"));
    let (job, args) = (job.to_path_buf(), strings(args));
    let run = move || {
        let out_put = train2(&job, &out, &args.iter().map(String::as_str).collect::<Vec<_>>());
        let recorded = step_records(&out).len();
        if out_put.status.success() && recorded != steps {
            panic!("{}: {recorded} steps recorded, want {steps}", out.display());
        }
        out_put
    };
    (name.to_string(), expect, Box::new(run))
}

#[test]
fn pools_pool_files_and_rank_loss() {
    let dir = tempfile::tempdir().unwrap();
    let job = write(dir.path(), "job.toml", &set_key(&fast_ppo(), "job", "steps", Some("2")));
    let mut cases = Vec::new();
    for (pool, expect) in [
        ("2", Expect::Works),
        ("0-1", Expect::Works),
        ("1", Expect::Works),
        ("0", Expect::Refused(2, "a pool of 0 ranks")),
        ("3", Expect::Refused(2, "the world has 2")),
        ("1-1", Expect::Refused(2, "not the first")),
        ("0-1,3", Expect::Refused(2, "names rank 3")),
        ("x", Expect::Refused(2, "neither a rank count")),
        ("-1", Expect::Refused(2, "--pool")),
        ("0-", Expect::Refused(2, "neither a rank count")),
        ("18446744073709551616", Expect::Refused(2, "neither a rank count")),
        ("0-4294967295", Expect::Refused(2, "names rank 4294967295")),
    ] {
        let args = ["--pool", pool, "--policy", "nereus"];
        cases.push(train_case(dir.path(), &job, &format!("--pool {pool}"), &args, expect, 2));
    }
    for (content, expect) in [
        ("", Expect::Refused(2, "is empty")),
        ("abc", Expect::Refused(2, "neither a rank count")),
        ("0-99999999", Expect::Refused(2, "names rank")),
        ("3", Expect::Refused(2, "the world has 2")),
        ("1", Expect::Works),
    ] {
        let name = format!("pool file {content:?}");
        let out = dir.path().join(name.replace(|c: char| !c.is_ascii_alphanumeric(), "_"));
        std::fs::create_dir_all(&out).unwrap();
        std::fs::write(out.join("pool"), content).unwrap();
        cases.push(train_case(dir.path(), &job, &name, &["--policy", "nereus"], expect, 2));
    }
    // A plan where each rank holds the only training replica of one model (the actor on 0, the
    // critic on 1), so a lost rank's model must come back from a checkpoint. The planner's own
    // choice depends on the cost model (it has been DP on both ranks, which loses nothing), and
    // a minimum gain of 90% keeps the controller from moving away before the loss.
    let toml = set_key(&set_key(&fast_ppo(), "job", "steps", Some("3")), "policy", "mode", Some("\"nereus\""));
    let mut toml = set_key(&toml, "policy", "min_gain", Some("0.9"));
    for (ms, dp, ranks) in [
        ("actor/generation", 2, "[0, 1]"),
        ("reference/inference", 2, "[0, 1]"),
        ("reward/inference", 2, "[0, 1]"),
        ("critic/inference", 2, "[0, 1]"),
        ("actor/training", 1, "[0]"),
        ("critic/training", 1, "[1]"),
    ] {
        toml.push_str(&format!("\n[plan.\"{ms}\"]\ntp = 1\npp = 1\ndp = {dp}\nranks = {ranks}\n"));
    }
    let nereus = write(dir.path(), "n.toml", &toml);
    for (rank, at, expect) in [
        ("1", "1", Expect::Refused(2, "no complete checkpoint to restore it from")),
        ("0", "2", Expect::Works),
        ("2", "1", Expect::Refused(2, "--fail-rank 2")),
        ("1", "0", Expect::Refused(2, "--at-step 0")),
        ("1", "3", Expect::Refused(2, "would never be lost")),
        ("4294967295", "1", Expect::Refused(2, "--fail-rank")),
    ] {
        let args = ["--fail-rank", rank, "--at-step", at];
        cases.push(train_case(dir.path(), &nereus, &format!("--fail-rank {rank} --at-step {at}"), &args, expect, 3));
    }
    run_corpus("pools and rank loss", cases);
}

#[test]
fn resume_variants() {
    let dir = tempfile::tempdir().unwrap();
    let job = write(dir.path(), "job.toml", &set_key(&fast_ppo(), "train", "checkpoint_every", Some("1")));
    let other = write(dir.path(), "other.toml", &set_key(&fast_ppo(), "job", "seed", Some("99")));
    let base = dir.path().join("base");
    assert!(train2(&job, &base, &["--steps", "2"]).status.success());
    let step2 = base.join("checkpoints/step-2");
    let damaged = dir.path().join("damaged");
    common_copy(&base, &damaged);
    std::fs::write(damaged.join("checkpoints/step-2/state.json"), "{}").unwrap();
    let s = |p: &Path| p.to_str().unwrap().to_string();
    let mut cases: Vec<Case<'static>> = Vec::new();
    let mut add = |name: &str, job: &Path, out: PathBuf, args: Vec<String>, expect: Expect| {
        let job = job.to_path_buf();
        let run = move || train2(&job, &out, &args.iter().map(String::as_str).collect::<Vec<_>>());
        cases.push((name.to_string(), expect, Box::new(run) as Box<dyn FnOnce() -> Output>));
    };
    let fresh = |n: &str| dir.path().join(n);
    add(
        "missing directory",
        &job,
        fresh("a"),
        strings(&["--resume", "/nonexistent/step-3"]),
        Expect::Refused(2, "/nonexistent"),
    );
    add(
        "a sidecar path",
        &job,
        fresh("b"),
        vec!["--resume".into(), s(&step2.join("state.json"))],
        Expect::Refused(2, "is a file"),
    );
    add(
        "latest with none",
        &job,
        fresh("c"),
        strings(&["--resume", "latest", "--steps", "1"]),
        Expect::Refused(2, "--resume auto"),
    );
    add("auto with none", &job, fresh("d"), strings(&["--resume", "auto", "--steps", "1"]), Expect::Works);
    add(
        "another job",
        &other,
        fresh("e"),
        vec!["--resume".into(), s(&step2), "--steps".into(), "3".into()],
        Expect::Refused(2, "does not match"),
    );
    add(
        "damaged sidecar",
        &job,
        damaged.clone(),
        strings(&["--resume", "latest", "--steps", "3"]),
        Expect::Refused(2, "state.json"),
    );
    add(
        "nothing left to run",
        &job,
        base.clone(),
        strings(&["--resume", "latest", "--steps", "2"]),
        Expect::Refused(2, "nothing to run"),
    );
    add(
        "a fresh start over a run",
        &job,
        base.clone(),
        strings(&["--steps", "3"]),
        Expect::Refused(2, "already holds a run"),
    );
    add("auto with a checkpoint", &job, base.clone(), strings(&["--resume", "auto", "--steps", "3"]), Expect::Works);
    run_corpus("resume", cases);
}

fn common_copy(from: &Path, to: &Path) {
    assert!(std::process::Command::new("cp").arg("-r").arg(from).arg(to).status().unwrap().success());
}

/// A seeded delay in `[lo, hi)` milliseconds (SplitMix64 of the case number).
fn delay(case: u64, lo: u64, hi: u64) -> Duration {
    let mut z = case.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    Duration::from_millis(lo + (z ^ (z >> 31)) % (hi - lo))
}

/// Stop signals (SIGTERM, SIGUSR1, SIGUSR2) to `scripts/mpirun.sh`, the documented launcher,
/// and SIGHUP to rank 0, each at a seeded random time from MPI bring-up to mid-run: a stop
/// ends with status 75 and a checkpoint of every recorded step, a SIGHUP changes nothing.
#[test]
fn signals_at_random_times() {
    let dir = tempfile::tempdir().unwrap();
    let job = write(dir.path(), "job.toml", &set_key(&fast_ppo(), "train", "checkpoint_every", Some("0")));
    let mut failures = Vec::new();
    let signals = ["TERM", "USR1", "USR2", "HUP", "TERM", "USR1", "USR2", "HUP"];
    for (case, signal) in signals.iter().enumerate() {
        let out = dir.path().join(format!("s{case}"));
        let steps = if *signal == "HUP" { "6" } else { "400" };
        let run = std::process::Command::new("bash")
            .arg(common::repo().join("scripts/mpirun.sh"))
            .args(["2", "train", job.to_str().unwrap(), "--steps", steps, "--output-dir", out.to_str().unwrap()])
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        std::thread::sleep(delay(case as u64, 50, 3000));
        let target = if *signal == "HUP" { common::rank0_of(&out) } else { Some(run.id()) };
        if let Some(pid) = target {
            send_signal(pid, &format!("-{signal}"));
        }
        let finished = run.wait_with_output().unwrap();
        let (code, recorded) = (finished.status.code(), step_records(&out).len());
        let latest = std::fs::read_to_string(out.join("checkpoints/latest")).unwrap_or_default();
        let ok = match *signal {
            "HUP" => code == Some(0) && recorded == 6,
            _ => code == Some(75) && latest.trim() == format!("step-{recorded}"),
        };
        if !ok {
            let stderr = String::from_utf8_lossy(&finished.stderr);
            failures.push(format!(
                "SIG{signal} case {case}: status {code:?}, {recorded} steps, latest {latest:?}: {stderr}"
            ));
        }
    }
    eprintln!("hostile corpus, signals: {} cases, {} misbehaved", signals.len(), failures.len());
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

#[test]
fn small_inode_limited_and_read_only_file_systems() {
    let dir = tempfile::tempdir().unwrap();
    let job = write(dir.path(), "job.toml", &set_key(&fast_ppo(), "job", "steps", Some("2")));
    let mut cases: Vec<Case<'static>> = Vec::new();
    let mut mounts = Vec::new();
    for (options, expect) in [
        ("size=64k", Expect::Refused(1, "")),
        ("size=64m,nr_inodes=12", Expect::Refused(1, "")),
        ("size=64m,ro", Expect::Refused(1, "cannot create directory")),
        ("size=64m", Expect::Works),
    ] {
        let Some(fs) = common::Tmpfs::mount_with(options) else {
            assert!(std::env::var("CI").is_err(), "CI runs as root and must be able to mount a tmpfs");
            eprintln!("note: file-system cases skipped: cannot mount a tmpfs here (needs root)");
            return;
        };
        let out = fs.path.join("out");
        let job = job.clone();
        let check_out = out.clone();
        let run = move || {
            let o = train2(&job, &out, &["--steps", "2"]);
            // Whatever failed, no checkpoint is half there: `latest` names a complete one or none.
            let latest = std::fs::read_to_string(check_out.join("checkpoints/latest")).unwrap_or_default();
            if !latest.trim().is_empty() {
                assert!(check_out.join("checkpoints").join(latest.trim()).join("state.json").is_file());
            }
            o
        };
        cases.push((format!("tmpfs {options}"), expect, Box::new(run)));
        mounts.push(fs);
    }
    run_corpus("file systems", cases);
    drop(mounts);
}
