//! [`EmuSet`]: one rank's view of every EMU of the job (replicated metadata) and the shards it
//! holds, with the four primitives.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Instant;

use serde::{Deserialize, Serialize};

use crate::comm::DataPlane;
use nereus_core::cost::MemoryItem;
use nereus_core::model::{merge_ranks_of, shard_bytes, split_ranks_of, Catalogue, Layout, Position};
use nereus_core::plan::{ModelStage, Role};

use super::digest::{counters_digest, params_digest, shard_digest};
use super::execute::{move_sections, RankPlan};
use super::memory::{Exchange, HostMemory, ShardMemory};
use super::shard::ShardBuffer;
use super::{
    synthetic_fill, Counters, Digest, Emu, EmuError, EmuId, LocalShard, Movement, Section, ShardStore, TargetEmu,
};

/// How a primitive runs: on its own (the default), or as a node of a transition's schedule.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PrimitiveOptions {
    /// How the sources (a Split's source, a Merge's parts) travel: through host memory for a
    /// node the transition's schedule found no room for beside them.
    pub route: Route,
    /// Inside a transition: intermediate units of one model-stage may share ranks (the
    /// schedule has checked memory); only the target plan's replicas must be disjoint.
    pub in_transition: bool,
}

/// What a redistribution does with its sources once its targets hold their bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Sources {
    /// Freed (Split, Merge, a reshard): a resident source may become its one target in place.
    Consumed,
    /// Kept (Extend: the source replica stays).
    Kept,
}

/// How the sources' bytes reach the targets.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum Route {
    /// Straight from the memory the sources live in.
    #[default]
    Direct,
    /// Staged through host memory first (a node the schedule found no room for beside them).
    ThroughHost,
}

impl Route {
    /// `ThroughHost` when `staged`.
    pub fn staged_if(staged: bool) -> Route {
        if staged {
            Route::ThroughHost
        } else {
            Route::Direct
        }
    }
}

/// A shard's contribution to a digest, from a host copy of its buffer.
type ShardDigest<B> = fn(&LocalShard<B>, &[u8], &Catalogue) -> [u64; 2];

/// What a primitive did (identical on every rank: computed from the movement, not measured).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PrimitiveReport {
    /// `Split`, `Merge`, `Extend` or `Destroy`.
    pub primitive: String,
    /// Bytes that crossed ranks over the data plane, all ranks together.
    pub bytes_sent: u64,
    /// Bytes sliced locally, all ranks together.
    pub bytes_local: u64,
    /// Wall time on this rank.
    pub seconds: f64,
    /// EMUs the primitive created.
    pub created: Vec<EmuId>,
}

/// Every EMU of the job as this rank knows it, and this rank's shards (in host memory, or in
/// device memory with `EmuSet::in_memory`).
pub struct EmuSet<M: ShardMemory = HostMemory> {
    rank: i32,
    world: Vec<i32>,
    participants_only: bool,
    catalogues: BTreeMap<Role, Catalogue>,
    emus: BTreeMap<EmuId, Emu>,
    next_id: u64,
    store: ShardStore<M>,
}

/// Ranks of the `k = a·b` EMUs that `Split` makes from `emu` with layout `sub`
/// (`a = tp / sub.tp`, `b = pp / sub.pp`): sub-EMU `w·a + u` takes the source positions
/// `(i'·a + u, j'·b + w)`, so each of its ranks already holds a `1/(a·b)` slice of what it needs.
pub fn split_ranks(emu: &Emu, sub: Layout) -> Vec<Vec<i32>> {
    split_ranks_of(emu.layout, &emu.ranks, sub)
}

/// Ranks of the EMU that `Merge` makes from `parts` (the inverse of [`split_ranks`]): target
/// position `(i'·a + u, j'·b + w)` is the rank at `(i', j')` of part `w·a + u`, which already
/// holds the target shard whenever stage boundaries line up — then Merge sends no byte.
pub fn merge_ranks(parts: &[&Emu], layout: Layout) -> Vec<i32> {
    let ranks: Vec<&[i32]> = parts.iter().map(|p| p.ranks.as_slice()).collect();
    merge_ranks_of(parts[0].layout, &ranks, layout)
}

impl EmuSet {
    /// An empty set for `rank` of `world_size`, with `capacity` bytes of device memory and the
    /// catalogue of every model of the job; shards in host memory.
    pub fn new(rank: i32, world_size: i32, capacity: u64, catalogues: BTreeMap<Role, Catalogue>) -> EmuSet {
        EmuSet::in_memory(rank, world_size, capacity, catalogues, HostMemory)
    }
}

impl<M: ShardMemory> EmuSet<M> {
    /// An empty set whose shards live in `memory` (capped at the device's real capacity).
    pub fn in_memory(
        rank: i32,
        world_size: i32,
        capacity: u64,
        catalogues: BTreeMap<Role, Catalogue>,
        memory: M,
    ) -> EmuSet<M> {
        EmuSet {
            rank,
            world: (0..world_size).collect(),
            participants_only: false,
            catalogues,
            emus: BTreeMap::new(),
            next_id: 0,
            store: ShardStore::in_memory(rank, capacity, memory),
        }
    }

