//! `nereus train` on a text job: prompts from a JSON-lines file through the shipped tokenizer
//! and chat template, responses decoded and scored by the `math` rule or a scorer command,
//! held-out evaluation, decoded samples, and every bad input named before or at the step it
//! breaks — with the completed steps checkpointed when a scorer fails mid-run.

mod common;

use std::path::{Path, PathBuf};

use common::{run_mpi, run_single, set_key, small_text_job, step_records, text, write};
use serde_json::Value;

/// The shipped text job, small: `steps` steps of 8 prompts × 2 samples on `dir`'s synthesized
/// data (200 training, 16 held-out problems), output under `dir/out`.
fn job(dir: &Path, steps: u32) -> String {
    job_from("tiny-math-grpo.toml", dir, steps)
}

/// The shipped config `name` made small as [`job`] makes the GRPO one.
fn job_from(name: &str, dir: &Path, steps: u32) -> String {
    let data = dir.join("data");
    let out = run_single(&["data", "synth", data.to_str().unwrap(), "--train", "200", "--eval", "16"]);
    assert!(out.status.success(), "{:?}", text(&out));
    small_text_job(name, &data, &dir.join("out"), steps, 8, 5)
}

fn lines(path: &Path) -> Vec<Value> {
    std::fs::read_to_string(path).unwrap().lines().map(|l| serde_json::from_str(l).unwrap()).collect()
}

fn train(n: usize, config: &Path, extra: &[&str]) -> (Option<i32>, String, String) {
    let mut args = vec!["train", config.to_str().unwrap()];
    args.extend_from_slice(extra);
    let out = run_mpi(n, &args);
    let (stdout, stderr) = text(&out);
    (out.status.code(), stdout, stderr)
}

#[test]
fn a_text_job_trains_on_decoded_scored_responses_and_evaluates() {
    let dir = tempfile::tempdir().unwrap();
    let config = write(dir.path(), "job.toml", &job(dir.path(), 3));
    let (code, stdout, stderr) = train(4, &config, &["--set", "train.digest_every=2"]);
    assert_eq!(code, Some(0), "{stdout}{stderr}");
    let out = dir.path().join("out");
    // State digests every 2nd step and after the last.
    let digested: Vec<bool> =
        step_records(&out).iter().map(|r| r["state_digest"]["actor/training"].is_string()).collect();
    assert_eq!(digested, [false, true, true]);
    let evals: Vec<Value> = lines(&out.join("metrics.jsonl")).into_iter().filter(|r| r["event"] == "eval").collect();
    assert_eq!(evals.iter().map(|e| e["step"].as_u64().unwrap()).collect::<Vec<_>>(), [0, 3], "{stdout}");
    assert!(evals
        .iter()
        .all(|e| e["prompts"] == 16 && e["accuracy"].as_f64().is_some_and(|a| (0.0..=1.0).contains(&a))));
    assert!(stdout.contains("eval after step 3: accuracy "), "{stdout}");
    // Two decoded samples per step, each scored as the math rule scores it offline.
    let samples = out.join("samples.jsonl");
    let recorded = lines(&samples);
    assert_eq!(recorded.iter().map(|s| s["step"].as_u64().unwrap()).collect::<Vec<_>>(), [0, 0, 1, 1, 2, 2]);
    assert!(recorded.iter().all(|s| s["prompt"].as_str().unwrap().starts_with("<|im_start|>user\n")));
    let json = dir.path().join("scores.json");
    let offline =
        run_single(&["reward", samples.to_str().unwrap(), "--kind", "math", "--json", json.to_str().unwrap()]);
    assert!(offline.status.success(), "{:?}", text(&offline));
    let scores: Value = serde_json::from_str(&std::fs::read_to_string(json).unwrap()).unwrap();
    for (sample, score) in recorded.iter().zip(scores["scores"].as_array().unwrap()) {
        assert_eq!(sample["reward"].as_f64(), score["reward"].as_f64(), "{sample}");
    }
    // The checkpoint's actor is a model directory with the job's tokenizer: data preview reads
    // it (config.json's vocabulary against the tokenizer, the template, the stop id).
    let actor = out.join("checkpoints/step-3/actor");
    let tokenizer = dir.path().join("data/tokenizer/tokenizer.json");
    assert_eq!(std::fs::read(actor.join("tokenizer.json")).unwrap(), std::fs::read(tokenizer).unwrap());
    let prompts = dir.path().join("data/eval.jsonl");
    let preview =
        run_single(&["data", "preview", prompts.to_str().unwrap(), "--model", actor.to_str().unwrap(), "--count", "1"]);
    let (shown, why) = text(&preview);
    assert!(preview.status.success() && shown.contains("eos ids [2], pad id 0"), "{shown}{why}");
    if let Some(python) = common::reference_python() {
        tensorboard_reads_the_run(&python, &out);
    }
}

