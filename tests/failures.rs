//! How the job fails: runtime failures on some ranks, damaged or foreign checkpoints, divergence,
//! configs that passed validation once and should not have, a rank killed mid-save, a stop
//! signal. Every case exits with its documented status (1 runtime, 2 usage/config) and a message
//! naming the problem, never panics, and under MPI ends within 15 s of the failure with the
//! watchdog at its default (300 s) — so a hang shows as a wall time, not a pass.

mod common;

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::Output;
use std::time::Duration;

use common::{
    fast_ppo, run_mpi_timed, run_single, send_signal, set_key, spawn_mpi, step_records, text, wait_for_steps, write,
    Tmpfs,
};
use nereus_data::model_files::FileDigest;
use nereus_runtime::checkpoint::Sidecar;
use safetensors::tensor::TensorView;
use safetensors::SafeTensors;

/// A failed MPI job must be over within this long (the watchdog would take 300 s).
const FAST: Duration = Duration::from_secs(15);

/// How many error reports a case may print: agreed failures print once, on rank 0; a failure
/// inside a step aborts from the failing rank, and symmetric ranks may fail together.
#[derive(Clone, Copy, PartialEq)]
enum Reports {
    Once,
    AtLeastOnce,
}

/// What is wrong with one case's outcome, if anything.
fn verdict(
    name: &str,
    out: &Output,
    elapsed: Duration,
    status: i32,
    needles: &[&str],
    reports: Reports,
) -> Option<String> {
    let (_, stderr) = text(out);
    let count = stderr.lines().filter(|l| l.contains("nereus: error")).count();
    let problems: Vec<String> = [
        (out.status.code() != Some(status)).then(|| format!("exit status {:?}, want {status}", out.status.code())),
        (elapsed > FAST).then(|| format!("took {elapsed:?} (a hang until the watchdog?)")),
        stderr.contains("panicked").then(|| "panicked".into()),
        stderr.contains("watchdog:").then(|| "ended by the watchdog".into()),
        (count == 0).then(|| "no `nereus: error` report".into()),
        (reports == Reports::Once && count > 1).then(|| format!("{count} reports, want one")),
    ]
    .into_iter()
    .flatten()
    .chain(needles.iter().filter(|n| !stderr.contains(*n)).map(|n| format!("message lacks {n:?}")))
    .collect();
    (!problems.is_empty()).then(|| format!("{name}: {}\n    stderr: {}", problems.join("; "), stderr.trim()))
}

fn assert_no_failures(failures: Vec<String>, of: usize) {
    assert!(failures.is_empty(), "{} of {of} cases misbehaved:\n{}", failures.len(), failures.join("\n"));
}

/// `train CONFIG --output-dir OUT --steps N EXTRA...` under `mpirun -n ranks`.
fn train(
    ranks: usize,
    config: &Path,
    out: &Path,
    steps: u32,
    extra: &[&str],
    env: &[(&str, &str)],
) -> (Output, Duration) {
    let steps = steps.to_string();
    let mut args = vec!["train", config.to_str().unwrap(), "--steps", &steps, "--output-dir", out.to_str().unwrap()];
    args.extend_from_slice(extra);
    run_mpi_timed(ranks, env, &args)
}

fn in_ci() -> bool {
    std::env::var("CI").is_ok_and(|v| v == "true")
}

/// A tmpfs, or (outside CI, where mounting may be refused) `None` with a note.
fn tmpfs(size: u64, read_only: bool, case: &str) -> Option<Tmpfs> {
    let mounted = Tmpfs::mount(size, read_only);
    assert!(mounted.is_some() || !in_ci(), "{case}: CI runs as root and must be able to mount a tmpfs");
    if mounted.is_none() {
        eprintln!("note: {case} skipped: cannot mount a tmpfs here (needs root)");
    }
    mounted
}

