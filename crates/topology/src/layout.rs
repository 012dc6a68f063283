//! The world layout: which node each rank runs on.

/// Ranks grouped into nodes by host name. Nodes are numbered in order of their lowest rank.
///
/// Example: host names `[a, a, b, b]` give nodes `[a, b]`, `node_of_rank = [0, 0, 1, 1]` and local
/// ranks `[0, 1, 0, 1]`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WorldLayout {
    node_names: Vec<String>,
    node_of_rank: Vec<usize>,
    local_rank: Vec<usize>,
}

impl WorldLayout {
    /// Builds the layout from every rank's host name, indexed by world rank.
    pub fn from_hostnames(hostnames: &[String]) -> WorldLayout {
        let mut node_names: Vec<String> = Vec::new();
        let mut node_of_rank = Vec::with_capacity(hostnames.len());
        let mut local_rank = Vec::with_capacity(hostnames.len());
        let mut ranks_seen: Vec<usize> = Vec::new();
        for host in hostnames {
            let node = match node_names.iter().position(|n| n == host) {
                Some(i) => i,
                None => {
                    node_names.push(host.clone());
                    ranks_seen.push(0);
                    node_names.len() - 1
                }
            };
            node_of_rank.push(node);
            local_rank.push(ranks_seen[node]);
            ranks_seen[node] += 1;
        }
        WorldLayout { node_names, node_of_rank, local_rank }
    }

    /// Number of distinct nodes.
    pub fn nodes(&self) -> usize {
        self.node_names.len()
    }

    /// Host name of node `node`.
    pub fn node_name(&self, node: usize) -> &str {
        &self.node_names[node]
    }

    /// The node that `rank` runs on.
    pub fn node_of(&self, rank: usize) -> usize {
        self.node_of_rank[rank]
    }

    /// `rank`'s position among the ranks of its node.
    pub fn local_rank(&self, rank: usize) -> usize {
        self.local_rank[rank]
    }

    /// The largest number of ranks on one node.
    pub fn max_ranks_per_node(&self) -> usize {
        (0..self.nodes()).map(|n| self.node_of_rank.iter().filter(|&&m| m == n).count()).max().unwrap_or(0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nodes_follow_first_appearance_and_local_ranks_count_within_node() {
        let hosts: Vec<String> = ["b", "a", "b", "a", "c"].iter().map(|s| s.to_string()).collect();
        let layout = WorldLayout::from_hostnames(&hosts);
        assert_eq!(layout.nodes(), 3);
        assert_eq!(layout.node_name(0), "b");
        assert_eq!((0..5).map(|r| layout.node_of(r)).collect::<Vec<_>>(), [0, 1, 0, 1, 2]);
        assert_eq!((0..5).map(|r| layout.local_rank(r)).collect::<Vec<_>>(), [0, 0, 1, 1, 0]);
        assert_eq!(layout.max_ranks_per_node(), 2);
    }
}
