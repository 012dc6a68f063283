//! Bad job configs: each must exit with status 2 and a one-paragraph message naming the key.

mod common;

use common::{drop_section, run_single, set_key, shipped, text, write};

/// One broken config: how it is broken, and what the message must name.
struct Case {
    name: &'static str,
    toml: String,
    /// Substrings the error message must contain (the key, and the reason).
    expect: &'static [&'static str],
}

fn cases() -> Vec<Case> {
    let ppo = shipped("tiny-ppo.toml");
    let grpo = shipped("tiny-grpo.toml");
    let math = shipped("tiny-math-grpo.toml");
    let reward = |lines: &str| math.replace("[reward]\nkind = \"math\"\n", &format!("[reward]\n{lines}\n"));
    let set = |section: &str, key: &str, value: &str| set_key(&ppo, section, key, Some(value));
    // The broken header's position, counted in the shipped file (1-based line, column after "[rl").
    let rl_line = ppo.lines().position(|l| l == "[rl]").expect("tiny-ppo has [rl]") + 1;
    let syntax_at: &'static str = Box::leak(format!("line {rl_line}, column 4").into_boxed_str());
    vec![
        Case {
            name: "toml syntax error",
            toml: ppo.replace("[rl]", "[rl"),
            expect: Box::leak(Box::new([syntax_at, "invalid table header"])),
        },
        Case {
            name: "unknown key",
            toml: ppo.replace("steps = 100", "stepz = 100"),
            expect: &["job.stepz", "unknown field `stepz`"],
        },
        Case {
            name: "unknown section",
            toml: format!("{ppo}\n[training]\nlr = 1e-5\n"),
            expect: &["unknown field `training`"],
        },
        Case {
            name: "wrong type",
            toml: set("job", "steps", "\"many\""),
            expect: &["job.steps", "invalid type: string \"many\""],
        },
        Case {
            name: "negative layers",
            toml: set("models.actor", "layers", "-2"),
            expect: &["models.actor.layers", "integer `-2`"],
        },
        Case {
            name: "zero layers",
            toml: set("models.actor", "layers", "0"),
            expect: &["`models.actor.layers` = 0", "at least 1"],
        },
        Case {
            name: "heads do not divide hidden",
            toml: set("models.critic", "heads", "5"),
            expect: &["`models.critic.heads` = 5", "must divide models.critic.hidden (64)"],
        },
        Case {
            name: "kv_heads do not divide heads",
            toml: set("models.reward", "kv_heads", "3"),
            expect: &["`models.reward.kv_heads` = 3", "must divide models.reward.heads (4)"],
        },
        Case {
            name: "odd head dimension",
            toml: set_key(&set("models.actor", "hidden", "48"), "models.actor", "heads", Some("16")),
            expect: &["models.actor.heads", "odd head dimension 48 / 16 = 3"],
        },
        Case {
            name: "zero device memory",
            toml: set("cluster", "device_memory_gb", "0.0"),
            expect: &["`cluster.device_memory_gb` = 0", "greater than 0"],
        },
        Case {
            name: "negative device memory",
            toml: set("cluster", "device_memory_gb", "-16.0"),
            expect: &["`cluster.device_memory_gb` = -16", "greater than 0"],
        },
        Case {
            name: "unknown algorithm",
            toml: set("rl", "algorithm", "\"dpo\""),
            expect: &["rl.algorithm", "unknown variant `dpo`", "`ppo`, `grpo`, `remax`"],
        },
        Case {
            name: "unknown model role",
            toml: ppo.replace("[models.critic]", "[models.critik]"),
            expect: &["models.critik", "unknown field `critik`"],
        },
        Case {
            name: "mini-batch does not divide the batch",
            toml: set("rl", "mini_batch", "12"),
            expect: &["`rl.mini_batch` = 12", "must divide prompts_per_step * samples_per_prompt (64)"],
        },
        Case {
            name: "micro-batch does not divide the mini-batch",
            toml: set("rl", "micro_batch", "5"),
            expect: &["`rl.micro_batch` = 5", "must divide rl.mini_batch (32)"],
        },
        Case {
            name: "grpo with one sample per prompt",
            toml: set_key(&grpo, "rl", "samples_per_prompt", Some("1")),
            expect: &["`rl.samples_per_prompt` = 1", "at least 2"],
        },
        Case {
            name: "ppo without critic",
            toml: drop_section(&ppo, "models.critic"),
            expect: &["`models.critic`", "trains a value model"],
        },
        Case {
            name: "grpo with critic",
            toml: set("rl", "algorithm", "\"grpo\"").replace("samples_per_prompt = 1", "samples_per_prompt = 2"),
            expect: &["`models.critic`", "has no critic"],
        },
        Case {
            name: "missing cluster key",
            toml: set_key(&ppo, "cluster", "nodes", None),
            expect: &["`cluster.nodes`", "missing value", "detect = true"],
        },
        Case {
            name: "unknown data plane",
            toml: set("cluster", "data_plane", "\"gloo\""),
            expect: &["cluster.data_plane", "unknown variant `gloo`"],
        },
        Case {
            name: "gamma out of range",
            toml: set("policy", "gamma", "1.5"),
            expect: &["`policy.gamma` = 1.5", "[0, 1]"],
        },
        Case {
            name: "memory headroom out of range",
            toml: set("policy", "memory_headroom", "0.95"),
            expect: &["`policy.memory_headroom` = 0.95", "[0, 0.9]"],
        },
        Case {
            name: "plan error out of range",
            toml: set("policy", "plan_error", "-0.1"),
            expect: &["`policy.plan_error` = -0.1", "[0, 1]"],
        },
        Case {
            name: "job name with a space",
            toml: set("job", "name", "\"my job\""),
            expect: &["`job.name` = \"my job\"", "letters, digits"],
        },
        Case {
            name: "zero collective timeout",
            toml: set("job", "collective_timeout_s", "0.0"),
            expect: &["`job.collective_timeout_s` = 0", "[0.1, 604800]"],
        },
        Case { name: "missing rl section", toml: drop_section(&ppo, "rl"), expect: &["missing field `rl`"] },
        Case {
            name: "reference vocab differs from actor",
            toml: set("models.reference", "vocab", "64"),
            expect: &["`models.reference.vocab` = 64", "must equal models.actor.vocab (32)"],
        },
        Case { name: "top-p above one", toml: set("train", "top_p", "1.5"), expect: &["`train.top_p` = 1.5"] },
        Case {
            name: "unknown key in [train]",
            toml: set("train", "learning_rate", "1e-3"),
            expect: &["train.learning_rate", "unknown field `learning_rate`"],
        },
        Case {
            name: "plan names no model-stage",
            toml: format!("{ppo}\n[plan.\"actor/decoding\"]\ntp = 1\npp = 1\ndp = 1\nranks = [0]\n"),
            expect: &["plan.\"actor/decoding\"", "not a model-stage"],
        },
        Case {
            name: "plan rank count",
            toml: format!("{ppo}\n[plan.\"actor/training\"]\ntp = 2\npp = 1\ndp = 2\nranks = [0, 1, 2]\n"),
            expect: &["plan.\"actor/training\".ranks", "needs dp·tp·pp = 4 ranks"],
        },
        Case {
            name: "ReMax with a model-scored reward",
            toml: set("rl", "algorithm", "\"remax\"").replace("[train]", "[train]\nreward = \"model\""),
            expect: &["`train.reward` = model", "greedy baseline"],
        },
        Case {
            name: "a reward kind and terms",
            toml: reward("kind = \"math\"\nterms = [{kind = \"exact\"}]"),
            expect: &["`reward.kind` = math", "either one kind or weighted [[reward.terms]]"],
        },
        Case {
            name: "two scorer terms",
            toml: reward("command = [\"s\"]\nterms = [{kind = \"command\"}, {kind = \"math\"}, {kind = \"command\"}]"),
            expect: &["`reward.terms[2].kind` = command", "one job runs one scorer"],
        },
        Case {
            name: "pass@k without a rule",
            toml: set_key(&reward("command = [\"s\"]\nterms = [{kind = \"command\"}]"), "data", "pass_k", Some("4")),
            expect: &["`data.pass_k` = 4", "only a rule (math, exact)"],
        },
        Case {
            name: "a reward-model term under ReMax",
            toml: set_key(
                &reward("terms = [{kind = \"math\"}, {kind = \"model\", weight = 0.5}]"),
                "rl",
                "algorithm",
                Some("\"remax\""),
            ),
            expect: &["`reward.terms` = model", "greedy baseline"],
        },
        Case {
            name: "clip_low above clip_high",
            toml: set("train", "clip_low", "0.3"),
            expect: &["`train.clip_low` = 0.3", "train.clip_high (0.2)"],
        },
        Case {
            name: "unknown KL estimator",
            toml: set("rl", "kl_estimator", "\"k4\""),
            expect: &["rl.kl_estimator", "unknown variant `k4`", "low-var-kl"],
        },
        Case {
            name: "dynamic sampling with one sample per prompt",
            toml: set("rl", "dynamic_sampling", "true"),
            expect: &["`rl.dynamic_sampling` = true", "rl.samples_per_prompt = 1"],
        },
        Case {
            name: "max_staleness in synchronous mode",
            toml: set("rl", "max_staleness", "2"),
            expect: &["`rl.max_staleness` = 2", "rl.mode = \"async\"", "rl.mode is \"sync\""],
        },
        Case {
            name: "max_staleness 0 in asynchronous mode",
            toml: set_key(&set("rl", "mode", "\"async\""), "rl", "max_staleness", Some("0")),
            expect: &["`rl.max_staleness` = 0", "between 1 and 64", "rl.mode = \"sync\""],
        },
        Case {
            name: "behaviour_weight_cap in synchronous mode",
            toml: set("rl", "behaviour_weight_cap", "3.0"),
            expect: &["`rl.behaviour_weight_cap` = 3", "rl.mode = \"async\"", "every rollout is on-policy"],
        },
        Case {
            name: "behaviour_weight_cap below 1 in asynchronous mode",
            toml: set_key(&set("rl", "mode", "\"async\""), "rl", "behaviour_weight_cap", Some("0.5")),
            expect: &["`rl.behaviour_weight_cap` = 0.5", "at least 1"],
        },
        Case {
            name: "DAPO's dynamic sampling in asynchronous mode",
            toml: set_key(&set_key(&grpo, "rl", "mode", Some("\"async\"")), "rl", "algorithm", Some("\"dapo\"")),
            expect: &["`rl.dynamic_sampling` = true", "asynchronous mode keeps apart", "rl.mode = \"sync\""],
        },
        Case {
            name: "asynchronous fixed plan generating on rank 0",
            toml: format!(
                "{}{}",
                set_key(&grpo, "rl", "mode", Some("\"async\"")),
                [
                    ("actor/generation", "dp = 2", "[0, 1]"),
                    ("actor/training", "dp = 2", "[2, 3]"),
                    ("reference/inference", "dp = 2", "[4, 5]"),
                    ("reward/inference", "dp = 2", "[6, 7]"),
                ]
                .map(|(ms, dp, ranks)| format!("\n[plan.\"{ms}\"]\ntp = 1\npp = 1\n{dp}\nranks = {ranks}\n"))
                .concat()
            ),
            expect: &[
                "`plan.\"actor/generation\".ranks` = [0, 1]",
                "actor/generation",
                "rank 0",
                "rl.mode = \"async\"",
            ],
        },
        Case {
            name: "unknown RL mode",
            toml: set("rl", "mode", "\"overlapped\""),
            expect: &["rl.mode", "unknown variant `overlapped`", "sync", "async"],
        },
        Case {
            name: "RLOO with one sample per prompt",
            toml: set("rl", "algorithm", "\"rloo\""),
            expect: &["`rl.samples_per_prompt` = 1", "`rloo` takes its baseline"],
        },
        Case {
            name: "overlong buffer past the length cap",
            toml: set("rl", "overlong_buffer", "100"),
            expect: &["`rl.overlong_buffer` = 100", "rl.max_response_len (24)"],
        },
        Case {
            name: "job name `..` (a path component that climbs)",
            toml: set("job", "name", "\"..\""),
            expect: &["`job.name` = \"..\"", "one file-name component"],
        },
        Case {
            name: "job name hidden",
            toml: set("job", "name", "\".run\""),
            expect: &["`job.name` = \".run\"", "not starting with `.`"],
        },
        Case {
            name: "device memory past any device",
            toml: set("cluster", "device_memory_gb", "1e300"),
            expect: &["`cluster.device_memory_gb` = 1e300", "at most 65536"],
        },
        Case {
            name: "scorer timeout past a week",
            toml: reward("kind = \"command\"\ncommand = [\"true\"]\ntimeout_s = 1e300"),
            expect: &["`reward.timeout_s` = 1e300", "[0.001, 604800]"],
        },
        Case {
            name: "included cluster file missing",
            toml: format!("{}\n[cluster]\ninclude = \"clusters/nope.toml\"\n", drop_section(&ppo, "cluster")),
            expect: &["cannot read config file", "clusters/nope.toml"],
        },
    ]
}

