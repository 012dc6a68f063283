// norm.cu: RMSNorm forward and backward and the residual add, bf16 in memory and f32 in
// registers. The f64 references they are checked against, and their launches, are in
// crates/bench/src/selftest/kernels/ (`nereus selftest kernels`, docs/kernels.md).
//
// Legend: R rows, C columns (the model width), N elements. Row kernels: one block per row
// (grid-stride over rows), blockDim.x a multiple of the warp and at most 1024, reductions through
// nereus_block_reduce (pairwise trees, never one long f32 chain). Element-wise: 1-D grid-stride.

// The RMSNorm forward's rows, W columns at a time a thread (W = 8: 16-byte vectors).
template <int W>
__device__ __forceinline__ void nereus_rmsnorm_rows(bf16* __restrict__ y, float* __restrict__ inv_rms,
                                                    bf16* __restrict__ x, const bf16* __restrict__ weight, u64 rows,
                                                    u64 cols, float eps, const bf16* __restrict__ residual,
                                                    float* scratch) {
  NEREUS_ROWS(row, rows) {
    bf16* xr = x + row * cols;  // [C]
    float squares = 0.0f;
    for (u64 c = W * threadIdx.x; c < cols; c += W * blockDim.x) {
      float v[W];
      nereus_load_bf16<W>(v, xr + c);
      if (residual) {
        float r[W];
        nereus_load_bf16<W>(r, residual + row * cols + c);
        NEREUS_UNROLL
        for (int j = 0; j < W; ++j) v[j] = nereus_bf16_to_f32(nereus_f32_to_bf16(v[j] + r[j]));
        nereus_store_bf16<W>(xr + c, v);
      }
      NEREUS_UNROLL
      for (int j = 0; j < W; ++j) squares += v[j] * v[j];
    }
    const float r = nereus_rsqrt(nereus_block_reduce(squares, scratch, false) / (float)cols + eps);
    for (u64 c = W * threadIdx.x; c < cols; c += W * blockDim.x) {
      float v[W], w[W];
      nereus_load_bf16<W>(v, xr + c);
      nereus_load_bf16<W>(w, weight + c);
      NEREUS_UNROLL
      for (int j = 0; j < W; ++j) v[j] = v[j] * r * w[j];
      nereus_store_bf16<W>(y + row * cols + c, v);
    }
    if (threadIdx.x == 0) inv_rms[row] = r;
  }
}

// RMSNorm: y[R,C] = x · rsqrt(mean(x²) + eps) · weight[C]; inv_rms[R] kept for the backward pass.
// With a residual (not null) the residual connection comes first, in the same pass: x[R,C] +=
// residual[R,C], rounded to bf16 as nereus_residual_add rounds it, and the norm reads the sum
// (each thread reads back only the elements it wrote). Where C is a multiple of 8 and every
// buffer is 16-byte aligned, each thread moves 8 columns at a time as one vector.
NEREUS_KERNEL nereus_rmsnorm_forward(bf16* __restrict__ y, float* __restrict__ inv_rms, bf16* __restrict__ x,
                                     const bf16* __restrict__ weight, u64 rows, u64 cols, float eps,
                                     const bf16* __restrict__ residual) {
  __shared__ float scratch[1024 / NEREUS_WARP];
  const bool vectors = cols % 8 == 0 && nereus_aligned16(y) && nereus_aligned16(x) && nereus_aligned16(weight) &&
                       (!residual || nereus_aligned16(residual));
  if (vectors)
    nereus_rmsnorm_rows<8>(y, inv_rms, x, weight, rows, cols, eps, residual, scratch);
  else
    nereus_rmsnorm_rows<1>(y, inv_rms, x, weight, rows, cols, eps, residual, scratch);
}

// Columns one thread of the RMSNorm backward keeps dweight sums for in registers: a row up to
// NEREUS_NORM_STRIDES · blockDim.x wide (4,096 at 256 threads) is summed over the block's rows
// before one atomic a column.
#define NEREUS_NORM_STRIDES 16

// W columns (W = 8: one 16-byte vector each) of a row of the RMSNorm backward from column c:
// dx += inv_rms · (g − x · inv_rms² · mean(g·x)) each, rounded once, and each element's dweight
// term dy·x·inv_rms added to dw.
template <int W>
__device__ __forceinline__ void nereus_rmsnorm_dx(float (&dw)[W], bf16* dxr, const bf16* dyr, const bf16* xr,
                                                  const bf16* weight, float r, float mean_gx, u64 c) {
  float xv[W], dyv[W], w[W], d[W];
  nereus_load_bf16<W>(xv, xr + c);
  nereus_load_bf16<W>(dyv, dyr + c);
  nereus_load_bf16<W>(w, weight + c);
  nereus_load_bf16<W>(d, dxr + c);
  NEREUS_UNROLL
  for (int j = 0; j < W; ++j) {
    d[j] += r * (dyv[j] * w[j] - xv[j] * r * r * mean_gx);
    dw[j] += dyv[j] * xv[j] * r;
  }
  nereus_store_bf16<W>(dxr + c, d);
}

