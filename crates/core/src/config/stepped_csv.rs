//! Tables keyed by RL step, as traces are written: a CSV header, then one row per step with
//! steps strictly increasing; blank lines and `#` comments are skipped. What the other cells
//! mean is the reader's business (`sim::Trace`, the `[pool] trace` of `runtime::pool`).
//!
//! ```text
//! step,available_gpus
//! 0,8
//! 120,6
//! ```

/// A problem on one line of the file (1-based).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CsvError {
    /// The line.
    pub line: usize,
    /// What is wrong there.
    pub message: String,
}

/// One row: its line, its step, and every cell in header order (the step's included).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SteppedRow<'t> {
    /// The line in the file.
    pub line: usize,
    /// The RL step.
    pub step: u64,
    /// The cells, trimmed.
    pub cells: Vec<&'t str>,
}

/// A parsed table: the header's columns and the rows in step order (possibly none).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SteppedCsv<'t> {
    /// The header's column names, trimmed.
    pub columns: Vec<&'t str>,
    /// The rows.
    pub rows: Vec<SteppedRow<'t>>,
}

impl<'t> SteppedCsv<'t> {
    /// Parses `text`, whose header may name only `allowed` columns and must name `step`. A
    /// `rest_of_line` column written last takes the rest of each line, commas included (a
    /// rank list such as `0-3,6`).
    pub fn parse(text: &'t str, allowed: &[&str], rest_of_line: Option<&str>) -> Result<Self, CsvError> {
        let bad = |line: usize, message: String| CsvError { line, message };
        // A byte-order mark (spreadsheets write one) is not part of the first column's name.
        let text = text.strip_prefix('\u{feff}').unwrap_or(text);
        let mut lines = text
            .lines()
            .enumerate()
            .map(|(i, l)| (i + 1, l.trim()))
            .filter(|(_, l)| !l.is_empty() && !l.starts_with('#'));
        let (header_line, header) = lines.next().ok_or_else(|| bad(1, "empty file: a header is needed".into()))?;
        let columns: Vec<&str> = header.split(',').map(str::trim).collect();
        if let Some(unknown) = columns.iter().find(|c| !allowed.contains(c)) {
            let shown = unknown.escape_debug();
            return Err(bad(header_line, format!("unknown column `{shown}`; expected {}", allowed.join(", "))));
        }
        if let Some((_, twice)) = columns.iter().enumerate().find(|(k, c)| columns[..*k].contains(c)) {
            return Err(bad(header_line, format!("column `{twice}` appears twice")));
        }
        let step_column = columns
            .iter()
            .position(|c| *c == "step")
            .ok_or_else(|| bad(header_line, "the header has no `step` column".into()))?;
        let rest = rest_of_line.is_some_and(|c| columns.last() == Some(&c));
        let mut rows: Vec<SteppedRow> = Vec::new();
        for (line, text) in lines {
            let cells: Vec<&str> = if rest {
                text.splitn(columns.len(), ',').map(str::trim).collect()
            } else {
                text.split(',').map(str::trim).collect()
            };
            if cells.len() != columns.len() {
                return Err(bad(line, format!("{} cells for {} columns", cells.len(), columns.len())));
            }
            let cell = cells[step_column];
            let step = cell.parse::<u64>().map_err(|_| bad(line, format!("step = `{cell}` is not a step number")))?;
            if let Some(last) = rows.last().filter(|last| last.step >= step) {
                return Err(bad(line, format!("step {step} does not follow step {}", last.step)));
            }
            rows.push(SteppedRow { line, step, cells });
        }
        Ok(SteppedCsv { columns, rows })
    }

    /// Where `column` is in the header.
    pub fn column(&self, column: &str) -> Option<usize> {
        self.columns.iter().position(|c| *c == column)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rows_keep_their_lines_and_a_last_list_column_keeps_its_commas() {
        let text = "# a pool\nstep,ranks\n\n0,0-7\n5, 0-3,6\n";
        let t = SteppedCsv::parse(text, &["step", "ranks"], Some("ranks")).unwrap();
        assert_eq!(t.columns, ["step", "ranks"]);
        let rows: Vec<(usize, u64, &str)> = t.rows.iter().map(|r| (r.line, r.step, r.cells[1])).collect();
        assert_eq!(rows, [(4, 0, "0-7"), (5, 5, "0-3,6")]);
        assert_eq!(t.column("ranks"), Some(1));
    }

    #[test]
    fn bad_tables_name_the_line_and_the_problem() {
        let allowed = ["step", "available_gpus"];
        let error = |text: &str| SteppedCsv::parse(text, &allowed, None).unwrap_err();
        assert_eq!(error("").message, "empty file: a header is needed");
        assert_eq!(error("available_gpus\n4\n").message, "the header has no `step` column");
        assert_eq!(error("step,gpus\n0,4\n").message, "unknown column `gpus`; expected step, available_gpus");
        assert_eq!(
            error("step,available_gpus\n0,4,5\n"),
            CsvError { line: 2, message: "3 cells for 2 columns".into() }
        );
        assert_eq!(error("step,available_gpus\n1.5,4\n").message, "step = `1.5` is not a step number");
        assert_eq!(
            error("step,available_gpus\n3,4\n\n3,5\n"),
            CsvError { line: 4, message: "step 3 does not follow step 3".into() }
        );
        assert!(SteppedCsv::parse("step,available_gpus\n", &allowed, None).unwrap().rows.is_empty());
        assert_eq!(error("step,available_gpus,step\n0,4,0\n").message, "column `step` appears twice");
        assert_eq!(
            error("step, gpus\u{200b}\n0,4\n").message,
            "unknown column `gpus\\u{200b}`; expected step, available_gpus"
        );
    }

    #[test]
    fn a_byte_order_mark_is_not_part_of_the_header() {
        let t = SteppedCsv::parse("\u{feff}step,available_gpus\n0,4\n", &["step", "available_gpus"], None).unwrap();
        assert_eq!(t.columns, ["step", "available_gpus"]);
    }
}