    /// Who checks room for a primitive. By default the whole world agrees, so every rank learns
    /// the outcome and a refusal leaves every rank's metadata unchanged. With
    /// `participants_only`, only the primitive's ranks communicate, so primitives on disjoint
    /// ranks run concurrently; for transitions, whose schedule has already checked memory (a
    /// refusal then ends the job rather than diverging silently: the refusing ranks return an
    /// error and the launcher stops the others).
    pub fn set_participants_only(&mut self, participants_only: bool) {
        self.participants_only = participants_only;
    }

    /// Number of ranks in the world.
    pub fn world_size(&self) -> i32 {
        self.world.len() as i32
    }

    /// Every EMU of the job.
    pub fn emus(&self) -> impl Iterator<Item = &Emu> {
        self.emus.values()
    }

    /// One EMU.
    pub fn emu(&self, id: EmuId) -> Option<&Emu> {
        self.emus.get(&id)
    }

    /// The replicas of a model-stage.
    pub fn replicas(&self, model_stage: ModelStage) -> Vec<&Emu> {
        self.emus.values().filter(|e| e.model_stage == model_stage).collect()
    }

    /// This rank's shards and ledger.
    pub fn store(&self) -> &ShardStore<M> {
        &self.store
    }

    /// Mutable store (to change the capacity, or charge other buffers).
    pub fn store_mut(&mut self) -> &mut ShardStore<M> {
        &mut self.store
    }

    /// Every buffer of the store, for another set to start with ([`ShardStore::into_buffers`]).
    pub fn into_buffers(self) -> Vec<M::Buffer> {
        self.store.into_buffers()
    }

    /// The catalogue of a role.
    pub fn catalogue(&self, role: Role) -> &Catalogue {
        &self.catalogues[&role]
    }

    fn sections(&self, model_stage: ModelStage) -> Vec<Section> {
        Section::of(model_stage.trains(), self.catalogue(model_stage.role).arch.dtype)
    }

    fn fresh_id(&mut self) -> EmuId {
        self.next_id += 1;
        EmuId(self.next_id - 1)
    }

    fn get(&self, id: EmuId, primitive: &str) -> Result<&Emu, EmuError> {
        self.emus
            .get(&id)
            .ok_or_else(|| EmuError::Invalid { primitive: primitive.into(), reason: format!("{id} does not exist") })
    }

    /// Checks that `ranks` are distinct world ranks not used by another replica of `model_stage`.
    fn check_ranks(
        &self,
        primitive: &str,
        model_stage: ModelStage,
        ranks: &[i32],
        except: &[EmuId],
    ) -> Result<(), EmuError> {
        let invalid = |reason: String| EmuError::Invalid { primitive: primitive.into(), reason };
        let mut sorted = ranks.to_vec();
        sorted.sort_unstable();
        sorted.dedup();
        if sorted.len() != ranks.len() || ranks.iter().any(|r| !self.world.contains(r)) {
            return Err(invalid(format!(
                "ranks {ranks:?} must be distinct ranks of the world (0..{})",
                self.world.len()
            )));
        }
        for other in self.replicas(model_stage).into_iter().filter(|e| !except.contains(&e.id)) {
            if let Some(r) = ranks.iter().find(|r| other.ranks.contains(r)) {
                return Err(invalid(format!("rank {r} already holds {} of {model_stage}", other.id)));
            }
        }
        Ok(())
    }

    /// Creates a replica filled with [`synthetic_fill`] bytes (tests, benchmarks, drills).
    pub fn create_synthetic<P: DataPlane>(
        &mut self,
        plane: &mut P,
        model_stage: ModelStage,
        layout: Layout,
        ranks: &[i32],
        counters: Counters,
    ) -> Result<EmuId, EmuError> {
        self.create(plane, model_stage, layout, ranks, counters, |shard, catalogue| {
            synthetic_fill(shard, catalogue, counters.seed);
            Ok(())
        })
    }