#[test]
fn every_bad_config_exits_2_with_a_one_paragraph_message_naming_the_key() {
    let dir = tempfile::tempdir().unwrap();
    let cases = cases();
    assert!(cases.len() >= 15);
    let mut failures = Vec::new();
    for (i, case) in cases.iter().enumerate() {
        let path = write(dir.path(), &format!("case{i}.toml"), &case.toml);
        let out = run_single(&["inspect", "config", path.to_str().unwrap()]);
        let (stdout, stderr) = text(&out);
        let message = stderr.trim();
        let problems: Vec<String> = [
            (out.status.code() != Some(2)).then(|| format!("exit status {:?}, want 2", out.status.code())),
            (!stdout.is_empty()).then(|| "printed a config on stdout".to_string()),
            (message.lines().count() != 1).then(|| "message is not one paragraph".to_string()),
            message.contains("panicked").then(|| "panicked".to_string()),
        ]
        .into_iter()
        .flatten()
        .chain(case.expect.iter().filter(|e| !message.contains(*e)).map(|e| format!("message lacks {e:?}")))
        .collect();
        if !problems.is_empty() {
            failures.push(format!("{}: {}\n    stderr: {message}", case.name, problems.join("; ")));
        }
    }
    assert!(
        failures.is_empty(),
        "{} of {} bad configs misreported:\n{}",
        failures.len(),
        cases.len(),
        failures.join("\n")
    );
}

