//! One typed argument struct per kernel, its fields in the kernel's parameter order (the C
//! signatures in `device/*.cu`; the grid emulator's table gives each parameter's size, and a
//! test holds every struct to it). Legend as in the sources: N elements, R rows, C columns, B
//! sequences, T positions, H query heads, K key/value heads, D head width.

use crate::attention::FlashWidth;
use crate::kernel::{DevicePtr, Kernel, KernelArgs, KernelCall, PushArgs};

macro_rules! kernel_args {
    ($( $(#[$doc:meta])* $name:ident => $kernel:ident { $( $(#[$fdoc:meta])* $field:ident : $ty:ty ),* $(,)? } )*) => {
        $(
            $(#[$doc])*
            #[derive(Debug, Clone, Copy, Default, PartialEq)]
            pub struct $name {
                $( $(#[$fdoc])* pub $field: $ty, )*
            }

            impl KernelCall for $name {
                fn kernel(&self) -> Kernel {
                    Kernel::$kernel
                }

                fn args(&self) -> KernelArgs {
                    let mut args = KernelArgs::default();
                    $( self.$field.push_args(&mut args); )*
                    args
                }
            }
        )*

        /// One call of every struct above with default values (the ABI test's samples).
        pub fn fixed_samples() -> Vec<Box<dyn KernelCall>> {
            vec![$(Box::new($name::default())),*]
        }
    };
}

/// The shape arguments every attention kernel takes after its buffers: `B, Tq, Tk, Tc, H, K, D`
/// (`Tc` the K/V buffers' positions per sequence, the KV cache's capacity).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct AttentionDims {
    /// Sequences.
    pub b: u64,
    /// Query positions.
    pub tq: u64,
    /// Valid key positions (≥ `tq`).
    pub tk: u64,
    /// Positions per sequence in the K/V buffers (≥ `tk`).
    pub tc: u64,
    /// Query heads.
    pub heads: u64,
    /// Key/value heads (dividing `heads`).
    pub kv_heads: u64,
    /// Head width.
    pub d: u64,
}

impl PushArgs for AttentionDims {
    fn push_args(&self, args: &mut KernelArgs) {
        for v in [self.b, self.tq, self.tk, self.tc, self.heads, self.kv_heads, self.d] {
            v.push_args(args);
        }
    }
}

/// What every attention kernel reads after its outputs: bf16 queries `[B, Tq, H, D]`, keys and
/// values `[B, Tc, K, D]`, each sequence's first key (`int [B]`, or null when none is padded)
/// and the shape.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct AttentionInputs {
    /// Queries.
    pub q: DevicePtr,
    /// Keys.
    pub k: DevicePtr,
    /// Values.
    pub v: DevicePtr,
    /// First key of each sequence, or null.
    pub starts: DevicePtr,
    /// Shape.
    pub dims: AttentionDims,
}

impl PushArgs for AttentionInputs {
    fn push_args(&self, args: &mut KernelArgs) {
        for p in [self.q, self.k, self.v, self.starts] {
            p.push_args(args);
        }
        self.dims.push_args(args);
    }
}

kernel_args! {
    /// `y[N] = bf16(x[N])`.
    CastF32ToBf16 => CastF32ToBf16 {
        /// bf16 output.
        y: DevicePtr,
        /// f32 input.
        x: DevicePtr,
        /// Elements.
        n: u64,
    }
    /// `y[N] = f32(x[N])`.
    CastBf16ToF32 => CastBf16ToF32 {
        /// f32 output.
        y: DevicePtr,
        /// bf16 input.
        x: DevicePtr,
        /// Elements.
        n: u64,
    }
    /// `y[R,C] = x · rsqrt(mean(x²) + eps) · weight`, `inv_rms[R]` kept; with a residual,
    /// `x += residual` first, in the same pass.
    RmsnormForward => RmsnormForward {
        /// bf16 output `[R, C]`.
        y: DevicePtr,
        /// f32 `1/rms` per row `[R]`.
        inv_rms: DevicePtr,
        /// bf16 input `[R, C]` (the sum, written back, where a residual is given).
        x: DevicePtr,
        /// bf16 gain `[C]`.
        weight: DevicePtr,
        /// Rows.
        rows: u64,
        /// Columns.
        cols: u64,
        /// The norm's epsilon.
        eps: f32,
        /// bf16 `[R, C]` added to `x` before the norm, or null.
        residual: DevicePtr,
    }
    /// RMSNorm backward: `dx +=`, `dweight +=` (f32).
    RmsnormBackward => RmsnormBackward {
        /// bf16 input gradient `[R, C]`, added to.
        dx: DevicePtr,
        /// f32 gain gradient `[C]`, added to.
        dweight: DevicePtr,
        /// bf16 output gradient `[R, C]`.
        dy: DevicePtr,
        /// bf16 forward input `[R, C]`.
        x: DevicePtr,
        /// bf16 gain `[C]`.
        weight: DevicePtr,
        /// f32 `1/rms` per row `[R]`.
        inv_rms: DevicePtr,
        /// Rows.
        rows: u64,
        /// Columns.
        cols: u64,
    }
    /// `x[N] += y[N]` in bf16.
    ResidualAdd => ResidualAdd {
        /// bf16 residual stream, added to.
        x: DevicePtr,
        /// bf16 addend.
        y: DevicePtr,
        /// Elements.
        n: u64,
    }
    /// `out[R, F] = silu(gate) · up` over the fused gate/up rows `gu[R, 2F]`.
    SwigluForward => SwigluForward {
        /// bf16 output `[R, F]`.
        out: DevicePtr,
        /// bf16 gate and up projections `[R, 2F]` (each row's gate, then its up).
        gu: DevicePtr,
        /// Rows.
        rows: u64,
        /// SwiGLU width `F`.
        f: u64,
    }
    /// SwiGLU backward into the fused layout: `dgu[R, 2F]` written.
    SwigluBackward => SwigluBackward {
        /// bf16 gate and up gradients `[R, 2F]`.
        dgu: DevicePtr,
        /// bf16 output gradient `[R, F]`.
        dout: DevicePtr,
        /// bf16 gate and up projections `[R, 2F]`.
        gu: DevicePtr,
        /// Rows.
        rows: u64,
        /// SwiGLU width `F`.
        f: u64,
    }
    /// Rotates `x[B·T, H, D]` in place by the tables `cos/sin[P, D/2]`.
    Rope => Rope {
        /// bf16 heads, rotated in place.
        x: DevicePtr,
        /// f32 cosines `[P, D/2]`.
        cos_table: DevicePtr,
        /// f32 sines `[P, D/2]`.
        sin_table: DevicePtr,
        /// Rows (`B·T`).
        rows: u64,
        /// Positions per sequence.
        t: u64,
        /// Heads per row.
        heads: u64,
        /// `D/2`.
        half: u64,
        /// Position of each sequence's first row.
        pos0: u64,
        /// 1 to rotate back (the backward pass).
        inverse: i32,
        /// `int` row counter `[1]` added to `pos0`, or null (a replayed decode step's position).
        position: DevicePtr,
    }
    /// Splits the fused projection `qkv[B·T, (H+2K)·D]` into `q` and `k, v` (rows of their own or
    /// of a KV cache), rotating q and k; or, with `merge`, gathers and rotates back.
    QkvRope => QkvRope {
        /// bf16 fused rows `[B·T, (H+2K)·D]`: read by a split, written by a merge.
        qkv: DevicePtr,
        /// bf16 queries `[B·T, H·D]`.
        q: DevicePtr,
        /// bf16 keys `[B·T, K·D]`, or a KV cache `[B, kv_t, K·D]`.
        k: DevicePtr,
        /// bf16 values, laid out as `k`.
        v: DevicePtr,
        /// f32 cosines `[P, D/2]`.
        cos_table: DevicePtr,
        /// f32 sines `[P, D/2]`.
        sin_table: DevicePtr,
        /// Rows (`B·T`).
        rows: u64,
        /// Positions per sequence.
        t: u64,
        /// Query heads `H`.
        heads: u64,
        /// Key/value heads `K`.
        kv_heads: u64,
        /// `D/2`.
        half: u64,
        /// Position of each sequence's first row.
        pos0: u64,
        /// 0 when k and v rows are q's rows, else the KV cache's positions per sequence.
        kv_t: u64,
        /// 1 to rotate q and k (0 for a model that rotates after its q/k-norms).
        rotate: i32,
        /// 1 to gather `q, k, v` into `qkv` and rotate back (the backward pass).
        merge: i32,
        /// `int` row counter `[1]` added to `pos0`, or null (a replayed decode step's position).
        position: DevicePtr,
    }
    /// `out[N,C] = W[token − v0]` where this rank holds the row, else zero.
    EmbeddingForward => EmbeddingForward {
        /// bf16 output `[N, C]`.
        out: DevicePtr,
        /// `int` token ids `[N]`.
        tokens: DevicePtr,
        /// bf16 table shard `[V, C]`.
        w: DevicePtr,
        /// Tokens.
        n: u64,
        /// Model width.
        c: u64,
        /// First vocabulary row of the shard.
        v0: u64,
        /// Rows of the shard.
        v: u64,
    }
    /// `dW[token − v0] += dy` (f32, atomically).
    EmbeddingBackward => EmbeddingBackward {
        /// f32 table gradient `[V, C]`, added to.
        dw: DevicePtr,
        /// bf16 output gradient `[N, C]`.
        dy: DevicePtr,
        /// `int` token ids `[N]`.
        tokens: DevicePtr,
        /// Tokens.
        n: u64,
        /// Model width.
        c: u64,
        /// First vocabulary row of the shard.
        v0: u64,
        /// Rows of the shard.
        v: u64,
    }
    /// Appends `fresh[B, Tn, K·D]` to `cache[B, Tc, K·D]` at position `at`.
    KvAppend => KvAppend {
        /// bf16 cache.
        cache: DevicePtr,
        /// bf16 fresh rows.
        fresh: DevicePtr,
        /// Sequences.
        b: u64,
        /// Fresh positions per sequence.
        tn: u64,
        /// Cache positions per sequence.
        tc: u64,
        /// Where the fresh rows go.
        at: u64,
        /// Elements per position (`K·D`).
        kd: u64,
        /// `int` row counter `[1]` added to `at`, or null.
        position: DevicePtr,
    }
    /// Scalar causal GQA attention forward: `out[B,Tq,H,D]`, `lse[B,H,Tq]`.
    AttentionForward => AttentionForward {
        /// bf16 output.
        out: DevicePtr,
        /// f32 log-sum-exp per row.
        lse: DevicePtr,
        /// Queries, keys, values, first keys and the shape.
        inputs: AttentionInputs,
    }
    /// Scalar causal GQA attention backward (f32 `dk`, `dv` gathered atomically).
    AttentionBackward => AttentionBackward {
        /// bf16 query gradient.
        dq: DevicePtr,
        /// f32 key gradient, added to.
        dk: DevicePtr,
        /// f32 value gradient, added to.
        dv: DevicePtr,
        /// bf16 output gradient.
        dout: DevicePtr,
        /// bf16 forward output.
        out: DevicePtr,
        /// f32 forward log-sum-exp.
        lse: DevicePtr,
        /// Queries, keys, values, first keys and the shape.
        inputs: AttentionInputs,
    }
    /// The LM head's per-row `(max, Σ exp(l − max), target logit)` over one vocabulary shard or
    /// chunk, merged into the values already there when `fold` is set.
    LogitsRowStats => LogitsRowStats {
        /// f32 row maxima `[R]`.
        row_max: DevicePtr,
        /// f32 row sums `[R]`.
        row_sum: DevicePtr,
        /// f32 target logits `[R]` (−inf outside the shard).
        target_logit: DevicePtr,
        /// f32 log-sum-exp `[R]` when the shard is the whole vocabulary, else null.
        lse: DevicePtr,
        /// f32 log p(target) `[R]` when the shard is the whole vocabulary, else null.
        logp: DevicePtr,
        /// bf16 logits `[R, C]`.
        logits: DevicePtr,
        /// `int` targets `[R]`.
        targets: DevicePtr,
        /// Rows.
        rows: u64,
        /// Columns of the shard.
        cols: u64,
        /// First vocabulary id of the shard.
        shard_start: u64,
        /// Non-zero: merge into the statistics of earlier chunks instead of writing them.
        fold: i32,
    }
    /// Next-token cross-entropy over `R` rows of log p: `dlogp` and the loss added to `loss[0]`.
    CrossEntropy => CrossEntropy {
        /// f32 gradient with respect to log p `[R]`.
        dlogp: DevicePtr,
        /// f32 loss accumulator `[1]`.
        loss: DevicePtr,
        /// f32 log p(target) `[R]`.
        logp: DevicePtr,
        /// Rows (`B·T`).
        rows: u64,
        /// Positions per sequence `T`.
        seq_len: u64,
        /// One over the global batch's counted positions.
        inv_count: f32,
    }
    /// `dlogits[R,C] = dlogp · (onehot(target) − exp(l − lse))`.
    LogprobBackward => LogprobBackward {
        /// bf16 logit gradient `[R, C]` (may be `logits`: computed in place).
        dlogits: DevicePtr,
        /// bf16 logits `[R, C]`.
        logits: DevicePtr,
        /// f32 global log-sum-exp per row.
        lse: DevicePtr,
        /// f32 loss gradient per row's log-prob.
        dlogp: DevicePtr,
        /// `int` targets `[R]`.
        targets: DevicePtr,
        /// Rows.
        rows: u64,
        /// Columns of the shard.
        cols: u64,
        /// First vocabulary id of the shard.
        shard_start: u64,
    }
    /// Greedy decoding over one vocabulary shard: the lowest column at the row's maximum.
    Argmax => Argmax {
        /// `int` tokens `[R]`.
        tokens: DevicePtr,
        /// f32 maxima `[R]`.
        values: DevicePtr,
        /// bf16 logits `[R, C]`.
        logits: DevicePtr,
        /// Rows.
        rows: u64,
        /// Columns.
        cols: u64,
    }
    /// Fused AdamW over a table of [`AdamTensor`]s in device memory.
    Adamw => Adamw {
        /// The table.
        tensors: DevicePtr,
        /// Tensors in it.
        count: i32,
        /// Learning rate.
        lr: f32,
        /// β₁.
        beta1: f32,
        /// β₂.
        beta2: f32,
        /// ε.
        eps: f32,
        /// `1 − β₁ᵗ`.
        c1: f32,
        /// `1 − β₂ᵗ`.
        c2: f32,
        /// The global-norm clipping factor.
        clip: f32,
    }
    /// One pass of a sum: `partial[block] = Σ x²` (`square` = 1) or `Σ x` (0).
    SumSquares => SumSquares {
        /// f32 partial sums, one per block.
        partial: DevicePtr,
        /// f32 input.
        x: DevicePtr,
        /// Elements.
        n: u64,
        /// 1 to square.
        square: i32,
    }
    /// Temperature, min-p, top-k and top-p sampling of `drawn[R]` from f32 `logits[R, V]`,
    /// sequence `ids[r]` at position `pos` drawing the counter-based uniform of
    /// `(seed, ids[r], pos)`; rows with `done[r]` set are skipped.
    Sample => Sample {
        /// `int` tokens drawn `[R]`.
        drawn: DevicePtr,
        /// Logits `[R, V]`, f32 or bf16 (`logits_bf16`).
        logits: DevicePtr,
        /// `u64` sequence ids `[R]`.
        ids: DevicePtr,
        /// `int` finished flags `[R]`, or null (every row drawn).
        done: DevicePtr,
        /// Rows.
        rows: u64,
        /// Vocabulary.
        v: u64,
        /// Seed of the draws.
        seed: u64,
        /// Position drawn.
        pos: u64,
        /// Temperature.
        temperature: f32,
        /// Top-p mass.
        top_p: f32,
        /// Min-p: the least probability, relative to the most likely token's, kept (0: off).
        min_p: f32,
        /// Most tokens kept (0: off).
        top_k: u64,
        /// 1 for greedy decoding.
        greedy: i32,
        /// 1 where the logits are bf16 (a decode's, read without widening them first), 0 for f32.
        logits_bf16: i32,
        /// `int` row counter `[1]` added to `pos`, or null.
        position: DevicePtr,
    }
    /// One decode step's bookkeeping: `drawn[B]` into `tokens[B, Tc]` at `pos` for unfinished
    /// sequences, their lengths and finished flags, and `last[B]` for the next step's embedding.
    DecodeAdvance => DecodeAdvance {
        /// `int` tokens `[B, Tc]`.
        tokens: DevicePtr,
        /// `int` response lengths `[B]`.
        lengths: DevicePtr,
        /// `int` finished flags `[B]`.
        done: DevicePtr,
        /// `int` tokens at `pos` `[B]`.
        last: DevicePtr,
        /// `int` tokens drawn `[B]`.
        drawn: DevicePtr,
        /// `int` stop ids `[S]`.
        stops: DevicePtr,
        /// Sequences.
        rows: u64,
        /// Positions per sequence.
        t_cap: u64,
        /// Position written.
        pos: u64,
        /// Stop ids.
        n_stops: u64,
        /// What a finished sequence holds.
        eos: i32,
        /// `int` row counter `[1]` added to `pos` and then advanced by one (the launch is one
        /// block), or null.
        position: DevicePtr,
    }
    /// Flash-decoding's first pass: each split's unnormalised output `partial[B, H, S, D]` and
    /// softmax statistics `stats[B, H, S, 2]` for one query per sequence against the KV cache.
    DecodeAttention => DecodeAttention {
        /// f32 partial outputs `[B, H, S, D]`.
        partial: DevicePtr,
        /// f32 `(max, Σ exp)` per split `[B, H, S, 2]`.
        stats: DevicePtr,
        /// bf16 queries `[B, 1, H, D]`.
        q: DevicePtr,
        /// bf16 key cache `[B, Tc, K, D]`.
        k: DevicePtr,
        /// bf16 value cache `[B, Tc, K, D]`.
        v: DevicePtr,
        /// `int` first key per sequence `[B]`, or null.
        starts: DevicePtr,
        /// `int` row counter `[1]` added to `tk`, or null.
        position: DevicePtr,
        /// `int` finished flags `[B]` (a finished sequence outputs zero), or null.
        done: DevicePtr,
        /// Sequences.
        b: u64,
        /// Valid keys (the query's position + 1), before the row counter.
        tk: u64,
        /// Cache positions per sequence.
        tc: u64,
        /// Query heads.
        heads: u64,
        /// Key/value heads.
        kv_heads: u64,
        /// Head width.
        d: u64,
        /// Splits of the keys.
        splits: u64,
        /// Keys per split (a multiple of the tile).
        split_keys: u64,
        /// bf16 output `[B, 1, H, D]` written directly where there is one split (no combine), or null.
        out: DevicePtr,
        /// f32 log-sum-exp `[B, H]` written with `out`, or null.
        lse: DevicePtr,
    }
    /// Flash-decoding's combine: `out[B, 1, H, D]` and `lse[B, H]` from the splits.
    DecodeAttentionCombine => DecodeAttentionCombine {
        /// bf16 output `[B, 1, H, D]`.
        out: DevicePtr,
        /// f32 log-sum-exp `[B, H]`.
        lse: DevicePtr,
        /// f32 partial outputs `[B, H, S, D]`.
        partial: DevicePtr,
        /// f32 `(max, Σ exp)` per split `[B, H, S, 2]`.
        stats: DevicePtr,
        /// Sequences.
        b: u64,
        /// Query heads.
        heads: u64,
        /// Head width.
        d: u64,
        /// Splits.
        splits: u64,
    }
    /// Probe: `out[t] = 255 − t` through shared memory (one block of 256).
    ProbeBlockReverse => ProbeBlockReverse {
        /// f32 output.
        out: DevicePtr,
    }
    /// Probe: warp and block sums.
    ProbeReductions => ProbeReductions {
        /// f32 output (two values per thread).
        out: DevicePtr,
    }
}

macro_rules! flash_args {
    ($( $(#[$doc:meta])* $name:ident by $select:ident { $( $(#[$fdoc:meta])* $field:ident : $ty:ty ),* $(,)? } )*) => {
        $(
            $(#[$doc])*
            #[derive(Debug, Clone, Copy, PartialEq)]
            pub struct $name {
                /// The padded head width, which picks the entry point (not a parameter).
                pub width: FlashWidth,
                $( $(#[$fdoc])* pub $field: $ty, )*
            }

            impl KernelCall for $name {
                fn kernel(&self) -> Kernel {
                    self.width.$select()
                }

                fn args(&self) -> KernelArgs {
                    let mut args = KernelArgs::default();
                    $( self.$field.push_args(&mut args); )*
                    args
                }
            }
        )*

        /// One call of each flash struct at `width` with zero arguments (the ABI test's samples).
        pub fn flash_samples(width: FlashWidth) -> Vec<Box<dyn KernelCall>> {
            vec![$(Box::new($name { width, $( $field: Default::default(), )* })),*]
        }
    };
}

flash_args! {
    /// Flash attention forward: `out[B,Tq,H,D]`, `lse[B,H,Tq]` (FlashAttention-2, Dao 2023).
    FlashForward by forward {
        /// bf16 output.
        out: DevicePtr,
        /// f32 log-sum-exp per row.
        lse: DevicePtr,
        /// Queries, keys, values, first keys and the shape.
        inputs: AttentionInputs,
    }
    /// Flash attention backward, first pass: `dq` and each row's `delta = Σ dout·out`.
    FlashBackwardDq by backward_dq {
        /// bf16 query gradient.
        dq: DevicePtr,
        /// f32 `Σ dout·out` per row.
        delta: DevicePtr,
        /// bf16 output gradient.
        dout: DevicePtr,
        /// bf16 forward output.
        out: DevicePtr,
        /// f32 forward log-sum-exp.
        lse: DevicePtr,
        /// Queries, keys, values, first keys and the shape.
        inputs: AttentionInputs,
    }
    /// Flash attention backward, second pass: `dk`, `dv` per key tile (no atomics).
    FlashBackwardDkv by backward_dkv {
        /// bf16 key gradient.
        dk: DevicePtr,
        /// bf16 value gradient.
        dv: DevicePtr,
        /// bf16 output gradient.
        dout: DevicePtr,
        /// f32 forward log-sum-exp.
        lse: DevicePtr,
        /// f32 `Σ dout·out` per row (from the first pass).
        delta: DevicePtr,
        /// Queries, keys, values, first keys and the shape.
        inputs: AttentionInputs,
    }
}

/// One tensor of the fused AdamW kernel's table (`NereusAdamTensor` in `device/adamw.cu`):
/// device addresses of the f32 master weights, moments and gradient and of the bf16 working copy.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct AdamTensor {
    /// f32 master weights.
    pub param: u64,
    /// f32 first moment.
    pub m: u64,
    /// f32 second moment.
    pub v: u64,
    /// bf16 working copy, rewritten from the updated master.
    pub working: u64,
    /// f32 gradient.
    pub grad: u64,
    /// Elements.
    pub n: u64,
    /// Decoupled weight decay of this tensor (0 for norms).
    pub weight_decay: f32,
    /// Padding to the device struct's 56 bytes.
    pub pad: u32,
}

// SAFETY: `repr(C)`, every field plain data, no implicit padding (6 × 8 + 4 + 4 = 56 bytes), and
// every bit pattern a valid value.
unsafe impl bytemuck::Zeroable for AdamTensor {}
// SAFETY: as above.
unsafe impl bytemuck::Pod for AdamTensor {}
const _: () = assert!(std::mem::size_of::<AdamTensor>() == 56);
