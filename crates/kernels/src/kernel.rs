//! Kernel ids, launch shapes and the argument block every backend passes.

use std::ffi::c_void;

use crate::source::Source;

/// A device address (a pointer argument, or the base of an allocation).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, PartialOrd, Ord)]
pub struct DevicePtr(pub u64);

impl DevicePtr {
    /// The null address (an optional pointer argument left out).
    pub const NULL: DevicePtr = DevicePtr(0);

    /// The address `bytes` further on.
    pub fn offset(self, bytes: u64) -> DevicePtr {
        DevicePtr(self.0 + bytes)
    }
}

macro_rules! kernels {
    ($( $(#[$doc:meta])* $id:ident = $name:literal in $source:ident; )*) => {
        /// Every entry point of every kernel source, as a backend launches it.
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
        pub enum Kernel {
            $( $(#[$doc])* $id, )*
        }

        impl Kernel {
            /// Every kernel, in table order ([`Kernel::index`]).
            pub const ALL: &'static [Kernel] = &[$(Kernel::$id),*];

            /// The `extern "C"` name of the entry point.
            pub fn name(self) -> &'static str {
                match self { $(Kernel::$id => $name,)* }
            }

            /// The source that defines it.
            pub fn source(self) -> Source {
                match self { $(Kernel::$id => Source::$source,)* }
            }
        }
    };
}

kernels! {
    /// `rect_copy` over 16-byte vectors (`pack.cu`).
    RectCopy16 = "nereus_rect_copy_16" in Pack;
    /// `rect_copy` over 8-byte vectors.
    RectCopy8 = "nereus_rect_copy_8" in Pack;
    /// `rect_copy` over 4-byte vectors.
    RectCopy4 = "nereus_rect_copy_4" in Pack;
    /// `rect_copy` over 2-byte vectors.
    RectCopy2 = "nereus_rect_copy_2" in Pack;
    /// `rect_copy` over bytes.
    RectCopy1 = "nereus_rect_copy_1" in Pack;
    /// f32 to bf16, rounding to nearest even.
    CastF32ToBf16 = "nereus_cast_f32_to_bf16" in Cast;
    /// bf16 to f32 (exact).
    CastBf16ToF32 = "nereus_cast_bf16_to_f32" in Cast;
    /// RMSNorm forward.
    RmsnormForward = "nereus_rmsnorm_forward" in Norm;
    /// RMSNorm backward.
    RmsnormBackward = "nereus_rmsnorm_backward" in Norm;
    /// `x += y` on the residual stream.
    ResidualAdd = "nereus_residual_add" in Norm;
    /// SwiGLU forward.
    SwigluForward = "nereus_swiglu_forward" in Swiglu;
    /// SwiGLU backward.
    SwigluBackward = "nereus_swiglu_backward" in Swiglu;
    /// Rotary embeddings, in place (forward, or inverse for the backward pass).
    Rope = "nereus_rope" in Rope;
    /// The fused QKV projection's split (rotating q and k, appending to a KV cache) or merge.
    QkvRope = "nereus_qkv_rope" in Rope;
    /// Token embedding forward.
    EmbeddingForward = "nereus_embedding_forward" in Embedding;
    /// Token embedding backward.
    EmbeddingBackward = "nereus_embedding_backward" in Embedding;
    /// KV-cache append.
    KvAppend = "nereus_kv_append" in Attention;
    /// Scalar causal GQA attention forward (heads wider than the flash kernels take).
    AttentionForward = "nereus_attention_forward" in Attention;
    /// Scalar causal GQA attention backward.
    AttentionBackward = "nereus_attention_backward" in Attention;
    /// Flash attention forward, heads up to 32 wide.
    FlashForward32 = "nereus_flash_forward_32" in FlashAttention;
    /// Flash attention backward, dq pass, heads up to 32 wide.
    FlashBackwardDq32 = "nereus_flash_backward_dq_32" in FlashAttention;
    /// Flash attention backward, dk/dv pass, heads up to 32 wide.
    FlashBackwardDkv32 = "nereus_flash_backward_dkv_32" in FlashAttention;
    /// Flash attention forward, heads up to 64 wide.
    FlashForward64 = "nereus_flash_forward_64" in FlashAttention;
    /// Flash attention backward, dq pass, heads up to 64 wide.
    FlashBackwardDq64 = "nereus_flash_backward_dq_64" in FlashAttention;
    /// Flash attention backward, dk/dv pass, heads up to 64 wide.
    FlashBackwardDkv64 = "nereus_flash_backward_dkv_64" in FlashAttention;
    /// Flash attention forward, heads up to 128 wide.
    FlashForward128 = "nereus_flash_forward_128" in FlashAttention;
    /// Flash attention backward, dq pass, heads up to 128 wide.
    FlashBackwardDq128 = "nereus_flash_backward_dq_128" in FlashAttention;
    /// Flash attention backward, dk/dv pass, heads up to 128 wide.
    FlashBackwardDkv128 = "nereus_flash_backward_dkv_128" in FlashAttention;
    /// Flash-decoding's per-split partial softmax over the KV cache.
    DecodeAttention = "nereus_decode_attention" in DecodeAttention;
    /// Flash-decoding's combine of the splits.
    DecodeAttentionCombine = "nereus_decode_attention_combine" in DecodeAttention;
    /// The LM head's per-row statistics over a vocabulary shard.
    LogitsRowStats = "nereus_logits_row_stats" in Logits;
    /// Next-token cross-entropy's loss and gradient with respect to log p.
    CrossEntropy = "nereus_cross_entropy" in Logits;
    /// The LM head's backward through log p(target).
    LogprobBackward = "nereus_logprob_backward" in Logits;
    /// Greedy argmax over a vocabulary shard.
    Argmax = "nereus_argmax" in Logits;
    /// Fused multi-tensor AdamW.
    Adamw = "nereus_adamw" in Adamw;
    /// One pass of a sum (of squares).
    SumSquares = "nereus_sum_squares" in Adamw;
    /// Temperature, min-p, top-k and top-p sampling, one block per row.
    Sample = "nereus_sample" in Sample;
    /// A decode step's token, length and finished-flag bookkeeping.
    DecodeAdvance = "nereus_decode_advance" in Sample;
    /// Probe: a block reverses its threads' values through shared memory.
    ProbeBlockReverse = "nereus_probe_block_reverse" in Probe;
    /// Probe: warp and block reductions.
    ProbeReductions = "nereus_probe_reductions" in Probe;
}

impl Kernel {
    /// The kernel's position in [`Kernel::ALL`]: a backend's table of loaded functions is indexed
    /// by it.
    pub fn index(self) -> usize {
        self as usize
    }
}

/// One kernel argument, by value, as the kernel's parameter type.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum KernelArg {
    /// A device address (any pointer parameter).
    Ptr(u64),
    /// `u64` (lengths, offsets, pitches).
    U64(u64),
    /// `float`.
    F32(f32),
    /// `int`.
    I32(i32),
}

impl KernelArg {
    /// Bytes of the parameter it passes.
    pub fn size(&self) -> usize {
        match self {
            KernelArg::Ptr(_) | KernelArg::U64(_) => 8,
            KernelArg::F32(_) | KernelArg::I32(_) => 4,
        }
    }
}

/// The arguments of one launch, laid out as `cuLaunchKernel` and `hipModuleLaunchKernel` take
/// them (and the grid emulator too): an array of pointers to the values.
#[derive(Debug, Default, Clone, PartialEq)]
pub struct KernelArgs {
    values: Vec<KernelArg>,
}

impl KernelArgs {
    /// The arguments in parameter order.
    pub fn new(values: impl IntoIterator<Item = KernelArg>) -> KernelArgs {
        KernelArgs { values: values.into_iter().collect() }
    }

    /// Appends one argument.
    pub fn push(&mut self, value: KernelArg) {
        self.values.push(value);
    }

    /// The values in parameter order.
    pub fn values(&self) -> &[KernelArg] {
        &self.values
    }

    /// The pointer arguments' addresses.
    pub fn addresses(&self) -> impl Iterator<Item = u64> + '_ {
        self.values.iter().filter_map(|v| match v {
            KernelArg::Ptr(p) => Some(*p),
            _ => None,
        })
    }

    /// Pointers to each value, valid while `self` is neither moved nor changed.
    pub fn pointers(&mut self) -> Vec<*mut c_void> {
        self.values
            .iter_mut()
            .map(|v| match v {
                KernelArg::Ptr(p) | KernelArg::U64(p) => (p as *mut u64).cast(),
                KernelArg::F32(x) => (x as *mut f32).cast(),
                KernelArg::I32(x) => (x as *mut i32).cast(),
            })
            .collect()
    }
}

/// A value that passes as one or more kernel parameters.
pub trait PushArgs {
    /// Appends the parameters it passes, in order.
    fn push_args(&self, args: &mut KernelArgs);
}

impl PushArgs for DevicePtr {
    fn push_args(&self, args: &mut KernelArgs) {
        args.push(KernelArg::Ptr(self.0));
    }
}

impl PushArgs for u64 {
    fn push_args(&self, args: &mut KernelArgs) {
        args.push(KernelArg::U64(*self));
    }
}

impl PushArgs for f32 {
    fn push_args(&self, args: &mut KernelArgs) {
        args.push(KernelArg::F32(*self));
    }
}

impl PushArgs for i32 {
    fn push_args(&self, args: &mut KernelArgs) {
        args.push(KernelArg::I32(*self));
    }
}

/// A kernel's typed arguments: which entry point they launch and the values in its parameter
/// order. Every launch goes through one ([`crate::args`]).
pub trait KernelCall {
    /// The entry point.
    fn kernel(&self) -> Kernel;
    /// The arguments, in parameter order.
    fn args(&self) -> KernelArgs;
}

/// A kernel launch's shape: which entry point, over how many blocks of how many threads, with how
/// much dynamic shared memory.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Launch {
    /// Entry point.
    pub kernel: Kernel,
    /// Blocks (x, y, z).
    pub grid: [u32; 3],
    /// Threads per block (x, y, z).
    pub block: [u32; 3],
    /// Bytes of dynamic shared memory per block.
    pub shared_bytes: u32,
}

impl Launch {
    /// `call`'s kernel over `grid` blocks of `threads` threads (1-D blocks, no dynamic shared
    /// memory).
    pub fn of(call: &impl KernelCall, grid: [u32; 3], threads: u32) -> Launch {
        Launch { kernel: call.kernel(), grid, block: [threads, 1, 1], shared_bytes: 0 }
    }
}