#[test]
fn runtime_failures_end_every_rank_within_seconds_with_one_message() {
    let dir = tempfile::tempdir().unwrap();
    let base = fast_ppo();
    let config = write(dir.path(), "base.toml", &base);
    let out = |name: &str| dir.path().join(name);
    let mut failures = Vec::new();
    let mut cases = 0;
    let mut check = |name: &str, run: (Output, Duration), status: i32, needles: &[&str], reports: Reports| {
        cases += 1;
        failures.extend(verdict(name, &run.0, run.1, status, needles, reports));
    };

    let bf16 = write(dir.path(), "bf16.toml", &set_key(&base, "models.actor", "dtype", Some("\"bf16\"")));
    check("bf16 model", train(4, &bf16, &out("bf16"), 1, &[], &[]), 2, &["models.actor.dtype", "f32"], Reports::Once);

    check(
        "output_dir under /dev/null",
        train(4, &config, Path::new("/dev/null/run"), 1, &[], &[]),
        1,
        &["`/dev/null/run`", "Not a directory"],
        Reports::Once,
    );
    let file = write(dir.path(), "a-file", "not a directory\n");
    check(
        "output_dir is a regular file",
        train(4, &config, &file, 1, &[], &[]),
        1,
        &[file.to_str().unwrap()],
        Reports::Once,
    );

    if let Some(ro) = tmpfs(1 << 20, true, "read-only output_dir") {
        let target = ro.path.join("run");
        let needles = [target.to_str().unwrap(), "Read-only file system"];
        check("read-only output_dir", train(4, &config, &target, 1, &[], &[]), 1, &needles, Reports::Once);
    }
    if let Some(small) = tmpfs(256 << 10, false, "disk full during a checkpoint") {
        // The metrics fit, the first checkpoint (3 MB) does not: written on the loop's thread,
        // its own write fails; written in the background, whichever write finds the disk full
        // first fails (the step's metrics, or the checkpoint when the job waits for it). Either
        // way no complete-looking checkpoint is left.
        for (run_dir, mode, needles) in [
            ("run", "false", &["step-1.partial", "No space left on device"][..]),
            ("background", "true", &["No space left on device"][..]),
        ] {
            let target = small.path.join(run_dir);
            let run = train(4, &config, &target, 3, &["--set", &format!("train.checkpoint_async={mode}")], &[]);
            check(
                &format!("disk full during a checkpoint (checkpoint_async = {mode})"),
                run,
                1,
                needles,
                Reports::Once,
            );
            assert!(
                !target.join("checkpoints/step-1").exists() && !target.join("checkpoints/latest").exists(),
                "a failed checkpoint left a complete-looking one"
            );
            std::fs::remove_dir_all(&target).ok();
        }
    }
    if let Some(tiny) = tmpfs(4096, false, "disk full during a metrics append") {
        let no_checkpoints =
            write(dir.path(), "end-only.toml", &set_key(&base, "train", "checkpoint_every", Some("0")));
        let target = tiny.path.join("run");
        let run = train(4, &no_checkpoints, &target, 5, &[], &[]);
        check(
            "disk full during a metrics append",
            run,
            1,
            &["metrics.jsonl", "No space left on device"],
            Reports::Once,
        );
        let text = std::fs::read_to_string(target.join("metrics.jsonl")).unwrap_or_default();
        assert!(text.is_empty() || text.ends_with('\n'), "a torn metrics line was left behind: {text:?}");
    }

    // A checkpoint of the base job, then a resume with another hidden size: every rank reads the
    // sidecar, so every rank refuses at the same point.
    let (ok, _) = train(4, &config, &out("base"), 2, &[], &[]);
    assert!(ok.status.success(), "{}", text(&ok).1);
    let wider =
        set_key(&set_key(&base, "models.actor", "hidden", Some("128")), "models.reference", "hidden", Some("128"));
    let wider = write(dir.path(), "wider.toml", &wider);
    let step2 = out("base").join("checkpoints/step-2");
    let run = train(4, &wider, &out("wider"), 4, &["--resume", step2.to_str().unwrap()], &[]);
    check("resume with another hidden size", run, 2, &["models.actor.hidden", "64", "128"], Reports::Once);

    // A fixed pp = 2 plan in which only the first stages of the training model-stages run out of
    // memory (1F1B keeps two micro-batches in flight there, one on the last): planned for 2 GB,
    // the ranks find 4.5 MB (measured: first stages fail below about 4.8 MB, last ones at 3.9 MB).
    let pp2 = write(dir.path(), "pp2.toml", &pp2_plan(&base));
    let run = train(8, &pp2, &out("pp2"), 1, &[], &[("NEREUS_FAULT_MEMORY_BYTES", "4500000")]);
    check("some ranks out of memory under pp = 2", run, 1, &["out of memory on rank"], Reports::AtLeastOnce);
    assert_no_failures(failures, cases);
}

fn pp2_plan(toml: &str) -> String {
    let plan = [
        ("actor/generation", 1, 1, 8, "[0, 1, 2, 3, 4, 5, 6, 7]"),
        ("reference/inference", 1, 2, 2, "[0, 1, 2, 3]"),
        ("reward/inference", 1, 1, 2, "[4, 5]"),
        ("critic/inference", 1, 1, 2, "[6, 7]"),
        ("actor/training", 1, 2, 2, "[0, 1, 2, 3]"),
        ("critic/training", 1, 2, 2, "[4, 5, 6, 7]"),
    ];
    let mut out = toml.to_string();
    for (ms, tp, pp, dp, ranks) in plan {
        out.push_str(&format!("\n[plan.\"{ms}\"]\ntp = {tp}\npp = {pp}\ndp = {dp}\nranks = {ranks}\n"));
    }
    out
}

/// A checkpoint to damage: a copy of a good one, with tools to edit its files consistently.
struct Damaged {
    dir: PathBuf,
}

impl Damaged {
    fn copy_of(good: &Path, to: PathBuf) -> Damaged {
        copy_tree(good, &to);
        Damaged { dir: to }
    }

    fn sidecar(&self) -> Sidecar {
        serde_json::from_str(&std::fs::read_to_string(self.dir.join("state.json")).unwrap()).unwrap()
    }

