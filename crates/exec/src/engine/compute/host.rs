//! The host f32 reference: each layer is the `ops/` function of the same name.

use std::ops::Range;

use super::{Compute, GradView, InputGrad, KvRows, LogitStats, Optimize, RowCopy, View, VocabChunk};
use crate::comm::DataPlane;
use crate::engine::arena::{Arena, Mark};
use crate::engine::decode::{DecodeShape, Generated, HostDecoding};
use crate::engine::ops::*;
use crate::engine::sampling::{draw_uniform, sample_token, Sampling};
use crate::engine::EngineError;
use crate::engine::{AdamW, Objective, Replica};
use nereus_core::cost::{MemoryBreakdown, MemoryItem};
use nereus_core::model::LocalShape;

/// The host f32 engine: buffers from the rank's [`Arena`], layers from `ops/`.
pub struct Host<'a, 'l> {
    arena: &'a mut Arena<'l>,
    rope: &'a Rope<f32>,
}

impl<'a, 'l> Host<'a, 'l> {
    /// Computes with buffers charged to `arena` and the rotary tables `rope`.
    pub fn new(arena: &'a mut Arena<'l>, rope: &'a Rope<f32>) -> Self {
        Host { arena, rope }
    }
}

/// A training f32 shard in host memory: its parameters and Adam's moments, updated in place.
pub struct HostShard<'s> {
    /// Parameters.
    pub params: &'s mut [f32],
    /// Adam's first moment.
    pub m: &'s mut [f32],
    /// Adam's second moment.
    pub v: &'s mut [f32],
}

impl Optimize for Host<'_, '_> {
    type Trainable<'s> = HostShard<'s>;

    fn params<'a>(shard: &'a HostShard<'_>) -> &'a [f32] {
        shard.params
    }

    fn reduce_gradients<P: DataPlane>(
        &mut self,
        replica: &Replica,
        plane: &P,
        grads: &mut [f32],
        loss: f64,
    ) -> Result<(f64, f64), EngineError> {
        replica.reduce(plane, grads, loss)
    }

    fn adamw(
        &mut self,
        shard: &mut HostShard<'_>,
        grads: &[f32],
        tensors: &[(Range<usize>, bool)],
        opt: &AdamW,
        t: u64,
        clip: f32,
    ) -> Result<(), EngineError> {
        for (r, replicated) in tensors {
            let (p, m, v) = (&mut shard.params[r.clone()], &mut shard.m[r.clone()], &mut shard.v[r.clone()]);
            opt.update(p, m, v, &grads[r.clone()], t, clip, !replicated);
        }
        Ok(())
    }
}

fn at<'a>((p, r): View<'a, [f32]>) -> &'a [f32] {
    &p[r.clone()]
}

impl Compute for Host<'_, '_> {
    type Act = Vec<f32>;
    type Stat = Vec<f32>;
    type Params = [f32];
    type Grads = [f32];
    type Ids = Vec<u32>;

    fn zeros(&mut self, item: MemoryItem, len: usize) -> Result<Vec<f32>, EngineError> {
        self.arena.zeros(item, len)
    }

    fn stats(&mut self, item: MemoryItem, len: usize) -> Result<Vec<f32>, EngineError> {
        self.arena.zeros(item, len)
    }

    fn add(&mut self, x: &mut Vec<f32>, y: &Vec<f32>) -> Result<(), EngineError> {
        x.iter_mut().zip(y).for_each(|(a, &b)| *a += b);
        Ok(())
    }

    fn rmsnorm_forward(
        &mut self,
        y: &mut Vec<f32>,
        rstd: &mut Vec<f32>,
        x: &Vec<f32>,
        w: View<[f32]>,
        cols: usize,
        eps: f64,
    ) -> Result<(), EngineError> {
        rmsnorm_forward(y, rstd, x, at(w), cols, eps);
        Ok(())
    }

