//! Plan pairs for the transition's tests and benchmarks: random valid pairs over a tiny model
//! (the property tests, `nereus bench transition-planning`'s small instances), and the planner's
//! own re-plans of a shipped job (its large instances, the core's criterion bench, the DAG
//! digests), with the state sizes and links they are planned with.

use rustc_hash::FxHashMap;
use std::cell::RefCell;
use std::collections::BTreeMap;

use crate::config::{Dtype, JobConfig};
use crate::cost::{Efficiencies, Hardware};
use crate::model::{shard_bytes, Position, Section};
use crate::model::{Architecture, Catalogue, Layout, OutputHead};
use crate::plan::{Candidate, ModelStage, Placement, Plan, Recompute, Role, Stage};
use crate::planner::{Planner, PlannerError};
use crate::rng::Rng;
use crate::transition::global::Links;
use crate::transition::{Coordination, TransitionDag};

/// PPO's model-stages.
pub const MODEL_STAGES: [(Role, Stage); 6] = [
    (Role::Actor, Stage::Generation),
    (Role::Reference, Stage::Inference),
    (Role::Reward, Stage::Inference),
    (Role::Critic, Stage::Inference),
    (Role::Actor, Stage::Training),
    (Role::Critic, Stage::Training),
];

/// The links of the random plan pairs: 4 devices a node, unbounded memory.
pub const SMALL_LINKS: Links = Links {
    devices_per_node: 4,
    intra_bytes_per_s: 100e9,
    inter_bytes_per_s: 10e9,
    memory_bytes_per_s: 1000e9,
    setup_seconds: 1e-4,
    capacity_bytes: u64::MAX,
    host_bytes_per_s: None,
    cores_per_node: None,
};

/// An 8-block bf16 model that every `tp, pp ∈ {1, 2, 4, 8}` can hold.
pub fn tiny_catalogue() -> Catalogue {
    Catalogue::new(Architecture {
        vocab: 64,
        hidden: 16,
        layers: 8,
        heads: 8,
        kv_heads: 8,
        head_dim: 2,
        ffn: 32,
        tie_embeddings: false,
        qk_norm: false,
        head: OutputHead::Lm,
        dtype: Dtype::Bf16,
    })
}

/// A random valid plan on `pool` ranks (`pool >= 3`): per stage, the ranks are shuffled and
/// handed out to its model-stages, each a random layout the catalogue accepts and a random DP.
pub fn random_plan(rng: &mut Rng, catalogue: &Catalogue, pool: u32) -> Plan {
    let mut placements = Vec::new();
    for stage in [Stage::Generation, Stage::Inference, Stage::Training] {
        let members: Vec<ModelStage> =
            MODEL_STAGES.iter().filter(|(_, s)| *s == stage).map(|&(r, s)| ModelStage::new(r, s)).collect();
        let mut free: Vec<i32> = (0..pool as i32).collect();
        rng.shuffle(&mut free);
        for (k, ms) in members.iter().enumerate() {
            let budget = free.len() - (members.len() - k - 1); // a rank for each later member
            let layouts: Vec<Layout> = [1, 2, 4, 8]
                .iter()
                .flat_map(|&tp| [1, 2, 4, 8].iter().map(move |&pp| Layout::new(tp, pp)))
                .filter(|l| l.size() as usize <= budget && catalogue.check_layout(*l).is_ok())
                .collect();
            let layout = *rng.pick(&layouts);
            let dp = 1 + rng.below(budget / layout.size() as usize) as u32;
            let ranks: Vec<i32> = free.drain(..(layout.size() * dp) as usize).collect();
            placements.push(Placement {
                candidate: Candidate { model_stage: *ms, layout, dp, recompute: Recompute::None, micro_batch: 1 },
                ranks,
            });
        }
    }
    Plan { placements }
}

/// `plan` with a random subset of its stages re-drawn (the others keep their placements).
pub fn perturbed(rng: &mut Rng, catalogue: &Catalogue, plan: &Plan, pool: u32) -> Plan {
    let fresh = random_plan(rng, catalogue, pool);
    let redraw: Vec<Stage> =
        [Stage::Generation, Stage::Inference, Stage::Training].into_iter().filter(|_| rng.below(2) == 0).collect();
    Plan {
        placements: plan
            .placements
            .iter()
            .zip(&fresh.placements)
            .map(|(old, new)| if redraw.contains(&old.candidate.model_stage.stage) { new.clone() } else { old.clone() })
            .collect(),
    }
}

