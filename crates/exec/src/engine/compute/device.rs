//! A GPU (or the grid emulator): activations in bf16, statistics, gradients and accumulations in
//! f32, layers as the kernels of `kernels/engine.cu` and `kernels/attention.cu`, linear layers as
//! the vendor GEMMs ([`crate::backend::blas`]). Every launch is enqueued on the device's current
//! stream. The tensor-parallel sums (bf16) and the pipeline's transfers run on the plane's
//! device collectives in the same stream order, as the data-parallel gradient sum does
//! ([`Optimize::reduce_gradients`]); on a plane without them they go through the host. The host waits only
//! where it reads bytes back: the loss, the norm's one value, and the LM head's per-row
//! statistics (their TP maxima and sums are a few values per row).
//! Input gradients accumulate in place (bf16 GEMMs with `beta = 1`, RMSNorm's backward adds to
//! `dx`); the few f32 scratch buffers (the flash attention backward's per-row `delta`, or the
//! scalar kernels' `dk`/`dv` gathers for heads wider than 128, the LM head's per-shard
//! statistics, the sampler's widened logits) stay charged to the arena until the caller releases
//! the micro-batch, as on the host, and `cost/reference.rs` prices each of them.

use std::ops::Range;

use super::{pipe_through_host, Compute, GradView, KvRows, Neighbour, Optimize, PipeLink, RowCopy, View};
use crate::backend::blas::{Gemm, GemmOut};
use crate::backend::gpu::{Device, DeviceArray, DevicePtr, DeviceView};
use crate::backend::kernels::RectCopy;
use crate::backend::sources::{
    flash_keys_grid, flash_rows_grid, AdamTensor, FlashWidth, KernelArg, KernelArgs, Launch, ATTENTION_BLOCK,
    FLASH_WARPS,
};
use crate::comm::collectives::DataType;
use crate::comm::DataPlane;
use crate::engine::arena::{Arena, Mark};
use crate::engine::generate::Sampling;
use crate::engine::ops::{AttentionShape, Rope, TensorGroup};
use crate::engine::real::Op;
use crate::engine::timers::timed;
use crate::engine::{AdamW, EngineError, Replica};
use nereus_core::cost::{MemoryBreakdown, MemoryItem, OpClass};
use nereus_core::half::{bf16_to_f32, f32_to_bf16};

/// Threads per block of the row and element-wise kernels.
const BLOCK: u32 = 256;
/// At most this many blocks per launch: the kernels stride over the rest.
const MAX_BLOCKS: u64 = 4096;

/// bf16 activations on a device.
pub type Bf16<'d> = DeviceArray<'d, u16>;
/// f32 statistics or gradients on a device.
pub type F32<'d> = DeviceArray<'d, f32>;

/// A stage's layers on `device`, buffers charged to the rank's [`Arena`] under the items the
/// cost model prices, rotary tables uploaded once.
pub struct OnDevice<'d, 'a, 'l> {
    device: &'d Device,
    arena: &'a mut Arena<'l>,
    cos: F32<'d>,
    sin: F32<'d>,
    half: usize,
}

impl<'d, 'a, 'l> OnDevice<'d, 'a, 'l> {
    /// Computes on `device` with buffers charged to `arena` and the tables of `rope`.
    pub fn new(device: &'d Device, arena: &'a mut Arena<'l>, rope: &Rope<f32>) -> Result<Self, EngineError> {
        let (cos, sin) = rope.tables();
        let bytes = 4 * (cos.len() + sin.len()) as u64;
        arena.charge(MemoryItem::Activations, bytes)?;
        let (cos, sin) = (DeviceArray::from(device, cos)?, DeviceArray::from(device, sin)?);
        Ok(OnDevice { device, arena, cos, sin, half: rope.half() })
    }

