//! Where a stage's layers compute: the host f32 reference ([`Host`]) or a GPU through the
//! kernels in `kernels/` and the vendor GEMMs ([`OnDevice`], bf16 activations, f32 statistics
//! and gradients). The model is written once over this trait — a block and the embedding in
//! `stage.rs`, the heads in `output.rs`, 1F1B with TP/PP/DP in `train.rs`, generation in
//! `generate.rs` — and each implementation supplies the layers and the few places where the
//! host must see values (`read`, `modify`: the loss, the LM head's per-row statistics). The
//! tensor-parallel sum ([`Compute::tp_sum`]) and the pipeline's transfers ([`Compute::pipe`])
//! go through the host on the host, and through the plane's device collectives on a device
//! whose plane has them (NCCL, RCCL, the emulated library).
//!
//! Conventions, as the host ops (`ops/`) keep them: buffers are flat row-major; an output a
//! method *writes whole* comes from [`Compute::overwritten`] (a device skips the memset; the
//! emulated one fills it with NaN, so a skipped element shows), one it adds to from
//! [`Compute::zeros`]; `dx` arguments of backward
//! passes and every weight gradient *accumulate* (`+=`), because activations feed more than one
//! consumer and gradients sum over micro-batches. Weights are `(parameters, range)` views into
//! the stage's flat parameter buffer; gradients are views into the flat f32 gradient buffer.

mod decoding;
mod device;
mod host;

pub use decoding::DeviceDecoding;

pub use device::{MixedShard, OnDevice};
pub use host::{Host, HostShard};

use std::ops::Range;

use super::arena::Mark;
use super::decode::{DecodeShape, Generated};
use super::objective::Objective;
use super::ops::{AttentionShape, QkvLayout, TensorGroup};
use super::sampling::Sampling;
use super::{AdamW, EngineError, Replica};
use crate::backend::gpu::DevicePtr;
use crate::comm::DataPlane;
use nereus_core::cost::{MemoryBreakdown, MemoryItem};
use nereus_core::model::LocalShape;

/// A view of one tensor in a stage's flat parameter (or gradient) buffer.
pub type View<'a, P> = (&'a P, &'a Range<usize>);

/// A view of one tensor in a stage's flat gradient buffer, accumulated into.
pub type GradView<'a, G> = (&'a mut G, &'a Range<usize>);

/// Which pipeline neighbour a transfer goes to or comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Neighbour {
    /// The next stage (activations go there, their gradients come back from it).
    Next,
    /// The previous stage.
    Prev,
}

/// A device transfer of a pipeline exchange: the neighbour, the device address, the bytes.
pub type DeviceBytes = (Neighbour, DevicePtr, u64);

/// A stage's pipeline neighbours as [`Compute::pipe`] sees them.
pub trait PipeLink {
    /// Sends `send` and receives `recv` as host f32 values, both posted at once.
    fn exchange(
        &self,
        send: Option<(Neighbour, &[f32])>,
        recv: Option<(Neighbour, &mut [f32])>,
    ) -> Result<(), EngineError>;
    /// The same with device bytes, in the device stream's order; `false` where the plane has no
    /// device point-to-point (the caller goes through the host).
    fn exchange_on_device(&self, send: Option<DeviceBytes>, recv: Option<DeviceBytes>) -> Result<bool, EngineError>;
}

/// [`Compute::pipe`] through host values: read `send`, receive into `recv`'s values.
pub fn pipe_through_host<C: Compute + ?Sized, L: PipeLink>(
    c: &mut C,
    link: &L,
    send: Option<(Neighbour, &C::Act)>,
    recv: Option<(Neighbour, &mut C::Act)>,
) -> Result<(), EngineError> {
    match (send, recv) {
        (Some((to, x)), Some((from, y))) => c.read_modify(x, y, |x, y| link.exchange(Some((to, x)), Some((from, y)))),
        (Some((to, x)), None) => c.read(x, |x| link.exchange(Some((to, x)), None)),
        (None, Some((from, y))) => c.modify(y, |y| link.exchange(None, Some((from, y)))),
        (None, None) => Ok(()),
    }
}

