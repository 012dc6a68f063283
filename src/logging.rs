//! Rank-tagged logging: every line starts with `[rN]`; by default only rank 0 logs at info level.

use log::LevelFilter;
use std::io::Write;

/// How much each rank logs.
#[derive(Debug, Clone, Default)]
pub struct LogOptions {
    /// Level for rank 0 (and for every rank with `all_ranks`); `None`: `RUST_LOG`, else `info`.
    pub level: Option<LevelFilter>,
    /// Let every rank log at rank 0's level instead of `warn`.
    pub all_ranks: bool,
}

/// Installs the logger for `rank`. Calling it twice keeps the first logger.
pub fn init(rank: i32, options: &LogOptions) {
    let mut builder = env_logger::Builder::new();
    match options.level {
        Some(level) => {
            builder.filter_level(level);
        }
        None => match std::env::var("RUST_LOG") {
            Ok(spec) => {
                builder.parse_filters(&spec);
            }
            Err(_) => {
                builder.filter_level(LevelFilter::Info);
            }
        },
    }
    // The HiGHS binding (feature `exact`) logs a solve stopped by its time limit as a warning;
    // the caller reports that itself, with the bound.
    builder.filter_module("highs", LevelFilter::Error);
    if rank != 0 && !options.all_ranks {
        // Other ranks speak up only for warnings and errors, whatever rank 0's level.
        builder.filter_level(LevelFilter::Warn);
    }
    builder.format(move |out, record| writeln!(out, "[r{rank}] {:<5} {}", record.level(), record.args()));
    let _ = builder.try_init();
}
