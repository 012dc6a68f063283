//! Launch geometry of the rectangle-copy kernels (`device/pack.cu`) and the
//! schedule of Merge's in-place slice: pure functions, tested without a device.
//!
//! One kernel family serves every rectangle the data plane moves: packing (pitched source,
//! contiguous target), unpacking (contiguous source, pitched target) and local slices (both
//! pitched). Each entry point copies `rows` rows of `row_vectors` vectors of `W` bytes; a 2-D
//! grid-stride loop puts `x` along a row and `y` across rows:
//!
//! ```text
//! for row = blockIdx.y·blockDim.y + threadIdx.y; row < rows; row += gridDim.y·blockDim.y
//!   for col = blockIdx.x·blockDim.x + threadIdx.x; col < row_vectors; col += gridDim.x·blockDim.x
//!     dst[row·dst_pitch + col] = src[row·src_pitch + col]          (pitches in vectors)
//! ```

use std::ops::Range;

use crate::{DevicePtr, Kernel, KernelArgs, KernelCall, Launch, PushArgs};

/// Threads per block (x · y).
pub const BLOCK_THREADS: u32 = 256;
/// Largest `gridDim.y` CUDA and HIP accept.
pub const MAX_GRID_Y: u32 = 65_535;
/// Blocks per launch at most: enough to fill any current GPU several times over; larger copies
/// loop (grid stride) instead of launching more blocks.
pub const MAX_BLOCKS: u64 = 32_768;
/// Kernel launches one in-place slice may take; beyond it Merge copies out of place.
pub const MAX_IN_PLACE_LAUNCHES: usize = 4_096;

/// Entry points by vector width in bytes, widest first (`device/pack.cu`).
pub const RECT_COPY_KERNELS: [(u64, Kernel); 5] = [
    (16, Kernel::RectCopy16),
    (8, Kernel::RectCopy8),
    (4, Kernel::RectCopy4),
    (2, Kernel::RectCopy2),
    (1, Kernel::RectCopy1),
];

/// A rectangle copy inside one memory, in bytes: `rows` rows of `row_bytes`, read from
/// `src_offset` with rows `src_pitch` apart and written at `dst_offset` with rows `dst_pitch`
/// apart. Packing writes with `dst_pitch = row_bytes`, unpacking reads with `src_pitch = row_bytes`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RectCopy {
    /// Byte offset of the first source row.
    pub src_offset: u64,
    /// Bytes between source rows.
    pub src_pitch: u64,
    /// Byte offset of the first target row.
    pub dst_offset: u64,
    /// Bytes between target rows.
    pub dst_pitch: u64,
    /// Bytes per row.
    pub row_bytes: u64,
    /// Rows.
    pub rows: u64,
}

impl RectCopy {
    /// Bytes the copy moves.
    pub fn bytes(&self) -> u64 {
        self.row_bytes * self.rows
    }

    /// Whether both sides are one contiguous run (a plain memcpy).
    pub fn is_contiguous(&self) -> bool {
        self.rows <= 1 || (self.src_pitch == self.row_bytes && self.dst_pitch == self.row_bytes)
    }

    /// Byte range of row `row` on the source side.
    pub fn src_row(&self, row: u64) -> Range<u64> {
        let start = self.src_offset + row * self.src_pitch;
        start..start + self.row_bytes
    }

    /// Byte range of row `row` on the target side.
    pub fn dst_row(&self, row: u64) -> Range<u64> {
        let start = self.dst_offset + row * self.dst_pitch;
        start..start + self.row_bytes
    }

    /// The copy on host bytes: what the kernels do on a device (the host memory's copy, and
    /// the reference the device copies are checked against).
    pub fn copy_on_host(&self, src: &[u8], dst: &mut [u8]) {
        if self.is_contiguous() {
            let (s, d, n) = (self.src_offset as usize, self.dst_offset as usize, self.bytes() as usize);
            dst[d..d + n].copy_from_slice(&src[s..s + n]);
            return;
        }
        for row in 0..self.rows {
            let (s, d) = (self.src_row(row), self.dst_row(row));
            dst[d.start as usize..d.end as usize].copy_from_slice(&src[s.start as usize..s.end as usize]);
        }
    }

