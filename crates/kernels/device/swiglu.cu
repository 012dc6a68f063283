// swiglu.cu: the SwiGLU activation forward and backward on the fused gate/up product, bf16 in
// memory and f32 in registers. The f64 references they are checked against, and their launches,
// are in crates/bench/src/selftest/kernels/ (`nereus selftest kernels`, docs/kernels.md).
//
// Legend: R rows, F the SwiGLU width. gu[R, 2F] is one GEMM's output over the adjacent
// gate_proj and up_proj weights: row r holds its gate in columns [0, F) and its up in [F, 2F).
// Element-wise: 1-D grid-stride loops over R·F.

// SwiGLU: out[R, F] = silu(gate) · up.
NEREUS_KERNEL nereus_swiglu_forward(bf16* __restrict__ out, const bf16* __restrict__ gu, u64 rows, u64 f) {
  NEREUS_GRID_STRIDE(i, rows * f) {
    const bf16* row = gu + (i / f) * 2 * f;
    const u64 col = i % f;
    const float g = nereus_bf16_to_f32(row[col]);
    out[i] = nereus_f32_to_bf16(g / (1.0f + nereus_exp(-g)) * nereus_bf16_to_f32(row[f + col]));
  }
}

// SwiGLU backward into the fused layout: dgu[R, 2F] = (dout·up·silu'(gate) | dout·silu(gate)).
NEREUS_KERNEL nereus_swiglu_backward(bf16* __restrict__ dgu, const bf16* __restrict__ dout,
                                     const bf16* __restrict__ gu, u64 rows, u64 f) {
  NEREUS_GRID_STRIDE(i, rows * f) {
    const u64 base = (i / f) * 2 * f + i % f;
    const float g = nereus_bf16_to_f32(gu[base]), u = nereus_bf16_to_f32(gu[base + f]);
    const float d = nereus_bf16_to_f32(dout[i]);
    const float s = 1.0f / (1.0f + nereus_exp(-g));
    dgu[base] = nereus_f32_to_bf16(d * u * s * (1.0f + g * (1.0f - s)));
    dgu[base + f] = nereus_f32_to_bf16(d * g * s);
  }
}

// Every entry point, for the grid emulator's table (crates/kernels/emulator/kernels.cpp).
#define NEREUS_SWIGLU_KERNELS(X) X(nereus_swiglu_forward) X(nereus_swiglu_backward)
