//! `nereus bench primitives` keeps its JSON contract and its byte floors (deterministic; the
//! bandwidth floors are timing and are checked by running the benchmark, not here).

mod common;

use common::{run_mpi, text};

#[test]
fn bench_primitives_writes_the_contract_and_holds_the_byte_floors() {
    let dir = tempfile::tempdir().unwrap();
    let json = dir.path().join("p.json");
    let out = run_mpi(2, &["bench", "primitives", "--sizes-mib", "1,2", "--reps", "1", "--json", json.to_str().unwrap()]);
    let (stdout, stderr) = text(&out);
    assert!(out.status.success(), "{stderr}");
    assert!(stdout.contains("floors:"), "{stdout}");
    let report: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    assert_eq!(report["bench"], "primitives");
    assert_eq!(report["machine"]["ranks"], 2);
    let rows = report["rows"].as_array().unwrap();
    for kind in ["extend", "destroy", "split", "merge", "p2p"] {
        assert_eq!(rows.iter().filter(|r| r["primitive"] == kind).count(), 2, "{kind} at each size");
    }
    for r in rows.iter().filter(|r| r["primitive"] == "extend") {
        assert_eq!(r["bytes_sent"], r["unit_bytes"], "Extend sends one copy: {r}");
    }
    let floors = report["floors"].as_array().unwrap();
    for name in ["merge_bytes_sent_with_resident_targets", "extend_bytes_sent_minus_one_unit", "split_bytes_sent_minus_missing_bytes"] {
        let f = floors.iter().find(|f| f["name"] == name).unwrap_or_else(|| panic!("floor {name} missing"));
        assert_eq!(f["ok"], true, "{f}");
    }
}

#[test]
fn bench_primitives_needs_two_ranks() {
    let out = run_mpi(1, &["bench", "primitives", "--sizes-mib", "1"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(text(&out).1.contains("at least 2 MPI ranks"));
}