/// TensorBoard's own reader finds every step's reward and the evaluations, with the values the
/// JSON lines hold (as f32).
fn tensorboard_reads_the_run(python: &str, out: &Path) {
    let reader = common::repo().join("tests/py/tensorboard_scalars.py");
    let run = std::process::Command::new(python).arg(reader).arg(out.join("tensorboard")).output().unwrap();
    assert!(run.status.success(), "{}", String::from_utf8_lossy(&run.stderr));
    let scalars: Value = serde_json::from_slice(&run.stdout).unwrap();
    let series = |tag: &str| -> Vec<(u64, f64)> {
        let points = scalars[tag].as_array().unwrap_or_else(|| panic!("no scalar `{tag}`"));
        points.iter().map(|p| (p[0].as_u64().unwrap(), p[1].as_f64().unwrap())).collect()
    };
    let as_f32 = |x: f64| f64::from(x as f32);
    let records = step_records(out);
    let want: Vec<(u64, f64)> =
        records.iter().map(|r| (r["step"].as_u64().unwrap(), as_f32(r["reward_mean"].as_f64().unwrap()))).collect();
    assert_eq!(series("reward_mean"), want);
    assert_eq!(series("step_seconds").len(), 3);
    assert!(series("op_seconds/measured/generation/attention").len() == 3, "{scalars}");
    let evals: Vec<Value> = lines(&out.join("metrics.jsonl")).into_iter().filter(|r| r["event"] == "eval").collect();
    let want: Vec<(u64, f64)> =
        evals.iter().map(|e| (e["step"].as_u64().unwrap(), as_f32(e["accuracy"].as_f64().unwrap()))).collect();
    assert_eq!(series("eval/accuracy"), want);
}

#[test]
fn the_same_prompts_follow_a_resume_under_another_layout() {
    let dir = tempfile::tempdir().unwrap();
    let straight = write(dir.path(), "straight.toml", &job(dir.path(), 4));
    let (code, _, stderr) = train(4, &straight, &[]);
    assert_eq!(code, Some(0), "{stderr}");
    let first: Vec<Value> = lines(&dir.path().join("out/samples.jsonl"));
    // Two steps on 4 ranks, then the rest on 2 ranks (another plan) from the checkpoint.
    let split_dir = dir.path().join("split");
    std::fs::create_dir_all(&split_dir).unwrap();
    let mut toml = job(&split_dir, 4);
    toml = set_key(&toml, "train", "checkpoint_every", Some("2"));
    // The split run reads the same prompts from a verl-style Parquet file (the answer under
    // `reward_model.ground_truth`), so it also shows Parquet rows read as their JSON lines.
    if let Some(python) = common::reference_python() {
        for split in ["train", "eval"] {
            let rows: Vec<Value> = lines(&split_dir.join(format!("data/{split}.jsonl")))
                .into_iter()
                .map(|r| {
                    serde_json::json!({"prompt": r["prompt"], "solution": r["solution"],
                                       "reward_model": {"ground_truth": r["answer"]}})
                })
                .collect();
            let parquet = split_dir.join(format!("data/{split}.parquet"));
            common::write_parquet(&python, &parquet, &rows, "snappy");
            toml = set_key(&toml, "data", split, Some(&format!("{parquet:?}")));
        }
        toml = set_key(&toml, "data", "answer_key", Some("\"reward_model.ground_truth\""));
    }
    let split = write(&split_dir, "split.toml", &toml);
    let (code, _, stderr) = train(4, &split, &["--steps", "2"]);
    assert_eq!(code, Some(0), "{stderr}");
    let two_ranks = set_key(&toml, "cluster", "devices_per_node", Some("2"));
    let resumed = write(&split_dir, "resumed.toml", &two_ranks);
    let (code, stdout, stderr) = train(2, &resumed, &["--resume", "latest"]);
    assert_eq!(code, Some(0), "{stdout}{stderr}");
    let second: Vec<Value> = lines(&split_dir.join("out/samples.jsonl"));
    let prompts = |v: &[Value], step: u64| {
        v.iter()
            .filter(|s| s["step"] == step)
            .map(|s| (s["prompt"].to_string(), s["answer"].to_string()))
            .collect::<Vec<_>>()
    };
    for step in 0..4 {
        assert_eq!(prompts(&first, step), prompts(&second, step), "step {step}");
    }
    assert_ne!(prompts(&first, 2), prompts(&first, 3), "steps read different prompts");
}