    /// The device computed on.
    pub fn device(&self) -> &'d Device {
        self.device
    }

    /// One fused AdamW launch over the table `tensors` (update number `t`, gradients scaled by
    /// `clip`): the f32 master weights and moments, then each bf16 working copy.
    fn adamw_table(&mut self, tensors: &[AdamTensor], opt: &AdamW, t: u64, clip: f32) -> Result<(), EngineError> {
        let table = DeviceArray::from(self.device, tensors)?;
        let (c1, c2) = (1.0 - opt.beta1.powi(t as i32), 1.0 - opt.beta2.powi(t as i32));
        let hyper = [opt.lr, opt.beta1, opt.beta2, opt.eps, c1, c2, clip].map(KernelArg::F32);
        let args = [vec![ptr(table.ptr()), KernelArg::I32(tensors.len() as i32)], hyper.to_vec()].concat();
        let widest = tensors.iter().map(|x| x.n as usize).max().unwrap_or(1);
        // The table is freed in stream order, after the launch has read it.
        self.elementwise("nereus_adamw", widest, args)
    }

    /// `Σ x²` over `runs` of `x`, on the device (`nereus_sum_squares`: a partial per block, then
    /// one block adds them), read back as one value per run.
    fn sum_squares(&mut self, x: &DeviceView<f32>, runs: &[Range<usize>]) -> Result<f64, EngineError> {
        let widest = runs.iter().map(Range::len).max().unwrap_or(0);
        let blocks = (widest as u64).div_ceil(u64::from(BLOCK) * 2).clamp(1, MAX_BLOCKS);
        let partial = self.f32_zeros(MemoryItem::Workspace, blocks as usize + 1)?;
        let mut total = 0.0;
        for r in runs.iter().filter(|r| !r.is_empty()) {
            let grid = (r.len() as u64).div_ceil(u64::from(BLOCK) * 2).clamp(1, MAX_BLOCKS);
            let first = vec![ptr(partial.at(1)), ptr(x.at(r.start)), len(r.len()), KernelArg::I32(1)];
            self.launch("nereus_sum_squares", [grid as u32, 1, 1], BLOCK, first)?;
            let second = vec![ptr(partial.ptr()), ptr(partial.at(1)), KernelArg::U64(grid), KernelArg::I32(0)];
            self.launch("nereus_sum_squares", [1, 1, 1], BLOCK, second)?;
            // The first element holds the run's sum (a few KiB come back with it).
            total += f64::from(partial.read()?[0]);
        }
        Ok(total)
    }

    fn launch(
        &self,
        kernel: &'static str,
        grid: [u32; 3],
        block: u32,
        args: Vec<KernelArg>,
    ) -> Result<(), EngineError> {
        let launch = Launch { kernel, grid, block: [block, 1, 1], shared_bytes: 0 };
        // SAFETY: each caller passes the kernel's parameters with buffers of the sizes it touches.
        unsafe { self.device.launch(&launch, &mut KernelArgs::new(args))? };
        Ok(())
    }

    /// One block per row (up to [`MAX_BLOCKS`]; the kernels stride over the rest).
    fn rows(&self, kernel: &'static str, rows: usize, args: Vec<KernelArg>) -> Result<(), EngineError> {
        self.launch(kernel, [(rows as u64).clamp(1, MAX_BLOCKS) as u32, 1, 1], BLOCK, args)
    }

    /// A grid-stride launch over `n` elements, a few elements per thread.
    fn elementwise(&self, kernel: &'static str, n: usize, args: Vec<KernelArg>) -> Result<(), EngineError> {
        let blocks = (n as u64).div_ceil(u64::from(BLOCK) * 2).clamp(1, MAX_BLOCKS);
        self.launch(kernel, [blocks as u32, 1, 1], BLOCK, args)
    }

    fn gemm(&self, g: Gemm, a: DevicePtr, b: DevicePtr, c: DevicePtr) -> Result<(), EngineError> {
        // SAFETY: callers pass buffers holding op(A)[m,k], op(B)[k,n] and C[m,n] of `g`.
        unsafe { self.device.gemm(&g, a, b, c)? };
        Ok(())
    }

    /// `f32` scratch charged under `item`.
    fn f32_zeros(&mut self, item: MemoryItem, len: usize) -> Result<F32<'d>, EngineError> {
        self.arena.charge(item, 4 * len as u64)?;
        Ok(DeviceArray::zeros(self.device, len)?)
    }

    /// `y = bf16(x)`.
    fn round(&self, y: &Bf16<'d>, x: &F32<'d>) -> Result<(), EngineError> {
        self.elementwise("nereus_cast_f32_to_bf16", x.len(), vec![ptr(y.ptr()), ptr(x.ptr()), len(x.len())])
    }

    /// Threads per block of the flash attention kernels: their warps at this device's width.
    fn flash_threads(&self) -> u32 {
        FLASH_WARPS * self.device.runtime().warp_width()
    }

    /// Token ids as the kernels read them.
    fn tokens(&self, tokens: &[u32]) -> Result<DeviceArray<'d, i32>, EngineError> {
        let ids: Vec<i32> = tokens.iter().map(|&t| t as i32).collect();
        Ok(DeviceArray::from(self.device, &ids)?)
    }

    /// The `starts` argument: null when no sequence is padded, as the kernels read it.
    fn starts(&self, starts: &[usize]) -> Result<Option<DeviceArray<'d, i32>>, EngineError> {
        if starts.iter().all(|&s| s == 0) {
            return Ok(None);
        }
        let values: Vec<i32> = starts.iter().map(|&s| s as i32).collect();
        Ok(Some(DeviceArray::from(self.device, &values)?))
    }
}

