//! The engine under `mpirun -n 8`: every (tp, pp, dp) layout of a tiny model gives the (1, 1, 1)
//! loss, gradients and post-step parameters, and samples the same tokens with its TP-sharded KV
//! cache; on emulated devices (bf16, the kernels under the grid emulator) every layout matches
//! the host f32 engine within bf16 tolerance.

mod common;

use common::{run_mpi, text};

#[test]
fn every_layout_that_fits_8_ranks_matches_the_single_rank_step() {
    let out = run_mpi(8, &["selftest", "engine"]);
    let (stdout, stderr) = text(&out);
    assert!(out.status.success(), "selftest engine: {stderr}");
    let summary: serde_json::Value = serde_json::from_str(stdout.trim()).expect("one JSON summary from rank 0");
    assert_eq!(summary["failures"].as_array().unwrap().len(), 0, "{summary}");
    let rows = summary["rows"].as_array().unwrap();
    // 17 layouts with tp, pp, dp in {1, 2, 4} and tp·pp·dp <= 8, for the LM and the value model.
    assert_eq!(rows.len(), 34, "{summary}");
    for row in rows {
        assert!(row["params_rel"].as_f64().unwrap() <= 1e-5 && row["grads_rel"].as_f64().unwrap() <= 1e-5, "{row}");
        assert_eq!(row["same_samples"], true, "KV-cache sampling under this layout differs: {row}");
    }
    let lm_loss = rows[0]["loss"].as_f64().unwrap();
    assert!((lm_loss - 32f64.ln()).abs() < 0.1, "an untrained LM over 32 tokens has loss near ln 32: {lm_loss}");
}

#[test]
fn every_layout_on_emulated_devices_matches_the_host_f32_step_within_bf16_tolerance() {
    // On 4 ranks: the emulator runs each kernel's grid on the host, so the 10 layouts that fit 4
    // ranks take half the time of 8 ranks' 17, and the host test above covers all 17.
    let out = run_mpi(4, &["selftest", "engine", "--device", "emulated"]);
    let (stdout, stderr) = text(&out);
    assert!(out.status.success(), "selftest engine --device emulated: {stderr}");
    let summary: serde_json::Value = serde_json::from_str(stdout.trim()).expect("one JSON summary from rank 0");
    assert_eq!(summary["failures"].as_array().unwrap().len(), 0, "{summary}");
    let rows = summary["rows"].as_array().unwrap();
    // The host's (1, 1, 1) for each model, then the 10 layouts of each on the devices.
    assert_eq!(rows.iter().filter(|r| r["device"] == true).count(), 20, "{summary}");
    for row in rows.iter().filter(|r| r["device"] == true) {
        // bf16 rounding shows (the device is not computing in f32), within the stated tolerances.
        let (params, grads) = (row["params_rel"].as_f64().unwrap(), row["grads_rel"].as_f64().unwrap());
        assert!(grads > 1e-4 && grads <= 0.08 && params <= 0.05, "{row}");
    }
}

