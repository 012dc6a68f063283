// swiglu.cu: the SwiGLU activation forward and backward on the fused gate/up product, bf16 in
// memory and f32 in registers. The f64 references they are checked against, and their launches,
// are in crates/bench/src/selftest/kernels/ (`nereus selftest kernels`, docs/kernels.md).
//
// Legend: R rows, F the SwiGLU width. gu[R, 2F] is one GEMM's output over the adjacent
// gate_proj and up_proj weights: row r holds its gate in columns [0, F) and its up in [F, 2F).
// Element-wise: 1-D grid-stride loops over R·F, or over R·F/8 groups of 8 columns moved as
// 16-byte vectors where F and the buffers allow it.

// silu(g) · u, and the pair (d·u·silu'(g), d·silu(g)) of the backward pass.
__device__ __forceinline__ float nereus_swiglu(float g, float u) { return g / (1.0f + nereus_exp(-g)) * u; }
__device__ __forceinline__ void nereus_swiglu_grad(float g, float u, float d, float* dg, float* du) {
  const float s = 1.0f / (1.0f + nereus_exp(-g));
  *dg = d * u * s * (1.0f + g * (1.0f - s));
  *du = d * g * s;
}

// Whether rows of F columns may move 8 bf16 at a time: F a multiple of 8 and every buffer
// 16-byte aligned (then every row, and every group of 8 in it, is too).
__device__ __forceinline__ bool nereus_swiglu_vectors(u64 f, const void* a, const void* b, const void* c) {
  return f % 8 == 0 && nereus_aligned16(a) && nereus_aligned16(b) && nereus_aligned16(c);
}

// SwiGLU: out[R, F] = silu(gate) · up; 16-byte vectors where the rows allow them.
NEREUS_KERNEL nereus_swiglu_forward(bf16* __restrict__ out, const bf16* __restrict__ gu, u64 rows, u64 f) {
  if (nereus_swiglu_vectors(f, out, gu, gu)) {
    NEREUS_GRID_STRIDE(i, rows * f / 8) {
      const u64 row = 8 * i / f, col = 8 * i % f;
      float g[8], u[8], o[8];
      nereus_load8(g, gu + row * 2 * f + col);
      nereus_load8(u, gu + row * 2 * f + f + col);
      NEREUS_UNROLL
      for (int j = 0; j < 8; ++j) o[j] = nereus_swiglu(g[j], u[j]);
      nereus_store8(out + 8 * i, o);
    }
    return;
  }
  NEREUS_GRID_STRIDE(i, rows * f) {
    const bf16* row = gu + (i / f) * 2 * f;
    const u64 col = i % f;
    out[i] = nereus_f32_to_bf16(nereus_swiglu(nereus_bf16_to_f32(row[col]), nereus_bf16_to_f32(row[f + col])));
  }
}

// SwiGLU backward into the fused layout: dgu[R, 2F] = (dout·up·silu'(gate) | dout·silu(gate)).
NEREUS_KERNEL nereus_swiglu_backward(bf16* __restrict__ dgu, const bf16* __restrict__ dout,
                                     const bf16* __restrict__ gu, u64 rows, u64 f) {
  if (nereus_swiglu_vectors(f, dgu, dout, gu)) {
    NEREUS_GRID_STRIDE(i, rows * f / 8) {
      const u64 base = (8 * i / f) * 2 * f + 8 * i % f;
      float g[8], u[8], d[8], dg[8], du[8];
      nereus_load8(g, gu + base);
      nereus_load8(u, gu + base + f);
      nereus_load8(d, dout + 8 * i);
      NEREUS_UNROLL
      for (int j = 0; j < 8; ++j) nereus_swiglu_grad(g[j], u[j], d[j], &dg[j], &du[j]);
      nereus_store8(dgu + base, dg);
      nereus_store8(dgu + base + f, du);
    }
    return;
  }
  NEREUS_GRID_STRIDE(i, rows * f) {
    const u64 base = (i / f) * 2 * f + i % f;
    float dg, du;
    nereus_swiglu_grad(nereus_bf16_to_f32(gu[base]), nereus_bf16_to_f32(gu[base + f]), nereus_bf16_to_f32(dout[i]),
                       &dg, &du);
    dgu[base] = nereus_f32_to_bf16(dg);
    dgu[base + f] = nereus_f32_to_bf16(du);
  }
}

// Every entry point, for the grid emulator's table (crates/kernels/emulator/kernels.cpp).
#define NEREUS_SWIGLU_KERNELS(X) X(nereus_swiglu_forward) X(nereus_swiglu_backward)
