// rope.cu: rotary position embeddings ("rotate half"), in place on bf16 heads. The CPU engine's
// op (crates/exec/src/engine/ops/rope.rs) defines the semantics; the f64 reference is in
// crates/bench/src/selftest/kernels/reference.rs.
//
// Legend: B·T rows, H heads, D = 2·half head width, P positions of the tables. 1-D grid-stride.

// Rotates x[B·T, H, D] in place ("rotate half": channel j < D/2 pairs with j + D/2), row r at
// position pos0 + *position + r % T (position: a decode's row counter in device memory, or null),
// by the host's tables cos/sin[P, D/2] (f64-computed, llama3 scaling included); `inverse` = 1
// turns back, which is the backward pass.
NEREUS_KERNEL nereus_rope(bf16* __restrict__ x, const float* __restrict__ cos_table,
                          const float* __restrict__ sin_table, u64 rows, u64 t, u64 heads, u64 half, u64 pos0,
                          int inverse, const int* __restrict__ position) {
  if (position) pos0 += (u64)*position;
  NEREUS_GRID_STRIDE(i, rows * heads * half) {
    const u64 j = i % half, head_row = i / half, row = head_row / heads;
    const u64 pos = pos0 + row % t;
    const float c = cos_table[pos * half + j], s = inverse ? -sin_table[pos * half + j] : sin_table[pos * half + j];
    bf16* xh = x + head_row * 2 * half;  // [D] one head
    const float a = nereus_bf16_to_f32(xh[j]), b = nereus_bf16_to_f32(xh[j + half]);
    xh[j] = nereus_f32_to_bf16(a * c - b * s);
    xh[j + half] = nereus_f32_to_bf16(b * c + a * s);
  }
}

// Every entry point, for the grid emulator's table (crates/kernels/emulator/kernels.cpp).
#define NEREUS_ROPE_KERNELS(X) X(nereus_rope)
