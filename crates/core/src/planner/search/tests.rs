//! The DP against the exhaustive search, memory bounds, rank assignment and stability.

use super::*;
use crate::config::{JobConfig, Overrides};
use crate::cost::Efficiencies;
use crate::plan::{Recompute, Role};
use crate::planner::testing::{tiny, tiny_jobs_and_llama};
use crate::rng::Rng;

#[test]
fn stage_solutions_match_the_exhaustive_optimum_and_every_rank_fits() {
    let mut agreed = 0;
    let mut infeasible = 0;
    for case in 0..300 {
        let mut rng = Rng::new(case);
        let config = tiny(&mut rng);
        let gpus = 1 + rng.below(8) as u32;
        let planner = Planner::new(&config, gpus, None, Efficiencies::default()).unwrap();
        // The frontier and the stage solver lose nothing against every candidate combination.
        let (fast, slow) = (planner.stage_optima(), planner.exhaustive());
        match (fast, slow) {
            (Some(a), Some(b)) => {
                assert!((a - b).abs() <= 1e-12 * b.max(1.0), "case {case}: stages {a} vs exhaustive {b}")
            }
            (None, None) => {}
            other => panic!("case {case}: {other:?}"),
        }
        // Whatever the search returns keeps every rank within memory, placement-exact.
        match planner.search(None) {
            Ok(job) => {
                job.plan().validate(gpus).unwrap();
                let usable = planner.cost().hardware.usable_bytes();
                let peaks = planner.rank_peaks(&job.plan());
                assert!(peaks.over(usable).is_empty(), "case {case}: ranks {:?} over {usable}", peaks.over(usable));
                assert_eq!(peaks, job.rank_peaks);
                assert_eq!(job.step_latency_s, planner.predict(&job.plan()));
                for m in &job.model_stages {
                    assert_eq!(m.estimate, planner.estimate(&m.placement.candidate));
                }
                agreed += 1;
            }
            Err(_) => infeasible += 1,
        }
    }
    assert!(agreed >= 150 && infeasible > 0, "planned {agreed}, infeasible {infeasible}: the cases must exercise both");
}

