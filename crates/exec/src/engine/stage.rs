//! One pipeline stage of one model on one rank: the blocks it holds, the embedding on the
//! first stage, the final norm and the head on the last. Forward passes save what their
//! backward passes need (`BlockActs`); every buffer comes from the compute, charged to the
//! rank's [`super::arena::Arena`].

use std::ops::Range;

use super::compute::{Compute, InputGrad, KvRows};
use super::ops::*;
use super::weights::{BlockWeights, LocalDims, StageWeights};
use super::EngineError;
use nereus_core::cost::MemoryItem;
use nereus_core::model::{Catalogue, OutputHead};

/// Key/value cache of one block: `k, v[B, T_cap, K, D]`.
#[derive(Debug)]
pub struct LayerCache<A> {
    pub(crate) k: A,
    pub(crate) v: A,
}

/// The KV cache of this stage's blocks for a batch of `B` sequences of up to `T_cap` tokens
/// (host f32 buffers unless `A` says otherwise).
#[derive(Debug)]
pub struct KvCache<A = Vec<f32>> {
    pub(crate) layers: Vec<LayerCache<A>>,
    t_cap: usize,
}

impl<A> KvCache<A> {
    /// A cache for `b` sequences of `t_cap` positions over `model`'s blocks, on `c`.
    pub fn on<C: Compute<Act = A>>(c: &mut C, model: &StageModel, b: usize, t_cap: usize) -> Result<Self, EngineError> {
        let n = b * t_cap * model.dims().kv_heads * model.dims().d;
        let layers = (0..model.weights.blocks.len())
            .map(|_| Ok(LayerCache { k: c.zeros(MemoryItem::KvCache, n)?, v: c.zeros(MemoryItem::KvCache, n)? }))
            .collect::<Result<_, EngineError>>()?;
        Ok(KvCache { layers, t_cap })
    }
}

/// What a block's backward pass needs from its forward pass (all `[N, …]` row-major):
/// activations `A` and per-row statistics `S` (host f32 buffers unless the types say otherwise).
pub struct BlockActs<A = Vec<f32>, S = Vec<f32>> {
    x: A,
    xn1: A,
    r1: S,
    /// What a model with q/k-norms keeps for their backward pass.
    qk_norm: Option<QkNormActs<A, S>>,
    /// The queries as attention read them (rotated).
    q: A,
    /// The keys (rotated) and values as attention read them; `None` where they went straight
    /// into a KV cache (generation, which has no backward pass).
    kv: Option<(A, A)>,
    /// Attention's saved state: the probabilities on the host, `lse` on a device.
    attention: S,
    att: A,
    xmid: A,
    xn2: A,
    r2: S,
    /// The fused gate/up product `[N, 2F]`.
    gu: A,
    h: A,
}

/// The q/k-norms' inputs (the fused projection's q and k, not yet rotated) and their per-head
/// `1/rms`.
struct QkNormActs<A, S> {
    q_raw: A,
    k_raw: A,
    rq: S,
    rk: S,
}

/// Token rows of one call: `b` sequences of `t` positions starting at position `pos0`.
#[derive(Debug, Clone, Copy)]
pub struct Rows<'a> {
    /// Sequences.
    pub b: usize,
    /// Positions per sequence in this call.
    pub t: usize,
    /// Position of the first one.
    pub pos0: usize,
    /// Per sequence, the position of its first real token (a left-padded prompt's padding is
    /// masked out of attention); empty when no sequence is padded.
    pub starts: &'a [usize],
}

impl Rows<'_> {
    fn n(&self) -> usize {
        self.b * self.t
    }
}

/// Where [`StageModel::blocks_forward_on`] puts the last block's residual (its `xmid`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LastResidual {
    /// Added to the output, which is then the residual stream (sent to the next stage, or rows
    /// copied from it).
    Added,
    /// Left out of the output: the caller hands `xmid` to the final norm, which adds it in its
    /// own pass ([`Compute::add_rmsnorm_forward`]), one launch fewer.
    ToFinalNorm,
}