    fn rmsnorm_backward(
        &mut self,
        dx: &mut Vec<f32>,
        (grads, range): GradView<[f32]>,
        dy: &Vec<f32>,
        x: &Vec<f32>,
        w: View<[f32]>,
        rstd: &Vec<f32>,
        cols: usize,
    ) -> Result<(), EngineError> {
        rmsnorm_backward(dx, &mut grads[range.clone()], dy, x, at(w), rstd, cols);
        Ok(())
    }

    fn linear_forward(
        &mut self,
        y: &mut Vec<f32>,
        x: &Vec<f32>,
        w: View<[f32]>,
        n: usize,
        inp: usize,
        out: usize,
    ) -> Result<(), EngineError> {
        linear_forward(y, x, at(w), n, inp, out);
        Ok(())
    }

    fn linear_backward(
        &mut self,
        dx: InputGrad<'_, Vec<f32>>,
        (grads, range): GradView<[f32]>,
        dy: &Vec<f32>,
        x: &Vec<f32>,
        w: View<[f32]>,
        n: usize,
        inp: usize,
        out: usize,
    ) -> Result<(), EngineError> {
        let dx = match dx {
            InputGrad::Skip => None,
            InputGrad::Add(dx) => Some(dx.as_mut_slice()),
            InputGrad::Write(dx) => {
                dx.fill(0.0);
                Some(dx.as_mut_slice())
            }
        };
        linear_backward(dx, &mut grads[range.clone()], dy, x, at(w), n, inp, out);
        Ok(())
    }

    fn swiglu_forward(&mut self, h: &mut Vec<f32>, gu: &Vec<f32>, f: usize) -> Result<(), EngineError> {
        swiglu_forward(h, gu, f);
        Ok(())
    }

    fn swiglu_backward(
        &mut self,
        dgu: &mut Vec<f32>,
        dh: &Vec<f32>,
        gu: &Vec<f32>,
        f: usize,
    ) -> Result<(), EngineError> {
        swiglu_backward(dgu, dh, gu, f);
        Ok(())
    }

    fn rope(
        &mut self,
        x: &mut Vec<f32>,
        t: usize,
        heads: usize,
        pos0: usize,
        inverse: bool,
    ) -> Result<(), EngineError> {
        self.rope.apply(x, t, heads, pos0, inverse);
        Ok(())
    }

    fn attention_forward(
        &mut self,
        out: &mut Vec<f32>,
        q: &Vec<f32>,
        k: &Vec<f32>,
        v: &Vec<f32>,
        shape: AttentionShape,
        starts: &[usize],
    ) -> Result<Vec<f32>, EngineError> {
        let mut probs = self.arena.zeros(MemoryItem::Activations, shape.b * shape.heads * shape.tq * shape.tk)?;
        attention_forward(out, &mut probs, q, k, v, shape, starts);
        Ok(probs)
    }

    fn attention_backward(
        &mut self,
        (dq, dk, dv): (&mut Vec<f32>, &mut Vec<f32>, &mut Vec<f32>),
        dout: &Vec<f32>,
        _out: &Vec<f32>,
        probs: &Vec<f32>,
        (q, k, v): (&Vec<f32>, &Vec<f32>, &Vec<f32>),
        shape: AttentionShape,
        _starts: &[usize],
    ) -> Result<(), EngineError> {
        attention_backward(dq, dk, dv, dout, q, k, v, probs, shape);
        Ok(())
    }

    fn kv_append(&mut self, cache: &mut Vec<f32>, fresh: &Vec<f32>, r: KvRows) -> Result<(), EngineError> {
        let run = r.t * r.width;
        let copy = RowCopy {
            src_offset: 0,
            src_pitch: run,
            dst_offset: r.pos0 * r.width,
            dst_pitch: r.t_cap * r.width,
            width: run,
            rows: r.b,
        };
        self.copy_rows(cache, fresh, copy)
    }

    fn qkv_split(
        &mut self,
        (q, k, v): (&mut Vec<f32>, &mut Vec<f32>, &mut Vec<f32>),
        qkv: &Vec<f32>,
        layout: QkvLayout,
    ) -> Result<(), EngineError> {
        self.rope.split_qkv((q, k, v), qkv, layout);
        Ok(())
    }

