//! Pools, resume variants, signals, simulate and logprobs under inputs a user got wrong: one test
//! per defect once found there, each of which failed before its fix. The generated corpus of the
//! same kinds is `tests/bad_input_corpus.rs`.

mod common;

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use common::{
    assert_status, fast_ppo, nereus, repo, run_mpi, run_single, send_signal, set_key, spawn_mpi, step_records, text,
    wait_for_steps, write, Tmpfs,
};
use serde_json::Value;

/// Every line of a run's metrics, events included.
fn lines(out: &Path) -> Vec<Value> {
    std::fs::read_to_string(out.join("metrics.jsonl"))
        .unwrap_or_default()
        .lines()
        .filter_map(|l| serde_json::from_str(l).ok())
        .collect()
}

/// `train JOB --output-dir OUT ARGS…` on `ranks` ranks.
fn train(ranks: usize, job: &Path, out: &Path, args: &[&str]) -> Output {
    let mut all = vec!["train", job.to_str().unwrap(), "--output-dir", out.to_str().unwrap()];
    all.extend_from_slice(args);
    run_mpi(ranks, &all)
}

/// The fast PPO job under the controller with a pool trace, drift triggers out of reach (only
/// the pool moves plans).
fn pool_job(dir: &Path, trace: &str, steps: u32, mode: &str) -> PathBuf {
    let trace = write(dir, "pool.csv", trace);
    let toml = set_key(&fast_ppo(), "job", "steps", Some(&steps.to_string()));
    let toml = set_key(&toml, "policy", "mode", Some(&format!("\"{mode}\"")));
    let toml = set_key(&toml, "policy", "length_drift", Some("100.0"));
    let toml = set_key(&toml, "policy", "latency_drift", Some("100.0"));
    // No trials: a trial's measured error (on this oversubscribed machine, mostly load) would
    // raise the gain a later move must show, and these runs test the pool's moves alone.
    let toml = set_key(&toml, "policy", "plan_error", Some("0.0"));
    write(dir, "pool.toml", &format!("{toml}\n[pool]\ntrace = \"{}\"\n", trace.display()))
}

/// The largest rank any model-stage of a step line's plan uses.
fn highest_rank(line: &Value) -> u64 {
    let plan = line["plan"].as_object().unwrap();
    plan.values().flat_map(|p| p["ranks"].as_array().unwrap()).map(|r| r.as_u64().unwrap()).max().unwrap()
}

/// Item 1: a pool change at a run's first boundary is acted on, fresh (shrink and growth) and
/// after a resume.
#[test]
fn a_pool_change_at_the_first_boundary_moves_the_plan() {
    let dir = tempfile::tempdir().unwrap();
    // A shrink invalidates the plan (urgent); a growth is priced and, on this plane's cheap
    // transition, admitted by payback (opportunistic; paper §4).
    for (trace, pools, top, kind) in [
        ("step,available_gpus\n0,4\n1,2\n", ["0-3", "0-1", "0-1"], [3, 1, 1], "urgent"),
        ("step,available_gpus\n0,2\n1,4\n", ["0-1", "0-3", "0-3"], [1, 3, 3], "opportunistic"),
    ] {
        let job = pool_job(dir.path(), trace, 3, "nereus");
        let out = dir.path().join(format!("out-{}", pools[1]));
        assert_status(&train(4, &job, &out, &[]), 0, &[]);
        let records = step_records(&out);
        let got: Vec<&str> = records.iter().map(|r| r["pool"].as_str().unwrap()).collect();
        assert_eq!(got, pools, "{trace}");
        assert_follows(&records, &top, trace);
        assert_eq!(records[0]["transition"]["kind"], kind, "{}", records[0]["decision"]);
    }
    // Resumed at step 3 with the growth at step 4.
    let job = pool_job(dir.path(), "step,available_gpus\n0,2\n4,4\n", 3, "nereus");
    let out = dir.path().join("resumed");
    assert_status(&train(4, &job, &out, &[]), 0, &[]);
    assert_status(&train(4, &job, &out, &["--resume", "latest", "--steps", "6"]), 0, &[]);
    assert_follows(&step_records(&out), &[1, 1, 1, 1, 3, 3], "growth at step 4 after a resume");
}

