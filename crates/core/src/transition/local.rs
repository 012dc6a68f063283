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

/// The DAG through `sub`, phase by phase: Split the current units into `sub`, Extend the
/// sub-units no current unit already is, Destroy what no target needs, Merge each target.
/// Intermediate units of one model-stage may share ranks (memory is what the global schedule
/// checks); only the target units must be disjoint, as the plan says.
fn build(current: &[Unit], target: &[(Layout, Vec<i32>)], sub: Layout, next: &mut usize) -> LocalDag {
    let mut b = Builder { current, sub, first_new: *next, next, dag: LocalDag::default(), available: Vec::new() };
    b.split();
    let needed: Vec<Vec<Vec<i32>>> = target
        .iter()
        .map(|(layout, ranks)| if *layout == sub { vec![ranks.clone()] } else { split_ranks_of(*layout, ranks, sub) })
        .collect();
    let flat: Vec<&[i32]> = needed.iter().flatten().map(Vec::as_slice).collect();
    let kept = b.kept(&flat);
    let (producer, feeds) = b.extend(&flat, &kept);
    b.destroy(&kept, &feeds);
    b.merge(target, &needed, &producer, &feeds);
    b.dag
}

/// A unit and the node that made it (`None`: it existed before the transition).
type Made = (UnitId, Option<usize>);

/// One model-stage's local DAG under construction.
struct Builder<'a> {
    current: &'a [Unit],
    sub: Layout,
    /// The id of the first unit this DAG creates (current units have consecutive ids below).
    first_new: usize,
    next: &'a mut usize,
    dag: LocalDag,
    /// Sub-units available after the Splits.
    available: Vec<Made>,
}

impl Builder<'_> {
    fn fresh(&mut self, layout: Layout, ranks: Vec<i32>) -> UnitId {
        let id = UnitId(*self.next);
        *self.next += 1;
        self.dag.units.push(Unit { id, model_stage: self.current[0].model_stage, layout, ranks });
        id
    }

    fn ranks_of(&self, id: UnitId) -> &[i32] {
        if id.0 >= self.first_new {
            &self.dag.units[id.0 - self.first_new].ranks
        } else {
            &self.current[id.0 - self.current[0].id.0].ranks
        }
    }

    /// Split: every current unit not already in `sub` becomes its sub-units.
    fn split(&mut self) {
        for c in self.current {
            if c.layout == self.sub {
                self.available.push((c.id, None));
                continue;
            }
            let node = self.dag.nodes.len();
            let parts: Vec<UnitId> =
                split_ranks_of(c.layout, &c.ranks, self.sub).into_iter().map(|r| self.fresh(self.sub, r)).collect();
            self.available.extend(parts.iter().map(|&id| (id, Some(node))));
            self.dag.nodes.push(Primitive::Split { source: c.id, parts });
        }
    }

    /// Per available sub-unit: which needed sub-unit (index into `flat`) it already is.
    fn kept(&self, flat: &[&[i32]]) -> Vec<Option<usize>> {
        let slot: HashMap<&[i32], usize> = flat.iter().enumerate().map(|(k, r)| (*r, k)).collect();
        self.available.iter().map(|(id, _)| slot.get(self.ranks_of(*id)).copied()).collect()
    }

    /// Extend: each needed sub-unit nobody is yet, copied from an available one in rotation
    /// (kept units first: they outlive the transition). Returns who produces each needed
    /// sub-unit and, per available unit, the Extends it feeds.
    fn extend(&mut self, flat: &[&[i32]], kept: &[Option<usize>]) -> (Vec<Made>, Vec<Vec<usize>>) {
        let mut producer: Vec<Option<Made>> = vec![None; flat.len()];
        for (i, k) in kept.iter().enumerate() {
            if let Some(k) = k {
                producer[*k] = Some(self.available[i]);
            }
        }
        let mut ordered: Vec<usize> = (0..self.available.len()).filter(|&i| kept[i].is_some()).collect();
        ordered.extend((0..self.available.len()).filter(|&i| kept[i].is_none()));
        let mut feeds: Vec<Vec<usize>> = vec![Vec::new(); self.available.len()];
        let mut rotation = 0;
        for (k, ranks) in flat.iter().enumerate() {
            if producer[k].is_some() {
                continue;
            }
            let src = ordered[rotation % ordered.len()];
            rotation += 1;
            let copy = self.fresh(self.sub, ranks.to_vec());
            let node = self.dag.nodes.len();
            self.dag.nodes.push(Primitive::Extend { source: self.available[src].0, copy });
            if let Some(split) = self.available[src].1 {
                self.dag.edges.push((split, node));
            }
            feeds[src].push(node);
            producer[k] = Some((copy, Some(node)));
        }
        (producer.into_iter().map(|p| p.expect("every needed unit is produced")).collect(), feeds)
    }

    /// Destroy what no target needs, after the Extends it feeds.
    fn destroy(&mut self, kept: &[Option<usize>], feeds: &[Vec<usize>]) {
        for (i, &(id, made_by)) in self.available.iter().enumerate() {
            if kept[i].is_some() {
                continue;
            }
            let node = self.dag.nodes.len();
            self.dag.nodes.push(Primitive::Destroy { unit: id });
            if let Some(split) = made_by {
                self.dag.edges.push((split, node));
            }
            for &extend in &feeds[i] {
                self.dag.edges.push((extend, node));
            }
        }
    }

    /// Merge each target from its parts (a target in `sub` is its one part).
    fn merge(
        &mut self,
        target: &[(Layout, Vec<i32>)],
        needed: &[Vec<Vec<i32>>],
        producer: &[Made],
        feeds: &[Vec<usize>],
    ) {
        let index_of: HashMap<UnitId, usize> = self.available.iter().enumerate().map(|(i, (id, _))| (*id, i)).collect();
        let mut k = 0;
        for ((layout, ranks), parts) in target.iter().zip(needed) {
            let part_ids = &producer[k..k + parts.len()];
            k += parts.len();
            if *layout == self.sub {
                self.dag.targets.push(part_ids[0].0);
                continue;
            }
            let merged = self.fresh(*layout, ranks.clone());
            let part_ranks: Vec<&[i32]> = parts.iter().map(Vec::as_slice).collect();
            debug_assert_eq!(merge_ranks_of(self.sub, &part_ranks, *layout), *ranks);
            let node = self.dag.nodes.len();
            self.dag.nodes.push(Primitive::Merge { parts: part_ids.iter().map(|(id, _)| *id).collect(), merged });
            for (part, made_by) in part_ids {
                if let Some(n) = made_by {
                    self.dag.edges.push((*n, node));
                }
                // A kept part may also be an Extend's source: the Merge consumes it only after.
                if let Some(&i) = index_of.get(part) {
                    for &extend in &feeds[i] {
                        self.dag.edges.push((extend, node));
                    }
                }
            }
            self.dag.targets.push(merged);
        }
    }
}