/// Where [`Compute::linear_backward`] puts the input gradient `dy · W`.
pub enum InputGrad<'a, A> {
    /// Not wanted (the LM head's chunks, whose input gradient is summed in f32 apart).
    Skip,
    /// Added to what the buffer holds (the layers that read the same input add theirs).
    Add(&'a mut A),
    /// Written over the buffer, which may be uninitialised ([`Compute::overwritten`]).
    Write(&'a mut A),
}

/// The layers the engine needs, on one compute (see the module comment).
pub trait Compute {
    /// Activations and their gradients (`f32` on the host, bf16 on a device).
    type Act;
    /// Per-row statistics saved for backward passes (RMSNorm's `1/rms`; attention's saved
    /// state): f32 everywhere.
    type Stat;
    /// The stage's flat parameters.
    type Params: ?Sized;
    /// The stage's flat gradients (f32 everywhere).
    type Grads: ?Sized;

    /// `len` zeroed activations holding `item`, charged to the rank's ledger first.
    fn zeros(&mut self, item: MemoryItem, len: usize) -> Result<Self::Act, EngineError>;
    /// `len` activations holding `item`, charged first, for an output the next operation writes
    /// whole (a GEMM that overwrites, a norm, an element-wise kernel): a device skips the memset
    /// [`Compute::zeros`] pays; the host's are zeros.
    fn overwritten(&mut self, item: MemoryItem, len: usize) -> Result<Self::Act, EngineError> {
        self.zeros(item, len)
    }
    /// `len` zeroed statistics holding `item`, charged first.
    fn stats(&mut self, item: MemoryItem, len: usize) -> Result<Self::Stat, EngineError>;
    /// `x += y` (residual connections).
    fn add(&mut self, x: &mut Self::Act, y: &Self::Act) -> Result<(), EngineError>;

    /// `y[R,C] = x · rstd · w`, `rstd[R]` saved.
    #[allow(clippy::too_many_arguments)]
    fn rmsnorm_forward(
        &mut self,
        y: &mut Self::Act,
        rstd: &mut Self::Stat,
        x: &Self::Act,
        w: View<Self::Params>,
        cols: usize,
        eps: f64,
    ) -> Result<(), EngineError>;
    /// The residual connection `x += residual`, then [`Compute::rmsnorm_forward`] of the sum
    /// into `y`: one pass over `x` on a device.
    #[allow(clippy::too_many_arguments)]
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
        self.add(x, residual)?;
        self.rmsnorm_forward(y, rstd, x, w, cols, eps)
    }
    /// Backward of [`Compute::rmsnorm_forward`]: `dx +=`, `dw +=`.
    #[allow(clippy::too_many_arguments)]
    fn rmsnorm_backward(
        &mut self,
        dx: &mut Self::Act,
        dw: GradView<Self::Grads>,
        dy: &Self::Act,
        x: &Self::Act,
        w: View<Self::Params>,
        rstd: &Self::Stat,
        cols: usize,
    ) -> Result<(), EngineError>;

    /// `y[N,out] = x[N,in] · W[out,in]ᵀ`.
    fn linear_forward(
        &mut self,
        y: &mut Self::Act,
        x: &Self::Act,
        w: View<Self::Params>,
        n: usize,
        inp: usize,
        out: usize,
    ) -> Result<(), EngineError>;
    /// `dx[N,in] (+)= dy · W` as `dx` says and `dW += dyᵀ · x`.
    #[allow(clippy::too_many_arguments)]
    fn linear_backward(
        &mut self,
        dx: InputGrad<'_, Self::Act>,
        dw: GradView<Self::Grads>,
        dy: &Self::Act,
        x: &Self::Act,
        w: View<Self::Params>,
        n: usize,
        inp: usize,
        out: usize,
    ) -> Result<(), EngineError>;

    /// `h[N,F] = silu(g) · u` from the fused gate/up product `gu[N, 2F]` (each row its gate,
    /// then its up).
    fn swiglu_forward(&mut self, h: &mut Self::Act, gu: &Self::Act, f: usize) -> Result<(), EngineError>;
    /// Backward of [`Compute::swiglu_forward`], writing every element of `dgu[N, 2F]`.
    fn swiglu_backward(
        &mut self,
        dgu: &mut Self::Act,
        dh: &Self::Act,
        gu: &Self::Act,
        f: usize,
    ) -> Result<(), EngineError>;
    /// Rotates `x[B,T,heads,D]` in place, row `(b, t)` at position `pos0 + t`; `inverse` is the
    /// backward pass.
    fn rope(
        &mut self,
        x: &mut Self::Act,
        t: usize,
        heads: usize,
        pos0: usize,
        inverse: bool,
    ) -> Result<(), EngineError>;

    /// Causal GQA attention, writing `out` whole (a query row with no key outputs zeros); returns
    /// what the backward pass needs (the host saves the probabilities, a device only each query
    /// row's log-sum-exp).
    fn attention_forward(
        &mut self,
        out: &mut Self::Act,
        q: &Self::Act,
        k: &Self::Act,
        v: &Self::Act,
        shape: AttentionShape,
        starts: &[usize],
    ) -> Result<Self::Stat, EngineError>;
    /// Backward of [`Compute::attention_forward`] (`tq = tk = t_cap`), writing `dq`, `dk`, `dv`
    /// whole.
    #[allow(clippy::too_many_arguments)]
    fn attention_backward(
        &mut self,
        grads: (&mut Self::Act, &mut Self::Act, &mut Self::Act),
        dout: &Self::Act,
        out: &Self::Act,
        saved: &Self::Stat,
        qkv: (&Self::Act, &Self::Act, &Self::Act),
        shape: AttentionShape,
        starts: &[usize],
    ) -> Result<(), EngineError>;

    /// Writes `fresh[B,T,W]` into `cache[B,T_cap,W]` at positions `pos0..pos0+T`.
    fn kv_append(&mut self, cache: &mut Self::Act, fresh: &Self::Act, rows: KvRows) -> Result<(), EngineError>;

    /// Splits the fused projection `qkv[N, (H+2K)·D]` (each row's query heads, then its key
    /// heads, then its value heads) into `q[N, H·D]` and `k, v` — rows of their own `[N, K·D]`,
    /// or of a KV cache where `layout.kv_t_cap` says so (the append fused in) — rotating q and k
    /// where `layout.rotate` says so.
    fn qkv_split(
        &mut self,
        parts: (&mut Self::Act, &mut Self::Act, &mut Self::Act),
        qkv: &Self::Act,
        layout: QkvLayout,
    ) -> Result<(), EngineError>;
    /// The backward of [`Compute::qkv_split`] without a cache: writes `dqkv` whole from `dq, dk,
    /// dv`, rotating `dq` and `dk` back where `layout.rotate` says so.
    fn qkv_merge(
        &mut self,
        dqkv: &mut Self::Act,
        parts: (&Self::Act, &Self::Act, &Self::Act),
        layout: QkvLayout,
    ) -> Result<(), EngineError>;

    /// `x[N,C]` = rows `tokens - v0` of this rank's embedding shard `w[V,C]`, written whole
    /// (zero for tokens outside the shard).
    fn embedding_forward(
        &mut self,
        x: &mut Self::Act,
        tokens: &[u32],
        w: View<Self::Params>,
        v0: usize,
        c: usize,
    ) -> Result<(), EngineError>;
    /// `dw[token - v0] += dx[n]` for the tokens in this rank's shard.
    fn embedding_backward(
        &mut self,
        dw: GradView<Self::Grads>,
        dx: &Self::Act,
        tokens: &[u32],
        v0: usize,
        c: usize,
    ) -> Result<(), EngineError>;

    /// Token ids as this compute's kernels read them (a device uploads them once, for every
    /// vocabulary chunk of the LM head to read).
    type Ids;
    /// `tokens` as [`Compute::Ids`].
    fn ids(&mut self, tokens: &[u32]) -> Result<Self::Ids, EngineError>;

    /// Folds one vocabulary chunk of this rank's logits into the rows' running statistics
    /// `acc` (the fused LM head, `engine/output.rs`): `logits[N, W]` hold the whole
    /// vocabulary's columns `chunk.col0..chunk.col0 + W`. The first chunk starts `acc`'s
    /// maximum, sum of exponentials and target logit, later ones merge into them (online
    /// softmax); on [`VocabChunk::completes_rows`] a device writes `acc.lse` and `acc.logp`
    /// too (the host computes them in [`Compute::log_probs_finish`]).
    fn log_probs_fold(
        &mut self,
        acc: &mut LogitStats<Self::Stat>,
        logits: &Self::Act,
        targets: &Self::Ids,
        chunk: VocabChunk,
    ) -> Result<(), EngineError>;
    /// After the last chunk: `(logp[N], lse[N])` over the whole vocabulary, the ranks' statistics
    /// combined over `tp` (where one rank holds it all the last fold wrote them).
    fn log_probs_finish<G: TensorGroup<f32>>(
        &mut self,
        acc: &mut LogitStats<Self::Stat>,
        tp: &G,
    ) -> Result<(), EngineError>;
    /// In place, one chunk's logits `[N, W]` (columns `col0..col0 + W`) become their gradient
    /// `dlogp[n] · (1[v = target_n] − exp(logits[n,v] − lse[n]))`.
    fn log_probs_backward(
        &mut self,
        logits: &mut Self::Act,
        dlogp: &Self::Stat,
        lse: &Self::Stat,
        targets: &Self::Ids,
        col0: usize,
    ) -> Result<(), EngineError>;
    /// `dx[N,in] += dy · W`, accumulated in f32 (the fused LM head sums its chunks' input
    /// gradients before one rounding).
    #[allow(clippy::too_many_arguments)]
    fn linear_input_grad_f32(
        &mut self,
        dx: &mut Self::Stat,
        dy: &Self::Act,
        w: View<Self::Params>,
        n: usize,
        inp: usize,
        out: usize,
    ) -> Result<(), EngineError>;
    /// `y = x` as activations (rounded to bf16 on a device), into `y`.
    fn narrow(&mut self, y: &mut Self::Act, x: &Self::Stat) -> Result<(), EngineError>;

    /// `value[N] = x[N,C] · w[C]` (the value head), into zeroed `value`.
    fn value_forward(
        &mut self,
        value: &mut Self::Stat,
        x: &Self::Act,
        w: View<Self::Params>,
    ) -> Result<(), EngineError>;
    /// `dx += dvalue · w`, `dw += Σ dvalue · x`.
    fn value_backward(
        &mut self,
        dx: &mut Self::Act,
        dw: GradView<Self::Grads>,
        dvalue: &Self::Stat,
        x: &Self::Act,
        w: View<Self::Params>,
    ) -> Result<(), EngineError>;

    /// Copies `copy.rows` runs of `copy.width` elements from `src` into `dst` (strided rows:
    /// the last position of each sequence, a TP shard's columns of a full row).
    fn copy_rows(&mut self, dst: &mut Self::Act, src: &Self::Act, copy: RowCopy) -> Result<(), EngineError>;

    /// A decode's state between token steps (see [`crate::engine::decode`]): host vectors on
    /// the host, device arrays on a device, so that a device's token step needs no host wait.
    type Decoding;
    /// The state of a decode of `prompts[B, P]`, sequence ids `ids` (they seed the draws), by a
    /// stage of local shape `dims` (a device sizes flash-decoding's scratch by it).
    fn decode_begin(
        &mut self,
        prompts: &[u32],
        ids: &[u64],
        shape: DecodeShape,
        s: &Sampling,
        dims: &LocalShape,
    ) -> Result<Self::Decoding, EngineError>;
    /// Runs one token step, `step`, whose rows sit at position `row`, where one rank holds the
    /// whole replica (nothing crosses the host inside it). The host runs it. A device that
    /// allows graphs, where flash-decoding takes the heads, records the first step it is given
    /// as a graph, with every position its kernels read taken from the decode's row counter in
    /// device memory, and launches that graph for every later step instead of running `step`
    /// again (docs/engine.md, "Decode as a replayed graph"); otherwise it runs each step.
    fn decode_step(
        &mut self,
        d: &mut Self::Decoding,
        row: usize,
        step: impl FnOnce(&mut Self, &mut Self::Decoding) -> Result<(), EngineError>,
    ) -> Result<(), EngineError>;
    /// `x[B,C]` = the embedding rows (this rank's shard `w[V,C]`, zero outside it) of the
    /// tokens the decode holds at its last position written, into zeroed `x`.
    fn decode_embedding(
        &mut self,
        x: &mut Self::Act,
        d: &Self::Decoding,
        w: View<Self::Params>,
        v0: usize,
        c: usize,
    ) -> Result<(), EngineError>;
    /// Draws position `pos` of every sequence from `logits[B, V]` (the whole vocabulary) as
    /// [`crate::engine::sample_token`] draws it with [`crate::engine::draw_uniform`], and
    /// advances the decode ([`crate::engine::HostDecoding::advance`]).
    fn decode_draw(
        &mut self,
        d: &mut Self::Decoding,
        logits: &Self::Act,
        s: &Sampling,
        pos: usize,
    ) -> Result<(), EngineError>;
    /// The tokens at the last position written, as host values (a device waits once): what
    /// the last pipeline stage hands the others, and what TP ranks that each draw compare.
    fn decode_last(&mut self, d: &Self::Decoding) -> Result<Vec<u32>, EngineError>;
    /// Advances the decode with tokens drawn on another rank.
    fn decode_advance(&mut self, d: &mut Self::Decoding, drawn: &[u32], pos: usize) -> Result<(), EngineError>;
    /// Whether every sequence is known to have ended after token step `step` (0 the prefill).
    /// The host knows at every step; a device reads its flags only every
    /// [`Sampling::stop_check_every`] steps (one wait) and answers `false` between.
    fn decode_finished(&mut self, d: &Self::Decoding, step: usize) -> Result<bool, EngineError>;
    /// The decode's tokens and response lengths (a device waits once).
    fn decode_end(&mut self, d: Self::Decoding) -> Result<Generated, EngineError>;

    /// Runs `f` on `x` as host f32 values (a device copies them back first, widened).
    fn read<T>(&mut self, x: &Self::Act, f: impl FnOnce(&[f32]) -> Result<T, EngineError>) -> Result<T, EngineError>;
    /// Lets `f` rewrite `x` as host f32 values (a device copies them back, then over, rounded).
    fn modify<T>(
        &mut self,
        x: &mut Self::Act,
        f: impl FnOnce(&mut [f32]) -> Result<T, EngineError>,
    ) -> Result<T, EngineError>;
    /// Runs `f` on `src` as host values while it rewrites `dst` (a pipeline exchange).
    fn read_modify<T>(
        &mut self,
        src: &Self::Act,
        dst: &mut Self::Act,
        f: impl FnOnce(&[f32], &mut [f32]) -> Result<T, EngineError>,
    ) -> Result<T, EngineError>;
    /// Runs `f` on statistics `x` as host values.
    fn read_stats<T>(
        &mut self,
        x: &Self::Stat,
        f: impl FnOnce(&[f32]) -> Result<T, EngineError>,
    ) -> Result<T, EngineError>;
    /// This micro-batch's share of `objective`'s loss over the head's outputs `out` (sequences
    /// `seqs`), writing `d loss / d out` into `dout`. A device runs an objective's device form
    /// ([`Objective::on_device`]) itself, adds its loss to the step's accumulator and returns 0
    /// ([`Optimize::reduce_gradients`] reads the accumulator); other objectives read `out` back.
    fn objective(
        &mut self,
        objective: &dyn Objective,
        seqs: Range<usize>,
        out: &Self::Stat,
        dout: &mut Self::Stat,
    ) -> Result<f64, EngineError>;
    /// Lets `f` rewrite the gradients as host values (the data-parallel all-reduce, the norm).
    fn modify_grads<T>(
        &mut self,
        g: &mut Self::Grads,
        f: impl FnOnce(&mut [f32]) -> Result<T, EngineError>,
    ) -> Result<T, EngineError>;

    /// Bytes of one activation element (what a pipeline buffer of `n` elements is charged).
    const ACT_BYTES: u64;
    /// The current position in the rank's stack of charges (see [`Arena::mark`]).
    fn mark(&self) -> Mark;
    /// The charges made since `mark`.
    fn since(&self, mark: Mark) -> MemoryBreakdown;
    /// Releases `charges` (buffers the caller has dropped).
    fn release(&mut self, charges: &MemoryBreakdown);
    /// Elements of `a` (what [`Compute::free`] releases).
    fn elements(a: &Self::Act) -> usize;
    /// Drops the temporary `a`, charged as `item`, and releases its charge: the backward pass
    /// frees each gradient once its last reader has run, so one block's are held at a time.
    fn free(&mut self, item: MemoryItem, a: Self::Act) {
        let mut charge = MemoryBreakdown::default();
        charge.add(item, Self::ACT_BYTES * Self::elements(&a) as u64);
        drop(a);
        self.release(&charge);
    }

    /// Element-wise sum over the tensor-parallel group, in place: Megatron's
    /// `reduce_from_tensor_model_parallel_region` forward (a row-parallel layer's partial
    /// outputs) and `copy_to_tensor_model_parallel_region` backward (a column-parallel layer's
    /// partial input gradients); the other direction of each is the identity.
    ///
    /// Through the host here; a device sums its bf16 values with the plane's device collective.
    fn tp_sum<G: TensorGroup<f32>>(&mut self, tp: &G, x: &mut Self::Act) -> Result<(), EngineError> {
        if tp.is_single() {
            return Ok(());
        }
        self.modify(x, |values| tp.sum(values))
    }

    /// Sends `send` to a pipeline neighbour while receiving `recv` from one, both at once
    /// (Megatron's `send_forward_recv_backward` and its kin; either may be absent).
    ///
    /// Through the host here; a device moves its bf16 bytes with the plane's point-to-point.
    fn pipe<L: PipeLink>(
        &mut self,
        link: &L,
        send: Option<(Neighbour, &Self::Act)>,
        recv: Option<(Neighbour, &mut Self::Act)>,
    ) -> Result<(), EngineError> {
        pipe_through_host(self, link, send, recv)
    }
}