/// The last block's residual (its `xmid`), which [`LastResidual::ToFinalNorm`] left out of
/// the blocks' output for the final norm to add.
pub fn last_residual<A, S>(acts: &[BlockActs<A, S>]) -> Option<&A> {
    acts.last().map(|a| &a.xmid)
}

/// This rank's stage of one model.
pub struct StageModel {
    /// Where each tensor lives in the flat buffer.
    pub weights: StageWeights,
    /// LM or value head.
    pub head: OutputHead,
    /// ε of every RMSNorm of the model.
    pub(super) eps: f64,
    rope: Rope<f32>,
}

impl StageModel {
    /// The stage `weights` describes, for sequences of up to `max_positions` tokens, with the
    /// catalogue's RoPE and RMSNorm numbers.
    pub fn new(catalogue: &Catalogue, weights: StageWeights, max_positions: usize) -> StageModel {
        let n = &catalogue.numerics;
        let rope = Rope::new(max_positions, weights.dims.d, n.rope_theta, n.rope_scaling.as_ref());
        StageModel { weights, head: catalogue.arch.head, eps: n.rms_norm_eps, rope }
    }

    /// Local shapes.
    pub fn dims(&self) -> LocalDims {
        self.weights.dims
    }

    /// The rotary tables (a device uploads them once).
    pub fn rope(&self) -> &Rope<f32> {
        &self.rope
    }

    /// Positions the rotary tables cover.
    pub fn max_positions(&self) -> usize {
        self.rope.max_positions()
    }

    /// The embedding table's range in the stage's parameters (the first stage's only).
    fn embedding_range(&self) -> Result<&Range<usize>, EngineError> {
        let what = "embedding on a stage without it";
        self.weights.embed.as_ref().ok_or_else(|| EngineError::Shape { what: what.into() })
    }

    /// First stage: `x[N,C]` = the embedding rows of `tokens`, summed over vocabulary shards.
    pub fn embed_on<C: Compute, G: TensorGroup<f32>>(
        &self,
        c: &mut C,
        p: &C::Params,
        tokens: &[u32],
        tp: &G,
    ) -> Result<C::Act, EngineError> {
        let d = self.dims();
        let range = self.embedding_range()?;
        // The embedding writes every row: zeros for tokens outside this rank's shard.
        let mut x = c.overwritten(MemoryItem::Activations, tokens.len() * d.c)?;
        c.embedding_forward(&mut x, tokens, (p, range), d.v0, d.c)?;
        // Each rank holds a vocabulary shard: the rows of the others are zero here, so the shards sum.
        c.tp_sum(tp, &mut x)?;
        Ok(x)
    }

    /// First stage, decoding: `x[B,C]` = the embedding rows of the tokens `decoding` drew last,
    /// summed over vocabulary shards as [`StageModel::embed_on`] sums them.
    pub fn embed_decoded_on<C: Compute, G: TensorGroup<f32>>(
        &self,
        c: &mut C,
        p: &C::Params,
        decoding: &C::Decoding,
        b: usize,
        tp: &G,
    ) -> Result<C::Act, EngineError> {
        let d = self.dims();
        let range = self.embedding_range()?;
        let mut x = c.overwritten(MemoryItem::Activations, b * d.c)?;
        c.decode_embedding(&mut x, decoding, (p, range), d.v0, d.c)?;
        c.tp_sum(tp, &mut x)?;
        Ok(x)
    }

    /// First stage, backward: accumulates the embedding gradient of `tokens`.
    pub fn embed_backward_on<C: Compute>(
        &self,
        c: &mut C,
        g: &mut C::Grads,
        dx: &C::Act,
        tokens: &[u32],
    ) -> Result<(), EngineError> {
        match &self.weights.embed {
            Some(range) => c.embedding_backward((g, range), dx, tokens, self.dims().v0, self.dims().c),
            None => Ok(()),
        }
    }

