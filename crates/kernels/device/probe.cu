// probe.cu: kernels that probe the execution model itself (barriers, shuffles, shared
// memory, warp width), so that the grid emulator is checked against what a device guarantees
// (crates/kernels/src/grid.rs tests) and a device against the emulator (selftest kernels).
//
// Legend: N threads in one block (blockDim.x), out[N] floats.

// out[t] = t-th thread's view of the block reversed through shared memory: correct only if
// __syncthreads really waits for every writer.
NEREUS_KERNEL nereus_probe_block_reverse(float* __restrict__ out) {
  __shared__ float staged[1024];
  const unsigned t = threadIdx.x, n = blockDim.x;
  staged[t] = (float)t;
  __syncthreads();
  out[t] = staged[n - 1 - t];
}

// out[t] = the sum of (lane + 1) over the thread's warp, and out[N + t] = the block's sum of t:
// the warp sum depends on NEREUS_WARP, the block sum does not.
NEREUS_KERNEL nereus_probe_reductions(float* __restrict__ out) {
  __shared__ float scratch[1024 / NEREUS_WARP];
  const unsigned t = threadIdx.x;
  out[t] = nereus_warp_sum((float)(t % NEREUS_WARP + 1));
  out[blockDim.x + t] = nereus_block_reduce((float)t, scratch, false);
}

#if !defined(__CUDACC__) && !defined(__HIPCC__)
// Emulator only: odd threads skip the barrier, which hangs a device. The emulator must refuse it.
NEREUS_KERNEL nereus_probe_divergent_barrier(float* __restrict__ out) {
  if (threadIdx.x % 2 == 0) __syncthreads();
  out[threadIdx.x] = 1.0f;
}
#define NEREUS_PROBE_EMULATOR_ONLY(X) X(nereus_probe_divergent_barrier)
#else
#define NEREUS_PROBE_EMULATOR_ONLY(X)
#endif

// Every entry point, for the grid emulator's table (crates/kernels/emulator/kernels.cpp).
#define NEREUS_PROBE_KERNELS(X) X(nereus_probe_block_reverse) X(nereus_probe_reductions) NEREUS_PROBE_EMULATOR_ONLY(X)
