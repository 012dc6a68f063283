//! Rewards from an external scorer, written by the user in any language: started once, fed one
//! JSON line per response (`{"prompt", "response", "answer", "metadata"}`) and answering one
//! JSON line each (`{"reward": x}`), a step's responses as one batch, within a timeout.
//!
//! A scorer that cannot start, exits, stops answering past the timeout, or answers anything but
//! a finite reward is an error naming the command and the line of the batch; under
//! [`OnError::Zero`] that response scores 0, the failure is counted, and a scorer that died or
//! hung is started again for the rest of the batch.

use std::io::{BufRead, BufReader, Write};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::mpsc::{Receiver, RecvTimeoutError};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};
use serde_json::Value;
use thiserror::Error;

/// What a scorer failure does.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum OnError {
    /// Stop: the job checkpoints its last complete step and exits naming the line.
    #[default]
    Stop,
    /// Score the response 0 and count the failure.
    Zero,
}

nereus_core::named_enum!(OnError { Stop => "stop", Zero => "zero" });

/// Why a scorer gave no reward.
#[derive(Debug, Error, Clone, PartialEq)]
pub enum ScorerError {
    /// The program could not be started.
    #[error("reward command `{command}` cannot start: {reason}")]
    Start {
        /// The command line.
        command: String,
        /// The system's reason.
        reason: String,
    },
    /// The program exited (or closed its output) before answering.
    #[error("reward command `{command}` exited ({status}) before answering line {line} of the batch{stderr}")]
    Exited {
        /// The command line.
        command: String,
        /// Its exit status.
        status: String,
        /// The 1-based line of the batch left unanswered.
        line: usize,
        /// The end of what it wrote to stderr, if anything.
        stderr: String,
    },
    /// The program did not answer in time.
    #[error("reward command `{command}` did not answer line {line} of the batch within {timeout_s} s")]
    Timeout {
        /// The command line.
        command: String,
        /// The 1-based line of the batch.
        line: usize,
        /// The timeout.
        timeout_s: f64,
    },
    /// The answer is not `{"reward": <finite number>}`.
    #[error("reward command `{command}` answered line {line} of the batch with {answer:?}, not {{\"reward\": <finite number>}}")]
    Garbage {
        /// The command line.
        command: String,
        /// The 1-based line of the batch.
        line: usize,
        /// What it wrote (cut at 200 characters).
        answer: String,
    },
}

/// One response to score, as the scorer reads it.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ScoreRequest<'a> {
    /// The prompt as text (chat messages rendered).
    pub prompt: &'a str,
    /// The response.
    pub response: &'a str,
    /// The reference answer.
    pub answer: &'a str,
    /// The record's metadata (`null` if none).
    pub metadata: &'a Value,
}

/// A batch's rewards and, under [`OnError::Zero`], its failures (line, reason).
#[derive(Debug, Clone, PartialEq, Default)]
pub struct BatchScores {
    /// One reward per request.
    pub rewards: Vec<f64>,
    /// The requests scored 0 because the scorer failed on them: (0-based index, why).
    pub failures: Vec<(usize, ScorerError)>,
}

/// A running scorer process.
pub struct CommandScorer {
    argv: Vec<String>,
    timeout: Duration,
    on_error: OnError,
    process: Option<Process>,
}

/// The child, its input, its output lines and the end of its stderr.
struct Process {
    child: Child,
    stdin: Option<ChildStdin>,
    lines: Receiver<std::io::Result<String>>,
    stderr: Arc<Mutex<String>>,
}

impl CommandScorer {
    /// Starts `argv` (program and arguments), answering within `timeout` per line.
    pub fn start(argv: &[String], timeout: Duration, on_error: OnError) -> Result<Self, ScorerError> {
        let mut scorer = Self { argv: argv.to_vec(), timeout, on_error, process: None };
        scorer.process = Some(scorer.spawn()?);
        Ok(scorer)
    }

    fn command(&self) -> String {
        self.argv.join(" ")
    }

