//! The parameter catalogue: every tensor of a model, its shape, its sharding rule and its
//! pipeline stage — the single source of truth for where every byte lives.
//!
//! Shapes follow Hugging Face: a linear layer's weight is `[out_features, in_features]`,
//! row-major. Megatron's rules then make every shard a rectangle of its tensor:
//!
//! | rule | tensors | a TP rank holds |
//! |---|---|---|
//! | column-parallel | `q/k/v_proj`, `gate/up_proj` | a contiguous block of rows (output features; whole heads for q/k/v) |
//! | row-parallel | `o_proj`, `down_proj` | a block of columns (input features) of every row |
//! | vocab-parallel | `embed_tokens`, `lm_head` | a contiguous block of vocabulary rows |
//! | replicated | norms, `score` (value head) | everything |
//!
//! Pipeline stage `j` of `pp` holds a balanced contiguous range of blocks (the first
//! `layers mod pp` stages take one extra); embeddings live on the first stage, the final norm
//! and the output head on the last.

use serde::{Deserialize, Serialize};
use thiserror::Error;

use super::{Architecture, Layout, Numerics, OutputHead, Position};
use crate::config::ModelSpec;

/// How a tensor is divided among the `tp` ranks of a stage.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Sharding {
    /// Every TP rank holds the whole tensor.
    Replicated,
    /// Rows (output features) are split.
    ColumnParallel,
    /// Columns (input features) are split.
    RowParallel,
    /// Vocabulary rows are split.
    VocabParallel,
}

/// Where in the pipeline a tensor lives.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum StageOwner {
    /// The first stage (embeddings).
    First,
    /// The stage holding this block.
    Block(u64),
    /// The last stage (final norm, output head).
    Last,
}

/// One tensor of the model.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TensorSpec {
    /// Hugging Face name, e.g. `model.layers.3.self_attn.q_proj.weight`.
    pub name: String,
    /// Rows (`out_features`; 1 for vectors).
    pub rows: u64,
    /// Columns (`in_features`; the length for vectors).
    pub cols: u64,
    /// TP sharding rule.
    pub sharding: Sharding,
    /// Pipeline placement.
    pub owner: StageOwner,
    /// One-dimensional in Hugging Face's files (`[cols]`: the norm gains); every other tensor
    /// is `[rows, cols]`, `score.weight` included (`[num_labels, hidden]` = `[1, hidden]`).
    pub vector: bool,
}

impl TensorSpec {
    /// Elements in the whole tensor.
    pub fn elements(&self) -> u64 {
        self.rows * self.cols
    }

    /// The tensor's shape in Hugging Face's files.
    pub fn hf_shape(&self) -> Vec<usize> {
        if self.vector {
            vec![self.cols as usize]
        } else {
            vec![self.rows as usize, self.cols as usize]
        }
    }
}

/// A rectangle of a tensor: rows `row0..row0+rows`, columns `col0..col0+cols`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Region {
    /// First row.
    pub row0: u64,
    /// Row count.
    pub rows: u64,
    /// First column.
    pub col0: u64,
    /// Column count.
    pub cols: u64,
}

impl Region {
    /// Elements in the rectangle.
    pub fn elements(&self) -> u64 {
        self.rows * self.cols
    }

    /// The overlap of two rectangles of the same tensor, if any.
    pub fn intersect(&self, other: &Region) -> Option<Region> {
        let r0 = self.row0.max(other.row0);
        let r1 = (self.row0 + self.rows).min(other.row0 + other.rows);
        let c0 = self.col0.max(other.col0);
        let c1 = (self.col0 + self.cols).min(other.col0 + other.cols);
        (r0 < r1 && c0 < c1).then(|| Region { row0: r0, rows: r1 - r0, col0: c0, cols: c1 - c0 })
    }
}

/// One tensor's shard in a position's flat buffer: the region it holds and where it starts.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Piece {
    /// Index into [`Catalogue::tensors`].
    pub tensor: usize,
    /// The rectangle held, stored row-major.
    pub region: Region,
    /// Element offset of the rectangle in the flat buffer (per state section).
    pub offset: u64,
}