/// A current plan and a perturbed target on `pool` ranks.
pub fn plan_pair(rng: &mut Rng, catalogue: &Catalogue, pool: u32) -> (Plan, Plan) {
    let from = random_plan(rng, catalogue, pool);
    let to = perturbed(rng, catalogue, &from, pool);
    (from, to)
}

/// The most state any rank holds under `plan`.
pub fn fullest_rank(plan: &Plan, bytes: &dyn Fn(ModelStage, Layout, Position) -> u64) -> u64 {
    let mut per_rank: std::collections::BTreeMap<i32, u64> = std::collections::BTreeMap::new();
    for p in &plan.placements {
        let layout = p.candidate.layout;
        for replica in p.ranks.chunks(layout.size() as usize) {
            for (k, &r) in replica.iter().enumerate() {
                *per_rank.entry(r).or_default() += bytes(p.candidate.model_stage, layout, layout.position(k));
            }
        }
    }
    per_rank.into_values().max().unwrap_or(0)
}

/// The smallest per-rank memory that holds both plans and at which the global DAG can schedule
/// the transition: the tightest setting in which coordination still succeeds.
pub fn tightest_capacity(
    from: &Plan,
    to: &Plan,
    bytes: &dyn Fn(ModelStage, Layout, Position) -> u64,
    links: &Links,
) -> u64 {
    let feasible = |c: u64| {
        TransitionDag::plan(from, to, bytes, &Links { capacity_bytes: c, ..*links }, Coordination::Global).is_ok()
    };
    let (mut lo, mut hi) = (fullest_rank(from, bytes).max(fullest_rank(to, bytes)).saturating_sub(1), 1u64 << 40);
    while lo + 1 < hi {
        let mid = lo + (hi - lo) / 2;
        if feasible(mid) {
            hi = mid
        } else {
            lo = mid
        }
    }
    hi
}

/// Per-position state bytes from the catalogues, memoized per (role, training, layout, stage):
/// the `bytes` every transition of the benchmarks is planned with.
pub struct Sizer {
    catalogues: BTreeMap<Role, Catalogue>,
    memo: RefCell<FxHashMap<(Role, bool, Layout, u32), u64>>,
}

impl Sizer {
    /// The job's own models.
    pub fn of(config: &JobConfig) -> Sizer {
        Sizer { catalogues: crate::planner::catalogues(config), memo: Default::default() }
    }

    /// The tiny model of the random plan pairs, in every role.
    pub fn tiny() -> Sizer {
        let tiny = tiny_catalogue();
        Sizer {
            catalogues: [Role::Actor, Role::Critic, Role::Reference, Role::Reward]
                .into_iter()
                .map(|r| (r, tiny.clone()))
                .collect(),
            memo: Default::default(),
        }
    }

    /// Bytes one position of a unit holds (TP positions of a pipeline stage hold equal shards).
    pub fn bytes(&self, ms: ModelStage, layout: Layout, position: Position) -> u64 {
        let key = (ms.role, ms.trains(), layout, position.pp);
        if let Some(b) = self.memo.borrow().get(&key) {
            return *b;
        }
        let c = &self.catalogues[&ms.role];
        let dtype = c.arch.dtype;
        let b =
            shard_bytes(&c.shard(layout, Position { tp: 0, pp: position.pp }), &Section::of(ms.trains(), dtype), dtype);
        self.memo.borrow_mut().insert(key, b);
        b
    }
}

/// The pool's links, each rank with room for its device's whole memory.
pub fn whole_memory_links(hw: &Hardware) -> Links {
    Links { capacity_bytes: hw.memory_bytes, ..Links::of(hw, None) }
}

/// Response tokens of the current plan of [`replanned_pair`]; the target's are 8 times as many.
pub const REPLANNED_FROM_LEN: u64 = 1024;

/// The planner the large instances re-plan from: `config`'s job on 8 GPUs at
/// [`REPLANNED_FROM_LEN`]-token responses.
pub fn base_planner(config: &JobConfig) -> Result<Planner, PlannerError> {
    Planner::new(config, 8, Some(REPLANNED_FROM_LEN), Efficiencies::default())
}

/// The planner's plans on `ranks` GPUs for 1K- and then 8K-token responses (the second
/// searched from the first), so that every model-stage changes layout.
pub fn replanned_pair(base: &Planner, ranks: u32) -> Result<(Plan, Plan), PlannerError> {
    let from = base.replanned(ranks, REPLANNED_FROM_LEN, Efficiencies::default())?.search(None)?.plan();
    let to = base.replanned(ranks, 8 * REPLANNED_FROM_LEN, Efficiencies::default())?.search(Some(&from))?.plan();
    Ok((from, to))
}