/// What one optimizer step needs of a compute beyond the layers: the data-parallel gradient
/// sum with the global norm, and AdamW over a training shard's own buffers. With [`Compute`] it
/// is the whole seam between the one training step ([`crate::engine::train_step`]) and the
/// memory the shard lives in.
pub trait Optimize: Compute {
    /// A training shard as the optimizer sees it: the parameters the layers read, Adam's
    /// moments, and the f32 master copy where the parameters are bf16.
    type Trainable<'s>;

    /// The parameters the layers read.
    fn params<'a>(shard: &'a Self::Trainable<'_>) -> &'a Self::Params;

    /// Sums `grads` over the replica's data-parallel group; returns the global gradient norm
    /// (tensors replicated over TP counted once) and the loss summed over the model-stage.
    fn reduce_gradients<P: DataPlane>(
        &mut self,
        replica: &Replica,
        plane: &P,
        grads: &mut Self::Grads,
        loss: f64,
    ) -> Result<(f64, f64), EngineError>;

    /// One AdamW update (number `t`, gradients scaled by `clip`) of every tensor of `shard`;
    /// `tensors` are their ranges in the flat buffers and whether each is replicated over TP
    /// (no weight decay).
    #[allow(clippy::too_many_arguments)]
    fn adamw(
        &mut self,
        shard: &mut Self::Trainable<'_>,
        grads: &Self::Grads,
        tensors: &[(Range<usize>, bool)],
        opt: &AdamW,
        t: u64,
        clip: f32,
    ) -> Result<(), EngineError>;
}