    /// Rewrites the sidecar after `edit`, sealed as a consistent sidecar would be.
    fn edit_sidecar(&self, edit: impl FnOnce(&mut Sidecar)) {
        let mut s = self.sidecar();
        edit(&mut s);
        s.write_sealed(&self.dir).unwrap();
    }

    /// Rewrites a tensor file after `edit` on its tensors and metadata, and records its new
    /// size and digest in the sidecar: damage that only the structural checks can see.
    fn edit_tensors(
        &self,
        file: &str,
        edit: impl FnOnce(&mut Vec<(String, Vec<usize>, Vec<u8>)>, &mut HashMap<String, String>),
    ) {
        let path = self.dir.join(file);
        let bytes = std::fs::read(&path).unwrap();
        let st = SafeTensors::deserialize(&bytes).unwrap();
        let mut meta = SafeTensors::read_metadata(&bytes).unwrap().1.metadata().clone().unwrap_or_default();
        let mut tensors: Vec<(String, Vec<usize>, Vec<u8>)> =
            st.tensors().into_iter().map(|(n, v)| (n, v.shape().to_vec(), v.data().to_vec())).collect();
        tensors.sort_by(|a, b| a.0.cmp(&b.0));
        edit(&mut tensors, &mut meta);
        let views: Vec<(String, TensorView)> = tensors
            .iter()
            .map(|(n, s, d)| (n.clone(), TensorView::new(safetensors::Dtype::F32, s.clone(), d).unwrap()))
            .collect();
        let out = safetensors::serialize(views, Some(meta)).unwrap();
        std::fs::write(&path, &out).unwrap();
        let digest = FileDigest::of(file, &out);
        self.edit_sidecar(|s| {
            for m in s.models.values_mut() {
                for d in m.files.iter_mut().chain(m.optimizer.as_mut()) {
                    if d.file == file {
                        *d = digest.clone();
                    }
                }
            }
        });
    }

    /// Rewrites a file of a model directory with `edit` and records its new size and digest in
    /// the sidecar (a file the sidecar did not list is added to its model's files).
    fn edit_file(&self, file: &str, edit: impl FnOnce(String) -> String) {
        let path = self.dir.join(file);
        let text = edit(std::fs::read_to_string(&path).unwrap_or_default());
        std::fs::write(&path, &text).unwrap();
        let digest = FileDigest::of(file, text.as_bytes());
        self.edit_sidecar(|s| {
            let m = s.models.values_mut().find(|m| file.starts_with(&format!("{}/", m.dir))).unwrap();
            match m.files.iter_mut().find(|d| d.file == file) {
                Some(d) => *d = digest,
                None => m.files.push(digest),
            }
        });
    }

    fn flip_byte(&self, file: &str, at: usize) {
        let path = self.dir.join(file);
        let mut bytes = std::fs::read(&path).unwrap();
        let at = at % bytes.len();
        bytes[at] ^= 0x5A;
        std::fs::write(&path, bytes).unwrap();
    }
}

/// Copies a checkpoint directory with its model directories.
fn copy_tree(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for entry in std::fs::read_dir(from).unwrap().flatten() {
        if entry.path().is_dir() {
            copy_tree(&entry.path(), &to.join(entry.file_name()));
        } else {
            std::fs::copy(entry.path(), to.join(entry.file_name())).unwrap();
        }
    }
}

/// A SplitMix64 stream for the generated damage.
struct Draws(u64);

impl Draws {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
}

