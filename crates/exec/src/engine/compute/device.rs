//! A GPU (or the grid emulator): activations in bf16, statistics, gradients and accumulations in
//! f32, layers as the kernels of `crates/kernels/device/` (one file per op family), linear layers as
//! the vendor GEMMs ([`crate::backend::blas`]). Every launch is enqueued on the device's current
//! stream. The tensor-parallel sums (bf16) and the pipeline's transfers run on the plane's
//! device collectives in the same stream order, as the data-parallel gradient sum does
//! ([`Optimize::reduce_gradients`]); on a plane without them they go through the host. The host waits only
//! where it reads bytes back: once a step for the loss and the norm's sums (the step's scalars,
//! one read), and, per micro-batch, where an objective has no device form (the RL losses read
//! their log-probs) or the LM head is split over TP (its per-row maxima and sums are combined on
//! the host: a few values per row).
//! Input gradients accumulate in place (bf16 GEMMs with `beta = 1`, RMSNorm's backward adds to
//! `dx`); the few f32 scratch buffers (the flash attention backward's per-row `delta`, or the
//! scalar kernels' `dk`/`dv` gathers for heads wider than 128, the LM head's per-shard
//! statistics, the sampler's widened logits) stay charged to the arena until the caller releases
//! the micro-batch, as on the host, and `cost/reference.rs` prices each of them.

use std::ops::Range;

use super::decoding::{as_int, relative_to, DeviceDecoding};
use super::{
    pipe_through_host, Compute, GradView, InputGrad, KvRows, LogitStats, Neighbour, Optimize, PipeLink, RowCopy, View,
    VocabChunk,
};
use crate::backend::blas::{Gemm, GemmOut};
use crate::backend::gpu::{Device, DeviceArray, DevicePtr, DeviceView};
use crate::backend::linalg::Op;
use crate::comm::collectives::DataType;
use crate::comm::DataPlane;
use crate::engine::arena::{Arena, Mark};
use crate::engine::decode::{DecodeShape, Generated};
use crate::engine::ops::{log_probs_finish, AttentionShape, QkvLayout, Rope, RowStats, TensorGroup};
use crate::engine::sampling::{SampleBuffers, Sampling};
use crate::engine::timers::timed;
use crate::engine::{AdamW, DeviceObjective, EngineError, Objective, Replica};
use nereus_core::cost::reference::DecodeSplit;
use nereus_core::cost::{MemoryBreakdown, MemoryItem, OpClass};
use nereus_core::half::{bf16_to_f32, f32_to_bf16};
use nereus_core::model::LocalShape;
use nereus_kernels::args::{self as k, AdamTensor, AttentionDims, AttentionInputs};
use nereus_kernels::attention::{
    attention_grid, decode_combine_grid, decode_grid, flash_keys_grid, flash_rows_grid, flash_threads, FlashWidth,
    ATTENTION_BLOCK, DECODE_THREADS, FLASH_MAX_HEAD_DIM,
};
use nereus_kernels::pack::RectCopy;
use nereus_kernels::KernelCall;

/// Threads per block of the row and element-wise kernels.
const BLOCK: u32 = 256;
// The cost model prices the flash path for exactly the heads the kernels take.
const _: () = assert!(nereus_core::cost::reference::FLASH_MAX_HEAD_DIM == FLASH_MAX_HEAD_DIM);
// The cost model splits flash-decoding's keys, and sizes its scratch, as the kernels take them.
const _: () = {
    use nereus_core::cost::reference as model;
    use nereus_kernels::attention as kernels;
    assert!(model::DECODE_TILE == kernels::DECODE_TILE && model::DECODE_MAX_GROUP == kernels::DECODE_MAX_GROUP);
    assert!(model::DECODE_MAX_HEAD_DIM == kernels::DECODE_MAX_HEAD_DIM);
    assert!(model::DECODE_MAX_OUTPUTS == kernels::DECODE_MAX_OUTPUTS);
};
/// At most this many blocks per launch: the kernels stride over the rest.
const MAX_BLOCKS: u64 = 4096;
/// Blocks of the RMSNorm backward: each sums its rows' weight gradient in registers and adds it
/// once, so fewer blocks mean fewer atomics on the same `C` addresses (512 blocks of 256 threads
/// still fill about half of a 132-SM GPU's threads).
const NORM_BACKWARD_BLOCKS: u64 = 512;

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
    /// A training step's accumulators (see [`OnDevice::with_step_scalars`]).
    step_scalars: Option<DeviceView<f32>>,
    /// The sequences' first keys as last uploaded (attention reads them in every block).
    starts: Option<(Vec<usize>, DeviceArray<'d, i32>)>,
    /// The decode in progress, from `decode_begin` to `decode_end`.
    decode: Option<DecodeContext<'d>>,
}