    fn qkv_merge(
        &mut self,
        dqkv: &mut Vec<f32>,
        (dq, dk, dv): (&Vec<f32>, &Vec<f32>, &Vec<f32>),
        layout: QkvLayout,
    ) -> Result<(), EngineError> {
        self.rope.merge_qkv(dqkv, (dq, dk, dv), layout);
        Ok(())
    }

    fn copy_rows(&mut self, dst: &mut Vec<f32>, src: &Vec<f32>, c: RowCopy) -> Result<(), EngineError> {
        for i in 0..c.rows {
            let (from, to) = (c.src_offset + i * c.src_pitch, c.dst_offset + i * c.dst_pitch);
            dst[to..to + c.width].copy_from_slice(&src[from..from + c.width]);
        }
        Ok(())
    }

    type Decoding = HostDecoding;

    fn decode_begin(
        &mut self,
        prompts: &[u32],
        ids: &[u64],
        shape: DecodeShape,
        s: &Sampling,
        _dims: &LocalShape,
    ) -> Result<HostDecoding, EngineError> {
        Ok(HostDecoding::new(prompts, ids, shape, s))
    }

    fn decode_step(
        &mut self,
        d: &mut HostDecoding,
        _row: usize,
        step: impl FnOnce(&mut Self, &mut HostDecoding) -> Result<(), EngineError>,
    ) -> Result<(), EngineError> {
        step(self, d)
    }

    fn decode_embedding(
        &mut self,
        x: &mut Vec<f32>,
        d: &HostDecoding,
        w: View<[f32]>,
        v0: usize,
        c: usize,
    ) -> Result<(), EngineError> {
        self.embedding_forward(x, &d.last, w, v0, c)
    }

    fn decode_draw(
        &mut self,
        d: &mut HostDecoding,
        logits: &Vec<f32>,
        s: &Sampling,
        pos: usize,
    ) -> Result<(), EngineError> {
        let vocab = logits.len() / d.shape.b.max(1);
        // A sequence that has ended is not drawn (the advance keeps `eos` there).
        let rows = logits.chunks_exact(vocab).zip(&d.ids).zip(&d.done);
        let draw = |((row, &id), &done): ((&[f32], &u64), &bool)| match done {
            true => d.eos,
            false => sample_token(row, s, draw_uniform(s.seed, id, pos as u64)),
        };
        let drawn: Vec<u32> = rows.map(draw).collect();
        d.advance(&drawn, pos);
        Ok(())
    }

    fn decode_last(&mut self, d: &HostDecoding) -> Result<Vec<u32>, EngineError> {
        Ok(d.last.clone())
    }

    fn decode_advance(&mut self, d: &mut HostDecoding, drawn: &[u32], pos: usize) -> Result<(), EngineError> {
        d.advance(drawn, pos);
        Ok(())
    }

    fn decode_finished(&mut self, d: &HostDecoding, _step: usize) -> Result<bool, EngineError> {
        Ok(d.finished())
    }

    fn decode_end(&mut self, d: HostDecoding) -> Result<Generated, EngineError> {
        Ok(d.into_generated())
    }

    fn embedding_forward(
        &mut self,
        x: &mut Vec<f32>,
        tokens: &[u32],
        w: View<[f32]>,
        v0: usize,
        c: usize,
    ) -> Result<(), EngineError> {
        embedding_forward(x, tokens, at(w), v0, c);
        Ok(())
    }

    fn embedding_backward(
        &mut self,
        (grads, range): GradView<[f32]>,
        dx: &Vec<f32>,
        tokens: &[u32],
        v0: usize,
        c: usize,
    ) -> Result<(), EngineError> {
        embedding_backward(&mut grads[range.clone()], dx, tokens, v0, c);
        Ok(())
    }

    fn ids(&mut self, tokens: &[u32]) -> Result<Vec<u32>, EngineError> {
        Ok(tokens.to_vec())
    }