    /// Creates a replica of `model_stage` in `layout` on `ranks` (every rank of the world calls
    /// it; it fails on every rank, allocating nothing, if one lacks room); `fill` writes each
    /// new shard of this rank (e.g. the engine's initialization or a checkpoint's tensors); if
    /// it fails, this rank's new shards are freed and the replica is not registered.
    pub fn create<P: DataPlane>(
        &mut self,
        plane: &mut P,
        model_stage: ModelStage,
        layout: Layout,
        ranks: &[i32],
        counters: Counters,
        mut fill: impl FnMut(&mut LocalShard, &Catalogue) -> Result<(), String>,
    ) -> Result<EmuId, EmuError> {
        let what = format!("Create {model_stage} {layout} on {ranks:?}");
        self.catalogue(model_stage.role).check_layout(layout)?;
        if ranks.len() != layout.size() as usize {
            return Err(EmuError::Invalid {
                primitive: what,
                reason: format!("{layout} needs {} ranks, got {}", layout.size(), ranks.len()),
            });
        }
        self.check_ranks(&what, model_stage, ranks, &[])?;
        let id = self.fresh_id();
        let target = TargetEmu { id, layout, ranks: ranks.to_vec() };
        let mut shards =
            self.allocate_targets(plane, &what, model_stage, std::slice::from_ref(&target), &[], 0, &BTreeMap::new())?;
        let catalogue = &self.catalogues[&model_stage.role];
        let memory = self.store.memory();
        let filled: Result<(), String> = shards
            .values_mut()
            .try_for_each(|shard| memory.fill_from_host(shard, &mut |host: &mut LocalShard| fill(host, catalogue)));
        if let Err(reason) = filled {
            for shard in shards.into_values() {
                self.store.ledger_mut().release_all(&shard.held());
            }
            return Err(EmuError::Invalid { primitive: what, reason });
        }
        self.install(model_stage, counters, &[target], shards);
        Ok(id)
    }

    /// Copies the parameters of replica `from` into replica `to` of another model-stage of the
    /// same model, resharding between their layouts (the weight sync from `actor/training` to
    /// `actor/generation`): each target rectangle moves once, rank to rank, concurrently; no
    /// copy passes through a root. Optimizer sections stay where they are.
    pub fn sync_params<P: Exchange<M>>(
        &mut self,
        plane: &mut P,
        from: EmuId,
        to: EmuId,
    ) -> Result<PrimitiveReport, EmuError> {
        let start = Instant::now();
        let (src, dst) = (self.get(from, "Sync")?.clone(), self.get(to, "Sync")?.clone());
        let what = format!("Sync {} {} -> {} {}", src.model_stage, src.layout, dst.model_stage, dst.layout);
        if src.model_stage.role != dst.model_stage.role {
            return Err(EmuError::Invalid {
                primitive: what,
                reason: "weights can only sync between stages of the same model".into(),
            });
        }
        let catalogue = &self.catalogues[&src.model_stage.role];
        let dtype = catalogue.arch.dtype;
        let target = TargetEmu { id: to, layout: dst.layout, ranks: dst.ranks.clone() };
        let movement = Movement::plan(catalogue, &[&src], std::slice::from_ref(&target));
        // Rectangles that are not contiguous in a buffer travel through pack buffers, charged
        // like every other buffer.
        let plan = RankPlan::new(&movement, self.rank, &[Section::Params], dtype);
        let mut buffers = self.take_scratch(&plan)?;
        let mut targets: BTreeMap<EmuId, LocalShard<M::Buffer>> =
            self.store.take(to).map(|s| (to, s)).into_iter().collect();
        let moved = {
            let sources: BTreeMap<EmuId, &LocalShard<M::Buffer>> =
                self.store.get(from).map(|s| (from, s)).into_iter().collect();
            let memory = self.store.memory();
            move_sections(&*plane, memory, &plan, &sources, &mut targets, &BTreeSet::new(), &mut buffers)
        };
        if let Some(shard) = targets.remove(&to) {
            self.store.put(shard);
        }
        self.return_scratch(buffers);
        moved?;
        let sections = [Section::Params];
        let report = PrimitiveReport {
            primitive: what,
            bytes_sent: movement.bytes_sent(&sections, dtype),
            bytes_local: movement.bytes_local(&sections, dtype),
            seconds: start.elapsed().as_secs_f64(),
            created: vec![],
        };
        Ok(report)
    }

    /// Sets the counters of replica `id` (after a training step or a weight sync).
    pub fn set_counters(&mut self, id: EmuId, counters: Counters) {
        if let Some(emu) = self.emus.get_mut(&id) {
            emu.counters = counters;
        }
    }

    /// `plan`'s scratch buffers, charged to the ledger as pack buffers and taken from the
    /// store's cache ([`ShardStore::take_buffers`]); nothing stays charged on failure.
    fn take_scratch(&mut self, plan: &RankPlan) -> Result<Vec<M::Buffer>, EmuError> {
        let sizes = plan.scratch_sizes();
        let bytes = sizes.iter().sum();
        self.store.ledger_mut().charge(MemoryItem::PackBuffers, bytes)?;
        let taken = self.store.take_buffers(&sizes);
        if taken.is_err() {
            self.store.ledger_mut().release(MemoryItem::PackBuffers, bytes);
        }
        taken
    }

    /// Scratch buffers back to the store's cache, their bytes back to the ledger.
    fn return_scratch(&mut self, buffers: Vec<M::Buffer>) {
        let bytes = buffers.iter().map(ShardBuffer::byte_len).sum();
        self.store.keep_buffers(buffers);
        self.store.ledger_mut().release(MemoryItem::PackBuffers, bytes);
    }