/// The plan's highest rank per step is `want`, except that a step after the one the pool
/// changed at may have moved back when the controller measured the new plan slower (`regret`:
/// on this oversubscribed machine 4 ranks can run slower than 2 under load).
fn assert_follows(records: &[Value], want: &[u64], what: &str) {
    let tops: Vec<u64> = records.iter().map(highest_rank).collect();
    assert_eq!(tops.len(), want.len(), "{what}");
    let changed = want.iter().zip(want.iter().skip(1)).position(|(a, b)| a != b).map_or(want.len(), |k| k + 1);
    let decisions: Vec<String> = records.iter().map(|r| r["decision"].to_string()).collect();
    assert_eq!(
        tops[..=changed.min(want.len() - 1)],
        want[..=changed.min(want.len() - 1)],
        "{what}: the plan follows the pool; the decisions: {decisions:#?}"
    );
    for k in changed + 1..want.len() {
        let regret = records[k - 1]["decision"]["trigger"].to_string().contains("regret");
        assert!(
            tops[k] == want[k] || regret,
            "{what}: step {k} left the pool's plan without a regret: {}",
            records[k - 1]
        );
    }
}

/// Item 2: `--resume auto` after a crash before the first checkpoint starts afresh (the crashed
/// run's records stay, marked); `--resume latest` refuses, pointing at `auto`.
#[test]
fn resume_auto_after_a_crash_before_the_first_checkpoint_starts_fresh() {
    let dir = tempfile::tempdir().unwrap();
    let job = write(dir.path(), "job.toml", &set_key(&fast_ppo(), "train", "checkpoint_every", Some("0")));
    let out = dir.path().join("out");
    let args = ["train", job.to_str().unwrap(), "--steps", "200", "--output-dir", out.to_str().unwrap()];
    let mut crashed = spawn_mpi(4, &args, Stdio::null());
    assert!(wait_for_steps(&out, 2, &mut crashed, Duration::from_secs(60)));
    let _ = crashed.kill();
    let _ = crashed.wait();
    common::kill_ranks_of(&out);
    assert!(!out.join("checkpoints/latest").exists(), "the crash came before any checkpoint");
    assert_status(&train(4, &job, &out, &["--resume", "latest", "--steps", "3"]), 2, &["--resume auto"]);
    assert_status(&train(4, &job, &out, &["--resume", "auto", "--steps", "3"]), 0, &[]);
    let all = lines(&out);
    let fresh = all.iter().position(|l| l["event"] == "fresh-start").expect("a fresh-start marker");
    assert!(all[fresh]["abandoned_records"].as_u64().unwrap() >= 2);
    let after: Vec<u64> = all[fresh + 1..].iter().filter_map(|l| l["step"].as_u64()).collect();
    assert_eq!(after, [0, 1, 2]);
}

/// Item 3: SIGUSR1 checkpoints and stops (75) whatever `checkpoint_on_signal` says, even when
/// it arrives before the job reached its first step.
#[test]
fn sigusr1_checkpoints_even_before_the_first_step() {
    let dir = tempfile::tempdir().unwrap();
    let job = write(dir.path(), "job.toml", &set_key(&fast_ppo(), "train", "checkpoint_every", Some("0")));
    for (name, early) in [("late", false), ("early", true)] {
        let out = dir.path().join(name);
        let args = ["train", job.to_str().unwrap(), "--steps", "300", "--output-dir", out.to_str().unwrap()];
        let mut run = spawn_mpi(4, &args, Stdio::null());
        if early {
            // As soon as every rank catches SIGUSR1 (SIGUSR1 is 10), long before its first step.
            assert!(common::wait_for_handlers(&out, 4, 10, Duration::from_secs(60)));
            assert!(step_records(&out).is_empty(), "{name}: the signal comes before the first step");
        } else {
            assert!(wait_for_steps(&out, 2, &mut run, Duration::from_secs(60)));
        }
        assert!(send_signal(run.id(), "-USR1"));
        let status = run.wait().unwrap();
        assert_eq!(status.code(), Some(75), "{name}");
        let done = step_records(&out).len();
        let latest = std::fs::read_to_string(out.join("checkpoints/latest")).unwrap();
        assert_eq!(latest.trim(), format!("step-{done}"), "{name}: the checkpoint holds every recorded step");
    }
}