/// A scorer that answers `{"reward": 1}` until its `limit`-th line, then misbehaves as `how`.
fn scorer(dir: &Path, how: &str, limit: usize) -> PathBuf {
    let body = match how {
        "crash" => "raise SystemExit('scorer: out of budget')",
        "hang" => "time.sleep(60)",
        _ => "print('not json', flush=True); continue",
    };
    let script = format!(
        "import json, sys, time\nn = 0\nfor line in sys.stdin:\n    json.loads(line)\n    n += 1\n    if n > {limit}:\n        {body}\n    print(json.dumps({{'reward': 1.0}}), flush=True)\n"
    );
    write(dir, &format!("score-{how}.py"), &script)
}

#[test]
fn a_failing_scorer_stops_the_job_after_checkpointing_or_scores_zero() {
    for how in ["crash", "hang", "garbage"] {
        let dir = tempfile::tempdir().unwrap();
        let script = scorer(dir.path(), how, 40); // 16 responses per step: fails in step 2
        let mut toml = job(dir.path(), 4);
        toml = set_key(&toml, "reward", "kind", Some("\"command\""));
        toml = set_key(&toml, "reward", "command", Some(&format!("[\"python3\", {:?}]", script)));
        toml = set_key(&toml, "reward", "timeout_s", Some("2.0"));
        toml = set_key(&toml, "data", "eval", None); // evaluation would feed the scorer too
        let config = write(dir.path(), "job.toml", &toml);
        let started = std::time::Instant::now();
        let (code, stdout, stderr) = train(4, &config, &[]);
        assert_eq!(code, Some(1), "{how}: {stdout}{stderr}");
        assert!(stderr.contains("step 2: the reward failed: reward command `python3 "), "{how}: {stderr}");
        assert!(stderr.contains("line 9 of the batch"), "{how}: {stderr}");
        assert!(stderr.contains("the 2 completed steps are checkpointed"), "{how}: {stderr}");
        assert!(dir.path().join("out/checkpoints/step-2").is_dir(), "{how}");
        assert_eq!(step_records(&dir.path().join("out")).len(), 2, "{how}");
        assert!(started.elapsed().as_secs() < 60, "{how} took {:?}", started.elapsed());

        let zero = write(dir.path(), "zero.toml", &set_key(&toml, "reward", "on_error", Some("\"zero\"")));
        std::fs::remove_dir_all(dir.path().join("out")).unwrap();
        let (code, stdout, stderr) = train(4, &zero, &["--steps", "3"]);
        assert_eq!(code, Some(0), "{how}: {stdout}{stderr}");
        let records = step_records(&dir.path().join("out"));
        let failures: Vec<u64> = records.iter().map(|r| r["reward_failures"].as_u64().unwrap_or(0)).collect();
        match how {
            // A dead or hung scorer is started again and fails again after 40 more lines.
            "garbage" => assert_eq!(failures, [0, 0, 8], "{stdout}"),
            _ => assert!(failures[2] >= 1 && failures[..2] == [0, 0], "{how}: {failures:?}"),
        }
    }
}

