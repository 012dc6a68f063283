//! Criterion benchmark of a replan (pure: no MPI): Llama-3.1-8B PPO on the H200 cluster at
//! 4K-token responses, from 32 to 16,384 GPUs. `nereus bench planner` reports the same with
//! peak memory and the floors.

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion};
use std::path::Path;

use nereus_core::config::{JobConfig, Overrides};
use nereus_core::cost::Efficiencies;
use nereus_core::planner::Planner;

fn replan(c: &mut Criterion) {
    let path = Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/../../configs/llama3.1-8b-ppo.toml"));
    let config =
        JobConfig::load(Some(path), &Overrides::default(), &mut Default::default).expect("shipped config loads");
    let base = Planner::new(&config, 8, Some(4096), Efficiencies::default()).expect("planner builds");
    let mut group = c.benchmark_group("replan");
    for gpus in [32u32, 1024, 16384] {
        group.bench_with_input(BenchmarkId::from_parameter(gpus), &gpus, |b, &gpus| {
            b.iter(|| {
                base.replanned(gpus, 4096, Efficiencies::default()).and_then(|p| p.search(None)).expect("a plan fits")
            });
        });
    }
    group.finish();
}

criterion_group!(benches, replan);
criterion_main!(benches);
