//! One pipeline stage of one model on one rank: the blocks it holds, the embedding on the
//! first stage, the final norm and the head on the last. Forward passes save what their
//! backward passes need (`BlockActs`); every buffer comes from the [`Arena`].

use super::arena::Arena;
use super::ops::*;
use super::parallel::{CopyToTp, ReduceFromTp};
use super::weights::{BlockWeights, LocalDims, StageWeights};
use super::EngineError;
use nereus_core::cost::MemoryItem;
use nereus_core::model::{Catalogue, OutputHead};

/// Key/value cache of one block: `k, v[B, T_cap, K, D]`.
#[derive(Debug)]
pub struct LayerCache {
    k: Vec<f32>,
    v: Vec<f32>,
}

/// The KV cache of this stage's blocks for a batch of `B` sequences of up to `T_cap` tokens.
#[derive(Debug)]
pub struct KvCache {
    layers: Vec<LayerCache>,
    t_cap: usize,
}

impl KvCache {
    /// A cache for `b` sequences of `t_cap` positions over `model`'s blocks, charged to `arena`.
    pub fn new(model: &StageModel, b: usize, t_cap: usize, arena: &mut Arena) -> Result<KvCache, EngineError> {
        let n = b * t_cap * model.dims().kv_heads * model.dims().d;
        let layers = (0..model.weights.blocks.len())
            .map(|_| {
                Ok(LayerCache { k: arena.zeros(MemoryItem::KvCache, n)?, v: arena.zeros(MemoryItem::KvCache, n)? })
            })
            .collect::<Result<_, EngineError>>()?;
        Ok(KvCache { layers, t_cap })
    }
}

/// What a block's backward pass needs from its forward pass (all `[N, …]` row-major).
pub struct BlockActs {
    x: Vec<f32>,
    xn1: Vec<f32>,
    r1: Vec<f32>,
    q_raw: Vec<f32>,
    k_raw: Vec<f32>,
    rq: Vec<f32>,
    rk: Vec<f32>,
    q: Vec<f32>,
    k: Vec<f32>,
    v: Vec<f32>,
    probs: Vec<f32>,
    att: Vec<f32>,
    xmid: Vec<f32>,
    xn2: Vec<f32>,
    r2: Vec<f32>,
    g: Vec<f32>,
    u: Vec<f32>,
    h: Vec<f32>,
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

    /// Positions the rotary tables cover.
    pub fn max_positions(&self) -> usize {
        self.rope.max_positions()
    }

    /// First stage: `x[N,C]` = the embedding rows of `tokens`, summed over vocabulary shards.
    pub fn embed<G: TensorGroup<f32>>(
        &self,
        p: &[f32],
        tokens: &[u32],
        tp: &G,
        arena: &mut Arena,
    ) -> Result<Vec<f32>, EngineError> {
        let d = self.dims();
        let range = self
            .weights
            .embed
            .clone()
            .ok_or_else(|| EngineError::Shape { what: "embedding on a stage without it".into() })?;
        let mut x = arena.zeros(MemoryItem::Activations, tokens.len() * d.c)?;
        embedding_forward(&mut x, tokens, &p[range], d.v0, d.c);
        ReduceFromTp::forward(tp, &mut x)?;
        Ok(x)
    }

    /// First stage, backward: accumulates the embedding gradient of `tokens`.
    pub fn embed_backward(&self, g: &mut [f32], dx: &[f32], tokens: &[u32]) {
        if let Some(range) = self.weights.embed.clone() {
            embedding_backward(&mut g[range], dx, tokens, self.dims().v0, self.dims().c);
        }
    }

    /// Runs every block of this stage on `x[N,C]`; with `cache`, keys and values are written at
    /// positions `pos0..pos0+t` and attention reads the whole cache (generation).
    pub fn blocks_forward<G: TensorGroup<f32>>(
        &self,
        p: &[f32],
        mut x: Vec<f32>,
        rows: Rows,
        mut cache: Option<&mut KvCache>,
        tp: &G,
        arena: &mut Arena,
    ) -> Result<(Vec<f32>, Vec<BlockActs>), EngineError> {
        let mut acts = Vec::with_capacity(self.weights.blocks.len());
        for (i, bw) in self.weights.blocks.iter().enumerate() {
            let layer = cache.as_deref_mut().map(|c| (&mut c.layers[i], c.t_cap));
            let (out, a) = self.block_forward(p, bw, x, rows, layer, tp, arena)?;
            acts.push(a);
            x = out;
        }
        Ok((x, acts))
    }