    /// Checks on every rank that the new shards (and pack buffers) fit, then allocates this
    /// rank's; a target in `in_place` (target → source) takes its source's buffer instead, which
    /// stays charged. If any rank lacks room, every rank returns [`EmuError::NoRoom`] naming
    /// them and nothing is allocated.
    #[allow(clippy::too_many_arguments)]
    fn allocate_targets<P: DataPlane>(
        &mut self,
        plane: &mut P,
        what: &str,
        model_stage: ModelStage,
        targets: &[TargetEmu],
        sources: &[i32],
        scratch: u64,
        in_place: &BTreeMap<EmuId, EmuId>,
    ) -> Result<BTreeMap<EmuId, LocalShard<M::Buffer>>, EmuError> {
        let catalogue = &self.catalogues[&model_stage.role];
        let (sections, dtype) = (self.sections(model_stage), catalogue.arch.dtype);
        let mine: Vec<(EmuId, Position)> = targets
            .iter()
            .filter_map(|t| t.ranks.iter().position(|&r| r == self.rank).map(|i| (t.id, t.layout.position(i))))
            .collect();
        let tables: Vec<_> = mine
            .iter()
            .map(|(id, pos)| (*id, *pos, catalogue.shard(targets.iter().find(|t| t.id == *id).unwrap().layout, *pos)))
            .collect();
        let need: u64 = tables
            .iter()
            .filter(|(id, _, _)| !in_place.contains_key(id))
            .map(|(_, _, table)| shard_bytes(table, &sections, dtype))
            .sum::<u64>()
            + scratch;
        let group_ranks: Vec<i32> = if self.participants_only {
            let mut ranks: Vec<i32> =
                targets.iter().flat_map(|t| t.ranks.iter().copied()).chain(sources.iter().copied()).collect();
            ranks.sort_unstable();
            ranks.dedup();
            ranks
        } else {
            self.world.clone()
        };
        if !group_ranks.contains(&self.rank) {
            return Ok(BTreeMap::new());
        }
        let mut short = vec![0u64; self.world.len()];
        short[self.rank as usize] = u64::from(!self.store.ledger().fits(need));
        let group = plane.group(&group_ranks)?;
        plane.all_reduce_sum_u64(group, &mut short)?;
        let ranks: Vec<i32> = short.iter().enumerate().filter(|(_, &s)| s > 0).map(|(r, _)| r as i32).collect();
        if !ranks.is_empty() {
            return Err(EmuError::NoRoom {
                primitive: what.into(),
                ranks: nereus_core::index_list::format_index_list(&ranks),
            });
        }
        let mut shards = BTreeMap::new();
        for (id, position, table) in tables {
            let shard = match in_place.get(&id).and_then(|source| self.store.take(*source)) {
                Some(source) => {
                    let was = source.held();
                    let shard = LocalShard {
                        emu: id,
                        position,
                        table,
                        sections: sections.clone(),
                        dtype,
                        buffer: source.buffer,
                    };
                    self.store.recharge_in_place(&was, &shard);
                    shard
                }
                None => self.store.new_shard(id, position, table, sections.clone(), dtype)?,
            };
            shards.insert(id, shard);
        }
        Ok(shards)
    }

    /// The in-place slices (target → source) whose target fills its source's whole buffer. A
    /// sliced target keeps the source's buffer, and the transition DAG prices every target at
    /// its own size, so a smaller target would hold the difference until it is freed — room a
    /// plan at the tightest memory does not have (`selftest transitions --device` found it).
    fn filling(
        &self,
        in_place: BTreeMap<EmuId, EmuId>,
        model_stage: ModelStage,
        targets: &[TargetEmu],
    ) -> BTreeMap<EmuId, EmuId> {
        let catalogue = &self.catalogues[&model_stage.role];
        let (sections, dtype) = (self.sections(model_stage), catalogue.arch.dtype);
        let target_bytes = |id: EmuId| {
            let t = targets.iter().find(|t| t.id == id)?;
            let position = t.layout.position(t.ranks.iter().position(|&r| r == self.rank)?);
            Some(shard_bytes(&catalogue.shard(t.layout, position), &sections, dtype))
        };
        in_place
            .into_iter()
            .filter(|&(target, source)| {
                target_bytes(target).is_some_and(|bytes| self.store.get(source).is_some_and(|s| s.bytes() == bytes))
            })
            .collect()
    }

    /// Registers targets in the metadata and hands their shards (already charged) to the store.
    fn install(
        &mut self,
        model_stage: ModelStage,
        counters: Counters,
        targets: &[TargetEmu],
        shards: BTreeMap<EmuId, LocalShard<M::Buffer>>,
    ) {
        for t in targets {
            self.emus.insert(t.id, Emu { id: t.id, model_stage, layout: t.layout, ranks: t.ranks.clone(), counters });
        }
        for (_, shard) in shards {
            self.store.adopt(shard);
        }
    }

