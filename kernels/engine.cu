// kernels/engine.cu: the element-wise and row kernels of the device engine, bf16 in memory and
// f32 in registers. Each entry point's contract (shapes, what it reduces) is in its comment; the
// f64 references they are checked against, and their launches, are in
// crates/bench/src/selftest/kernels/ (`nereus selftest kernels`, docs/kernels.md).
//
// Legend: R rows, C columns (the model width, or the local vocab shard), N elements.
// Row kernels: one block per row (grid-stride over rows), blockDim.x a multiple of the warp and at
// most 1024, reductions through nereus_block_reduce (pairwise trees, never one long f32 chain).
// Element-wise kernels: 1-D grid-stride loops.

#define NEREUS_GRID_STRIDE(i, n) \
  for (u64 i = (u64)blockIdx.x * blockDim.x + threadIdx.x; i < (n); i += (u64)gridDim.x * blockDim.x)
#define NEREUS_ROWS(row, rows) for (u64 row = blockIdx.x; row < (rows); row += gridDim.x)

// The largest of a bf16 row of C values, on every thread of the block.
__device__ __forceinline__ float nereus_row_max(const bf16* row, u64 cols, float* scratch) {
  float m = nereus_bits_to_f32(0xff800000u);
  for (u64 c = threadIdx.x; c < cols; c += blockDim.x) m = fmaxf(m, nereus_bf16_to_f32(row[c]));
  return nereus_block_reduce(m, scratch, true);
}

// y[N] = bf16(x[N]), rounding to nearest even.
NEREUS_KERNEL nereus_cast_f32_to_bf16(bf16* __restrict__ y, const float* __restrict__ x, u64 n) {
  NEREUS_GRID_STRIDE(i, n) y[i] = nereus_f32_to_bf16(x[i]);
}

// y[N] = f32(x[N]) (exact).
NEREUS_KERNEL nereus_cast_bf16_to_f32(float* __restrict__ y, const bf16* __restrict__ x, u64 n) {
  NEREUS_GRID_STRIDE(i, n) y[i] = nereus_bf16_to_f32(x[i]);
}

// RMSNorm: y[R,C] = x · rsqrt(mean(x²) + eps) · weight[C]; inv_rms[R] kept for the backward pass.
NEREUS_KERNEL nereus_rmsnorm_forward(bf16* __restrict__ y, float* __restrict__ inv_rms, const bf16* __restrict__ x,
                                     const bf16* __restrict__ weight, u64 rows, u64 cols, float eps) {
  __shared__ float scratch[1024 / NEREUS_WARP];
  NEREUS_ROWS(row, rows) {
    const bf16* xr = x + row * cols;  // [C]
    float squares = 0.0f;
    for (u64 c = threadIdx.x; c < cols; c += blockDim.x) {
      const float v = nereus_bf16_to_f32(xr[c]);
      squares += v * v;
    }
    const float r = nereus_rsqrt(nereus_block_reduce(squares, scratch, false) / (float)cols + eps);
    for (u64 c = threadIdx.x; c < cols; c += blockDim.x)
      y[row * cols + c] = nereus_f32_to_bf16(nereus_bf16_to_f32(xr[c]) * r * nereus_bf16_to_f32(weight[c]));
    if (threadIdx.x == 0) inv_rms[row] = r;
  }
}

// RMSNorm backward: dx[R,C] += (in f32, rounded once: the residual stream's gradient is added to)
// and dweight[C] += Σ_rows dy·x·inv_rms (f32, atomically).
//   g = dy·weight;  dx += inv_rms · (g − x · inv_rms² · mean(g·x))
NEREUS_KERNEL nereus_rmsnorm_backward(bf16* __restrict__ dx, float* __restrict__ dweight, const bf16* __restrict__ dy,
                                      const bf16* __restrict__ x, const bf16* __restrict__ weight,
                                      const float* __restrict__ inv_rms, u64 rows, u64 cols) {
  __shared__ float scratch[1024 / NEREUS_WARP];
  NEREUS_ROWS(row, rows) {
    const bf16* xr = x + row * cols;    // [C]
    const bf16* dyr = dy + row * cols;  // [C]
    const float r = inv_rms[row];
    float dot = 0.0f;
    for (u64 c = threadIdx.x; c < cols; c += blockDim.x)
      dot += nereus_bf16_to_f32(dyr[c]) * nereus_bf16_to_f32(weight[c]) * nereus_bf16_to_f32(xr[c]);
    const float mean_gx = nereus_block_reduce(dot, scratch, false) / (float)cols;
    for (u64 c = threadIdx.x; c < cols; c += blockDim.x) {
      const float xv = nereus_bf16_to_f32(xr[c]), dyv = nereus_bf16_to_f32(dyr[c]);
      const float g = dyv * nereus_bf16_to_f32(weight[c]);
      const u64 i = row * cols + c;
      dx[i] = nereus_f32_to_bf16(nereus_bf16_to_f32(dx[i]) + r * (g - xv * r * r * mean_gx));
      atomicAdd(&dweight[c], dyv * xv * r);
    }
  }
}

// SwiGLU: out[N] = silu(gate) · up.
NEREUS_KERNEL nereus_swiglu_forward(bf16* __restrict__ out, const bf16* __restrict__ gate, const bf16* __restrict__ up,
                                    u64 n) {
  NEREUS_GRID_STRIDE(i, n) {
    const float g = nereus_bf16_to_f32(gate[i]);
    out[i] = nereus_f32_to_bf16(g / (1.0f + nereus_exp(-g)) * nereus_bf16_to_f32(up[i]));
  }
}

