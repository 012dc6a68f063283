//! `nereus plan`: the JSON contract, valid plans, and a clear refusal when nothing fits.

mod common;

use common::{run_single, text};

fn plan_json(args: &[&str]) -> serde_json::Value {
    let mut all = vec!["plan", "configs/llama3.1-8b-ppo.toml", "--json"];
    all.extend_from_slice(args);
    let out = run_single(&all);
    let (stdout, stderr) = text(&out);
    assert!(out.status.success(), "{stderr}");
    serde_json::from_str(&stdout).expect("one JSON plan")
}

#[test]
fn plans_fit_every_rank_and_their_parts_add_up() {
    for (cluster, gpus) in [("h200", "16"), ("a100", "32")] {
        let p =
            plan_json(&["--cluster", &format!("configs/clusters/{cluster}.toml"), "--gpus", gpus, "--seq-len", "2048"]);
        let gpus: i64 = gpus.parse().unwrap();
        assert_eq!(p["gpus"], gpus);
        assert_eq!(p["parameters"]["actor"], 8_030_261_248u64, "catalogue count of Llama-3.1-8B");
        let stages = p["model_stages"].as_array().unwrap();
        let names: Vec<&str> = stages.iter().map(|m| m["model_stage"].as_str().unwrap()).collect();
        assert_eq!(
            names,
            [
                "actor/generation",
                "reference/inference",
                "reward/inference",
                "critic/inference",
                "actor/training",
                "critic/training"
            ]
        );
        let usable = p["usable_memory_bytes"].as_u64().unwrap();
        let ranks_peaks: Vec<u64> =
            p["rank_peak_memory_bytes"].as_array().unwrap().iter().map(|v| v.as_u64().unwrap()).collect();
        assert_eq!(ranks_peaks.len() as i64, gpus);
        assert!(ranks_peaks.iter().all(|&b| b > 0 && b <= usable), "{cluster}: {ranks_peaks:?} over {usable}");
        for m in stages {
            let (tp, pp, dp) = (m["tp"].as_i64().unwrap(), m["pp"].as_i64().unwrap(), m["dp"].as_i64().unwrap());
            let ranks: Vec<i64> = m["ranks"].as_array().unwrap().iter().map(|r| r.as_i64().unwrap()).collect();
            assert_eq!(ranks.len() as i64, tp * pp * dp);
            assert!(ranks.iter().all(|r| (0..gpus).contains(r)));
            let mut distinct = ranks.clone();
            distinct.dedup();
            assert_eq!(distinct.len(), ranks.len(), "a rank holds two replicas of {}", m["model_stage"]);
            assert!(m["latency_s"].as_f64().unwrap() > 0.0);
            let peak = m["peak_memory_bytes"].as_u64().unwrap();
            assert!(peak > 0 && peak <= usable);
            let items: u64 = m["memory"].as_object().unwrap().values().map(|v| v.as_u64().unwrap()).sum();
            assert_eq!(items, peak, "the breakdown adds up to the peak");
        }
        let parts: f64 = p["step_seconds"].as_object().unwrap().values().map(|v| v.as_f64().unwrap()).sum();
        let total = p["step_latency_s"].as_f64().unwrap();
        assert!(total > 0.0 && (parts - total).abs() <= 1e-9 * total, "{parts} vs {total}");
    }
}

#[test]
fn a_pool_too_small_is_refused_with_what_would_fit() {
    let out = run_single(&[
        "plan",
        "configs/llama3.1-8b-ppo.toml",
        "--cluster",
        "configs/clusters/a100.toml",
        "--gpus",
        "1",
        "--seq-len",
        "8192",
    ]);
    let (_, stderr) = text(&out);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(stderr.contains("no plan fits 1 GPUs"), "{stderr}");
    assert!(stderr.contains("would fit"), "{stderr}");
}