    /// Builds `targets` from `sources` (same model-stage, same layout) by `route`, then frees
    /// the sources when they are [`Sources::Consumed`]. Fails before moving a byte if any rank
    /// lacks room.
    fn redistribute<P: Exchange<M>>(
        &mut self,
        plane: &mut P,
        what: String,
        sources: &[EmuId],
        targets: Vec<TargetEmu>,
        after: Sources,
        route: Route,
    ) -> Result<PrimitiveReport, EmuError> {
        let (consume, through_host) = (after == Sources::Consumed, route == Route::ThroughHost);
        let start = Instant::now();
        let src: Vec<Emu> = sources.iter().map(|id| self.get(*id, &what).cloned()).collect::<Result<_, _>>()?;
        let model_stage = src[0].model_stage;
        let catalogue = &self.catalogues[&model_stage.role];
        for t in &targets {
            catalogue.check_layout(t.layout)?;
        }
        let src_refs: Vec<&Emu> = src.iter().collect();
        let movement = Movement::plan(catalogue, &src_refs, &targets);
        let (sections, dtype) = (self.sections(model_stage), catalogue.arch.dtype);
        let plan = RankPlan::new(&movement, self.rank, &sections, dtype);
        let scratch = plan.scratch_bytes();
        // A consumed source whose bytes are all its one target's may become that target where
        // it lies (Merge with resident targets): nothing allocated, nothing sent.
        let slices = consume && !through_host && self.store.memory().slices_in_place();
        let in_place = if slices { self.filling(plan.in_place(), model_stage, &targets) } else { BTreeMap::new() };
        let (bytes_sent, bytes_local) = (movement.bytes_sent(&sections, dtype), movement.bytes_local(&sections, dtype));
        let source_ranks: Vec<i32> = src.iter().flat_map(|e| e.ranks.iter().copied()).collect();
        // Through host memory: this rank's sources leave the device (and its ledger) before the
        // targets are allocated, and come back only as the bytes moved into them.
        let staged = if through_host { self.stage_to_host(&what, sources)? } else { BTreeMap::new() };
        let allocated = self.allocate_targets(plane, &what, model_stage, &targets, &source_ranks, scratch, &in_place);
        let mut shards = match allocated {
            Ok(shards) => shards,
            Err(e) => {
                self.unstage(staged);
                return Err(e);
            }
        };
        let mut buffers = self.take_scratch(&plan)?;
        let moved = {
            let sources: BTreeMap<EmuId, &LocalShard<M::Buffer>> = if through_host {
                staged.iter().map(|(id, s)| (*id, s)).collect()
            } else {
                sources.iter().filter_map(|id| self.store.get(*id).map(|s| (*id, s))).collect()
            };
            let sliced: BTreeSet<EmuId> = in_place.keys().copied().collect();
            move_sections(&*plane, self.store.memory(), &plan, &sources, &mut shards, &sliced, &mut buffers)
        };
        self.return_scratch(buffers);
        moved?;
        if consume {
            for id in sources {
                self.store.free(*id);
                self.emus.remove(id);
            }
        }
        let created = targets.iter().map(|t| t.id).collect();
        self.install(model_stage, src[0].counters, &targets, shards);
        Ok(PrimitiveReport {
            primitive: what,
            bytes_sent,
            bytes_local,
            seconds: start.elapsed().as_secs_f64(),
            created,
        })
    }

    /// Takes this rank's shards of `sources` out of the store and its ledger (host memory
    /// holds them now). Only for shards in host memory: a device would need a host copy and a
    /// data plane that sends from it, which the device planes do not have.
    fn stage_to_host(
        &mut self,
        what: &str,
        sources: &[EmuId],
    ) -> Result<BTreeMap<EmuId, LocalShard<M::Buffer>>, EmuError> {
        if self.store.memory().device_capacity().is_some() {
            return Err(EmuError::Invalid {
                primitive: what.into(),
                reason: format!(
                    "staging through host memory is not available for shards in {}",
                    self.store.memory().describe()
                ),
            });
        }
        let staged: BTreeMap<EmuId, LocalShard<M::Buffer>> =
            sources.iter().filter_map(|id| self.store.take(*id).map(|s| (*id, s))).collect();
        for shard in staged.values() {
            self.store.ledger_mut().release_all(&shard.held());
        }
        Ok(staged)
    }

    /// Puts staged shards back (an allocation failed after staging).
    fn unstage(&mut self, staged: BTreeMap<EmuId, LocalShard<M::Buffer>>) {
        for shard in staged.into_values() {
            self.store.ledger_mut().charge_within(&shard.held());
            self.store.put(shard);
        }
    }

