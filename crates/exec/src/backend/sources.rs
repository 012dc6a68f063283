//! The kernel sources in `kernels/`, one per concern, each compiled by NVRTC (CUDA), hipcc (ROCm)
//! and the host C++ compiler (the grid emulator) with the same prelude (docs/kernels.md), and the
//! argument block every backend launches them with.

use std::ffi::c_void;

use super::kernels::RECT_COPY_KERNELS;
use super::BackendError;

/// The portability prelude every source is compiled with.
pub const PRELUDE: &str = include_str!("../../../../kernels/prelude.h");

/// One kernel source and the entry points it defines.
#[derive(Debug, Clone, Copy)]
pub struct KernelSource {
    /// File name in `kernels/`, e.g. `pack.cu`.
    pub file: &'static str,
    /// The source text (without the prelude).
    pub text: &'static str,
    /// Entry points (`extern "C"` names on devices; the emulator's table lists the same).
    pub entry_points: &'static [&'static str],
}

/// The engine's entry points in `kernels/engine.cu`.
pub const ENGINE_KERNELS: [&str; 12] = [
    "nereus_cast_f32_to_bf16",
    "nereus_cast_bf16_to_f32",
    "nereus_rmsnorm_forward",
    "nereus_rmsnorm_backward",
    "nereus_swiglu_forward",
    "nereus_swiglu_backward",
    "nereus_residual_add",
    "nereus_logits_row_stats",
    "nereus_adamw",
    "nereus_logprob_backward",
    "nereus_argmax",
    "nereus_sum_squares",
];

const PACK_ENTRY_POINTS: [&str; 5] = {
    let mut names = [""; 5];
    let mut i = 0;
    while i < 5 {
        names[i] = RECT_COPY_KERNELS[i].1;
        i += 1;
    }
    names
};

/// The attention-path entry points in `kernels/attention.cu`.
pub const ATTENTION_KERNELS: [&str; 6] = [
    "nereus_embedding_forward",
    "nereus_embedding_backward",
    "nereus_rope",
    "nereus_kv_append",
    "nereus_attention_forward",
    "nereus_attention_backward",
];

/// The flash attention entry points in `kernels/flash_attention.cu`, by padded head width.
pub const FLASH_KERNELS: [&str; 9] = [
    "nereus_flash_forward_32",
    "nereus_flash_backward_dq_32",
    "nereus_flash_backward_dkv_32",
    "nereus_flash_forward_64",
    "nereus_flash_backward_dq_64",
    "nereus_flash_backward_dkv_64",
    "nereus_flash_forward_128",
    "nereus_flash_backward_dq_128",
    "nereus_flash_backward_dkv_128",
];

/// Warps per block of the flash attention kernels (`NEREUS_FLASH_WARPS`).
pub const FLASH_WARPS: u32 = 4;
/// Rows (query, head) a forward or dq block owns, and keys a dkv block owns (`NEREUS_FLASH_ROWS`).
pub const FLASH_ROWS: usize = 64;

/// The padded head width of a flash attention kernel: a head of width `d` runs in the narrowest
/// one that holds it (zero columns pad it). Wider heads take the scalar kernels of
/// `attention.cu`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FlashWidth {
    /// Heads of width 1–32.
    D32,
    /// Heads of width 33–64 (Llama-3.2-1B's 64).
    D64,
    /// Heads of width 65–128 (Llama-3.1-8B's 128).
    D128,
}

impl FlashWidth {
    /// The kernels' width for heads of width `d`, if they take it
    /// ([`nereus_core::cost::reference::FLASH_MAX_HEAD_DIM`] is the widest).
    pub fn for_head(d: usize) -> Option<FlashWidth> {
        const _: () = assert!(nereus_core::cost::reference::FLASH_MAX_HEAD_DIM == 128);
        match d {
            1..=32 => Some(FlashWidth::D32),
            33..=64 => Some(FlashWidth::D64),
            65..=128 => Some(FlashWidth::D128),
            _ => None,
        }
    }

    fn index(self) -> usize {
        match self {
            FlashWidth::D32 => 0,
            FlashWidth::D64 => 1,
            FlashWidth::D128 => 2,
        }
    }

    /// The forward entry point: `out`, `lse` from `q, k, v, starts` and the shape.
    pub fn forward(self) -> &'static str {
        FLASH_KERNELS[3 * self.index()]
    }

    /// The backward's first pass: `dq` and `delta` (Σ dout·out per row).
    pub fn backward_dq(self) -> &'static str {
        FLASH_KERNELS[3 * self.index() + 1]
    }

    /// The backward's second pass: `dk`, `dv`.
    pub fn backward_dkv(self) -> &'static str {
        FLASH_KERNELS[3 * self.index() + 2]
    }
}