/// Item 4: after a branch (a resume from an earlier checkpoint), a damaged `latest` pointer
/// falls back to the newest checkpoint written, not to the abandoned line's higher step; the
/// branch is recorded as one.
#[test]
fn a_damaged_latest_pointer_never_resumes_an_abandoned_branch() {
    let dir = tempfile::tempdir().unwrap();
    let job = write(dir.path(), "job.toml", &set_key(&fast_ppo(), "train", "checkpoint_every", Some("2")));
    let out = dir.path().join("out");
    assert_status(&train(4, &job, &out, &["--steps", "6"]), 0, &[]);
    let step2 = out.join("checkpoints/step-2");
    assert_status(&train(4, &job, &out, &["--resume", step2.to_str().unwrap(), "--steps", "4"]), 0, &["branches off"]);
    let resume = lines(&out).into_iter().find(|l| l["event"] == "resume").unwrap();
    assert_eq!(resume["branch"], true, "{resume}");
    std::fs::write(out.join("checkpoints/latest"), "step-99\n").unwrap();
    assert_status(&train(4, &job, &out, &["--resume", "latest", "--steps", "5"]), 0, &[]);
    let last = lines(&out).into_iter().rfind(|l| l["event"] == "resume").unwrap();
    assert_eq!(last["from_step"], 4, "resumed from the branch's step-4, not the abandoned step-6: {last}");
    assert_eq!(last["branch"], false);
}

/// Item 5: under `--policy static` the pool's growth is followed by DP, layouts kept.
#[test]
fn the_static_policy_grows_dp_with_the_pool() {
    let dir = tempfile::tempdir().unwrap();
    let job = pool_job(dir.path(), "step,available_gpus\n0,2\n1,4\n", 3, "static");
    let out = dir.path().join("out");
    assert_status(&train(4, &job, &out, &[]), 0, &[]);
    let records = step_records(&out);
    assert_eq!(highest_rank(&records[2]), 3, "the new ranks are used");
    for (ms, p) in records[0]["plan"].as_object().unwrap() {
        let q = &records[2]["plan"][ms];
        assert_eq!((&p["tp"], &p["pp"]), (&q["tp"], &q["pp"]), "{ms}: static keeps its layout");
    }
}

/// Item 6: no completed step goes unrecorded when a rank is lost, and a pool file that goes
/// away does not take the pool out of the later records.
#[test]
fn every_step_is_recorded_and_pool_fields_stay() {
    let dir = tempfile::tempdir().unwrap();
    let job = write(dir.path(), "job.toml", &set_key(&fast_ppo(), "policy", "mode", Some("\"nereus\"")));
    for ranks in [4, 8] {
        let out = dir.path().join(format!("fail-{ranks}"));
        let run = train(ranks, &job, &out, &["--steps", "4", "--fail-rank", "0", "--at-step", "2"]);
        let recorded: Vec<u64> = step_records(&out).iter().map(|r| r["step"].as_u64().unwrap()).collect();
        let expected = if run.status.success() { 4 } else { 2 };
        assert_eq!(recorded, (0..expected).collect::<Vec<_>>(), "{}", text(&run).1);
    }
    let out = dir.path().join("file");
    std::fs::create_dir_all(&out).unwrap();
    std::fs::write(out.join("pool"), "4\n").unwrap();
    let args = ["train", job.to_str().unwrap(), "--steps", "60", "--output-dir", out.to_str().unwrap()];
    let mut run = spawn_mpi(4, &args, Stdio::null());
    assert!(wait_for_steps(&out, 2, &mut run, Duration::from_secs(60)));
    std::fs::remove_file(out.join("pool")).unwrap();
    assert!(run.wait().unwrap().success());
    assert!(step_records(&out).iter().all(|r| r["pool"].is_string() && r["held_bytes"].is_array()));
}

