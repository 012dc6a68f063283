//! Asynchronous training (`rl.mode = "async"`) on real ranks: generation on ranks of its own,
//! rollouts at most `max_staleness` policy versions old, weight syncs recorded with equal
//! digests, the controller adapting at a weight sync, and SIGTERM and resume.

mod common;

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use common::{
    assert_status, ranks_of, run_mpi, run_single, send_signal, set_key, small_text_job, spawn_mpi, step_records, text,
    wait_for_steps, write,
};
use serde_json::Value;

/// Prompts per step of the small job.
const PROMPTS: u64 = 8;

/// The shipped async text job, small (8 prompts × 2 samples a step) with `max_staleness = k`.
fn job(dir: &Path, k: u32, steps: u32) -> PathBuf {
    let data = dir.join("data");
    if !data.exists() {
        let out = run_single(&["data", "synth", data.to_str().unwrap(), "--train", "200", "--eval", "16"]);
        assert!(out.status.success(), "{:?}", text(&out));
    }
    let toml = small_text_job("tiny-math-grpo-async.toml", &data, &dir.join("out"), steps, PROMPTS as u32, 5);
    let toml = set_key(&toml, "rl", "max_staleness", Some(&k.to_string()));
    write(dir, &format!("async-{k}.toml"), &toml)
}

fn train(ranks: usize, job: &Path, out: &Path, args: &[&str]) -> std::process::Output {
    let mut all = vec!["train", job.to_str().unwrap(), "--output-dir", out.to_str().unwrap()];
    all.extend_from_slice(args);
    run_mpi(ranks, &all)
}

fn ranks(plan: &Value, ms: &str) -> Vec<u64> {
    plan[ms]["ranks"].as_array().unwrap().iter().map(|r| r.as_u64().unwrap()).collect()
}

/// Every step runs generation on ranks no other model-stage uses.
fn assert_generation_apart(records: &[Value]) {
    for r in records {
        let generation = ranks(&r["plan"], "actor/generation");
        for (ms, _) in r["plan"].as_object().unwrap().iter().filter(|(ms, _)| *ms != "actor/generation") {
            assert!(ranks(&r["plan"], ms).iter().all(|x| !generation.contains(x)), "step {}: {}", r["step"], r["plan"]);
        }
    }
}

/// The async record of every step: versions within `k`, per-sample versions, data positions
/// advancing by the step's prompts, and each weight sync's digests equal.
fn assert_versions(records: &[Value], k: u64) {
    let prompts = records[0]["async"]["ahead_position"].as_u64().unwrap();
    let samples = records[0]["async"]["sample_versions"].as_array().unwrap().len();
    for r in records {
        let (step, a) = (r["step"].as_u64().unwrap(), &r["async"]);
        let trained = a["policy_version"].as_u64().unwrap();
        assert_eq!(trained, step, "{a}");
        let staleness = a["staleness"].as_u64().unwrap();
        assert!(staleness <= k, "step {step}: {a}");
        let versions = a["sample_versions"].as_array().unwrap();
        assert_eq!(versions.len(), samples);
        assert!(versions.iter().all(|v| v.as_u64().unwrap() == trained - staleness), "{a}");
        assert_eq!(a["ahead_position"].as_u64().unwrap(), prompts * (step + 1));
        // Every step samples the next one's rollouts: generation's own seconds, whatever the
        // other ranks waited.
        assert!(r["stage_seconds"]["generation"].as_f64().unwrap() > 0.0, "step {step}: {}", r["stage_seconds"]);
        assert!(a["generation_wait_seconds"].as_f64().unwrap() >= 0.0, "step {step}: {a}");
        assert_eq!(r["counters"]["actor/training"]["data_position"].as_u64().unwrap(), prompts * (step + 1));
        if let Some(sync) = a["weight_sync"].as_object() {
            assert_eq!(sync["digests_before"], sync["digests_after"], "step {step}");
            assert!(
                sync["bytes"].as_u64().unwrap() > 0 && sync["to"].as_str().unwrap().starts_with("actor/generation")
            );
            // The sync ran as a transition: one Sync per generation replica, priced by its DAG.
            let replicas = r["plan"]["actor/generation"]["dp"].as_u64().unwrap();
            assert_eq!(sync["primitives"].as_u64().unwrap(), replicas, "step {step}: {sync:?}");
            assert!(sync["predicted_seconds"].as_f64().unwrap() > 0.0, "step {step}: {sync:?}");
        }
    }
}

