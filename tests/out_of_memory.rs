//! Running out of memory exits 1 wherever it happens, as docs/operations.md's exit-status table
//! says: a supervised warm-up past its memory once exited 2, as a usage error would. (A step's
//! out-of-memory on some ranks is `tests/failures.rs`'s; a plan the planner finds will not fit,
//! a configuration problem found before anything runs, exits 2.)

mod common;

use common::{assert_status, run_mpi, set_key, shipped, write};

#[test]
fn a_warm_up_out_of_memory_exits_1_naming_the_warm_up_and_its_key() {
    let dir = tempfile::tempdir().unwrap();
    let toml = set_key(&shipped("tiny-ppo.toml"), "train", "warmup_memory_gb", Some("0.0001"));
    let job = write(dir.path(), "w.toml", &toml);
    let out = dir.path().join("out");
    let run = run_mpi(2, &["train", job.to_str().unwrap(), "--output-dir", out.to_str().unwrap(), "--steps", "1"]);
    assert_status(&run, 1, &["warm-up", "ran out of memory", "train.warmup_memory_gb"]);
}
