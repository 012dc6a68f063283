//! Global transition DAGs executed under `mpirun -n 8`: random plan pairs of PPO's six
//! model-stages (several sharing ranks), and the planner's own targets on a scaled-down CPU
//! cluster, reach exactly their targets with every digest unchanged.

mod common;

use common::{run_mpi, selftest_summary, text};

#[test]
fn random_transitions_reach_their_targets_without_changing_state() {
    for seed in ["1", "2"] {
        let summary = selftest_summary("transitions", "30", seed);
        assert!(summary["executed"].as_u64().unwrap() >= 20, "most plan pairs are feasible: {summary}");
        assert!(summary["primitives"].as_u64().unwrap() > 100, "{summary}");
        assert!(
            summary["resource_edges"].as_u64().unwrap() > 0,
            "model-stages waited for each other's releases: {summary}"
        );
        assert!(summary["bytes_sent"].as_u64().unwrap() > 0);
        // Every target the planner called executable was executed, and checked above.
        assert_eq!(summary["planner_cases"], 15, "{summary}");
        assert!(summary["planner_executable"].as_u64().unwrap() >= 3, "the planner moved: {summary}");
    }
}

#[test]
fn bench_coordination_executes_both_schedulers_and_nereus_completes_what_it_runs() {
    let dir = tempfile::tempdir().unwrap();
    let json = dir.path().join("c.json");
    // 8 trials per row: every assertion below holds from 8 on (the bench's default is 20).
    let out = run_mpi(8, &["bench", "coordination", "--trials", "8", "--json", json.to_str().unwrap()]);
    let (_, stderr) = text(&out);
    assert!(out.status.success(), "{stderr}");
    let report: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    assert_eq!(report["bench"], "coordination");
    let rows = report["rows"].as_array().unwrap();
    let n = |r: &serde_json::Value, key: &str| r[key].as_u64().unwrap();
    // The paper's three overlap types, each at the eight capacities.
    assert_eq!(rows.len(), 24);
    for overlap in ["same-model-across-stages", "different-models-same-stage", "different-models-across-stages"] {
        assert_eq!(rows.iter().filter(|r| r["overlap"] == overlap).count(), 8, "{overlap}");
    }
    for r in rows {
        // Every DAG Nereus did not block ran to its targets with its digests unchanged; the
        // baseline either completed or was refused on every rank at once (never half-moved).
        assert_eq!(n(r, "nereus_completed") + n(r, "nereus_blocked"), n(r, "trials"), "{r}");
        assert_eq!(n(r, "nereus_failed"), 0, "{r}");
        assert_eq!(n(r, "baseline_completed") + n(r, "baseline_refused"), n(r, "trials"), "{r}");
        assert_eq!(n(r, "baseline_failed") + n(r, "stalled"), 0, "{r}");
    }
    // Where Nereus ran every trial, the baseline's own order ran out of memory somewhere.
    assert!(
        rows.iter().any(|r| n(r, "nereus_completed") == n(r, "trials") && n(r, "baseline_refused") > 0),
        "uncoordinated orders must conflict somewhere"
    );
    assert!(rows.iter().any(|r| n(r, "resource_edges") > 0), "model-stages waited for each other's releases");
    assert!(report["floors"].as_array().unwrap().iter().all(|f| f["ok"] == true));
}

#[test]
fn a_stalled_primitive_aborts_the_job_naming_the_transition_node() {
    let mut cmd = common::mpirun();
    cmd.args(["-n", "8", "-x", "NEREUS_FAULT_STALL=3:point-to-point exchange"]).arg(common::nereus()).args([
        "--collective-timeout",
        "2",
        "selftest",
        "transitions",
        "--cases",
        "3",
    ]);
    let start = std::time::Instant::now();
    let out = cmd.output().unwrap();
    let (_, stderr) = text(&out);
    assert!(!out.status.success());
    assert!(start.elapsed() < std::time::Duration::from_secs(60), "aborted, not hung");
    assert!(stderr.contains("watchdog") && stderr.contains("during transition node"), "{stderr}");
}
