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

// Fused multi-tensor AdamW: one launch updates `count` tensors from the table (in device memory),
// every thread striding over each tensor in turn, and writes each bf16 working copy:
//   g = clip·grad;  m = β1·m + (1−β1)·g;  v = β2·v + (1−β2)·g²;  p −= lr·(m/c1 / (sqrt(v/c2) + eps) + wd·p)
// with c1 = 1 − β1^t and c2 = 1 − β2^t (decoupled weight decay, Loshchilov & Hutter 2019) and
// `clip` the global-norm clipping factor (1 when the norm is within bounds).
NEREUS_KERNEL nereus_adamw(const NereusAdamTensor* __restrict__ tensors, int count, float lr, float beta1, float beta2,
                           float eps, float c1, float c2, float clip) {
  for (int t = 0; t < count; ++t) {
    const NereusAdamTensor x = tensors[t];
    NEREUS_GRID_STRIDE(i, x.n) {
      const float g = x.grad[i] * clip;
      const float mi = beta1 * x.m[i] + (1.0f - beta1) * g;
      const float vi = beta2 * x.v[i] + (1.0f - beta2) * g * g;
      const float p = x.param[i] - lr * (mi / c1 / (nereus_sqrt(vi / c2) + eps) + x.weight_decay * x.param[i]);
      x.m[i] = mi;
      x.v[i] = vi;
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
