//! Property tests over random plan pairs, and the Nereus paper's example.

use super::*;
use crate::config::Dtype;
use crate::emu::{shard_bytes, Section};
use crate::model::Catalogue;
use crate::plan::{Candidate, Placement, Recompute, Role};
use crate::runtime::Rng;
use crate::transition::testing::{plan_pair, tiny_catalogue};
use petgraph::algo::is_cyclic_directed;
use petgraph::visit::EdgeRef;
use std::collections::BTreeSet;

fn catalogue() -> Catalogue {
    tiny_catalogue()
}

fn sizer(c: &Catalogue) -> impl Fn(ModelStage, Layout, Position) -> u64 + '_ {
    move |ms, layout, position| {
        shard_bytes(&c.shard(layout, position), &Section::of(ms.trains(), Dtype::Bf16), Dtype::Bf16)
    }
}

fn random_plan(rng: &mut Rng, pool: u32) -> Plan {
    crate::transition::testing::random_plan(rng, &catalogue(), pool)
}

fn links(capacity: u64) -> Links {
    Links {
        devices_per_node: 4,
        intra_bytes_per_s: 100e9,
        inter_bytes_per_s: 10e9,
        memory_bytes_per_s: 1000e9,
        setup_seconds: 1e-3,
        capacity_bytes: capacity,
    }
}

/// Replays the schedule and checks memory, rank ownership and the final units.
fn replay(dag: &TransitionDag, target: &Plan, bytes: &dyn Fn(ModelStage, Layout, Position) -> u64, capacity: u64) {
    let mut usage: BTreeMap<i32, u64> = BTreeMap::new();
    let mut alive: BTreeSet<UnitId> = dag.initial.iter().copied().collect();
    for id in &alive {
        for (r, b) in per_rank(&dag.units[id], bytes) {
            *usage.entry(r).or_default() += b;
        }
    }
    let position: BTreeMap<usize, usize> = dag.schedule.order.iter().enumerate().map(|(k, &i)| (i, k)).collect();
    for e in dag.graph.edge_indices() {
        let (a, b) = dag.graph.edge_endpoints(e).unwrap();
        assert!(position[&a.index()] < position[&b.index()], "the order respects every edge");
    }
    for &i in &dag.schedule.order {
        let node = &dag.graph[NodeIndex::new(i)];
        let label = dag.label(i);
        for &(r, b) in &node.acquire {
            *usage.entry(r).or_default() += b;
            assert!(usage[&r] <= capacity, "{label}: rank {r} over capacity");
        }
        for &(r, b) in &node.release {
            *usage.get_mut(&r).unwrap() -= b;
        }
        if let Primitive::Extend { source, .. } = &node.primitive {
            assert!(alive.contains(source), "{label} copies a unit that no longer exists");
        }
        node.primitive.frees().iter().for_each(|id| assert!(alive.remove(id), "{label} frees a dead unit"));
        alive.extend(node.primitive.creates().iter().copied());
        // No rank is held by two model-stages of one stage.
        let mut owner: BTreeMap<(Stage, i32), ModelStage> = BTreeMap::new();
        for id in &alive {
            let u = &dag.units[id];
            for &r in &u.ranks {
                let prev = owner.insert((u.model_stage.stage, r), u.model_stage);
                assert!(
                    prev.is_none_or(|p| p == u.model_stage),
                    "after {label}: rank {r} held by {} and {}",
                    prev.unwrap(),
                    u.model_stage
                );
            }
        }
    }
    for p in &target.placements {
        let ms = p.candidate.model_stage;
        let mut want: Vec<(Layout, Vec<i32>)> =
            (0..p.candidate.dp as usize).map(|r| (p.candidate.layout, p.replica(r).to_vec())).collect();
        let mut got: Vec<(Layout, Vec<i32>)> = alive
            .iter()
            .map(|id| &dag.units[id])
            .filter(|u| u.model_stage == ms)
            .map(|u| (u.layout, u.ranks.clone()))
            .collect();
        want.sort();
        got.sort();
        assert_eq!(got, want, "{ms} reaches exactly its target units");
    }
}