    /// Runs every block of this stage on `x[N,C]`; with `cache`, keys and values are written at
    /// positions `pos0..pos0+t` and attention reads the whole cache (generation). The last
    /// block's residual is added to the output, or left to the final norm as `last` says.
    #[allow(clippy::type_complexity, clippy::too_many_arguments)]
    pub fn blocks_forward_on<C: Compute, G: TensorGroup<f32>>(
        &self,
        c: &mut C,
        p: &C::Params,
        mut x: C::Act,
        rows: Rows,
        mut cache: Option<&mut KvCache<C::Act>>,
        tp: &G,
        last: LastResidual,
    ) -> Result<(C::Act, Vec<BlockActs<C::Act, C::Stat>>), EngineError> {
        let mut acts: Vec<BlockActs<C::Act, C::Stat>> = Vec::with_capacity(self.weights.blocks.len());
        for (i, bw) in self.weights.blocks.iter().enumerate() {
            let layer = cache.as_deref_mut().map(|kv| (&mut kv.layers[i], kv.t_cap));
            // A block's output still lacks its residual (its `xmid`): the next block adds it in
            // its first norm's pass.
            let residual = acts.last().map(|a| &a.xmid);
            let (out, a) = self.block_forward(c, p, bw, (x, residual), rows, layer, tp)?;
            acts.push(a);
            x = out;
        }
        if let (LastResidual::Added, Some(a)) = (last, acts.last()) {
            c.add(&mut x, &a.xmid)?;
        }
        Ok((x, acts))
    }

    /// Backward through every block, last first; returns `dx` of the stage input.
    #[allow(clippy::too_many_arguments)]
    pub fn blocks_backward_on<C: Compute, G: TensorGroup<f32>>(
        &self,
        c: &mut C,
        p: &C::Params,
        g: &mut C::Grads,
        acts: &[BlockActs<C::Act, C::Stat>],
        mut dx: C::Act,
        rows: Rows,
        tp: &G,
    ) -> Result<C::Act, EngineError> {
        for (bw, a) in self.weights.blocks.iter().zip(acts).rev() {
            dx = self.block_backward(c, p, g, bw, a, dx, rows, tp)?;
        }
        Ok(dx)
    }

    fn attention_shape(&self, rows: Rows, tk: usize, t_cap: usize) -> AttentionShape {
        let d = self.dims();
        AttentionShape { b: rows.b, tq: rows.t, tk, t_cap, heads: d.heads, kv_heads: d.kv_heads, d: d.d }
    }

    /// How `rows` of this stage's fused projection split (or merge): rotating q and k or not,
    /// into a KV cache of `kv_t_cap` positions or buffers of their own.
    fn qkv_layout(&self, rows: Rows, rotate: bool, kv_t_cap: Option<usize>) -> QkvLayout {
        let d = self.dims();
        QkvLayout { t: rows.t, pos0: rows.pos0, heads: d.heads, kv_heads: d.kv_heads, rotate, kv_t_cap }
    }

