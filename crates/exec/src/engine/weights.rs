//! Named views into a position's flat parameter buffer, built from the catalogue's size table:
//! the engine reads every weight in place from the EMU shard (and writes every gradient at the
//! same offset of a gradient buffer with the same layout).

use std::ops::Range;

use nereus_core::model::{Catalogue, Layout, LocalShape, OutputHead, Position, ShardTable, Sharding};

use super::EngineError;

/// Element ranges of one transformer block's tensors.
#[derive(Debug, Clone, Default)]
pub struct BlockWeights {
    /// `input_layernorm.weight[C]`.
    pub attn_norm: Range<usize>,
    /// `q_proj.weight[H·D, C]` (local heads).
    pub q: Range<usize>,
    /// `k_proj.weight[K·D, C]`.
    pub k: Range<usize>,
    /// `v_proj.weight[K·D, C]`.
    pub v: Range<usize>,
    /// `q_norm.weight[D]` (Qwen3).
    pub q_norm: Option<Range<usize>>,
    /// `k_norm.weight[D]` (Qwen3).
    pub k_norm: Option<Range<usize>>,
    /// Q, k and v together, `[(H+2K)·D, C]`: the shard table keeps them adjacent, so the
    /// attention's three column-parallel products are one GEMM.
    pub qkv: Range<usize>,
    /// `o_proj.weight[C, H·D]` (row-parallel: local input columns).
    pub o: Range<usize>,
    /// `post_attention_layernorm.weight[C]`.
    pub mlp_norm: Range<usize>,
    /// `gate_proj.weight[F, C]`.
    pub gate: Range<usize>,
    /// `up_proj.weight[F, C]`.
    pub up: Range<usize>,
    /// Gate and up together, `[2F, C]`: the shard table keeps them adjacent, so the MLP's two
    /// column-parallel products are one GEMM.
    pub gate_up: Range<usize>,
    /// `down_proj.weight[C, F]` (row-parallel).
    pub down: Range<usize>,
}

/// Shapes local to one rank of a layout (the catalogue's, shared with the cost model).
pub type LocalDims = LocalShape;

/// Where every tensor of one position lives in its flat buffer.
#[derive(Debug, Clone)]
pub struct StageWeights {
    /// `embed_tokens.weight[V, C]` on the first stage.
    pub embed: Option<Range<usize>>,
    /// Blocks of this stage, in order.
    pub blocks: Vec<BlockWeights>,
    /// `model.norm.weight[C]` on the last stage.
    pub final_norm: Option<Range<usize>>,
    /// The LM head `[V, C]` (the embedding when tied) on the last stage of an LM.
    pub lm_head: Option<Range<usize>>,
    /// `score.weight[1, C]` on the last stage of a value model.
    pub score: Option<Range<usize>>,
    /// Every tensor's range in buffer order, and whether it is replicated over TP (norm gains
    /// and the value head: no weight decay, counted once in the gradient norm).
    pub tensors: Vec<(Range<usize>, bool)>,
    /// Elements in one section of the buffer.
    pub elements: usize,
    /// Local shapes.
    pub dims: LocalDims,
}

/// The range covering `parts`, which must follow one another in the buffer (one GEMM then
/// reads their weights as one matrix).
fn adjacent<const N: usize>(parts: [(&str, &Range<usize>); N]) -> Result<Range<usize>, EngineError> {
    for ((a, first), (b, second)) in parts.iter().zip(parts.iter().skip(1)) {
        if first.end != second.start {
            let what = format!("{a} at {first:?} and {b} at {second:?} are not adjacent");
            return Err(EngineError::Shape { what });
        }
    }
    Ok(parts[0].1.start..parts[N - 1].1.end)
}

impl StageWeights {
    /// The views of `position` in `layout` of the model `catalogue` describes.
    pub fn new(
        catalogue: &Catalogue,
        layout: Layout,
        position: Position,
        table: &ShardTable,
    ) -> Result<StageWeights, EngineError> {
        let a = &catalogue.arch;
        let dims = catalogue.local_shape(layout, position);
        let mut w = StageWeights {
            embed: None,
            blocks: Vec::new(),
            final_norm: None,
            lm_head: None,
            score: None,
            tensors: Vec::new(),
            elements: table.elements as usize,
            dims,
        };
        let blocks = catalogue.blocks_of_stage(layout.pp, position.pp);
        w.blocks = vec![BlockWeights::default(); (blocks.end - blocks.start) as usize];
        for piece in &table.pieces {
            let range = piece.offset as usize..(piece.offset + piece.region.elements()) as usize;
            let spec = &catalogue.tensors[piece.tensor];
            w.tensors.push((range.clone(), spec.sharding == Sharding::Replicated));
            let name = spec.name.as_str();
            match name {
                "model.embed_tokens.weight" => w.embed = Some(range),
                "model.norm.weight" => w.final_norm = Some(range),
                "lm_head.weight" => w.lm_head = Some(range),
                "score.weight" => w.score = Some(range),
                _ => w.assign_block_tensor(name, range, blocks.start)?,
            }
        }
        for block in &mut w.blocks {
            block.qkv = adjacent([("q_proj", &block.q), ("k_proj", &block.k), ("v_proj", &block.v)])?;
            block.gate_up = adjacent([("gate_proj", &block.gate), ("up_proj", &block.up)])?;
        }
        if a.tie_embeddings && a.head == OutputHead::Lm && w.final_norm.is_some() {
            w.lm_head = w.embed.clone();
        }
        Ok(w)
    }

    fn assign_block_tensor(&mut self, name: &str, range: Range<usize>, first_block: u64) -> Result<(), EngineError> {
        let unknown = || EngineError::Shape { what: format!("tensor {name} is not part of a Llama-style block") };
        let rest = name.strip_prefix("model.layers.").ok_or_else(unknown)?;
        let (layer, suffix) = rest.split_once('.').ok_or_else(unknown)?;
        let layer: u64 = layer.parse().map_err(|_| unknown())?;
        let block = self.blocks.get_mut((layer - first_block) as usize).ok_or_else(unknown)?;
        match suffix {
            "input_layernorm.weight" => block.attn_norm = range,
            "self_attn.q_proj.weight" => block.q = range,
            "self_attn.k_proj.weight" => block.k = range,
            "self_attn.v_proj.weight" => block.v = range,
            "self_attn.q_norm.weight" => block.q_norm = Some(range),
            "self_attn.k_norm.weight" => block.k_norm = Some(range),
            "self_attn.o_proj.weight" => block.o = range,
            "post_attention_layernorm.weight" => block.mlp_norm = range,
            "mlp.gate_proj.weight" => block.gate = range,
            "mlp.up_proj.weight" => block.up = range,
            "mlp.down_proj.weight" => block.down = range,
            _ => return Err(unknown()),
        }
        Ok(())
    }

    /// Whether this position embeds tokens (first pipeline stage).
    pub fn is_first(&self) -> bool {
        self.embed.is_some()
    }

    /// Whether this position holds the output head (last pipeline stage).
    pub fn is_last(&self) -> bool {
        self.final_norm.is_some()
    }
}
