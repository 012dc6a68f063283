//! Pure tests of movement planning: which bytes each primitive sends (no MPI needed).

use std::collections::BTreeMap;

use super::*;
use nereus_core::config::Dtype;
use nereus_core::model::{Architecture, Catalogue, Layout};
use nereus_core::plan::{ModelStage, Role, Stage};

fn tiny() -> Catalogue {
    Catalogue::new(Architecture {
        heads: 8,
        kv_heads: 4,
        head_dim: 2,
        ffn: 32,
        ..crate::fixtures::tiny_architecture(Dtype::Bf16)
    })
}

fn emu(id: u64, layout: Layout, ranks: &[i32]) -> Emu {
    Emu {
        id: EmuId(id),
        model_stage: ModelStage::new(Role::Actor, Stage::Training),
        layout,
        ranks: ranks.to_vec(),
        counters: Counters::default(),
    }
}

/// Elements one replica holds over all its positions (replicated tensors once per TP rank).
fn replica_elements(c: &Catalogue, layout: Layout) -> u64 {
    layout.positions().map(|p| c.shard(layout, p).elements).sum()
}

#[test]
fn extend_sends_exactly_one_copy_rank_aligned() {
    let c = tiny();
    let layout = Layout::new(2, 2);
    let src = emu(0, layout, &[0, 1, 2, 3]);
    let target = TargetEmu { id: EmuId(1), layout, ranks: vec![4, 5, 6, 7] };
    let m = Movement::plan(&c, &[&src], &[target]);
    let sections = Section::of(true, Dtype::Bf16);
    let per_element: u64 = sections.iter().map(|s| s.element_bytes(Dtype::Bf16)).sum();
    assert_eq!(m.bytes_sent(&sections, Dtype::Bf16), replica_elements(&c, layout) * per_element);
    for seg in &m.segments {
        assert_eq!(seg.src.1 + 4, seg.dst.1, "position-aligned pairs");
    }
}

#[test]
fn merge_of_split_parts_sends_nothing() {
    let c = tiny();
    let whole = emu(0, Layout::new(4, 2), &[7, 3, 5, 1, 0, 2, 4, 6]);
    for sub in [Layout::new(2, 2), Layout::new(1, 2), Layout::new(2, 1), Layout::new(1, 1)] {
        let parts: Vec<Emu> =
            split_ranks(&whole, sub).into_iter().enumerate().map(|(k, r)| emu(10 + k as u64, sub, &r)).collect();
        let refs: Vec<&Emu> = parts.iter().collect();
        let target = TargetEmu { id: EmuId(99), layout: whole.layout, ranks: merge_ranks(&refs, whole.layout) };
        assert_eq!(target.ranks, whole.ranks, "merge inverts split for {sub}");
        let m = Movement::plan(&c, &refs, &[target]);
        assert_eq!(m.bytes_sent(&[Section::Params], Dtype::Bf16), 0, "{sub}");
    }
}

#[test]
fn split_sends_only_the_missing_bytes() {
    let c = tiny();
    let whole = emu(0, Layout::new(4, 1), &[0, 1, 2, 3]);
    let sub = Layout::new(2, 1);
    let targets: Vec<TargetEmu> = split_ranks(&whole, sub)
        .into_iter()
        .enumerate()
        .map(|(k, ranks)| TargetEmu { id: EmuId(1 + k as u64), layout: sub, ranks })
        .collect();
    let m = Movement::plan(&c, &[&whole], &targets);
    // Each target position needs its (2,1) shard; what its rank already holds of it (its (4,1)
    // shard, which lies inside) is sliced locally; exactly the rest is sent.
    let mut needed = 0;
    let mut resident = 0;
    for t in &targets {
        for (k, &rank) in t.ranks.iter().enumerate() {
            let table = c.shard(sub, sub.position(k));
            needed += table.elements;
            let held = c.shard(whole.layout, whole.position_of(rank).unwrap());
            for p in &table.pieces {
                let h = held.pieces.iter().find(|h| h.tensor == p.tensor).unwrap();
                resident += h.region.intersect(&p.region).map_or(0, |r| r.elements());
            }
        }
    }
    let sections = [Section::Params];
    assert_eq!(m.bytes_local(&sections, Dtype::Bf16), resident * 2);
    assert_eq!(m.bytes_sent(&sections, Dtype::Bf16), (needed - resident) * 2);
    assert!(needed > resident && resident > 0);
}

#[test]
fn every_target_element_comes_from_exactly_one_segment() {
    let c = tiny();
    let src = emu(0, Layout::new(2, 4), &[0, 1, 2, 3, 4, 5, 6, 7]);
    let target = TargetEmu { id: EmuId(1), layout: Layout::new(4, 1), ranks: vec![3, 6, 1, 0] };
    let m = Movement::plan(&c, &[&src], std::slice::from_ref(&target));
    let mut per_rank: BTreeMap<i32, u64> = BTreeMap::new();
    for seg in &m.segments {
        *per_rank.entry(seg.dst.1).or_default() += seg.region.elements();
    }
    for (k, rank) in target.ranks.iter().enumerate() {
        assert_eq!(per_rank[rank], c.shard(target.layout, target.layout.position(k)).elements);
    }
}

#[test]
fn sections_follow_training_and_dtype() {
    assert_eq!(Section::of(false, Dtype::Bf16), vec![Section::Params]);
    assert_eq!(Section::of(true, Dtype::F32).len(), 3);
    assert_eq!(Section::of(true, Dtype::Bf16).len(), 4, "bf16 training keeps an f32 master copy");
    // Mixed-precision Adam: 2 (bf16 θ) + 4 + 4 (moments) + 4 (master) = 14 bytes/parameter of
    // state, before gradients.
    let bytes: u64 = Section::of(true, Dtype::Bf16).iter().map(|s| s.element_bytes(Dtype::Bf16)).sum();
    assert_eq!(bytes, 14);
}