#[test]
fn async_steps_train_on_bounded_stale_rollouts_and_sync_weights_with_equal_digests() {
    let dir = tempfile::tempdir().unwrap();
    // k = 1 syncs after every step; k = 2 after every other, so step 2 trains on rollouts of
    // version 0 (two behind) and step 3 on those of version 0 too, sampled before the sync.
    for (k, synced, staleness) in [(1, [true; 4], [0, 1, 1, 1]), (2, [false, true, false, true], [0, 1, 2, 1])] {
        let job = job(dir.path(), k, 4);
        let out = dir.path().join(format!("out-{k}"));
        assert_status(&train(4, &job, &out, &[]), 0, &[]);
        let records = step_records(&out);
        assert_eq!(records.len(), 4);
        assert_generation_apart(&records);
        assert_versions(&records, k as u64);
        let got: Vec<bool> = records.iter().map(|r| r["async"]["weight_sync"].is_object()).collect();
        assert_eq!(got, synced, "k = {k}");
        let got: Vec<u64> = records.iter().map(|r| r["async"]["staleness"].as_u64().unwrap()).collect();
        assert_eq!(got, staleness, "k = {k}");
        let generation = &records[3]["counters"]["actor/generation"]["policy_version"];
        assert_eq!(generation.as_u64().unwrap(), 4, "k = {k}: the last sync left version 4");
    }
}

#[test]
fn the_controller_adapts_at_a_weight_sync_when_the_pool_shrinks() {
    let dir = tempfile::tempdir().unwrap();
    let trace = write(dir.path(), "pool.csv", "step,available_gpus\n0,4\n2,3\n");
    let toml = std::fs::read_to_string(job(dir.path(), 1, 4)).unwrap();
    let job = write(dir.path(), "pool.toml", &format!("{toml}\n[pool]\ntrace = \"{}\"\n", trace.display()));
    let out = dir.path().join("out");
    assert_status(&train(4, &job, &out, &["--policy", "nereus"]), 0, &[]);
    let records = step_records(&out);
    assert_generation_apart(&records);
    assert_eq!(records[0]["async"]["ahead_position"].as_u64(), Some(PROMPTS));
    assert_versions(&records, 1);
    let pools: Vec<&str> = records.iter().map(|r| r["pool"].as_str().unwrap()).collect();
    assert_eq!(pools, ["0-3", "0-3", "0-2", "0-2"]);
    let shrink = &records[1];
    assert_eq!(shrink["decision"]["admitted"], true, "{}", shrink["decision"]);
    assert_eq!(shrink["transition"]["kind"], "urgent");
    assert_eq!(shrink["transition"]["digests_before"], shrink["transition"]["digests_after"]);
    assert!(ranks(&records[2]["plan"], "actor/generation").iter().all(|&r| r < 3));
}

#[test]
fn sigterm_during_an_async_run_exits_75_and_resume_continues_versions_and_positions() {
    let dir = tempfile::tempdir().unwrap();
    let job = job(dir.path(), 2, 300);
    let out = dir.path().join("out");
    let args = ["train", job.to_str().unwrap(), "--output-dir", out.to_str().unwrap()];
    let mut run = spawn_mpi(4, &args, Stdio::null());
    assert!(wait_for_steps(&out, 2, &mut run, Duration::from_secs(60)));
    for pid in ranks_of(&out) {
        assert!(send_signal(pid, "-TERM"));
    }
    let stopped = run.wait_with_output().unwrap();
    assert_eq!(stopped.status.code(), Some(75), "{}", String::from_utf8_lossy(&stopped.stderr));
    let done = step_records(&out).len() as u64;
    let latest = std::fs::read_to_string(out.join("checkpoints/latest")).unwrap();
    assert_eq!(latest.trim(), format!("step-{done}"));
    let more = (done + 2).to_string();
    assert_status(&train(4, &job, &out, &["--resume", "latest", "--steps", &more]), 0, &[]);
    let records = step_records(&out);
    let steps: Vec<u64> = records.iter().map(|r| r["step"].as_u64().unwrap()).collect();
    assert_eq!(steps, (0..done + 2).collect::<Vec<_>>(), "no step lost or repeated");
    assert_versions(&records, 2);
    // The rollouts in flight at the stop were dropped with the run: the first resumed step
    // samples its own with the checkpointed weights (version `done`, staleness 0), even when
    // the generation weights had lagged a version at the stop (k = 2).
    let first = &records[done as usize]["async"];
    assert_eq!((first["staleness"].as_u64(), first["dropped_rollouts"].as_u64()), (Some(0), Some(0)), "{first}");
    assert_eq!(first["sample_versions"][0].as_u64(), Some(done));
}