/// A training bf16 shard on a device: the parameters the layers read, Adam's moments and the
/// f32 master copy the optimizer updates (the shard's four sections, in place).
#[derive(Debug, Clone, Copy)]
pub struct MixedShard {
    /// bf16 working parameters.
    pub params: DeviceView<u16>,
    /// Adam's first moment.
    pub m: DeviceView<f32>,
    /// Adam's second moment.
    pub v: DeviceView<f32>,
    /// f32 master weights.
    pub master: DeviceView<f32>,
}

impl<'d> Optimize for OnDevice<'d, '_, '_> {
    type Trainable<'s> = MixedShard;

    fn params(shard: &MixedShard) -> &DeviceView<u16> {
        &shard.params
    }

    /// The gradients stay on the device: the data-parallel sum runs on the plane's device
    /// collective (NCCL, RCCL) in stream order and the norm is summed there; a plane without
    /// device collectives sums them through the host.
    fn reduce_gradients<P: DataPlane>(
        &mut self,
        replica: &Replica,
        plane: &P,
        grads: &mut DeviceView<f32>,
        loss: f64,
    ) -> Result<(f64, f64), EngineError> {
        let on_device = match replica.groups.dp {
            Some(_) => timed(OpClass::DpAllReduce, || {
                plane.all_reduce_device(&replica.groups.dp_ranks, grads.ptr(), grads.len() as u64, DataType::F32)
            })?,
            None => true,
        };
        if !on_device {
            return self.modify_grads(grads, |g| replica.reduce(plane, g, loss));
        }
        let sq = self.sum_squares(grads, &replica.counted_runs())?;
        replica.norm_and_loss(plane, sq, loss)
    }

    fn adamw(
        &mut self,
        shard: &mut MixedShard,
        grads: &DeviceView<f32>,
        tensors: &[(Range<usize>, bool)],
        opt: &AdamW,
        t: u64,
        clip: f32,
    ) -> Result<(), EngineError> {
        let table: Vec<AdamTensor> = tensors
            .iter()
            .map(|(r, replicated)| AdamTensor {
                param: shard.master.at(r.start).0,
                m: shard.m.at(r.start).0,
                v: shard.v.at(r.start).0,
                working: shard.params.at(r.start).0,
                grad: grads.at(r.start).0,
                n: r.len() as u64,
                weight_decay: if *replicated { 0.0 } else { opt.weight_decay },
                pad: 0,
            })
            .collect();
        self.adamw_table(&table, opt, t, clip)
    }
}

/// Per row, `(lse, logp)` over the whole vocabulary from each shard's `(max, Σ exp(z − max),
/// target logit or −inf)`: the group's maximum, the sums rescaled to it and added, and the one
/// shard's target logit (Milakov & Gimelshein 2018's online-softmax merge).
fn combine_shards<G: TensorGroup<f32>>(
    local_max: Vec<f32>,
    sum: Vec<f32>,
    target: Vec<f32>,
    tp: &G,
) -> Result<(Vec<f32>, Vec<f32>), EngineError> {
    let mut max = local_max.clone();
    tp.max(&mut max)?;
    let mut sums: Vec<f32> = sum.iter().zip(&local_max).zip(&max).map(|((&s, &m), &g)| s * (m - g).exp()).collect();
    tp.sum(&mut sums)?;
    let mut target: Vec<f32> = target.into_iter().map(|t| if t.is_finite() { t } else { 0.0 }).collect();
    tp.sum(&mut target)?;
    let lse: Vec<f32> = max.iter().zip(&sums).map(|(&m, &s)| m + s.ln()).collect();
    let logp = target.iter().zip(&lse).map(|(&t, &l)| t - l).collect();
    Ok((lse, logp))
}

