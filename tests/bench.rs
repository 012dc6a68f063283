//! `nereus bench primitives` and `bench engine` keep their JSON contracts; the primitives hold
//! their byte floors (deterministic; timing floors are checked by running the benchmarks).

mod common;

use common::{run_mpi, text};

#[test]
fn bench_primitives_writes_the_contract_and_holds_the_byte_floors() {
    let dir = tempfile::tempdir().unwrap();
    let json = dir.path().join("p.json");
    let out =
        run_mpi(2, &["bench", "primitives", "--sizes-mib", "1,2", "--reps", "1", "--json", json.to_str().unwrap()]);
    let (stdout, stderr) = text(&out);
    assert!(out.status.success(), "{stderr}");
    assert!(stdout.contains("floors:"), "{stdout}");
    let report: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    assert_eq!(report["bench"], "primitives");
    assert_eq!(report["machine"]["ranks"], 2);
    let rows = report["rows"].as_array().unwrap();
    for kind in ["extend", "destroy", "split", "merge", "p2p"] {
        assert_eq!(rows.iter().filter(|r| r["primitive"] == kind).count(), 2, "{kind} at each size");
    }
    for r in rows.iter().filter(|r| r["primitive"] == "extend") {
        assert_eq!(r["bytes_sent"], r["unit_bytes"], "Extend sends one copy: {r}");
    }
    let floors = report["floors"].as_array().unwrap();
    for name in [
        "merge_bytes_sent_with_resident_targets",
        "extend_bytes_sent_minus_one_unit",
        "split_bytes_sent_minus_missing_bytes",
    ] {
        let f = floors.iter().find(|f| f["name"] == name).unwrap_or_else(|| panic!("floor {name} missing"));
        assert_eq!(f["ok"], true, "{f}");
    }
}

