//! Every command that reads a file the user names checks first that it is a regular file: a
//! named pipe (which once hung `data preview`, `reward` and `model import-gguf` past 120 s), a
//! directory or a device is refused at once, naming the path and what it is.

mod common;

use std::path::Path;
use std::time::Duration;

use common::{assert_status, repo, run_single_within, write};

/// A named pipe at `dir/name`, or `None` (with a note) where mkfifo is missing.
fn fifo(dir: &Path, name: &str) -> Option<String> {
    let path = dir.join(name);
    let made = std::process::Command::new("mkfifo").arg(&path).status().is_ok_and(|s| s.success());
    if !made {
        eprintln!("note: mkfifo failed; the named-pipe cases are skipped");
    }
    made.then(|| path.to_str().unwrap().to_string())
}

/// `args` ends within 20 s (a hang guard) with `status` and a message naming `needles`.
fn refused(args: &[&str], status: i32, needles: &[&str]) {
    let out = run_single_within(args, Duration::from_secs(20)).unwrap_or_else(|| panic!("{args:?} hung"));
    assert_status(&out, status, needles);
}

#[test]
fn pipes_directories_and_devices_are_refused_by_name_without_hanging() {
    let dir = tempfile::tempdir().unwrap();
    let Some(pipe) = fifo(dir.path(), "pipe") else { return };
    let tokenizer = repo().join("configs/data/tiny-math/tokenizer");
    let tokenizer = tokenizer.to_str().unwrap();
    let out = dir.path().join("out");
    let out = out.to_str().unwrap();
    let folder = dir.path().to_str().unwrap();
    let named_pipe = [pipe.as_str(), "it is a named pipe (FIFO), not a regular file"];
    let trace = ["simulate", "configs/llama3.1-8b-ppo.toml", "--trace"];
    // On threads: `inspect config` and `simulate` start MPI (seconds) before they read a file.
    std::thread::scope(|scope| {
        for target in [pipe.as_str(), folder, "/dev/null"] {
            let kind = match target {
                t if t == pipe => "a named pipe (FIFO)",
                "/dev/null" => "a character device",
                _ => "a directory",
            };
            let needles = [target, kind];
            refused(&["data", "preview", target, "--model", tokenizer], 2, &needles);
            refused(&["reward", target, "--kind", "math"], 2, &needles);
            refused(&["model", "import-gguf", target, "--out", out], 2, &needles);
            scope.spawn(move || refused(&["inspect", "config", target], 2, &needles));
            scope.spawn(move || refused(&[&trace[..], &[target]].concat(), 2, &needles));
        }
    });
    // A pipe inside a model directory: the tokenizer, the template, a special-token file.
    for file in ["tokenizer.json", "chat_template.jinja", "generation_config.json"] {
        let model = dir.path().join(file.replace('.', "-"));
        std::fs::create_dir_all(&model).unwrap();
        for f in ["tokenizer.json", "tokenizer_config.json", "generation_config.json"] {
            std::fs::copy(Path::new(tokenizer).join(f), model.join(f)).unwrap();
        }
        std::fs::remove_file(model.join(file)).ok();
        let Some(inner) = fifo(&model, file) else { return };
        let prompts = write(dir.path(), "p.jsonl", r#"{"prompt": "hi"}"#);
        let args = ["data", "preview", prompts.to_str().unwrap(), "--model", model.to_str().unwrap()];
        refused(&args, 2, &[inner.as_str(), named_pipe[1]]);
    }
}