    /// `Split(EMU, T_sub) → k EMUs` on the same ranks (see [`split_ranks`]).
    pub fn split<P: Exchange<M>>(
        &mut self,
        plane: &mut P,
        id: EmuId,
        sub: Layout,
        options: PrimitiveOptions,
    ) -> Result<PrimitiveReport, EmuError> {
        let route = options.route;
        let what = format!("Split {id} -> {sub}");
        let emu = self.get(id, &what)?.clone();
        let l = emu.layout;
        if sub.tp == 0 || sub.pp == 0 || l.tp % sub.tp != 0 || l.pp % sub.pp != 0 || sub == l {
            return Err(EmuError::Invalid {
                primitive: what,
                reason: format!("{sub} must divide {l} in tp and pp, and be smaller"),
            });
        }
        let targets = split_ranks(&emu, sub)
            .into_iter()
            .map(|ranks| TargetEmu { id: self.fresh_id(), layout: sub, ranks })
            .collect();
        self.redistribute(plane, what, &[id], targets, Sources::Consumed, route)
    }

    /// `Merge(k EMUs, T) → one EMU` on the union of their ranks (see [`merge_ranks`]).
    pub fn merge<P: Exchange<M>>(
        &mut self,
        plane: &mut P,
        ids: &[EmuId],
        layout: Layout,
        options: PrimitiveOptions,
    ) -> Result<PrimitiveReport, EmuError> {
        let route = options.route;
        let what = format!("Merge {ids:?} -> {layout}");
        let parts: Vec<Emu> = ids.iter().map(|id| self.get(*id, &what).cloned()).collect::<Result<_, _>>()?;
        let sub = parts[0].layout;
        let same = parts.iter().all(|p| p.layout == sub && p.model_stage == parts[0].model_stage);
        let fits = sub.tp > 0
            && layout.tp.is_multiple_of(sub.tp)
            && layout.pp.is_multiple_of(sub.pp)
            && (layout.tp / sub.tp) * (layout.pp / sub.pp) == ids.len() as u32;
        if !same || !fits || ids.len() < 2 {
            return Err(EmuError::Invalid {
                primitive: what,
                reason: format!(
                    "needs k >= 2 replicas of one model-stage with one layout whose tp and pp multiply up to {layout}"
                ),
            });
        }
        let refs: Vec<&Emu> = parts.iter().collect();
        let target = TargetEmu { id: self.fresh_id(), layout, ranks: merge_ranks(&refs, layout) };
        self.redistribute(plane, what, ids, vec![target], Sources::Consumed, route)
    }

    /// `Split` of unit `id` and `Merge` of all its parts, as one redistribution: how a transition
    /// runs a Split whose parts all go, and only go, into one Merge (a layout change through
    /// `T_sub` on the same ranks, e.g. `(tp=2, pp=1) → (tp=1, pp=2)`). The unit becomes one in
    /// `layout` on `ranks`; each rectangle of the target moves once from the source (a local
    /// slice where the rank holds it), and nothing the Merge would discard is sent. The sources
    /// travel by `route`.
    pub fn reshard_with<P: Exchange<M>>(
        &mut self,
        plane: &mut P,
        id: EmuId,
        layout: Layout,
        ranks: &[i32],
        route: Route,
    ) -> Result<PrimitiveReport, EmuError> {
        let what = format!("Split+Merge {id} -> {layout} on {ranks:?}");
        self.get(id, &what)?;
        if ranks.len() != layout.size() as usize {
            return Err(EmuError::Invalid {
                primitive: what,
                reason: format!("{layout} needs {} ranks, got {}", layout.size(), ranks.len()),
            });
        }
        let target = TargetEmu { id: self.fresh_id(), layout, ranks: ranks.to_vec() };
        self.redistribute(plane, what, &[id], vec![target], Sources::Consumed, route)
    }

    /// `Extend(EMU, R') → EMU + EMU'`: a new replica on `ranks`, each shard sent once from the
    /// rank at the same position.
    pub fn extend<P: Exchange<M>>(
        &mut self,
        plane: &mut P,
        id: EmuId,
        ranks: &[i32],
        options: PrimitiveOptions,
    ) -> Result<PrimitiveReport, EmuError> {
        let disjoint_replicas = !options.in_transition;
        let what = format!("Extend {id} -> ranks {ranks:?}");
        let emu = self.get(id, &what)?.clone();
        if ranks.len() != emu.ranks.len() {
            return Err(EmuError::Invalid {
                primitive: what,
                reason: format!("{} needs {} ranks, got {}", emu.layout, emu.ranks.len(), ranks.len()),
            });
        }
        if disjoint_replicas {
            self.check_ranks(&what, emu.model_stage, ranks, &[])?;
        } else {
            self.check_ranks(
                &what,
                emu.model_stage,
                ranks,
                &self.replicas(emu.model_stage).iter().map(|e| e.id).collect::<Vec<_>>(),
            )?;
        }
        let target = TargetEmu { id: self.fresh_id(), layout: emu.layout, ranks: ranks.to_vec() };
        self.redistribute(plane, what, &[id], vec![target], Sources::Kept, Route::Direct)
    }

    /// A replica lost with a rank (not a primitive: its state is gone, never read): frees this
    /// rank's shards of it and forgets it, the last replica of a model-stage included.
    pub fn lose(&mut self, id: EmuId) {
        if self.emus.remove(&id).is_some() {
            self.store.free(id);
        }
    }

