// decode_attention.cu: flash-decoding (Dao, Haziza, Massa & Sizov, "Flash-Decoding for long-context
// inference", 2023): the attention of one new query per sequence against the KV cache, with the
// keys split across blocks so that a small batch still fills the device, and the splits' partial
// softmaxes combined by a second kernel. The scalar kernel in attention.cu defines the semantics.
//
// Legend as in attention.cu: B sequences, Tc positions per sequence in the cache, H query heads,
// K key/value heads (G = H/K query heads per group), D head width, S splits. The query of sequence
// b sits at position keys − 1, where keys = tk + *position (position is the decode's row counter
// in device memory, or null: a replayed decode step reads how far it has come there); its keys
// are the positions starts[b]..keys − 1. A sequence whose done[b] is set (it has ended; done may
// be null) costs no attention: it outputs zero, as a query with no key does.
//
// A block owns (split, group, sequence): it stages a tile of NEREUS_DECODE_TILE keys and values in
// shared memory once and scores them against all G query heads of the group (GQA: a K/V tile is
// read from memory once per group, not once per head).

#define NEREUS_DECODE_TILE 32
#define NEREUS_DECODE_THREADS 128
#define NEREUS_DECODE_MAX_HEAD_DIM 256
#define NEREUS_DECODE_MAX_GROUP 16
#define NEREUS_DECODE_MAX_OUTPUTS 1024  // G·D a block accumulates
#define NEREUS_DECODE_K_STRIDE (NEREUS_DECODE_MAX_HEAD_DIM + 2)  // a padded row: lanes on distinct banks