/// Items 7 and 8: sizes are bounded where they are parsed, before anything is allocated.
#[test]
fn huge_rank_lists_and_gpu_counts_are_refused_at_once() {
    let dir = tempfile::tempdir().unwrap();
    let job = write(dir.path(), "job.toml", &set_key(&fast_ppo(), "job", "steps", Some("2")));
    let out = dir.path().join("out");
    for pool in ["0-999999999", "0-4294967295", "0-99999999999999999999"] {
        let start = Instant::now();
        let run = train(2, &job, &out, &["--pool", pool, "--policy", "nereus"]);
        assert_status(&run, 2, &["--pool"]);
        assert!(start.elapsed() < Duration::from_secs(10), "{pool}: {:?}", start.elapsed());
    }
    // The same written into a running job's pool file: a warning, the pool kept, the job ends.
    let out = dir.path().join("file");
    let args = ["train", job.to_str().unwrap(), "--steps", "12", "--policy", "nereus", "--pool", "2"];
    let mut args = args.to_vec();
    args.extend(["--output-dir", out.to_str().unwrap()]);
    let mut run = spawn_mpi(2, &args, Stdio::null());
    assert!(wait_for_steps(&out, 2, &mut run, Duration::from_secs(60)));
    std::fs::write(out.join("pool"), "0-4294967295\n").unwrap();
    let started = Instant::now();
    let finished = run.wait_with_output().unwrap();
    assert!(finished.status.success(), "{}", String::from_utf8_lossy(&finished.stderr));
    assert!(String::from_utf8_lossy(&finished.stderr).contains("keeping the pool of 2 ranks"));
    assert!(started.elapsed() < Duration::from_secs(60), "a bad pool file slowed the boundaries down");
    assert_eq!(step_records(&out).len(), 12);
    let trace = write(dir.path(), "t.csv", "step,available_gpus\n0,4000000000\n");
    for args in [
        vec![
            "simulate",
            "configs/llama3.1-8b-ppo.toml",
            "--trace",
            "configs/traces/paper-26.csv",
            "--gpus",
            "4000000000",
        ],
        vec!["simulate", "configs/llama3.1-8b-ppo.toml", "--trace", trace.to_str().unwrap()],
    ] {
        let start = Instant::now();
        assert_status(&run_single(&args), 2, &["between 1 and 1048576"]);
        assert!(start.elapsed() < Duration::from_secs(10));
    }
}

/// A model directory of the tiny actor, from a one-step run.
fn actor_dir(dir: &Path) -> PathBuf {
    let out = dir.join("model");
    let job = write(dir, "model.toml", &set_key(&fast_ppo(), "job", "steps", Some("1")));
    assert_status(&train(2, &job, &out, &[]), 0, &[]);
    out.join("checkpoints/step-1/actor")
}

