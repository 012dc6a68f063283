//! The device data path without a GPU: `--device emulated` runs the device shard store and the
//! GPU data plane (communicators from broadcast ids, splits, grouped send/recv, pack/unpack
//! launches, in-place Merge slices) over MPI on host memory, and must do exactly what the host
//! plane does; a binary without a GPU backend refuses `--device` with exit status 2.

mod common;

use common::{fresh_seed, run_mpi, text};

fn summary(n: usize, args: &[&str]) -> serde_json::Value {
    let out = run_mpi(n, args);
    let (stdout, stderr) = text(&out);
    assert!(out.status.success(), "{args:?}: {stderr}");
    let summary: serde_json::Value = serde_json::from_str(stdout.trim()).expect("one JSON summary from rank 0");
    assert_eq!(summary["failures"].as_array().unwrap().len(), 0, "{summary}");
    summary
}

#[test]
fn device_resident_primitives_do_what_the_host_plane_does_on_8_ranks() {
    let args = ["selftest", "primitives", "--cases", "30", "--seed", "3"];
    let host = summary(8, &args);
    let device = summary(8, &[&args[..], &["--device", "emulated"]].concat());
    for key in ["executed", "refusals", "gathers", "bytes_sent"] {
        assert_eq!(host[key], device[key], "{key}: host {host} device {device}");
    }
    assert_eq!(device["group_checks"], 2, "device collectives on split and unique-id communicators");
    assert!(device["device"].as_str().unwrap().contains("emulated"), "{device}");
}

#[test]
fn device_resident_transitions_do_what_the_host_plane_does_with_a_fresh_seed() {
    let seed = fresh_seed("selftest transitions").to_string();
    let args = ["selftest", "transitions", "--cases", "12", "--seed", &seed];
    let (host, device) = (summary(6, &args), summary(6, &[&args[..], &["--device=emulated"]].concat()));
    assert!(device["executed"].as_u64().unwrap() > 0, "{device}");
    assert_eq!(host, device, "same transitions, same bytes, every check passed");
}

#[test]
fn bench_primitives_on_a_device_reports_kernels_and_bytes_handed_to_send() {
    let dir = tempfile::tempdir().unwrap();
    let json = dir.path().join("d.json");
    let args = ["bench", "primitives", "--device", "emulated", "--sizes-mib", "1", "--reps", "1", "--json"];
    let out = run_mpi(2, &[&args[..], &[json.to_str().unwrap()]].concat());
    assert!(out.status.success(), "{}", text(&out).1);
    let report: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    let rows = report["rows"].as_array().unwrap();
    for kind in ["d2d", "pack", "unpack", "extend", "destroy", "split", "merge", "p2p"] {
        assert!(rows.iter().any(|r| r["primitive"] == kind), "{kind} missing: {report}");
    }
    for r in rows.iter().filter(|r| r["primitive"] == "extend" || r["primitive"] == "split") {
        assert_eq!(r["device_bytes_sent"], r["expected_bytes"], "bytes handed to send = the host plane's: {r}");
    }
    let floors = report["floors"].as_array().unwrap();
    for name in [
        "merge_bytes_sent_with_resident_targets",
        "extend_device_bytes_minus_host_bytes",
        "split_device_bytes_minus_host_bytes",
    ] {
        let f = floors.iter().find(|f| f["name"] == name).unwrap_or_else(|| panic!("floor {name} missing: {report}"));
        assert_eq!(f["ok"], true, "{f}");
    }
}

#[test]
fn a_rank_stalled_on_the_device_path_ends_the_job_through_the_watchdog() {
    let mut cmd = common::mpirun();
    cmd.args(["-n", "4", "-x", "NEREUS_FAULT_STALL=2:device stream wait"]).arg(common::nereus()).args([
        "--collective-timeout",
        "2",
        "selftest",
        "transitions",
        "--cases",
        "3",
        "--device=emulated",
    ]);
    let start = std::time::Instant::now();
    let out = cmd.output().unwrap();
    let (_, stderr) = text(&out);
    assert!(!out.status.success());
    assert!(start.elapsed() < std::time::Duration::from_secs(60), "aborted, not hung");
    assert!(stderr.contains("watchdog"), "{stderr}");
}

#[test]
fn without_a_gpu_backend_device_commands_exit_2_and_say_why() {
    if cfg!(any(feature = "cuda", feature = "rocm")) {
        return; // such a binary answers "no … device visible" instead (unit-tested in backend)
    }
    for args in [&["bench", "primitives", "--device"][..], &["selftest", "primitives", "--device=cuda"]] {
        let out = run_mpi(1, args);
        assert_eq!(out.status.code(), Some(2), "{args:?}");
        assert!(text(&out).1.contains("not compiled with"), "{}", text(&out).1);
    }
}

#[test]
fn every_engine_kernel_matches_its_f64_reference_on_the_grid_emulator_at_warp_32_and_64() {
    // A fresh seed each run (printed, to reproduce a failure): shapes and inputs differ every time.
    let seed = fresh_seed("selftest kernels");
    let s = summary(1, &["selftest", "kernels", "--seed", &seed.to_string()]);
    let runs = s["runs"].as_array().unwrap();
    for warp in [32, 64] {
        let at: Vec<_> = runs.iter().filter(|r| r["warp"] == warp).collect();
        assert_eq!(at.len(), 20, "every kernel and the GEMM at warp {warp}: {s}");
        assert!(at.iter().all(|r| r["worst"].as_f64().unwrap() <= 1.0), "{s}");
    }
    assert!(s["finite_difference_error"].as_f64().unwrap() < 1e-5, "{s}");
}

#[test]
fn kernels_and_the_engine_on_a_gpu_this_machine_lacks_exit_2_and_say_which_for_selftests_and_the_bench() {
    for what in [["selftest", "kernels"], ["selftest", "engine"], ["bench", "engine"]] {
        for (device, compiled) in [("cuda", cfg!(feature = "cuda")), ("rocm", cfg!(feature = "rocm"))] {
            let out = run_mpi(1, &[what[0], what[1], "--device", device]);
            let stderr = text(&out).1;
            assert_eq!(out.status.code(), Some(2), "{what:?} --device {device}: {stderr}");
            let why = if compiled { "device visible" } else { "not compiled with" };
            assert!(stderr.contains(why), "{what:?} --device {device}: {stderr}");
        }
    }
}
