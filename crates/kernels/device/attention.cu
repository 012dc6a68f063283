// attention.cu: the KV-cache append and the scalar causal grouped-query attention, for heads
// wider than the flash kernels take (flash_attention.cu); bf16 in memory, f32 in registers. The
// CPU engine's op (crates/exec/src/engine/ops/attention.rs) defines the semantics; the f64
// references are in crates/bench/src/selftest/kernels/reference.rs.
//
// Legend: B sequences, Tq query positions, Tk valid key positions (Tk ≥ Tq), Tc positions per
// sequence in the K/V buffers (the KV cache's capacity, ≥ Tk), H query heads, K key/value heads
// (K divides H; query head h reads group h / (H/K)), D head width. Query i sits at position Tk − Tq + i, so one kernel serves
// training and prefill (Tq = Tk) and decoding against the cache (Tq = 1). Sequence b starts at
// key starts[b] (left padding): earlier keys are masked and a query before it outputs zero.

// Appends new[B, Tn, K, D] to the cache [B, Tc, K, D] at positions at..at+Tn of every sequence, where
// at = at + *position (position: a decode's row counter in device memory, or null).
NEREUS_KERNEL nereus_kv_append(bf16* __restrict__ cache, const bf16* __restrict__ fresh, u64 b, u64 tn, u64 tc,
                               u64 at, u64 kd, const int* __restrict__ position) {
  if (position) at += (u64)*position;
  NEREUS_GRID_STRIDE(i, b * tn * kd) {
    const u64 seq = i / (tn * kd), rest = i % (tn * kd);
    cache[(seq * tc + at) * kd + rest] = fresh[i];
  }
}

// The query row a block of the attention kernels owns: grid (Tq, H, B).
struct NereusQueryRow {
  u64 i, h, seq, g, pos, first;  // query, head, sequence, key/value group, position, first key
};

__device__ __forceinline__ NereusQueryRow nereus_query_row(const int* starts, u64 tq, u64 tk, u64 heads, u64 kv_heads) {
  const u64 i = blockIdx.x, h = blockIdx.y, seq = blockIdx.z;
  return NereusQueryRow{i, h, seq, h / (heads / kv_heads), tk - tq + i, starts ? (u64)starts[seq] : 0};
}

// Keys per tile: the block's threads each score one key of the tile.
#define NEREUS_KEY_TILE 128
#define NEREUS_MAX_HEAD_DIM 256

// Causal GQA attention forward with an online softmax (Milakov & Gimelshein 2018; Dao et al.
// 2022): one block per (query, head, sequence), blockDim.x = NEREUS_KEY_TILE threads; the scores
// of one key tile at a time live in shared memory, never the whole row and never Tq × Tk.
//   out[B,Tq,H,D] (bf16), lse[B,H,Tq] = log Σ_j exp(s_ij) (f32, −inf for a pad query; kept for
//   the backward pass)
NEREUS_KERNEL nereus_attention_forward(bf16* __restrict__ out, float* __restrict__ lse, const bf16* __restrict__ q,
                                       const bf16* __restrict__ k, const bf16* __restrict__ v,
                                       const int* __restrict__ starts, u64 b, u64 tq, u64 tk, u64 tc, u64 heads,
                                       u64 kv_heads, u64 d) {
  __shared__ float q_row[NEREUS_MAX_HEAD_DIM];
  __shared__ float p_tile[NEREUS_KEY_TILE];
  __shared__ float scratch[1024 / NEREUS_WARP];
  const NereusQueryRow at = nereus_query_row(starts, tq, tk, heads, kv_heads);
  if (at.i >= tq || at.h >= heads || at.seq >= b) return;  // a grid larger than the shape: the block leaves
  const u64 i = at.i, h = at.h, seq = at.seq, g = at.g, pos = at.pos, first = at.first;
  const float scale = nereus_rsqrt((float)d);
  bf16* o = out + ((seq * tq + i) * heads + h) * d;  // [D]
  for (u64 c = threadIdx.x; c < d; c += blockDim.x) q_row[c] = nereus_bf16_to_f32(q[((seq * tq + i) * heads + h) * d + c]);
  const float neg_inf = nereus_bits_to_f32(0xff800000u);
  float running_max = neg_inf, running_sum = 0.0f;
  float acc[NEREUS_MAX_HEAD_DIM / NEREUS_KEY_TILE];  // this thread's output channels c = threadIdx.x + m·blockDim.x
  for (int m = 0; m < NEREUS_MAX_HEAD_DIM / NEREUS_KEY_TILE; ++m) acc[m] = 0.0f;
  __syncthreads();
  for (u64 tile = first; tile <= pos; tile += NEREUS_KEY_TILE) {
    const u64 j = tile + threadIdx.x;
    float score = neg_inf;
    if (j <= pos) {
      const bf16* kj = k + ((seq * tc + j) * kv_heads + g) * d;  // [D]
      float dot = 0.0f;
      for (u64 c = 0; c < d; ++c) dot += q_row[c] * nereus_bf16_to_f32(kj[c]);
      score = dot * scale;
    }
    const float tile_max = nereus_block_reduce(score, scratch, true);
    const float new_max = fmaxf(running_max, tile_max);
    const float p = j <= pos ? nereus_exp(score - new_max) : 0.0f;
    const float correction = nereus_exp(running_max - new_max);  // 0 on the first tile
    running_sum = running_sum * correction + nereus_block_reduce(p, scratch, false);
    running_max = new_max;
    p_tile[threadIdx.x] = p;
    __syncthreads();
    const u64 keys = pos - tile + 1 < NEREUS_KEY_TILE ? pos - tile + 1 : NEREUS_KEY_TILE;
    for (int m = 0; m * blockDim.x + threadIdx.x < d; ++m) {
      const u64 c = m * blockDim.x + threadIdx.x;
      float sum = 0.0f;
      for (u64 jj = 0; jj < keys; ++jj) sum += p_tile[jj] * nereus_bf16_to_f32(v[((seq * tc + tile + jj) * kv_heads + g) * d + c]);
      acc[m] = acc[m] * correction + sum;
    }
    __syncthreads();  // p_tile is rewritten by the next tile
  }
  const bool pad = pos < first;
  for (int m = 0; m * blockDim.x + threadIdx.x < d; ++m)
    o[m * blockDim.x + threadIdx.x] = nereus_f32_to_bf16(pad ? 0.0f : acc[m] / running_sum);
  if (threadIdx.x == 0) lse[(seq * heads + h) * tq + i] = pad ? neg_inf : running_max + nereus_log(running_sum);
}