/// The size table of one position: its pieces in catalogue order, packed back to back.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ShardTable {
    /// Pieces in catalogue order.
    pub pieces: Vec<Piece>,
    /// Total elements (the length of one state section of the flat buffer).
    pub elements: u64,
}

/// Why a layout cannot hold a model.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum LayoutError {
    /// A degree of zero.
    #[error("layout {layout}: tp and pp must be at least 1")]
    Zero {
        /// The layout.
        layout: Layout,
    },
    /// `tp` does not divide a dimension that TP splits.
    #[error("layout {layout}: tp = {} does not divide {what} = {value}; every TP rank must hold whole heads and equal shards", layout.tp)]
    TpDoesNotDivide {
        /// The layout.
        layout: Layout,
        /// The dimension, e.g. `kv_heads`.
        what: &'static str,
        /// Its size.
        value: u64,
    },
    /// More stages than blocks.
    #[error("layout {layout}: pp = {} exceeds the {layers} transformer blocks", layout.pp)]
    TooManyStages {
        /// The layout.
        layout: Layout,
        /// Blocks in the model.
        layers: u64,
    },
    /// Tied embeddings would need the embedding on two stages.
    #[error("layout {layout}: tied embeddings need pp = 1 (the embedding would live on the first and the last stage)")]
    TiedAcrossStages {
        /// The layout.
        layout: Layout,
    },
}

/// Shapes local to one position of a layout: what one rank's stage of the model computes with.
/// The engine sizes its buffers from it and the cost model counts them from it, so both see the
/// same numbers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LocalShape {
    /// Residual width `C`.
    pub c: usize,
    /// Local query heads `H`.
    pub heads: usize,
    /// Local key/value heads `K`.
    pub kv_heads: usize,
    /// Head width `D`.
    pub d: usize,
    /// Local SwiGLU width `F`.
    pub ffn: usize,
    /// Local vocabulary rows `V`.
    pub vocab: usize,
    /// First vocabulary row held.
    pub v0: usize,
    /// Whole vocabulary.
    pub vocab_total: usize,
    /// Blocks of this pipeline stage.
    pub blocks: usize,
    /// Whether this stage embeds the tokens.
    pub first: bool,
    /// Whether this stage holds the final norm and the head.
    pub last: bool,
    /// LM or value head.
    pub head: OutputHead,
    /// Per-head RMSNorm of queries and keys.
    pub qk_norm: bool,
}

/// Blocks `start..end` of a model with `layers` blocks held by pipeline stage `stage` of `pp`:
/// balanced and contiguous, the first `layers mod pp` stages taking one extra.
pub fn blocks_of_stage(layers: u64, pp: u32, stage: u32) -> std::ops::Range<u64> {
    let (pp, stage) = (u64::from(pp), u64::from(stage));
    let (base, extra) = (layers / pp, layers % pp);
    let start = stage * base + stage.min(extra);
    start..start + base + u64::from(stage < extra)
}

impl LocalShape {
    /// Columns of one chunk of the fused LM head (`engine/output.rs`): this rank's `V`
    /// vocabulary columns in `ceil(V / F)` chunks of `ceil(V / chunks)` columns, rounded up to a
    /// multiple of 8 (16-byte rows of bf16, which tensor-core GEMMs want), so one chunk's logits
    /// are about a block's SwiGLU activation `[n, F]` (at most `F` rounded up to 8; the last
    /// chunk may be narrower). The head's logits never exist beyond one chunk, and the cost
    /// model charges one.
    pub fn vocab_chunk(&self) -> usize {
        let chunks = self.vocab.div_ceil(self.ffn.max(1)).max(1);
        self.vocab.div_ceil(chunks).next_multiple_of(8).min(self.vocab)
    }

    /// This rank's vocabulary columns in [`LocalShape::vocab_chunk`]-wide runs (the last may be
    /// narrower), as local column ranges.
    pub fn vocab_chunks(&self) -> impl Iterator<Item = std::ops::Range<usize>> {
        let (width, vocab) = (self.vocab_chunk().max(1), self.vocab);
        (0..vocab).step_by(width).map(move |start| start..(start + width).min(vocab))
    }

