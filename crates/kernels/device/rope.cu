// rope.cu: rotary position embeddings ("rotate half"), in place on bf16 heads. The CPU engine's
// op (crates/exec/src/engine/ops/rope.rs) defines the semantics; the f64 reference is in
// crates/bench/src/selftest/kernels/reference.rs.
//
// Legend: B·T rows, H heads, D = 2·half head width, P positions of the tables. 1-D grid-stride.

// Channel pairs (j + e, j + e + D/2), e < W, of one head at position pos, read from `from` and
// written to `to` (the same head for an in-place rotation) turned by the tables' angles, or back
// when `inverse`. W = 8: one 16-byte vector of each half and two of each table's f32.
template <int W>
__device__ __forceinline__ void nereus_rotate_pairs(const bf16* from, bf16* to, const float* cos_table,
                                                    const float* sin_table, u64 pos, u64 half, u64 j, bool inverse) {
  float c[W], s[W], a[W], b[W];
  nereus_load_f32<W>(c, cos_table + pos * half + j);
  nereus_load_f32<W>(s, sin_table + pos * half + j);
  nereus_load_bf16<W>(a, from + j);
  nereus_load_bf16<W>(b, from + j + half);
  float ra[W], rb[W];
  NEREUS_UNROLL
  for (int e = 0; e < W; ++e) {
    const float sn = inverse ? -s[e] : s[e];
    ra[e] = a[e] * c[e] - b[e] * sn;
    rb[e] = b[e] * c[e] + a[e] * sn;
  }
  nereus_store_bf16<W>(to + j, ra);
  nereus_store_bf16<W>(to + j + half, rb);
}

// Whether a kernel over heads of width 2·half whose tables are cos_table and sin_table may move 8
// pairs at a time: half a multiple of 8 and the tables 16-byte aligned (then, with the heads'
// buffers aligned too, every head, half-head and table row is).
__device__ __forceinline__ bool nereus_rope_vectors(u64 half, const float* cos_table, const float* sin_table) {
  return half % 8 == 0 && nereus_aligned16(cos_table) && nereus_aligned16(sin_table);
}

template <int W>
__device__ __forceinline__ void nereus_rope_items(bf16* __restrict__ x, const float* __restrict__ cos_table,
                                                  const float* __restrict__ sin_table, u64 rows, u64 t, u64 heads,
                                                  u64 half, u64 pos0, int inverse) {
  const u64 runs = half / W;  // runs of W pairs a head
  NEREUS_GRID_STRIDE(i, rows * heads * runs) {
    const u64 j = W * (i % runs), head_row = i / runs, row = head_row / heads;
    bf16* xh = x + head_row * 2 * half;  // [D] one head
    nereus_rotate_pairs<W>(xh, xh, cos_table, sin_table, pos0 + row % t, half, j, inverse);
  }
}

// Rotates x[B·T, H, D] in place ("rotate half": channel j < D/2 pairs with j + D/2), row r at
// position pos0 + *position + r % T (position: a decode's row counter in device memory, or null),
// by the host's tables cos/sin[P, D/2] (f64-computed, llama3 scaling included); `inverse` = 1
// turns back, which is the backward pass. Eight pairs an item where nereus_rope_vectors allows.
NEREUS_KERNEL nereus_rope(bf16* __restrict__ x, const float* __restrict__ cos_table,
                          const float* __restrict__ sin_table, u64 rows, u64 t, u64 heads, u64 half, u64 pos0,
                          int inverse, const int* __restrict__ position) {
  if (position) pos0 += (u64)*position;
  if (nereus_rope_vectors(half, cos_table, sin_table) && nereus_aligned16(x))
    nereus_rope_items<8>(x, cos_table, sin_table, rows, t, heads, half, pos0, inverse);
  else
    nereus_rope_items<1>(x, cos_table, sin_table, rows, t, heads, half, pos0, inverse);
}

template <int W>
__device__ __forceinline__ void nereus_qkv_rope_items(bf16* __restrict__ qkv, bf16* __restrict__ q,
                                                      bf16* __restrict__ k, bf16* __restrict__ v,
                                                      const float* __restrict__ cos_table,
                                                      const float* __restrict__ sin_table, u64 rows, u64 t, u64 heads,
                                                      u64 kv_heads, u64 half, u64 pos0, u64 kv_t, int rotate,
                                                      int merge) {
  const u64 width = heads + 2 * kv_heads;  // heads of a fused row
  const u64 runs = half / W;               // runs of W pairs a head
  NEREUS_GRID_STRIDE(i, rows * width * runs) {
    const u64 j = W * (i % runs), head = (i / runs) % width, row = i / (runs * width);
    const u64 pos = pos0 + row % t;
    const u64 kv_row = kv_t ? (row / t) * kv_t + pos : row;
    bf16* part = head < heads              ? q + (row * heads + head) * 2 * half
                 : head < heads + kv_heads ? k + (kv_row * kv_heads + head - heads) * 2 * half
                                           : v + (kv_row * kv_heads + head - heads - kv_heads) * 2 * half;
    bf16* fused = qkv + (row * width + head) * 2 * half;
    const bf16* from = merge ? part : fused;
    bf16* to = merge ? fused : part;
    if (rotate && head < heads + kv_heads) {
      nereus_rotate_pairs<W>(from, to, cos_table, sin_table, pos, half, j, merge);
    } else {
      nereus_copy_bf16<W>(to + j, from + j);
      nereus_copy_bf16<W>(to + j + half, from + j + half);
    }
  }
}

// The fused projection's split, or with `merge` its gather (the backward pass). A fused row of
// qkv[B·T, (H + 2K)·D] holds the row's H query heads, then its K key heads, then its K value
// heads (one GEMM over the adjacent q, k and v weights wrote it). Split: q[B·T, H·D], k and v
// receive their heads, q and k rotated when `rotate` (a model with q/k-norms rotates after them).
// Merge: the reverse, q and k rotated back. k and v rows are q's rows when kv_t is 0; otherwise
// they are rows of a KV cache [B, kv_t, K·D] at positions pos0 + *position + r % T, so the split
// is also the cache's append. Each item moves one (row, head) run of pairs j & j + D/2: eight
// where nereus_rope_vectors allows, else one.
NEREUS_KERNEL nereus_qkv_rope(bf16* __restrict__ qkv, bf16* __restrict__ q, bf16* __restrict__ k,
                              bf16* __restrict__ v, const float* __restrict__ cos_table,
                              const float* __restrict__ sin_table, u64 rows, u64 t, u64 heads, u64 kv_heads,
                              u64 half, u64 pos0, u64 kv_t, int rotate, int merge, const int* __restrict__ position) {
  if (position) pos0 += (u64)*position;
  const bool aligned = nereus_aligned16(qkv) && nereus_aligned16(q) && nereus_aligned16(k) && nereus_aligned16(v);
  if (aligned && nereus_rope_vectors(half, cos_table, sin_table))
    nereus_qkv_rope_items<8>(qkv, q, k, v, cos_table, sin_table, rows, t, heads, kv_heads, half, pos0, kv_t, rotate,
                             merge);
  else
    nereus_qkv_rope_items<1>(qkv, q, k, v, cos_table, sin_table, rows, t, heads, kv_heads, half, pos0, kv_t, rotate,
                             merge);
}

// Every entry point, for the grid emulator's table (crates/kernels/emulator/kernels.cpp).
#define NEREUS_ROPE_KERNELS(X) X(nereus_rope) X(nereus_qkv_rope)
