// adamw.cu: the optimizer: the fused multi-tensor AdamW and the gradient norm's sum of squares.
// The f64 references they are checked against, and their launches, are in
// crates/bench/src/selftest/kernels/ (`nereus selftest kernels`, docs/kernels.md).
//
// Legend: N elements. 1-D grid-stride loops.

// One tensor of the fused AdamW: f32 master weights, moments and gradient, the bf16 working copy
// it rewrites, and its own weight decay (0 for norms). Mirrors `AdamTensor` in
// crates/kernels/src/args.rs (56 bytes).
struct NereusAdamTensor {
  float* param;
  float* m;
  float* v;
  bf16* working;
  const float* grad;
  u64 n;
  float weight_decay;
  unsigned int pad;
};

// One AdamW step's scalars (the kernel's arguments).
struct NereusAdamStep {
  float lr, beta1, beta2, eps, c1, c2, clip;
};

// One element's update (see nereus_adamw).
__device__ __forceinline__ void nereus_adamw_element(float& p, float& m, float& v, float grad, float weight_decay,
                                                     const NereusAdamStep& s) {
  const float g = grad * s.clip;
  m = s.beta1 * m + (1.0f - s.beta1) * g;
  v = s.beta2 * v + (1.0f - s.beta2) * g * g;
  p = p - s.lr * (m / s.c1 / (nereus_sqrt(v / s.c2) + s.eps) + weight_decay * p);
}

// Whether the five arrays of x hold a run of four at element i as one vector each.
__device__ __forceinline__ bool nereus_adamw_vectors_at(const NereusAdamTensor& x, u64 i) {
  return nereus_aligned16(x.param + i) && nereus_aligned16(x.m + i) && nereus_aligned16(x.v + i) &&
         nereus_aligned16(x.grad + i) && ((u64)(x.working + i) & 7) == 0;
}

// Fused multi-tensor AdamW: one launch updates `count` tensors from the table (in device memory),
// every thread striding over each tensor in turn, and writes each bf16 working copy:
//   g = clip·grad;  m = β1·m + (1−β1)·g;  v = β2·v + (1−β2)·g²;  p −= lr·(m/c1 / (sqrt(v/c2) + eps) + wd·p)
// with c1 = 1 − β1^t and c2 = 1 − β2^t (decoupled weight decay, Loshchilov & Hutter 2019) and
// `clip` the global-norm clipping factor (1 when the norm is within bounds). The elements before
// the master weights' first 16-byte boundary go one by one; from there, where every array is
// aligned alike (a tensor of the flat buffers starts at the same element offset in each), runs of
// four move as one 16-byte vector per f32 array and one 8-byte store of the working copy; the
// tail, and a tensor whose arrays are not aligned alike, go one by one.
NEREUS_KERNEL nereus_adamw(const NereusAdamTensor* __restrict__ tensors, int count, float lr, float beta1, float beta2,
                           float eps, float c1, float c2, float clip) {
  const NereusAdamStep s = {lr, beta1, beta2, eps, c1, c2, clip};
  for (int t = 0; t < count; ++t) {
    const NereusAdamTensor x = tensors[t];
    u64 head = ((16 - ((u64)x.param & 15)) & 15) / 4;
    if (head > x.n) head = x.n;
    const u64 runs = nereus_adamw_vectors_at(x, head) ? (x.n - head) / 4 : 0;
    NEREUS_GRID_STRIDE(r, runs) {
      const u64 i = head + 4 * r;
      float p[4], m[4], v[4], g[4];
      nereus_load4(p, x.param + i);
      nereus_load4(m, x.m + i);
      nereus_load4(v, x.v + i);
      nereus_load4(g, x.grad + i);
      NEREUS_UNROLL
      for (int e = 0; e < 4; ++e) nereus_adamw_element(p[e], m[e], v[e], g[e], x.weight_decay, s);
      nereus_store4(x.m + i, m);
      nereus_store4(x.v + i, v);
      nereus_store4(x.param + i, p);
      nereus_store4_bf16(x.working + i, p);
    }
    // The head [0, head) and the tail [head + 4·runs, n), one element each.
    const u64 tail = head + 4 * runs;
    NEREUS_GRID_STRIDE(j, head + (x.n - tail)) {
      const u64 i = j < head ? j : tail + (j - head);
      float p = x.param[i], m = x.m[i], v = x.v[i];
      nereus_adamw_element(p, m, v, x.grad[i], x.weight_decay, s);
      x.m[i] = m;
      x.v[i] = v;
      x.param[i] = p;
      x.working[i] = nereus_f32_to_bf16(p);
    }
  }
}

// One pass of the gradient norm: partial[blockIdx.x] = Σ x² (`square` = 1) or Σ x (0) over the
// block's grid-stride share, each thread's share summed in f64 (a 10⁹-element tensor gives each
// thread thousands of terms), the block's in a pairwise f32 tree. The first pass squares; a
// second launch with one block and `square` = 0 adds the partials.
NEREUS_KERNEL nereus_sum_squares(float* __restrict__ partial, const float* __restrict__ x, u64 n, int square) {
  __shared__ float scratch[1024 / NEREUS_WARP];
  double own = 0.0;
  NEREUS_GRID_STRIDE(i, n) own += square ? (double)x[i] * (double)x[i] : (double)x[i];
  const float block = nereus_block_reduce((float)own, scratch, false);
  if (threadIdx.x == 0) partial[blockIdx.x] = block;
}

// Every entry point, for the grid emulator's table (crates/kernels/emulator/kernels.cpp).
#define NEREUS_ADAMW_KERNELS(X) X(nereus_adamw) X(nereus_sum_squares)