    /// The local shapes of `position` in `layout` for `arch`.
    pub fn of(arch: &Architecture, layout: Layout, position: Position) -> LocalShape {
        let a = arch;
        let tp = u64::from(layout.tp);
        let vocab = (a.vocab / tp) as usize;
        let blocks = blocks_of_stage(a.layers, layout.pp, position.pp);
        LocalShape {
            c: a.hidden as usize,
            heads: (a.heads / tp) as usize,
            kv_heads: (a.kv_heads / tp) as usize,
            d: a.head_dim as usize,
            ffn: (a.ffn / tp) as usize,
            vocab,
            v0: position.tp as usize * vocab,
            vocab_total: a.vocab as usize,
            blocks: (blocks.end - blocks.start) as usize,
            first: position.pp == 0,
            last: position.pp + 1 == layout.pp,
            head: a.head,
            qk_norm: a.qk_norm,
        }
    }
}

/// A weight matrix `[rows, cols]` (`[out_features, in_features]`).
fn matrix(name: String, rows: u64, cols: u64, sharding: Sharding, owner: StageOwner) -> TensorSpec {
    TensorSpec { name, rows, cols, sharding, owner, vector: false }
}

/// An RMSNorm gain `[width]`, replicated.
fn norm(name: String, width: u64, owner: StageOwner) -> TensorSpec {
    TensorSpec { name, rows: 1, cols: width, sharding: Sharding::Replicated, owner, vector: true }
}

/// Every tensor of one model.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Catalogue {
    /// The architecture described.
    pub arch: Architecture,
    /// Tensors in a fixed order: embeddings, blocks in order, final norm, head.
    pub tensors: Vec<TensorSpec>,
    /// RoPE and RMSNorm constants, for the engine (the tiny models' unless given).
    #[serde(default)]
    pub numerics: Numerics,
}

impl Catalogue {
    /// The catalogue of a `[models.<role>]` table, numbers included, with `head` on top (a value
    /// head for the critic and the reward model).
    pub fn of_spec(spec: &ModelSpec, head: OutputHead) -> Catalogue {
        Catalogue::new(Architecture::from_spec(spec, head)).with_numerics(Numerics::from_spec(spec))
    }

    /// The same catalogue computing with `numerics`.
    pub fn with_numerics(self, numerics: Numerics) -> Catalogue {
        Catalogue { numerics, ..self }
    }

    /// Lists every tensor of `arch` (with the tiny models' numerics: [`Numerics::default`]).
    pub fn new(arch: Architecture) -> Catalogue {
        use Sharding::{ColumnParallel, RowParallel, VocabParallel};
        let a = &arch;
        let mut t =
            vec![matrix("model.embed_tokens.weight".into(), a.vocab, a.hidden, VocabParallel, StageOwner::First)];
        for l in 0..a.layers {
            let p = |s: &str| format!("model.layers.{l}.{s}");
            let b = StageOwner::Block(l);
            t.push(norm(p("input_layernorm.weight"), a.hidden, b));
            t.push(matrix(p("self_attn.q_proj.weight"), a.q_width(), a.hidden, ColumnParallel, b));
            t.push(matrix(p("self_attn.k_proj.weight"), a.kv_width(), a.hidden, ColumnParallel, b));
            t.push(matrix(p("self_attn.v_proj.weight"), a.kv_width(), a.hidden, ColumnParallel, b));
            if a.qk_norm {
                t.push(norm(p("self_attn.q_norm.weight"), a.head_dim, b));
                t.push(norm(p("self_attn.k_norm.weight"), a.head_dim, b));
            }
            t.push(matrix(p("self_attn.o_proj.weight"), a.hidden, a.q_width(), RowParallel, b));
            t.push(norm(p("post_attention_layernorm.weight"), a.hidden, b));
            t.push(matrix(p("mlp.gate_proj.weight"), a.ffn, a.hidden, ColumnParallel, b));
            t.push(matrix(p("mlp.up_proj.weight"), a.ffn, a.hidden, ColumnParallel, b));
            t.push(matrix(p("mlp.down_proj.weight"), a.hidden, a.ffn, RowParallel, b));
        }
        t.push(norm("model.norm.weight".into(), a.hidden, StageOwner::Last));
        match (a.head, a.tie_embeddings) {
            (OutputHead::Lm, false) => {
                t.push(matrix("lm_head.weight".into(), a.vocab, a.hidden, VocabParallel, StageOwner::Last))
            }
            (OutputHead::Lm, true) => {} // the LM head is model.embed_tokens.weight
            (OutputHead::Value, _) => {
                t.push(matrix("score.weight".into(), 1, a.hidden, Sharding::Replicated, StageOwner::Last))
            }
        }
        Catalogue { arch, tensors: t, numerics: Numerics::default() }
    }