#[test]
fn bench_primitives_needs_two_ranks() {
    let out = run_mpi(1, &["bench", "primitives", "--sizes-mib", "1"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(text(&out).1.contains("at least 2 MPI ranks"));
}

#[test]
fn bench_engine_reports_every_phase_and_the_gemm_fraction_floor() {
    let dir = tempfile::tempdir().unwrap();
    let json = dir.path().join("e.json");
    let out = run_mpi(1, &["bench", "engine", "--reps", "1", "--json", json.to_str().unwrap()]);
    let (stdout, stderr) = text(&out);
    assert!(out.status.success(), "{stderr}");
    let report: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    assert_eq!(report["bench"], "engine", "{stdout}");
    let rows = report["rows"].as_array().unwrap();
    for phase in ["gemm_reference", "forward", "backward", "train_step", "decode"] {
        let row = rows.iter().find(|r| r["phase"] == phase).unwrap_or_else(|| panic!("{phase} missing: {stdout}"));
        assert!(row["tokens_per_second"].as_f64().unwrap() > 0.0, "{row}");
    }
    let step = rows.iter().find(|r| r["phase"] == "train_step").unwrap();
    // 6 · (matrix parameters) · tokens, plus causal attention, worked by hand: per block q, k,
    // v, o = 512·512 + 2·256·512 + 512·512 and SwiGLU 3·1408·512, four blocks, LM head
    // 4096·512 → 13,893,632 matrix parameters; attention 4 blocks · 4 sequences · 8 heads ·
    // 2 · 64 · 256 · 257 · (1 forward + 2 backward).
    let want = 6.0 * 13_893_632.0 * 1024.0 + 3.0 * (4 * 4 * 8 * 2 * 64 * 256 * 257) as f64;
    assert_eq!(step["flops"].as_f64().unwrap(), want, "{step}");
    let floor = report["floors"]
        .as_array()
        .unwrap()
        .iter()
        .find(|f| f["name"] == "train_step_fraction_of_gemm_flops")
        .expect("the floor is reported")
        .clone();
    assert_eq!(floor["floor"], 0.4);
}

#[test]
fn bench_calibration_fits_half_the_plans_and_predicts_the_other_half() {
    let dir = tempfile::tempdir().unwrap();
    let json = dir.path().join("c.json");
    let runs = dir.path().join("runs");
    let out = run_mpi(
        8,
        &[
            "bench",
            "calibration",
            "--steps",
            "2",
            "--out-dir",
            runs.to_str().unwrap(),
            "--json",
            json.to_str().unwrap(),
        ],
    );
    let (_, stderr) = text(&out);
    assert!(out.status.success(), "{stderr}");
    let report: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    let rows = report["rows"].as_array().unwrap();
    assert_eq!(rows.len(), 16, "4 layouts x {{4, 8}} ranks x 2 lengths");
    let held_out: Vec<&serde_json::Value> = rows.iter().filter(|r| r["set"] == "held-out").collect();
    assert_eq!(held_out.len(), 8);
    for ranks in [4, 8] {
        assert!(held_out.iter().any(|r| r["ranks"] == ranks), "both pools are predicted");
    }
    for r in rows {
        let measured: f64 = r["measured"].as_object().unwrap().values().map(|v| v.as_f64().unwrap()).sum();
        let predicted: f64 = r["predicted"].as_object().unwrap().values().map(|v| v.as_f64().unwrap()).sum();
        assert!(measured > 0.0 && predicted > 0.0, "{r}");
        let error = 100.0 * (predicted - measured).abs() / measured;
        assert!((error - r["step_error_pct"].as_f64().unwrap()).abs() < 1e-6, "{r}");
    }
    let names: Vec<&str> = report["floors"].as_array().unwrap().iter().map(|f| f["name"].as_str().unwrap()).collect();
    assert_eq!(names, ["held_out_step_mape_pct", "held_out_largest_step_error_pct"]);
}

#[test]
fn bench_scaling_small_moves_every_method_with_digests_unchanged_and_writes_the_contract() {
    scaling_moves_every_method(&[], "host");
}

/// The same three methods on device-resident state (the emulated device, NCCL's API over MPI):
/// the DAG and the per-tensor baseline move device buffers over the GPU plane, and the restarted
/// job of checkpoint/restart loads its files onto the device.
#[test]
fn bench_scaling_on_the_emulated_device_moves_device_resident_state_every_way() {
    scaling_moves_every_method(&["--device", "emulated"], "emulated");
}

fn scaling_moves_every_method(device: &[&str], memory: &str) {
    let dir = tempfile::tempdir().unwrap();
    let json = dir.path().join("s.json");
    let checkpoints = dir.path().join("ckpt");
    let args = ["bench", "scaling", "--small", "--reps", "1", "--dir", checkpoints.to_str().unwrap()];
    let out = run_mpi(4, &[&args[..], device, &["--json", json.to_str().unwrap()]].concat());
    let (stdout, stderr) = text(&out);
    // A digest that changed under any method, or a restarted job that failed, fails the run.
    assert!(out.status.success(), "{stdout}\n{stderr}");
    assert!(stdout.contains("paper Table 4"), "{stdout}");
    let report: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    assert_eq!(report["bench"], "scaling");
    let rows = report["rows"].as_array().unwrap();
    let row =
        |case: &str| rows.iter().find(|r| r["case"] == case).unwrap_or_else(|| panic!("{case} missing: {stdout}"));
    let (extend, reshard) = (row("extend-2-4"), row("reshard-tp2-pp2"));
    let state = extend["state_bytes"].as_u64().unwrap();
    assert_eq!(extend["bytes_moved"].as_u64().unwrap(), state, "DP 1→2: one copy of each model: {extend}");
    assert_eq!(extend["tenplex_bytes"].as_u64().unwrap(), state, "{extend}");
    assert!(extend["checkpoint_bytes"].as_u64().unwrap() >= state, "{extend}");
    // tp 2 → pp 2 on the same ranks: each rank receives the other TP half of its stage only.
    let moved = reshard["bytes_moved"].as_u64().unwrap();
    assert!(moved < state * 55 / 100 && moved > state * 45 / 100, "{reshard}");
    // …and copies its own half locally: every byte of the new layout is written once.
    let local = |row: &serde_json::Value, key: &str| row[key].as_u64().unwrap();
    assert_eq!(moved + local(reshard, "bytes_local"), state, "{reshard}");
    // The Extend copies nothing locally, and neither does the per-tensor baseline (as Tenplex,
    // it keeps the resident replica); on the reshard both copy the same bytes, sent and local.
    assert_eq!(local(extend, "bytes_local"), 0, "{extend}");
    assert_eq!(local(extend, "tenplex_bytes_local"), 0, "{extend}");
    assert_eq!(local(reshard, "tenplex_bytes"), moved, "{reshard}");
    assert_eq!(local(reshard, "tenplex_bytes_local"), local(reshard, "bytes_local"), "{reshard}");
    for r in rows {
        assert_eq!(r["memory"], memory, "{r}");
        for key in ["nereus_s", "ucp_s", "tenplex_s", "floor_s"] {
            assert!(r[key].as_f64().unwrap() > 0.0, "{key}: {r}");
        }
    }
    let floors = report["floors"].as_array().unwrap();
    for case in ["extend-2-4", "reshard-tp2-pp2"] {
        for name in ["ucp_over_nereus", "tenplex_over_nereus", "nereus_over_bandwidth_floor"] {
            let name = format!("{name}_{case}");
            assert!(floors.iter().any(|f| f["name"] == name.as_str()), "floor {name} missing");
        }
    }
}