/// An asynchronous run of the shipped text job learns: 10 steps (one version stale each) lift
/// held-out accuracy from the warm-up's as a synchronous run's do (0.42 → 0.63 on 64 prompts;
/// docs/engine.md, "Asynchronous training", has the measured runs).
#[test]
fn an_async_run_of_the_text_job_learns() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("out");
    let config = common::repo().join("configs/tiny-math-grpo-async.toml");
    let run = run_mpi(
        8,
        &[
            "train",
            config.to_str().unwrap(),
            "--steps",
            "10",
            "--output-dir",
            out.to_str().unwrap(),
            "--set",
            "data.eval_every=10",
            "--set",
            "data.eval_count=64",
        ],
    );
    assert_status(&run, 0, &[]);
    let lines = std::fs::read_to_string(out.join("metrics.jsonl")).unwrap();
    let accuracy: Vec<f64> = lines
        .lines()
        .map(|l| serde_json::from_str::<Value>(l).unwrap())
        .filter(|r| r["event"] == "eval")
        .map(|r| r["accuracy"].as_f64().unwrap())
        .collect();
    assert_eq!(accuracy.len(), 2, "{lines}");
    assert!(accuracy[1] >= accuracy[0] + 0.15, "held-out accuracy {accuracy:?}");
    assert_versions(&step_records(&out), 1);
}

/// Rollouts more than `max_staleness` versions old are dropped and the step samples its own:
/// rank 3, the only generation rank, is lost at the start of step 5 and generation is restored
/// on another rank from the step-3 checkpoint (policy version 3). Step 5 still trains on the
/// rollouts sampled ahead before the loss (version 4), while the restored weights sample step
/// 6's; those are 3 versions behind step 6's policy (k = 1), so step 6 drops them and trains on
/// its own, sampled after the weight sync (staleness 0). Every other step keeps its rollouts.
#[test]
fn rollouts_staler_than_max_staleness_are_dropped_and_sampled_again() {
    let dir = tempfile::tempdir().unwrap();
    let job = job(dir.path(), 1, 8);
    let out = dir.path().join("out");
    let args = ["--policy", "static", "--set", "train.checkpoint_every=3", "--fail-rank", "3", "--at-step", "5"];
    assert_status(&train(4, &job, &out, &args), 0, &[]);
    let records = step_records(&out);
    let steps: Vec<u64> = records.iter().map(|r| r["step"].as_u64().unwrap()).collect();
    assert_eq!(steps, (0..8).collect::<Vec<_>>(), "training continues past the drop");
    let loss = &records[4]["rank_loss"];
    assert_eq!(loss["restored"], serde_json::json!(["actor/generation"]), "{loss}");
    assert!(loss["checkpoint"].as_str().unwrap().ends_with("step-3"), "{loss}");
    assert_generation_apart(&records);
    assert_versions(&records, 1);
    let dropped: Vec<u64> = records.iter().map(|r| r["async"]["dropped_rollouts"].as_u64().unwrap()).collect();
    assert_eq!(dropped, [0, 0, 0, 0, 0, 0, 1, 0]);
    assert_eq!(records[5]["async"]["ahead_version"].as_u64(), Some(3), "{}", records[5]["async"]);
    let resampled = &records[6]["async"];
    assert_eq!(resampled["staleness"].as_u64(), Some(0), "{resampled}");
    assert!(resampled["sample_versions"].as_array().unwrap().iter().all(|v| v.as_u64() == Some(6)), "{resampled}");
}