    /// Total parameters.
    pub fn parameter_count(&self) -> u64 {
        self.tensors.iter().map(TensorSpec::elements).sum()
    }

    /// Checks that `layout` can hold this model with equal, whole-head shards.
    pub fn check_layout(&self, layout: Layout) -> Result<(), LayoutError> {
        let a = &self.arch;
        if layout.tp == 0 || layout.pp == 0 {
            return Err(LayoutError::Zero { layout });
        }
        let tp = u64::from(layout.tp);
        for (what, value) in [("heads", a.heads), ("kv_heads", a.kv_heads), ("ffn", a.ffn), ("vocab", a.vocab)] {
            if value % tp != 0 {
                return Err(LayoutError::TpDoesNotDivide { layout, what, value });
            }
        }
        if u64::from(layout.pp) > a.layers {
            return Err(LayoutError::TooManyStages { layout, layers: a.layers });
        }
        if a.tie_embeddings && a.head == OutputHead::Lm && layout.pp > 1 {
            return Err(LayoutError::TiedAcrossStages { layout });
        }
        Ok(())
    }

    /// The local shapes of `position` in `layout` (which must pass [`Catalogue::check_layout`]).
    pub fn local_shape(&self, layout: Layout, position: Position) -> LocalShape {
        LocalShape::of(&self.arch, layout, position)
    }

    /// Blocks `start..end` held by pipeline stage `stage` of `pp`.
    pub fn blocks_of_stage(&self, pp: u32, stage: u32) -> std::ops::Range<u64> {
        blocks_of_stage(self.arch.layers, pp, stage)
    }

    /// The pipeline stage holding tensor `index` under `pp` stages.
    pub fn stage_of(&self, index: usize, pp: u32) -> u32 {
        match self.tensors[index].owner {
            StageOwner::First => 0,
            StageOwner::Last => pp - 1,
            StageOwner::Block(b) => (0..pp).find(|&s| self.blocks_of_stage(pp, s).contains(&b)).unwrap_or(pp - 1),
        }
    }

    /// The rectangle of tensor `index` held at TP index `tp_index` of `tp`.
    pub fn region(&self, index: usize, tp: u32, tp_index: u32) -> Region {
        let t = &self.tensors[index];
        let (tp, i) = (u64::from(tp), u64::from(tp_index));
        let whole = Region { row0: 0, rows: t.rows, col0: 0, cols: t.cols };
        match t.sharding {
            Sharding::Replicated => whole,
            Sharding::ColumnParallel | Sharding::VocabParallel => {
                Region { row0: i * t.rows / tp, rows: t.rows / tp, ..whole }
            }
            Sharding::RowParallel => Region { col0: i * t.cols / tp, cols: t.cols / tp, ..whole },
        }
    }

    /// The size table of `position` in `layout`: which rectangles of which tensors it holds,
    /// packed in catalogue order. The layout must have passed [`Catalogue::check_layout`].
    pub fn shard(&self, layout: Layout, position: Position) -> ShardTable {
        let mut pieces = Vec::new();
        let mut offset = 0;
        for index in 0..self.tensors.len() {
            if self.stage_of(index, layout.pp) != position.pp {
                continue;
            }
            let region = self.region(index, layout.tp, position.tp);
            pieces.push(Piece { tensor: index, region, offset });
            offset += region.elements();
        }
        ShardTable { pieces, elements: offset }
    }
}

#[cfg(test)]
mod tests;
