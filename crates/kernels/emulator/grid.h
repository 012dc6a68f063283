// kernels/emulator/grid.h: the CUDA subset the kernels use, on the host, for the grid emulator.
//
// Each block's threads are fibers (ucontext) run by one host thread; __syncthreads and the warp
// shuffles are real barriers between them (kernels/emulator/grid.cpp), so a kernel that reads
// shared memory before its writers reached a barrier, or that diverges around one, fails here as
// it would race or hang on a device. Shared memory is per block; atomics are plain updates
// (fibers never preempt one another). The warp width is NEREUS_WARP_SIZE, fixed per build:
// build.rs compiles the kernels once for 32 and once for 64.
#pragma once

#include <math.h>
#include <string.h>

#ifndef NEREUS_WARP_SIZE
#error "the grid emulator is built with -DNEREUS_WARP_SIZE=32 or 64"
#endif
#define NEREUS_WARP NEREUS_WARP_SIZE

namespace nereus_grid {

struct Dim3 {
  unsigned int x, y, z;
};

// The calling fiber's coordinates and its block's shape and launch.
const Dim3& thread_idx();
const Dim3& block_idx();
const Dim3& block_dim();
const Dim3& grid_dim();
// Waits until every live thread of the block arrives (a block barrier).
void sync_block();
// Exchanges one 32-bit value across the calling thread's warp: every live lane must call it.
unsigned int shuffle_xor(unsigned int value, int lane_mask);
// A warp barrier that hands each lane's `bytes` (at most 64) to every lane: `all` receives the
// warp's lanes in order, `bytes` apart. Every lane of a full warp must call it.
void warp_exchange(const void* mine, unsigned bytes, void* all);
// The launch's dynamic shared memory, 16-byte aligned.
unsigned char* dynamic_shared();

}  // namespace nereus_grid

#define __global__
#define __device__
#define __forceinline__ inline
#define __align__(n) __attribute__((aligned(n)))
#define __restrict__ __restrict
// Function-scope shared arrays: one per host thread, so blocks (run one after another) reuse
// them and concurrent launches on different host threads do not share them.
#define __shared__ static thread_local
#define threadIdx (::nereus_grid::thread_idx())
#define blockIdx (::nereus_grid::block_idx())
#define blockDim (::nereus_grid::block_dim())
#define gridDim (::nereus_grid::grid_dim())
#define __syncthreads() ::nereus_grid::sync_block()
#define NEREUS_KERNEL void
#define NEREUS_LAUNCH_BOUNDS(threads)
#define NEREUS_UNROLL
#define NEREUS_NO_UNROLL
#define NEREUS_DYNAMIC_SHARED(type, name) type* name = reinterpret_cast<type*>(::nereus_grid::dynamic_shared())

inline float nereus_bits_to_f32(unsigned int u) {
  float f;
  memcpy(&f, &u, sizeof f);
  return f;
}
inline unsigned int nereus_f32_to_bits(float f) {
  unsigned int u;
  memcpy(&u, &f, sizeof u);
  return u;
}
inline float nereus_shfl_xor(float v, int lane_mask) {
  return nereus_bits_to_f32(::nereus_grid::shuffle_xor(nereus_f32_to_bits(v), lane_mask));
}
inline float rsqrtf(float x) { return 1.0f / sqrtf(x); }
inline float atomicAdd(float* address, float value) {
  const float old = *address;
  *address = old + value;
  return old;
}
inline unsigned int atomicAdd(unsigned int* address, unsigned int value) {
  const unsigned int old = *address;
  *address = old + value;
  return old;
}
inline unsigned long long atomicAdd(unsigned long long* address, unsigned long long value) {
  const unsigned long long old = *address;
  *address = old + value;
  return old;
}