/// Blocks of a flash forward or dq launch: `⌈tq·G / 64⌉` row tiles per (key/value head, sequence).
pub fn flash_rows_grid(b: usize, tq: usize, heads: usize, kv_heads: usize) -> [u32; 3] {
    [(tq * (heads / kv_heads)).div_ceil(FLASH_ROWS) as u32, kv_heads as u32, b as u32]
}

/// Blocks of a flash dkv launch: `⌈tk / 64⌉` key tiles per (key/value head, sequence).
pub fn flash_keys_grid(b: usize, tk: usize, kv_heads: usize) -> [u32; 3] {
    [tk.div_ceil(FLASH_ROWS) as u32, kv_heads as u32, b as u32]
}

/// Threads per block the attention kernels must be launched with (`NEREUS_KEY_TILE`).
pub const ATTENTION_BLOCK: u32 = 128;
/// Widest head the attention kernels take (`NEREUS_MAX_HEAD_DIM`).
pub const ATTENTION_MAX_HEAD_DIM: usize = 256;

/// The execution-model probes in `kernels/probe.cu` (the emulator also has one that must fail).
pub const PROBE_KERNELS: [&str; 2] = ["nereus_probe_block_reverse", "nereus_probe_reductions"];

/// Every kernel source.
pub const SOURCES: [KernelSource; 6] = [
    KernelSource {
        file: "pack.cu",
        text: include_str!("../../../../kernels/pack.cu"),
        entry_points: &PACK_ENTRY_POINTS,
    },
    KernelSource {
        file: "engine.cu",
        text: include_str!("../../../../kernels/engine.cu"),
        entry_points: &ENGINE_KERNELS,
    },
    KernelSource {
        file: "attention.cu",
        text: include_str!("../../../../kernels/attention.cu"),
        entry_points: &ATTENTION_KERNELS,
    },
    KernelSource {
        file: "flash_attention.cu",
        text: include_str!("../../../../kernels/flash_attention.cu"),
        entry_points: &FLASH_KERNELS,
    },
    KernelSource {
        file: "sample.cu",
        text: include_str!("../../../../kernels/sample.cu"),
        entry_points: &["nereus_sample"],
    },
    KernelSource { file: "probe.cu", text: include_str!("../../../../kernels/probe.cu"), entry_points: &PROBE_KERNELS },
];

impl KernelSource {
    /// The text a run-time compiler (NVRTC) is given: the prelude, then the source.
    pub fn with_prelude(&self) -> String {
        format!("{PRELUDE}\n#line 1 \"{}\"\n{}", self.file, self.text)
    }
}

/// A kernel launch's shape: which entry point, over how many blocks of how many threads, with how
/// much dynamic shared memory.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Launch {
    /// Entry point.
    pub kernel: &'static str,
    /// Blocks (x, y, z).
    pub grid: [u32; 3],
    /// Threads per block (x, y, z).
    pub block: [u32; 3],
    /// Bytes of dynamic shared memory per block.
    pub shared_bytes: u32,
}

/// One tensor of the fused AdamW kernel's table (`NereusAdamTensor` in `kernels/engine.cu`):
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

/// The loaded function of `kernel` among a runtime's `(name, function)` pairs.
pub fn loaded<F: Copy>(kernels: &[(&'static str, F)], kernel: &str, backend: &'static str) -> Result<F, BackendError> {
    kernels
        .iter()
        .find(|(name, _)| *name == kernel)
        .map(|&(_, f)| f)
        .ok_or_else(|| BackendError::Kernels { backend, reason: format!("no kernel named {kernel}") })
}

/// One kernel argument, by value, as the kernel's parameter type.
#[derive(Debug, Clone, Copy)]
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

/// The arguments of one launch, laid out as `cuLaunchKernel` and `hipModuleLaunchKernel` take
/// them (and the grid emulator too): an array of pointers to the values.
#[derive(Debug, Default)]
pub struct KernelArgs {
    values: Vec<KernelArg>,
}

impl KernelArgs {
    /// The arguments in parameter order.
    pub fn new(values: impl IntoIterator<Item = KernelArg>) -> KernelArgs {
        KernelArgs { values: values.into_iter().collect() }
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
