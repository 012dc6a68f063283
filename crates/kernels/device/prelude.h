// prelude.h: the portability prelude every kernel source in crates/kernels/device/ is compiled with.
//
// One kernel source, three compilers (docs/kernels.md):
//   NVRTC (CUDA, sm_80/sm_90)   __CUDACC_RTC__   warp 32  exec's backend/cuda.rs prepends this file
//   hipcc (ROCm, gfx90a)        __HIPCC__        warp 64  build.rs: -include device/prelude.h
//   host C++ (grid emulator)    neither          warp NEREUS_WARP_SIZE (32 and 64 are both built)
//
// Kernels use only what this file names: NEREUS_KERNEL for entry points, NEREUS_WARP for the
// warp width, nereus_shfl_xor for shuffles, __shared__ arrays of fixed size or
// NEREUS_DYNAMIC_SHARED for the launch's dynamic shared memory, __syncthreads, atomicAdd on
// floats, unsigned ints and u64, and the bf16 helpers below (bf16 is carried as its 16 bits,
// never as a vendor type, so that every compiler rounds alike). No standard headers: NVRTC has
// none.
#pragma once

#if defined(__HIPCC__)
#include <hip/hip_runtime.h>
#if defined(__AMDGCN_WAVEFRONT_SIZE)
#define NEREUS_WARP __AMDGCN_WAVEFRONT_SIZE
#else
#define NEREUS_WARP 64  // host pass of hipcc: the value is only used in device code
#endif
__device__ __forceinline__ float nereus_shfl_xor(float v, int lane_mask) { return __shfl_xor(v, lane_mask); }
#elif defined(__CUDACC__)
#define NEREUS_WARP 32
__device__ __forceinline__ float nereus_shfl_xor(float v, int lane_mask) {
  return __shfl_xor_sync(0xffffffffu, v, lane_mask);
}
#else
#include "../emulator/grid.h"
#endif

// What CUDA and HIP spell alike (the emulator defines its own in grid.h).
#if defined(__HIPCC__) || defined(__CUDACC__)
#define NEREUS_KERNEL extern "C" __global__ void
#define NEREUS_DYNAMIC_SHARED(type, name) \
  extern __shared__ __align__(16) unsigned char nereus_dynamic_shared[]; \
  type* name = reinterpret_cast<type*>(nereus_dynamic_shared)
// Unrolls the loop that follows (loops over fragments: their registers must not become an array
// in local memory).
#define NEREUS_UNROLL _Pragma("unroll")
#define NEREUS_NO_UNROLL _Pragma("unroll 1")
// The most threads a kernel is launched with, so the compiler may give each more registers.
#if defined(__CUDACC__)
#define NEREUS_LAUNCH_BOUNDS(threads) __launch_bounds__(threads, 1)
#else
#define NEREUS_LAUNCH_BOUNDS(threads) __launch_bounds__(threads)
#endif
__device__ __forceinline__ float nereus_bits_to_f32(unsigned int u) { return __uint_as_float(u); }
__device__ __forceinline__ unsigned int nereus_f32_to_bits(float f) { return __float_as_uint(f); }
#endif

typedef unsigned long long u64;

// The two loop shapes of the element-wise and row kernels: a 1-D grid-stride loop over N
// elements, and one block per row (grid-stride over rows).
#define NEREUS_GRID_STRIDE(i, n) \
  for (u64 i = (u64)blockIdx.x * blockDim.x + threadIdx.x; i < (n); i += (u64)gridDim.x * blockDim.x)
#define NEREUS_ROWS(row, rows) for (u64 row = blockIdx.x; row < (rows); row += gridDim.x)

typedef unsigned short bf16;  // bfloat16 as its bits: the upper half of an f32

// Device math under one name on every compiler.
__device__ __forceinline__ float nereus_exp(float x) { return expf(x); }
__device__ __forceinline__ float nereus_log(float x) { return logf(x); }
__device__ __forceinline__ float nereus_rsqrt(float x) { return rsqrtf(x); }
__device__ __forceinline__ float nereus_sqrt(float x) { return sqrtf(x); }

// bf16 -> f32 is exact.
__device__ __forceinline__ float nereus_bf16_to_f32(bf16 h) { return nereus_bits_to_f32((unsigned int)h << 16); }