/// A decode in progress on a device.
struct DecodeContext<'d> {
    /// Flash-decoding's split of the keys and its scratch (the splits' outputs, then their
    /// softmax statistics), where its kernels take the heads.
    flash: Option<(DecodeSplit, F32<'d>)>,
    /// Inside a recorded token step: the row counter, and what it held when the step began.
    register: Option<(DevicePtr, i64)>,
    /// The decode's finished flags: an ended sequence costs no attention.
    done: DevicePtr,
}

impl<'d, 'a, 'l> OnDevice<'d, 'a, 'l> {
    /// Computes on `device` with buffers charged to `arena` and the tables of `rope`.
    pub fn new(device: &'d Device, arena: &'a mut Arena<'l>, rope: &Rope<f32>) -> Result<Self, EngineError> {
        let (cos, sin) = rope.tables();
        let bytes = 4 * (cos.len() + sin.len()) as u64;
        arena.charge(MemoryItem::Activations, bytes)?;
        let (cos, sin) = (DeviceArray::from(device, cos)?, DeviceArray::from(device, sin)?);
        Ok(OnDevice { device, arena, cos, sin, half: rope.half(), step_scalars: None, starts: None, decode: None })
    }

    /// Makes `scalars` — zeroed, one f32 for the device objective's loss and one per counted
    /// run of the gradients ([`Replica::counted_runs`]) for its sum of squares — the step's
    /// accumulators, so that the step reads the loss and the norm back in one copy.
    pub fn with_step_scalars(self, scalars: DeviceView<f32>) -> Self {
        OnDevice { step_scalars: Some(scalars), ..self }
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
        let (lr, beta1, beta2, eps) = (opt.lr, opt.beta1, opt.beta2, opt.eps);
        let call = k::Adamw { tensors: table.ptr(), count: tensors.len() as i32, lr, beta1, beta2, eps, c1, c2, clip };
        let widest = tensors.iter().map(|x| x.n as usize).max().unwrap_or(1);
        // The table is freed in stream order, after the launch has read it.
        self.elementwise(&call, widest)
    }

    /// `Σ x²` over each of `runs` of `x`, on the device (`nereus_sum_squares`: a partial per
    /// block, then one block adds them), written to `sums[i]` for run `i` (empty runs: left).
    fn sum_squares(&mut self, x: &DeviceView<f32>, runs: &[Range<usize>], sums: DevicePtr) -> Result<(), EngineError> {
        let widest = runs.iter().map(Range::len).max().unwrap_or(0);
        let blocks = (widest as u64).div_ceil(u64::from(BLOCK) * 2).clamp(1, MAX_BLOCKS);
        let partial = self.f32_zeros(MemoryItem::Workspace, blocks as usize + 1)?;
        for (i, r) in runs.iter().enumerate().filter(|(_, r)| !r.is_empty()) {
            let grid = (r.len() as u64).div_ceil(u64::from(BLOCK) * 2).clamp(1, MAX_BLOCKS);
            let first = k::SumSquares { partial: partial.at(1), x: x.at(r.start), n: r.len() as u64, square: 1 };
            self.launch(&first, [grid as u32, 1, 1], BLOCK)?;
            let second = k::SumSquares { partial: sums.offset(4 * i as u64), x: partial.at(1), n: grid, square: 0 };
            self.launch(&second, [1, 1, 1], BLOCK)?;
        }
        Ok(())
    }

    /// The step's scalars as host values (one wait: everything enqueued before has run).
    fn read_step_scalars(&self, scalars: &DeviceView<f32>) -> Result<(f64, f64), EngineError> {
        let values = scalars.read(self.device)?;
        let (loss, sums) = values.split_first().expect("the loss and one sum per run");
        Ok((f64::from(*loss), sums.iter().map(|&s| f64::from(s)).sum()))
    }

    /// Enqueues `call` over `grid` blocks of `threads` threads.
    fn launch(&self, call: &impl KernelCall, grid: [u32; 3], threads: u32) -> Result<(), EngineError> {
        // SAFETY: each caller's arguments hold buffers of the sizes its kernel touches.
        unsafe { self.device.launch(call, grid, [threads, 1, 1])? };
        Ok(())
    }

    /// One block per row (up to [`MAX_BLOCKS`]; the kernels stride over the rest).
    fn rows(&self, call: &impl KernelCall, rows: usize) -> Result<(), EngineError> {
        self.launch(call, [(rows as u64).clamp(1, MAX_BLOCKS) as u32, 1, 1], BLOCK)
    }

    /// A grid-stride launch over `n` elements, a few elements per thread.
    fn elementwise(&self, call: &impl KernelCall, n: usize) -> Result<(), EngineError> {
        let blocks = (n as u64).div_ceil(u64::from(BLOCK) * 2).clamp(1, MAX_BLOCKS);
        self.launch(call, [blocks as u32, 1, 1], BLOCK)
    }

    fn gemm(&self, g: Gemm, a: DevicePtr, b: DevicePtr, c: DevicePtr) -> Result<(), EngineError> {
        // SAFETY: callers pass buffers holding op(A)[m,k], op(B)[k,n] and C[m,n] of `g`.
        let run = || unsafe { self.device.gemm(&g, a, b, c) };
        // A host timer measures a GEMM only where it has run when the call returns (the
        // emulated device); a GPU's would time its issue.
        if self.device.runtime().synchronous() {
            timed(OpClass::Gemm, run)?;
        } else {
            run()?;
        }
        Ok(())
    }