    /// Rows `rows` of this copy as a copy of their own.
    fn rows_of(&self, rows: Range<u64>) -> RectCopy {
        RectCopy {
            src_offset: self.src_row(rows.start).start,
            dst_offset: self.dst_row(rows.start).start,
            rows: rows.end - rows.start,
            ..*self
        }
    }
}

/// One kernel launch: entry point, grid, block and arguments (addresses in bytes, pitches and
/// row length in vectors of `width` bytes); the typed arguments of `rect_copy`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RectLaunch {
    /// Entry point.
    pub kernel: Kernel,
    /// Bytes per vector.
    pub width: u64,
    /// Blocks (x along rows, y across rows).
    pub grid: [u32; 3],
    /// Threads per block.
    pub block: [u32; 3],
    /// Target address of row 0.
    pub dst: u64,
    /// Vectors between target rows.
    pub dst_pitch: u64,
    /// Source address of row 0.
    pub src: u64,
    /// Vectors between source rows.
    pub src_pitch: u64,
    /// Vectors per row.
    pub row_vectors: u64,
    /// Rows.
    pub rows: u64,
}

impl RectLaunch {
    /// The launch's shape.
    pub fn launch(&self) -> Launch {
        Launch { kernel: self.kernel, grid: self.grid, block: self.block, shared_bytes: 0 }
    }
}

impl KernelCall for RectLaunch {
    fn kernel(&self) -> Kernel {
        self.kernel
    }

    fn args(&self) -> KernelArgs {
        let mut args = KernelArgs::default();
        DevicePtr(self.dst).push_args(&mut args);
        self.dst_pitch.push_args(&mut args);
        DevicePtr(self.src).push_args(&mut args);
        for v in [self.src_pitch, self.row_vectors, self.rows] {
            v.push_args(&mut args);
        }
        args
    }
}

/// The launch that copies `c` between buffers at `src_base` and `dst_base` (device addresses):
/// the widest vector every address, pitch and row length is a multiple of; blocks shaped to
/// the row length so narrow rows still fill warps; at most [`MAX_BLOCKS`] blocks.
pub fn rect_launch(src_base: u64, dst_base: u64, c: &RectCopy) -> RectLaunch {
    let (src, dst) = (src_base + c.src_offset, dst_base + c.dst_offset);
    let aligned = src | dst | c.src_pitch | c.dst_pitch | c.row_bytes;
    let (width, kernel) =
        RECT_COPY_KERNELS.into_iter().find(|(w, _)| aligned.is_multiple_of(*w)).expect("width 1 divides all");
    let row_vectors = c.row_bytes / width;
    let bx = if row_vectors >= u64::from(BLOCK_THREADS) {
        BLOCK_THREADS
    } else {
        (row_vectors.max(1).next_power_of_two() as u32).max(32)
    };
    let by = BLOCK_THREADS / bx;
    let mut gx = row_vectors.div_ceil(u64::from(bx)).max(1);
    let mut gy = c.rows.div_ceil(u64::from(by)).clamp(1, u64::from(MAX_GRID_Y));
    gx = gx.min((MAX_BLOCKS / gy).max(1));
    gy = gy.min((MAX_BLOCKS / gx).max(1));
    RectLaunch {
        kernel,
        width,
        grid: [gx as u32, gy as u32, 1],
        block: [bx, by, 1],
        dst,
        dst_pitch: c.dst_pitch / width,
        src,
        src_pitch: c.src_pitch / width,
        row_vectors,
        rows: c.rows,
    }
}

/// Visits `(row, col)` for every vector a launch copies, walking blocks and threads exactly as
/// the kernel's loops do: the tests' reference for the launch geometry.
#[cfg(test)]
fn for_each_vector(l: &RectLaunch, mut visit: impl FnMut(u64, u64)) {
    let (gx, gy) = (u64::from(l.grid[0]), u64::from(l.grid[1]));
    let (bx, by) = (u64::from(l.block[0]), u64::from(l.block[1]));
    for block_y in 0..gy {
        for block_x in 0..gx {
            for ty in 0..by {
                for tx in 0..bx {
                    let mut row = block_y * by + ty;
                    while row < l.rows {
                        let mut col = block_x * bx + tx;
                        while col < l.row_vectors {
                            visit(row, col);
                            col += gx * bx;
                        }
                        row += gy * by;
                    }
                }
            }
        }
    }
}