/// Items 9 and 12: logprobs bounds a sequence by the model and memory by the machine, refuses
/// a micro-batch of 0 and non-finite weights.
#[test]
fn logprobs_refuses_what_it_cannot_hold_or_score() {
    let dir = tempfile::tempdir().unwrap();
    let model = actor_dir(dir.path());
    let tokens = |name: &str, seqs: Vec<Vec<u32>>| write(dir.path(), name, &serde_json::to_string(&seqs).unwrap());
    let long = tokens("long.json", vec![(0..40_000).map(|i| i % 30 + 1).collect()]);
    let lp = |model: &Path, t: &Path, extra: &[&str]| {
        let mut args = vec!["logprobs", model.to_str().unwrap(), "--tokens", t.to_str().unwrap()];
        args.extend_from_slice(extra);
        run_single(&args)
    };
    assert_status(&lp(&model, &long, &[]), 2, &["max_position_embeddings"]);
    // Without max_position_embeddings the machine's memory bounds it: a clear refusal.
    let unbounded = dir.path().join("unbounded");
    copy_dir(&model, &unbounded);
    edit_json(&unbounded.join("config.json"), |c| drop(c.as_object_mut().unwrap().remove("max_position_embeddings")));
    let run = lp(&unbounded, &long, &[]);
    assert_status(&run, 1, &["out of memory on rank 0"]);
    let short = tokens("short.json", vec![vec![1, 2, 3], vec![4, 5]]);
    assert_status(&lp(&model, &short, &["--micro-batch", "0"]), 2, &["--micro-batch 0"]);
    let nan = dir.path().join("nan");
    copy_dir(&model, &nan);
    poison_first_weight(&nan);
    assert_status(&lp(&nan, &short, &[]), 2, &["not finite"]);
}

fn copy_dir(from: &Path, to: &Path) {
    assert!(Command::new("cp").arg("-r").arg(from).arg(to).status().unwrap().success());
}

fn edit_json(path: &Path, edit: impl FnOnce(&mut Value)) {
    let mut v: Value = serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    edit(&mut v);
    std::fs::write(path, serde_json::to_string(&v).unwrap()).unwrap();
}

/// Writes a NaN over the first f32 of the model's weights (its safetensors file, after the
/// header).
fn poison_first_weight(dir: &Path) {
    let file = std::fs::read_dir(dir)
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .find(|p| p.extension().is_some_and(|e| e == "safetensors"))
        .unwrap();
    let mut bytes = std::fs::read(&file).unwrap();
    let header = u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize;
    bytes[8 + header..8 + header + 4].copy_from_slice(&f32::NAN.to_le_bytes());
    std::fs::write(&file, bytes).unwrap();
}

/// Item 10: a full file system (inodes) left `step-N.partial`; the next start cleans it before
/// it probes the directory, and runs.
#[test]
fn stale_partials_are_removed_before_the_write_probe() {
    let Some(fs) = Tmpfs::mount_with("size=64m,nr_inodes=64") else {
        assert!(std::env::var("CI").is_err(), "CI runs as root and must be able to mount a tmpfs");
        return;
    };
    let out = fs.path.join("out");
    let partial = out.join("checkpoints/step-3.partial");
    std::fs::create_dir_all(&partial).unwrap();
    for i in 0.. {
        if std::fs::write(partial.join(format!("f{i}")), b"x").is_err() {
            break;
        }
    }
    assert!(std::fs::write(out.join("probe"), b"").is_err(), "the inodes are used up");
    let dir = tempfile::tempdir().unwrap();
    let job = write(dir.path(), "job.toml", &set_key(&fast_ppo(), "train", "checkpoint_every", Some("0")));
    assert_status(&train(2, &job, &out, &["--steps", "1", "--resume", "auto"]), 0, &[]);
    assert!(!partial.exists());
}

