// swiglu.cu: the SwiGLU activation forward and backward, bf16 in memory and f32 in registers.
// The f64 references they are checked against, and their launches, are in
// crates/bench/src/selftest/kernels/ (`nereus selftest kernels`, docs/kernels.md).
//
// Legend: N elements. Element-wise: 1-D grid-stride loops.

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

// Every entry point, for the grid emulator's table (crates/kernels/emulator/kernels.cpp).
#define NEREUS_SWIGLU_KERNELS(X) X(nereus_swiglu_forward) X(nereus_swiglu_backward)
