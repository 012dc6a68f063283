// pack.cu: the rectangle copies of the GPU data plane.
//
// One concern: copy R rows of C vectors of W bytes between two pitched places. The data plane
// uses it to pack a shard rectangle into a contiguous transfer buffer (target pitch = C),
// unpack one (source pitch = C), and slice locally (both pitched): Merge's in-place slice runs
// it in waves whose targets never overlap their sources (crates/kernels/src/pack.rs,
// in_place_schedule), which is what makes `__restrict__` true.
//
// Legend: R rows, C row_vectors, W vector bytes (16, 8, 4, 2, 1: the widest every address and
// pitch is a multiple of), pitches in vectors. Launch geometry: crates/kernels/src/pack.rs
// (rect_launch): block (x along a row, y across rows) of 256 threads, 2-D grid-stride loops.
// Compiled with prelude.h by NVRTC, hipcc and the grid emulator (docs/kernels.md).

struct alignas(16) vec16 { u64 lo, hi; };
struct alignas(8) vec8 { u64 v; };
struct alignas(4) vec4 { unsigned int v; };
struct alignas(2) vec2 { unsigned short v; };
struct vec1 { unsigned char v; };

template <typename V>
__device__ __forceinline__ void rect_copy(V* __restrict__ dst, u64 dst_pitch, const V* __restrict__ src,
                                          u64 src_pitch, u64 row_vectors, u64 rows) {
  const u64 row_step = (u64)gridDim.y * blockDim.y;
  const u64 col_step = (u64)gridDim.x * blockDim.x;
  for (u64 row = (u64)blockIdx.y * blockDim.y + threadIdx.y; row < rows; row += row_step) {
    const V* __restrict__ s = src + row * src_pitch;  // [C] source row
    V* __restrict__ d = dst + row * dst_pitch;        // [C] target row
    for (u64 col = (u64)blockIdx.x * blockDim.x + threadIdx.x; col < row_vectors; col += col_step) {
      d[col] = s[col];
    }
  }
}

#define NEREUS_RECT_COPY(W)                                                                          \
  NEREUS_KERNEL nereus_rect_copy_##W(vec##W* dst, u64 dst_pitch, const vec##W* src, u64 src_pitch,   \
                                     u64 row_vectors, u64 rows) {                                     \
    rect_copy<vec##W>(dst, dst_pitch, src, src_pitch, row_vectors, rows);                            \
  }

NEREUS_RECT_COPY(16)
NEREUS_RECT_COPY(8)
NEREUS_RECT_COPY(4)
NEREUS_RECT_COPY(2)
NEREUS_RECT_COPY(1)

// Every entry point, for the grid emulator's table (crates/kernels/emulator/kernels.cpp).
#define NEREUS_PACK_KERNELS(X) \
  X(nereus_rect_copy_16) X(nereus_rect_copy_8) X(nereus_rect_copy_4) X(nereus_rect_copy_2) X(nereus_rect_copy_1)