// Each split's unnormalised output partial[B, H, S, D] (f32) and its softmax statistics
// stats[B, H, S, 2] = (max score, Σ exp(score − max)); a split with no key writes (−inf, 0).
// blockDim.x = NEREUS_DECODE_THREADS, grid (S, K, B); split s holds keys s·split_keys and on.
// With one split and `out` given (not null), the block finishes as the combine would — out[B, 1,
// H, D] and lse[B, H], bit for bit its results, since a single split's weight is exp(0) = 1 — and
// writes no partials: a batch that fills the device alone needs no second launch.
NEREUS_KERNEL nereus_decode_attention(float* __restrict__ partial, float* __restrict__ stats,
                                      const bf16* __restrict__ q, const bf16* __restrict__ k,
                                      const bf16* __restrict__ v, const int* __restrict__ starts,
                                      const int* __restrict__ position, const int* __restrict__ done, u64 b,
                                      u64 tk, u64 tc, u64 heads,
                                      u64 kv_heads, u64 d, u64 splits, u64 split_keys, bf16* __restrict__ out,
                                      float* __restrict__ lse) {
  __shared__ float q_s[NEREUS_DECODE_MAX_OUTPUTS];  // [G, D], pre-scaled
  __shared__ bf16 k_s[NEREUS_DECODE_TILE * NEREUS_DECODE_K_STRIDE];
  __shared__ bf16 v_s[NEREUS_DECODE_TILE * NEREUS_DECODE_MAX_HEAD_DIM];
  __shared__ float p_s[NEREUS_DECODE_MAX_GROUP * NEREUS_DECODE_TILE];  // [G, tile] scores, then exp
  __shared__ float max_s[NEREUS_DECODE_MAX_GROUP], sum_s[NEREUS_DECODE_MAX_GROUP], scale_s[NEREUS_DECODE_MAX_GROUP];
  const u64 split = blockIdx.x, g = blockIdx.y, seq = blockIdx.z, group = heads / kv_heads;
  if (split >= splits || g >= kv_heads || seq >= b) return;  // a grid larger than the shape: the block leaves
  // A shape the block cannot hold (the host's DecodeSplit refuses it) writes nothing.
  if (blockDim.x != NEREUS_DECODE_THREADS || group == 0 || group > NEREUS_DECODE_MAX_GROUP || d == 0 ||
      d > NEREUS_DECODE_MAX_HEAD_DIM || group * d > NEREUS_DECODE_MAX_OUTPUTS)
    return;
  const u64 keys = tk + (position ? (u64)*position : 0), first = starts ? (u64)starts[seq] : 0;
  const u64 lo = split * split_keys > first ? split * split_keys : first;
  const u64 end = (split + 1) * split_keys < keys ? (split + 1) * split_keys : keys;
  const u64 hi = done && done[seq] ? lo : end;  // the same for the whole block
  const u64 outputs = group * d, h0 = g * group;
  const float scale = nereus_rsqrt((float)d), neg_inf = nereus_bits_to_f32(0xff800000u);
  for (u64 e = threadIdx.x; e < outputs; e += blockDim.x)
    q_s[e] = nereus_bf16_to_f32(q[(seq * heads + h0) * d + e]) * scale;
  if (threadIdx.x < group) {
    max_s[threadIdx.x] = neg_inf;
    sum_s[threadIdx.x] = 0.0f;
  }
  // Outputs e = threadIdx.x + m·NEREUS_DECODE_THREADS; the loops over m have a constant trip
  // count, so acc stays in registers.
  float acc[NEREUS_DECODE_MAX_OUTPUTS / NEREUS_DECODE_THREADS];
  NEREUS_UNROLL
  for (int m = 0; m < NEREUS_DECODE_MAX_OUTPUTS / NEREUS_DECODE_THREADS; ++m) acc[m] = 0.0f;
  for (u64 tile = lo; tile < hi; tile += NEREUS_DECODE_TILE) {
    const u64 n = hi - tile < NEREUS_DECODE_TILE ? hi - tile : NEREUS_DECODE_TILE;
    __syncthreads();  // the previous tile's k_s, v_s and p_s have been read
    for (u64 e = threadIdx.x; e < n * d; e += blockDim.x) {
      const u64 j = e / d, c = e % d, at = ((seq * tc + tile + j) * kv_heads + g) * d + c;
      k_s[j * NEREUS_DECODE_K_STRIDE + c] = k[at];
      v_s[j * d + c] = v[at];
    }
    __syncthreads();
    for (u64 e = threadIdx.x; e < group * NEREUS_DECODE_TILE; e += blockDim.x) {
      const u64 r = e / NEREUS_DECODE_TILE, j = e % NEREUS_DECODE_TILE;
      float score = neg_inf;
      if (j < n) {
        score = 0.0f;
        for (u64 c = 0; c < d; ++c) score += q_s[r * d + c] * nereus_bf16_to_f32(k_s[j * NEREUS_DECODE_K_STRIDE + c]);
      }
      p_s[e] = score;
    }
    __syncthreads();
    if (threadIdx.x < group) {  // one thread per query head: the online softmax over the tile
      float* p = p_s + threadIdx.x * NEREUS_DECODE_TILE;
      float tile_max = neg_inf;
      for (u64 j = 0; j < n; ++j) tile_max = fmaxf(tile_max, p[j]);
      const float old_max = max_s[threadIdx.x], new_max = fmaxf(old_max, tile_max);
      float sum = 0.0f;
      for (u64 j = 0; j < NEREUS_DECODE_TILE; ++j) {
        p[j] = j < n ? nereus_exp(p[j] - new_max) : 0.0f;
        sum += p[j];
      }
      scale_s[threadIdx.x] = nereus_exp(old_max - new_max);  // 0 on the first tile
      sum_s[threadIdx.x] = sum_s[threadIdx.x] * scale_s[threadIdx.x] + sum;
      max_s[threadIdx.x] = new_max;
    }
    __syncthreads();
    NEREUS_UNROLL
    for (int m = 0; m < NEREUS_DECODE_MAX_OUTPUTS / NEREUS_DECODE_THREADS; ++m) {
      const u64 e = m * NEREUS_DECODE_THREADS + threadIdx.x, r = e / d, c = e % d;
      if (e >= outputs) continue;
      float sum = 0.0f;
      for (u64 j = 0; j < n; ++j) sum += p_s[r * NEREUS_DECODE_TILE + j] * nereus_bf16_to_f32(v_s[j * d + c]);
      acc[m] = acc[m] * scale_s[r] + sum;
    }
  }
  __syncthreads();  // max_s and sum_s as the last tile left them
  if (out && splits == 1) {
    NEREUS_UNROLL
    for (int m = 0; m < NEREUS_DECODE_MAX_OUTPUTS / NEREUS_DECODE_THREADS; ++m) {
      const u64 e = m * NEREUS_DECODE_THREADS + threadIdx.x, r = e / d, c = e % d;
      if (e < outputs) out[(seq * heads + h0 + r) * d + c] = nereus_f32_to_bf16(sum_s[r] > 0.0f ? acc[m] / sum_s[r] : 0.0f);
    }
    if (threadIdx.x < group) {
      const float sum = sum_s[threadIdx.x];
      lse[seq * heads + h0 + threadIdx.x] = sum > 0.0f ? max_s[threadIdx.x] + nereus_log(sum) : neg_inf;
    }
    return;
  }
  NEREUS_UNROLL
  for (int m = 0; m < NEREUS_DECODE_MAX_OUTPUTS / NEREUS_DECODE_THREADS; ++m) {
    const u64 e = m * NEREUS_DECODE_THREADS + threadIdx.x, r = e / d, c = e % d;
    if (e < outputs) partial[((seq * heads + h0 + r) * splits + split) * d + c] = acc[m];
  }
  if (threadIdx.x < group) {
    float* st = stats + ((seq * heads + h0 + threadIdx.x) * splits + split) * 2;
    st[0] = max_s[threadIdx.x];
    st[1] = sum_s[threadIdx.x];
  }
}