    /// One block's forward on `x` (plus `residual`, the previous block's `xmid`, added in the
    /// first norm's pass where given). The output returned lacks its own residual: the caller
    /// adds this block's `xmid` (the next block does it in its first norm).
    #[allow(clippy::too_many_arguments, clippy::type_complexity)]
    fn block_forward<C: Compute, G: TensorGroup<f32>>(
        &self,
        c: &mut C,
        p: &C::Params,
        bw: &BlockWeights,
        (mut x, residual): (C::Act, Option<&C::Act>),
        rows: Rows,
        mut cache: Option<(&mut LayerCache<C::Act>, usize)>,
        tp: &G,
    ) -> Result<(C::Act, BlockActs<C::Act, C::Stat>), EngineError> {
        let (d, n) = (self.dims(), rows.n());
        let (qw, kw) = (d.heads * d.d, d.kv_heads * d.d);
        let item = MemoryItem::Activations;
        let (mut xn1, mut r1) = (c.overwritten(item, n * d.c)?, c.stats(item, n)?);
        let attn_norm = (p, &bw.attn_norm);
        match residual {
            Some(r) => c.add_rmsnorm_forward(&mut x, r, &mut xn1, &mut r1, attn_norm, d.c, self.eps)?,
            None => c.rmsnorm_forward(&mut xn1, &mut r1, &x, attn_norm, d.c, self.eps)?,
        }
        // Entering the column-parallel attention (Megatron's copy_to_tensor_model_parallel_region):
        // the identity forward. Q, k and v are one GEMM over their adjacent weights.
        let mut qkv = c.overwritten(item, n * (qw + 2 * kw))?;
        c.linear_forward(&mut qkv, &xn1, (p, &bw.qkv), n, d.c, qw + 2 * kw)?;
        let (q, kv, qk_norm) =
            self.attention_inputs(c, p, bw, &qkv, rows, cache.as_mut().map(|(l, t)| (&mut **l, *t)))?;
        // Every attention kernel writes each query row whole (zeros for a row with no key).
        let mut att = c.overwritten(item, n * qw)?;
        let attention = match (cache, &kv) {
            (Some((layer, t_cap)), _) => {
                let shape = self.attention_shape(rows, rows.pos0 + rows.t, t_cap);
                c.attention_forward(&mut att, &q, &layer.k, &layer.v, shape, rows.starts)?
            }
            (None, Some((k, v))) => {
                let shape = self.attention_shape(rows, rows.pos0 + rows.t, rows.t);
                c.attention_forward(&mut att, &q, k, v, shape, rows.starts)?
            }
            (None, None) => return Err(EngineError::Shape { what: "keys without a KV cache or a buffer".into() }),
        };
        let mut xmid = c.overwritten(item, n * d.c)?;
        c.linear_forward(&mut xmid, &att, (p, &bw.o), n, qw, d.c)?;
        // Leaving the row-parallel projection (reduce_from_tensor_model_parallel_region).
        c.tp_sum(tp, &mut xmid)?;
        let (mut xn2, mut r2) = (c.overwritten(item, n * d.c)?, c.stats(item, n)?);
        c.add_rmsnorm_forward(&mut xmid, &x, &mut xn2, &mut r2, (p, &bw.mlp_norm), d.c, self.eps)?;
        // Gate and up in one GEMM over their adjacent weights: gu[n, 2F].
        let (mut gu, mut h) = (c.overwritten(item, n * 2 * d.ffn)?, c.overwritten(item, n * d.ffn)?);
        c.linear_forward(&mut gu, &xn2, (p, &bw.gate_up), n, d.c, 2 * d.ffn)?;
        c.swiglu_forward(&mut h, &gu, d.ffn)?;
        let mut out = c.overwritten(item, n * d.c)?;
        c.linear_forward(&mut out, &h, (p, &bw.down), n, d.ffn, d.c)?;
        c.tp_sum(tp, &mut out)?;
        let acts = BlockActs { x, xn1, r1, qk_norm, q, kv, attention, att, xmid, xn2, r2, gu, h };
        Ok((out, acts))
    }

