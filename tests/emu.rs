//! EMU primitives under `mpirun -n 8`: random sequences on random tiny models, every step
//! checked by digests, a byte-exact gather, and refusals that leave state intact.

mod common;

use common::selftest_summary;

#[test]
fn random_primitive_sequences_lose_and_change_nothing_on_8_ranks() {
    for seed in ["1", "2"] {
        let summary = selftest_summary("primitives", "40", seed);
        for kind in ["split", "merge", "extend", "destroy"] {
            assert!(summary["executed"][kind].as_u64().unwrap_or(0) > 0, "seed {seed}: no {kind} ran: {summary}");
        }
        for refusal in ["destroy-last-replica", "no-room"] {
            assert!(
                summary["refusals"][refusal].as_u64().unwrap_or(0) > 0,
                "seed {seed}: no {refusal} drill: {summary}"
            );
        }
        assert!(summary["gathers"].as_u64().unwrap() >= 40 * 9, "a byte-exact gather after every step");
        assert!(summary["bytes_sent"].as_u64().unwrap() > 0);
        assert_eq!(summary["group_checks"], 1, "disjoint groups formed and ran collectives");
    }
}
