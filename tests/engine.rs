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
    let out = run_mpi(8, &["selftest", "engine", "--device", "emulated"]);
    let (stdout, stderr) = text(&out);
    assert!(out.status.success(), "selftest engine --device emulated: {stderr}");
    let summary: serde_json::Value = serde_json::from_str(stdout.trim()).expect("one JSON summary from rank 0");
    assert_eq!(summary["failures"].as_array().unwrap().len(), 0, "{summary}");
    let rows = summary["rows"].as_array().unwrap();
    // The host's (1, 1, 1) for each model, then the 17 layouts of each on the devices.
    assert_eq!(rows.iter().filter(|r| r["device"] == true).count(), 34, "{summary}");
    for row in rows.iter().filter(|r| r["device"] == true) {
        // bf16 rounding shows (the device is not computing in f32), within the stated tolerances.
        let (params, grads) = (row["params_rel"].as_f64().unwrap(), row["grads_rel"].as_f64().unwrap());
        assert!(grads > 1e-4 && grads <= 0.08 && params <= 0.05, "{row}");
    }
}
