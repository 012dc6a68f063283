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
fn plans_cover_the_pool_with_disjoint_ranks_per_stage() {
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
        let mut used: std::collections::BTreeMap<&str, Vec<i64>> = Default::default();
        for m in stages {
            let (tp, pp, dp) = (m["tp"].as_i64().unwrap(), m["pp"].as_i64().unwrap(), m["dp"].as_i64().unwrap());
            let ranks: Vec<i64> = m["ranks"].as_array().unwrap().iter().map(|r| r.as_i64().unwrap()).collect();
            assert_eq!(ranks.len() as i64, tp * pp * dp);
            assert!(ranks.iter().all(|r| (0..gpus).contains(r)));
            let stage = m["model_stage"].as_str().unwrap().split('/').nth(1).unwrap();
            let bucket = used.entry(stage).or_default();
            assert!(ranks.iter().all(|r| !bucket.contains(r)), "ranks shared inside the {stage} stage");
            bucket.extend(ranks);
            assert!(m["latency_s"].as_f64().unwrap() > 0.0);
            assert!(m["peak_memory_bytes"].as_u64().unwrap() > 0);
        }
        assert!(p["step_latency_s"].as_f64().unwrap() > 0.0);
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