// out[B, 1, H, D] (bf16) and lse[B, H] from the splits' partials: each split weighs by
// exp(max_s − max) and the sum is divided once. A query with no key (before its sequence's first)
// outputs zero with lse −inf, as the scalar kernel does. Grid (H, B), any block width.
NEREUS_KERNEL nereus_decode_attention_combine(bf16* __restrict__ out, float* __restrict__ lse,
                                              const float* __restrict__ partial, const float* __restrict__ stats,
                                              u64 b, u64 heads, u64 d, u64 splits) {
  const u64 h = blockIdx.x, seq = blockIdx.y;
  if (h >= heads || seq >= b) return;
  const float* st = stats + (seq * heads + h) * splits * 2;
  const float neg_inf = nereus_bits_to_f32(0xff800000u);
  float most = neg_inf;
  for (u64 s = 0; s < splits; ++s) most = fmaxf(most, st[2 * s]);
  float total = 0.0f;
  for (u64 s = 0; s < splits; ++s)
    if (st[2 * s + 1] > 0.0f) total += st[2 * s + 1] * nereus_exp(st[2 * s] - most);
  const float* part = partial + (seq * heads + h) * splits * d;
  for (u64 c = threadIdx.x; c < d; c += blockDim.x) {
    float sum = 0.0f;
    for (u64 s = 0; s < splits; ++s)
      if (st[2 * s + 1] > 0.0f) sum += part[s * d + c] * nereus_exp(st[2 * s] - most);
    out[(seq * heads + h) * d + c] = nereus_f32_to_bf16(total > 0.0f ? sum / total : 0.0f);
  }
  if (threadIdx.x == 0) lse[seq * heads + h] = total > 0.0f ? most + nereus_log(total) : neg_inf;
}

// Every entry point, for the grid emulator's table (crates/kernels/emulator/kernels.cpp).
#define NEREUS_DECODE_ATTENTION_KERNELS(X) X(nereus_decode_attention) X(nereus_decode_attention_combine)