// f32 -> bf16, rounding to nearest even; NaN stays a (quiet) NaN. Written out, as in
// crates/core/src/half.rs, so devices, emulator and host files round alike.
__device__ __forceinline__ bf16 nereus_f32_to_bf16(float f) {
  unsigned int u = nereus_f32_to_bits(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return (bf16)((u >> 16) | 0x40u);
  u += 0x7fffu + ((u >> 16) & 1u);
  return (bf16)(u >> 16);
}

// f32 rounded through bf16 (what a bf16 store then load yields).
__device__ __forceinline__ float nereus_round_bf16(float f) { return nereus_bf16_to_f32(nereus_f32_to_bf16(f)); }

// Butterfly sum over a warp: a pairwise tree, so long rows do not accumulate one f32 chain.
__device__ __forceinline__ float nereus_warp_sum(float v) {
  for (int offset = NEREUS_WARP / 2; offset > 0; offset /= 2) v += nereus_shfl_xor(v, offset);
  return v;
}

__device__ __forceinline__ float nereus_warp_max(float v) {
  for (int offset = NEREUS_WARP / 2; offset > 0; offset /= 2) v = fmaxf(v, nereus_shfl_xor(v, offset));
  return v;
}

// Sum (or max) over a block of blockDim.x threads (a multiple of NEREUS_WARP, at most 1024);
// every thread gets the result. `scratch` is shared memory of at least 1024 / NEREUS_WARP floats,
// not touched by the caller between the two __syncthreads.
__device__ __forceinline__ float nereus_block_reduce(float v, float* scratch, bool is_max) {
  const int lane = threadIdx.x % NEREUS_WARP, warp = threadIdx.x / NEREUS_WARP;
  const int warps = blockDim.x / NEREUS_WARP;
  v = is_max ? nereus_warp_max(v) : nereus_warp_sum(v);
  __syncthreads();  // the scratch may still be read by a previous reduction
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  float r = lane < warps ? scratch[lane] : (is_max ? nereus_bits_to_f32(0xff800000u) : 0.0f);
  return is_max ? nereus_warp_max(r) : nereus_warp_sum(r);
}

// Warp synchronization: the lanes' shared-memory writes before it are visible to the warp after.
#if defined(__CUDACC__)
__device__ __forceinline__ void nereus_syncwarp() { __syncwarp(); }
#elif defined(__HIPCC__)
// A wavefront runs in lockstep; the barrier keeps the compiler from moving memory accesses across.
__device__ __forceinline__ void nereus_syncwarp() { __builtin_amdgcn_wave_barrier(); }
#else
inline void nereus_syncwarp() {
  char none = 0;
  ::nereus_grid::warp_exchange(&none, 0, &none);
}
#endif

// 16 bytes moved as one vector (global and shared loads and stores of 8 bf16).
struct __align__(16) NereusVec16 {
  unsigned int w[4];
};

// 8 bytes moved as one vector (4 bf16).
struct __align__(8) NereusVec8 {
  unsigned int w[2];
};

// Whether p is 16-byte aligned (a vector load or store may start there).
__device__ __forceinline__ bool nereus_aligned16(const void* p) { return ((u64)p & 15) == 0; }

// Eight bf16 at p (16-byte aligned) as one load, widened to f32: element j is the low half of
// word j / 2 for even j (little-endian), the high half for odd j.
__device__ __forceinline__ void nereus_load8(float v[8], const bf16* p) {
  const NereusVec16 x = *reinterpret_cast<const NereusVec16*>(p);
  NEREUS_UNROLL
  for (int i = 0; i < 4; ++i) {
    v[2 * i] = nereus_bits_to_f32(x.w[i] << 16);
    v[2 * i + 1] = nereus_bits_to_f32(x.w[i] & 0xffff0000u);
  }
}

// Two f32 rounded to bf16 in one word, as a vector store lays them out: `lo` in the low half.
__device__ __forceinline__ unsigned int nereus_bf16_pair(float lo, float hi) {
  return (unsigned int)nereus_f32_to_bf16(lo) | ((unsigned int)nereus_f32_to_bf16(hi) << 16);
}

// Eight f32 rounded to bf16 and stored at p (16-byte aligned) as one store.
__device__ __forceinline__ void nereus_store8(bf16* p, const float v[8]) {
  NereusVec16 x;
  NEREUS_UNROLL
  for (int i = 0; i < 4; ++i) x.w[i] = nereus_bf16_pair(v[2 * i], v[2 * i + 1]);
  *reinterpret_cast<NereusVec16*>(p) = x;
}

// Four f32 at p (16-byte aligned) as one load.
__device__ __forceinline__ void nereus_load4(float v[4], const float* p) {
  const NereusVec16 x = *reinterpret_cast<const NereusVec16*>(p);
  NEREUS_UNROLL
  for (int i = 0; i < 4; ++i) v[i] = nereus_bits_to_f32(x.w[i]);
}

// Four f32 stored at p (16-byte aligned) as one store.
__device__ __forceinline__ void nereus_store4(float* p, const float v[4]) {
  NereusVec16 x;
  NEREUS_UNROLL
  for (int i = 0; i < 4; ++i) x.w[i] = nereus_f32_to_bits(v[i]);
  *reinterpret_cast<NereusVec16*>(p) = x;
}

// Four f32 rounded to bf16 and stored at p (8-byte aligned) as one store.
__device__ __forceinline__ void nereus_store4_bf16(bf16* p, const float v[4]) {
  NereusVec8 x;
  NEREUS_UNROLL
  for (int i = 0; i < 2; ++i) x.w[i] = nereus_bf16_pair(v[2 * i], v[2 * i + 1]);
  *reinterpret_cast<NereusVec8*>(p) = x;
}

// W bf16 at p widened to f32, W = 8 as one vector (p 16-byte aligned) or W = 1: a kernel
// templated on W reads either way with its arrays in registers.
template <int W>
__device__ __forceinline__ void nereus_load_bf16(float (&v)[W], const bf16* p);
template <>
__device__ __forceinline__ void nereus_load_bf16<1>(float (&v)[1], const bf16* p) {
  v[0] = nereus_bf16_to_f32(p[0]);
}
template <>
__device__ __forceinline__ void nereus_load_bf16<8>(float (&v)[8], const bf16* p) {
  nereus_load8(v, p);
}

// W f32 at p, W = 8 as two 16-byte vectors (p 16-byte aligned) or W = 1.
template <int W>
__device__ __forceinline__ void nereus_load_f32(float (&v)[W], const float* p);
template <>
__device__ __forceinline__ void nereus_load_f32<1>(float (&v)[1], const float* p) {
  v[0] = p[0];
}
template <>
__device__ __forceinline__ void nereus_load_f32<8>(float (&v)[8], const float* p) {
  nereus_load4(v, p);
  nereus_load4(v + 4, p + 4);
}

// W bf16 copied bit for bit from `from` to `to`, W = 8 as one 16-byte vector (both aligned).
template <int W>
__device__ __forceinline__ void nereus_copy_bf16(bf16* to, const bf16* from);
template <>
__device__ __forceinline__ void nereus_copy_bf16<1>(bf16* to, const bf16* from) {
  to[0] = from[0];
}
template <>
__device__ __forceinline__ void nereus_copy_bf16<8>(bf16* to, const bf16* from) {
  *reinterpret_cast<NereusVec16*>(to) = *reinterpret_cast<const NereusVec16*>(from);
}

// W f32 rounded to bf16 at p, as nereus_load_bf16 reads them.
template <int W>
__device__ __forceinline__ void nereus_store_bf16(bf16* p, const float (&v)[W]);
template <>
__device__ __forceinline__ void nereus_store_bf16<1>(bf16* p, const float (&v)[1]) {
  p[0] = nereus_f32_to_bf16(v[0]);
}
template <>
__device__ __forceinline__ void nereus_store_bf16<8>(bf16* p, const float (&v)[8]) {
  nereus_store8(p, v);
}

// ---------------------------------------------------------------------------------------------
// The warp-level matrix multiply-accumulate (docs/kernels.md, "Tensor cores"): one warp computes
//   C[16×16] (f32) += A[16×16] (bf16) · B[16×16] (bf16)
// with each lane holding NEREUS_MMA_REGS elements of each operand. Which elements a lane holds is
// the instruction's fragment layout, given below as (row, column) functions of (lane, element e):
// kernels load and store fragments only through them, so one kernel source serves every layout.
//
// Warp 32 (CUDA, sm_80+; the emulator at warp 32): two `mma.sync.m16n8k16.row.col` per call, one
// per 8-column half of C (PTX ISA, "Matrix Fragments for mma.m16n8k16"). With g = lane / 4 and
// t = lane % 4:
//   A: e = 0..7 at row g + 8·((e / 2) % 2), column 2t + e % 2 + 8·(e / 4)   (a0..a7, two per register)
//   B: e = 0..7 at row (k) 2t + e % 2 + 8·((e / 2) % 2), column (n) g + 8·(e / 4)
//   C: e = 0..7 at row g + 8·((e / 2) % 2), column 2t + e % 2 + 8·(e / 4)
//   so a lane holds 2 rows of C, each shared with the 3 other lanes of its quad.
// Warp 64 (ROCm gfx90a, `v_mfma_f32_16x16x16bf16_1k`; the emulator at warp 64), from AMD's matrix
// instruction calculator, with c = lane % 16 and q = lane / 16:
//   A: e = 0..3 at row c, column (k) 4q + e
//   B: e = 0..3 at row (k) 4q + e, column c
//   C: e = 0..3 at row 4q + e, column c
//   so a lane holds 4 rows of C, each shared with the 15 other lanes of its sixteen.
// The grid emulator executes the same ownership exactly: every lane hands its fragments to the
// warp (a warp barrier), and each computes its own elements of C from the gathered operands, in
// f32, k in order.
// ---------------------------------------------------------------------------------------------
#define NEREUS_MMA_REGS (256 / NEREUS_WARP)
// Aligned so that the CUDA path may read two bf16 as one 32-bit register wherever they live.
struct __align__(16) NereusMmaA {
  bf16 x[NEREUS_MMA_REGS];
};
struct __align__(16) NereusMmaB {
  bf16 x[NEREUS_MMA_REGS];
};
struct __align__(16) NereusMmaC {
  float x[NEREUS_MMA_REGS];
};

#if NEREUS_WARP == 32
#define NEREUS_MMA_ROWS 2  // rows of C a lane holds
__device__ __forceinline__ int nereus_mma_a_row(int lane, int e) { return lane / 4 + 8 * ((e / 2) % 2); }
__device__ __forceinline__ int nereus_mma_a_col(int lane, int e) { return 2 * (lane % 4) + e % 2 + 8 * (e / 4); }
__device__ __forceinline__ int nereus_mma_b_row(int lane, int e) { return 2 * (lane % 4) + e % 2 + 8 * ((e / 2) % 2); }
__device__ __forceinline__ int nereus_mma_b_col(int lane, int e) { return lane / 4 + 8 * (e / 4); }
__device__ __forceinline__ int nereus_mma_c_row(int lane, int e) { return nereus_mma_a_row(lane, e); }
__device__ __forceinline__ int nereus_mma_c_col(int lane, int e) { return nereus_mma_a_col(lane, e); }
// Which of the lane's NEREUS_MMA_ROWS rows C element e lies in.
__device__ __forceinline__ int nereus_mma_c_slot(int e) { return (e / 2) % 2; }
// Max and sum over the lanes that hold one row of C.
__device__ __forceinline__ float nereus_mma_row_max(float v) {
  v = fmaxf(v, nereus_shfl_xor(v, 1));
  return fmaxf(v, nereus_shfl_xor(v, 2));
}
__device__ __forceinline__ float nereus_mma_row_sum(float v) {
  v += nereus_shfl_xor(v, 1);
  return v + nereus_shfl_xor(v, 2);
}
#else
#define NEREUS_MMA_ROWS 4
__device__ __forceinline__ int nereus_mma_a_row(int lane, int) { return lane % 16; }
__device__ __forceinline__ int nereus_mma_a_col(int lane, int e) { return 4 * (lane / 16) + e; }
__device__ __forceinline__ int nereus_mma_b_row(int lane, int e) { return 4 * (lane / 16) + e; }
__device__ __forceinline__ int nereus_mma_b_col(int lane, int) { return lane % 16; }
__device__ __forceinline__ int nereus_mma_c_row(int lane, int e) { return 4 * (lane / 16) + e; }
__device__ __forceinline__ int nereus_mma_c_col(int lane, int) { return lane % 16; }
__device__ __forceinline__ int nereus_mma_c_slot(int e) { return e; }
__device__ __forceinline__ float nereus_mma_row_max(float v) {
  for (int m = 1; m < 16; m *= 2) v = fmaxf(v, nereus_shfl_xor(v, m));
  return v;
}
__device__ __forceinline__ float nereus_mma_row_sum(float v) {
  for (int m = 1; m < 16; m *= 2) v += nereus_shfl_xor(v, m);
  return v;
}
#endif

// C += A · B on the warp (every lane of a full warp calls it, with its own fragments).
__device__ __forceinline__ void nereus_mma(NereusMmaC& c, const NereusMmaA& a, const NereusMmaB& b) {
#if defined(__CUDACC__)
  const unsigned int* ar = reinterpret_cast<const unsigned int*>(a.x);
  const unsigned int* br = reinterpret_cast<const unsigned int*>(b.x);
  NEREUS_UNROLL
  for (int half = 0; half < 2; ++half)
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%0,%1,%2,%3};\n"
        : "+f"(c.x[4 * half]), "+f"(c.x[4 * half + 1]), "+f"(c.x[4 * half + 2]), "+f"(c.x[4 * half + 3])
        : "r"(ar[0]), "r"(ar[1]), "r"(ar[2]), "r"(ar[3]), "r"(br[2 * half]), "r"(br[2 * half + 1]));