// Attention backward from the forward's lse (probabilities recomputed a tile at a time, as in
// FlashAttention's backward): one block per (query, head, sequence), blockDim.x = NEREUS_KEY_TILE.
//   δ_i = Σ_c dout·out;  p_ij = exp(s_ij − lse_i);  ds_ij = p_ij·(dout_i·v_j − δ_i)
//   dq_i = scale·Σ_j ds_ij·k_j (bf16);  dk_j += scale·ds_ij·q_i, dv_j += p_ij·dout_i (f32, atomically)
NEREUS_KERNEL nereus_attention_backward(bf16* __restrict__ dq, float* __restrict__ dk, float* __restrict__ dv,
                                        const bf16* __restrict__ dout, const bf16* __restrict__ out,
                                        const float* __restrict__ lse, const bf16* __restrict__ q,
                                        const bf16* __restrict__ k, const bf16* __restrict__ v,
                                        const int* __restrict__ starts, u64 b, u64 tq, u64 tk, u64 tc, u64 heads,
                                        u64 kv_heads, u64 d) {
  __shared__ float q_row[NEREUS_MAX_HEAD_DIM];
  __shared__ float do_row[NEREUS_MAX_HEAD_DIM];
  __shared__ float p_tile[NEREUS_KEY_TILE];
  __shared__ float ds_tile[NEREUS_KEY_TILE];
  __shared__ float scratch[1024 / NEREUS_WARP];
  const NereusQueryRow at = nereus_query_row(starts, tq, tk, heads, kv_heads);
  if (at.i >= tq || at.h >= heads || at.seq >= b) return;  // a grid larger than the shape: the block leaves
  const u64 i = at.i, h = at.h, seq = at.seq, g = at.g, pos = at.pos, first = at.first;
  const u64 row = ((seq * tq + i) * heads + h) * d;
  const float scale = nereus_rsqrt((float)d), row_lse = lse[(seq * heads + h) * tq + i];
  float delta = 0.0f;
  for (u64 c = threadIdx.x; c < d; c += blockDim.x) {
    q_row[c] = nereus_bf16_to_f32(q[row + c]);
    do_row[c] = nereus_bf16_to_f32(dout[row + c]);
    delta += do_row[c] * nereus_bf16_to_f32(out[row + c]);
  }
  delta = nereus_block_reduce(delta, scratch, false);  // also makes q_row and do_row visible
  float dq_acc[NEREUS_MAX_HEAD_DIM / NEREUS_KEY_TILE];
  for (int m = 0; m < NEREUS_MAX_HEAD_DIM / NEREUS_KEY_TILE; ++m) dq_acc[m] = 0.0f;
  for (u64 tile = first; pos >= first && tile <= pos; tile += NEREUS_KEY_TILE) {
    const u64 j = tile + threadIdx.x;
    float p = 0.0f, ds = 0.0f;
    if (j <= pos) {
      const bf16* kj = k + ((seq * tc + j) * kv_heads + g) * d;  // [D]
      const bf16* vj = v + ((seq * tc + j) * kv_heads + g) * d;  // [D]
      float dot = 0.0f, dp = 0.0f;
      for (u64 c = 0; c < d; ++c) {
        dot += q_row[c] * nereus_bf16_to_f32(kj[c]);
        dp += do_row[c] * nereus_bf16_to_f32(vj[c]);
      }
      p = nereus_exp(dot * scale - row_lse);
      ds = p * (dp - delta);
    }
    p_tile[threadIdx.x] = p;
    ds_tile[threadIdx.x] = ds;
    __syncthreads();
    const u64 keys = pos - tile + 1 < NEREUS_KEY_TILE ? pos - tile + 1 : NEREUS_KEY_TILE;
    for (int m = 0; m * blockDim.x + threadIdx.x < d; ++m) {
      const u64 c = m * blockDim.x + threadIdx.x;
      for (u64 jj = 0; jj < keys; ++jj) {
        const u64 at = ((seq * tc + tile + jj) * kv_heads + g) * d + c;
        dq_acc[m] += ds_tile[jj] * nereus_bf16_to_f32(k[at]);
        atomicAdd(&dk[at], scale * ds_tile[jj] * q_row[c]);
        atomicAdd(&dv[at], p_tile[jj] * do_row[c]);
      }
    }
    __syncthreads();
  }
  for (int m = 0; m * blockDim.x + threadIdx.x < d; ++m)
    dq[row + m * blockDim.x + threadIdx.x] = nereus_f32_to_bf16(scale * dq_acc[m]);
}

// Every entry point, for the grid emulator's table (crates/kernels/emulator/kernels.cpp).
#define NEREUS_ATTENTION_KERNELS(X) X(nereus_kv_append) X(nereus_attention_forward) X(nereus_attention_backward)
