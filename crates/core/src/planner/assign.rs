//! Rank assignment: the stages' rank sets laid over one pool. Stages run one after another, so
//! each stage may use the whole pool; within a stage, groups get disjoint rank sets and the
//! members of a group share theirs. A rank keeps the state of every EMU placed on it, so each
//! rank set goes where the state already placed (earlier stages) is lightest, TP-aligned so TP
//! groups stay inside nodes; a model-stage whose candidate is unchanged from the current plan
//! keeps its ranks when they are free, so transitions stay cheap.

use crate::plan::{Candidate, Placement, Plan};

/// One group of a stage to place: its members' candidates and its rank-set size.
pub struct GroupToPlace {
    /// The members (sharing the rank set).
    pub members: Vec<Candidate>,
    /// Ranks of the set.
    pub ranks: u32,
}

/// Places every stage's groups on a pool of `pool` ranks; `state_of(candidate, j)` is the state
/// one rank at pipeline position `j` of the candidate keeps. Returns the placements in the order
/// of `stages` then members.
pub fn assign(
    stages: &[Vec<GroupToPlace>],
    pool: u32,
    current: Option<&Plan>,
    state_of: &dyn Fn(&Candidate, u32) -> u64,
) -> Vec<Placement> {
    let n = pool as usize;
    let mut load = vec![0u64; n];
    let mut out = Vec::new();
    for groups in stages {
        let mut free = vec![true; n];
        let mut order: Vec<&GroupToPlace> = groups.iter().collect();
        // Heaviest state per rank first: it gets the lightest ranks.
        order.sort_by_cached_key(|g| std::cmp::Reverse(g.members.iter().map(|c| state_of(c, 0)).sum::<u64>()));
        // Groups whose every member keeps its current candidate keep their ranks when free.
        let mut placed: Vec<(usize, Vec<Placement>)> = Vec::new();
        let mut rest = Vec::new();
        for (k, g) in order.iter().enumerate() {
            match kept(g, current, &free) {
                Some(ps) => {
                    for p in &ps {
                        p.ranks.iter().for_each(|&r| free[r as usize] = false);
                    }
                    placed.push((k, ps));
                }
                None => rest.push(k),
            }
        }
        for k in rest {
            let g = order[k];
            let align = g.members.iter().map(|c| c.layout.tp).max().unwrap_or(1).max(1) as usize;
            let block = lightest_block(&load, &free, g.ranks as usize, align);
            block.iter().for_each(|&r| free[r] = false);
            let ps = g
                .members
                .iter()
                .map(|c| {
                    let within = lightest_block_within(&load, &block, c.ranks() as usize, c.layout.tp.max(1) as usize);
                    Placement { candidate: *c, ranks: within.iter().map(|&r| r as i32).collect() }
                })
                .collect();
            placed.push((k, ps));
        }
        placed.sort_by_key(|(k, _)| *k);
        for (_, ps) in placed {
            for p in ps {
                let (layout, c) = (p.candidate.layout, &p.candidate);
                let per_position: Vec<u64> = (0..layout.pp).map(|j| state_of(c, j)).collect();
                for (i, &r) in p.ranks.iter().enumerate() {
                    load[r as usize] += per_position[layout.position(i % layout.size() as usize).pp as usize];
                }
                out.push(p);
            }
        }
    }
    out
}

/// The current placements of a group whose members are all unchanged, if their ranks are free
/// and make one rank set of the group's size (members that sat apart in the current plan but
/// share a set now cannot keep theirs: together they would take more ranks than the group has).
fn kept(g: &GroupToPlace, current: Option<&Plan>, free: &[bool]) -> Option<Vec<Placement>> {
    let current = current?;
    let ps: Vec<Placement> = g
        .members
        .iter()
        .map(|c| current.placements.iter().find(|p| p.candidate == *c).cloned())
        .collect::<Option<_>>()?;
    let mut union: Vec<i32> = ps.iter().flat_map(|p| p.ranks.iter().copied()).collect();
    union.sort_unstable();
    union.dedup();
    if union.len() > g.ranks as usize {
        return None;
    }
    let all_free = ps.iter().all(|p| p.ranks.iter().all(|&r| (r as usize) < free.len() && free[r as usize]));
    all_free.then_some(ps)
}

