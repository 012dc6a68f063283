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
    /// Copy the parameters of `source` into `target`, an existing unit of another model-stage of
    /// the same model that does not train, resharding between their layouts: the weight sync
    /// (training into generation or inference). Both units stay; nothing is allocated but pack
    /// buffers.
    Sync {
        /// The unit whose parameters are copied (a training replica).
        source: UnitId,
        /// The unit whose parameters are overwritten.
        target: UnitId,
    },
}

impl Primitive {
    /// Units this primitive creates.
    pub fn creates(&self) -> &[UnitId] {
        match self {
            Primitive::Split { parts, .. } => parts,
            Primitive::Extend { copy, .. } => std::slice::from_ref(copy),
            Primitive::Merge { merged, .. } => std::slice::from_ref(merged),
            Primitive::Destroy { .. } | Primitive::Sync { .. } => &[],
        }
    }

    /// Units this primitive frees when it completes.
    pub fn frees(&self) -> &[UnitId] {
        match self {
            Primitive::Split { source, .. } => std::slice::from_ref(source),
            Primitive::Merge { parts, .. } => parts,
            Primitive::Destroy { unit } => std::slice::from_ref(unit),
            Primitive::Extend { .. } | Primitive::Sync { .. } => &[],
        }
    }

    /// Short name.
    pub fn kind(&self) -> &'static str {
        match self {
            Primitive::Split { .. } => "Split",
            Primitive::Destroy { .. } => "Destroy",
            Primitive::Extend { .. } => "Extend",
            Primitive::Merge { .. } => "Merge",
            Primitive::Sync { .. } => "Sync",
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
    /// Units looked at while building it, counted by each phase as it goes (a unit counts each
    /// time a phase looks at it): its share of the transition's
    /// [`BuildWork`](super::global::BuildWork).
    pub unit_visits: u64,
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
pub fn local_dag(current: &[Unit], target: &[(Layout, &[i32])], next: &mut usize) -> LocalDag {
    // Different numbers of units cannot be the same units: no set to build then.
    let unchanged = current.len() == target.len() && {
        let goal: HashSet<(Layout, &[i32])> = target.iter().copied().collect();
        current.iter().all(|c| goal.contains(&(c.layout, c.ranks.as_slice())))
    };
    if unchanged {
        let unit_visits = (current.len() + target.len()) as u64;
        return LocalDag { targets: current.iter().map(|c| c.id).collect(), unit_visits, ..LocalDag::default() };
    }
    let (t, t_star) = (current[0].layout, target[0].0);
    let sub = Layout::new(gcd(t.tp, t_star.tp), gcd(t.pp, t_star.pp));
    build(current, target, sub, next)
}

/// The DAG through `sub`, phase by phase: Split the current units into `sub`, Extend the
/// sub-units no current unit already is, Destroy what no target needs, Merge each target.
/// Intermediate units of one model-stage may share ranks (memory is what the global schedule
/// checks); only the target units must be disjoint, as the plan says.
fn build(current: &[Unit], target: &[(Layout, &[i32])], sub: Layout, next: &mut usize) -> LocalDag {
    let mut b = Builder { current, sub, first_new: *next, next, dag: LocalDag::default(), available: Vec::new() };
    b.split();
    let needed = Needed::of(target, sub);
    // Every needed sub-unit is kept or extended, every available one kept or destroyed, and
    // each target not in `sub` merged: room for all of them up front.
    let count = needed.count();
    b.dag.nodes.reserve(count + b.available.len() + target.len());
    b.dag.units.reserve(count + target.len());
    b.dag.edges.reserve(2 * count + b.available.len());
    let kept = b.kept(&needed);
    // Splitting the targets looks at each and at every sub-unit they need, and so does indexing
    // those for the available units, each looked up once.
    b.dag.unit_visits += (target.len() + 2 * count + b.available.len()) as u64;
    let (producer, feeds) = b.extend(&needed, &kept);
    b.destroy(&kept, &feeds);
    b.merge(target, &needed, &producer, &feeds);
    b.dag
}

/// The ranks of the sub-units every target splits into, target after target, in one vector:
/// each sub-unit has `sub.size()` ranks.
struct Needed {
    ranks: Vec<i32>,
    size: usize,
}

impl Needed {
    /// The sub-units of `target` in `sub`, as [`split_ranks_of`] orders them (a target already
    /// in `sub` is its own sub-unit).
    fn of(target: &[(Layout, &[i32])], sub: Layout) -> Needed {
        let size = sub.size() as usize;
        let mut ranks = Vec::with_capacity(target.iter().map(|(_, r)| r.len()).sum());
        // Which of a target's positions each sub-unit takes, in order: the split of the
        // positions themselves, once per layout (the targets of a model-stage share theirs).
        let mut split: Option<(Layout, Vec<usize>)> = None;
        for &(layout, replica) in target {
            if layout == sub {
                ranks.extend_from_slice(replica);
                continue;
            }
            if split.as_ref().is_none_or(|(l, _)| *l != layout) {
                let positions: Vec<i32> = (0..layout.size() as i32).collect();
                let order = split_ranks_of(layout, &positions, sub).into_iter().flatten().map(|k| k as usize);
                split = Some((layout, order.collect()));
            }
            let (_, order) = split.as_ref().expect("set above");
            ranks.extend(order.iter().map(|&k| replica[k]));
        }
        Needed { ranks, size }
    }

    /// Per rank: the sub-unit that has it (`u32::MAX`: none); `None` when some rank is in two
    /// places or is negative (not a plan's targets: then only a comparison of whole rank lists
    /// tells which sub-unit a unit is).
    fn owners(&self) -> Option<Vec<u32>> {
        let highest = self.ranks.iter().copied().max().unwrap_or(0);
        let mut owner = vec![u32::MAX; usize::try_from(highest).ok()? + 1];
        for (k, ranks) in self.ranks.chunks(self.size).enumerate() {
            for &r in ranks {
                let slot = owner.get_mut(usize::try_from(r).ok()?)?;
                if *slot != u32::MAX {
                    return None;
                }
                *slot = k as u32;
            }
        }
        Some(owner)
    }

    /// How many sub-units.
    fn count(&self) -> usize {
        self.ranks.len() / self.size
    }

    /// The ranks of sub-unit `k`.
    fn ranks(&self, k: usize) -> &[i32] {
        &self.ranks[k * self.size..(k + 1) * self.size]
    }
}

/// Per available sub-unit, the Extends it feeds (node indices, ascending), all in one vector.
struct Feeds {
    /// Where each available sub-unit's Extends begin in `nodes` (one more entry at the end).
    start: Vec<usize>,
    nodes: Vec<usize>,
}

impl Feeds {
    /// From `(available sub-unit, Extend)` pairs in the order the Extends were made.
    fn of(available: usize, pairs: &[(usize, usize)]) -> Feeds {
        let mut start = vec![0; available + 1];
        for &(src, _) in pairs {
            start[src + 1] += 1;
        }
        for i in 0..available {
            start[i + 1] += start[i];
        }
        let mut fill = start.clone();
        let mut nodes = vec![0; pairs.len()];
        for &(src, node) in pairs {
            nodes[fill[src]] = node;
            fill[src] += 1;
        }
        Feeds { start, nodes }
    }

    /// The Extends available sub-unit `i` feeds.
    fn of_unit(&self, i: usize) -> &[usize] {
        &self.nodes[self.start[i]..self.start[i + 1]]
    }
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
        self.dag.unit_visits += self.current.len() as u64;
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

    /// Per available sub-unit: which needed sub-unit it already is.
    fn kept(&self, needed: &Needed) -> Vec<Option<usize>> {
        let Some(owner) = needed.owners() else {
            let slot: HashMap<&[i32], usize> = (0..needed.count()).map(|k| (needed.ranks(k), k)).collect();
            return self.available.iter().map(|(id, _)| slot.get(self.ranks_of(*id)).copied()).collect();
        };
        // Needed sub-units share no rank: the only one a unit can be owns its first rank.
        let is = |ranks: &[i32]| {
            let k = *owner.get(*ranks.first()? as usize)?;
            (k != u32::MAX && needed.ranks(k as usize) == ranks).then_some(k as usize)
        };
        self.available.iter().map(|(id, _)| is(self.ranks_of(*id))).collect()
    }

    /// Extend: each needed sub-unit nobody is yet, copied from an available one in rotation
    /// (kept units first: they outlive the transition). Returns who produces each needed
    /// sub-unit and the Extends each available unit feeds.
    fn extend(&mut self, needed: &Needed, kept: &[Option<usize>]) -> (Vec<Made>, Feeds) {
        // Each needed sub-unit once, each available one twice to order them, once more to map
        // the kept ones.
        self.dag.unit_visits += (needed.count() + 3 * self.available.len()) as u64;
        let mut producer: Vec<Option<Made>> = vec![None; needed.count()];
        for (i, k) in kept.iter().enumerate() {
            if let Some(k) = k {
                producer[*k] = Some(self.available[i]);
            }
        }
        let mut ordered: Vec<usize> = (0..self.available.len()).filter(|&i| kept[i].is_some()).collect();
        ordered.extend((0..self.available.len()).filter(|&i| kept[i].is_none()));
        let mut feeds = Vec::with_capacity(needed.count());
        // The next source in rotation (counted round, not divided: a division per Extend costs
        // more than the rest of choosing its source).
        let mut rotation = 0;
        for (k, made) in producer.iter_mut().enumerate() {
            if made.is_some() {
                continue;
            }
            let src = ordered[rotation];
            rotation = if rotation + 1 == ordered.len() { 0 } else { rotation + 1 };
            let copy = self.fresh(self.sub, needed.ranks(k).to_vec());
            let node = self.dag.nodes.len();
            self.dag.nodes.push(Primitive::Extend { source: self.available[src].0, copy });
            if let Some(split) = self.available[src].1 {
                self.dag.edges.push((split, node));
            }
            feeds.push((src, node));
            *made = Some((copy, Some(node)));
        }
        let producer = producer.into_iter().map(|p| p.expect("every needed unit is produced")).collect();
        (producer, Feeds::of(self.available.len(), &feeds))
    }

    /// Destroy what no target needs, after the Extends it feeds.
    fn destroy(&mut self, kept: &[Option<usize>], feeds: &Feeds) {
        self.dag.unit_visits += (self.available.len() + feeds.nodes.len()) as u64;
        for (i, &(id, made_by)) in self.available.iter().enumerate() {
            if kept[i].is_some() {
                continue;
            }
            let node = self.dag.nodes.len();
            self.dag.nodes.push(Primitive::Destroy { unit: id });
            if let Some(split) = made_by {
                self.dag.edges.push((split, node));
            }
            for &extend in feeds.of_unit(i) {
                self.dag.edges.push((extend, node));
            }
        }
    }

    /// Per unit id from the first current one's: its index among the available sub-units
    /// (`usize::MAX`: not available), for the ids below the Extends' copies.
    fn available_index(&self) -> Vec<usize> {
        let base = self.current[0].id.0;
        let end = self.available.iter().map(|(id, _)| id.0 + 1).max().unwrap_or(base);
        let mut index = vec![usize::MAX; end - base];
        for (i, (id, _)) in self.available.iter().enumerate() {
            index[id.0 - base] = i;
        }
        index
    }

    /// Merge each target from its parts (a target in `sub` is its one part).
    fn merge(&mut self, target: &[(Layout, &[i32])], needed: &Needed, producer: &[Made], feeds: &Feeds) {
        let (base, index_of) = (self.current[0].id.0, self.available_index());
        // Indexing the available units, then each target and each of its parts.
        self.dag.unit_visits += (self.available.len() + target.len() + producer.len()) as u64;
        let mut k = 0;
        for &(layout, ranks) in target {
            let count = if layout == self.sub { 1 } else { (layout.size() / self.sub.size()) as usize };
            let part_ids = &producer[k..k + count];
            if layout == self.sub {
                k += count;
                self.dag.targets.push(part_ids[0].0);
                continue;
            }
            let merged = self.fresh(layout, ranks.to_vec());
            debug_assert_eq!(
                merge_ranks_of(self.sub, &(k..k + count).map(|j| needed.ranks(j)).collect::<Vec<_>>(), layout),
                ranks
            );
            k += count;
            let node = self.dag.nodes.len();
            self.dag.nodes.push(Primitive::Merge { parts: part_ids.iter().map(|(id, _)| *id).collect(), merged });
            for (part, made_by) in part_ids {
                if let Some(n) = made_by {
                    self.dag.edges.push((*n, node));
                }
                // A kept part may also be an Extend's source: the Merge consumes it only after.
                let available = part.0.checked_sub(base).and_then(|j| index_of.get(j)).filter(|&&i| i != usize::MAX);
                if let Some(&i) = available {
                    self.dag.unit_visits += feeds.of_unit(i).len() as u64;
                    for &extend in feeds.of_unit(i) {
                        self.dag.edges.push((extend, node));
                    }
                }
            }
            self.dag.targets.push(merged);
        }
    }
}