#[test]
fn a_missing_file_is_named() {
    let out = run_single(&["inspect", "config", "configs/does-not-exist.toml"]);
    let (_, stderr) = text(&out);
    assert_eq!(out.status.code(), Some(2));
    assert!(stderr.contains("cannot read config file `configs/does-not-exist.toml`"), "{stderr}");
}

#[test]
fn usage_errors_exit_2() {
    let out = run_single(&["inspect", "config", "--algorithm", "dpo"]);
    assert_eq!(out.status.code(), Some(2));
    let stderr = text(&out).1;
    assert!(stderr.contains("invalid value 'dpo' for '--algorithm") && stderr.contains("ppo, grpo, remax"), "{stderr}");
    let out = run_single(&["--collective-timeout", "-1", "inspect", "topology"]);
    assert_eq!(out.status.code(), Some(2));
}

#[test]
fn inspect_config_shows_the_rl_mode_and_staleness_with_their_source() {
    let dir = tempfile::tempdir().unwrap();
    let config = write(dir.path(), "job.toml", &shipped("tiny-grpo.toml"));
    let c = config.to_str().unwrap();
    let sync = text(&run_single(&["inspect", "config", c])).0;
    assert!(sync.contains("mode = \"sync\"  # default"), "{sync}");
    assert!(!sync.contains("max_staleness") && !sync.contains("behaviour_weight_cap"), "{sync}");
    let out = run_single(&["inspect", "config", c, "--set", "rl.mode=\"async\""]);
    let (stdout, stderr) = text(&out);
    assert_eq!(out.status.code(), Some(0), "{stderr}");
    for line in ["mode = \"async\"  # --set", "max_staleness = 1  # default", "behaviour_weight_cap = 5.0  # default"] {
        assert!(stdout.contains(line), "`{line}` missing:\n{stdout}");
    }
    let asynchronous = write(dir.path(), "async.toml", &shipped("tiny-math-grpo-async.toml"));
    let stdout = text(&run_single(&["inspect", "config", asynchronous.to_str().unwrap()])).0;
    for line in ["mode = \"async\"  # job file", "max_staleness = 1  # job file"] {
        assert!(stdout.contains(line), "`{line}` missing:\n{stdout}");
    }
}