/// The rows' running statistics of the fused LM head (`[N]` each, f32): over the vocabulary
/// chunks folded so far, each row's maximum logit, its sum of exponentials relative to that
/// maximum, and its target's logit (−inf until a chunk holding it); once finished, `lse` and
/// `logp` over the whole vocabulary.
pub struct LogitStats<S> {
    /// Row maxima.
    pub max: S,
    /// Sums of `exp(logit − max)`.
    pub sum: S,
    /// Target logits.
    pub target: S,
    /// Log-sum-exps, kept for the backward pass.
    pub lse: S,
    /// `log p(target)`.
    pub logp: S,
}

/// Which vocabulary chunk [`Compute::log_probs_fold`] is given.
#[derive(Debug, Clone, Copy)]
pub struct VocabChunk {
    /// Its first column's id in the whole vocabulary.
    pub col0: usize,
    /// Whether it is the rank's first chunk (which starts the statistics).
    pub first: bool,
    /// Whether it completes every row: the last chunk of a rank holding the whole vocabulary
    /// (no TP), where the combine over ranks would be the identity.
    pub completes_rows: bool,
}

/// A strided copy between activation buffers, in elements: `rows` runs of `width`, the `i`-th
/// from `src_offset + i·src_pitch` to `dst_offset + i·dst_pitch`.
#[derive(Debug, Clone, Copy)]
pub struct RowCopy {
    /// First source element.
    pub src_offset: usize,
    /// Elements between source runs.
    pub src_pitch: usize,
    /// First target element.
    pub dst_offset: usize,
    /// Elements between target runs.
    pub dst_pitch: usize,
    /// Elements per run.
    pub width: usize,
    /// Runs.
    pub rows: usize,
}

/// Where [`Compute::kv_append`] writes: `b` sequences of `t` fresh rows `width` wide, into a
/// cache of `t_cap` positions per sequence, from position `pos0`.
#[derive(Debug, Clone, Copy)]
pub struct KvRows {
    /// Sequences.
    pub b: usize,
    /// Fresh positions per sequence.
    pub t: usize,
    /// Positions per sequence in the cache.
    pub t_cap: usize,
    /// Where the fresh rows go.
    pub pos0: usize,
    /// Elements per position (`K·D`).
    pub width: usize,
}

#[cfg(test)]
mod sampler_tests;
#[cfg(test)]
mod tests;