fn widen(values: &[u16]) -> Vec<f32> {
    values.iter().map(|&h| bf16_to_f32(h)).collect()
}

fn narrow(values: &[f32]) -> Vec<u16> {
    values.iter().map(|&v| f32_to_bf16(v)).collect()
}

fn ptr(p: DevicePtr) -> KernelArg {
    KernelArg::Ptr(p.0)
}

fn len(n: usize) -> KernelArg {
    KernelArg::U64(n as u64)
}

fn weight((p, r): View<DeviceView<u16>>) -> DevicePtr {
    p.at(r.start)
}

fn attention_args(a: &AttentionShape) -> Vec<KernelArg> {
    [a.b, a.tq, a.tk, a.t_cap, a.heads, a.kv_heads, a.d].iter().map(|&v| len(v)).collect()
}

fn attention_grid(a: &AttentionShape) -> [u32; 3] {
    [a.tq as u32, a.heads as u32, a.b as u32]
}

impl<'d> Compute for OnDevice<'d, '_, '_> {
    type Act = Bf16<'d>;
    type Stat = F32<'d>;
    type Params = DeviceView<u16>;
    type Grads = DeviceView<f32>;

    fn zeros(&mut self, item: MemoryItem, len: usize) -> Result<Self::Act, EngineError> {
        self.arena.charge(item, 2 * len as u64)?;
        Ok(DeviceArray::zeros(self.device, len)?)
    }

    fn stats(&mut self, item: MemoryItem, len: usize) -> Result<Self::Stat, EngineError> {
        self.f32_zeros(item, len)
    }

    fn duplicate(&mut self, item: MemoryItem, x: &Self::Act) -> Result<Self::Act, EngineError> {
        // bf16(0 + x) is x exactly.
        let mut copy = self.zeros(item, x.len())?;
        self.add(&mut copy, x)?;
        Ok(copy)
    }

    fn add(&mut self, x: &mut Self::Act, y: &Self::Act) -> Result<(), EngineError> {
        self.elementwise("nereus_residual_add", x.len(), vec![ptr(x.ptr()), ptr(y.ptr()), len(x.len())])
    }

    fn rmsnorm_forward(
        &mut self,
        y: &mut Self::Act,
        rstd: &mut Self::Stat,
        x: &Self::Act,
        w: View<Self::Params>,
        cols: usize,
        eps: f64,
    ) -> Result<(), EngineError> {
        let rows = x.len() / cols;
        let args = vec![ptr(y.ptr()), ptr(rstd.ptr()), ptr(x.ptr()), ptr(weight(w)), len(rows), len(cols)];
        self.rows("nereus_rmsnorm_forward", rows, [args, vec![KernelArg::F32(eps as f32)]].concat())
    }

    fn rmsnorm_backward(
        &mut self,
        dx: &mut Self::Act,
        (grads, range): GradView<Self::Grads>,
        dy: &Self::Act,
        x: &Self::Act,
        w: View<Self::Params>,
        rstd: &Self::Stat,
        cols: usize,
    ) -> Result<(), EngineError> {
        let rows = x.len() / cols;
        // The kernel adds its dx to the residual stream's gradient.
        let args = [ptr(dx.ptr()), ptr(grads.at(range.start)), ptr(dy.ptr()), ptr(x.ptr()), ptr(weight(w))];
        self.rows("nereus_rmsnorm_backward", rows, [&args[..], &[ptr(rstd.ptr()), len(rows), len(cols)]].concat())
    }

