//! Local DAGs: the primitives that turn one model-stage's current units into its target units.

use rustc_hash::{FxHashMap as HashMap, FxHashSet as HashSet};
use serde::{Deserialize, Serialize};

use crate::model::Layout;
use crate::model::{merge_ranks_of, split_ranks_of};
use crate::plan::{ModelStage, Placement};

/// Identifier of a unit (an EMU before, during or after the transition).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct UnitId(pub usize);

/// A unit: one replica of one model-stage with a layout and ordered ranks.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Unit {
    /// Identifier.
    pub id: UnitId,
    /// Its model-stage.
    pub model_stage: ModelStage,
    /// Layout.
    pub layout: Layout,
    /// Ordered ranks (TP-fastest).
    pub ranks: Vec<i32>,
}

/// One primitive of a transition.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum Primitive {
    /// Split `source` into `parts` (layout `T_sub`) on the same ranks.
    Split {
        /// The unit split.
        source: UnitId,
        /// The units made.
        parts: Vec<UnitId>,
    },
    /// Free `unit`.
    Destroy {
        /// The unit.
        unit: UnitId,
    },
    /// Copy `source` onto new ranks as `copy`.
    Extend {
        /// The unit copied.
        source: UnitId,
        /// The new replica.
        copy: UnitId,
    },
    /// Merge `parts` into `merged`.
    Merge {
        /// The units merged, in `merge_ranks` order.
        parts: Vec<UnitId>,
        /// The unit made.
        merged: UnitId,
    },
}

impl Primitive {
    /// Units this primitive creates.
    pub fn creates(&self) -> &[UnitId] {
        match self {
            Primitive::Split { parts, .. } => parts,
            Primitive::Extend { copy, .. } => std::slice::from_ref(copy),
            Primitive::Merge { merged, .. } => std::slice::from_ref(merged),
            Primitive::Destroy { .. } => &[],
        }
    }

    /// Units this primitive frees when it completes.
    pub fn frees(&self) -> &[UnitId] {
        match self {
            Primitive::Split { source, .. } => std::slice::from_ref(source),
            Primitive::Merge { parts, .. } => parts,
            Primitive::Destroy { unit } => std::slice::from_ref(unit),
            Primitive::Extend { .. } => &[],
        }
    }

    /// Short name.
    pub fn kind(&self) -> &'static str {
        match self {
            Primitive::Split { .. } => "Split",
            Primitive::Destroy { .. } => "Destroy",
            Primitive::Extend { .. } => "Extend",
            Primitive::Merge { .. } => "Merge",
        }
    }
}

/// A local DAG: primitives of one model-stage and the edges between them (indices into
/// `nodes`), plus every unit it mentions.
#[derive(Debug, Clone, Default)]
pub struct LocalDag {
    /// Primitives.
    pub nodes: Vec<Primitive>,
    /// `(before, after)` pairs.
    pub edges: Vec<(usize, usize)>,
    /// Units created by the DAG.
    pub units: Vec<Unit>,
    /// Target units, as they will exist at the end (ids of kept or created units).
    pub targets: Vec<UnitId>,
}

fn gcd(a: u32, b: u32) -> u32 {
    if b == 0 {
        a
    } else {
        gcd(b, a % b)
    }
}

/// Units of a placement, one per replica.
pub fn units_of(placement: &Placement, next: &mut usize) -> Vec<Unit> {
    let c = placement.candidate;
    (0..c.dp as usize)
        .map(|r| {
            *next += 1;
            Unit {
                id: UnitId(*next - 1),
                model_stage: c.model_stage,
                layout: c.layout,
                ranks: placement.replica(r).to_vec(),
            }
        })
        .collect()
}

/// Builds the local DAG turning `current` units into units laid out as `target`
/// (`(layout, ranks)` per replica); new unit ids come from `next`.
pub fn local_dag(current: &[Unit], target: &[(Layout, Vec<i32>)], next: &mut usize) -> LocalDag {
    let goal: HashSet<(Layout, &Vec<i32>)> = target.iter().map(|(l, r)| (*l, r)).collect();
    let unchanged = current.len() == target.len() && current.iter().all(|c| goal.contains(&(c.layout, &c.ranks)));
    if unchanged {
        return LocalDag { targets: current.iter().map(|c| c.id).collect(), ..LocalDag::default() };
    }
    let (t, t_star) = (current[0].layout, target[0].0);
    let sub = Layout::new(gcd(t.tp, t_star.tp), gcd(t.pp, t_star.pp));
    build(current, target, sub, next)
}

