//! The pool: the ranks of the MPI world a job may use now (resource drift, paper §2). It comes
//! from, in this order, the config's `[pool] trace`, the file `<output_dir>/pool` that an
//! operator or a scheduler hook writes (re-read at every step boundary, and at once on SIGHUP:
//! [`PoolSignal`]), and `--pool` for the start; without any of them it is the whole world.
//!
//! A pool is the first N ranks of the world in topology order: the planner lays plans out on
//! ranks `0..N`, so ranks leave from the top. An index list must therefore be such a prefix
//! (`0-5`); other sets are refused with a message naming them.

use std::path::{Path, PathBuf};

use signal_hook::consts::SIGHUP;
use signal_hook::iterator::{Handle, Signals};

use nereus_core::config::stepped_csv::SteppedCsv;
use nereus_core::index_list::{parse_index_list, IndexListError};

use crate::RuntimeError;

/// Where the pool of each step comes from.
#[derive(Debug, Clone)]
pub struct PoolSource {
    /// Trace rows `(from step, ranks)`, by step.
    trace: Vec<(u64, u32)>,
    /// The operator's pool file.
    file: PathBuf,
    /// `--pool`, for the start.
    start: Option<u32>,
    /// The MPI world.
    world: u32,
}

impl PoolSource {
    /// The pool of a job in `output_dir` on `world` ranks with an optional trace and `--pool`.
    pub fn new(trace: Option<&Path>, output_dir: &Path, start: Option<&str>, world: u32) -> Result<Self, RuntimeError> {
        let trace = match trace {
            Some(path) => read_trace(path, world)?,
            None => Vec::new(),
        };
        let start = start.map(|text| parse_pool(text, world, "--pool")).transpose()?;
        Ok(PoolSource { trace, file: output_dir.join("pool"), start, world })
    }

    /// Whether anything but the whole world may ever be the pool.
    pub fn is_elastic(&self) -> bool {
        !self.trace.is_empty() || self.start.is_some() || self.file.exists()
    }

    /// The pool size for `step`: the trace's row in force, else the pool file, else `--pool`,
    /// else the world.
    pub fn at(&self, step: u64) -> Result<u32, RuntimeError> {
        if let Some(&(_, n)) = self.trace.iter().rev().find(|(from, _)| *from <= step) {
            return Ok(n);
        }
        Ok(self.read_file()?.unwrap_or(self.start.unwrap_or(self.world)))
    }

    /// What the pool file says now, in words: the pool the next boundary takes, or why the
    /// file cannot be used (the boundary then keeps the pool in force).
    pub fn describe_file(&self) -> String {
        let file = self.file.display();
        if !self.trace.is_empty() {
            return format!("this job follows [pool] trace, which takes precedence over the pool file {file}");
        }
        match self.read_file() {
            Ok(Some(n)) => format!(
                "the pool file {file} reads {n} ranks (0-{}); the job follows it at the next step boundary",
                n - 1
            ),
            Ok(None) => format!("there is no pool file {file}; the pool stays as it is"),
            Err(e) => format!("{e}; the job keeps its pool until the file is fixed"),
        }
    }

    /// The pool file's pool, `None` when there is no file.
    fn read_file(&self) -> Result<Option<u32>, RuntimeError> {
        match nereus_core::file_error::read_regular_string(&self.file).map_err(|e| e.source) {
            Ok(text) if text.trim().is_empty() => Err(RuntimeError::Usage(format!(
                "the pool file {} is empty (a write in progress? write the new pool to a temporary file and rename it over the pool file)",
                self.file.display()
            ))),
            Ok(text) => parse_pool(text.trim(), self.world, &self.file.display().to_string()).map(Some),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(RuntimeError::Usage(format!("cannot read the pool file {}: {e}", self.file.display()))),
        }
    }
}

