//! Launch geometry of the attention kernels (`device/attention.cu`, `device/flash_attention.cu`,
//! `device/decode_attention.cu`): which flash entry point a head width takes, how flash-decoding
//! splits the keys, and the grids and blocks each kernel expects.

use crate::Kernel;

/// Warps per block of the flash attention kernels (`NEREUS_FLASH_WARPS`).
pub const FLASH_WARPS: u32 = 4;
/// Rows (query, head) a forward or dq block owns, and keys a dkv block owns (`NEREUS_FLASH_ROWS`).
pub const FLASH_ROWS: usize = 64;
/// Widest head the flash kernels take; wider heads take the scalar kernels.
pub const FLASH_MAX_HEAD_DIM: usize = 128;
/// Threads per block the scalar attention kernels must be launched with (`NEREUS_KEY_TILE`).
pub const ATTENTION_BLOCK: u32 = 128;
/// Widest head the scalar attention kernels take (`NEREUS_MAX_HEAD_DIM`).
pub const ATTENTION_MAX_HEAD_DIM: usize = 256;

/// The padded head width of a flash attention kernel: a head of width `d` runs in the narrowest
/// one that holds it (zero columns pad it).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum FlashWidth {
    /// Heads of width 1–32.
    D32,
    /// Heads of width 33–64 (Llama-3.2-1B's 64).
    D64,
    /// Heads of width 65–128 (Llama-3.1-8B's 128).
    D128,
}

impl FlashWidth {
    /// Every width.
    pub const ALL: [FlashWidth; 3] = [FlashWidth::D32, FlashWidth::D64, FlashWidth::D128];

    /// The kernels' width for heads of width `d`, if they take it ([`FLASH_MAX_HEAD_DIM`] is
    /// the widest).
    pub fn for_head(d: usize) -> Option<FlashWidth> {
        match d {
            1..=32 => Some(FlashWidth::D32),
            33..=64 => Some(FlashWidth::D64),
            65..=FLASH_MAX_HEAD_DIM => Some(FlashWidth::D128),
            _ => None,
        }
    }

    /// The forward entry point: `out`, `lse` from `q, k, v, starts` and the shape.
    pub fn forward(self) -> Kernel {
        match self {
            FlashWidth::D32 => Kernel::FlashForward32,
            FlashWidth::D64 => Kernel::FlashForward64,
            FlashWidth::D128 => Kernel::FlashForward128,
        }
    }

    /// The backward's first pass: `dq` and `delta` (Σ dout·out per row).
    pub fn backward_dq(self) -> Kernel {
        match self {
            FlashWidth::D32 => Kernel::FlashBackwardDq32,
            FlashWidth::D64 => Kernel::FlashBackwardDq64,
            FlashWidth::D128 => Kernel::FlashBackwardDq128,
        }
    }

    /// The backward's second pass: `dk`, `dv`.
    pub fn backward_dkv(self) -> Kernel {
        match self {
            FlashWidth::D32 => Kernel::FlashBackwardDkv32,
            FlashWidth::D64 => Kernel::FlashBackwardDkv64,
            FlashWidth::D128 => Kernel::FlashBackwardDkv128,
        }
    }
}

/// Threads per block of the flash kernels on a device whose warps are `warp` lanes wide.
pub fn flash_threads(warp: u32) -> u32 {
    FLASH_WARPS * warp
}

/// Blocks of a flash forward or dq launch: `⌈tq·G / 64⌉` row tiles per (key/value head, sequence).
pub fn flash_rows_grid(b: usize, tq: usize, heads: usize, kv_heads: usize) -> [u32; 3] {
    [(tq * (heads / kv_heads)).div_ceil(FLASH_ROWS) as u32, kv_heads as u32, b as u32]
}

/// Blocks of a flash dkv launch: `⌈tk / 64⌉` key tiles per (key/value head, sequence).
pub fn flash_keys_grid(b: usize, tk: usize, kv_heads: usize) -> [u32; 3] {
    [tk.div_ceil(FLASH_ROWS) as u32, kv_heads as u32, b as u32]
}

/// Blocks of a scalar attention launch: one per (query, head, sequence).
pub fn attention_grid(b: usize, tq: usize, heads: usize) -> [u32; 3] {
    [tq as u32, heads as u32, b as u32]
}

/// Threads per block of flash-decoding's first pass (`NEREUS_DECODE_THREADS`).
pub const DECODE_THREADS: u32 = 128;
/// Keys flash-decoding stages in shared memory at once (`NEREUS_DECODE_TILE`).
pub const DECODE_TILE: usize = 32;
/// Most query heads a group may have (`NEREUS_DECODE_MAX_GROUP`).
pub const DECODE_MAX_GROUP: usize = 16;
/// Widest head flash-decoding takes (`NEREUS_DECODE_MAX_HEAD_DIM`).
pub const DECODE_MAX_HEAD_DIM: usize = 256;
/// Most outputs (query heads of a group × head width) a block accumulates (`NEREUS_DECODE_MAX_OUTPUTS`).
pub const DECODE_MAX_OUTPUTS: usize = 1024;

/// Blocks of flash-decoding's first pass: (split, key/value head, sequence).
pub fn decode_grid(splits: usize, b: usize, kv_heads: usize) -> [u32; 3] {
    [splits as u32, kv_heads as u32, b as u32]
}

/// Blocks of flash-decoding's combine: one per (query head, sequence).
pub fn decode_combine_grid(b: usize, heads: usize) -> [u32; 3] {
    [heads as u32, b as u32, 1]
}