    /// Attention's inputs from the fused projection `qkv`: the rotated queries, and the keys and
    /// values — in a buffer of their own, or (without q/k-norms) written straight into `cache`.
    /// A model with q/k-norms splits without rotating, normalises q and k per head, then rotates.
    #[allow(clippy::type_complexity)]
    fn attention_inputs<C: Compute>(
        &self,
        c: &mut C,
        p: &C::Params,
        bw: &BlockWeights,
        qkv: &C::Act,
        rows: Rows,
        cache: Option<(&mut LayerCache<C::Act>, usize)>,
    ) -> Result<(C::Act, Option<(C::Act, C::Act)>, Option<QkNormActs<C::Act, C::Stat>>), EngineError> {
        let (d, n) = (self.dims(), rows.n());
        let (qw, kw) = (d.heads * d.d, d.kv_heads * d.d);
        let item = MemoryItem::Activations;
        let norms = bw.q_norm.as_ref().zip(bw.k_norm.as_ref());
        let layout = |kv_t_cap| self.qkv_layout(rows, norms.is_none(), kv_t_cap);
        let mut q = c.overwritten(item, n * qw)?;
        let Some((qn, kn)) = norms else {
            if let Some((layer, t_cap)) = cache {
                c.qkv_split((&mut q, &mut layer.k, &mut layer.v), qkv, layout(Some(t_cap)))?;
                return Ok((q, None, None));
            }
            let (mut k, mut v) = (c.overwritten(item, n * kw)?, c.overwritten(item, n * kw)?);
            c.qkv_split((&mut q, &mut k, &mut v), qkv, layout(None))?;
            return Ok((q, Some((k, v)), None));
        };
        let (mut q_raw, mut k_raw) = (c.overwritten(item, n * qw)?, c.overwritten(item, n * kw)?);
        let (mut k, mut v) = (c.overwritten(item, n * kw)?, c.overwritten(item, n * kw)?);
        c.qkv_split((&mut q_raw, &mut k_raw, &mut v), qkv, layout(None))?;
        let (mut rq, mut rk) = (c.stats(item, n * d.heads)?, c.stats(item, n * d.kv_heads)?);
        c.rmsnorm_forward(&mut q, &mut rq, &q_raw, (p, qn), d.d, self.eps)?;
        c.rmsnorm_forward(&mut k, &mut rk, &k_raw, (p, kn), d.d, self.eps)?;
        c.rope(&mut q, rows.t, d.heads, rows.pos0, false)?;
        c.rope(&mut k, rows.t, d.kv_heads, rows.pos0, false)?;
        if let Some((layer, t_cap)) = cache {
            let fresh = KvRows { b: rows.b, t: rows.t, t_cap, pos0: rows.pos0, width: kw };
            c.kv_append(&mut layer.k, &k, fresh)?;
            c.kv_append(&mut layer.v, &v, fresh)?;
        }
        Ok((q, Some((k, v)), Some(QkNormActs { q_raw, k_raw, rq, rk })))
    }

