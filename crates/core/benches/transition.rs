//! Criterion benchmark of transition planning (pure: no MPI): building, scheduling and costing
//! the global DAG of Llama-3.1-8B PPO on the H200 cluster re-planned from 1K- to 8K-token
//! responses, at 64, 1,024 and 16,384 ranks. `nereus bench transition-planning` reports the
//! same instances with the floors.

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion};
use std::path::Path;

use nereus_core::config::{JobConfig, Overrides};
use nereus_core::cost::Hardware;
use nereus_core::model::{Layout, Position};
use nereus_core::plan::ModelStage;
use nereus_core::transition::testing::{base_planner, replanned_pair, whole_memory_links, Sizer};
use nereus_core::transition::{Coordination, TransitionDag};

fn transition_planning(c: &mut Criterion) {
    let path = Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/../../configs/llama3.1-8b-ppo.toml"));
    let config =
        JobConfig::load(Some(path), &Overrides::default(), &mut Default::default).expect("shipped config loads");
    let base = base_planner(&config).expect("planner builds");
    let sizer = Sizer::of(&config);
    let bytes = |ms: ModelStage, l: Layout, p: Position| sizer.bytes(ms, l, p);
    let mut group = c.benchmark_group("transition_planning");
    for ranks in [64u32, 1024, 16384] {
        let (from, to) = replanned_pair(&base, ranks).expect("the planner plans both lengths");
        let links = whole_memory_links(&Hardware::new(&config.cluster, ranks, 0.0));
        group.bench_with_input(BenchmarkId::from_parameter(ranks), &ranks, |b, _| {
            // Dropping the DAG is not part of planning (`nereus bench transition-planning` does
            // not time it either).
            b.iter_with_large_drop(|| {
                TransitionDag::plan(&from, &to, &bytes, &links, Coordination::Global).expect("the transition plans")
            });
        });
    }
    group.finish();
}

criterion_group!(benches, transition_planning);
criterion_main!(benches);