#[test]
fn random_plan_pairs_give_acyclic_memory_safe_dags_that_reach_the_target() {
    let c = catalogue();
    let bytes = sizer(&c);
    let (mut planned, mut refused, mut with_resource_edges) = (0, 0, 0);
    for case in 0..400 {
        let mut rng = Rng::new(case);
        let pool = 3 + rng.below(62) as u32;
        let (from, to) = plan_pair(&mut rng, &c, pool);
        let initial: u64 = (0..pool as i32)
            .map(|r| {
                from.placements
                    .iter()
                    .map(|p| {
                        p.ranks.iter().position(|x| *x == r).map_or(0, |k| {
                            let size = p.candidate.layout.size() as usize;
                            bytes(p.candidate.model_stage, p.candidate.layout, p.candidate.layout.position(k % size))
                        })
                    })
                    .sum::<u64>()
            })
            .max()
            .unwrap();
        let capacity = initial * (2 + rng.below(3) as u64);
        match TransitionDag::plan(&from, &to, &bytes, &links(capacity), true) {
            Ok(dag) => {
                assert!(!is_cyclic_directed(&dag.graph), "case {case}");
                replay(&dag, &to, &bytes, capacity);
                assert!(dag.schedule.seconds >= 0.0);
                planned += 1;
                with_resource_edges += usize::from(dag.resource_edges > 0);
            }
            // Refusals are swaps (two model-stages of a stage trading ranks, each Destroy waiting
            // for the other's) or a T_sub too large for a rank: rejected before any move.
            Err(TransitionError::Blocked { .. }) => refused += 1,
            Err(e) => panic!("case {case}: {e}"),
        }
    }
    assert!(
        planned >= 150 && with_resource_edges >= 50 && refused > 0,
        "planned {planned}, refused {refused}, with resource edges {with_resource_edges}"
    );
}

#[test]
fn an_unchanged_plan_has_no_nodes() {
    let c = catalogue();
    let mut rng = Rng::new(7);
    let plan = random_plan(&mut rng, 16);
    let dag = TransitionDag::plan(&plan, &plan, &sizer(&c), &links(u64::MAX), true).unwrap();
    assert_eq!(dag.graph.node_count(), 0);
    assert_eq!(dag.schedule.seconds, 0.0);
}

/// The paper's example: reward inference goes from (TP 4, PP 8) to (TP 8, PP 2) and frees
/// ranks 16–31, onto which reference and critic inference Extend — after it releases them.
#[test]
fn the_paper_example_orders_extends_after_the_release() {
    let c = catalogue();
    let ms = |r| ModelStage::new(r, Stage::Inference);
    let place = |r, tp, pp, ranks: Vec<i32>| {
        let dp = ranks.len() as u32 / (tp * pp);
        Placement {
            candidate: Candidate {
                model_stage: ms(r),
                layout: Layout::new(tp, pp),
                dp,
                recompute: Recompute::None,
                micro_batch: 1,
            },
            ranks,
        }
    };
    let from = Plan {
        placements: vec![
            place(Role::Reward, 4, 8, (0..32).collect()),
            place(Role::Reference, 8, 1, (32..40).collect()),
            place(Role::Critic, 8, 1, (40..48).collect()),
        ],
    };
    let to = Plan {
        placements: vec![
            place(Role::Reward, 8, 2, (0..16).collect()),
            place(Role::Reference, 8, 1, (32..40).chain(16..24).collect()),
            place(Role::Critic, 8, 1, (40..48).chain(24..32).collect()),
        ],
    };
    let bytes = sizer(&c);
    let dag = TransitionDag::plan(&from, &to, &bytes, &links(u64::MAX), true).unwrap();
    replay(&dag, &to, &bytes, u64::MAX);
    assert!(dag.resource_edges >= 2, "both Extends wait for the reward model's release: {}", dag.resource_edges);
    for name in ["Extend reference", "Extend critic"] {
        let extend = dag
            .graph
            .node_indices()
            .find(|&i| dag.label(i.index()).starts_with(name))
            .unwrap_or_else(|| panic!("no {name}"));
        let waits_for_reward = dag
            .graph
            .edges_directed(extend, Direction::Incoming)
            .any(|e| *e.weight() == EdgeKind::Resource && dag.graph[e.source()].model_stage.role == Role::Reward);
        assert!(waits_for_reward, "{name} has a resource edge from the reward model's release");
        let timing = dag.schedule.timings.iter().find(|t| t.node == extend.index()).unwrap();
        assert!(timing.start > 0.0, "{name} starts after the reward model has moved");
    }
}