    fn spawn(&self) -> Result<Process, ScorerError> {
        let start_error = |reason: String| ScorerError::Start { command: self.command(), reason };
        let (program, args) = self.argv.split_first().ok_or_else(|| start_error("the command is empty".into()))?;
        let mut child = Command::new(program)
            .args(args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .map_err(|e| start_error(e.to_string()))?;
        let stdout = child.stdout.take().expect("stdout is piped");
        let (send, lines) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                if send.send(line).is_err() {
                    break;
                }
            }
        });
        let stderr = Arc::new(Mutex::new(String::new()));
        let (sink, pipe) = (Arc::clone(&stderr), child.stderr.take().expect("stderr is piped"));
        std::thread::spawn(move || {
            for line in BufReader::new(pipe).lines().map_while(Result::ok) {
                let mut tail = sink.lock().expect("the stderr tail is never poisoned");
                *tail = line; // the last line says most (a traceback's exception, an error)
            }
        });
        Ok(Process { stdin: child.stdin.take(), child, lines, stderr })
    }

    /// Scores `requests` in one batch: all lines written, then one answer read per line.
    pub fn score(&mut self, requests: &[ScoreRequest]) -> Result<BatchScores, ScorerError> {
        let mut scores = BatchScores::default();
        while scores.rewards.len() < requests.len() {
            let done = scores.rewards.len();
            match self.score_from(&requests[done..], done, &mut scores) {
                Ok(()) => {}
                Err(e) if self.on_error == OnError::Stop => return Err(e),
                Err(e) => {
                    // The scorer died or hung: this line scores 0, a fresh scorer gets the rest.
                    scores.failures.push((scores.rewards.len(), e));
                    scores.rewards.push(0.0);
                    self.restart()?;
                }
            }
        }
        Ok(scores)
    }

    /// Writes `requests` (the batch from index `offset`) and appends their rewards to `scores`
    /// until all are answered or the scorer dies or hangs.
    fn score_from(
        &mut self,
        requests: &[ScoreRequest],
        offset: usize,
        scores: &mut BatchScores,
    ) -> Result<(), ScorerError> {
        let mut batch = String::new();
        for r in requests {
            batch.push_str(&serde_json::to_string(r).expect("a request serializes"));
            batch.push('\n');
        }
        let (command, timeout, on_error) = (self.command(), self.timeout, self.on_error);
        let process = self.process.as_mut().expect("a scorer holds a process between batches");
        let mut stdin = process.stdin.take();
        // The batch is written from its own thread: a scorer that answers as it reads would
        // otherwise fill its output pipe while we still write.
        let writer = std::thread::spawn(move || {
            let ok = stdin.as_mut().is_some_and(|s| s.write_all(batch.as_bytes()).and_then(|()| s.flush()).is_ok());
            (stdin, ok)
        });
        let answers = Answers { command: &command, timeout, on_error };
        let result = answers.read(process, requests.len(), offset, scores);
        if result.is_err() {
            let _ = process.child.kill(); // unblocks a writer stuck on a scorer that stopped reading
        }
        let (stdin, _) = writer.join().expect("the batch writer does not panic");
        process.stdin = stdin;
        result
    }

    fn restart(&mut self) -> Result<(), ScorerError> {
        if let Some(mut old) = self.process.take() {
            let _ = old.child.kill();
            let _ = old.child.wait();
        }
        self.process = Some(self.spawn()?);
        Ok(())
    }
}

/// How answers are read: whose, how long each may take, what a garbage answer does.
struct Answers<'a> {
    command: &'a str,
    timeout: Duration,
    on_error: OnError,
}

impl Answers<'_> {
    /// Reads `n` answers (batch lines `offset + 1 …`) into `scores`, each within the timeout; a
    /// garbage answer under [`OnError::Zero`] scores 0 and reading goes on (the scorer is alive
    /// and answers the next line next).
    fn read(
        &self,
        process: &mut Process,
        n: usize,
        offset: usize,
        scores: &mut BatchScores,
    ) -> Result<(), ScorerError> {
        let command = self.command.to_string();
        for k in 0..n {
            let line = offset + k + 1;
            let answer = match process.lines.recv_timeout(self.timeout) {
                Ok(Ok(text)) => text,
                Err(RecvTimeoutError::Timeout) => {
                    return Err(ScorerError::Timeout { command, line, timeout_s: self.timeout.as_secs_f64() })
                }
                Ok(Err(_)) | Err(RecvTimeoutError::Disconnected) => return Err(exited(process, &command, line)),
            };
            match parse_answer(&answer) {
                Some(reward) => scores.rewards.push(reward),
                None => {
                    let e = ScorerError::Garbage {
                        command: command.clone(),
                        line,
                        answer: answer.chars().take(200).collect(),
                    };
                    if self.on_error == OnError::Stop {
                        return Err(e);
                    }
                    scores.failures.push((scores.rewards.len(), e));
                    scores.rewards.push(0.0);
                }
            }
        }
        Ok(())
    }
}

/// The error for a scorer whose output ended: its exit status and last stderr line.
fn exited(process: &mut Process, command: &str, line: usize) -> ScorerError {
    // The output closed; the exit follows within moments (or the process closed stdout and
    // lives on, which is as useless and is then killed).
    let deadline = Instant::now() + Duration::from_secs(2);
    let status = loop {
        match process.child.try_wait() {
            Ok(Some(status)) => break status.to_string(),
            Ok(None) if Instant::now() < deadline => std::thread::sleep(Duration::from_millis(10)),
            _ => {
                let _ = process.child.kill();
                break "closed its output".to_string();
            }
        }
    };
    std::thread::sleep(Duration::from_millis(20)); // the stderr reader takes the last line
    let tail = process.stderr.lock().expect("the stderr tail is never poisoned").clone();
    let stderr = if tail.is_empty() { String::new() } else { format!("; its stderr ended: {tail}") };
    ScorerError::Exited { command: command.into(), status, line, stderr }
}

