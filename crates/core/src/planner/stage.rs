//! One stage's choice: which model-stages share a rank set (and so run one after another), how
//! many ranks each rank set gets, and each model-stage's candidate — the paper's execution-overlap
//! graph restricted to one stage (Verl-style colocation when a group holds several members).
//!
//! A *group* is a set of model-stages on one rank set of `r` ranks: each member takes its best
//! frontier point with at most `r` ranks, and the group takes the sum of their latencies.
//! Groups are disjoint and run concurrently, so the stage takes the slowest group. For a fixed
//! partition into groups this is a min-max knapsack over monotone frontiers, solved exactly by
//! a threshold search: the smallest latency `T` for which the least ranks each group needs to
//! reach `T` add up to at most the pool. Every partition of the (at most four) members is tried.

/// One model-stage's frontier: `(ranks, seconds)`, ranks ascending, seconds strictly falling.
pub type Frontier = [(u32, f64)];

/// How a stage is laid out.
#[derive(Debug, Clone, PartialEq)]
pub struct StageChoice {
    /// Groups of member indices; each group shares one rank set.
    pub groups: Vec<Vec<usize>>,
    /// Ranks per group.
    pub group_ranks: Vec<u32>,
    /// Per member: the index of its frontier point.
    pub picks: Vec<usize>,
    /// The stage's latency: the slowest group's sum.
    pub seconds: f64,
}

/// The most members a stage has (and a partition is enumerated for).
const MAX_MEMBERS: usize = 6;

/// Every partition of `0..n` into non-empty groups, `n ≤ 6`, each as its groups' members in
/// ascending order, groups by their first member (the order of [`each_partition`]).
pub fn partitions(n: usize) -> Vec<Vec<Vec<usize>>> {
    let mut out = Vec::new();
    each_partition(n, &mut |of, groups| out.push((0..groups).map(|g| members(of, g).collect()).collect()));
    out
}

/// Calls `f(of, groups)` for every partition of `0..n` into `groups` non-empty groups, member
/// `m` in group `of[m]`, as restricted growth strings in lexicographic order (a member joins
/// each group opened before it, then opens a new one), without allocating.
fn each_partition(n: usize, f: &mut dyn FnMut(&[usize], usize)) {
    fn grow(i: usize, groups: usize, of: &mut [usize], f: &mut dyn FnMut(&[usize], usize)) {
        if i == of.len() {
            f(of, groups);
            return;
        }
        for g in 0..=groups {
            of[i] = g;
            grow(i + 1, groups.max(g + 1), of, f);
        }
    }
    assert!(n <= MAX_MEMBERS, "a stage has at most {MAX_MEMBERS} model-stages, not {n}");
    grow(0, 0, &mut [0; MAX_MEMBERS][..n], f);
}

/// The members of group `g` of the partition `of`, ascending.
fn members(of: &[usize], g: usize) -> impl Iterator<Item = usize> + '_ {
    (0..of.len()).filter(move |&m| of[m] == g)
}

/// The index of the best point of `f` with at most `ranks` ranks.
fn best_within(f: &Frontier, ranks: u32) -> Option<usize> {
    let k = f.partition_point(|p| p.0 <= ranks);
    k.checked_sub(1)
}

/// A group's frontier into `out`: at each rank count where a member's frontier steps (listed
/// in `counts`, scratch), the sum of the members' best latencies within it (strictly falling
/// points only).
fn group_frontier(frontiers: &[&Frontier], of: &[usize], g: usize, counts: &mut Vec<u32>, out: &mut Vec<(u32, f64)>) {
    counts.clear();
    counts.extend(members(of, g).flat_map(|m| frontiers[m].iter().map(|p| p.0)));
    counts.sort_unstable();
    counts.dedup();
    out.clear();
    for &r in counts.iter() {
        let total: Option<f64> = members(of, g).map(|m| best_within(frontiers[m], r).map(|k| frontiers[m][k].1)).sum();
        if let Some(total) = total {
            if out.last().is_none_or(|last| total < last.1) {
                out.push((r, total));
            }
        }
    }
}

/// The least ranks at which `g` reaches `seconds` or less.
fn ranks_for(g: &[(u32, f64)], seconds: f64) -> Option<u32> {
    let k = g.partition_point(|p| p.1 > seconds);
    g.get(k).map(|p| p.0)
}