/// The DAG through `sub`. Intermediate units of one model-stage may share ranks (memory is
/// what the global schedule checks); only the target units must be disjoint, as the plan says.
fn build(current: &[Unit], target: &[(Layout, Vec<i32>)], sub: Layout, next: &mut usize) -> LocalDag {
    let ms = current[0].model_stage;
    let first_new = *next;
    let mut dag = LocalDag::default();
    let fresh = |layout: Layout, ranks: Vec<i32>, dag: &mut LocalDag, next: &mut usize| {
        let id = UnitId(*next);
        *next += 1;
        dag.units.push(Unit { id, model_stage: ms, layout, ranks });
        id
    };
    // Split: available sub-units, each with the node that made it (None: it existed).
    let mut available: Vec<(UnitId, Option<usize>)> = Vec::new();
    for c in current {
        if c.layout == sub {
            available.push((c.id, None));
            continue;
        }
        let node = dag.nodes.len();
        let parts: Vec<UnitId> =
            split_ranks_of(c.layout, &c.ranks, sub).into_iter().map(|r| fresh(sub, r, &mut dag, next)).collect();
        available.extend(parts.iter().map(|&id| (id, Some(node))));
        dag.nodes.push(Primitive::Split { source: c.id, parts });
    }
    // Needed sub-units, per target and flattened; which available unit already is one.
    let needed: Vec<Vec<Vec<i32>>> = target
        .iter()
        .map(|(layout, ranks)| if *layout == sub { vec![ranks.clone()] } else { split_ranks_of(*layout, ranks, sub) })
        .collect();
    let flat: Vec<&[i32]> = needed.iter().flatten().map(Vec::as_slice).collect();
    let slot: HashMap<&[i32], usize> = flat.iter().enumerate().map(|(k, r)| (*r, k)).collect();
    // Current units have consecutive ids, new ones continue from `first_new`.
    let ranks_of = |id: UnitId| -> &[i32] {
        if id.0 >= first_new {
            &dag.units[id.0 - first_new].ranks
        } else {
            &current[id.0 - current[0].id.0].ranks
        }
    };
    let kept: Vec<Option<usize>> = available.iter().map(|(id, _)| slot.get(ranks_of(*id)).copied()).collect();
    // Who produces each needed unit: a kept unit, or an Extend.
    let mut producer: Vec<Option<(UnitId, Option<usize>)>> = vec![None; flat.len()];
    for (i, k) in kept.iter().enumerate() {
        if let Some(k) = k {
            producer[*k] = Some(available[i]);
        }
    }
    // Sources for Extends: kept units first (they outlive the transition), then the others.
    let mut ordered: Vec<usize> = (0..available.len()).filter(|&i| kept[i].is_some()).collect();
    ordered.extend((0..available.len()).filter(|&i| kept[i].is_none()));
    let mut feeds: Vec<Vec<usize>> = vec![Vec::new(); available.len()]; // Extend nodes per source
    let mut rotation = 0;
    for (k, ranks) in flat.iter().enumerate() {
        if producer[k].is_some() {
            continue;
        }
        let src = ordered[rotation % ordered.len()];
        rotation += 1;
        let copy = fresh(sub, ranks.to_vec(), &mut dag, next);
        let node = dag.nodes.len();
        dag.nodes.push(Primitive::Extend { source: available[src].0, copy });
        if let Some(split) = available[src].1 {
            dag.edges.push((split, node));
        }
        feeds[src].push(node);
        producer[k] = Some((copy, Some(node)));
    }
    // Destroy what no target needs, after the Extends it feeds.
    for (i, (id, made_by)) in available.iter().enumerate() {
        if kept[i].is_some() {
            continue;
        }
        let node = dag.nodes.len();
        dag.nodes.push(Primitive::Destroy { unit: *id });
        if let Some(split) = made_by {
            dag.edges.push((*split, node));
        }
        for &extend in &feeds[i] {
            dag.edges.push((extend, node));
        }
    }
    // Merge each target from its parts.
    let index_of: HashMap<UnitId, usize> = available.iter().enumerate().map(|(i, (id, _))| (*id, i)).collect();
    let mut k = 0;
    for ((layout, ranks), parts) in target.iter().zip(&needed) {
        let part_ids: Vec<(UnitId, Option<usize>)> =
            (k..k + parts.len()).map(|j| producer[j].expect("every needed unit is produced")).collect();
        k += parts.len();
        if *layout == sub {
            dag.targets.push(part_ids[0].0);
            continue;
        }
        let merged = fresh(*layout, ranks.clone(), &mut dag, next);
        debug_assert_eq!(merge_ranks_of(sub, &parts.iter().map(|p| p.as_slice()).collect::<Vec<_>>(), *layout), *ranks);
        let node = dag.nodes.len();
        dag.nodes.push(Primitive::Merge { parts: part_ids.iter().map(|(id, _)| *id).collect(), merged });
        for (part, made_by) in &part_ids {
            if let Some(n) = made_by {
                dag.edges.push((*n, node));
            }
            // A kept part may also be an Extend's source: the Merge consumes it only after.
            if let Some(&i) = index_of.get(part) {
                for &extend in &feeds[i] {
                    dag.edges.push((extend, node));
                }
            }
        }
        dag.targets.push(merged);
    }
    dag
}