    /// Backward through every block, last first; returns `dx` of the stage input.
    #[allow(clippy::too_many_arguments)]
    pub fn blocks_backward<G: TensorGroup<f32>>(
        &self,
        p: &[f32],
        g: &mut [f32],
        acts: &[BlockActs],
        mut dx: Vec<f32>,
        rows: Rows,
        tp: &G,
        arena: &mut Arena,
    ) -> Result<Vec<f32>, EngineError> {
        for (bw, a) in self.weights.blocks.iter().zip(acts).rev() {
            dx = self.block_backward(p, g, bw, a, dx, rows, tp, arena)?;
        }
        Ok(dx)
    }

    #[allow(clippy::too_many_arguments)]
    fn block_forward<G: TensorGroup<f32>>(
        &self,
        p: &[f32],
        bw: &BlockWeights,
        x: Vec<f32>,
        rows: Rows,
        cache: Option<(&mut LayerCache, usize)>,
        tp: &G,
        arena: &mut Arena,
    ) -> Result<(Vec<f32>, BlockActs), EngineError> {
        let (d, n) = (self.dims(), rows.n());
        let (qw, kw) = (d.heads * d.d, d.kv_heads * d.d);
        let w = |r: &std::ops::Range<usize>| &p[r.clone()];
        let mut z = |len: usize| arena.zeros::<f32>(MemoryItem::Activations, len);
        let (mut xn1, mut r1) = (z(n * d.c)?, z(n)?);
        rmsnorm_forward(&mut xn1, &mut r1, &x, w(&bw.attn_norm), d.c, self.eps);
        CopyToTp::forward(&mut xn1);
        let (mut q_raw, mut k_raw, mut v) = (z(n * qw)?, z(n * kw)?, z(n * kw)?);
        linear_forward(&mut q_raw, &xn1, w(&bw.q), n, d.c, qw);
        linear_forward(&mut k_raw, &xn1, w(&bw.k), n, d.c, kw);
        linear_forward(&mut v, &xn1, w(&bw.v), n, d.c, kw);
        let (mut q, mut k) = (z(n * qw)?, z(n * kw)?);
        q.copy_from_slice(&q_raw);
        k.copy_from_slice(&k_raw);
        let (mut rq, mut rk) = (z(n * d.heads)?, z(n * d.kv_heads)?);
        if let (Some(qn), Some(kn)) = (&bw.q_norm, &bw.k_norm) {
            rmsnorm_forward(&mut q, &mut rq, &q_raw, w(qn), d.d, self.eps);
            rmsnorm_forward(&mut k, &mut rk, &k_raw, w(kn), d.d, self.eps);
        }
        self.rope.apply(&mut q, rows.t, d.heads, rows.pos0, false);
        self.rope.apply(&mut k, rows.t, d.kv_heads, rows.pos0, false);
        let mut att = z(n * qw)?;
        let shape = AttentionShape {
            b: rows.b,
            tq: rows.t,
            tk: rows.pos0 + rows.t,
            t_cap: rows.t,
            heads: d.heads,
            kv_heads: d.kv_heads,
            d: d.d,
        };
        let mut probs = z(rows.b * d.heads * rows.t * shape.tk)?;
        match cache {
            Some((layer, t_cap)) => {
                for b in 0..rows.b {
                    let (dst, src) = ((b * t_cap + rows.pos0) * kw, b * rows.t * kw);
                    layer.k[dst..dst + rows.t * kw].copy_from_slice(&k[src..src + rows.t * kw]);
                    layer.v[dst..dst + rows.t * kw].copy_from_slice(&v[src..src + rows.t * kw]);
                }
                let shape = AttentionShape { t_cap, ..shape };
                attention_forward(&mut att, &mut probs, &q, &layer.k, &layer.v, shape, rows.starts);
            }
            None => attention_forward(&mut att, &mut probs, &q, &k, &v, shape, rows.starts),
        }
        let mut xmid = z(n * d.c)?;
        linear_forward(&mut xmid, &att, w(&bw.o), n, qw, d.c);
        ReduceFromTp::forward(tp, &mut xmid)?;
        xmid.iter_mut().zip(&x).for_each(|(m, &r)| *m += r);
        let (mut xn2, mut r2) = (z(n * d.c)?, z(n)?);
        rmsnorm_forward(&mut xn2, &mut r2, &xmid, w(&bw.mlp_norm), d.c, self.eps);
        CopyToTp::forward(&mut xn2);
        let (mut g, mut u, mut h) = (z(n * d.ffn)?, z(n * d.ffn)?, z(n * d.ffn)?);
        linear_forward(&mut g, &xn2, w(&bw.gate), n, d.c, d.ffn);
        linear_forward(&mut u, &xn2, w(&bw.up), n, d.c, d.ffn);
        swiglu_forward(&mut h, &g, &u);
        let mut out = z(n * d.c)?;
        linear_forward(&mut out, &h, w(&bw.down), n, d.ffn, d.c);
        ReduceFromTp::forward(tp, &mut out)?;
        out.iter_mut().zip(&xmid).for_each(|(o, &r)| *o += r);
        Ok((out, BlockActs { x, xn1, r1, q_raw, k_raw, rq, rk, q, k, v, probs, att, xmid, xn2, r2, g, u, h }))
    }