    fn log_probs_fold(
        &mut self,
        acc: &mut LogitStats<Vec<f32>>,
        logits: &Vec<f32>,
        targets: &Vec<u32>,
        chunk: VocabChunk,
    ) -> Result<(), EngineError> {
        let stats = RowStats { max: &mut acc.max, sum: &mut acc.sum, target: &mut acc.target };
        log_probs_fold(stats, logits, targets, chunk.col0, chunk.first);
        Ok(())
    }

    fn log_probs_finish<G: TensorGroup<f32>>(
        &mut self,
        acc: &mut LogitStats<Vec<f32>>,
        tp: &G,
    ) -> Result<(), EngineError> {
        let stats = RowStats { max: &mut acc.max, sum: &mut acc.sum, target: &mut acc.target };
        log_probs_finish(&mut acc.lse, &mut acc.logp, stats, tp)
    }

    fn log_probs_backward(
        &mut self,
        logits: &mut Vec<f32>,
        dlogp: &Vec<f32>,
        lse: &Vec<f32>,
        targets: &Vec<u32>,
        col0: usize,
    ) -> Result<(), EngineError> {
        log_probs_backward(logits, dlogp, lse, targets, col0);
        Ok(())
    }

    fn linear_input_grad_f32(
        &mut self,
        dx: &mut Vec<f32>,
        dy: &Vec<f32>,
        w: View<[f32]>,
        n: usize,
        inp: usize,
        out: usize,
    ) -> Result<(), EngineError> {
        linear_input_grad(dx, dy, at(w), n, inp, out);
        Ok(())
    }

    fn narrow(&mut self, y: &mut Vec<f32>, x: &Vec<f32>) -> Result<(), EngineError> {
        y.copy_from_slice(x);
        Ok(())
    }

    fn value_forward(&mut self, value: &mut Vec<f32>, x: &Vec<f32>, w: View<[f32]>) -> Result<(), EngineError> {
        value_forward(value, x, at(w));
        Ok(())
    }

    fn value_backward(
        &mut self,
        dx: &mut Vec<f32>,
        (grads, range): GradView<[f32]>,
        dvalue: &Vec<f32>,
        x: &Vec<f32>,
        w: View<[f32]>,
    ) -> Result<(), EngineError> {
        value_backward(dx, &mut grads[range.clone()], dvalue, x, at(w));
        Ok(())
    }

    fn read<T>(&mut self, x: &Vec<f32>, f: impl FnOnce(&[f32]) -> Result<T, EngineError>) -> Result<T, EngineError> {
        f(x)
    }

    fn modify<T>(
        &mut self,
        x: &mut Vec<f32>,
        f: impl FnOnce(&mut [f32]) -> Result<T, EngineError>,
    ) -> Result<T, EngineError> {
        f(x)
    }

    fn read_modify<T>(
        &mut self,
        src: &Vec<f32>,
        dst: &mut Vec<f32>,
        f: impl FnOnce(&[f32], &mut [f32]) -> Result<T, EngineError>,
    ) -> Result<T, EngineError> {
        f(src, dst)
    }

    fn read_stats<T>(
        &mut self,
        x: &Vec<f32>,
        f: impl FnOnce(&[f32]) -> Result<T, EngineError>,
    ) -> Result<T, EngineError> {
        f(x)
    }

    fn objective(
        &mut self,
        objective: &dyn Objective,
        seqs: Range<usize>,
        out: &Vec<f32>,
        dout: &mut Vec<f32>,
    ) -> Result<f64, EngineError> {
        Ok(objective.loss_and_grad(seqs, out, dout))
    }

    fn modify_grads<T>(
        &mut self,
        g: &mut [f32],
        f: impl FnOnce(&mut [f32]) -> Result<T, EngineError>,
    ) -> Result<T, EngineError> {
        f(g)
    }

    const ACT_BYTES: u64 = 4;

    fn mark(&self) -> Mark {
        self.arena.mark()
    }

    fn since(&self, mark: Mark) -> MemoryBreakdown {
        self.arena.since(mark)
    }

    fn release(&mut self, charges: &MemoryBreakdown) {
        self.arena.release(charges)
    }

    fn elements(a: &Self::Act) -> usize {
        a.len()
    }
}
