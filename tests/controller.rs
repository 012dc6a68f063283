//! The live controller on 8 MPI ranks: `configs/tiny-ppo-adaptive.toml` grows its responses past
//! what its first plan fits, so the job must transition urgently, and cheaper plans pay back
//! later; every transition keeps every model-stage's state bit for bit, no sample is repeated or
//! skipped, and the job learns as a fixed-plan run with room to spare does. Under the static
//! policy the same job stops before it would run out of memory, saying where and what fits, or
//! is slower over the whole run.

mod common;

use common::{run_mpi, set_key, shipped, step_records, text, write};

/// Mean reward of the last 20 steps.
fn last_20_reward(records: &[serde_json::Value]) -> f64 {
    let tail = &records[records.len() - 20..];
    tail.iter().map(|r| r["reward_mean"].as_f64().unwrap()).sum::<f64>() / 20.0
}

/// The whole-run tokens/s of a controlled run's summary.
fn run_tokens_per_second(stdout: &str) -> f64 {
    let line = stdout.lines().find(|l| l.starts_with("tokens/s over the run")).expect("a summary");
    line.split_whitespace().last().unwrap().parse().unwrap()
}

/// The static baseline (DP follows the pool, TP/PP layouts never change) on the adaptive job:
/// depending on the plan this machine's probes lead to, it either stops before running out of
/// memory — after a checkpoint, naming the rank, what it would need, the device's memory, a plan
/// that fits and how to continue — or it runs to the end on its first layouts, slower than
/// Nereus over the whole run.
fn static_stops_or_is_slower(run: &std::process::Output, out: &std::path::Path, nereus_tokens_per_second: f64) {
    let (stdout, stderr) = text(run);
    if run.status.code() == Some(2) {
        for needle in
            ["static policy", "out of memory ahead", "rank", "of 4.50 MB", "a plan that fits", "--resume latest"]
        {
            assert!(stderr.contains(needle), "{needle}: {stderr}");
        }
        assert_eq!(stderr.matches("nereus: error").count(), 1, "one message, from rank 0: {stderr}");
        assert!(out.join("checkpoints").read_dir().unwrap().count() > 0, "a checkpoint before the stop");
        return;
    }
    assert!(run.status.success(), "{stderr}");
    let records = step_records(out);
    let layouts = |r: &serde_json::Value| -> Vec<(u64, u64)> {
        r["plan"]
            .as_object()
            .unwrap()
            .values()
            .map(|p| (p["tp"].as_u64().unwrap(), p["pp"].as_u64().unwrap()))
            .collect()
    };
    assert!(records.iter().all(|r| layouts(r) == layouts(&records[0])), "static changed a layout");
    let static_tokens_per_second = run_tokens_per_second(&stdout);
    assert!(
        static_tokens_per_second < nereus_tokens_per_second,
        "static {static_tokens_per_second} tokens/s, nereus {nereus_tokens_per_second}"
    );
}

/// Steps of each run in the adaptive test.
const STEPS: &str = "40";