/// `bench engine --device emulated` runs the bf16 engine on the grid emulator and reports what
/// a GPU run is judged by: the FLOPs it counts are the tiny model's, and the model FLOP
/// utilisation and the decode roofline follow from the cluster file's peaks (no speed floor
/// applies on the emulator). The step's counts do: after the warm-up round no phase asks the
/// runtime for memory, and a training step waits for the device twice (the loss and the norm's
/// sums in one read, and the step's end).
#[test]
fn bench_engine_on_the_emulated_device_counts_flops_and_bytes_against_the_cluster_peaks() {
    let dir = tempfile::tempdir().unwrap();
    let json = dir.path().join("engine.json");
    let args = ["bench", "engine", "--device", "emulated", "--cluster", "configs/clusters/h200.toml", "--reps", "1"];
    let out = run_mpi(1, &[&args[..], &["--json", json.to_str().unwrap()]].concat());
    assert!(out.status.success(), "{}", text(&out).1);
    let report: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    let rows = report["rows"].as_array().unwrap();
    let phase = |name: &str| rows.iter().find(|r| r["phase"] == name).unwrap_or_else(|| panic!("{name}: {report}"));
    let phases: Vec<&str> = rows.iter().map(|r| r["phase"].as_str().unwrap()).collect();
    let families = [
        "kernels:gemm",
        "kernels:attention_forward",
        "kernels:attention_backward",
        "kernels:norms",
        "kernels:head_and_loss",
        "kernels:adamw",
        "kernels:other",
    ];
    let steps = ["gemm_library", "gemm_engine", "forward", "backward", "train_step", "prefill", "decode"];
    assert_eq!(phases, [&steps[..], &families[..]].concat());
    assert!(rows.iter().all(|r| r["seconds"].as_f64().unwrap() > 0.0), "{report}");
    // The tiny shape: 2 blocks of 128 wide, 4 × 32 query and 2 × 32 key-value heads, SwiGLU 352,
    // vocabulary 512, 128 tokens; each linear layer's three products are 6·n·in·out FLOPs.
    let linears = 2 * (128 * 128 + 2 * 128 * 64 + 128 * 128 + 3 * 128 * 352) + 128 * 512;
    assert_eq!(phase("gemm_library")["flops"].as_f64().unwrap(), (6 * 128 * linears) as f64);
    assert_eq!(phase("gemm_engine")["flops"], phase("gemm_library")["flops"]);
    // MFU against the H200's 989 TFLOP/s: the fraction times the peak and the time is the work.
    let step = phase("train_step");
    let work = step["fraction_of_peak"].as_f64().unwrap() * 989e12 * step["seconds"].as_f64().unwrap();
    assert!((work / step["flops"].as_f64().unwrap() - 1.0).abs() < 1e-9, "{step}");
    // Decode reads the bf16 weights less the untied embedding table (500,352 − 512·128
    // parameters) and 4 sequences' KV cache over 2 blocks at the mean context 8 + 8/2, per step
    // (7 steps), at 4.8 TB/s.
    let decode = phase("decode");
    let per_step = decode["seconds"].as_f64().unwrap() / 7.0;
    let bytes = decode["fraction_of_roofline"].as_f64().unwrap() * per_step * 4.8e12;
    let want = 2.0 * (500_352.0 - 512.0 * 128.0) + 4.0 * 2.0 * 2.0 * 64.0 * 12.0 * 2.0;
    assert!((bytes / want - 1.0).abs() < 1e-9, "{bytes} bytes for {want}: {decode}");
    let floors: Vec<(&str, f64, bool)> = report["floors"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| (f["name"].as_str().unwrap(), f["value"].as_f64().unwrap(), f["ok"].as_bool().unwrap()))
        .collect();
    let want =
        [("allocations_after_warmup", 0.0, true), ("syncs_per_train_step", 2.0, true), ("syncs_per_token", 0.0, true)];
    assert_eq!(floors, want, "{report}");
    // Decode's 7 token steps of 8 new tokens: the finished flags are read every 16 steps, so
    // never; no token step waits for the host. Each is one launch, of the recorded step's
    // graph, which runs the step's kernels.
    assert_eq!(decode["syncs"], 0, "{decode}");
    assert_eq!((decode["launches"].as_u64(), decode["launches_per_token"].as_f64()), (Some(7), Some(1.0)), "{decode}");
    let kernels = decode["kernels"].as_f64().unwrap();
    assert!(kernels > 7.0 * 10.0 && decode["kernels_per_token"].as_f64().unwrap() == kernels / 7.0, "{decode}");
    // Every measured pass is counted: kernels ran, and a step's tokens and results crossed.
    for name in ["forward", "train_step", "prefill", "decode"] {
        let r = phase(name);
        assert_eq!(r["allocations"], 0, "{r}");
        assert!(r["kernels"].as_u64().unwrap() > 0 && r["host_device_bytes"].as_u64().unwrap() > 0, "{r}");
        assert!(r["memset_bytes"].is_u64(), "{r}");
    }
    assert!(phase("gemm_library").get("launches").is_none(), "the bare GEMMs are not a pass");
    kernel_table_covers_the_step(&phase, &families);
}