    fn linear_forward(
        &mut self,
        y: &mut Self::Act,
        x: &Self::Act,
        w: View<Self::Params>,
        n: usize,
        inp: usize,
        out: usize,
    ) -> Result<(), EngineError> {
        let g = Gemm { m: n, k: inp, n: out, op_a: Op::N, op_b: Op::T, out: GemmOut::Bf16 { accumulate: false } };
        self.gemm(g, x.ptr(), weight(w), y.ptr())
    }

    fn linear_backward(
        &mut self,
        dx: Option<&mut Self::Act>,
        (grads, range): GradView<Self::Grads>,
        dy: &Self::Act,
        x: &Self::Act,
        w: View<Self::Params>,
        n: usize,
        inp: usize,
        out: usize,
    ) -> Result<(), EngineError> {
        if let Some(dx) = dx {
            let g = Gemm { m: n, k: out, n: inp, op_a: Op::N, op_b: Op::N, out: GemmOut::Bf16 { accumulate: true } };
            self.gemm(g, dy.ptr(), weight(w), dx.ptr())?;
        }
        // Weight gradients accumulate in f32, across micro-batches too.
        let g = Gemm { m: out, k: n, n: inp, op_a: Op::T, op_b: Op::N, out: GemmOut::F32 { accumulate: true } };
        self.gemm(g, dy.ptr(), x.ptr(), grads.at(range.start))
    }

    fn swiglu_forward(&mut self, h: &mut Self::Act, g: &Self::Act, u: &Self::Act) -> Result<(), EngineError> {
        self.elementwise("nereus_swiglu_forward", h.len(), vec![ptr(h.ptr()), ptr(g.ptr()), ptr(u.ptr()), len(h.len())])
    }

    fn swiglu_backward(
        &mut self,
        dg: &mut Self::Act,
        du: &mut Self::Act,
        dh: &Self::Act,
        g: &Self::Act,
        u: &Self::Act,
    ) -> Result<(), EngineError> {
        let args = vec![ptr(dg.ptr()), ptr(du.ptr()), ptr(dh.ptr()), ptr(g.ptr()), ptr(u.ptr()), len(dh.len())];
        self.elementwise("nereus_swiglu_backward", dh.len(), args)
    }

    fn rope(
        &mut self,
        x: &mut Self::Act,
        t: usize,
        heads: usize,
        pos0: usize,
        inverse: bool,
    ) -> Result<(), EngineError> {
        let rows = x.len() / (heads * 2 * self.half);
        let mut args = vec![ptr(x.ptr()), ptr(self.cos.ptr()), ptr(self.sin.ptr())];
        args.extend([rows, t, heads, self.half, pos0].map(len));
        args.push(KernelArg::I32(i32::from(inverse)));
        self.elementwise("nereus_rope", rows * heads * self.half, args)
    }

    fn attention_forward(
        &mut self,
        out: &mut Self::Act,
        q: &Self::Act,
        k: &Self::Act,
        v: &Self::Act,
        shape: AttentionShape,
        starts: &[usize],
    ) -> Result<Self::Stat, EngineError> {
        let lse = self.f32_zeros(MemoryItem::Activations, shape.b * shape.heads * shape.tq)?;
        let starts = self.starts(starts)?;
        let buffers =
            [out.ptr(), lse.ptr(), q.ptr(), k.ptr(), v.ptr(), starts.as_ref().map_or(DevicePtr(0), |s| s.ptr())];
        let args = [buffers.map(ptr).to_vec(), attention_args(&shape)].concat();
        match FlashWidth::for_head(shape.d) {
            Some(width) => {
                let grid = flash_rows_grid(shape.b, shape.tq, shape.heads, shape.kv_heads);
                self.launch(width.forward(), grid, self.flash_threads(), args)?;
            }
            None => self.launch("nereus_attention_forward", attention_grid(&shape), ATTENTION_BLOCK, args)?,
        }
        Ok(lse)
    }

