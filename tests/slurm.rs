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
    if !slurm_tests_on() {
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

/// Whether the Slurm tests run (`NEREUS_SLURM_TESTS=1`); says so when they are skipped.
fn slurm_tests_on() -> bool {
    let on = std::env::var("NEREUS_SLURM_TESTS").as_deref() == Ok("1");
    if !on {
        eprintln!("skipped: set NEREUS_SLURM_TESTS=1 after `bash slurm/local-cluster.sh start`");
    }
    on
}

/// A training job submitted to the local cluster without waiting, its output in `dir/job.out`
/// and its run in `dir/run`.
struct Submitted {
    id: String,
    out: std::path::PathBuf,
    runs: std::path::PathBuf,
    started: std::time::Instant,
}

impl Submitted {
    /// `sbatch slurm/local-test.sbatch train CONFIG --steps STEPS --output-dir dir/run`.
    fn training(dir: &Path, config: &Path, steps: &str) -> Submitted {
        Submitted::submit(dir, &[], &[], "slurm/local-test.sbatch", &["train"], config, steps)
    }

    /// `sbatch FLAGS SCRIPT [LEAD] CONFIG --steps STEPS --output-dir dir/run` with the script's
    /// variables `env`, without waiting.
    fn submit(
        dir: &Path,
        flags: &[&str],
        env: &[(&str, &str)],
        script: &str,
        lead: &[&str],
        config: &Path,
        steps: &str,
    ) -> Submitted {
        let (out, runs) = (dir.join("job.out"), dir.join("run"));
        let submitted = Command::new("sbatch")
            .args(["--parsable", &format!("--output={}", out.display())])
            .args(flags)
            .arg(repo().join(script))
            .args(lead)
            .args([config.to_str().unwrap(), "--steps", steps, "--output-dir", runs.to_str().unwrap()])
            .env("NEREUS", nereus())
            .envs(env.iter().copied())
            .current_dir(repo())
            .output()
            .expect("sbatch starts");
        let id = text(&submitted).0.trim().to_string();
        assert!(!id.is_empty(), "sbatch refused the job: {}", text(&submitted).1);
        Submitted { id, out, runs, started: std::time::Instant::now() }
    }

    /// The job's output so far.
    fn output(&self) -> String {
        std::fs::read_to_string(&self.out).unwrap_or_default()
    }

    /// Waits (at most 120 s from submission) until the run has recorded `steps` steps.
    fn wait_for_steps(&self, steps: usize) {
        while common::step_records(&self.runs).len() < steps {
            assert!(self.started.elapsed().as_secs() < 120, "the job never reached step {steps}: {}", self.output());
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
    }

    /// Waits until Slurm no longer knows the job, at most `limit_s` from submission.
    fn wait_until_gone(&self, limit_s: u64, after: &str) {
        let job = &self.id;
        while Command::new("squeue").args(["-h", "-j", job]).output().is_ok_and(|o| !o.stdout.is_empty()) {
            assert!(self.started.elapsed().as_secs() < limit_s, "job {job} did not end{after}: {}", self.output());
            std::thread::sleep(std::time::Duration::from_millis(100));
        }
    }
}

#[test]
fn scancel_leaves_a_checkpoint_of_the_last_step_and_the_resume_is_bit_identical() {
    if !slurm_tests_on() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let config = common::write(
        dir.path(),
        "ppo.toml",
        &common::set_key(&common::fast_ppo(), "train", "checkpoint_every", Some("0")),
    );
    let job = Submitted::training(dir.path(), &config, "300");
    job.wait_for_steps(3);
    assert!(Command::new("scancel").arg(&job.id).status().unwrap().success());
    job.wait_until_gone(180, " after scancel");
    let (job_output, runs) = (job.output(), job.runs);
    let done = common::step_records(&runs).len() as u32;
    let latest = std::fs::read_to_string(runs.join("checkpoints/latest")).unwrap_or_default();
    assert_eq!(latest.trim(), format!("step-{done}"), "scancel left no checkpoint of the last step:\n{job_output}");
    assert!(job_output.contains("SIGTERM received: stopped after step"), "{job_output}");
    let until = (done + 2).to_string();
    let resume = |out: &Path, extra: &[&str]| {
        let mut args =
            vec!["train", config.to_str().unwrap(), "--steps", &until, "--output-dir", out.to_str().unwrap()];
        args.extend_from_slice(extra);
        let run = common::run_mpi(4, &args);
        assert!(run.status.success(), "{}", text(&run).1);
    };
    resume(&runs, &["--resume", "latest"]);
    let whole = dir.path().join("whole");
    resume(&whole, &[]);
    let (a, b) = (common::step_records(&runs), common::step_records(&whole));
    assert_eq!(a.len(), b.len());
    for (x, y) in a.iter().zip(&b) {
        for key in ["reward_mean", "actor_loss", "critic_loss", "kl", "state_digest"] {
            assert_eq!(x[key], y[key], "{key} at step {}", x["step"]);
        }
    }
}

/// The processes of `nereus` (not srun) whose command line names `dir`.
fn rank_processes(dir: &Path) -> Vec<u32> {
    let needle = dir.to_str().unwrap();
    std::fs::read_dir("/proc")
        .unwrap()
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse::<u32>().ok())
        .filter(|pid| {
            let comm = std::fs::read_to_string(format!("/proc/{pid}/comm")).unwrap_or_default();
            let cmdline = std::fs::read_to_string(format!("/proc/{pid}/cmdline")).unwrap_or_default();
            comm.trim() == "nereus" && cmdline.contains(needle)
        })
        .collect()
}

#[test]
fn a_killed_rank_restarts_the_job_from_the_latest_checkpoint_on_the_ranks_that_remain() {
    if !slurm_tests_on() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let config = common::write(dir.path(), "ppo.toml", &common::fast_ppo());
    let job = Submitted::training(dir.path(), &config, "16");
    job.wait_for_steps(3);
    let ranks = rank_processes(&job.runs);
    assert_eq!(ranks.len(), 4, "four rank processes: {ranks:?}");
    let victim = ranks.iter().max().unwrap().to_string();
    assert!(Command::new("kill").args(["-9", &victim]).status().unwrap().success());
    job.wait_until_gone(300, "");
    let (job_output, runs) = (job.output(), job.runs);
    assert!(job_output.contains("restart 1 on 3 ranks from the latest checkpoint"), "{job_output}");
    // Every step ran to the end, the last ones on three ranks.
    let records = common::step_records(&runs);
    let steps: std::collections::BTreeSet<u64> = records.iter().map(|r| r["step"].as_u64().unwrap()).collect();
    assert_eq!(steps, (0..16).collect(), "{job_output}");
    let last = records.last().unwrap();
    for p in last["plan"].as_object().unwrap().values() {
        assert!(p["ranks"].as_array().unwrap().iter().all(|r| r.as_u64().unwrap() < 3), "{last}");
    }
    let latest = std::fs::read_to_string(runs.join("checkpoints/latest")).unwrap_or_default();
    assert_eq!(latest.trim(), "step-16", "{job_output}");
}

#[test]
fn a_crash_before_the_first_checkpoint_restarts_the_job_afresh_and_it_completes() {
    if !slurm_tests_on() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let config = common::write(
        dir.path(),
        "ppo.toml",
        &common::set_key(&common::fast_ppo(), "train", "checkpoint_every", Some("0")),
    );
    let job = Submitted::training(dir.path(), &config, "12");
    job.wait_for_steps(2);
    let ranks = rank_processes(&job.runs);
    let victim = ranks.iter().max().expect("rank processes").to_string();
    assert!(Command::new("kill").args(["-9", &victim]).status().unwrap().success());
    job.wait_until_gone(300, "");
    let (job_output, runs) = (job.output(), job.runs);
    assert!(job_output.contains("restart 1 on 3 ranks"), "{job_output}");
    let lines: Vec<serde_json::Value> = std::fs::read_to_string(runs.join("metrics.jsonl"))
        .unwrap()
        .lines()
        .filter_map(|l| serde_json::from_str(l).ok())
        .collect();
    let fresh = lines.iter().position(|l| l["event"] == "fresh-start").expect("the restart started afresh");
    let steps: Vec<u64> = lines[fresh + 1..].iter().filter_map(|l| l["step"].as_u64()).collect();
    assert_eq!(steps, (0..12).collect::<Vec<_>>(), "{job_output}");
    let latest = std::fs::read_to_string(runs.join("checkpoints/latest")).unwrap_or_default();
    assert_eq!(latest.trim(), "step-12", "{job_output}");
}

/// The NVIDIA batch script as users submit it, its train path on the local cluster: the
/// emulated device stands in for the GPUs (`NEREUS_DEVICE=emulated`, the only difference), the
/// job keeps its own `[cluster]` (`NEREUS_CLUSTER=`), and a rank killed mid-run goes through
/// slurm/requeue.sh's restart loop: the step starts again on the rank left, resumes on the
/// device from the latest checkpoint, and the run completes.
#[test]
fn the_nvidia_batch_script_trains_on_the_emulated_device_and_restarts_a_lost_rank() {
    if !slurm_tests_on() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let mut toml = common::fast_ppo().replace("dtype = \"f32\"", "dtype = \"bf16\"");
    for (key, value) in [("prompts_per_step", "16"), ("mini_batch", "16"), ("max_response_len", "12")] {
        toml = common::set_key(&toml, "rl", key, Some(value));
    }
    let config = common::write(dir.path(), "ppo.toml", &toml);
    // The local node has two cores: two ranks, no GPUs to request, and the node shared with
    // the other tests' jobs (the script asks for it whole).
    let flags = [
        "--nodes=1",
        "--ntasks-per-node=2",
        "--cpus-per-task=1",
        "--gpus-per-node=0",
        "--overcommit",
        "--oversubscribe",
    ];
    let env = [("NEREUS_DEVICE", "emulated"), ("NEREUS_CLUSTER", "")];
    let job = Submitted::submit(dir.path(), &flags, &env, "slurm/nvidia-ib.sbatch", &[], &config, "4");
    job.wait_for_steps(1);
    let ranks = rank_processes(&job.runs);
    let victim = ranks.iter().max().expect("rank processes").to_string();
    assert!(Command::new("kill").args(["-9", &victim]).status().unwrap().success());
    job.wait_until_gone(300, "");
    let (job_output, runs) = (job.output(), job.runs);
    assert!(job_output.contains("drives emulated device 0"), "{job_output}");
    assert!(job_output.contains("restart 1 on 1 ranks from the latest checkpoint"), "{job_output}");
    let steps: std::collections::BTreeSet<u64> =
        common::step_records(&runs).iter().map(|r| r["step"].as_u64().unwrap()).collect();
    assert_eq!(steps, (0..4).collect(), "{job_output}");
    let latest = std::fs::read_to_string(runs.join("checkpoints/latest")).unwrap_or_default();
    assert_eq!(latest.trim(), "step-4", "{job_output}");
}