/// Item 13: SIGTERM to scripts/mpirun.sh checkpoints and exits 75 with the stop line; a
/// sidecar's path given to `--resume` is a usage error (2).
#[test]
fn sigterm_through_the_mpirun_wrapper_exits_75_and_resume_names_directories() {
    let dir = tempfile::tempdir().unwrap();
    let job = write(dir.path(), "job.toml", &set_key(&fast_ppo(), "train", "checkpoint_every", Some("0")));
    let out = dir.path().join("out");
    let wrapper = Command::new("bash")
        .arg(repo().join("scripts/mpirun.sh"))
        .args(["4", "train", job.to_str().unwrap(), "--steps", "300", "--output-dir", out.to_str().unwrap()])
        .env("NEREUS", nereus())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let started = Instant::now();
    while step_records(&out).len() < 2 {
        assert!(started.elapsed() < Duration::from_secs(60));
        std::thread::sleep(Duration::from_millis(20));
    }
    assert!(send_signal(wrapper.id(), "-TERM"));
    let run = wrapper.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&run.stderr);
    assert_eq!(run.status.code(), Some(75), "{stderr}");
    let last = step_records(&out).len() - 1;
    assert!(
        stderr.contains(&format!("stopped after step {last} with a checkpoint of the {} completed", last + 1)),
        "{stderr}"
    );
    let sidecar = out.join(format!("checkpoints/step-{}/state.json", last + 1));
    assert_status(&train(4, &job, &out, &["--resume", sidecar.to_str().unwrap()]), 2, &["is a file"]);
}

/// Item 11 and 12's simulate and trace parts: nonsense flags and traces are refused by name.
#[test]
fn simulate_refuses_nonsense_by_flag_and_line() {
    let dir = tempfile::tempdir().unwrap();
    let base = ["simulate", "configs/llama3.1-8b-ppo.toml", "--trace", "configs/traces/paper-26.csv"];
    for (extra, needle) in [
        (vec!["--restart-s", "-100000"], "--restart-s"),
        (vec!["--restart-s", "nan"], "--restart-s"),
        (vec!["--fs-gbps", "0"], "--fs-gbps"),
        (vec!["--fs-gbps", "-3"], "--fs-gbps"),
        (vec!["--gamma-sweep", "nan,-1,7"], "--gamma-sweep"),
        (vec!["--gamma", "5"], "--gamma"),
        (vec!["--noise", "-1"], "--noise"),
        (vec!["--op-error", "-1"], "--op-error"),
        (vec!["--seeds", "0"], "--seeds"),
        (vec!["--transition-error", "nan"], "--transition-error"),
    ] {
        let mut args = base.to_vec();
        args.extend(extra);
        assert_status(&run_single(&args), 2, &[needle]);
    }
    let bom = write(dir.path(), "bom.csv", "\u{feff}step,seq_len_mean\n0,100\n1,110\n");
    let run = run_single(&["simulate", "configs/llama3.1-8b-ppo.toml", "--trace", bom.to_str().unwrap()]);
    assert_status(&run, 0, &[]);
    let twice = write(dir.path(), "twice.csv", "step,seq_len_mean,seq_len_mean\n0,100,100\n");
    let run = run_single(&["simulate", "configs/llama3.1-8b-ppo.toml", "--trace", twice.to_str().unwrap()]);
    assert_status(&run, 2, &["appears twice"]);
    let header_only = write(dir.path(), "pool.csv", "step,available_gpus\n");
    let toml = format!("{}\n[pool]\ntrace = \"{}\"\n", fast_ppo(), header_only.display());
    let job = write(dir.path(), "job.toml", &set_key(&toml, "policy", "mode", Some("\"nereus\"")));
    assert_status(&train(2, &job, &dir.path().join("o"), &["--steps", "1"]), 2, &["no rows"]);
    let job = write(dir.path(), "f.toml", &set_key(&fast_ppo(), "policy", "mode", Some("\"nereus\"")));
    let run = train(2, &job, &dir.path().join("f"), &["--steps", "3", "--fail-rank", "1", "--at-step", "3"]);
    assert_status(&run, 2, &["would never be lost"]);
}