    fn attention_backward(
        &mut self,
        (dq, dk, dv): (&mut Self::Act, &mut Self::Act, &mut Self::Act),
        dout: &Self::Act,
        out: &Self::Act,
        lse: &Self::Stat,
        (q, k, v): (&Self::Act, &Self::Act, &Self::Act),
        shape: AttentionShape,
        starts: &[usize],
    ) -> Result<(), EngineError> {
        let starts_buffer = self.starts(starts)?;
        let starts_ptr = ptr(starts_buffer.as_ref().map_or(DevicePtr(0), |s| s.ptr()));
        if let Some(width) = FlashWidth::for_head(shape.d) {
            // dq (and each row's Σ dout·out) per row tile, then dk, dv per key tile: no atomics.
            let delta = self.f32_zeros(MemoryItem::ActivationGradients, shape.b * shape.heads * shape.tq)?;
            let dq_buffers = [dq.ptr(), delta.ptr(), dout.ptr(), out.ptr()];
            let inputs = [lse.ptr(), q.ptr(), k.ptr(), v.ptr()];
            let args =
                [dq_buffers.map(ptr).to_vec(), inputs.map(ptr).to_vec(), vec![starts_ptr], attention_args(&shape)];
            let grid = flash_rows_grid(shape.b, shape.tq, shape.heads, shape.kv_heads);
            self.launch(width.backward_dq(), grid, self.flash_threads(), args.concat())?;
            let dkv_buffers = [dk.ptr(), dv.ptr(), dout.ptr(), lse.ptr(), delta.ptr(), q.ptr(), k.ptr(), v.ptr()];
            let args = [dkv_buffers.map(ptr).to_vec(), vec![starts_ptr], attention_args(&shape)];
            let grid = flash_keys_grid(shape.b, shape.tk, shape.kv_heads);
            return self.launch(width.backward_dkv(), grid, self.flash_threads(), args.concat());
        }
        // Key and value gradients gather over query rows with f32 atomics, then round once.
        let dk32 = self.f32_zeros(MemoryItem::ActivationGradients, dk.len())?;
        let dv32 = self.f32_zeros(MemoryItem::ActivationGradients, dv.len())?;
        let buffers = [dq.ptr(), dk32.ptr(), dv32.ptr(), dout.ptr(), out.ptr(), lse.ptr(), q.ptr(), k.ptr(), v.ptr()];
        let mut args = buffers.map(ptr).to_vec();
        args.push(starts_ptr);
        args.extend(attention_args(&shape));
        self.launch("nereus_attention_backward", attention_grid(&shape), ATTENTION_BLOCK, args)?;
        self.round(dk, &dk32)?;
        self.round(dv, &dv32)
    }

    fn kv_append(&mut self, cache: &mut Self::Act, fresh: &Self::Act, r: KvRows) -> Result<(), EngineError> {
        let args = vec![ptr(cache.ptr()), ptr(fresh.ptr())];
        let shape = [r.b, r.t, r.t_cap, r.pos0, r.width].map(len);
        self.elementwise("nereus_kv_append", fresh.len(), [args, shape.to_vec()].concat())
    }

    fn embedding_forward(
        &mut self,
        x: &mut Self::Act,
        tokens: &[u32],
        w: View<Self::Params>,
        v0: usize,
        c: usize,
    ) -> Result<(), EngineError> {
        let ids = self.tokens(tokens)?;
        let rows = w.1.len() / c;
        let args = vec![ptr(x.ptr()), ptr(ids.ptr()), ptr(weight(w)), len(tokens.len()), len(c), len(v0), len(rows)];
        self.elementwise("nereus_embedding_forward", tokens.len() * c, args)
    }

    fn embedding_backward(
        &mut self,
        (grads, range): GradView<Self::Grads>,
        dx: &Self::Act,
        tokens: &[u32],
        v0: usize,
        c: usize,
    ) -> Result<(), EngineError> {
        let ids = self.tokens(tokens)?;
        let rows = range.len() / c;
        let args = vec![ptr(grads.at(range.start)), ptr(dx.ptr()), ptr(ids.ptr()), len(tokens.len()), len(c), len(v0)];
        self.elementwise("nereus_embedding_backward", tokens.len() * c, [args, vec![len(rows)]].concat())
    }