    /// The per-tensor baseline of `nereus bench scaling`, after Tenplex's reconfiguration
    /// (Wagenländer et al., SOSP 2024, §4): replaces every replica of `model_stage` with
    /// `targets` (layout and ranks per replica). A target that a current replica already is
    /// (same layout, same ranks) stays resident, untouched; every other target is built one
    /// tensor at a time (one exchange per tensor, all its sections) from the current replicas,
    /// each sub-tensor read from a replica on the target's own rank where one holds it, so only
    /// sub-tensors whose placement changes cross ranks, through the pack buffers (Tenplex's pass
    /// through its tensor store). Current replicas no target keeps are freed afterwards. Every
    /// rank of the world calls it.
    pub fn rebuild_per_tensor<P: Exchange<M>>(
        &mut self,
        plane: &mut P,
        model_stage: ModelStage,
        targets: &[(Layout, Vec<i32>)],
    ) -> Result<PrimitiveReport, EmuError> {
        let start = Instant::now();
        let what = format!("Rebuild {model_stage} per tensor");
        let current: Vec<Emu> = self.replicas(model_stage).into_iter().cloned().collect();
        let Some(counters) = current.first().map(|e| e.counters) else {
            return Err(EmuError::Invalid { primitive: what, reason: format!("{model_stage} has no replica") });
        };
        let catalogue = self.catalogues[&model_stage.role].clone();
        for (layout, _) in targets {
            catalogue.check_layout(*layout)?;
        }
        let (kept, built) = resident_targets(&current, targets);
        let built: Vec<TargetEmu> = built
            .into_iter()
            .map(|(layout, ranks)| TargetEmu { id: self.fresh_id(), layout: *layout, ranks: ranks.clone() })
            .collect();
        let sources: Vec<&Emu> = current.iter().collect();
        let movement = Movement::plan(&catalogue, &sources, &built);
        let (sections, dtype) = (self.sections(model_stage), catalogue.arch.dtype);
        let source_ranks: Vec<i32> = current.iter().flat_map(|e| e.ranks.iter().copied()).collect();
        let mut shards = BTreeMap::new();
        if !built.is_empty() {
            let scratch = RankPlan::new(&movement, self.rank, &sections, dtype).scratch_bytes();
            shards =
                self.allocate_targets(plane, &what, model_stage, &built, &source_ranks, scratch, &BTreeMap::new())?;
            self.store.ledger_mut().charge(MemoryItem::PackBuffers, scratch)?;
            let moved = self.move_tensor_by_tensor(plane, &catalogue, &movement, &current, &mut shards);
            self.store.ledger_mut().release(MemoryItem::PackBuffers, scratch);
            moved?;
        }
        for emu in current.iter().filter(|e| !kept.contains(&e.id)) {
            self.store.free(emu.id);
            self.emus.remove(&emu.id);
        }
        let created = built.iter().map(|t| t.id).collect();
        self.install(model_stage, counters, &built, shards);
        Ok(PrimitiveReport {
            primitive: what,
            bytes_sent: movement.bytes_sent(&sections, dtype),
            bytes_local: movement.bytes_local(&sections, dtype),
            seconds: start.elapsed().as_secs_f64(),
            created,
        })
    }

    /// Runs `movement` one tensor at a time (one exchange each), from this rank's shards of
    /// `sources` into `shards`.
    fn move_tensor_by_tensor<P: Exchange<M>>(
        &mut self,
        plane: &mut P,
        catalogue: &Catalogue,
        movement: &Movement,
        sources: &[Emu],
        shards: &mut BTreeMap<EmuId, LocalShard<M::Buffer>>,
    ) -> Result<(), EmuError> {
        let model_stage = sources[0].model_stage;
        let (sections, dtype) = (self.sections(model_stage), catalogue.arch.dtype);
        (0..catalogue.tensors.len()).try_for_each(|tensor| {
            let one = Movement { segments: movement.segments.iter().filter(|s| s.tensor == tensor).copied().collect() };
            let plan = RankPlan::new(&one, self.rank, &sections, dtype);
            let mut buffers = self.store.take_buffers(&plan.scratch_sizes())?;
            let held: BTreeMap<EmuId, &LocalShard<M::Buffer>> =
                sources.iter().filter_map(|e| self.store.get(e.id).map(|s| (e.id, s))).collect();
            let moved =
                move_sections(&*plane, self.store.memory(), &plan, &held, shards, &BTreeSet::new(), &mut buffers);
            self.store.keep_buffers(buffers);
            moved
        })
    }

    /// `Destroy(EMU)`: frees its shards locally; refuses the last replica of a model-stage.
    pub fn destroy(&mut self, id: EmuId) -> Result<PrimitiveReport, EmuError> {
        let what = format!("Destroy {id}");
        let emu = self.get(id, &what)?.clone();
        if self.replicas(emu.model_stage).len() == 1 {
            return Err(EmuError::LastReplica { emu: id, model_stage: emu.model_stage.to_string() });
        }
        self.store.free(id);
        self.emus.remove(&id);
        Ok(PrimitiveReport { primitive: what, bytes_sent: 0, bytes_local: 0, seconds: 0.0, created: Vec::new() })
    }