// SwiGLU backward: dgate[N] = dout·up·silu'(gate), dup[N] = dout·silu(gate).
NEREUS_KERNEL nereus_swiglu_backward(bf16* __restrict__ dgate, bf16* __restrict__ dup, const bf16* __restrict__ dout,
                                     const bf16* __restrict__ gate, const bf16* __restrict__ up, u64 n) {
  NEREUS_GRID_STRIDE(i, n) {
    const float g = nereus_bf16_to_f32(gate[i]), u = nereus_bf16_to_f32(up[i]), d = nereus_bf16_to_f32(dout[i]);
    const float s = 1.0f / (1.0f + nereus_exp(-g));
    dgate[i] = nereus_f32_to_bf16(d * u * s * (1.0f + g * (1.0f - s)));
    dup[i] = nereus_f32_to_bf16(d * g * s);
  }
}

// Residual add: x[N] += y[N], in place on the bf16 residual stream.
NEREUS_KERNEL nereus_residual_add(bf16* __restrict__ x, const bf16* __restrict__ y, u64 n) {
  NEREUS_GRID_STRIDE(i, n) x[i] = nereus_f32_to_bf16(nereus_bf16_to_f32(x[i]) + nereus_bf16_to_f32(y[i]));
}

// The LM head's per-row statistics over one vocab shard: row_max[R] and row_sum[R] = Σ exp(l −
// row_max), and the target's logit where the target falls in this shard [shard_start, shard_start
// + C) (else −inf). Under TP the shards' (max, sum, target) are combined across ranks
// (nereus_logprob_combine's formula) before the log-prob is read.
NEREUS_KERNEL nereus_logits_row_stats(float* __restrict__ row_max, float* __restrict__ row_sum,
                                      float* __restrict__ target_logit, const bf16* __restrict__ logits,
                                      const int* __restrict__ targets, u64 rows, u64 cols, u64 shard_start) {
  __shared__ float scratch[1024 / NEREUS_WARP];
  const float neg_inf = nereus_bits_to_f32(0xff800000u);
  NEREUS_ROWS(row, rows) {
    const bf16* lr = logits + row * cols;  // [C]
    const float m = nereus_row_max(lr, cols, scratch);
    float s = 0.0f;
    for (u64 c = threadIdx.x; c < cols; c += blockDim.x) s += nereus_exp(nereus_bf16_to_f32(lr[c]) - m);
    s = nereus_block_reduce(s, scratch, false);
    if (threadIdx.x == 0) {
      const long long t = (long long)targets[row] - (long long)shard_start;
      row_max[row] = m;
      row_sum[row] = s;
      target_logit[row] = t >= 0 && t < (long long)cols ? nereus_bf16_to_f32(lr[t]) : neg_inf;
    }
  }
}

// One tensor of the fused AdamW: f32 master weights, moments and gradient, the bf16 working copy
// it rewrites, and its own weight decay (0 for norms). Mirrors `AdamTensor` in
// crates/exec/src/backend/sources.rs (56 bytes).
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

// The LM head's backward through log p(target) over one vocab shard, given each row's global
// log-sum-exp (after the TP combine) and the loss's gradient g[R] with respect to log p:
//   dlogits[R,C] = g · (onehot(target − shard_start) − exp(l − lse))
NEREUS_KERNEL nereus_logprob_backward(bf16* __restrict__ dlogits, const bf16* __restrict__ logits,
                                      const float* __restrict__ lse, const float* __restrict__ dlogp,
                                      const int* __restrict__ targets, u64 rows, u64 cols, u64 shard_start) {
  NEREUS_GRID_STRIDE(i, rows * cols) {
    const u64 row = i / cols, col = i % cols;
    const float p = nereus_exp(nereus_bf16_to_f32(logits[i]) - lse[row]);
    const float hit = (long long)targets[row] - (long long)shard_start == (long long)col ? 1.0f : 0.0f;
    dlogits[i] = nereus_f32_to_bf16(dlogp[row] * (hit - p));
  }
}

// Greedy decoding over one vocab shard: tokens[R] = the lowest column holding the row's largest
// logit (the host combines shards by (value, shard_start + column)); values[R] that logit.
NEREUS_KERNEL nereus_argmax(int* __restrict__ tokens, float* __restrict__ values, const bf16* __restrict__ logits,
                            u64 rows, u64 cols) {
  __shared__ float scratch[1024 / NEREUS_WARP];
  const float neg_inf = nereus_bits_to_f32(0xff800000u);
  NEREUS_ROWS(row, rows) {
    const bf16* lr = logits + row * cols;  // [C]
    const float m = nereus_row_max(lr, cols, scratch);
    // The lowest column at the maximum, as the largest −column (exact in f32 below 2^24 columns).
    float first = neg_inf;
    for (u64 c = threadIdx.x; c < cols; c += blockDim.x)
      if (nereus_bf16_to_f32(lr[c]) == m) first = fmaxf(first, -(float)c);
    first = nereus_block_reduce(first, scratch, true);
    if (threadIdx.x == 0) {
      tokens[row] = (int)(-first);
      values[row] = m;
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

// Every entry point, for the grid emulator's table (kernels/emulator/kernels.cpp).
#define NEREUS_ENGINE_KERNELS(X)                                                                            \
  X(nereus_cast_f32_to_bf16) X(nereus_cast_bf16_to_f32) X(nereus_rmsnorm_forward) X(nereus_rmsnorm_backward) \
  X(nereus_swiglu_forward) X(nereus_swiglu_backward) X(nereus_residual_add) X(nereus_logits_row_stats)       \
  X(nereus_adamw) X(nereus_logprob_backward) X(nereus_argmax) X(nereus_sum_squares)