/// Item 14: messages name the real cause.
#[test]
fn messages_name_the_cause() {
    let dir = tempfile::tempdir().unwrap();
    let llama = "configs/llama3.1-8b-ppo.toml";
    assert_status(&run_single(&["plan", llama, "--from-gpus", "0"]), 2, &["--from-gpus 0"]);
    assert_status(&run_single(&["plan", llama, "--from-seq-len", "0"]), 2, &["--from-seq-len 0"]);
    let run =
        run_single(&["plan", llama, "--cluster", "configs/clusters/a100.toml", "--gpus", "64", "--from-gpus", "10000"]);
    assert!(text(&run).0.contains("ΔL unbounded"), "{}", text(&run).0);
    let tiny_timeout = write(dir.path(), "t.toml", &set_key(&fast_ppo(), "job", "collective_timeout_s", Some("1e-9")));
    assert_status(&run_single(&["inspect", "config", tiny_timeout.to_str().unwrap()]), 2, &["[0.1, 604800]"]);
    // A pool file caught mid-write reads as empty: named so.
    let out = dir.path().join("empty-pool");
    std::fs::create_dir_all(&out).unwrap();
    std::fs::write(out.join("pool"), "").unwrap();
    let job = write(dir.path(), "j.toml", &set_key(&fast_ppo(), "policy", "mode", Some("\"nereus\"")));
    assert_status(&train(2, &job, &out, &["--steps", "1"]), 2, &["is empty (a write in progress"]);
    // The static policy keeps pipelines of two stages; a pool of one rank cannot hold them,
    // and the stop says that the pool is the cause.
    let job = pool_job(dir.path(), "step,available_gpus\n0,4\n1,1\n", 3, "static");
    let mut toml = std::fs::read_to_string(&job).unwrap();
    for (ms, pp, dp, ranks) in [
        ("actor/generation", 2, 2, "[0, 1, 2, 3]"),
        ("reference/inference", 2, 1, "[0, 1]"),
        ("reward/inference", 1, 1, "[2]"),
        ("critic/inference", 1, 1, "[3]"),
        ("actor/training", 2, 1, "[0, 1]"),
        ("critic/training", 2, 1, "[2, 3]"),
    ] {
        toml.push_str(&format!("\n[plan.\"{ms}\"]\ntp = 1\npp = {pp}\ndp = {dp}\nranks = {ranks}\n"));
    }
    let job = write(dir.path(), "static-pp2.toml", &toml);
    let run = train(4, &job, &dir.path().join("shrunk"), &[]);
    assert_status(
        &run,
        2,
        &["static policy", "the pool of 1 ranks no longer holds the current plan", "a plan that fits"],
    );
    // A warm-up out of memory: tests/out_of_memory.rs.
}

/// Item 14's checkpoint messages: a damaged model directory is a damaged file (not a
/// checkpoint's), and a missing optimizer file points at --resume-reset-optimizer.
#[test]
fn file_messages_fit_model_directories_and_optimizers() {
    let dir = tempfile::tempdir().unwrap();
    let job = write(dir.path(), "job.toml", &set_key(&fast_ppo(), "job", "steps", Some("1")));
    let out = dir.path().join("out");
    assert_status(&train(2, &job, &out, &[]), 0, &[]);
    let step = out.join("checkpoints/step-1");
    let optimizer = std::fs::read_dir(&step)
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .find(|p| p.to_string_lossy().ends_with(".optim.safetensors"))
        .unwrap();
    std::fs::remove_file(&optimizer).unwrap();
    let run = train(2, &job, &out, &["--resume", "latest", "--steps", "2"]);
    assert_status(&run, 2, &["--resume-reset-optimizer"]);
    let broken = dir.path().join("broken");
    copy_dir(&step.join("actor"), &broken);
    let weights = std::fs::read_dir(&broken)
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .find(|p| p.extension().is_some_and(|e| e == "safetensors"))
        .unwrap();
    std::fs::write(&weights, b"not a safetensors file").unwrap();
    let tokens = write(dir.path(), "t.json", "[[1, 2, 3]]");
    let run = run_single(&["logprobs", broken.to_str().unwrap(), "--tokens", tokens.to_str().unwrap()]);
    let (_, stderr) = text(&run);
    assert!(stderr.contains("model file") && stderr.contains("is damaged"), "{stderr}");
    assert!(!stderr.contains("checkpoint file"), "{stderr}");
}