    #[allow(clippy::too_many_arguments)]
    fn block_backward<G: TensorGroup<f32>>(
        &self,
        p: &[f32],
        grads: &mut [f32],
        bw: &BlockWeights,
        a: &BlockActs,
        mut dout: Vec<f32>,
        rows: Rows,
        tp: &G,
        arena: &mut Arena,
    ) -> Result<Vec<f32>, EngineError> {
        let (d, n) = (self.dims(), rows.n());
        let (qw, kw) = (d.heads * d.d, d.kv_heads * d.d);
        let w = |r: &std::ops::Range<usize>| &p[r.clone()];
        let mut z = |len: usize| arena.zeros::<f32>(MemoryItem::ActivationGradients, len);
        // MLP: out = xmid + down(swiglu(gate(xn2), up(xn2))).
        ReduceFromTp::backward(&mut dout);
        let mut dh = z(n * d.ffn)?;
        linear_backward(Some(&mut dh), &mut grads[bw.down.clone()], &dout, &a.h, w(&bw.down), n, d.ffn, d.c);
        let (mut dg, mut du) = (z(n * d.ffn)?, z(n * d.ffn)?);
        swiglu_backward(&mut dg, &mut du, &dh, &a.g, &a.u);
        let mut dxn2 = z(n * d.c)?;
        linear_backward(Some(&mut dxn2), &mut grads[bw.gate.clone()], &dg, &a.xn2, w(&bw.gate), n, d.c, d.ffn);
        linear_backward(Some(&mut dxn2), &mut grads[bw.up.clone()], &du, &a.xn2, w(&bw.up), n, d.c, d.ffn);
        CopyToTp::backward(tp, &mut dxn2)?;
        let mut dxmid = dout;
        rmsnorm_backward(&mut dxmid, &mut grads[bw.mlp_norm.clone()], &dxn2, &a.xmid, w(&bw.mlp_norm), &a.r2, d.c);
        // Attention: xmid = x + o(attention(rope(q), rope(k), v)).
        ReduceFromTp::backward(&mut dxmid);
        let mut datt = z(n * qw)?;
        linear_backward(Some(&mut datt), &mut grads[bw.o.clone()], &dxmid, &a.att, w(&bw.o), n, qw, d.c);
        let (mut dq, mut dk, mut dv) = (z(n * qw)?, z(n * kw)?, z(n * kw)?);
        let shape = AttentionShape {
            b: rows.b,
            tq: rows.t,
            tk: rows.t,
            t_cap: rows.t,
            heads: d.heads,
            kv_heads: d.kv_heads,
            d: d.d,
        };
        attention_backward(&mut dq, &mut dk, &mut dv, &datt, &a.q, &a.k, &a.v, &a.probs, shape);
        self.rope.apply(&mut dq, rows.t, d.heads, rows.pos0, true);
        self.rope.apply(&mut dk, rows.t, d.kv_heads, rows.pos0, true);
        if let (Some(qn), Some(kn)) = (&bw.q_norm, &bw.k_norm) {
            let (mut dq_raw, mut dk_raw) = (z(n * qw)?, z(n * kw)?);
            rmsnorm_backward(&mut dq_raw, &mut grads[qn.clone()], &dq, &a.q_raw, w(qn), &a.rq, d.d);
            rmsnorm_backward(&mut dk_raw, &mut grads[kn.clone()], &dk, &a.k_raw, w(kn), &a.rk, d.d);
            (dq, dk) = (dq_raw, dk_raw);
        }
        let mut dxn1 = z(n * d.c)?;
        linear_backward(Some(&mut dxn1), &mut grads[bw.q.clone()], &dq, &a.xn1, w(&bw.q), n, d.c, qw);
        linear_backward(Some(&mut dxn1), &mut grads[bw.k.clone()], &dk, &a.xn1, w(&bw.k), n, d.c, kw);
        linear_backward(Some(&mut dxn1), &mut grads[bw.v.clone()], &dv, &a.xn1, w(&bw.v), n, d.c, kw);
        CopyToTp::backward(tp, &mut dxn1)?;
        let mut dx = dxmid;
        rmsnorm_backward(&mut dx, &mut grads[bw.attn_norm.clone()], &dxn1, &a.x, w(&bw.attn_norm), &a.r1, d.c);
        Ok(dx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::emu::MemoryLedger;
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
        let (tokens, pad) = ([5u32, 9, 2, 17, 30], 3);
        let padded: Vec<u32> = std::iter::repeat_n(0, pad).chain(tokens).collect();
        let hidden = |ids: &[u32], starts: &[usize], arena: &mut Arena| {
            let x = model.embed(&params, ids, &Local, arena).unwrap();
            let rows = Rows { b: 1, t: ids.len(), pos0: 0, starts };
            model.blocks_forward(&params, x, rows, None, &Local, arena).unwrap().0
        };
        let plain = hidden(&tokens, &[], &mut arena);
        let masked = hidden(&padded, &[pad], &mut arena);
        let c = 16;
        let close = |a: &[f32], b: &[f32]| a.iter().zip(b).all(|(x, y)| (x - y).abs() <= 1e-5 * (1.0 + y.abs()));
        assert!(
            close(&masked[pad * c..], &plain),
            "padded {:?}\nplain {:?}",
            &masked[pad * c..pad * c + 4],
            &plain[..4]
        );
        let unmasked = hidden(&padded, &[], &mut arena);
        assert!(!close(&unmasked[pad * c..], &plain), "without the mask the padding is read");
        // Decoding the last token against a cache of the padded prompt gives the same row.
        let mut cache = KvCache::new(&model, 1, padded.len(), &mut arena).unwrap();
        let prefix = &padded[..padded.len() - 1];
        let x = model.embed(&params, prefix, &Local, &mut arena).unwrap();
        let rows = Rows { b: 1, t: prefix.len(), pos0: 0, starts: &[pad] };
        model.blocks_forward(&params, x, rows, Some(&mut cache), &Local, &mut arena).unwrap();
        let x = model.embed(&params, &padded[padded.len() - 1..], &Local, &mut arena).unwrap();
        let rows = Rows { b: 1, t: 1, pos0: prefix.len(), starts: &[pad] };
        let last = model.blocks_forward(&params, x, rows, Some(&mut cache), &Local, &mut arena).unwrap().0;
        assert!(close(&last, &plain[(tokens.len() - 1) * c..]));
    }
}
