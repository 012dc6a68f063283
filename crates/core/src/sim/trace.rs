//! Traces: what a job's monitor would see step by step, as CSV with a header. `step` is
//! required; `seq_len_mean`, `seq_len_p95` (response tokens) and `available_gpus` are each
//! optional, and a column a trace leaves out holds the job's value (see [`Trace::points`]).
//!
//! ```text
//! step,seq_len_mean,seq_len_p95,available_gpus
//! 0,512,690,1024
//! 1,518,701,1024
//! ```

use super::SimError;
use crate::config::check::{MAX_DEVICES, MAX_TOKENS};
use crate::config::stepped_csv::SteppedCsv;

/// The columns a trace may carry, in the order they are written.
pub const COLUMNS: [&str; 4] = ["step", "seq_len_mean", "seq_len_p95", "available_gpus"];

/// One row as written (a missing column is `None`).
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct TraceRow {
    /// The RL step (strictly increasing down the file).
    pub step: u64,
    /// Mean response length, tokens.
    pub seq_len_mean: Option<f64>,
    /// 95th percentile of the response length, tokens.
    pub seq_len_p95: Option<f64>,
    /// GPUs the job may use during this step.
    pub available_gpus: Option<u32>,
}

/// A parsed trace.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Trace {
    /// Rows in step order.
    pub rows: Vec<TraceRow>,
}

/// One step with every value known (the job's value where the trace has no column).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Point {
    /// The RL step.
    pub step: u64,
    /// Mean response length, tokens.
    pub seq_len_mean: f64,
    /// 95th percentile of the response length, tokens.
    pub seq_len_p95: f64,
    /// GPUs available during the step.
    pub gpus: u32,
}

/// Most steps a trace may have (10^7: a simulation keeps every step's record).
pub const MAX_ROWS: usize = 10_000_000;

impl Trace {
    /// Parses CSV text (`name` is only for messages). Errors name the line and the column.
    pub fn parse(text: &str, name: &str) -> Result<Trace, SimError> {
        let bad = |line: usize, message: String| SimError::Trace { name: name.into(), line, message };
        let table = SteppedCsv::parse(text, &COLUMNS, None).map_err(|e| bad(e.line, e.message))?;
        let mut rows: Vec<TraceRow> = Vec::with_capacity(table.rows.len());
        for r in &table.rows {
            let mut row = TraceRow { step: r.step, ..TraceRow::default() };
            for (c, cell) in table.columns.iter().zip(&r.cells).filter(|(c, _)| **c != "step") {
                let number = cell
                    .parse::<f64>()
                    .ok()
                    .filter(|x| x.is_finite() && *x >= 0.0)
                    .ok_or_else(|| bad(r.line, format!("{c} = `{cell}` is not a non-negative number")))?;
                match *c {
                    "seq_len_mean" => row.seq_len_mean = Some(positive(number, c).map_err(|m| bad(r.line, m))?),
                    "seq_len_p95" => row.seq_len_p95 = Some(positive(number, c).map_err(|m| bad(r.line, m))?),
                    _ => {
                        let n =
                            integer(number).filter(|n| (1..=u64::from(MAX_DEVICES)).contains(n)).ok_or_else(|| {
                                bad(r.line, format!("{c} = `{cell}`: a GPU count between 1 and {MAX_DEVICES}"))
                            })?;
                        row.available_gpus = Some(n as u32);
                    }
                }
            }
            rows.push(row);
        }
        if rows.is_empty() {
            return Err(bad(1, "the trace has a header but no rows".into()));
        }
        if rows.len() > MAX_ROWS {
            return Err(bad(1, format!("{} rows: a trace has at most {MAX_ROWS} steps", rows.len())));
        }
        Ok(Trace { rows })
    }

    /// The trace as CSV: the header names the columns some row carries.
    pub fn to_csv(&self) -> String {
        let has = [
            true,
            self.rows.iter().any(|r| r.seq_len_mean.is_some()),
            self.rows.iter().any(|r| r.seq_len_p95.is_some()),
            self.rows.iter().any(|r| r.available_gpus.is_some()),
        ];
        let header: Vec<&str> = COLUMNS.iter().zip(has).filter(|(_, h)| *h).map(|(c, _)| *c).collect();
        let mut out = header.join(",") + "\n";
        let cell = |x: Option<f64>| x.map_or(String::new(), |v| format!("{v:.1}"));
        for r in &self.rows {
            let cells = [
                r.step.to_string(),
                cell(r.seq_len_mean),
                cell(r.seq_len_p95),
                r.available_gpus.map_or(String::new(), |g| g.to_string()),
            ];
            let row: Vec<&str> = cells.iter().zip(has).filter(|(_, h)| *h).map(|(c, _)| c.as_str()).collect();
            out += &(row.join(",") + "\n");
        }
        out
    }

    /// Every row with every value: a missing length column takes the other length column
    /// (a trace of one length), else `len` (the job's response length); a missing
    /// `available_gpus` takes `gpus` (the job's pool).
    pub fn points(&self, len: f64, gpus: u32) -> Vec<Point> {
        self.rows
            .iter()
            .map(|r| Point {
                step: r.step,
                seq_len_mean: r.seq_len_mean.or(r.seq_len_p95).unwrap_or(len),
                seq_len_p95: r.seq_len_p95.or(r.seq_len_mean).unwrap_or(len),
                gpus: r.available_gpus.unwrap_or(gpus),
            })
            .collect()
    }
}

fn integer(x: f64) -> Option<u64> {
    (x.fract() == 0.0 && x < 2f64.powi(53)).then_some(x as u64)
}

fn positive(x: f64, what: &str) -> Result<f64, String> {
    if x < 1.0 {
        Err(format!("{what} = {x}: a response has at least one token"))
    } else if x > f64::from(MAX_TOKENS) {
        Err(format!("{what} = {x}: a response has at most {MAX_TOKENS} tokens"))
    } else {
        Ok(x)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn missing_columns_hold_the_jobs_values_and_bad_rows_name_their_line() {
        let t = Trace::parse("step,seq_len_mean\n0,100\n1,120\n", "t.csv").unwrap();
        let p = t.points(512.0, 64);
        assert_eq!(p[1], Point { step: 1, seq_len_mean: 120.0, seq_len_p95: 120.0, gpus: 64 });
        let t = Trace::parse("step,available_gpus\n3,8\n", "t.csv").unwrap();
        assert_eq!(t.points(512.0, 64)[0], Point { step: 3, seq_len_mean: 512.0, seq_len_p95: 512.0, gpus: 8 });
        let e = Trace::parse("step,seq_len_mean\n0,100\n0,120\n", "t.csv").unwrap_err().to_string();
        assert!(e.contains("line 3") && e.contains("does not follow"), "{e}");
        let e = Trace::parse("step,gpus\n0,1\n", "t.csv").unwrap_err().to_string();
        assert!(e.contains("unknown column `gpus`"), "{e}");
        let e = Trace::parse("step,available_gpus\n0,1.5\n", "t.csv").unwrap_err().to_string();
        assert!(e.contains("available_gpus"), "{e}");
        assert!(Trace::parse("seq_len_mean\n100\n", "t.csv").is_err());
    }

    #[test]
    fn csv_round_trips() {
        let text = "step,seq_len_mean,seq_len_p95,available_gpus\n0,500.0,700.0,16\n1,510.5,710.0,8\n";
        let t = Trace::parse(text, "t.csv").unwrap();
        assert_eq!(t.to_csv(), text);
        assert_eq!(Trace::parse(&t.to_csv(), "again").unwrap(), t);
    }
}