/// The same failures in asynchronous mode, where only the scoring ranks (rank 0's side of the
/// split) see them: every rank still stops at the failing step with the synchronous message
/// and checkpoint, in seconds (not by the 120 s collective watchdog), and the checkpoint
/// resumes once the scorer is fixed.
#[test]
fn a_failing_scorer_stops_an_async_job_as_it_stops_a_synchronous_one() {
    for how in ["crash", "hang", "garbage"] {
        let dir = tempfile::tempdir().unwrap();
        let script = scorer(dir.path(), how, 40); // 16 responses scored per step: fails in step 2
        let mut toml = job_from("tiny-math-grpo-async.toml", dir.path(), 4);
        toml = set_key(&toml, "reward", "kind", Some("\"command\""));
        toml = set_key(&toml, "reward", "command", Some(&format!("[\"python3\", {:?}]", script)));
        toml = set_key(&toml, "reward", "timeout_s", Some("2.0"));
        toml = set_key(&toml, "data", "eval", None);
        let config = write(dir.path(), "job.toml", &toml);
        let started = std::time::Instant::now();
        let (code, stdout, stderr) = train(4, &config, &[]);
        let took = started.elapsed();
        assert_eq!(code, Some(1), "{how}: {stdout}{stderr}");
        assert!(stderr.contains("step 2: the reward failed: reward command `python3 "), "{how}: {stderr}");
        assert!(stderr.contains("line 9 of the batch"), "{how}: {stderr}");
        assert!(stderr.contains("the 2 completed steps are checkpointed"), "{how}: {stderr}");
        assert!(!stderr.contains("panicked"), "{how}: {stderr}");
        let out = dir.path().join("out");
        let latest = std::fs::read_to_string(out.join("checkpoints/latest")).unwrap();
        assert_eq!(latest.trim(), "step-2", "{how}");
        assert_eq!(step_records(&out).len(), 2, "{how}");
        assert!(took.as_secs() < 60, "{how} took {took:?}");
        if how != "crash" {
            continue;
        }
        // The checkpoint is whole: with the scorer fixed, the job resumes and finishes.
        scorer(dir.path(), how, 1_000);
        let (code, stdout, stderr) = train(4, &config, &["--resume", "latest"]);
        assert_eq!(code, Some(0), "{stdout}{stderr}");
        let steps: Vec<u64> = step_records(&out).iter().map(|r| r["step"].as_u64().unwrap()).collect();
        assert_eq!(steps, [0, 1, 2, 3]);
    }
}

#[test]
fn bad_data_is_named_before_the_first_step() {
    let dir = tempfile::tempdir().unwrap();
    let base = job(dir.path(), 1);
    let broken = write(
        dir.path(),
        "broken.jsonl",
        "{\"prompt\": \"What is 1 + 1?\", \"answer\": \"2\", \"solution\": \"2\"}\n{\"prompt\": \n",
    );
    let no_answer = write(dir.path(), "no-answer.jsonl", "{\"prompt\": \"What is 1 + 1?\", \"solution\": \"2\"}\n");
    let long = "What is 1 + 1? ".repeat(20);
    let too_long = write(
        dir.path(),
        "long.jsonl",
        &format!("{{\"prompt\": \"{long}\", \"answer\": \"2\", \"solution\": \"2\"}}\n"),
    );
    let cases: Vec<(String, &str)> = vec![
        (set_key(&base, "data", "train", Some(&format!("{broken:?}"))), "broken.jsonl:2: not JSON"),
        (set_key(&base, "data", "train", Some(&format!("{no_answer:?}"))), "no-answer.jsonl:1: no field `answer`"),
        (
            set_key(&base, "data", "train", Some(&format!("{too_long:?}"))),
            "long.jsonl:1: every prompt is longer than rl.prompt_len = 32 tokens",
        ),
        (
            set_key(
                &set_key(&base, "data", "train", Some(&format!("{too_long:?}"))),
                "data",
                "too_long",
                Some("\"error\""),
            ),
            "long.jsonl:1: the prompt is",
        ),
        (
            set_key(&set_key(&base, "models.actor", "vocab", Some("300")), "models.reference", "vocab", Some("300")),
            "the tokenizer's vocabulary (384 ids, up to id 383) does not fit the model's embedding (300 rows)",
        ),
        (set_key(&base, "data", "tokenizer", Some("\"/nonexistent\"")), "/nonexistent/tokenizer.json"),
        (set_key(&base, "train", "warmup_reward_steps", Some("10")), "train.warmup_reward_steps"),
    ];
    for (k, (toml, needle)) in cases.iter().enumerate() {
        let config = write(dir.path(), &format!("bad-{k}.toml"), toml);
        let (code, stdout, stderr) = train(4, &config, &[]);
        assert_eq!(code, Some(2), "{needle}: {stdout}{stderr}");
        assert!(stderr.contains(needle), "wanted `{needle}` in: {stderr}");
        assert!(!stderr.contains("panicked"), "{stderr}");
    }
}