#[test]
fn set_flags_reach_every_key_typed_as_the_file() {
    let dir = tempfile::tempdir().unwrap();
    let config = write(dir.path(), "job.toml", &shipped("tiny-grpo.toml"));
    let c = config.to_str().unwrap();
    let out = run_single(&[
        "inspect",
        "config",
        c,
        "--set",
        "rl.prompts_per_step=32",
        "--set",
        "train.kl_coef=0.05",
        "--set",
        "job.output_dir=runs/elsewhere",
        "--steps",
        "7",
    ]);
    let (stdout, stderr) = text(&out);
    assert_eq!(out.status.code(), Some(0), "{stderr}");
    for line in [
        "prompts_per_step = 32  # --set",
        "kl_coef = 0.05  # --set",
        "output_dir = \"runs/elsewhere\"  # --set",
        "steps = 7  # --steps",
        "algorithm = \"grpo\"  # job file",
        "rope_theta = 10000.0  # default",
    ] {
        assert!(stdout.contains(line), "`{line}` missing:\n{stdout}");
    }
    for (flag, needle) in [
        ("rl.prompts_per_step=many", "--set rl.prompts_per_step=many: invalid type: string \"many\", expected u32"),
        ("rl.prompt_lenn=3", "--set rl.prompt_lenn=3: unknown field `prompt_lenn`"),
        ("rl.prompts_per_step=0", "invalid value for `rl.prompts_per_step` = 0"),
        ("job.name.x=1", "--set job.name.x=1: `name` is a value in the job file, not a table"),
        ("rl", "`rl` is not KEY=VALUE"),
        // A value holding a newline once set job.name and silently dropped `steps = 1`.
        (
            "job.name=\"x\"\nsteps = 1",
            "--set job.name=\"x\"\\nsteps = 1: the value parses as more than one key (`steps` after it)",
        ),
        ("job.name=x\ny", "control character"),
        ("job.output_dir=a\tb", "control character"),
    ] {
        let out = run_single(&["inspect", "config", c, "--set", flag]);
        let (_, stderr) = text(&out);
        assert_eq!(out.status.code(), Some(2), "{flag}: {stderr}");
        assert!(stderr.contains(needle), "wanted `{needle}` in: {stderr}");
    }
}
