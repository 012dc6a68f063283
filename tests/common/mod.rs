//! Helpers shared by the integration tests: the built binary, mpirun, and config editing.
#![allow(dead_code)]

pub mod gguf;

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

/// The `nereus` binary cargo built for these tests.
pub fn nereus() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_nereus"))
}

/// The repository root (for `configs/`).
pub fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// Runs `nereus ARGS` as a single process (an MPI singleton).
pub fn run_single(args: &[&str]) -> Output {
    Command::new(nereus()).args(args).current_dir(repo()).output().expect("nereus starts")
}

/// `mpirun` with what this machine needs: root allowed, more ranks than cores, shared memory.
///
/// A job that has failed is torn down at once: Open MPI's `odls_base_sigkill_timeout` (1 s by
/// default) makes mpirun sleep twice before it SIGKILLs the ranks of a failed job, even when
/// they have all exited already, which added 2 s to every launch a test expects to fail. Jobs
/// that a test stops with a signal through mpirun keep the default grace ([`spawn_mpi`]).
pub fn mpirun() -> Command {
    let mut cmd = Command::new("mpirun");
    cmd.env("OMPI_ALLOW_RUN_AS_ROOT", "1")
        .env("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1")
        .env("OMPI_MCA_btl", "self,vader")
        .env("OMPI_MCA_rmaps_base_oversubscribe", "1")
        .env("OMPI_MCA_odls_base_sigkill_timeout", "0")
        .current_dir(repo());
    cmd
}

/// Runs `mpirun -n N nereus ARGS`.
pub fn run_mpi(n: usize, args: &[&str]) -> Output {
    mpirun().arg("-n").arg(n.to_string()).arg(nereus()).args(args).output().expect("mpirun starts")
}

/// Starts `mpirun -n N nereus ARGS` in the background, stderr piped and stdout as `stdout`, for
/// tests that act on a running job (signals, pool files). mpirun's default grace between the
/// SIGTERM it passes on and its SIGKILL (1 s) is kept: the ranks checkpoint within it.
pub fn spawn_mpi(n: usize, args: &[&str], stdout: Stdio) -> Child {
    mpirun()
        .env("OMPI_MCA_odls_base_sigkill_timeout", "1")
        .arg("-n")
        .arg(n.to_string())
        .arg(nereus())
        .args(args)
        .stdout(stdout)
        .stderr(Stdio::piped())
        .spawn()
        .expect("mpirun starts")
}