#[test]
fn the_adaptive_job_transitions_urgently_and_opportunistically_without_changing_state() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("adaptive");
    let static_out = dir.path().join("static");
    // Nereus and the static baseline side by side, so both see the same load.
    // 40 of the config's 80 steps: the transitions come in the first few, and by step 40 the
    // reward has climbed from 0.05 to about 0.8.
    let (run, static_run) = std::thread::scope(|s| {
        let nereus = s.spawn(|| {
            run_mpi(
                8,
                &["train", "configs/tiny-ppo-adaptive.toml", "--steps", STEPS, "--output-dir", out.to_str().unwrap()],
            )
        });
        let fixed = [
            "train",
            "configs/tiny-ppo-adaptive.toml",
            "--steps",
            STEPS,
            "--policy",
            "static",
            "--output-dir",
            static_out.to_str().unwrap(),
        ];
        let baseline = s.spawn(move || run_mpi(8, &fixed));
        (nereus.join().unwrap(), baseline.join().unwrap())
    });
    let (stdout, stderr) = text(&run);
    assert!(run.status.success(), "{stderr}");
    static_stops_or_is_slower(&static_run, &static_out, run_tokens_per_second(&stdout));
    let records = step_records(&out);
    assert_eq!(records.len(), 40);
    let transitions: Vec<&serde_json::Value> =
        records.iter().map(|r| &r["transition"]).filter(|t| !t.is_null()).collect();
    let kinds: Vec<&str> = transitions.iter().map(|t| t["kind"].as_str().unwrap()).collect();
    assert!(kinds.contains(&"urgent") && kinds.contains(&"opportunistic"), "{kinds:?}");
    for t in &transitions {
        assert_eq!(t["digests_before"], t["digests_after"], "a transition changed state: {t}");
        assert_eq!(t["digests_before"].as_object().unwrap().len(), 6, "every PPO model-stage");
    }
    // Every decision that fired is recorded with its numbers; admitted ones moved or resized.
    let decisions: Vec<&serde_json::Value> = records.iter().map(|r| &r["decision"]).filter(|d| !d.is_null()).collect();
    assert!(decisions.len() >= transitions.len());
    assert!(decisions.iter().all(|d| d["trigger"].as_array().is_some_and(|t| !t.is_empty()) && d["gamma"] == 0.5));
    // The data position advances by exactly one global batch (64 sequences) every step.
    let positions: Vec<u64> =
        records.iter().map(|r| r["counters"]["actor/training"]["data_position"].as_u64().unwrap()).collect();
    assert!(positions.windows(2).all(|w| w[1] == w[0] + 64), "{positions:?}");
    assert!(stdout.contains("tokens/s over the run") && out.join("timeline.svg").exists());

    // The same seed on one fixed plan with room to spare learns the same.
    let roomy = shipped("tiny-ppo-adaptive.toml");
    let roomy = set_key(&roomy, "cluster", "device_memory_gb", Some("2.0"));
    let roomy = set_key(&roomy, "policy", "mode", Some("\"off\""));
    let fixed_out = dir.path().join("fixed");
    let job = write(dir.path(), "fixed.toml", &roomy);
    let run =
        run_mpi(8, &["train", job.to_str().unwrap(), "--steps", STEPS, "--output-dir", fixed_out.to_str().unwrap()]);
    assert!(run.status.success(), "{}", text(&run).1);
    let fixed = step_records(&fixed_out);
    assert!(fixed.iter().all(|r| r["transition"].is_null()));
    let (adaptive_reward, fixed_reward) = (last_20_reward(&records), last_20_reward(&fixed));
    assert!(
        (adaptive_reward - fixed_reward).abs() <= 0.1,
        "last 20 steps: adaptive {adaptive_reward:.3}, fixed {fixed_reward:.3}"
    );
}

/// `bench controller` replays the recorded tiny run through the controller and decides on
/// modelled records at 1,024 and 16,384 GPUs; what it reports follows from the decisions made.
#[test]
fn bench_controller_decides_on_every_record_and_reports_its_floors() {
    let dir = tempfile::tempdir().unwrap();
    let json = dir.path().join("controller.json");
    let run = common::run_single(&["bench", "controller", "--json", json.to_str().unwrap()]);
    assert!(run.status.success(), "{}", text(&run).1);
    let report: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    let rows = report["rows"].as_array().unwrap();
    let gpus: Vec<u64> = rows.iter().map(|r| r["gpus"].as_u64().unwrap()).collect();
    assert_eq!(gpus, [8, 1024, 16384]);
    // One decision per line of the recorded 100-step run.
    assert_eq!(rows[0]["decisions"], 100);
    for r in rows {
        let (replans, admitted) = (r["replans"].as_u64().unwrap(), r["admitted"].as_u64().unwrap());
        assert!(replans >= 1 && admitted <= replans, "{r}");
        assert!(r["replan_max_s"].as_f64().unwrap() >= r["replan_median_s"].as_f64().unwrap());
    }
    assert_eq!(report["floors"].as_array().unwrap().len(), 2);
}