/// `size` free ranks, contiguous and starting at a multiple of `align` when possible (the one
/// with the lightest heaviest rank), else any free ranks (a pool fragmented by kept sets).
/// Linear in the pool: a prefix count of taken ranks and a sliding-window maximum of the load.
fn lightest_block(load: &[u64], free: &[bool], size: usize, align: usize) -> Vec<usize> {
    let n = load.len();
    let fallback = || (0..n).filter(|&r| free[r]).take(size).collect();
    if size == 0 || size > n {
        return fallback();
    }
    let mut taken = vec![0usize; n + 1];
    for r in 0..n {
        taken[r + 1] = taken[r] + usize::from(!free[r]);
    }
    let mut best: Option<(u64, usize)> = None;
    // Indices whose load is a candidate maximum of the window, loads falling front to back.
    let mut window: std::collections::VecDeque<usize> = std::collections::VecDeque::new();
    for end in 0..n {
        while window.back().is_some_and(|&b| load[b] <= load[end]) {
            window.pop_back();
        }
        window.push_back(end);
        let Some(start) = (end + 1).checked_sub(size) else { continue };
        while window.front().is_some_and(|&f| f < start) {
            window.pop_front();
        }
        if start % align == 0 && taken[end + 1] == taken[start] {
            let heaviest = load[window[0]];
            if best.is_none_or(|(b, _)| heaviest < b) {
                best = Some((heaviest, start));
            }
        }
    }
    match best {
        Some((_, start)) => (start..start + size).collect(),
        None => fallback(),
    }
}

/// `size` ranks out of `block` (in order), TP-aligned within it, on the lightest ranks.
fn lightest_block_within(load: &[u64], block: &[usize], size: usize, align: usize) -> Vec<usize> {
    if size >= block.len() {
        return block.to_vec();
    }
    let sub: Vec<u64> = block.iter().map(|&r| load[r]).collect();
    let picked = lightest_block(&sub, &vec![true; sub.len()], size, align);
    picked.into_iter().map(|i| block[i]).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::Layout;
    use crate::plan::{ModelStage, Recompute, Role, Stage};

    fn cand(role: Role, stage: Stage, tp: u32, dp: u32) -> Candidate {
        Candidate {
            model_stage: ModelStage::new(role, stage),
            layout: Layout::new(tp, 1),
            dp,
            recompute: Recompute::None,
            micro_batch: 1,
        }
    }

    #[test]
    fn later_stages_go_where_the_earlier_state_is_lightest() {
        // Generation fills ranks 0-3 of 8; the two-rank reference set then goes to ranks 4-5.
        let gen = cand(Role::Actor, Stage::Generation, 1, 4);
        let reference = cand(Role::Reference, Stage::Inference, 2, 1);
        let stages = vec![
            vec![GroupToPlace { members: vec![gen], ranks: 4 }],
            vec![GroupToPlace { members: vec![reference], ranks: 2 }],
        ];
        let ps = assign(&stages, 8, None, &|_, _| 10);
        assert_eq!(ps[0].ranks, vec![0, 1, 2, 3]);
        assert_eq!(ps[1].ranks, vec![4, 5]);
    }

    #[test]
    fn members_of_a_group_share_its_ranks_and_unchanged_sets_stay() {
        let reference = cand(Role::Reference, Stage::Inference, 1, 4);
        let reward = cand(Role::Reward, Stage::Inference, 2, 1);
        let stages = vec![vec![GroupToPlace { members: vec![reference, reward], ranks: 4 }]];
        let ps = assign(&stages, 4, None, &|_, _| 1);
        assert_eq!(ps[0].ranks, vec![0, 1, 2, 3]);
        assert_eq!(ps[1].ranks.len(), 2);
        assert!(ps[1].ranks.iter().all(|r| ps[0].ranks.contains(r)));
        let current = Plan { placements: vec![Placement { candidate: reference, ranks: vec![4, 5, 6, 7] }] };
        let stages = vec![vec![GroupToPlace { members: vec![reference], ranks: 4 }]];
        assert_eq!(assign(&stages, 8, Some(&current), &|_, _| 1)[0].ranks, vec![4, 5, 6, 7]);
    }

    #[test]
    fn members_that_sat_apart_do_not_keep_their_ranks_when_they_share_a_set_now() {
        // Reference on 0-3 and reward on 4-7 in the current plan; now one group of 4 ranks
        // beside a new 4-rank critic on a pool of 8: keeping both would take all 8 ranks and
        // leave the critic none (the planner once returned it short of ranks).
        let reference = cand(Role::Reference, Stage::Inference, 1, 4);
        let reward = cand(Role::Reward, Stage::Inference, 1, 4);
        let critic = cand(Role::Critic, Stage::Inference, 2, 2);
        let current = Plan {
            placements: vec![
                Placement { candidate: reference, ranks: vec![0, 1, 2, 3] },
                Placement { candidate: reward, ranks: vec![4, 5, 6, 7] },
            ],
        };
        let stages = vec![vec![
            GroupToPlace { members: vec![reference, reward], ranks: 4 },
            GroupToPlace { members: vec![critic], ranks: 4 },
        ]];
        let ps = assign(&stages, 8, Some(&current), &|_, _| 1);
        for p in &ps {
            assert_eq!(p.ranks.len(), p.candidate.ranks() as usize, "{p:?}");
        }
        let shared: Vec<i32> = ps[0].ranks.iter().chain(&ps[1].ranks).copied().collect();
        assert!(ps[2].ranks.iter().all(|r| !shared.contains(r)), "{ps:?}");
    }
}