#[test]
fn a_scorer_failing_on_the_held_out_prompts_stops_the_job_as_a_step_would() {
    let dir = tempfile::tempdir().unwrap();
    // The evaluation before step 0 takes 4 lines, steps 0 and 1 take 16 each: the 38th line is
    // the 2nd of the evaluation after step 2.
    let script = scorer(dir.path(), "crash", 37);
    let mut toml = job(dir.path(), 2);
    toml = set_key(&toml, "reward", "kind", Some("\"command\""));
    toml = set_key(&toml, "reward", "command", Some(&format!("[\"python3\", {:?}]", script)));
    toml = set_key(&toml, "data", "eval_every", Some("2"));
    toml = set_key(&toml, "data", "eval_count", Some("4"));
    let config = write(dir.path(), "job.toml", &toml);
    let (code, stdout, stderr) = train(4, &config, &[]);
    assert_eq!(code, Some(1), "{stdout}{stderr}");
    assert!(
        stderr.contains("step 2: the reward failed: evaluating the held-out prompts: reward command `python3 "),
        "{stderr}"
    );
    assert!(stderr.contains("the 2 completed steps are checkpointed"), "{stderr}");
    assert!(dir.path().join("out/checkpoints/step-2").is_dir());
    assert_eq!(step_records(&dir.path().join("out")).len(), 2);
}

/// `[[reward.terms]]` (given with `--set`) sums weighted terms: each decoded sample's reward is
/// 2 × the math rule's (as `nereus reward` scores it offline) + 0.5 × a scorer's (the
/// response's length in characters). The math term's verdicts travel from the scorer's rank to
/// every rank, so the evaluation still reports accuracy; with top-p so small that sampling keeps
/// only the most likely token, pass@2's answers are the greedy ones and pass@2 equals accuracy.
#[test]
fn weighted_reward_terms_sum_and_pass_at_k_counts_solved_prompts() {
    let dir = tempfile::tempdir().unwrap();
    let script = write(
        dir.path(),
        "length.py",
        "import json, sys\nfor line in sys.stdin:\n    r = json.loads(line)['response']\n    print(json.dumps({'reward': len(r)}), flush=True)\n",
    );
    let mut toml = job(dir.path(), 2);
    toml = set_key(&toml, "reward", "kind", None);
    toml = set_key(&toml, "reward", "command", Some(&format!("[\"python3\", {:?}]", script)));
    toml = set_key(&toml, "data", "pass_k", Some("2"));
    toml = set_key(&toml, "train", "top_p", Some("1e-9"));
    let config = write(dir.path(), "job.toml", &toml);
    let terms = "reward.terms=[{kind = \"math\", weight = 2.0}, {kind = \"command\", weight = 0.5}]";
    let (code, stdout, stderr) = train(4, &config, &["--set", terms]);
    assert_eq!(code, Some(0), "{stdout}{stderr}");
    let out = dir.path().join("out");
    let samples = out.join("samples.jsonl");
    let json = dir.path().join("scores.json");
    let offline =
        run_single(&["reward", samples.to_str().unwrap(), "--kind", "math", "--json", json.to_str().unwrap()]);
    assert!(offline.status.success(), "{:?}", text(&offline));
    let scores: Value = serde_json::from_str(&std::fs::read_to_string(json).unwrap()).unwrap();
    let recorded = lines(&samples);
    assert_eq!(recorded.len(), 4);
    for (sample, score) in recorded.iter().zip(scores["scores"].as_array().unwrap()) {
        let length = sample["response"].as_str().unwrap().chars().count() as f64;
        let want = 2.0 * score["reward"].as_f64().unwrap() + 0.5 * length;
        assert!((sample["reward"].as_f64().unwrap() - want).abs() < 1e-4, "{sample} against {want}");
    }
    let evals: Vec<Value> = lines(&out.join("metrics.jsonl")).into_iter().filter(|r| r["event"] == "eval").collect();
    assert_eq!(evals.len(), 2, "{stdout}");
    for e in &evals {
        assert_eq!(e["pass_k"], 2, "{e}");
        assert_eq!(e["pass_at_k"].as_f64(), e["accuracy"].as_f64(), "{e}");
    }
    assert!(stdout.contains("eval after step 2: accuracy ") && stdout.contains("pass@2 "), "{stdout}");
}