    /// One block's backward from its output gradient `dout` (which becomes the returned `dx`).
    /// Each temporary is freed once its last reader has run, so a block holds at most the
    /// moment [`nereus_core::cost::reference::block_backward`] names, and the next block
    /// reuses the memory.
    #[allow(clippy::too_many_arguments)]
    fn block_backward<C: Compute, G: TensorGroup<f32>>(
        &self,
        c: &mut C,
        p: &C::Params,
        grads: &mut C::Grads,
        bw: &BlockWeights,
        a: &BlockActs<C::Act, C::Stat>,
        dout: C::Act,
        rows: Rows,
        tp: &G,
    ) -> Result<C::Act, EngineError> {
        let (d, n) = (self.dims(), rows.n());
        let qw = d.heads * d.d;
        let item = MemoryItem::ActivationGradients;
        // MLP: out = xmid + down(swiglu(gate(xn2), up(xn2))); the output gradient is the same on
        // every TP rank (the row-parallel reduction's backward is the identity).
        let mut dh = c.overwritten(item, n * d.ffn)?;
        c.linear_backward(InputGrad::Write(&mut dh), (grads, &bw.down), &dout, &a.h, (p, &bw.down), n, d.ffn, d.c)?;
        let mut dgu = c.overwritten(item, n * 2 * d.ffn)?;
        c.swiglu_backward(&mut dgu, &dh, &a.gu, d.ffn)?;
        c.free(item, dh);
        let mut dxn2 = c.overwritten(item, n * d.c)?;
        let gate_up = (p, &bw.gate_up);
        c.linear_backward(InputGrad::Write(&mut dxn2), (grads, &bw.gate_up), &dgu, &a.xn2, gate_up, n, d.c, 2 * d.ffn)?;
        c.free(item, dgu);
        // Each TP rank's input gradient covers its own columns: the copy's backward sums them.
        c.tp_sum(tp, &mut dxn2)?;
        let mut dxmid = dout;
        c.rmsnorm_backward(&mut dxmid, (grads, &bw.mlp_norm), &dxn2, &a.xmid, (p, &bw.mlp_norm), &a.r2, d.c)?;
        c.free(item, dxn2);
        // Attention: xmid = x + o(attention(rope(q), rope(k), v)).
        let mut datt = c.overwritten(item, n * qw)?;
        c.linear_backward(InputGrad::Write(&mut datt), (grads, &bw.o), &dxmid, &a.att, (p, &bw.o), n, qw, d.c)?;
        let mut dxn1 = self.attention_branch_backward(c, (p, grads), bw, a, datt, rows)?;
        c.tp_sum(tp, &mut dxn1)?;
        let mut dx = dxmid;
        c.rmsnorm_backward(&mut dx, (grads, &bw.attn_norm), &dxn1, &a.x, (p, &bw.attn_norm), &a.r1, d.c)?;
        c.free(item, dxn1);
        Ok(dx)
    }

