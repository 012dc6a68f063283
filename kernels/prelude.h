// kernels/prelude.h: the portability prelude every kernel source in kernels/ is compiled with.
//
// One kernel source, three compilers (docs/kernels.md):
//   NVRTC (CUDA, sm_80/sm_90)   __CUDACC_RTC__   warp 32  src/backend/cuda.rs prepends this file
//   hipcc (ROCm, gfx90a)        __HIPCC__        warp 64  build.rs: -include kernels/prelude.h
//   host C++ (grid emulator)    neither          warp NEREUS_WARP_SIZE (32 and 64 are both built)
//
// Kernels use only what this file names: NEREUS_KERNEL for entry points, NEREUS_WARP for the
// warp width, nereus_shfl_xor for shuffles, __shared__ arrays of fixed size or
// NEREUS_DYNAMIC_SHARED for the launch's dynamic shared memory, __syncthreads, atomicAdd on
// floats, and the bf16 helpers below (bf16 is carried as its 16 bits, never as a vendor type, so
// that every compiler rounds alike). No standard headers: NVRTC has none.
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
#include "emulator/grid.h"
#endif

// What CUDA and HIP spell alike (the emulator defines its own in grid.h).
#if defined(__HIPCC__) || defined(__CUDACC__)
#define NEREUS_KERNEL extern "C" __global__ void
#define NEREUS_DYNAMIC_SHARED(type, name) \
  extern __shared__ __align__(16) unsigned char nereus_dynamic_shared[]; \
  type* name = reinterpret_cast<type*>(nereus_dynamic_shared)
__device__ __forceinline__ float nereus_bits_to_f32(unsigned int u) { return __uint_as_float(u); }
__device__ __forceinline__ unsigned int nereus_f32_to_bits(float f) { return __float_as_uint(f); }
#endif

typedef unsigned long long u64;
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