/// SIGHUP as "the pool file changed": rank 0 re-reads `<output_dir>/pool` at once, in a thread,
/// and logs what the job will do at the next step boundary — or, for a file it cannot use, why,
/// while there is still time to fix it before the boundary reads it. (Every rank catches the
/// signal from the start of the process: `signals::install`.)
pub struct PoolSignal {
    handle: Option<Handle>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl PoolSignal {
    /// Starts the thread (rank 0).
    pub fn install(source: &PoolSource) -> Result<PoolSignal, RuntimeError> {
        let failed = |e: std::io::Error| RuntimeError::Usage(format!("cannot install a handler for SIGHUP: {e}"));
        let mut signals = Signals::new([SIGHUP]).map_err(failed)?;
        let handle = signals.handle();
        let source = source.clone();
        let thread = std::thread::Builder::new()
            .name("pool-sighup".into())
            .spawn(move || {
                for _ in signals.forever() {
                    log::info!("SIGHUP: {}", source.describe_file());
                }
            })
            .map_err(|e| RuntimeError::Usage(format!("cannot start the SIGHUP pool thread: {e}")))?;
        Ok(PoolSignal { handle: Some(handle), thread: Some(thread) })
    }
}

impl Drop for PoolSignal {
    fn drop(&mut self) {
        if let Some(handle) = self.handle.take() {
            handle.close();
        }
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// Reads a pool trace: a header with `step` and `available_gpus` or `ranks`, one row per change.
fn read_trace(path: &Path, world: u32) -> Result<Vec<(u64, u32)>, RuntimeError> {
    let name = path.display().to_string();
    let text = nereus_core::file_error::read_regular_string(path)
        .map_err(|e| RuntimeError::Usage(format!("cannot read pool.trace {name}: {}", e.source)))?;
    let at = |line: usize| format!("pool.trace {name} line {line}");
    let table = SteppedCsv::parse(&text, &["step", "available_gpus", "ranks"], Some("ranks"))
        .map_err(|e| RuntimeError::Usage(format!("{}: {}", at(e.line), e.message)))?;
    let (pool_column, is_list) = match (table.column("available_gpus"), table.column("ranks")) {
        (Some(c), None) => (c, false),
        (None, Some(c)) => (c, true),
        _ => {
            return Err(RuntimeError::Usage(format!(
                "pool.trace {name}: the header needs one of `available_gpus` (a count) or `ranks` (an index list)"
            )))
        }
    };
    if table.rows.is_empty() {
        return Err(RuntimeError::Usage(format!(
            "pool.trace {name}: the header has no rows under it; a trace needs at least one `step,pool` row"
        )));
    }
    let mut rows = Vec::with_capacity(table.rows.len());
    for row in &table.rows {
        let (value, at) = (row.cells[pool_column], at(row.line));
        let n = if is_list {
            parse_pool(value, world, &at)?
        } else {
            let n = value
                .parse()
                .map_err(|_| RuntimeError::Usage(format!("{at}: available_gpus {value:?} is not a count")))?;
            check_size(n, world, &at)?
        };
        rows.push((row.step, n));
    }
    Ok(rows)
}

/// A pool written as a count (`6`) or as the index list of the first ranks (`0-5`).
fn parse_pool(text: &str, world: u32, what: &str) -> Result<u32, RuntimeError> {
    if let Ok(n) = text.parse::<u32>() {
        if !text.contains('-') && !text.contains(',') {
            return check_size(n, world, what);
        }
    }
    // Ranks past the world are refused before a range is expanded (`0-4294967295`).
    let ranks = parse_index_list(text, world.saturating_sub(1)).map_err(|e| match e {
        IndexListError::Above { index, .. } => RuntimeError::Usage(format!(
            "{what}: {text:?} names rank {index}; the world has {world} (ranks 0-{})",
            world.saturating_sub(1)
        )),
        IndexListError::Malformed(_) => {
            RuntimeError::Usage(format!("{what}: {text:?} is neither a rank count nor an index list like 0-5 ({e})"))
        }
    })?;
    let n = ranks.len() as u32;
    if ranks.iter().enumerate().any(|(i, &r)| r != i as u32) {
        return Err(RuntimeError::Usage(format!(
            "{what}: pool {text:?} is not the first {n} ranks; plans are laid out on ranks 0..N, so a pool is a prefix such as 0-{}",
            n.saturating_sub(1)
        )));
    }
    check_size(n, world, what)
}

fn check_size(n: u32, world: u32, what: &str) -> Result<u32, RuntimeError> {
    if n == 0 || n > world {
        return Err(RuntimeError::Usage(format!("{what}: a pool of {n} ranks; the world has {world} (1 … {world})")));
    }
    Ok(n)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn traces_files_and_the_start_take_turns_in_that_order() {
        let dir = tempfile::tempdir().unwrap();
        let trace = dir.path().join("t.csv");
        std::fs::write(&trace, "step,available_gpus\n2,6\n5,8\n").unwrap();
        let pool = PoolSource::new(Some(&trace), dir.path(), Some("0-3"), 8).unwrap();
        // Before the trace's first row: no file, so --pool.
        assert_eq!([0, 1, 2, 4, 5, 9].map(|s| pool.at(s).unwrap()), [4, 4, 6, 6, 8, 8]);
        std::fs::write(dir.path().join("pool"), "0-2\n").unwrap();
        assert_eq!(pool.at(1).unwrap(), 3);
        let lists = dir.path().join("r.csv");
        std::fs::write(&lists, "step,ranks\n0,0-7\n3,0-4\n").unwrap();
        assert_eq!(PoolSource::new(Some(&lists), dir.path(), None, 8).unwrap().at(3).unwrap(), 5);
    }

    #[test]
    fn bad_pools_are_refused_by_name() {
        let dir = tempfile::tempdir().unwrap();
        let cases = [
            ("step,available_gpus\n0,9\n", "the world has 8"),
            ("step,available_gpus\n0,0\n", "a pool of 0 ranks"),
            ("step,ranks\n0,0-3,6\n", "not the first 5 ranks"),
            ("step,gpus\n0,4\n", "unknown column `gpus`"),
            ("step\n0\n", "needs one of `available_gpus` (a count) or `ranks`"),
            ("step,available_gpus\n3,4\n3,5\n", "line 3: step 3 does not follow step 3"),
            ("step,available_gpus\nx,4\n", "not a step number"),
        ];
        for (text, needle) in cases {
            let path = dir.path().join("bad.csv");
            std::fs::write(&path, text).unwrap();
            let e = PoolSource::new(Some(&path), dir.path(), None, 8).unwrap_err().to_string();
            assert!(e.contains(needle), "{text:?}: {e}");
        }
    }
}