#[test]
fn resume_refuses_damaged_or_foreign_checkpoints_naming_the_problem() {
    let dir = tempfile::tempdir().unwrap();
    let base = fast_ppo();
    let config = write(dir.path(), "base.toml", &base);
    let (ok, _) = train(4, &config, &dir.path().join("good"), 2, &[], &[]);
    assert!(ok.status.success(), "{}", text(&ok).1);
    let good = dir.path().join("good/checkpoints/step-2");
    let mut n = 0;
    let mut fresh = |name: &str| {
        n += 1;
        Damaged::copy_of(&good, dir.path().join(format!("case{n}-{}", name.replace(' ', "-"))))
    };
    let layer1 = "model.layers.1.";
    type Case = (String, Damaged, Vec<&'static str>, PathBuf);
    let mut cases: Vec<Case> = Vec::new();
    let mut add = |name: &str, d: Damaged, needles: &[&'static str]| {
        cases.push((name.into(), d, needles.to_vec(), config.clone()))
    };

    let d = fresh("flipped byte");
    d.flip_byte("actor/model.safetensors", 200_000);
    add("a flipped byte in a tensor", d, &["actor/model.safetensors", "SHA-256"]);
    let d = fresh("nans");
    d.edit_tensors("actor/model.safetensors", |t, _| {
        let data = &mut t.iter_mut().find(|x| x.0.contains("mlp.up_proj")).unwrap().2;
        for k in 0..1000 {
            data[4 * k..4 * k + 4].copy_from_slice(&f32::NAN.to_le_bytes());
        }
    });
    add("1,000 NaNs in the actor (digest updated)", d, &["1000 values", "NaN or infinite"]);
    let d = fresh("no optimizer");
    std::fs::remove_file(d.dir.join("actor.optim.safetensors")).unwrap();
    add("a missing optimizer file", d, &["actor.optim.safetensors", "missing"]);
    for model in ["actor", "critic", "reward"] {
        let d = fresh(&format!("no {model}"));
        std::fs::remove_file(d.dir.join(format!("{model}/model.safetensors"))).unwrap();
        add(&format!("a missing {model} file"), d, &["missing"]);
    }
    let d = fresh("swapped");
    std::fs::rename(d.dir.join("actor/model.safetensors"), d.dir.join("tmp")).unwrap();
    std::fs::rename(d.dir.join("reference/model.safetensors"), d.dir.join("actor/model.safetensors")).unwrap();
    std::fs::rename(d.dir.join("tmp"), d.dir.join("reference/model.safetensors")).unwrap();
    add("actor and reference files swapped", d, &["actor/model.safetensors", "bytes; the sidecar says"]);
    let d = fresh("model swapped consistently");
    d.edit_tensors("actor/model.safetensors", |_, meta| drop(meta.insert("nereus.model".into(), "reference".into())));
    add("a file written for another model", d, &["written for model reference"]);
    let d = fresh("grpo");
    d.edit_sidecar(|s| s.algorithm = nereus_core::config::Algorithm::Grpo);
    add("another algorithm", d, &["rl.algorithm", "\"grpo\""]);
    let d = fresh("job");
    d.edit_sidecar(|s| s.job = "someone-else".into());
    add("another job", d, &["job.name", "someone-else"]);
    let d = fresh("seed");
    d.edit_sidecar(|s| s.seed = 7);
    add("another seed", d, &["job.seed", "7"]);
    let d = fresh("counters");
    d.edit_sidecar(|s| s.counters.clear());
    add("empty counters", d, &["no counters for"]);
    let d = fresh("step 1");
    d.edit_sidecar(|s| s.step = 1);
    add("step 1 beside step-2 weights", d, &["data position 128 is not step 1"]);
    let d = fresh("step 1 everywhere");
    d.edit_sidecar(|s| {
        s.step = 1;
        s.data_position = 64;
        for c in s.counters.values_mut() {
            (c.policy_version, c.data_position) = (1, 64);
        }
    });
    add("a sidecar of step 1 beside step-2 weights", d, &["written for model actor at step 2"]);
    let d = fresh("fewer layers");
    d.edit_tensors("actor/model.safetensors", |t, _| t.retain(|x| !x.0.starts_with(layer1)));
    add("layer 1 dropped", d, &["tensor `model.layers.1.", "missing"]);
    let d = fresh("extra tensor");
    d.edit_tensors("critic/model.safetensors", |t, _| {
        t.push(("model.layers.9.mlp.up_proj.weight".into(), vec![2], vec![0; 8]))
    });
    add("an extra tensor", d, &["model.layers.9.mlp.up_proj.weight", "not part of the model"]);
    let d = fresh("reshaped");
    d.edit_tensors("reward/model.safetensors", |t, _| {
        let x = t.iter_mut().find(|x| x.1.len() == 2).unwrap();
        x.1 = vec![x.1[1], x.1[0]];
    });
    add("a transposed tensor", d, &["reward/model.safetensors", "the model needs F32"]);
    let d = fresh("old format");
    std::fs::write(d.dir.join("state.json"), r#"{"format": 1, "job": "tiny-ppo"}"#).unwrap();
    add("a format-1 sidecar", d, &["sidecar format 1", "format 3"]);
    let d = fresh("edited sidecar");
    let edited = std::fs::read_to_string(d.dir.join("state.json")).unwrap().replace("\"updates\": 4", "\"updates\": 5");
    std::fs::write(d.dir.join("state.json"), edited).unwrap();
    add("a hand-edited sidecar", d, &["state.json", "edited or damaged"]);
    let d = fresh("no sidecar");
    std::fs::remove_file(d.dir.join("state.json")).unwrap();
    add("no sidecar", d, &["state.json", "missing"]);
    let d = fresh("truncated");
    let path = d.dir.join("critic.optim.safetensors");
    let len = std::fs::metadata(&path).unwrap().len();
    std::fs::OpenOptions::new().write(true).open(&path).unwrap().set_len(len / 2).unwrap();
    add("a truncated optimizer file", d, &["critic.optim.safetensors"]);
    let d = fresh("no config.json");
    std::fs::remove_file(d.dir.join("critic/config.json")).unwrap();
    add("a missing config.json", d, &["critic/config.json", "missing"]);
    let d = fresh("config.json of another model");
    d.edit_file("actor/config.json", |text| text.replace("\"hidden_size\": 64", "\"hidden_size\": 128"));
    add("config.json describing another width (digest updated)", d, &["actor/config.json", "hidden_size = 128"]);
    let d = fresh("unlisted shard");
    let weights = d.dir.join("reference/model.safetensors");
    std::fs::copy(&weights, d.dir.join("reference/extra.safetensors")).unwrap();
    let bytes = std::fs::read(&weights).unwrap();
    let names =
        SafeTensors::deserialize(&bytes).unwrap().names().into_iter().map(|n| n.to_string()).collect::<Vec<_>>();
    let map: serde_json::Map<String, serde_json::Value> =
        names.into_iter().map(|n| (n, "extra.safetensors".into())).collect();
    let index = serde_json::json!({"metadata": {}, "weight_map": map}).to_string();
    d.edit_file("reference/model.safetensors.index.json", |_| index);
    add(
        "an index (listed) naming a shard the sidecar does not list",
        d,
        &["reference/extra.safetensors", "does not list it"],
    );
    // Generated damage: bytes flipped at drawn offsets of drawn files, and drawn truncations.
    let files = [
        "actor/model.safetensors",
        "actor.optim.safetensors",
        "critic/model.safetensors",
        "critic.optim.safetensors",
        "reference/model.safetensors",
        "reward/model.safetensors",
        "reward/config.json",
        "actor/generation_config.json",
        "state.json",
    ];
    let mut draws = Draws(0x5EED);
    for k in 0..20 {
        let d = fresh(&format!("generated {k}"));
        let file = files[(draws.next() % files.len() as u64) as usize];
        if k % 4 == 3 {
            let path = d.dir.join(file);
            let len = std::fs::metadata(&path).unwrap().len();
            std::fs::OpenOptions::new().write(true).open(&path).unwrap().set_len(draws.next() % len).unwrap();
        } else {
            d.flip_byte(file, draws.next() as usize);
        }
        add(&format!("generated damage {k} in {file}"), d, &["checkpoint"]);
    }

    let heads = set_key(&set_key(&base, "models.actor", "heads", Some("8")), "models.actor", "kv_heads", Some("4"));
    let heads =
        set_key(&set_key(&heads, "models.reference", "heads", Some("8")), "models.reference", "kv_heads", Some("4"));
    let heads_config = write(dir.path(), "heads.toml", &heads);
    cases.push((
        "heads 8/kv 4 instead of 4/2 (same tensor sizes)".into(),
        fresh("heads"),
        vec!["models.actor.heads", "4", "8"],
        heads_config,
    ));
    let prompts = write(dir.path(), "prompts.toml", &set_key(&base, "rl", "prompts_per_step", Some("32")));
    cases.push(("another prompts_per_step".into(), fresh("prompts"), vec!["rl.prompts_per_step"], prompts));

    let mut failures = Vec::new();
    let count = cases.len();
    assert!(count >= 40, "{count} damaged checkpoints");
    for (i, (name, d, needles, config)) in cases.into_iter().enumerate() {
        let out = dir.path().join(format!("out{i}"));
        let (run, elapsed) = train(4, &config, &out, 4, &["--resume", d.dir.to_str().unwrap()], &[]);
        failures.extend(verdict(&name, &run, elapsed, 2, &needles, Reports::Once));
        if !step_records(&out).is_empty() {
            failures.push(format!("{name}: steps ran on a refused checkpoint"));
        }
    }
    // Nothing to run, and the one refusal a flag may lift.
    let (run, elapsed) = train(4, &config, &dir.path().join("done"), 2, &["--resume", good.to_str().unwrap()], &[]);
    failures.extend(verdict(
        "a checkpoint at job.steps",
        &run,
        elapsed,
        2,
        &["nothing to run", "--steps"],
        Reports::Once,
    ));
    let d = fresh("reset optimizer");
    std::fs::remove_file(d.dir.join("actor.optim.safetensors")).unwrap();
    let out = dir.path().join("reset");
    let (run, _) = train(4, &config, &out, 3, &["--resume", d.dir.to_str().unwrap(), "--resume-reset-optimizer"], &[]);
    let stderr = text(&run).1;
    if !(run.status.success() && stderr.contains("restarts AdamW from zero moments") && step_records(&out).len() == 1) {
        failures.push(format!("--resume-reset-optimizer did not resume loudly: {stderr}"));
    }
    assert_no_failures(failures, count + 2);
}

#[test]
fn divergence_stops_the_job_and_non_finite_state_is_never_checkpointed() {
    let dir = tempfile::tempdir().unwrap();
    let huge = set_key(&fast_ppo(), "train", "actor_lr", Some("1e30"));
    let stop = write(dir.path(), "stop.toml", &huge);
    let out = dir.path().join("stop");
    let (run, elapsed) = train(4, &stop, &out, 6, &[], &[]);
    let mut failures: Vec<String> =
        verdict("actor_lr = 1e30", &run, elapsed, 1, &["diverged at step", "actor/training"], Reports::Once)
            .into_iter()
            .collect();
    // The diverging step's record is written, then the job stops: no checkpoint after it.
    let diverged = step_records(&out).last().and_then(|r| r["step"].as_u64()).unwrap_or(0);
    let after: Vec<u64> = std::fs::read_dir(out.join("checkpoints"))
        .map(|d| d.flatten().filter_map(|e| e.file_name().to_str()?.strip_prefix("step-")?.parse().ok()).collect())
        .unwrap_or_default();
    if after.iter().any(|&k| k > diverged) {
        failures.push(format!("checkpoints {after:?} after the divergence at step {diverged}"));
    }
    let skip = write(dir.path(), "skip.toml", &set_key(&huge, "train", "on_nonfinite", Some("\"skip-step\"")));
    let out = dir.path().join("skip");
    let (run, elapsed) = train(4, &skip, &out, 8, &[], &[]);
    failures.extend(verdict("skip-step with actor_lr = 1e30", &run, elapsed, 1, &["diverged at step"], Reports::Once));
    let skipped: Vec<u64> = step_records(&out).iter().map(|r| r["skipped_updates"].as_u64().unwrap()).collect();
    if skipped.iter().filter(|&&s| s > 0).count() != 3 {
        failures.push(format!(
            "skip-step: skipped updates per step {skipped:?}; want three steps skipping before the stop"
        ));
    }
    assert_no_failures(failures, 2);
}

#[test]
fn validation_closes_the_gaps_that_reached_allocations_and_panics() {
    let dir = tempfile::tempdir().unwrap();
    let base = fast_ppo();
    let set = |section: &str, key: &str, value: &str| set_key(&base, section, key, Some(value));
    let configs = [
        ("prompt_len 1", set("rl", "prompt_len", "1"), vec!["rl.prompt_len", "between 2 and"]),
        ("timeout 1e30", set("job", "collective_timeout_s", "1e30"), vec!["job.collective_timeout_s", "1e30"]),
        (
            "reward_cap 2^32 - 1",
            set("train", "reward_cap", "4294967295"),
            vec!["train.reward_cap", "rl.max_response_len"],
        ),
        (
            "sequences overflow u32",
            set_key(&set("rl", "prompts_per_step", "65536"), "rl", "samples_per_prompt", Some("65536")),
            vec!["rl.prompts_per_step", "4294967296 sequences"],
        ),
        ("devices overflow u32", set("cluster", "nodes", "536870913"), vec!["cluster.nodes", "4294967304 devices"]),
        (
            "reward vocabulary smaller",
            set("models.reward", "vocab", "16"),
            vec!["models.reward.vocab", "models.actor.vocab (32)"],
        ),
        (
            "gamma f64::MAX",
            set("policy", "gamma", "1.7976931348623157e308"),
            vec!["policy.gamma", "= 1.7976931348623157e308"],
        ),
        (
            "duplicate rank in [plan]",
            pp2_plan(&base).replace("dp = 2\nranks = [4, 5]", "dp = 2\nranks = [4, 4]"),
            vec!["plan.\"reward/inference\".ranks", "rank 4 appears twice"],
        ),
        (
            "negative rank in [plan]",
            pp2_plan(&base).replace("ranks = [6, 7]", "ranks = [6, -7]"),
            vec!["rank -7 is negative"],
        ),
    ];
    let mut failures = Vec::new();
    for (name, toml, needles) in &configs {
        let path = write(dir.path(), &format!("{}.toml", name.replace(' ', "-")), toml);
        let out = run_single(&["inspect", "config", path.to_str().unwrap()]);
        let needles: Vec<&str> = needles.to_vec();
        failures.extend(verdict(name, &out, Duration::ZERO, 2, &needles, Reports::Once));
        if text(&out).1.chars().filter(|c| c.is_ascii_digit()).count() > 60 {
            failures.push(format!("{name}: a number printed digit by digit: {}", text(&out).1));
        }
    }
    let config = write(dir.path(), "base.toml", &base);
    let c = config.to_str().unwrap();
    let commands: [(&str, Vec<&str>, Vec<&str>); 5] = [
        (
            "--collective-timeout 1e30",
            vec!["--collective-timeout", "1e30", "inspect", "config"],
            vec!["--collective-timeout", "1e30"],
        ),
        ("plan --gpus 2^32 - 1", vec!["plan", c, "--gpus", "4294967295"], vec!["--gpus 4294967295", "between 1 and"]),
        (
            "plan --seq-len 2^64 - 1",
            vec!["plan", c, "--seq-len", "18446744073709551615"],
            vec!["--seq-len", "between 1 and"],
        ),
        (
            "plan --nodes wrapping the device count",
            vec!["plan", c, "--nodes", "536870913"],
            vec!["cluster.nodes", "devices"],
        ),
        ("train with a data plane this build lacks", vec![], vec![]),
    ];
    for (name, args, needles) in commands.iter().take(4) {
        let out = run_single(args);
        failures.extend(verdict(name, &out, Duration::ZERO, 2, needles, Reports::Once));
    }
    if !cfg!(feature = "cuda") {
        let nccl = write(dir.path(), "nccl.toml", &set("cluster", "data_plane", "\"nccl\""));
        let (run, elapsed) = train(4, &nccl, &dir.path().join("nccl"), 1, &[], &[]);
        failures.extend(verdict(
            commands[4].0,
            &run,
            elapsed,
            2,
            &["data plane `nccl`", "--features cuda"],
            Reports::Once,
        ));
    }
    assert_no_failures(failures, configs.len() + commands.len());
}

/// Mutations of one key each: out-of-range, huge, negative, NaN-like, wrong-typed, missing.
fn mutations(base: &str) -> Vec<(String, String)> {
    let keys: [(&str, &str, &[&str]); 22] = [
        ("job", "steps", &["0", "-1", "4294967296", "1.5"]),
        ("job", "seed", &["-1", "18446744073709551615"]),
        ("job", "collective_timeout_s", &["0.0", "-5.0", "nan", "inf", "1e300"]),
        ("cluster", "nodes", &["0", "4294967295"]),
        ("cluster", "devices_per_node", &["0", "3"]),
        ("cluster", "device_memory_gb", &["0.0", "-1.0", "nan", "1e-9", "1e308"]),
        ("cluster", "device_peak_tflops", &["0.0", "inf"]),
        ("cluster", "intra_node_gbps", &["-1.0"]),
        ("models.actor", "layers", &["0", "64"]),
        ("models.actor", "hidden", &["0", "65"]),
        ("models.actor", "heads", &["0", "3", "64"]),
        ("models.actor", "vocab", &["0", "1", "4294967295"]),
        ("models.critic", "ffn", &["0"]),
        ("rl", "prompts_per_step", &["0", "63"]),
        ("rl", "samples_per_prompt", &["0", "3"]),
        ("rl", "prompt_len", &["0", "2", "2000000"]),
        ("rl", "max_response_len", &["0", "1", "4294967295"]),
        ("rl", "mini_batch", &["0", "7", "128"]),
        ("rl", "micro_batch", &["0", "5"]),
        ("train", "top_p", &["0.0", "1.5", "nan"]),
        ("train", "temperature", &["0.0", "1e-30", "1e30"]),
        ("policy", "memory_headroom", &["-0.1", "0.95"]),
    ];
    let mut out = Vec::new();
    for (section, key, values) in keys {
        for v in values {
            out.push((format!("{section}.{key} = {v}"), set_key(base, section, key, Some(v))));
        }
    }
    out.push(("rl.algorithm = \"grpo\" with a critic".into(), set_key(base, "rl", "algorithm", Some("\"grpo\""))));
    out.push(("models.actor.layers = \"two\"".into(), set_key(base, "models.actor", "layers", Some("\"two\""))));
    out.push(("rl.prompt_len missing".into(), set_key(base, "rl", "prompt_len", None)));
    out.push(("train.clip_ratio = 2.0".into(), set_key(base, "train", "clip_ratio", Some("2.0"))));
    out
}

#[test]
fn every_accepted_config_runs_and_every_refused_one_says_why() {
    let dir = tempfile::tempdir().unwrap();
    let base = set_key(&fast_ppo(), "train", "checkpoint_every", Some("0"));
    let corpus = mutations(&base);
    assert!(corpus.len() >= 40, "{} mutations", corpus.len());
    let (mut failures, mut accepted) = (Vec::new(), 0);
    for (i, (name, toml)) in corpus.iter().enumerate() {
        let path = write(dir.path(), &format!("m{i}.toml"), toml);
        let inspect = run_single(&["inspect", "config", path.to_str().unwrap()]);
        let (_, stderr) = text(&inspect);
        if inspect.status.code() == Some(2) {
            if stderr.contains("panicked") || !stderr.contains("nereus: error") || stderr.lines().count() != 1 {
                failures.push(format!("{name}: refused without a one-line reason: {stderr}"));
            }
            continue;
        }
        if !inspect.status.success() {
            failures.push(format!("{name}: inspect config exited {:?}: {stderr}", inspect.status.code()));
            continue;
        }
        // Accepted: one step must either run, or stop cleanly with a reason (a plan that does
        // not fit, a rollout too big for the ranks) — never panic, hang or die by signal.
        accepted += 1;
        let (run, elapsed) = train(4, &path, &dir.path().join(format!("run{i}")), 1, &[], &[]);
        let (_, stderr) = text(&run);
        let clean = match run.status.code() {
            Some(0) => true,
            Some(1) | Some(2) => stderr.contains("nereus: error"),
            _ => false,
        };
        if !clean || stderr.contains("panicked") || elapsed > FAST + Duration::from_secs(30) {
            failures.push(format!(
                "{name}: accepted, then train exited {:?} after {elapsed:?}: {}",
                run.status.code(),
                stderr.trim()
            ));
        }
    }
    assert!(
        accepted >= 5,
        "only {accepted} mutations were accepted: the corpus no longer tests that accepted configs run"
    );
    assert_no_failures(failures, corpus.len());
}

/// The process id of world rank 0 among mpirun's children.
fn rank0_pid() -> Option<u32> {
    for entry in std::fs::read_dir("/proc").ok()?.flatten() {
        let Ok(pid) = entry.file_name().to_string_lossy().parse::<u32>() else { continue };
        let Ok(env) = std::fs::read(entry.path().join("environ")) else { continue };
        let is_rank0 = env.split(|&b| b == 0).any(|kv| kv == b"OMPI_COMM_WORLD_RANK=0");
        let is_nereus = std::fs::read_link(entry.path().join("exe")).is_ok_and(|exe| exe == common::nereus());
        if is_rank0 && is_nereus && env.split(|&b| b == 0).any(|kv| kv == b"NEREUS_KILL_TRIAL=1") {
            return Some(pid);
        }
    }
    None
}

#[test]
fn kill_9_of_rank_0_during_saves_always_leaves_a_complete_latest_checkpoint() {
    // Ten kills at seeded random points in saves 2-4 (each trial starts a 4-rank run and resumes it).
    const TRIALS: usize = 10;
    let dir = tempfile::tempdir().unwrap();
    let config = write(dir.path(), "base.toml", &fast_ppo());
    let mut draws = Draws(0xC0FFEE);
    let mut failures = Vec::new();
    for trial in 0..TRIALS {
        let out = dir.path().join(format!("trial{trial}"));
        let mut child = common::mpirun()
            .envs([("NEREUS_FAULT_SLOW_SAVE_MS", "15"), ("NEREUS_KILL_TRIAL", "1")])
            .args(["-n", "4"])
            .arg(common::nereus())
            .args(["train", config.to_str().unwrap(), "--steps", "60", "--output-dir", out.to_str().unwrap()])
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .unwrap();
        // Wait for a save after the first complete checkpoint, then kill rank 0 somewhere in it.
        let wanted = 2 + draws.next() % 3;
        let started = std::time::Instant::now();
        while !out.join(format!("checkpoints/step-{wanted}.partial")).exists()
            && started.elapsed() < Duration::from_secs(60)
        {
            std::thread::sleep(Duration::from_millis(2));
        }
        std::thread::sleep(Duration::from_millis(draws.next() % 110));
        match rank0_pid() {
            Some(pid) => drop(std::process::Command::new("kill").args(["-9", &pid.to_string()]).status()),
            None => failures.push(format!("trial {trial}: rank 0 not found")),
        }
        let _ = child.wait();
        let latest = std::fs::read_to_string(out.join("checkpoints/latest")).unwrap_or_default();
        let step: u32 = latest.trim().strip_prefix("step-").and_then(|s| s.parse().ok()).unwrap_or(0);
        let (run, _) = train(4, &config, &out, step + 1, &["--resume", "latest"], &[]);
        if !run.status.success() {
            failures.push(format!(
                "trial {trial} (killed in save {wanted}, latest {latest:?}): resume failed: {}",
                text(&run).1
            ));
        }
    }
    assert_no_failures(failures, TRIALS);
}

#[test]
fn sigterm_checkpoints_the_last_completed_step_and_the_resume_is_bit_identical() {
    let dir = tempfile::tempdir().unwrap();
    let config = write(dir.path(), "base.toml", &set_key(&fast_ppo(), "train", "checkpoint_every", Some("0")));
    let out = dir.path().join("stopped");
    let args = ["train", config.to_str().unwrap(), "--steps", "200", "--output-dir", out.to_str().unwrap()];
    let mut child = spawn_mpi(4, &args, std::process::Stdio::null());
    assert!(wait_for_steps(&out, 3, &mut child, Duration::from_secs(120)), "the run never reached step 3");
    send_signal(child.id(), "-TERM");
    let stopped = child.wait_with_output().unwrap();
    let records = step_records(&out);
    let done = records.len() as u64;
    let latest = std::fs::read_to_string(out.join("checkpoints/latest")).unwrap_or_default();
    assert_eq!(latest.trim(), format!("step-{done}"), "a checkpoint of the last completed step: {}", text(&stopped).1);
    let until = (done + 3) as u32;
    let (resumed, _) = train(4, &config, &out, until, &["--resume", "latest"], &[]);
    assert!(resumed.status.success(), "{}", text(&resumed).1);
    let (whole, _) = train(4, &config, &dir.path().join("whole"), until, &[], &[]);
    assert!(whole.status.success(), "{}", text(&whole).1);
    let (a, b) = (step_records(&out), step_records(&dir.path().join("whole")));
    assert_eq!(a.len(), b.len());
    for (x, y) in a.iter().zip(&b) {
        for key in ["step", "reward_mean", "response_len_mean", "kl", "actor_loss", "critic_loss", "state_digest"] {
            assert_eq!(
                x[key], y[key],
                "{key} differs at step {} between the stopped-and-resumed run and the uninterrupted one",
                x["step"]
            );
        }
    }
}