#elif defined(__HIPCC__)
  typedef short short4_t __attribute__((ext_vector_type(4)));
  typedef float float4_t __attribute__((ext_vector_type(4)));
  const short4_t av = {(short)a.x[0], (short)a.x[1], (short)a.x[2], (short)a.x[3]};
  const short4_t bv = {(short)b.x[0], (short)b.x[1], (short)b.x[2], (short)b.x[3]};
  float4_t cv = {c.x[0], c.x[1], c.x[2], c.x[3]};
  cv = __builtin_amdgcn_mfma_f32_16x16x16bf16_1k(av, bv, cv, 0, 0, 0);
  for (int e = 0; e < 4; ++e) c.x[e] = cv[e];
#else
  struct Operands {
    NereusMmaA a;
    NereusMmaB b;
  };
  const Operands mine = {a, b};
  Operands all[NEREUS_WARP];
  ::nereus_grid::warp_exchange(&mine, sizeof mine, all);
  float am[16][16], bm[16][16];
  for (int l = 0; l < NEREUS_WARP; ++l)
    for (int e = 0; e < NEREUS_MMA_REGS; ++e) {
      am[nereus_mma_a_row(l, e)][nereus_mma_a_col(l, e)] = nereus_bf16_to_f32(all[l].a.x[e]);
      bm[nereus_mma_b_row(l, e)][nereus_mma_b_col(l, e)] = nereus_bf16_to_f32(all[l].b.x[e]);
    }
  const int lane = threadIdx.x % NEREUS_WARP;
  for (int e = 0; e < NEREUS_MMA_REGS; ++e) {
    const int row = nereus_mma_c_row(lane, e), col = nereus_mma_c_col(lane, e);
    float sum = c.x[e];
    for (int k = 0; k < 16; ++k) sum += am[row][k] * bm[k][col];
    c.x[e] = sum;
  }