    /// From attention's output gradient `datt` back through attention, the rotations (and
    /// q/k-norms) and the fused projection's merge: the first norm's output gradient `dxn1` on
    /// this rank's columns, accumulating the q, k, v (and norm) weights' gradients. Frees
    /// `datt`, and each of its own temporaries, as soon as it has been read.
    fn attention_branch_backward<C: Compute>(
        &self,
        c: &mut C,
        (p, grads): (&C::Params, &mut C::Grads),
        bw: &BlockWeights,
        a: &BlockActs<C::Act, C::Stat>,
        datt: C::Act,
        rows: Rows,
    ) -> Result<C::Act, EngineError> {
        let (d, n) = (self.dims(), rows.n());
        let (qw, kw) = (d.heads * d.d, d.kv_heads * d.d);
        let item = MemoryItem::ActivationGradients;
        let (mut dq, mut dk, mut dv) =
            (c.overwritten(item, n * qw)?, c.overwritten(item, n * kw)?, c.overwritten(item, n * kw)?);
        let shape = self.attention_shape(rows, rows.t, rows.t);
        let what = "a backward pass through a forward that wrote its keys into a KV cache";
        let (k, v) = a.kv.as_ref().ok_or_else(|| EngineError::Shape { what: what.into() })?;
        c.attention_backward(
            (&mut dq, &mut dk, &mut dv),
            &datt,
            &a.att,
            &a.attention,
            (&a.q, k, v),
            shape,
            rows.starts,
        )?;
        c.free(item, datt);
        let mut layout = self.qkv_layout(rows, true, None);
        if let (Some(qn), Some(kn), Some(norm)) = (&bw.q_norm, &bw.k_norm, &a.qk_norm) {
            c.rope(&mut dq, rows.t, d.heads, rows.pos0, true)?;
            c.rope(&mut dk, rows.t, d.kv_heads, rows.pos0, true)?;
            let (mut dq_raw, mut dk_raw) = (c.zeros(item, n * qw)?, c.zeros(item, n * kw)?);
            c.rmsnorm_backward(&mut dq_raw, (grads, qn), &dq, &norm.q_raw, (p, qn), &norm.rq, d.d)?;
            c.rmsnorm_backward(&mut dk_raw, (grads, kn), &dk, &norm.k_raw, (p, kn), &norm.rk, d.d)?;
            c.free(item, std::mem::replace(&mut dq, dq_raw));
            c.free(item, std::mem::replace(&mut dk, dk_raw));
            layout.rotate = false;
        }
        let mut dqkv = c.overwritten(item, n * (qw + 2 * kw))?;
        c.qkv_merge(&mut dqkv, (&dq, &dk, &dv), layout)?;
        for g in [dq, dk, dv] {
            c.free(item, g);
        }
        let mut dxn1 = c.overwritten(item, n * d.c)?;
        let (input_grad, weights) = (InputGrad::Write(&mut dxn1), (p, &bw.qkv));
        c.linear_backward(input_grad, (grads, &bw.qkv), &dqkv, &a.xn1, weights, n, d.c, qw + 2 * kw)?;
        c.free(item, dqkv);
        Ok(dxn1)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::emu::MemoryLedger;
    use crate::engine::arena::Arena;
    use crate::engine::compute::Host;
    use crate::engine::ops::Local;
    use nereus_core::config::Dtype;
    use nereus_core::model::{Architecture, Layout, Position};

    /// A left-padded sequence, its padding masked, reads its real tokens as the same sequence
    /// unpadded: every real position's hidden state after the blocks (RoPE included, at shifted
    /// absolute positions) matches to f32 rounding, in one pass and through a KV cache.
    #[test]
    fn a_masked_left_padded_sequence_reads_as_the_unpadded_one() {
        let arch = Architecture { vocab: 32, layers: 2, ..crate::fixtures::tiny_architecture(Dtype::F32) };
        let catalogue = Catalogue::new(arch);
        let (layout, position) = (Layout::new(1, 1), Position { tp: 0, pp: 0 });
        let table = catalogue.shard(layout, position);
        let weights = StageWeights::new(&catalogue, layout, position, &table).unwrap();
        let params: Vec<f32> = (0..weights.elements).map(|i| ((i * 7919 % 1000) as f32 / 1000.0 - 0.5) * 0.3).collect();
        let model = StageModel::new(&catalogue, weights, 16);
        let mut ledger = MemoryLedger::new(0, 1 << 30);
        let mut arena = Arena::new(&mut ledger);
        let mut host = Host::new(&mut arena, model.rope());
        let (tokens, pad) = ([5u32, 9, 2, 17, 30], 3);
        let padded: Vec<u32> = std::iter::repeat_n(0, pad).chain(tokens).collect();
        let mut cache = KvCache::on(&mut host, &model, 1, padded.len()).unwrap();
        let mut hidden = |ids: &[u32], starts: &[usize], cache: Option<&mut KvCache>, pos0: usize| {
            let x = model.embed_on(&mut host, &params[..], ids, &Local).unwrap();
            let rows = Rows { b: 1, t: ids.len(), pos0, starts };
            model.blocks_forward_on(&mut host, &params[..], x, rows, cache, &Local, LastResidual::Added).unwrap().0
        };
        let plain = hidden(&tokens, &[], None, 0);
        let masked = hidden(&padded, &[pad], None, 0);
        let c = 16;
        let close = |a: &[f32], b: &[f32]| a.iter().zip(b).all(|(x, y)| (x - y).abs() <= 1e-5 * (1.0 + y.abs()));
        assert!(
            close(&masked[pad * c..], &plain),
            "padded {:?}\nplain {:?}",
            &masked[pad * c..pad * c + 4],
            &plain[..4]
        );
        let unmasked = hidden(&padded, &[], None, 0);
        assert!(!close(&unmasked[pad * c..], &plain), "without the mask the padding is read");
        // Decoding the last token against a cache of the padded prompt gives the same row.
        let prefix = &padded[..padded.len() - 1];
        hidden(prefix, &[pad], Some(&mut cache), 0);
        let last = hidden(&padded[padded.len() - 1..], &[pad], Some(&mut cache), prefix.len());
        assert!(close(&last, &plain[(tokens.len() - 1) * c..]));
    }
}
