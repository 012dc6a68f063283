//! Nereus's harnesses: the benchmarks behind `nereus bench …` ([`bench`]), the self-tests
//! behind `nereus selftest …` ([`selftest`]) and the heap meter the planner benchmark reads
//! ([`alloc_meter`]). Products of their own, but not the runtime: the production binary calls
//! into this crate only for those commands.

pub mod alloc_meter;
pub mod bench;
pub mod selftest;