#endif
}

// Loads the lane's fragment of A[16×16] whose element (m, k) is at s[m·row_stride + k·col_stride]
// (shared memory; a transposed operand is the same call with the strides swapped).
__device__ __forceinline__ void nereus_mma_load_a(NereusMmaA& a, const bf16* s, int row_stride, int col_stride) {
  const int lane = threadIdx.x % NEREUS_WARP;
  NEREUS_UNROLL
  for (int e = 0; e < NEREUS_MMA_REGS; ++e)
    a.x[e] = s[nereus_mma_a_row(lane, e) * row_stride + nereus_mma_a_col(lane, e) * col_stride];
}

// Loads the lane's fragment of B[16×16] whose element (k, n) is at s[k·row_stride + n·col_stride].
__device__ __forceinline__ void nereus_mma_load_b(NereusMmaB& b, const bf16* s, int row_stride, int col_stride) {
  const int lane = threadIdx.x % NEREUS_WARP;
  NEREUS_UNROLL
  for (int e = 0; e < NEREUS_MMA_REGS; ++e)
    b.x[e] = s[nereus_mma_b_row(lane, e) * row_stride + nereus_mma_b_col(lane, e) * col_stride];
}

__device__ __forceinline__ void nereus_mma_zero(NereusMmaC& c) {
  NEREUS_UNROLL
  for (int e = 0; e < NEREUS_MMA_REGS; ++e) c.x[e] = 0.0f;
}
