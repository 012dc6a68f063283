//! Per-model numbers the cost model needs, derived once from the parameter catalogue.

use crate::model::catalogue::blocks_of_stage;
use crate::model::{Architecture, Catalogue, Layout, Sharding, StageOwner};

/// Parameter counts of one model, with prefix sums so that the heaviest rank of any layout is
/// found in `O(pp)`.
#[derive(Debug, Clone)]
pub struct ModelStats {
    /// The architecture.
    pub arch: Architecture,
    /// All parameters.
    pub params: u64,
    /// Parameters that take part in matrix products (all but the embedding lookup and norms).
    pub matmul_params: u64,
    /// Prefix sums over blocks of TP-split and replicated elements.
    block_split: Vec<u64>,
    block_replicated: Vec<u64>,
    first_split: u64,
    last_split: u64,
    last_replicated: u64,
}

impl ModelStats {
    /// Derives the numbers from a catalogue.
    pub fn new(catalogue: &Catalogue) -> ModelStats {
        let layers = catalogue.arch.layers as usize;
        let (mut split, mut repl) = (vec![0u64; layers + 1], vec![0u64; layers + 1]);
        let (mut first_split, mut last_split, mut last_replicated, mut matmul) = (0, 0, 0, 0);
        for t in &catalogue.tensors {
            let e = t.elements();
            let is_split = t.sharding != Sharding::Replicated;
            if t.rows > 1 && t.name != "model.embed_tokens.weight" {
                matmul += e;
            }
            match t.owner {
                StageOwner::First => first_split += e,
                StageOwner::Last if is_split => last_split += e,
                StageOwner::Last => last_replicated += e,
                StageOwner::Block(b) if is_split => split[b as usize + 1] += e,
                StageOwner::Block(b) => repl[b as usize + 1] += e,
            }
        }
        for b in 1..=layers {
            split[b] += split[b - 1];
            repl[b] += repl[b - 1];
        }
        ModelStats {
            arch: catalogue.arch.clone(),
            params: catalogue.parameter_count(),
            matmul_params: matmul,
            block_split: split,
            block_replicated: repl,
            first_split,
            last_split,
            last_replicated,
        }
        .with_tied_head(catalogue)
    }

    fn with_tied_head(mut self, catalogue: &Catalogue) -> ModelStats {
        if catalogue.arch.tie_embeddings {
            // The embedding doubles as the LM head: it takes part in the output product.
            self.matmul_params += catalogue.arch.vocab * catalogue.arch.hidden;
        }
        self
    }

    /// Parameters held by each rank of pipeline stage `j` of `layout` (every TP position of a
    /// stage holds the same count).
    pub fn params_of_stage(&self, layout: Layout, j: u32) -> u64 {
        let tp = u64::from(layout.tp);
        let blocks = blocks_of_stage(self.arch.layers, layout.pp, j);
        let (a, b) = (blocks.start as usize, blocks.end as usize);
        let mut e =
            (self.block_split[b] - self.block_split[a]) / tp + (self.block_replicated[b] - self.block_replicated[a]);
        if j == 0 {
            e += self.first_split / tp;
        }
        if j == layout.pp - 1 {
            e += self.last_split / tp + self.last_replicated;
        }
        e
    }

    /// Parameters held by the heaviest rank of `layout`.
    pub fn max_params_per_rank(&self, layout: Layout) -> u64 {
        (0..layout.pp).map(|j| self.params_of_stage(layout, j)).max().unwrap_or(0)
    }

    /// Blocks of the largest pipeline stage.
    pub fn max_layers_per_stage(&self, pp: u32) -> u64 {
        self.arch.layers.div_ceil(u64::from(pp))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::Position;

    #[test]
    fn heaviest_rank_matches_the_catalogue() {
        let c = Catalogue::new(Architecture { layers: 7, ..Architecture::qwen3_14b() });
        let stats = ModelStats::new(&c);
        for (tp, pp) in [(1, 1), (2, 3), (8, 7), (4, 2)] {
            let layout = Layout::new(tp, pp);
            for j in 0..pp {
                for tp_index in 0..tp {
                    let want = c.shard(layout, Position { tp: tp_index, pp: j }).elements;
                    assert_eq!(stats.params_of_stage(layout, j), want, "{layout} stage {j}");
                }
            }
            let want = (0..pp).map(|j| c.shard(layout, Position { tp: 0, pp: j }).elements).max().unwrap();
            assert_eq!(stats.max_params_per_rank(layout), want, "{layout}");
        }
    }
}