/// The kernel table of `bench engine --device`: one more training step timed launch by launch
/// accounts for every launch and GEMM call the timed steps make, and its GEMMs do the step's
/// counted products plus the fused LM head's recomputed one (`2·n·C·V`).
fn kernel_table_covers_the_step<'a>(phase: &dyn Fn(&str) -> &'a serde_json::Value, families: &[&str]) {
    let launches: u64 = families.iter().map(|f| phase(f)["kernel_launches"].as_u64().unwrap()).sum();
    let step = phase("train_step");
    assert_eq!(launches, step["launches"].as_u64().unwrap(), "{step}");
    let gemm = phase("kernels:gemm");
    let recompute = 2.0 * 128.0 * 128.0 * 512.0;
    assert_eq!(gemm["flops"].as_f64().unwrap(), phase("gemm_library")["flops"].as_f64().unwrap() + recompute);
    assert!(phase("kernels:adamw")["bytes"].as_f64().unwrap() == 34.0 * 500_352.0, "{}", phase("kernels:adamw"));
}

/// `bench engine --peer torch`: where PyTorch or a CUDA device is missing (CI) the benchmark says
/// so and adds no row; a peer that runs adds its rows with our tokens and FLOPs at its own
/// seconds (a stand-in script here: the same JSON `scripts/peer-torch.py` writes); a peer that
/// fails fails the command, after our rows are printed.
#[test]
fn bench_engine_with_a_peer_adds_its_rows_or_says_plainly_why_not() {
    let dir = tempfile::tempdir().unwrap();
    let json = dir.path().join("engine.json");
    let bench = |env: &[(&str, &str)]| {
        let args = ["bench", "engine", "--device", "emulated", "--reps", "1", "--peer", "torch", "--json"];
        common::run_mpi_timed(1, env, &[&args[..], &[json.to_str().unwrap()]].concat()).0
    };
    let report = || serde_json::from_str::<serde_json::Value>(&std::fs::read_to_string(&json).unwrap()).unwrap();
    // This machine: no torch (or no CUDA device), so no peer row.
    let out = bench(&[]);
    let (stdout, stderr) = text(&out);
    assert!(out.status.success(), "{stderr}");
    assert!(stdout.contains("peer torch: not run on this machine (peer-torch: "), "{stdout}");
    assert!(report()["rows"].as_array().unwrap().iter().all(|r| r["phase"] != "torch_train_step"));
    // A peer that ran: 2 s a step, 0.5 s a forward, 10 ms a decode token step.
    let peer = dir.path().join("peer.py");
    let write = r#"import json, sys; json.dump({"torch": "stand-in", "device": "none", "step_s": 2.0, "forward_s": 0.5, "peak_memory_bytes": 7, "decode_step_s": 0.01}, open(sys.argv[sys.argv.index("--json") + 1], "w"))"#;
    std::fs::write(&peer, write).unwrap();
    let out = bench(&[("NEREUS_PEER_TORCH", peer.to_str().unwrap())]);
    assert!(out.status.success(), "{}", text(&out).1);
    let report = report();
    let rows = report["rows"].as_array().unwrap();
    let phase = |name: &str| rows.iter().find(|r| r["phase"] == name).unwrap_or_else(|| panic!("{name}: {report}"));
    for (ours, theirs, seconds) in [
        ("train_step", "torch_train_step", 2.0),
        ("forward", "torch_forward", 0.5),
        ("decode", "hf_generate_decode", 0.07),
    ] {
        let (a, b) = (phase(ours), phase(theirs));
        assert_eq!((b["tokens"].clone(), b["flops"].clone()), (a["tokens"].clone(), a["flops"].clone()), "{b}");
        assert!((b["seconds"].as_f64().unwrap() - seconds).abs() < 1e-12, "{b}");
        let rate = |r: &serde_json::Value| r["tokens_per_second"].as_f64().unwrap() * r["seconds"].as_f64().unwrap();
        assert!((rate(a) / rate(b) - 1.0).abs() < 1e-9, "the same tokens at the peer's seconds: {b}");
        assert!(b.get("launches").is_none(), "the peer's passes are not counted: {b}");
    }
    assert!(report["floors"].as_array().unwrap().iter().all(|f| !f["name"].as_str().unwrap().contains("torch")));
    // A peer that crashes.
    std::fs::write(&peer, "import sys; print('peer-torch: out of memory', file=sys.stderr); sys.exit(1)").unwrap();
    let out = bench(&[("NEREUS_PEER_TORCH", peer.to_str().unwrap())]);
    let (stdout, stderr) = text(&out);
    assert!(!out.status.success() && stdout.contains("train_step"), "{stdout}");
    assert!(stderr.contains("peer.py failed") && stderr.contains("peer-torch: out of memory"), "{stderr}");
}
