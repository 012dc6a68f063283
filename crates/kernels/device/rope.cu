// rope.cu: rotary position embeddings ("rotate half"), in place on bf16 heads. The CPU engine's
// op (crates/exec/src/engine/ops/rope.rs) defines the semantics; the f64 reference is in
// crates/bench/src/selftest/kernels/reference.rs.
//
// Legend: B·T rows, H heads, D = 2·half head width, P positions of the tables. 1-D grid-stride.

// Channel pair (j, j + D/2) of one head at position pos, read from `from` and written to `to`
// (the same head for an in-place rotation) turned by the tables' angle, or back when `inverse`.
__device__ __forceinline__ void nereus_rotate_pair(const bf16* from, bf16* to, const float* cos_table,
                                                   const float* sin_table, u64 pos, u64 half, u64 j, bool inverse) {
  const float c = cos_table[pos * half + j], s = inverse ? -sin_table[pos * half + j] : sin_table[pos * half + j];
  const float a = nereus_bf16_to_f32(from[j]), b = nereus_bf16_to_f32(from[j + half]);
  to[j] = nereus_f32_to_bf16(a * c - b * s);
  to[j + half] = nereus_f32_to_bf16(b * c + a * s);
}

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
    bf16* xh = x + head_row * 2 * half;  // [D] one head
    nereus_rotate_pair(xh, xh, cos_table, sin_table, pos0 + row % t, half, j, inverse);
  }
}

// The fused projection's split, or with `merge` its gather (the backward pass). A fused row of
// qkv[B·T, (H + 2K)·D] holds the row's H query heads, then its K key heads, then its K value
// heads (one GEMM over the adjacent q, k and v weights wrote it). Split: q[B·T, H·D], k and v
// receive their heads, q and k rotated when `rotate` (a model with q/k-norms rotates after them).
// Merge: the reverse, q and k rotated back. k and v rows are q's rows when kv_t is 0; otherwise
// they are rows of a KV cache [B, kv_t, K·D] at positions pos0 + *position + r % T, so the split
// is also the cache's append. Each item moves one (row, head, pair j & j + D/2).
NEREUS_KERNEL nereus_qkv_rope(bf16* __restrict__ qkv, bf16* __restrict__ q, bf16* __restrict__ k,
                              bf16* __restrict__ v, const float* __restrict__ cos_table,
                              const float* __restrict__ sin_table, u64 rows, u64 t, u64 heads, u64 kv_heads,
                              u64 half, u64 pos0, u64 kv_t, int rotate, int merge, const int* __restrict__ position) {
  if (position) pos0 += (u64)*position;
  const u64 width = heads + 2 * kv_heads;  // heads of a fused row
  NEREUS_GRID_STRIDE(i, rows * width * half) {
    const u64 j = i % half, head = (i / half) % width, row = i / (half * width);
    const u64 pos = pos0 + row % t;
    const u64 kv_row = kv_t ? (row / t) * kv_t + pos : row;
    bf16* part = head < heads              ? q + (row * heads + head) * 2 * half
                 : head < heads + kv_heads ? k + (kv_row * kv_heads + head - heads) * 2 * half
                                           : v + (kv_row * kv_heads + head - heads - kv_heads) * 2 * half;
    bf16* fused = qkv + (row * width + head) * 2 * half;
    const bf16* from = merge ? part : fused;
    bf16* to = merge ? fused : part;
    if (rotate && head < heads + kv_heads) {
      nereus_rotate_pair(from, to, cos_table, sin_table, pos, half, j, merge);
    } else {
      to[j] = from[j];
      to[j + half] = from[j + half];
    }
  }
}

// Every entry point, for the grid emulator's table (crates/kernels/emulator/kernels.cpp).
#define NEREUS_ROPE_KERNELS(X) X(nereus_rope) X(nereus_qkv_rope)
