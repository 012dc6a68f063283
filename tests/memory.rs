//! The memory promise on real MPI ranks: random tiny jobs under the planner's plans and under
//! random valid fixed `[plan]` tables, each with a device memory just above what `nereus plan`
//! predicts for its fullest rank, train one step. None may run out of memory, and every rank's
//! ledger peak must lie between 0.8 and 1.0 of the peak predicted for that rank.

mod common;

use common::{drop_section, fast_ppo, run_mpi, run_single, set_key, step_records, text, write};

/// A small deterministic generator (the test's own draws; the engine's RNG is not involved).
struct Draw(u64);

impl Draw {
    fn below(&mut self, n: u64) -> u64 {
        self.0 = self.0.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        (self.0 >> 33) % n
    }

    fn pick<T: Copy>(&mut self, xs: &[T]) -> T {
        xs[self.below(xs.len() as u64) as usize]
    }
}

/// Random valid `[plan]` tables for `algorithm` on `ranks` ranks: per model-stage a layout the
/// tiny models accept, a replica count, and ranks drawn from a shuffled pool.
fn random_plan_tables(draw: &mut Draw, algorithm: &str, ranks: u32) -> String {
    let stages: &[&str] = match algorithm {
        "ppo" => &[
            "actor/generation",
            "reference/inference",
            "reward/inference",
            "critic/inference",
            "actor/training",
            "critic/training",
        ],
        _ => &["actor/generation", "reference/inference", "reward/inference", "actor/training"],
    };
    let mut out = String::new();
    for ms in stages {
        let (tp, pp) = (draw.pick(&[1u32, 2]), draw.pick(&[1u32, 2]));
        let dp = 1 + draw.below(u64::from(ranks / (tp * pp))) as u32;
        let mut pool: Vec<u32> = (0..ranks).collect();
        for i in (1..pool.len()).rev() {
            pool.swap(i, draw.below(i as u64 + 1) as usize);
        }
        let chosen: Vec<String> = pool[..(tp * pp * dp) as usize].iter().map(u32::to_string).collect();
        out += &format!("\n[plan.\"{ms}\"]\ntp = {tp}\npp = {pp}\ndp = {dp}\nranks = [{}]\n", chosen.join(", "));
    }
    out
}

/// `nereus plan FILE --json` for a job file.
fn plan_json(path: &std::path::Path) -> serde_json::Value {
    let out = run_single(&["plan", path.to_str().unwrap(), "--json"]);
    let (stdout, stderr) = text(&out);
    assert!(out.status.success(), "nereus plan {}: {stderr}", path.display());
    serde_json::from_str(&stdout).expect("one JSON plan")
}

#[test]
fn plans_near_the_memory_limit_run_and_each_ranks_ledger_peak_matches_its_prediction() {
    // Twelve seeded draws: PPO and GRPO, 4 and 8 ranks, the planner's plans and fixed ones alternating.
    const TRIALS: u64 = 12;
    let dir = tempfile::tempdir().unwrap();
    let mut ratios: Vec<f64> = Vec::new();
    for trial in 0..TRIALS {
        let mut draw = Draw(0x9e37_79b9 ^ trial);
        let ranks = draw.pick(&[4u32, 8]);
        let algorithm = draw.pick(&["ppo", "grpo"]);
        let fixed = trial % 2 == 1;
        let out_dir = dir.path().join(format!("run-{trial}"));
        let mut toml = fast_ppo();
        toml = set_key(&toml, "job", "output_dir", Some(&format!("\"{}\"", out_dir.display())));
        toml = set_key(&toml, "train", "checkpoint_every", Some("1000"));
        toml = set_key(&toml, "cluster", "devices_per_node", Some(&ranks.to_string()));
        toml = set_key(&toml, "rl", "algorithm", Some(&format!("\"{algorithm}\"")));
        toml = set_key(&toml, "rl", "max_response_len", Some(&draw.pick(&[8, 16, 24]).to_string()));
        toml = set_key(&toml, "rl", "micro_batch", Some(&draw.pick(&[4, 8, 16]).to_string()));
        if algorithm == "grpo" {
            toml = set_key(&toml, "rl", "prompts_per_step", Some("16"));
            toml = set_key(&toml, "rl", "samples_per_prompt", Some("4"));
            toml = drop_section(&toml, "models.critic");
        }
        if fixed {
            toml += &random_plan_tables(&mut draw, algorithm, ranks);
        }
        // Probe at a roomy memory, then give each device 0-15% more than the fullest rank needs
        // (over the 10% headroom): the tightest memory under which `nereus plan` accepts.
        let probe = write(dir.path(), &format!("probe-{trial}.toml"), &toml);
        let fullest = plan_json(&probe)["rank_peak_memory_bytes"]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v.as_u64().unwrap())
            .max()
            .unwrap();
        let memory_gb = fullest as f64 / 0.9 * (1.0 + draw.below(16) as f64 / 100.0) / 1e9 + 1e-6;
        toml = set_key(&toml, "cluster", "device_memory_gb", Some(&format!("{memory_gb:.9}")));
        let job = write(dir.path(), &format!("job-{trial}.toml"), &toml);
        let planned = plan_json(&job);
        let usable = planned["usable_memory_bytes"].as_u64().unwrap();
        let out = run_mpi(ranks as usize, &["train", job.to_str().unwrap(), "--steps", "1"]);
        let (_, stderr) = text(&out);
        assert!(
            out.status.success(),
            "trial {trial} ({algorithm}, {ranks} ranks, {} plan, {memory_gb:.6} GB): {stderr}",
            if fixed { "fixed" } else { "planner's" }
        );
        let records = step_records(&out_dir);
        let record = records.last().expect("one step recorded");
        let per_rank = |which: &str| -> Vec<u64> {
            record["rank_peak_memory_bytes"][which].as_array().unwrap().iter().map(|v| v.as_u64().unwrap()).collect()
        };
        let (measured, predicted) = (per_rank("measured"), per_rank("predicted"));
        assert_eq!(
            predicted,
            planned["rank_peak_memory_bytes"]
                .as_array()
                .unwrap()
                .iter()
                .map(|v| v.as_u64().unwrap())
                .collect::<Vec<_>>(),
            "trial {trial}: train predicts what plan printed"
        );
        for (rank, (&m, &p)) in measured.iter().zip(&predicted).enumerate() {
            assert!(p <= usable, "trial {trial}: rank {rank} predicted {p} over usable {usable}");
            if p == 0 {
                assert_eq!(m, 0, "trial {trial}: rank {rank} holds nothing in the plan but charged {m}");
                continue;
            }
            let ratio = m as f64 / p as f64;
            assert!((0.8..=1.0).contains(&ratio), "trial {trial}, rank {rank}: ledger peak {m} vs predicted {p}");
            ratios.push(ratio);
        }
    }
    ratios.sort_by(f64::total_cmp);
    let q = |f: f64| ratios[((ratios.len() - 1) as f64 * f) as usize];
    eprintln!(
        "{} ranks over {TRIALS} runs: ledger/predicted min {:.4}, p10 {:.4}, median {:.4}, max {:.4}",
        ratios.len(),
        q(0.0),
        q(0.1),
        q(0.5),
        q(1.0)
    );
}