    /// `f32` scratch charged under `item`.
    fn f32_zeros(&mut self, item: MemoryItem, len: usize) -> Result<F32<'d>, EngineError> {
        self.arena.charge(item, 4 * len as u64)?;
        Ok(DeviceArray::zeros(self.device, len)?)
    }

    /// An f32 buffer a kernel writes whole: charged, not zeroed (see [`Compute::overwritten`]).
    fn f32_overwritten(&mut self, item: MemoryItem, len: usize) -> Result<F32<'d>, EngineError> {
        self.arena.charge(item, 4 * len as u64)?;
        Ok(DeviceArray::uninit(self.device, len)?)
    }

    /// The RMSNorm forward launch: `y` and `rstd` of `x`, after `x += residual` where one is
    /// given (`nereus_rmsnorm_forward` does both in one pass).
    fn rmsnorm_rows(
        &self,
        y: &Bf16<'d>,
        rstd: &F32<'d>,
        x: &Bf16<'d>,
        residual: Option<&Bf16<'d>>,
        w: View<DeviceView<u16>>,
        (cols, eps): (usize, f64),
    ) -> Result<(), EngineError> {
        let rows = x.len() / cols;
        let residual = residual.map_or(DevicePtr::NULL, |r| r.ptr());
        let (y, inv_rms, x, weight) = (y.ptr(), rstd.ptr(), x.ptr(), weight(w));
        let (rows, cols, eps) = (rows as u64, cols as u64, eps as f32);
        self.rows(&k::RmsnormForward { y, inv_rms, x, weight, rows, cols, eps, residual }, rows as usize)
    }

    /// `y = bf16(x)`.
    fn round(&self, y: &Bf16<'d>, x: &F32<'d>) -> Result<(), EngineError> {
        self.elementwise(&k::CastF32ToBf16 { y: y.ptr(), x: x.ptr(), n: x.len() as u64 }, x.len())
    }

    /// Threads per block of the flash attention kernels: their warps at this device's width.
    fn flash_threads(&self) -> u32 {
        flash_threads(self.device.runtime().warp_width())
    }

    /// Token ids as the kernels read them.
    fn tokens(&self, tokens: &[u32]) -> Result<DeviceArray<'d, i32>, EngineError> {
        let ids: Vec<i32> = tokens.iter().map(|&t| t as i32).collect();
        Ok(DeviceArray::from(self.device, &ids)?)
    }

    /// The `starts` argument: null when no sequence is padded; uploaded once for as long as
    /// the calls pass the same values (every block of a pass, every step of a decode).
    fn starts(&mut self, starts: &[usize]) -> Result<DevicePtr, EngineError> {
        if starts.iter().all(|&s| s == 0) {
            return Ok(DevicePtr::NULL);
        }
        if let Some((held, array)) = &self.starts {
            if held == starts {
                return Ok(array.ptr());
            }
        }
        let values: Vec<i32> = starts.iter().map(|&s| s as i32).collect();
        let array = DeviceArray::from(self.device, &values)?;
        let ptr = array.ptr();
        self.starts = Some((starts.to_vec(), array));
        Ok(ptr)
    }

    /// What a kernel is given for position `pos`: inside a recorded token step the row counter
    /// and `pos` less what it held when the step began (the kernel adds the two); else no
    /// counter and `pos` itself.
    fn position(&self, pos: usize) -> (DevicePtr, u64) {
        match self.decode.as_ref().and_then(|d| d.register) {
            Some((counter, row)) => relative_to(counter, row, pos),
            None => (DevicePtr::NULL, pos as u64),
        }
    }

    /// `nereus_qkv_rope` over `[qkv, q, k, v]`, the fused buffer `fused_len` elements long: a
    /// split, or with `merge` its backward.
    fn qkv_rope(
        &mut self,
        [qkv, q, k, v]: [DevicePtr; 4],
        fused_len: usize,
        l: QkvLayout,
        merge: bool,
    ) -> Result<(), EngineError> {
        let width = l.heads + 2 * l.kv_heads;
        let rows = fused_len / (width * 2 * self.half);
        let (position, pos0) = self.position(l.pos0);
        let [rows_, t, heads, kv_heads, half, kv_t] =
            [rows, l.t, l.heads, l.kv_heads, self.half, l.kv_t_cap.unwrap_or(0)].map(|v| v as u64);
        let (cos_table, sin_table) = (self.cos.ptr(), self.sin.ptr());
        let (rotate, merge) = (i32::from(l.rotate), i32::from(merge));
        let call = k::QkvRope {
            qkv,
            q,
            k,
            v,
            cos_table,
            sin_table,
            rows: rows_,
            t,
            heads,
            kv_heads,
            half,
            pos0,
            kv_t,
            rotate,
            merge,
            position,
        };
        self.elementwise(&call, rows * width * self.half)
    }

    /// Flash-decoding (`decode_attention.cu`): the splits' partial softmaxes into the decode's
    /// scratch, then their combine into `out` and the returned `lse` — or, with one split, `out`
    /// and `lse` written by the split itself, in one launch.
    fn decode_attention(
        &mut self,
        out: &Bf16<'d>,
        (q, k, v): (&Bf16<'d>, &Bf16<'d>, &Bf16<'d>),
        shape: AttentionShape,
        starts: &[usize],
    ) -> Result<F32<'d>, EngineError> {
        let lse = self.f32_overwritten(MemoryItem::Activations, shape.b * shape.heads)?;
        let starts = self.starts(starts)?;
        let (position, tk) = self.position(shape.tk);
        let context = self.decode.as_ref().expect("the caller checked");
        let (split, scratch) = context.flash.as_ref().expect("the caller checked");
        let (split, partial, done) = (*split, scratch.ptr(), context.done);
        let stats = scratch.at(shape.b * shape.heads * split.splits * shape.d);
        let [b, tc, heads, kv_heads, d] =
            [shape.b, shape.t_cap, shape.heads, shape.kv_heads, shape.d].map(|v| v as u64);
        let [splits, split_keys] = [split.splits, split.split_keys].map(|v| v as u64);
        let call = k::DecodeAttention {
            partial,
            stats,
            q: q.ptr(),
            k: k.ptr(),
            v: v.ptr(),
            starts,
            position,
            done,
            b,
            tk,
            tc,
            heads,
            kv_heads,
            d,
            splits,
            split_keys,
            // One split finishes in the same launch (the batch fills the device alone).
            out: if splits == 1 { out.ptr() } else { DevicePtr::NULL },
            lse: if splits == 1 { lse.ptr() } else { DevicePtr::NULL },
        };
        self.launch(&call, decode_grid(split.splits, shape.b, shape.kv_heads), DECODE_THREADS)?;
        if splits > 1 {
            let call =
                k::DecodeAttentionCombine { out: out.ptr(), lse: lse.ptr(), partial, stats, b, heads, d, splits };
            self.launch(&call, decode_combine_grid(shape.b, shape.heads), DECODE_THREADS)?;
        }
        Ok(lse)
    }

    /// Whether `shape` is one query per sequence of the decode in progress, which
    /// flash-decoding takes.
    fn flash_decodes(&self, shape: &AttentionShape) -> bool {
        let scratch = self.decode.as_ref().and_then(|d| d.flash.as_ref());
        scratch.is_some_and(|(split, scratch)| {
            shape.tq == 1 && split.scratch_elements(shape.b, shape.heads, shape.d) <= scratch.len()
        })
    }

    /// `x[N,C]` = the embedding rows of the `n` token ids at `ids` (this rank's shard `w`).
    fn embed_ids(
        &self,
        x: &Bf16<'d>,
        ids: DevicePtr,
        n: usize,
        w: View<DeviceView<u16>>,
        v0: usize,
        c: usize,
    ) -> Result<(), EngineError> {
        let [n_, c_, v0, v] = [n, c, v0, w.1.len() / c].map(|v| v as u64);
        let call = k::EmbeddingForward { out: x.ptr(), tokens: ids, w: weight(w), n: n_, c: c_, v0, v };
        self.elementwise(&call, n * c)
    }

    /// One decode step's bookkeeping with the tokens at `drawn` for position `pos`
    /// (`nereus_decode_advance`, one block: it then moves the row counter on).
    fn advance(&self, d: &mut DeviceDecoding<'d>, drawn: DevicePtr, pos: usize) -> Result<(), EngineError> {
        let (position, pos) = d.at(pos);
        let [rows, t_cap, n_stops] = [d.shape.b, d.shape.t_cap, d.n_stops].map(|v| v as u64);
        let call = k::DecodeAdvance {
            tokens: d.tokens.ptr(),
            lengths: d.lengths.ptr(),
            done: d.done.ptr(),
            last: d.last.ptr(),
            drawn,
            stops: d.stops.ptr(),
            rows,
            t_cap,
            pos,
            n_stops,
            eos: d.eos as i32,
            position,
        };
        self.launch(&call, [1, 1, 1], BLOCK)?;
        d.row += 1;
        Ok(())
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
        let runs = replica.counted_runs();
        let owned;
        let scalars = match self.step_scalars {
            Some(scalars) => scalars,
            None => {
                owned = DeviceArray::<f32>::zeros(self.device, 1 + runs.len())?;
                owned.view()
            }
        };
        if !on_device {
            let loss = loss + self.read_step_scalars(&scalars)?.0;
            return self.modify_grads(grads, |g| replica.reduce(plane, g, loss));
        }
        self.sum_squares(grads, &runs, scalars.at(1))?;
        let (device_loss, sq) = self.read_step_scalars(&scalars)?;
        replica.norm_and_loss(plane, sq, loss + device_loss)
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

/// The GEMM of a linear layer's input gradient, `dx[N,in] (+)= dy[N,out] · W[out,in]`.
fn input_grad(n: usize, inp: usize, out: usize, to: GemmOut) -> Gemm {
    Gemm { m: n, k: out, n: inp, op_a: Op::N, op_b: Op::N, out: to }
}

fn widen(values: &[u16]) -> Vec<f32> {
    values.iter().map(|&h| bf16_to_f32(h)).collect()
}

fn narrow(values: &[f32]) -> Vec<u16> {
    values.iter().map(|&v| f32_to_bf16(v)).collect()
}

fn weight((p, r): View<DeviceView<u16>>) -> DevicePtr {
    p.at(r.start)
}

/// The attention kernels' inputs: `q, k, v`, the sequences' first keys (null when none is
/// padded) and the shape `a`.
fn attention_inputs(
    (q, k, v): (&Bf16<'_>, &Bf16<'_>, &Bf16<'_>),
    starts: DevicePtr,
    a: &AttentionShape,
) -> AttentionInputs {
    let [b, tq, tk, tc, heads, kv_heads, d] = [a.b, a.tq, a.tk, a.t_cap, a.heads, a.kv_heads, a.d].map(|v| v as u64);
    let dims = AttentionDims { b, tq, tk, tc, heads, kv_heads, d };
    AttentionInputs { q: q.ptr(), k: k.ptr(), v: v.ptr(), starts, dims }
}

impl<'d> Compute for OnDevice<'d, '_, '_> {
    type Act = Bf16<'d>;
    type Stat = F32<'d>;
    type Params = DeviceView<u16>;
    type Grads = DeviceView<f32>;
    type Ids = DeviceArray<'d, i32>;

    fn zeros(&mut self, item: MemoryItem, len: usize) -> Result<Self::Act, EngineError> {
        self.arena.charge(item, 2 * len as u64)?;
        Ok(DeviceArray::zeros(self.device, len)?)
    }

    fn overwritten(&mut self, item: MemoryItem, len: usize) -> Result<Self::Act, EngineError> {
        self.arena.charge(item, 2 * len as u64)?;
        Ok(DeviceArray::uninit(self.device, len)?)
    }

    fn stats(&mut self, item: MemoryItem, len: usize) -> Result<Self::Stat, EngineError> {
        self.f32_zeros(item, len)
    }

    fn add(&mut self, x: &mut Self::Act, y: &Self::Act) -> Result<(), EngineError> {
        self.elementwise(&k::ResidualAdd { x: x.ptr(), y: y.ptr(), n: x.len() as u64 }, x.len())
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
        self.rmsnorm_rows(y, rstd, x, None, w, (cols, eps))
    }

    fn add_rmsnorm_forward(
        &mut self,
        x: &mut Self::Act,
        residual: &Self::Act,
        y: &mut Self::Act,
        rstd: &mut Self::Stat,
        w: View<Self::Params>,
        cols: usize,
        eps: f64,
    ) -> Result<(), EngineError> {
        self.rmsnorm_rows(y, rstd, x, Some(residual), w, (cols, eps))
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
        let (dx, dweight, dy, x, weight, inv_rms) =
            (dx.ptr(), grads.at(range.start), dy.ptr(), x.ptr(), weight(w), rstd.ptr());
        let call = k::RmsnormBackward { dx, dweight, dy, x, weight, inv_rms, rows: rows as u64, cols: cols as u64 };
        self.launch(&call, [(rows as u64).clamp(1, NORM_BACKWARD_BLOCKS) as u32, 1, 1], BLOCK)
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
        dx: InputGrad<'_, Self::Act>,
        (grads, range): GradView<Self::Grads>,
        dy: &Self::Act,
        x: &Self::Act,
        w: View<Self::Params>,
        n: usize,
        inp: usize,
        out: usize,
    ) -> Result<(), EngineError> {
        let (dx, accumulate) = match dx {
            InputGrad::Skip => (None, false),
            InputGrad::Add(dx) => (Some(dx), true),
            InputGrad::Write(dx) => (Some(dx), false),
        };
        if let Some(dx) = dx {
            self.gemm(input_grad(n, inp, out, GemmOut::Bf16 { accumulate }), dy.ptr(), weight(w), dx.ptr())?;
        }
        // Weight gradients accumulate in f32, across micro-batches too.
        let g = Gemm { m: out, k: n, n: inp, op_a: Op::T, op_b: Op::N, out: GemmOut::F32 { accumulate: true } };
        self.gemm(g, dy.ptr(), x.ptr(), grads.at(range.start))
    }

    fn swiglu_forward(&mut self, h: &mut Self::Act, gu: &Self::Act, f: usize) -> Result<(), EngineError> {
        let rows = (h.len() / f.max(1)) as u64;
        self.elementwise(&k::SwigluForward { out: h.ptr(), gu: gu.ptr(), rows, f: f as u64 }, h.len())
    }

    fn swiglu_backward(
        &mut self,
        dgu: &mut Self::Act,
        dh: &Self::Act,
        gu: &Self::Act,
        f: usize,
    ) -> Result<(), EngineError> {
        let rows = (dh.len() / f.max(1)) as u64;
        let call = k::SwigluBackward { dgu: dgu.ptr(), dout: dh.ptr(), gu: gu.ptr(), rows, f: f as u64 };
        self.elementwise(&call, dh.len())
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
        let (position, pos0) = self.position(pos0);
        let [rows_, t, heads_, half] = [rows, t, heads, self.half].map(|v| v as u64);
        let (x, cos_table, sin_table, inverse) = (x.ptr(), self.cos.ptr(), self.sin.ptr(), i32::from(inverse));
        let call = k::Rope { x, cos_table, sin_table, rows: rows_, t, heads: heads_, half, pos0, inverse, position };
        self.elementwise(&call, rows * heads * self.half)
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
        if self.flash_decodes(&shape) {
            return self.decode_attention(out, (q, k, v), shape, starts);
        }
        if self.decode.as_ref().is_some_and(|d| d.register.is_some()) {
            // These kernels read their key count from the host: a replay would reuse it.
            let what = format!("attention of {} queries a sequence inside a recorded token step", shape.tq);
            return Err(EngineError::Shape { what });
        }
        let lse = self.f32_overwritten(MemoryItem::Activations, shape.b * shape.heads * shape.tq)?;
        let starts = self.starts(starts)?;
        let inputs = attention_inputs((q, k, v), starts, &shape);
        let (out, lse_ptr) = (out.ptr(), lse.ptr());
        match FlashWidth::for_head(shape.d) {
            Some(width) => {
                let grid = flash_rows_grid(shape.b, shape.tq, shape.heads, shape.kv_heads);
                let call = k::FlashForward { width, out, lse: lse_ptr, inputs };
                self.launch(&call, grid, self.flash_threads())?;
            }
            None => {
                let call = k::AttentionForward { out, lse: lse_ptr, inputs };
                self.launch(&call, attention_grid(shape.b, shape.tq, shape.heads), ATTENTION_BLOCK)?;
            }
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
        let starts = self.starts(starts)?;
        let inputs = attention_inputs((q, k, v), starts, &shape);
        let (dout, out, lse) = (dout.ptr(), out.ptr(), lse.ptr());
        // The kernels' scratch is freed (in stream order) and released when they are launched.
        let scratch = self.arena.mark();
        if let Some(width) = FlashWidth::for_head(shape.d) {
            // dq (and each row's Σ dout·out) per row tile, then dk, dv per key tile: no atomics.
            let delta = self.f32_overwritten(MemoryItem::ActivationGradients, shape.b * shape.heads * shape.tq)?;
            let (dq, delta_at) = (dq.ptr(), delta.ptr());
            let call = k::FlashBackwardDq { width, dq, delta: delta_at, dout, out, lse, inputs };
            self.launch(&call, flash_rows_grid(shape.b, shape.tq, shape.heads, shape.kv_heads), self.flash_threads())?;
            let call = k::FlashBackwardDkv { width, dk: dk.ptr(), dv: dv.ptr(), dout, lse, delta: delta_at, inputs };
            self.launch(&call, flash_keys_grid(shape.b, shape.tk, shape.kv_heads), self.flash_threads())?;
            drop(delta);
            self.arena.release_to(scratch);
            return Ok(());
        }
        // Key and value gradients gather over query rows with f32 atomics, then round once.
        let dk32 = self.f32_zeros(MemoryItem::ActivationGradients, dk.len())?;
        let dv32 = self.f32_zeros(MemoryItem::ActivationGradients, dv.len())?;
        let call = k::AttentionBackward { dq: dq.ptr(), dk: dk32.ptr(), dv: dv32.ptr(), dout, out, lse, inputs };
        self.launch(&call, attention_grid(shape.b, shape.tq, shape.heads), ATTENTION_BLOCK)?;
        self.round(dk, &dk32)?;
        self.round(dv, &dv32)?;
        drop((dk32, dv32));
        self.arena.release_to(scratch);
        Ok(())
    }

    fn kv_append(&mut self, cache: &mut Self::Act, fresh: &Self::Act, r: KvRows) -> Result<(), EngineError> {
        let (position, at) = self.position(r.pos0);
        let [b, tn, tc, kd] = [r.b, r.t, r.t_cap, r.width].map(|v| v as u64);
        let call = k::KvAppend { cache: cache.ptr(), fresh: fresh.ptr(), b, tn, tc, at, kd, position };
        self.elementwise(&call, fresh.len())
    }

    fn qkv_split(
        &mut self,
        (q, k, v): (&mut Self::Act, &mut Self::Act, &mut Self::Act),
        qkv: &Self::Act,
        layout: QkvLayout,
    ) -> Result<(), EngineError> {
        self.qkv_rope([qkv.ptr(), q.ptr(), k.ptr(), v.ptr()], qkv.len(), layout, false)
    }

    fn qkv_merge(
        &mut self,
        dqkv: &mut Self::Act,
        (dq, dk, dv): (&Self::Act, &Self::Act, &Self::Act),
        layout: QkvLayout,
    ) -> Result<(), EngineError> {
        self.qkv_rope([dqkv.ptr(), dq.ptr(), dk.ptr(), dv.ptr()], dqkv.len(), layout, true)
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
        self.embed_ids(x, ids.ptr(), tokens.len(), w, v0, c)
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
        let [n, c_, v0, v] = [tokens.len(), c, v0, range.len() / c].map(|v| v as u64);
        let call = k::EmbeddingBackward { dw: grads.at(range.start), dy: dx.ptr(), tokens: ids.ptr(), n, c: c_, v0, v };
        self.elementwise(&call, tokens.len() * c)
    }

    fn ids(&mut self, tokens: &[u32]) -> Result<Self::Ids, EngineError> {
        self.tokens(tokens)
    }

    fn log_probs_fold(
        &mut self,
        acc: &mut LogitStats<Self::Stat>,
        logits: &Self::Act,
        targets: &Self::Ids,
        chunk: VocabChunk,
    ) -> Result<(), EngineError> {
        let n = acc.max.len();
        let completes = |p: DevicePtr| if chunk.completes_rows { p } else { DevicePtr::NULL };
        let [rows, cols, shard_start] = [n, logits.len() / n.max(1), chunk.col0].map(|v| v as u64);
        let call = k::LogitsRowStats {
            row_max: acc.max.ptr(),
            row_sum: acc.sum.ptr(),
            target_logit: acc.target.ptr(),
            lse: completes(acc.lse.ptr()),
            logp: completes(acc.logp.ptr()),
            logits: logits.ptr(),
            targets: targets.ptr(),
            rows,
            cols,
            shard_start,
            fold: i32::from(!chunk.first),
        };
        self.rows(&call, n)
    }

    fn log_probs_finish<G: TensorGroup<f32>>(
        &mut self,
        acc: &mut LogitStats<Self::Stat>,
        tp: &G,
    ) -> Result<(), EngineError> {
        // One rank holding the whole vocabulary: its last fold wrote lse and log p.
        if tp.is_single() {
            return Ok(());
        }
        let (mut max, mut sum, mut target) = (acc.max.read()?, acc.sum.read()?, acc.target.read()?);
        let (mut lse, mut logp) = (vec![0.0; max.len()], vec![0.0; max.len()]);
        let stats = RowStats { max: &mut max, sum: &mut sum, target: &mut target };
        log_probs_finish(&mut lse, &mut logp, stats, tp)?;
        acc.lse.view().write(self.device, &lse)?;
        acc.logp.view().write(self.device, &logp)?;
        Ok(())
    }

    fn log_probs_backward(
        &mut self,
        logits: &mut Self::Act,
        dlogp: &Self::Stat,
        lse: &Self::Stat,
        targets: &Self::Ids,
        col0: usize,
    ) -> Result<(), EngineError> {
        let (n, len) = (lse.len(), logits.len());
        let [rows, cols, shard_start] = [n, len / n.max(1), col0].map(|v| v as u64);
        let (logits, lse, dlogp, targets) = (logits.ptr(), lse.ptr(), dlogp.ptr(), targets.ptr());
        let call = k::LogprobBackward { dlogits: logits, logits, lse, dlogp, targets, rows, cols, shard_start };
        self.elementwise(&call, len)
    }

    fn linear_input_grad_f32(
        &mut self,
        dx: &mut Self::Stat,
        dy: &Self::Act,
        w: View<Self::Params>,
        n: usize,
        inp: usize,
        out: usize,
    ) -> Result<(), EngineError> {
        self.gemm(input_grad(n, inp, out, GemmOut::F32 { accumulate: true }), dy.ptr(), weight(w), dx.ptr())
    }

    fn narrow(&mut self, y: &mut Self::Act, x: &Self::Stat) -> Result<(), EngineError> {
        self.round(y, x)
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
        self.gemm(g, narrow.ptr(), x.ptr(), grads.at(range.start))?;
        self.free(MemoryItem::ActivationGradients, narrow);
        Ok(())
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

    type Decoding = DeviceDecoding<'d>;

    fn decode_begin(
        &mut self,
        prompts: &[u32],
        ids: &[u64],
        shape: DecodeShape,
        s: &Sampling,
        dims: &LocalShape,
    ) -> Result<DeviceDecoding<'d>, EngineError> {
        let decoding = DeviceDecoding::upload(self.device, prompts, ids, shape, s)?;
        let flash = match DecodeSplit::of(dims, shape.b, shape.t_cap) {
            Some(split) => {
                let elements = split.scratch_elements(shape.b, dims.heads, dims.d);
                Some((split, self.f32_zeros(MemoryItem::Activations, elements)?))
            }
            None => None,
        };
        self.decode = Some(DecodeContext { flash, register: None, done: decoding.done.ptr() });
        Ok(decoding)
    }

    /// Records the first step it is given where flash-decoding takes the heads (the scalar
    /// and flash kernels read their key count from the host) and the device allows graphs,
    /// launches the graph for it and for every later step; otherwise runs each step.
    fn decode_step(
        &mut self,
        d: &mut DeviceDecoding<'d>,
        row: usize,
        step: impl FnOnce(&mut Self, &mut DeviceDecoding<'d>) -> Result<(), EngineError>,
    ) -> Result<(), EngineError> {
        if let Some(graph) = &d.graph {
            // SAFETY: as where it was recorded (below).
            unsafe { self.device.launch_graph(graph)? };
            d.row += 1; // the graph's advance moves the counter on
            return Ok(());
        }
        let recordable = self.device.graphs_allowed();
        let Some(context) = self.decode.as_mut().filter(|c| c.flash.is_some() && recordable) else {
            return step(self, d);
        };
        if d.row != row as i64 {
            let what = format!("a token step at row {row} of a decode whose counter holds {}", d.row);
            return Err(EngineError::Shape { what });
        }
        let register = Some((d.position.ptr(), d.row));
        self.device.begin_recording()?;
        context.register = register;
        let recorded = step(self, d);
        if let Some(context) = self.decode.as_mut() {
            context.register = None;
        }
        let graph = self.device.end_recording();
        recorded?;
        let graph = graph?;
        // SAFETY: what the graph names outside its own blocks — the weights, the KV cache, the
        // decode's arrays and flash-decoding's scratch — lives until the decode ends, after it.
        unsafe { self.device.launch_graph(&graph)? };
        d.graph = Some(graph);
        Ok(())
    }

    fn decode_embedding(
        &mut self,
        x: &mut Self::Act,
        d: &DeviceDecoding<'d>,
        w: View<Self::Params>,
        v0: usize,
        c: usize,
    ) -> Result<(), EngineError> {
        self.embed_ids(x, d.last.ptr(), d.shape.b, w, v0, c)
    }

    /// Every row is drawn in one launch (a block per row; a block skips a sequence that has
    /// ended), then one launch advances the decode: nothing waits for the host.
    fn decode_draw(
        &mut self,
        d: &mut DeviceDecoding<'d>,
        logits: &Self::Act,
        s: &Sampling,
        pos: usize,
    ) -> Result<(), EngineError> {
        let rows = d.shape.b;
        // The sampler reads the bf16 logits as they are (no widened copy, no pass to make one).
        let buffers = SampleBuffers {
            drawn: d.drawn.ptr(),
            logits: logits.ptr(),
            logits_bf16: true,
            ids: d.ids.ptr(),
            done: d.done.ptr(),
        };
        let (position, at) = d.at(pos);
        let call = k::Sample { position, ..s.kernel_call(buffers, rows, logits.len() / rows.max(1), at) };
        self.rows(&call, rows)?;
        self.advance(d, d.drawn.ptr(), pos)
    }

    fn decode_last(&mut self, d: &DeviceDecoding<'d>) -> Result<Vec<u32>, EngineError> {
        Ok(d.last_tokens()?)
    }

    fn decode_advance(&mut self, d: &mut DeviceDecoding<'d>, drawn: &[u32], pos: usize) -> Result<(), EngineError> {
        // Freed in stream order, after the advance has read it.
        let received = DeviceArray::from(self.device, &as_int(drawn))?;
        self.advance(d, received.ptr(), pos)
    }

    fn decode_finished(&mut self, d: &DeviceDecoding<'d>, step: usize) -> Result<bool, EngineError> {
        if !(step + 1).is_multiple_of(d.check_every) {
            return Ok(false);
        }
        Ok(d.finished()?)
    }

    fn decode_end(&mut self, d: DeviceDecoding<'d>) -> Result<Generated, EngineError> {
        let generated = d.generated();
        self.decode = None;
        Ok(generated?)
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

    fn objective(
        &mut self,
        objective: &dyn Objective,
        seqs: Range<usize>,
        out: &Self::Stat,
        dout: &mut Self::Stat,
    ) -> Result<f64, EngineError> {
        match (objective.on_device(), self.step_scalars) {
            (Some(DeviceObjective::NextToken { seq_len, inv_count }), Some(scalars)) => {
                let (rows, seq_len) = (out.len() as u64, seq_len as u64);
                let call = k::CrossEntropy {
                    dlogp: dout.ptr(),
                    loss: scalars.ptr(),
                    logp: out.ptr(),
                    rows,
                    seq_len,
                    inv_count,
                };
                self.launch(&call, [1, 1, 1], BLOCK)?;
                Ok(0.0)
            }
            _ => {
                // `dout` is written whole: only the outputs come back.
                let mut grad = vec![0.0; dout.len()];
                let loss = objective.loss_and_grad(seqs, &out.read()?, &mut grad);
                dout.view().write(self.device, &grad)?;
                Ok(loss)
            }
        }
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

    fn elements(a: &Self::Act) -> usize {
        a.len()
    }
}