/// The shipped DAPO job, small, scored by the parity of the response's length (so that some
/// groups of 2 have equal rewards and some do not): every group it trains on has unequal
/// rewards, the rounds it sampled advance the data position, and a resume from the first
/// step's checkpoint takes the same prompts and rounds as the straight run.
#[test]
fn dapo_trains_on_unequal_groups_only_and_resumes_where_its_rounds_left_off() {
    let dir = tempfile::tempdir().unwrap();
    let parity = write(
        dir.path(),
        "parity.py",
        "import json, sys\nfor line in sys.stdin:\n    r = json.loads(line)['response']\n    print(json.dumps({'reward': len(r) % 2}), flush=True)\n",
    );
    let mut toml = job_from("tiny-math-dapo.toml", dir.path(), 2);
    toml = set_key(&toml, "reward", "kind", Some("\"command\""));
    toml = set_key(&toml, "reward", "command", Some(&format!("[\"python3\", {:?}]", parity)));
    toml = set_key(&toml, "data", "eval", None);
    toml = set_key(&toml, "train", "checkpoint_every", Some("1"));
    let config = write(dir.path(), "job.toml", &toml);
    let (code, stdout, stderr) = train(4, &config, &[]);
    assert_eq!(code, Some(0), "{stdout}{stderr}");
    let out = dir.path().join("out");
    let records = step_records(&out);
    let rounds: Vec<u64> = records.iter().map(|r| r["sampling_rounds"].as_u64().unwrap()).collect();
    let dropped: Vec<u64> = records.iter().map(|r| r["dropped_groups"].as_u64().unwrap_or(0)).collect();
    // A step that needed one round dropped nothing; one that needed more dropped some of the
    // first round's groups, and at most every group of every round.
    for (r, d) in rounds.iter().zip(&dropped) {
        assert!((1..=10).contains(r) && *d <= 8 * r && (*r == 1) == (*d == 0), "{rounds:?} {dropped:?}");
    }
    assert!(dropped.iter().sum::<u64>() > 0, "length parity leaves some groups equal: {dropped:?}");
    let samples = lines(&out.join("samples.jsonl"));
    assert_eq!(samples.len(), 4, "{samples:?}");
    for pair in samples.chunks(2) {
        assert_eq!(pair[0]["prompt"], pair[1]["prompt"], "a group is one prompt's");
        assert_ne!(pair[0]["reward"], pair[1]["reward"], "a kept group has unequal rewards: {pair:?}");
    }
    let position = |step: u64| -> Option<u64> {
        let sidecar = std::fs::read_to_string(out.join(format!("checkpoints/step-{step}/state.json"))).unwrap();
        serde_json::from_str::<Value>(&sidecar).unwrap()["data_position"].as_u64()
    };
    assert_eq!((position(1), position(2)), (Some(8 * rounds[0]), Some(8 * (rounds[0] + rounds[1]))));

    let again = dir.path().join("again");
    let step_1 = out.join("checkpoints/step-1");
    let (code, stdout, stderr) =
        train(4, &config, &["--resume", step_1.to_str().unwrap(), "--output-dir", again.to_str().unwrap()]);
    assert_eq!(code, Some(0), "{stdout}{stderr}");
    let resumed = step_records(&again);
    assert_eq!(resumed.iter().map(|r| r["sampling_rounds"].as_u64().unwrap()).collect::<Vec<_>>(), rounds[1..]);
    let prompts = |v: &[Value]| v.iter().map(|s| s["prompt"].to_string()).collect::<Vec<_>>();
    assert_eq!(prompts(&lines(&again.join("samples.jsonl"))), prompts(&samples[2..]));
}

/// A scorer that gives every response the same reward leaves no group to train on: the step
/// stops after `rl.max_sampling_rounds` rounds, naming the keys to change.
#[test]
fn dapo_says_which_keys_to_change_when_sampling_rounds_run_out() {
    let dir = tempfile::tempdir().unwrap();
    let same = scorer(dir.path(), "garbage", 1 << 20); // 1.0 for every response
    let mut toml = job_from("tiny-math-dapo.toml", dir.path(), 2);
    toml = set_key(&toml, "reward", "kind", Some("\"command\""));
    toml = set_key(&toml, "reward", "command", Some(&format!("[\"python3\", {:?}]", same)));
    toml = set_key(&toml, "data", "eval", None);
    toml = set_key(&toml, "rl", "max_sampling_rounds", Some("2"));
    let config = write(dir.path(), "job.toml", &toml);
    let (code, stdout, stderr) = train(4, &config, &[]);
    assert_eq!(code, Some(1), "{stdout}{stderr}");
    assert!(
        stderr.contains("step 0: dynamic sampling kept 0 of 8 groups")
            && stderr.contains("raise rl.max_sampling_rounds (2), or set rl.dynamic_sampling = false"),
        "{stderr}"
    );
}
