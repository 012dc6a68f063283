//! A chat template renders under bounds: an instruction limit for loops (a nested 10^5 × 10^4
//! loop once hung `data preview` past 120 s), a memory bound on what it builds (a string doubled
//! 50 times once ran into the OOM killer after 86 s), a cap on its output, and Jinja's errors
//! where transformers' Jinja raises (`1 / 0` once rendered `inf`). Each refusal exits 2 within
//! seconds, naming the template file and the limit.

mod common;

use std::path::PathBuf;
use std::time::{Duration, Instant};

use common::{assert_status, repo, run_single_within, write};

/// The shipped tokenizer directory with `template` as its chat_template.jinja.
fn model_with(root: &std::path::Path, name: &str, template: &str) -> PathBuf {
    let dir = root.join(name);
    std::fs::create_dir_all(&dir).unwrap();
    let shipped = repo().join("configs/data/tiny-math/tokenizer");
    for f in ["tokenizer.json", "tokenizer_config.json", "generation_config.json"] {
        std::fs::copy(shipped.join(f), dir.join(f)).unwrap();
    }
    write(&dir, "chat_template.jinja", template);
    dir
}

#[test]
fn loops_growth_output_and_division_by_zero_stop_with_the_template_and_the_limit_named() {
    let root = tempfile::tempdir().unwrap();
    let prompts = write(root.path(), "p.jsonl", r#"{"prompt": "hi"}"#);
    let doubled: String = (0..50).map(|_| "{% set s = s ~ s %}").collect();
    let cases = [
        (
            "nested-loop",
            "{% for i in range(100000) %}{% for j in range(10000) %}{% endfor %}{% endfor %}x".to_string(),
            "ran past the limit of 10000000 instructions",
        ),
        (
            "doubling",
            "{% set ns = namespace(s='x') %}{% for i in range(50) %}{% set ns.s = ns.s ~ ns.s %}{% endfor %}{{ ns.s }}"
                .into(),
            "holds more than 268 MB at once while rendering",
        ),
        ("doubling-unrolled", format!("{{% set s = 'ab' %}}{doubled}{{{{ s|length }}}}"), "holds more than 268 MB"),
        (
            "long-output",
            "{% for i in range(100000) %}{{ 'x' * 1000 }}{% endfor %}".into(),
            "its output passed the limit of 16777216 bytes",
        ),
        ("division-by-zero", "{{ 1 / 0 }}".into(), "computed inf (a division by zero?)"),
        ("float-modulo-by-zero", "{{ 1.5 % 0 }}".into(), "computed NaN"),
        ("zero-in-tojson", "{{ [1 / 0] | tojson }}".into(), "computed inf"),
    ];
    for (name, template, needle) in cases {
        let model = model_with(root.path(), name, &template);
        let started = Instant::now();
        let args = ["data", "preview", prompts.to_str().unwrap(), "--model", model.to_str().unwrap()];
        let out = run_single_within(&args, Duration::from_secs(60)).unwrap_or_else(|| panic!("{name} hung"));
        let file = model.join("chat_template.jinja");
        assert_status(&out, 2, &[file.to_str().unwrap(), needle]);
        assert!(started.elapsed() < Duration::from_secs(20), "{name} took {:?}", started.elapsed());
    }
    // A template that stays within every bound still renders.
    let model = model_with(root.path(), "fine", "{% for m in messages %}{{ m.content }}{{ 10 / 4 }}{% endfor %}");
    let args = ["data", "preview", prompts.to_str().unwrap(), "--model", model.to_str().unwrap()];
    let out = run_single_within(&args, Duration::from_secs(60)).unwrap();
    assert_status(&out, 0, &[]);
    assert!(String::from_utf8_lossy(&out.stdout).contains("hi2.5"));
}