/// The launches of Merge's in-place slice: `copies` (sorted by source offset) rewritten inside
/// one buffer, each launch a run of rows whose targets all lie below all of its sources, so no
/// launch reads what it writes, and launches in stream order never overwrite a byte a later
/// one reads. Needs every row to move down or stay and the targets to keep the sources' order;
/// `None` otherwise, or when it would take more than [`MAX_IN_PLACE_LAUNCHES`] launches.
pub fn in_place_schedule(copies: &[RectCopy]) -> Option<Vec<RectCopy>> {
    let mut out = Vec::new();
    let mut last_dst_end = 0u64;
    let mut last_src_end = 0u64;
    for c in copies.iter().filter(|c| c.rows > 0 && c.row_bytes > 0) {
        let (first, last) = (c.src_row(0), c.src_row(c.rows - 1));
        if c.dst_offset > c.src_offset || c.dst_pitch > c.src_pitch || c.dst_offset < last_dst_end {
            return None;
        }
        if first.start < last_src_end || (c.src_pitch < c.row_bytes && c.rows > 1) {
            return None; // sources must be disjoint rows in increasing order
        }
        (last_dst_end, last_src_end) = (c.dst_row(c.rows - 1).end, last.end);
        if c.dst_offset == c.src_offset && c.dst_pitch == c.src_pitch {
            continue; // already in place
        }
        let mut a = 0;
        while a < c.rows {
            let (src, dst) = (c.src_row(a), c.dst_row(a));
            if dst.start == src.start {
                a += 1; // this row stays
            } else if dst.end > src.start {
                // The row overlaps itself: move it in pieces no longer than the shift.
                let shift = src.start - dst.start;
                for start in (0..c.row_bytes).step_by(shift as usize) {
                    let n = shift.min(c.row_bytes - start);
                    out.push(RectCopy {
                        src_offset: src.start + start,
                        dst_offset: dst.start + start,
                        row_bytes: n,
                        rows: 1,
                        ..*c
                    });
                }
                a += 1;
            } else {
                // Rows a..b whose targets end at or before row a's source starts.
                let reach = (src.start - c.dst_offset - c.row_bytes) / c.dst_pitch.max(1);
                let b = (reach + 1).min(c.rows).max(a + 1);
                out.push(c.rows_of(a..b));
                a = b;
            }
            if out.len() > MAX_IN_PLACE_LAUNCHES {
                return None;
            }
        }
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn covers_each_vector_once(c: &RectCopy, src_base: u64, dst_base: u64) -> RectLaunch {
        let l = rect_launch(src_base, dst_base, c);
        assert!(l.grid[1] <= MAX_GRID_Y && u64::from(l.grid[0]) * u64::from(l.grid[1]) <= MAX_BLOCKS, "{l:?}");
        assert_eq!(l.block[0] * l.block[1], BLOCK_THREADS);
        let mut seen = vec![0u8; (l.rows * l.row_vectors) as usize];
        for_each_vector(&l, |row, col| seen[(row * l.row_vectors + col) as usize] += 1);
        assert!(seen.iter().all(|&n| n == 1), "every vector exactly once for {c:?}");
        assert_eq!(l.row_vectors * l.width, c.row_bytes);
        l
    }

    #[test]
    fn launches_cover_every_vector_once_for_narrow_wide_and_tall_rectangles() {
        for (row_bytes, rows) in [(4, 1), (64, 3), (4 * 1000, 7), (2 * 17, 5), (16 * 300, 70_000), (12, 40_000)] {
            let c = RectCopy {
                src_offset: 0,
                src_pitch: row_bytes * 3,
                dst_offset: 0,
                dst_pitch: row_bytes,
                row_bytes,
                rows,
            };
            covers_each_vector_once(&c, 256, 1 << 20);
        }
    }

    #[test]
    fn vector_width_follows_the_alignment_of_every_address_and_pitch() {
        let c = |row_bytes, pitch| RectCopy {
            src_offset: 0,
            src_pitch: pitch,
            dst_offset: 0,
            dst_pitch: row_bytes,
            row_bytes,
            rows: 2,
        };
        assert_eq!(covers_each_vector_once(&c(64, 128), 0, 256).kernel, Kernel::RectCopy16);
        assert_eq!(covers_each_vector_once(&c(8, 24), 0, 256).width, 8);
        assert_eq!(covers_each_vector_once(&c(64, 128), 4, 256).width, 4, "a misaligned base narrows");
        assert_eq!(covers_each_vector_once(&c(6, 10), 0, 256).width, 2, "bf16 rows of three");
        assert_eq!(covers_each_vector_once(&c(3, 5), 0, 256).width, 1);
    }

    #[test]
    fn narrow_rows_get_narrow_blocks_with_several_rows_each() {
        let c = RectCopy { src_offset: 0, src_pitch: 64, dst_offset: 0, dst_pitch: 32, row_bytes: 32, rows: 100 };
        let l = covers_each_vector_once(&c, 0, 0);
        assert_eq!((l.width, l.block), (16, [32, 8, 1]));
        assert_eq!(l.grid, [1, 13, 1]);
    }

    /// Applies launches with a device's semantics: every source read before any target written.
    fn apply(buffer: &mut [u8], launches: &[RectCopy]) {
        for l in launches {
            let reads: Vec<Vec<u8>> =
                (0..l.rows).map(|r| buffer[l.src_row(r).start as usize..l.src_row(r).end as usize].to_vec()).collect();
            for r in 0..l.rows {
                for s in 0..l.rows {
                    let (d, src) = (l.dst_row(r), l.src_row(s));
                    assert!(d.end <= src.start || src.end <= d.start, "launch {l:?} reads what it writes");
                }
                buffer[l.dst_row(r).start as usize..l.dst_row(r).end as usize].copy_from_slice(&reads[r as usize]);
            }
        }
    }

    /// The out-of-place result the in-place schedule must reproduce.
    fn out_of_place(buffer: &[u8], copies: &[RectCopy]) -> Vec<u8> {
        let mut out = buffer.to_vec();
        for c in copies {
            for r in 0..c.rows {
                out[c.dst_row(r).start as usize..c.dst_row(r).end as usize]
                    .copy_from_slice(&buffer[c.src_row(r).start as usize..c.src_row(r).end as usize]);
            }
        }
        out
    }

    #[test]
    fn in_place_schedule_compacts_column_blocks_and_shifted_runs_like_a_copy() {
        // A row-parallel half (rows of 8 of 16 bytes), then a contiguous run shifted down by 5.
        let copies = [
            RectCopy { src_offset: 8, src_pitch: 16, dst_offset: 0, dst_pitch: 8, row_bytes: 8, rows: 12 },
            RectCopy { src_offset: 200, src_pitch: 64, dst_offset: 195, dst_pitch: 64, row_bytes: 64, rows: 1 },
            RectCopy { src_offset: 300, src_pitch: 4, dst_offset: 300, dst_pitch: 4, row_bytes: 4, rows: 3 },
        ];
        let original: Vec<u8> = (0..400).map(|i| (i * 7 % 251) as u8).collect();
        let schedule = in_place_schedule(&copies).expect("rows move down in order");
        let mut buffer = original.clone();
        apply(&mut buffer, &schedule);
        let expected = out_of_place(&original, &copies);
        for c in &copies {
            for r in 0..c.rows {
                let d = c.dst_row(r);
                assert_eq!(buffer[d.start as usize..d.end as usize], expected[d.start as usize..d.end as usize]);
            }
        }
        assert!(schedule.len() < 12 + 13 + 1, "rows batch into growing waves: {}", schedule.len());
    }

    #[test]
    fn in_place_schedule_refuses_upward_moves_and_reordering() {
        let up = RectCopy { src_offset: 0, src_pitch: 8, dst_offset: 4, dst_pitch: 8, row_bytes: 4, rows: 2 };
        assert!(in_place_schedule(&[up]).is_none());
        let a = RectCopy { src_offset: 100, src_pitch: 4, dst_offset: 50, dst_pitch: 4, row_bytes: 4, rows: 1 };
        let b = RectCopy { src_offset: 200, src_pitch: 4, dst_offset: 10, dst_pitch: 4, row_bytes: 4, rows: 1 };
        assert!(in_place_schedule(&[a, b]).is_none(), "targets out of the sources' order");
        let tiny_shift = RectCopy {
            src_offset: 1,
            src_pitch: 1 << 20,
            dst_offset: 0,
            dst_pitch: 1 << 20,
            row_bytes: 1 << 20,
            rows: 1,
        };
        assert!(in_place_schedule(&[tiny_shift]).is_none(), "a million one-byte launches is no slice");
    }
}
