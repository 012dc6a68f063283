//! `sbatch` on the local one-node Slurm cluster (`slurm/local-cluster.sh start`): the topology
//! of every rank under `srun --mpi=pmix`, and a short training run of the default job.
//!
//! Runs when `NEREUS_SLURM_TESTS=1` (set by `scripts/test.sh` once the cluster is up); then a
//! missing or broken cluster fails the test rather than skipping it.

mod common;

use common::{nereus, repo, text};
use std::path::Path;
use std::process::Command;

/// Submits `slurm/local-test.sbatch ARGS` with `sbatch --wait`, its output in `dir`; requires
/// success and returns sbatch's stdout and the job's output. `None` when the tests are off.
fn sbatch(dir: &Path, args: &[&str]) -> Option<(String, String)> {
    if std::env::var("NEREUS_SLURM_TESTS").as_deref() != Ok("1") {
        eprintln!("skipped: set NEREUS_SLURM_TESTS=1 after `bash slurm/local-cluster.sh start`");
        return None;
    }
    let output = dir.join("job.out");
    let out = Command::new("sbatch")
        .arg("--wait")
        .arg(format!("--output={}", output.display()))
        .arg(repo().join("slurm/local-test.sbatch"))
        .args(args)
        .env("NEREUS", nereus())
        .current_dir(repo())
        .output()
        .expect("sbatch starts");
    let (stdout, stderr) = text(&out);
    let job_output = std::fs::read_to_string(&output).unwrap_or_default();
    assert!(out.status.success(), "sbatch failed: {stdout}{stderr}\njob output:\n{job_output}");
    Some((stdout, job_output))
}

#[test]
fn sbatch_runs_every_rank_under_srun_pmix() {
    let dir = tempfile::tempdir().unwrap();
    let Some((stdout, job_output)) = sbatch(dir.path(), &[]) else { return };
    let job_id = stdout.trim().rsplit(' ').next().unwrap().to_string();
    let report: serde_json::Value = serde_json::from_str(&job_output).expect("rank 0 printed the topology as JSON");
    assert_eq!(report["world_size"], 4);
    let ranks = report["ranks"].as_array().unwrap();
    assert_eq!(ranks.iter().map(|r| r["rank"].as_i64().unwrap()).collect::<Vec<_>>(), [0, 1, 2, 3]);
    for r in ranks {
        assert_eq!(r["launcher"]["srun"]["job_id"].as_str(), Some(job_id.as_str()), "{r}");
    }
}

#[test]
fn sbatch_trains_the_default_job_under_srun_pmix() {
    let dir = tempfile::tempdir().unwrap();
    let runs = dir.path().join("run");
    let Some((_, job_output)) = sbatch(dir.path(), &["train", "--steps", "3", "--output-dir", runs.to_str().unwrap()])
    else {
        return;
    };
    assert!(job_output.contains("step    2"), "{job_output}");
    let lines: Vec<serde_json::Value> = std::fs::read_to_string(runs.join("metrics.jsonl"))
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(lines.len(), 3);
    let ranks: usize = lines[0]["plan"]["actor/generation"]["ranks"].as_array().unwrap().len();
    assert_eq!(ranks, 4, "the planner placed generation on the job's 4 ranks: {}", lines[0]["plan"]);
}
