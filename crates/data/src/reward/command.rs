//! Rewards from an external scorer, written by the user in any language: started once, fed one
//! JSON line per response (`{"prompt", "response", "answer", "metadata"}`) and answering one
//! JSON line each (`{"reward": x}`), a step's responses as one batch, within a timeout.
//!
//! A scorer that cannot start, exits, stops answering past the timeout, or answers anything but
//! a finite reward is an error naming the command and the line of the batch; under
//! [`OnError::Zero`] that response scores 0, the failure is counted, and a scorer that died or
//! hung is started again for the rest of the batch.
//!
//! The scorer runs in a process group of its own ([`super::process`]): when it finishes, times
//! out, fails or the job stops, the whole group is ended, whatever the scorer started with it.

use std::io::Write;
use std::process::ChildStdin;
use std::sync::mpsc::RecvTimeoutError;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use super::process::Process;

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

/// Scorers started in a row that answer no line before the batch's remaining lines score 0
/// under [`OnError::Zero`].
const SILENT_SCORERS: usize = 2;

/// A running scorer process.
pub struct CommandScorer {
    argv: Vec<String>,
    timeout: Duration,
    on_error: OnError,
    process: Option<Process>,
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
        Process::spawn(program, args).map_err(|e| start_error(e.to_string()))
    }

    /// Scores `requests` in one batch: all lines written, then one answer read per line.
    pub fn score(&mut self, requests: &[ScoreRequest]) -> Result<BatchScores, ScorerError> {
        let mut scores = BatchScores::default();
        let mut silent = 0; // scorers in a row that died or hung before answering any line
        while scores.rewards.len() < requests.len() {
            let done = scores.rewards.len();
            match self.score_from(&requests[done..], done, &mut scores) {
                Ok(()) => {}
                Err(e) if self.on_error == OnError::Stop => return Err(e),
                Err(e) => {
                    silent = if scores.rewards.len() == done { silent + 1 } else { 0 };
                    // The scorer died or hung: this line scores 0, a fresh scorer gets the rest,
                    // unless a fresh one already answered nothing: then the batch's rest scores
                    // 0 too, so a scorer that never answers costs two timeouts, not one a line.
                    let last = if silent >= SILENT_SCORERS { requests.len() } else { scores.rewards.len() + 1 };
                    for index in scores.rewards.len()..last {
                        scores.failures.push((index, e.clone()));
                        scores.rewards.push(0.0);
                    }
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
        if self.process.as_ref().is_none_or(Process::ended) {
            self.restart()?;
        }
        let (command, timeout, on_error) = (self.command(), self.timeout, self.on_error);
        let process = self.process.as_mut().expect("a scorer holds a process between batches");
        let mut stdin = process.stdin.take();
        // The batch is written from its own thread: a scorer that answers as it reads would
        // otherwise fill its output pipe while we still write.
        let writer = std::thread::spawn(move || {
            if let Some(s) = stdin.as_mut() {
                let _ = s.write_all(batch.as_bytes()).and_then(|()| s.flush());
            }
            stdin
        });
        let answers = Answers { command: &command, timeout, on_error };
        let result = answers.read(process, requests.len(), offset, scores);
        if result.is_err() {
            // Ends a writer stuck on a scorer that stopped reading: the group's end closes
            // every copy of the pipe's reading end, the scorer's children's included.
            process.end();
        }
        match (finished_writer(writer, timeout), result) {
            (Some(stdin), result) => {
                process.stdin = stdin;
                result
            }
            (None, Err(e)) => Err(e),
            (None, Ok(())) => {
                // Every line answered though the scorer did not read them all: the answers
                // stand, and a fresh scorer takes the next batch.
                process.end();
                Ok(())
            }
        }
    }

    fn restart(&mut self) -> Result<(), ScorerError> {
        drop(self.process.take()); // ends the old group
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

/// The batch writer's handle on the scorer's input once it has finished, waiting at most
/// `limit` (`None` past it: the scorer read neither its batch nor to its end, and the writer
/// is left blocked on a pipe the scorer's end will close).
fn finished_writer(writer: JoinHandle<Option<ChildStdin>>, limit: Duration) -> Option<Option<ChildStdin>> {
    let deadline = Instant::now() + limit.max(Duration::from_secs(1));
    while !writer.is_finished() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(5));
    }
    writer.is_finished().then(|| writer.join().ok().flatten())
}

/// The error for a scorer whose output ended: its exit status and last stderr line.
fn exited(process: &mut Process, command: &str, line: usize) -> ScorerError {
    // The output closed; the exit follows within moments (or the process closed stdout and
    // lives on, which is as useless and is then ended).
    let deadline = Instant::now() + Duration::from_secs(2);
    while !process.has_exited() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(10));
    }
    let status = match (process.has_exited(), process.end()) {
        (true, Some(status)) => status.to_string(),
        _ => "closed its output".to_string(),
    };
    std::thread::sleep(Duration::from_millis(20)); // the stderr reader takes the last line
    let tail = process.stderr.lock().unwrap_or_else(|e| e.into_inner()).clone();
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
            while !p.has_exited() && Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(10));
            }
            p.end(); // and whatever it started goes with it
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