/// The reward in `{"reward": x}`, if the line is that with a finite number.
fn parse_answer(line: &str) -> Option<f64> {
    let value: Value = serde_json::from_str(line.trim()).ok()?;
    value.get("reward")?.as_f64().filter(|x| x.is_finite())
}

impl Drop for CommandScorer {
    fn drop(&mut self) {
        if let Some(mut p) = self.process.take() {
            drop(p.stdin.take()); // a well-behaved scorer exits at the end of its input
            let deadline = Instant::now() + Duration::from_millis(500);
            while matches!(p.child.try_wait(), Ok(None)) && Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(10));
            }
            let _ = p.child.kill();
            let _ = p.child.wait();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A scorer in Python: reward 1 when the response equals the answer; `crash`, `hang` and
    /// `garbage` responses make it misbehave in that way.
    const SCORER: &str = r#"
import json, sys, time
for line in sys.stdin:
    r = json.loads(line)
    if r["response"] == "crash":
        sys.exit("scorer: cannot score " + r["answer"])
    if r["response"] == "hang":
        time.sleep(60)
    if r["response"] == "garbage":
        print("not json", flush=True)
        continue
    print(json.dumps({"reward": float(r["response"] == r["answer"]) + r["metadata"]["bonus"]}), flush=True)
"#;

    fn scorer(on_error: OnError) -> CommandScorer {
        let argv = ["python3", "-c", SCORER].map(String::from);
        CommandScorer::start(&argv, Duration::from_millis(1500), on_error).unwrap()
    }

    fn requests<'a>(responses: &[&'a str], meta: &'a Value) -> Vec<ScoreRequest<'a>> {
        responses.iter().map(|r| ScoreRequest { prompt: "p", response: r, answer: "7", metadata: meta }).collect()
    }

    #[test]
    fn a_scorer_answers_batch_after_batch() {
        let meta = serde_json::json!({"bonus": 0.25});
        let mut s = scorer(OnError::Stop);
        for _ in 0..3 {
            let scores = s.score(&requests(&["7", "8", "7"], &meta)).unwrap();
            assert_eq!(scores, BatchScores { rewards: vec![1.25, 0.25, 1.25], failures: vec![] });
        }
    }

    #[test]
    fn crashes_hangs_and_garbage_name_the_line() {
        let meta = serde_json::json!({"bonus": 0.0});
        for (bad, needle) in [
            ("crash", "exited (exit status: 1) before answering line 2 of the batch; its stderr ended: scorer: cannot score 7"),
            ("hang", "did not answer line 2 of the batch within 1.5 s"),
            ("garbage", "answered line 2 of the batch with \"not json\", not {\"reward\": <finite number>}"),
        ] {
            let started = Instant::now();
            let e = scorer(OnError::Stop).score(&requests(&["7", bad, "7"], &meta)).unwrap_err().to_string();
            assert!(e.starts_with("reward command `python3 -c ") && e.contains(needle), "{e}");
            assert!(started.elapsed() < Duration::from_secs(10), "{bad} took {:?}", started.elapsed());
        }
        let missing = CommandScorer::start(&["/nonexistent/scorer".into()], Duration::from_secs(1), OnError::Stop);
        assert!(missing.err().unwrap().to_string().starts_with("reward command `/nonexistent/scorer` cannot start: "));
        let dir = tempfile::tempdir().unwrap();
        let script = dir.path().join("score.sh");
        std::fs::write(&script, "#!/bin/sh\n").unwrap(); // not executable
        let e = CommandScorer::start(&[script.display().to_string()], Duration::from_secs(1), OnError::Stop);
        assert!(e.err().unwrap().to_string().contains("Permission denied"));
    }

    #[test]
    fn under_zero_failures_score_nothing_and_the_rest_is_scored() {
        let meta = serde_json::json!({"bonus": 0.0});
        let mut s = scorer(OnError::Zero);
        let scores = s.score(&requests(&["7", "garbage", "crash", "7", "hang", "7"], &meta)).unwrap();
        assert_eq!(scores.rewards, vec![1.0, 0.0, 0.0, 1.0, 0.0, 1.0]);
        let failed: Vec<usize> = scores.failures.iter().map(|f| f.0).collect();
        assert_eq!(failed, vec![1, 2, 4]);
        assert!(matches!(scores.failures[2].1, ScorerError::Timeout { line: 5, .. }), "{:?}", scores.failures);
        assert_eq!(s.score(&requests(&["7"], &meta)).unwrap().rewards, vec![1.0], "the restarted scorer goes on");
    }
}