/// The best layout of one stage on `budget` ranks, or `None` when even the smallest points do
/// not fit. Ties go to fewer groups sharing (earlier partitions are the more disjoint ones).
pub fn solve(frontiers: &[&Frontier], budget: u32) -> Option<StageChoice> {
    let n = frontiers.len();
    let mut best: Option<StageChoice> = None;
    // Scratch kept across partitions: the frontiers of groups of several members, their rank
    // counts, and the latencies tried.
    let mut merged: Vec<Vec<(u32, f64)>> = vec![Vec::new(); n];
    let (mut counts, mut thresholds) = (Vec::new(), Vec::new());
    // Most groups first: on equal latency, disjoint rank sets are preferred (no serialization
    // and no co-resident state). Within a group count, partitions in their enumeration order.
    for group_count in (1..=n).rev() {
        each_partition(n, &mut |of, groups| {
            if groups != group_count {
                return;
            }
            // A group of one member has that member's frontier.
            let mut single = [None; MAX_MEMBERS];
            for g in 0..groups {
                let mut ms = members(of, g);
                match (ms.next(), ms.next()) {
                    (Some(m), None) => single[g] = Some(m),
                    _ => group_frontier(frontiers, of, g, &mut counts, &mut merged[g]),
                }
            }
            let mut fronts: [&Frontier; MAX_MEMBERS] = [&[]; MAX_MEMBERS];
            for (g, front) in fronts.iter_mut().enumerate().take(groups) {
                *front = single[g].map_or(merged[g].as_slice(), |m| frontiers[m]);
            }
            let fronts = &fronts[..groups];
            if fronts.iter().any(|f| f.is_empty()) {
                return;
            }
            thresholds.clear();
            thresholds.extend(fronts.iter().flat_map(|f| f.iter().map(|p| p.1)));
            thresholds.sort_unstable_by(f64::total_cmp);
            thresholds.dedup();
            let need = |t: f64| -> Option<u32> { fronts.iter().map(|f| ranks_for(f, t)).sum() };
            let fits = |t: f64| need(t).is_some_and(|n| n <= budget);
            let k = thresholds.partition_point(|&t| !fits(t));
            let Some(&seconds) = thresholds.get(k) else { return };
            if best.as_ref().is_some_and(|b| b.seconds <= seconds) {
                return;
            }
            let group_ranks: Vec<u32> = fronts.iter().map(|f| ranks_for(f, seconds).unwrap_or(0)).collect();
            let picks = (0..n).map(|m| best_within(frontiers[m], group_ranks[of[m]]).unwrap_or(0)).collect();
            let groups = (0..groups).map(|g| members(of, g).collect()).collect();
            best = Some(StageChoice { groups, group_ranks, picks, seconds });
        });
    }
    best
}

/// [`solve`] by brute force over every partition and every combination of points (tests).
pub fn solve_exhaustively(frontiers: &[&Frontier], budget: u32) -> Option<f64> {
    if frontiers.iter().any(|f| f.is_empty()) {
        return None;
    }
    let mut best: Option<f64> = None;
    for groups in partitions(frontiers.len()) {
        // Every assignment of points to members.
        let mut idx = vec![0usize; frontiers.len()];
        loop {
            let mut used = 0;
            let mut worst: f64 = 0.0;
            for g in &groups {
                let ranks = g.iter().map(|&m| frontiers[m][idx[m]].0).max().unwrap_or(0);
                used += ranks;
                worst = worst.max(g.iter().map(|&m| frontiers[m][idx[m]].1).sum());
            }
            if used <= budget && best.is_none_or(|b| worst < b) {
                best = Some(worst);
            }
            let mut m = 0;
            while m < idx.len() {
                idx[m] += 1;
                if idx[m] < frontiers[m].len() {
                    break;
                }
                idx[m] = 0;
                m += 1;
            }
            if m == idx.len() {
                break;
            }
        }
    }
    best
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rng::Rng;

    #[test]
    fn partitions_are_the_bell_numbers() {
        assert_eq!([1, 2, 3, 4].map(|n| partitions(n).len()), [1, 2, 5, 15]);
    }

    #[test]
    fn the_threshold_search_matches_brute_force_on_random_frontiers() {
        for case in 0..500 {
            let mut rng = Rng::new(case);
            let members = 1 + rng.below(3);
            let frontiers: Vec<Vec<(u32, f64)>> = (0..members)
                .map(|_| {
                    let mut ranks = 1 + rng.below(3) as u32;
                    let mut seconds = 10.0 + rng.below(100) as f64;
                    let mut f = Vec::new();
                    for _ in 0..1 + rng.below(4) {
                        f.push((ranks, seconds));
                        ranks += 1 + rng.below(4) as u32;
                        seconds *= 0.3 + 0.6 * (rng.below(100) as f64 / 100.0);
                    }
                    f
                })
                .collect();
            let refs: Vec<&Frontier> = frontiers.iter().map(|f| f.as_slice()).collect();
            let budget = 1 + rng.below(20) as u32;
            let fast = solve(&refs, budget);
            let slow = solve_exhaustively(&refs, budget);
            assert_eq!(fast.as_ref().map(|c| c.seconds), slow, "case {case}: {frontiers:?} on {budget}");
            if let Some(c) = fast {
                assert!(c.group_ranks.iter().sum::<u32>() <= budget);
                for (g, members) in c.groups.iter().enumerate() {
                    let sum: f64 = members.iter().map(|&m| frontiers[m][c.picks[m]].1).sum();
                    assert!(
                        sum <= c.seconds + 1e-12
                            && members.iter().all(|&m| frontiers[m][c.picks[m]].0 <= c.group_ranks[g])
                    );
                }
            }
        }
    }

    #[test]
    fn colocation_fits_what_disjoint_rank_sets_cannot_and_disjoint_wins_otherwise() {
        // Two members that each need the whole pool (memory): only sharing it fits.
        let whole: Vec<(u32, f64)> = vec![(8, 1.0)];
        let c = solve(&[&whole, &whole], 8).unwrap();
        assert_eq!((c.groups.len(), c.group_ranks.clone(), c.seconds), (1, vec![8], 2.0));
        // A member that scales and one that does not: disjoint sets (4 + 1 ranks: max(2, 3))
        // beat sharing 8 ranks (1 + 3).
        let scaling: Vec<(u32, f64)> = vec![(1, 8.0), (2, 4.0), (4, 2.0), (8, 1.0)];
        let flat: Vec<(u32, f64)> = vec![(1, 3.0)];
        let c = solve(&[&scaling, &flat], 8).unwrap();
        assert_eq!((c.groups.len(), c.seconds), (2, 3.0), "{c:?}");
    }
}