#[test]
fn tp_groups_stay_inside_nodes_and_a_replan_keeps_the_plan() {
    let config = JobConfig::load(
        Some(std::path::Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/../../configs/llama3.1-8b-ppo.toml"))),
        &Overrides::default(),
        &mut || unreachable!(),
    )
    .unwrap();
    for gpus in [8, 16, 64, 256] {
        let planner = Planner::new(&config, gpus, Some(2048), Efficiencies::default()).unwrap();
        let job = planner.search(None).unwrap();
        let plan = job.plan();
        plan.validate(gpus).unwrap();
        let per_node = config.cluster.devices_per_node as i32;
        for p in &plan.placements {
            let tp = p.candidate.layout.tp as usize;
            for group in p.ranks.chunks(tp) {
                assert!(
                    group.iter().all(|r| r / per_node == group[0] / per_node),
                    "{gpus} GPUs: TP group {group:?} spans nodes"
                );
            }
        }
        let again = planner.search(Some(&plan)).unwrap();
        assert_eq!(again.plan(), plan, "replanning with nothing changed must not move anything");
        assert_eq!(planner.predict(&plan), job.step_latency_s);
        // Replanned for 8K tokens from the 2K plan: never slower than keeping it, when it still
        // fits every rank.
        let longer = planner.replanned(gpus, 8192, Efficiencies::default()).unwrap();
        let best = longer.search(Some(&plan)).unwrap().step_latency_s;
        if longer.rank_peaks(&plan).max().0 <= longer.cost().hardware.usable_bytes() {
            assert!(longer.predict(&plan) >= best, "{gpus} GPUs");
        }
    }
}

#[test]
fn the_training_plan_moves_as_sequences_grow() {
    let config = JobConfig::load(
        Some(std::path::Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/../../configs/llama3.1-8b-ppo.toml"))),
        &Overrides::default(),
        &mut || unreachable!(),
    )
    .unwrap();
    let actor_training = |len| {
        let job = Planner::new(&config, 64, Some(len), Efficiencies::default()).unwrap().search(None).unwrap();
        job.model_stages
            .iter()
            .find(|m| m.placement.candidate.model_stage == ModelStage::new(Role::Actor, Stage::Training))
            .unwrap()
            .placement
            .candidate
    };
    let (short, long) = (actor_training(1024), actor_training(8192));
    assert_ne!((short.layout, short.dp, short.recompute), (long.layout, long.dp, long.recompute));
}

#[test]
fn an_impossible_pool_says_what_would_fit() {
    let mut config = JobConfig::load(
        Some(std::path::Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/../../configs/llama3.1-8b-ppo.toml"))),
        &Overrides::default(),
        &mut || unreachable!(),
    )
    .unwrap();
    config.cluster.device_memory_gb = 24.0;
    let err = Planner::new(&config, 2, Some(8192), Efficiencies::default()).unwrap().search(None).unwrap_err();
    let message = err.to_string();
    assert!(message.contains("no plan fits 2 GPUs"), "{message}");
    assert!(message.contains("GPUs would fit") || message.contains("tokens would fit"), "{message}");
    // The hint names the smallest pool that fits, not the next power of two.
    let hinted: u32 = message
        .split(" GPUs would fit")
        .next()
        .and_then(|before| before.rsplit(' ').next())
        .and_then(|n| n.parse().ok())
        .expect("a GPU count in the hint");
    let fits =
        |gpus: u32| Planner::new(&config, gpus, Some(8192), Efficiencies::default()).unwrap().search(None).is_ok();
    assert!(fits(hinted) && !fits(hinted - 1), "{message}");
    assert!(!message.contains("0.0 GB"), "{message}");
}

#[test]
fn the_seconds_floor_is_under_every_variant_of_a_layout() {
    // Every layout, replica count, micro-batch (or decode wave) and recomputation of random tiny
    // jobs and of Llama-3.1-8B on H200, on both engines: the floor the frontier skips layouts
    // by is never above a variant's predicted seconds.
    let mut checked = 0;
    for (mut config, gpus) in tiny_jobs_and_llama(1000, 40, 64) {
        for plane in [crate::config::DataPlane::Mpi, crate::config::DataPlane::Nccl] {
            config.cluster.data_plane = plane;
            let planner = Planner::new(&config, gpus, None, Efficiencies::default()).unwrap();
            let per_node = planner.cost().hardware.devices_per_node;
            for &ms in planner.model_stages() {
                let cost = planner.job.stage_cost(ms);
                let powers = |limit: u32| (0..6).map(|k| 1u32 << k).filter(move |&x| x <= limit);
                for (tp, pp) in powers(per_node).flat_map(|tp| powers(4).map(move |pp| (tp, pp))) {
                    let layout = Layout::new(tp, pp);
                    if planner.catalogue(ms.role).check_layout(layout).is_err() {
                        continue;
                    }
                    for dp in [1, 2, 3, 4] {
                        let base =
                            Candidate { model_stage: ms, layout, dp, recompute: Recompute::None, micro_batch: 1 };
                        let floor = cost.seconds_floor(&base);
                        for micro_batch in [1, 2, 3, 4, 8, 64, 1 << 20] {
                            for recompute in [Recompute::None, Recompute::Selective, Recompute::Full] {
                                let c = Candidate { micro_batch, recompute, ..base };
                                let seconds = planner
                                    .cost()
                                    .latency(&planner.job.models[&ms.role].stats, &c, planner.workload(ms))
                                    .seconds(&planner.cost().efficiencies);
                                assert!(floor <= seconds * (1.0 + 1e-12), "{c:?}: floor {floor} over {seconds}");
                                checked += 1;
                            }
                        }
                    }
                }
            }
        }
    }
    assert!(checked > 10_000, "only {checked} variants checked");
}