    fn log_probs_forward<G: TensorGroup<f32>>(
        &mut self,
        logits: &Self::Act,
        targets: &[u32],
        v0: usize,
        tp: &G,
    ) -> Result<(Self::Stat, Self::Stat), EngineError> {
        let n = targets.len();
        let ids = self.tokens(targets)?;
        let item = MemoryItem::Logits;
        let (max, sum, target) = (self.f32_zeros(item, n)?, self.f32_zeros(item, n)?, self.f32_zeros(item, n)?);
        let args = vec![ptr(max.ptr()), ptr(sum.ptr()), ptr(target.ptr()), ptr(logits.ptr()), ptr(ids.ptr())];
        self.rows("nereus_logits_row_stats", n, [args, vec![len(n), len(logits.len() / n.max(1)), len(v0)]].concat())?;
        let (lse, logp) = combine_shards(max.read()?, sum.read()?, target.read()?, tp)?;
        self.arena.charge(item, 8 * n as u64)?;
        Ok((DeviceArray::from(self.device, &logp)?, DeviceArray::from(self.device, &lse)?))
    }

    fn log_probs_backward(
        &mut self,
        dlogits: &mut Self::Act,
        dlogp: &Self::Stat,
        logits: &Self::Act,
        lse: &Self::Stat,
        targets: &[u32],
        v0: usize,
    ) -> Result<(), EngineError> {
        let ids = self.tokens(targets)?;
        let (n, v) = (targets.len(), logits.len() / targets.len().max(1));
        let args = vec![ptr(dlogits.ptr()), ptr(logits.ptr()), ptr(lse.ptr()), ptr(dlogp.ptr()), ptr(ids.ptr())];
        self.elementwise("nereus_logprob_backward", n * v, [args, vec![len(n), len(v), len(v0)]].concat())
    }

    fn value_forward(
        &mut self,
        value: &mut Self::Stat,
        x: &Self::Act,
        w: View<Self::Params>,
    ) -> Result<(), EngineError> {
        let c = w.1.len();
        let g = Gemm { m: value.len(), k: c, n: 1, op_a: Op::N, op_b: Op::T, out: GemmOut::F32 { accumulate: false } };
        self.gemm(g, x.ptr(), weight(w), value.ptr())
    }

    fn value_backward(
        &mut self,
        dx: &mut Self::Act,
        (grads, range): GradView<Self::Grads>,
        dvalue: &Self::Stat,
        x: &Self::Act,
        w: View<Self::Params>,
    ) -> Result<(), EngineError> {
        let (n, c) = (dvalue.len(), range.len());
        // The GEMMs take bf16 operands: the per-row gradient is rounded once.
        let narrow = self.zeros(MemoryItem::ActivationGradients, n)?;
        self.round(&narrow, dvalue)?;
        let g = Gemm { m: n, k: 1, n: c, op_a: Op::N, op_b: Op::N, out: GemmOut::Bf16 { accumulate: true } };
        self.gemm(g, narrow.ptr(), weight(w), dx.ptr())?;
        let g = Gemm { m: 1, k: n, n: c, op_a: Op::T, op_b: Op::N, out: GemmOut::F32 { accumulate: true } };
        self.gemm(g, narrow.ptr(), x.ptr(), grads.at(range.start))
    }

    fn copy_rows(&mut self, dst: &mut Self::Act, src: &Self::Act, c: RowCopy) -> Result<(), EngineError> {
        let copy = RectCopy {
            src_offset: 2 * c.src_offset as u64,
            src_pitch: 2 * c.src_pitch as u64,
            dst_offset: 2 * c.dst_offset as u64,
            dst_pitch: 2 * c.dst_pitch as u64,
            row_bytes: 2 * c.width as u64,
            rows: c.rows as u64,
        };
        // SAFETY: the engine's copies stay inside both buffers (their shapes come from the same
        // dims that sized them); `dst` and `src` are distinct buffers.
        unsafe { self.device.copy_rects(src.ptr(), dst.ptr(), &[copy])? };
        Ok(())
    }