// The RMSNorm backward's rows, W columns at a time a thread (see nereus_rmsnorm_backward).
template <int W>
__device__ __forceinline__ void nereus_rmsnorm_backward_rows(bf16* __restrict__ dx, float* __restrict__ dweight,
                                                             const bf16* __restrict__ dy, const bf16* __restrict__ x,
                                                             const bf16* __restrict__ weight,
                                                             const float* __restrict__ inv_rms, u64 rows, u64 cols,
                                                             float* scratch) {
  constexpr int STRIDES = NEREUS_NORM_STRIDES / W;
  const bool in_registers = cols <= (u64)NEREUS_NORM_STRIDES * blockDim.x;
  float dw[STRIDES][W];
  NEREUS_UNROLL
  for (int s = 0; s < STRIDES; ++s) {
    NEREUS_UNROLL
    for (int j = 0; j < W; ++j) dw[s][j] = 0.0f;
  }
  NEREUS_ROWS(row, rows) {
    const bf16* xr = x + row * cols;    // [C]
    const bf16* dyr = dy + row * cols;  // [C]
    bf16* dxr = dx + row * cols;        // [C]
    const float r = inv_rms[row];
    float dot = 0.0f;
    for (u64 c = W * threadIdx.x; c < cols; c += W * blockDim.x) {
      float xv[W], dyv[W], w[W];
      nereus_load_bf16<W>(xv, xr + c);
      nereus_load_bf16<W>(dyv, dyr + c);
      nereus_load_bf16<W>(w, weight + c);
      NEREUS_UNROLL
      for (int j = 0; j < W; ++j) dot += dyv[j] * w[j] * xv[j];
    }
    const float mean_gx = nereus_block_reduce(dot, scratch, false) / (float)cols;
    if (in_registers) {
      NEREUS_UNROLL
      for (int s = 0; s < STRIDES; ++s) {
        const u64 c = W * (threadIdx.x + (u64)s * blockDim.x);
        if (c < cols) nereus_rmsnorm_dx<W>(dw[s], dxr, dyr, xr, weight, r, mean_gx, c);
      }
    } else {
      for (u64 c = W * threadIdx.x; c < cols; c += W * blockDim.x) {
        float terms[W];
        NEREUS_UNROLL
        for (int j = 0; j < W; ++j) terms[j] = 0.0f;
        nereus_rmsnorm_dx<W>(terms, dxr, dyr, xr, weight, r, mean_gx, c);
        NEREUS_UNROLL
        for (int j = 0; j < W; ++j) atomicAdd(&dweight[c + j], terms[j]);
      }
    }
  }
  if (!in_registers || blockIdx.x >= rows) return;
  NEREUS_UNROLL
  for (int s = 0; s < STRIDES; ++s) {
    const u64 c = W * (threadIdx.x + (u64)s * blockDim.x);
    if (c >= cols) continue;
    NEREUS_UNROLL
    for (int j = 0; j < W; ++j) atomicAdd(&dweight[c + j], dw[s][j]);
  }
}

// RMSNorm backward: dx[R,C] += (in f32, rounded once: the residual stream's gradient is added to)
// and dweight[C] += Σ_rows dy·x·inv_rms (f32). Each block sums its rows' dweight terms in
// registers and adds each column once (where C ≤ NEREUS_NORM_STRIDES · blockDim.x, else one
// atomic per element): a row per block and an atomic per element put every row's atomic on the
// same C addresses, 4,096 deep on a 4,096-token step, which serialise in L2. Where C is a
// multiple of 8 and every bf16 buffer is 16-byte aligned, each thread moves 8 columns at a time
// as one vector (the same NEREUS_NORM_STRIDES registers of sums: 2 strides of 8).
//   g = dy·weight;  dx += inv_rms · (g − x · inv_rms² · mean(g·x))
NEREUS_KERNEL nereus_rmsnorm_backward(bf16* __restrict__ dx, float* __restrict__ dweight, const bf16* __restrict__ dy,
                                      const bf16* __restrict__ x, const bf16* __restrict__ weight,
                                      const float* __restrict__ inv_rms, u64 rows, u64 cols) {
  __shared__ float scratch[1024 / NEREUS_WARP];
  const bool vectors =
      cols % 8 == 0 && nereus_aligned16(dx) && nereus_aligned16(dy) && nereus_aligned16(x) && nereus_aligned16(weight);
  if (vectors)
    nereus_rmsnorm_backward_rows<8>(dx, dweight, dy, x, weight, inv_rms, rows, cols, scratch);
  else
    nereus_rmsnorm_backward_rows<1>(dx, dweight, dy, x, weight, inv_rms, rows, cols, scratch);
}

// Residual add: x[N] += y[N], in place on the bf16 residual stream; 16-byte vectors of 8 where
// both buffers are aligned, the last N % 8 one at a time.
NEREUS_KERNEL nereus_residual_add(bf16* __restrict__ x, const bf16* __restrict__ y, u64 n) {
  u64 scalar_from = 0;
  if (nereus_aligned16(x) && nereus_aligned16(y)) {
    NEREUS_GRID_STRIDE(i, n / 8) {
      float a[8], b[8];
      nereus_load8(a, x + 8 * i);
      nereus_load8(b, y + 8 * i);
      NEREUS_UNROLL
      for (int j = 0; j < 8; ++j) a[j] += b[j];
      nereus_store8(x + 8 * i, a);
    }
    scalar_from = n / 8 * 8;
  }
  NEREUS_GRID_STRIDE(i, n - scalar_from) {
    const u64 at = scalar_from + i;
    x[at] = nereus_f32_to_bf16(nereus_bf16_to_f32(x[at]) + nereus_bf16_to_f32(y[at]));
  }
}

// Every entry point, for the grid emulator's table (crates/kernels/emulator/kernels.cpp).
#define NEREUS_NORM_KERNELS(X) X(nereus_rmsnorm_forward) X(nereus_rmsnorm_backward) X(nereus_residual_add)
