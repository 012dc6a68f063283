//! The binary under `mpirun`: bring-up, topology gather, config agreement, watchdog.

mod common;

use common::{mpirun, nereus, run_mpi, set_key, shipped, text, write};
use std::time::{Duration, Instant};

#[test]
fn topology_reports_every_rank_once_with_its_node_and_binding() {
    let out = run_mpi(4, &["inspect", "topology", "--json"]);
    let (stdout, stderr) = text(&out);
    assert!(out.status.success(), "{stderr}");
    let report: serde_json::Value = serde_json::from_str(&stdout).expect("rank 0 prints one JSON object");
    assert_eq!(report["world_size"], 4);
    let ranks = report["ranks"].as_array().unwrap();
    let ids: Vec<i64> = ranks.iter().map(|r| r["rank"].as_i64().unwrap()).collect();
    assert_eq!(ids, [0, 1, 2, 3], "each rank reported once, in order");
    // One node here: local ranks 0..3, and exactly one node description, from local rank 0.
    let local: Vec<i64> = ranks.iter().map(|r| r["local_rank"].as_i64().unwrap()).collect();
    assert_eq!(local, [0, 1, 2, 3]);
    assert_eq!(report["node_reports"].as_array().unwrap().len(), report["nodes"].as_u64().unwrap() as usize);
    for r in ranks {
        assert_eq!(r["launcher"], "mpirun");
        assert!(!r["binding"]["hardware_threads"].as_array().unwrap().is_empty());
    }
}

#[test]
fn topology_table_names_each_rank() {
    let out = run_mpi(4, &["inspect", "topology"]);
    let (stdout, stderr) = text(&out);
    assert!(out.status.success(), "{stderr}");
    assert!(stdout.starts_with("4 ranks on 1 node(s), launched by mpirun"), "{stdout}");
    for rank in 0..4 {
        assert!(stdout.contains(&format!("rank {rank}: node 0")), "{stdout}");
    }
    // Only rank 0 prints.
    assert_eq!(stdout.matches("ranks on").count(), 1);
}

#[test]
fn all_ranks_agree_on_the_default_config() {
    let out = run_mpi(4, &["inspect", "config"]);
    let (stdout, stderr) = text(&out);
    assert!(out.status.success(), "{stderr}");
    assert!(stdout.contains("agreed by 4 rank(s)"), "{stdout}");
    assert_eq!(stdout.matches("[job]").count(), 1, "only rank 0 prints the config");
}

#[test]
fn ranks_holding_different_configs_abort_the_job_naming_them() {
    let out = mpirun()
        .args(["-n", "2"])
        .arg(nereus())
        .args(["inspect", "config", "configs/tiny-ppo.toml", ":", "-n", "2"])
        .arg(nereus())
        .args(["inspect", "config", "configs/tiny-ppo.toml", "--seed", "7"])
        .output()
        .unwrap();
    let (stdout, stderr) = text(&out);
    assert!(!out.status.success());
    assert!(!stdout.contains("[job]"), "no rank may print a config it does not share");
    let line = stderr.lines().find(|l| l.contains("config agreement")).expect("an agreement error");
    assert!(line.starts_with("[r0]"), "rank 0 reports: {line}");
    assert!(line.contains("ranks 0-1: hash") && line.contains("ranks 2-3: hash"), "{line}");
    assert_eq!(stderr.matches("config agreement").count(), 1, "reported once: {stderr}");
}

#[test]
fn a_rank_whose_config_is_broken_is_named_and_nobody_hangs() {
    let dir = tempfile::tempdir().unwrap();
    let broken = set_key(&shipped("tiny-ppo.toml"), "models.actor", "kv_heads", Some("3"));
    let broken = write(dir.path(), "broken.toml", &broken);
    let out = mpirun()
        .args(["-n", "3"])
        .arg(nereus())
        .args(["inspect", "config", "configs/tiny-ppo.toml", ":", "-n", "1"])
        .arg(nereus())
        .args(["inspect", "config", broken.to_str().unwrap()])
        .output()
        .unwrap();
    let (_, stderr) = text(&out);
    assert!(!out.status.success());
    assert!(stderr.contains("ranks 0-2: hash"), "{stderr}");
    assert!(stderr.contains("rank 3: failed: invalid value for `models.actor.kv_heads` = 3"), "{stderr}");
}

#[test]
fn a_config_error_on_every_rank_is_reported_once_with_status_2() {
    let dir = tempfile::tempdir().unwrap();
    let broken = write(dir.path(), "b.toml", &set_key(&shipped("tiny-ppo.toml"), "rl", "algorithm", Some("\"dpo\"")));
    let out = run_mpi(4, &["inspect", "config", broken.to_str().unwrap()]);
    let (_, stderr) = text(&out);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert_eq!(stderr.matches("unknown variant `dpo`").count(), 1, "{stderr}");
    assert!(stderr.contains("all 4 ranks: failed:"), "{stderr}");
}

#[test]
fn the_watchdog_aborts_a_stalled_collective_instead_of_hanging() {
    let start = Instant::now();
    let out = run_mpi_env(
        3,
        &[("NEREUS_FAULT_STALL", "2:config agreement")],
        &["--collective-timeout", "2", "inspect", "config"],
    );
    let elapsed = start.elapsed();
    let (_, stderr) = text(&out);
    assert!(!out.status.success());
    assert!(elapsed < Duration::from_secs(60), "aborted after {elapsed:?}");
    assert!(
        stderr.contains("watchdog: collective `config agreement` on world (3 ranks) did not complete within 2 s"),
        "{stderr}"
    );
}

#[test]
fn detection_counts_ranks_per_node_as_devices_on_a_cpu_machine() {
    let out =
        run_mpi(4, &["inspect", "config", "configs/tiny-ppo.toml", "--cluster", "configs/clusters/local-detect.toml"]);
    let (stdout, stderr) = text(&out);
    assert!(out.status.success(), "{stderr}");
    assert!(stdout.contains("devices_per_node = 4"), "{stdout}");
    assert!(stdout.contains("data_plane = \"mpi\""), "{stdout}");
    assert!(stdout.contains("name = \"local\""), "{stdout}");
}

fn run_mpi_env(n: usize, env: &[(&str, &str)], args: &[&str]) -> std::process::Output {
    let mut cmd = mpirun();
    cmd.arg("-n").arg(n.to_string());
    for (k, v) in env {
        cmd.arg("-x").arg(format!("{k}={v}"));
    }
    cmd.arg(nereus()).args(args).output().unwrap()
}