/// Waits until the run writing to `out` has recorded `n` steps: `false` when `job` ended or
/// `limit` passed first.
pub fn wait_for_steps(out: &Path, n: usize, job: &mut Child, limit: Duration) -> bool {
    let start = Instant::now();
    while step_records(out).len() < n {
        if job.try_wait().unwrap().is_some() || start.elapsed() >= limit {
            return false;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    true
}

/// Sends `signal` (`"-TERM"`, `"-USR1"`) to `pid` with kill(1); whether kill succeeded.
pub fn send_signal(pid: u32, signal: &str) -> bool {
    Command::new("kill").args([signal, &pid.to_string()]).status().unwrap().success()
}

/// stdout and stderr as text.
pub fn text(out: &Output) -> (String, String) {
    (String::from_utf8_lossy(&out.stdout).into_owned(), String::from_utf8_lossy(&out.stderr).into_owned())
}

/// The text of a shipped config.
pub fn shipped(name: &str) -> String {
    std::fs::read_to_string(repo().join("configs").join(name)).expect("shipped config exists")
}

/// Sets `key = value` in `[section]` (replacing the key's line, or adding it after the header);
/// `None` removes the key.
pub fn set_key(toml: &str, section: &str, key: &str, value: Option<&str>) -> String {
    let header = format!("[{section}]");
    let mut out = Vec::new();
    let mut in_section = false;
    let mut done = false;
    for line in toml.lines() {
        let trimmed = line.trim();
        if trimmed.starts_with('[') {
            if in_section && !done {
                if let Some(v) = value {
                    out.push(format!("{key} = {v}"));
                }
                done = true;
            }
            in_section = trimmed == header;
        } else if in_section && !done && trimmed.split('=').next().map(str::trim) == Some(key) {
            if let Some(v) = value {
                out.push(format!("{key} = {v}"));
            }
            done = true;
            continue;
        }
        out.push(line.to_string());
    }
    if in_section && !done {
        if let Some(v) = value {
            out.push(format!("{key} = {v}"));
        }
    }
    out.join("\n") + "\n"
}

/// Removes a whole `[section]` table.
pub fn drop_section(toml: &str, section: &str) -> String {
    let header = format!("[{section}]");
    let mut skipping = false;
    let mut out = Vec::new();
    for line in toml.lines() {
        if line.trim().starts_with('[') {
            skipping = line.trim() == header;
        }
        if !skipping {
            out.push(line);
        }
    }
    out.join("\n") + "\n"
}

/// Writes `text` to `dir/name` and returns the path.
pub fn write(dir: &Path, name: &str, text: &str) -> PathBuf {
    let path = dir.join(name);
    std::fs::write(&path, text).expect("temp file writes");
    path
}

/// A fresh seed for a randomized self-test, printed so that a failure can be reproduced.
pub fn fresh_seed(what: &str) -> u64 {
    let seed =
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_nanos() as u64 % 1_000_000;
    eprintln!("{what} --seed {seed}");
    seed
}

/// Runs `mpirun -n 8 nereus selftest KIND --cases N --seed S`, requires success and no failed
/// check, and returns rank 0's JSON summary.
pub fn selftest_summary(kind: &str, cases: &str, seed: &str) -> serde_json::Value {
    let out = run_mpi(8, &["selftest", kind, "--cases", cases, "--seed", seed]);
    let (stdout, stderr) = text(&out);
    assert!(out.status.success(), "selftest {kind}, seed {seed}: {stderr}");
    let summary: serde_json::Value = serde_json::from_str(stdout.trim()).expect("one JSON summary from rank 0");
    assert_eq!(summary["failures"].as_array().unwrap().len(), 0, "{summary}");
    summary
}

/// Runs `mpirun -n N nereus ARGS` with extra environment variables; returns the output and the
/// wall time.
pub fn run_mpi_timed(n: usize, env: &[(&str, &str)], args: &[&str]) -> (Output, std::time::Duration) {
    let start = std::time::Instant::now();
    let out = mpirun()
        .envs(env.iter().copied())
        .arg("-n")
        .arg(n.to_string())
        .arg(nereus())
        .args(args)
        .output()
        .expect("mpirun starts");
    (out, start.elapsed())
}

/// tiny-ppo for fast hostile runs: no warm-ups, a checkpoint every step, and the watchdog at
/// its default (300 s), so a run that hangs instead of failing fast shows in its wall time.
pub fn fast_ppo() -> String {
    let toml = shipped("tiny-ppo.toml");
    let toml = set_key(&toml, "job", "collective_timeout_s", None);
    let toml = set_key(&toml, "train", "warmup_actor_steps", Some("0"));
    let toml = set_key(&toml, "train", "warmup_reward_steps", Some("0"));
    set_key(&toml, "train", "checkpoint_every", Some("1"))
}

/// The shipped text job `config` made small on `data` (a `nereus data synth` directory): `steps`
/// steps of `prompts` prompts × 2 samples into `out`, `warmup` supervised warm-up steps, no eval.
pub fn small_text_job(config: &str, data: &Path, out: &Path, steps: u32, prompts: u32, warmup: u32) -> String {
    let mut toml = shipped(config);
    for (section, key, value) in [
        ("job", "steps", steps.to_string()),
        ("job", "output_dir", format!("{out:?}")),
        ("rl", "prompts_per_step", prompts.to_string()),
        ("rl", "samples_per_prompt", "2".into()),
        ("rl", "mini_batch", "8".into()),
        ("rl", "micro_batch", "4".into()),
        ("data", "train", format!("{:?}", data.join("train.jsonl"))),
        ("data", "eval", format!("{:?}", data.join("eval.jsonl"))),
        ("data", "tokenizer", format!("{:?}", data.join("tokenizer"))),
        ("data", "eval_every", "0".into()),
        ("train", "warmup_actor_steps", warmup.to_string()),
    ] {
        toml = set_key(&toml, section, key, Some(&value));
    }
    toml
}

/// A tmpfs mounted for one test (root only): `size` bytes, read-only when asked; unmounted on
/// drop. `None` where mounting is not allowed.
pub struct Tmpfs {
    /// The mount point.
    pub path: PathBuf,
    _dir: tempfile::TempDir,
}

impl Tmpfs {
    /// Mounts a tmpfs of `size` bytes.
    pub fn mount(size: u64, read_only: bool) -> Option<Tmpfs> {
        Tmpfs::mount_with(&format!("size={size}{}", if read_only { ",ro" } else { "" }))
    }

    /// Mounts a tmpfs with mount options `options` (`size=…,nr_inodes=…`).
    pub fn mount_with(options: &str) -> Option<Tmpfs> {
        let dir = tempfile::tempdir().ok()?;
        let ok = Command::new("mount")
            .args(["-t", "tmpfs", "-o", options, "tmpfs"])
            .arg(dir.path())
            .status()
            .ok()?
            .success();
        ok.then(|| Tmpfs { path: dir.path().to_path_buf(), _dir: dir })
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg(&self.path).status();
    }
}

/// Step records of a run's metrics (event records such as a resume marker left out).
pub fn step_records(out: &Path) -> Vec<serde_json::Value> {
    std::fs::read_to_string(out.join("metrics.jsonl"))
        .unwrap_or_default()
        .lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok()) // a line being written is skipped
        .filter(|r| r.get("event").is_none())
        .collect()
}

/// The `nereus` processes whose command line names `dir` (the ranks of the job writing there).
pub fn ranks_of(dir: &Path) -> Vec<u32> {
    let needle = dir.to_str().unwrap().to_string();
    std::fs::read_dir("/proc")
        .map(|d| {
            d.flatten()
                .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
                .filter(|pid| {
                    let comm = std::fs::read_to_string(format!("/proc/{pid}/comm")).unwrap_or_default();
                    let cmdline = std::fs::read_to_string(format!("/proc/{pid}/cmdline")).unwrap_or_default();
                    comm.trim() == "nereus" && cmdline.contains(&needle)
                })
                .collect()
        })
        .unwrap_or_default()
}

/// Kills (SIGKILL) every `nereus` process whose command line names `dir` (ranks an mpirun left
/// behind when it was killed), and waits until they are gone.
pub fn kill_ranks_of(dir: &Path) {
    for pid in ranks_of(dir) {
        send_signal(pid, "-KILL");
    }
    let start = std::time::Instant::now();
    while !ranks_of(dir).is_empty() && start.elapsed() < Duration::from_secs(10) {
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Waits until `n` ranks of the job writing to `dir` catch `signal` (its bit is set in the
/// `SigCgt` mask of `/proc/PID/status`): `false` when `limit` passed first. A signal sent to
/// `mpirun` before its ranks exist is not forwarded to anyone, so tests of early signals wait
/// for this.
pub fn wait_for_handlers(dir: &Path, n: usize, signal: u32, limit: Duration) -> bool {
    let catches = |pid: &u32| {
        let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
        status
            .lines()
            .find_map(|l| l.strip_prefix("SigCgt:"))
            .and_then(|mask| u64::from_str_radix(mask.trim(), 16).ok())
            .is_some_and(|mask| mask & (1 << (signal - 1)) != 0)
    };
    let start = std::time::Instant::now();
    while ranks_of(dir).iter().filter(|pid| catches(pid)).count() < n {
        if start.elapsed() >= limit {
            return false;
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    true
}

/// The pid of rank 0 of the `mpirun` job whose command line names `dir` (its environment has
/// `OMPI_COMM_WORLD_RANK=0`), when it is running.
pub fn rank0_of(dir: &Path) -> Option<u32> {
    let needle = dir.to_str()?.to_string();
    std::fs::read_dir("/proc").ok()?.flatten().find_map(|entry| {
        let pid = entry.file_name().to_string_lossy().parse::<u32>().ok()?;
        let cmdline = std::fs::read_to_string(entry.path().join("cmdline")).ok()?;
        let env = std::fs::read(entry.path().join("environ")).ok()?;
        let rank0 = env.split(|&b| b == 0).any(|kv| kv == b"OMPI_COMM_WORLD_RANK=0");
        (rank0 && cmdline.contains(&needle) && !cmdline.starts_with("mpirun")).then_some(pid)
    })
}

/// The test-only Python with transformers and TensorBoard (tests/py), from `NEREUS_TEST_PYTHON`; `None` (with a note)
/// when it is not set outside CI, where it must be.
pub fn reference_python() -> Option<String> {
    match std::env::var("NEREUS_TEST_PYTHON") {
        Ok(python) => Some(python),
        Err(_) if std::env::var("CI").is_ok_and(|v| v == "true") => {
            panic!("CI needs NEREUS_TEST_PYTHON (scripts/py-test-env.sh makes it)")
        }
        Err(_) => {
            eprintln!(
                "note: NEREUS_TEST_PYTHON is not set; the parity with the reference Python (transformers, numpy) is skipped (scripts/py-test-env.sh)"
            );
            None
        }
    }
}

/// `rows` written to `path` by pyarrow (the reference Python) with `compression`, as verl's
/// preprocessing writes its Parquet files.
#[allow(dead_code)] // not every test binary writes Parquet
pub fn write_parquet(python: &str, path: &Path, rows: &[serde_json::Value], compression: &str) {
    let mut child = Command::new(python)
        .arg(repo().join("tests/py/write_parquet.py"))
        .args([path.to_str().unwrap(), compression])
        .stdin(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("the reference python starts");
    std::io::Write::write_all(
        &mut child.stdin.take().unwrap(),
        serde_json::Value::from(rows.to_vec()).to_string().as_bytes(),
    )
    .unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
}

/// transformers' rendering and ids of `conversations` through the tokenizer in `dir`.
#[allow(dead_code)] // not every test binary renders templates
pub fn transformers_prompts(python: &str, dir: &Path, conversations: &[serde_json::Value]) -> serde_json::Value {
    let mut child = Command::new(python)
        .arg(repo().join("tests/py/chat_template_parity.py"))
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("the reference python starts");
    let request = serde_json::json!({"dir": dir, "conversations": conversations});
    std::io::Write::write_all(&mut child.stdin.take().unwrap(), request.to_string().as_bytes()).unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    serde_json::from_slice(&out.stdout).unwrap()
}

/// `out` exited with `status`, its stderr names every one of `needles`, and nothing panicked.
#[allow(dead_code)] // not every test binary checks refusals
pub fn assert_status(out: &Output, status: i32, needles: &[&str]) {
    let (stdout, stderr) = text(out);
    assert_eq!(out.status.code(), Some(status), "stdout:\n{stdout}\nstderr:\n{stderr}");
    for n in needles {
        assert!(stderr.contains(n), "stderr lacks {n:?}:\n{stderr}");
    }
    assert!(!stderr.contains("panicked"), "{stderr}");
}

/// Runs `nereus ARGS` as a single process, killed after `limit`: `None` when it had to be (a
/// hang guard for inputs that once hung).
#[allow(dead_code)] // not every test binary guards a hang
pub fn run_single_within(args: &[&str], limit: Duration) -> Option<Output> {
    let child = Command::new(nereus())
        .args(args)
        .current_dir(repo())
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("nereus starts");
    wait_within(child, limit)
}

/// The output of `child` if it ends within `limit`; else it is killed and `None` returned. Its
/// output is read meanwhile, so a child that writes much never blocks on a full pipe.
#[allow(dead_code)]
pub fn wait_within(child: Child, limit: Duration) -> Option<Output> {
    let pid = child.id();
    let (send, receive) = std::sync::mpsc::channel();
    std::thread::spawn(move || send.send(child.wait_with_output()));
    match receive.recv_timeout(limit) {
        Ok(out) => Some(out.expect("its output is read")),
        Err(_) => {
            send_signal(pid, "-KILL");
            let _ = receive.recv();
            None
        }
    }
}