    /// Every row is drawn in one launch (a block per row); ended rows cost nothing extra.
    fn sample(
        &mut self,
        logits: &Self::Act,
        s: &Sampling,
        u: &[f64],
        active: &[bool],
    ) -> Result<Vec<u32>, EngineError> {
        let rows = u.len();
        // The sampler reads f32 logits (its bisection runs over float bit patterns).
        let wide = self.f32_zeros(MemoryItem::Logits, logits.len())?;
        let cast = vec![ptr(wide.ptr()), ptr(logits.ptr()), len(logits.len())];
        self.elementwise("nereus_cast_bf16_to_f32", logits.len(), cast)?;
        let draws: Vec<f32> = u.iter().map(|&u| u as f32).collect();
        let (draws, tokens) = (DeviceArray::from(self.device, &draws)?, DeviceArray::<i32>::zeros(self.device, rows)?);
        let mut args =
            vec![ptr(tokens.ptr()), ptr(wide.ptr()), ptr(draws.ptr()), len(rows), len(logits.len() / rows.max(1))];
        args.extend([KernelArg::F32(s.temperature), KernelArg::F32(s.top_p), KernelArg::I32(i32::from(s.greedy))]);
        self.rows("nereus_sample", rows, args)?;
        let drawn = tokens.read()?.into_iter().zip(active);
        Ok(drawn.map(|(t, &active)| if active { t as u32 } else { s.eos }).collect())
    }

    fn read<T>(&mut self, x: &Self::Act, f: impl FnOnce(&[f32]) -> Result<T, EngineError>) -> Result<T, EngineError> {
        f(&widen(&x.read()?))
    }

    fn modify<T>(
        &mut self,
        x: &mut Self::Act,
        f: impl FnOnce(&mut [f32]) -> Result<T, EngineError>,
    ) -> Result<T, EngineError> {
        let mut values = widen(&x.read()?);
        let out = f(&mut values)?;
        x.view().write(self.device, &narrow(&values))?;
        Ok(out)
    }

    fn read_modify<T>(
        &mut self,
        src: &Self::Act,
        dst: &mut Self::Act,
        f: impl FnOnce(&[f32], &mut [f32]) -> Result<T, EngineError>,
    ) -> Result<T, EngineError> {
        let src = widen(&src.read()?);
        self.modify(dst, |values| f(&src, values))
    }

    fn read_stats<T>(
        &mut self,
        x: &Self::Stat,
        f: impl FnOnce(&[f32]) -> Result<T, EngineError>,
    ) -> Result<T, EngineError> {
        f(&x.read()?)
    }

    fn read_modify_stats<T>(
        &mut self,
        src: &Self::Stat,
        dst: &mut Self::Stat,
        f: impl FnOnce(&[f32], &mut [f32]) -> Result<T, EngineError>,
    ) -> Result<T, EngineError> {
        let src = src.read()?;
        let mut values = dst.read()?;
        let out = f(&src, &mut values)?;
        dst.view().write(self.device, &values)?;
        Ok(out)
    }

    fn modify_grads<T>(
        &mut self,
        g: &mut Self::Grads,
        f: impl FnOnce(&mut [f32]) -> Result<T, EngineError>,
    ) -> Result<T, EngineError> {
        let mut values = g.read(self.device)?;
        let out = f(&mut values)?;
        g.write(self.device, &values)?;
        Ok(out)
    }

    const ACT_BYTES: u64 = 2;

    fn tp_sum<G: TensorGroup<f32>>(&mut self, tp: &G, x: &mut Self::Act) -> Result<(), EngineError> {
        if tp.is_single() || tp.sum_bf16_on_device(x.ptr(), x.len())? {
            return Ok(());
        }
        self.modify(x, |values| tp.sum(values))
    }

    fn pipe<L: PipeLink>(
        &mut self,
        link: &L,
        send: Option<(Neighbour, &Self::Act)>,
        recv: Option<(Neighbour, &mut Self::Act)>,
    ) -> Result<(), EngineError> {
        let bytes = |x: &Self::Act| Self::ACT_BYTES * x.len() as u64;
        let on_device = link.exchange_on_device(
            send.as_ref().map(|(n, x)| (*n, x.ptr(), bytes(x))),
            recv.as_ref().map(|(n, x)| (*n, x.ptr(), bytes(x))),
        )?;
        if on_device {
            return Ok(());
        }
        pipe_through_host(self, link, send, recv)
    }

    fn mark(&self) -> Mark {
        self.arena.mark()
    }

    fn since(&self, mark: Mark) -> MemoryBreakdown {
        self.arena.since(mark)
    }

    fn release(&mut self, charges: &MemoryBreakdown) {
        self.arena.release(charges)
    }
}