    /// The digest of every EMU, with one all-reduce over the world.
    pub fn digests<P: DataPlane>(&self, plane: &mut P) -> Result<BTreeMap<EmuId, Digest>, EmuError> {
        self.digests_of(plane, shard_digest, true)
    }

    /// Every EMU's parameter digest (θ alone, no counters): what a weight sync makes equal
    /// between a training EMU and the generation EMU it fills. Every rank calls it.
    pub fn param_digests<P: DataPlane>(&self, plane: &mut P) -> Result<BTreeMap<EmuId, Digest>, EmuError> {
        self.digests_of(plane, params_digest, false)
    }

    /// The digests of `digest` over every EMU (and of the counters with `counters`).
    fn digests_of<P: DataPlane>(
        &self,
        plane: &mut P,
        digest: ShardDigest<M::Buffer>,
        counters: bool,
    ) -> Result<BTreeMap<EmuId, Digest>, EmuError> {
        let ids: Vec<EmuId> = self.emus.keys().copied().collect();
        let mut sums = vec![0u64; 2 * ids.len()];
        for (k, id) in ids.iter().enumerate() {
            let emu = &self.emus[id];
            let mut add = |d: [u64; 2]| {
                sums[2 * k] = sums[2 * k].wrapping_add(d[0]);
                sums[2 * k + 1] = sums[2 * k + 1].wrapping_add(d[1]);
            };
            if let Some(shard) = self.store.get(*id) {
                let bytes = self.store.memory().read(&shard.buffer)?;
                add(digest(shard, &bytes, &self.catalogues[&emu.model_stage.role]));
            }
            if counters && emu.ranks[0] == self.rank {
                add(counters_digest(&emu.counters));
            }
        }
        let group = plane.group(&self.world)?;
        plane.all_reduce_sum_u64(group, &mut sums)?;
        Ok(ids.iter().enumerate().map(|(k, id)| (*id, Digest([sums[2 * k], sums[2 * k + 1]]))).collect())
    }

    /// Gathers one replica's whole state onto `root` as a `(tp, pp) = (1, 1)` shard (diagnostics
    /// and tests; not charged to the ledger). `None` on other ranks.
    pub fn gather<P: Exchange<M>>(&self, plane: &mut P, id: EmuId, root: i32) -> Result<Option<LocalShard>, EmuError> {
        let emu = self.get(id, "Gather")?;
        let catalogue = &self.catalogues[&emu.model_stage.role];
        let layout = Layout::new(1, 1);
        let target = TargetEmu { id: EmuId(u64::MAX), layout, ranks: vec![root] };
        let movement = Movement::plan(catalogue, &[emu], std::slice::from_ref(&target));
        let (sections, dtype, memory) = (self.sections(emu.model_stage), catalogue.arch.dtype, self.store.memory());
        let mut targets = BTreeMap::new();
        if self.rank == root {
            let (position, table) = (Position { tp: 0, pp: 0 }, catalogue.shard(layout, Position { tp: 0, pp: 0 }));
            let buffer = memory.allocate(shard_bytes(&table, &sections, dtype))?;
            targets.insert(
                target.id,
                LocalShard { emu: target.id, position, table, sections: sections.clone(), dtype, buffer },
            );
        }
        let sources: BTreeMap<EmuId, &LocalShard<M::Buffer>> =
            self.store.get(id).map(|s| (id, s)).into_iter().collect();
        // Diagnostics borrow the store: their scratch is allocated here, outside its cache.
        let plan = RankPlan::new(&movement, self.rank, &sections, dtype);
        let mut scratch =
            plan.scratch_sizes().into_iter().map(|bytes| memory.allocate(bytes)).collect::<Result<Vec<_>, _>>()?;
        move_sections(&*plane, memory, &plan, &sources, &mut targets, &BTreeSet::new(), &mut scratch)?;
        match targets.remove(&target.id) {
            Some(whole) => Ok(Some(whole.with_buffer(memory.read(&whole.buffer)?.into_owned()))),
            None => Ok(None),
        }
    }
}

/// Splits `targets` into the current replicas that already are one (same layout and ranks;
/// each kept at most once) and the targets still to build.
fn resident_targets<'t>(
    current: &[Emu],
    targets: &'t [(Layout, Vec<i32>)],
) -> (Vec<EmuId>, Vec<&'t (Layout, Vec<i32>)>) {
    let mut kept = Vec::new();
    let mut built = Vec::new();
    for target in targets {
        let resident =
            current.iter().find(|e| e.layout == target.0 && e.ranks == target.1 && !kept.contains(&e.id)).map(|e| e.id);
        match resident {
            Some(id) => kept.push(id),
            None => built.push(target),
        }
    }
    (kept, built)
}
