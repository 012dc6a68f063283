// cast.cu: precision casts between the f32 and bf16 buffers of the device engine.
// The f64 references they are checked against, and their launches, are in
// crates/bench/src/selftest/kernels/ (`nereus selftest kernels`, docs/kernels.md).
//
// Legend: N elements. Element-wise: 1-D grid-stride loops.

// y[N] = bf16(x[N]), rounding to nearest even.
NEREUS_KERNEL nereus_cast_f32_to_bf16(bf16* __restrict__ y, const float* __restrict__ x, u64 n) {
  NEREUS_GRID_STRIDE(i, n) y[i] = nereus_f32_to_bf16(x[i]);
}

// y[N] = f32(x[N]) (exact).
NEREUS_KERNEL nereus_cast_bf16_to_f32(float* __restrict__ y, const bf16* __restrict__ x, u64 n) {
  NEREUS_GRID_STRIDE(i, n) y[i] = nereus_bf16_to_f32(x[i]);
}

// Every entry point, for the grid emulator's table (crates/kernels/emulator/kernels.cpp).
#define NEREUS_CAST_KERNELS(X) X(nereus_cast_f32_to_bf16) X(nereus_cast_bf16_to_f32)
