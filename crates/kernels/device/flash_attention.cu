// flash_attention.cu: causal grouped-query attention on tensor cores, forward and
// backward, after FlashAttention-2 (Dao, 2023): tiles of queries stay in registers, tiles of keys
// and values stream through shared memory, the softmax is computed online in f32 with the
// log-sum-exp trick, and the backward pass recomputes the probabilities from the forward's
// log-sum-exp, so no buffer of Tq × Tk exists anywhere. The matrix products are the prelude's
// warp-level multiply (`nereus_mma`: mma.sync on CUDA, MFMA on gfx90a, an exact emulation on the
// grid emulator). The scalar kernels in attention.cu define the semantics (and still serve heads
// wider than 128); docs/kernels.md ("Flash attention") has the tiling and the memory traffic.
//
// Legend as attention.cu: B sequences, Tq queries, Tk valid keys, Tc cache positions, H query
// heads, K key/value heads, G = H / K heads per group, D head width (padded to DP, a multiple of
// 16, inside a kernel). Query i sits at position Tk − Tq + i; sequence b's keys start at starts[b]
// (left padding; null means 0).
//
// Rows: a block works on one (sequence, key/value head g) and its M = Tq·G "rows", row m being
// query i = m / G of head g·G + m % G. The G heads that read one key/value head share every K/V
// tile a block loads (GQA without replicating K/V), and decoding (Tq = 1) still fills G rows.

#define NEREUS_FLASH_WARPS 4
#define NEREUS_FLASH_ROWS (16 * NEREUS_FLASH_WARPS)  // rows (or keys) a block owns: 16 per warp
#define NEREUS_FLASH_THREADS (NEREUS_FLASH_WARPS * NEREUS_WARP)

// The geometry of one launch (the scalar kernels' arguments; each fits 32 bits, which keeps the
// uniform registers few: offsets are computed in 64 bits).
struct NereusFlashShape {
  unsigned int b, tq, tk, tc, heads, kv_heads, d;
  __device__ u64 group() const { return heads / kv_heads; }
  __device__ u64 rows() const { return (u64)tq * group(); }
  // Element offset of row m's D-vector in q, out and their gradients ([B, Tq, H, D]).
  __device__ u64 row_offset(u64 seq, u64 g, u64 m) const {
    return ((seq * tq + m / group()) * heads + g * group() + m % group()) * d;
  }
  // Index of row m in lse and delta ([B, H, Tq]).
  __device__ u64 row_stat(u64 seq, u64 g, u64 m) const {
    return (seq * heads + g * group() + m % group()) * tq + m / group();
  }
  // Element offset of key j's D-vector in k and v ([B, Tc, K, D]).
  __device__ u64 key_offset(u64 seq, u64 g, u64 j) const { return ((seq * tc + j) * kv_heads + g) * d; }
  // Position of row m's query.
  __device__ u64 position(u64 m) const { return (u64)tk - tq + m / group(); }
};

// Copies `n` rows of DP columns into a shared tile `ld` elements apart: row r from src + offset(r),
// or zeros where offset(r) < 0 and in columns ≥ d. 16-byte vectors when every row allows them.
template <int DP, typename Offsets>
__device__ __forceinline__ void nereus_flash_stage(bf16* tile, int ld, int n, const bf16* src, u64 d, Offsets offset) {
  if (d % 8 == 0 && (u64)src % 16 == 0) {
    const int chunks = DP / 8;
    for (int idx = threadIdx.x; idx < n * chunks; idx += blockDim.x) {
      const int r = idx / chunks, c = (idx % chunks) * 8;
      const long long at = offset(r);
      NereusVec16 value = {{0u, 0u, 0u, 0u}};
      if (at >= 0 && (u64)c < d) value = *reinterpret_cast<const NereusVec16*>(src + at + c);
      *reinterpret_cast<NereusVec16*>(tile + r * ld + c) = value;
    }
  } else {
    for (int idx = threadIdx.x; idx < n * DP; idx += blockDim.x) {
      const int r = idx / DP, c = idx % DP;
      const long long at = offset(r);
      tile[r * ld + c] = at >= 0 && (u64)c < d ? src[at + c] : (bf16)0;
    }
  }
}

// The lane's A fragments of its warp's 16 rows of x (q or dout), KS = DP / 16 of them along D.
template <int KS>
__device__ __forceinline__ void nereus_flash_row_fragments(NereusMmaA (&frags)[KS], const bf16* x,
                                                           const NereusFlashShape& s, u64 seq, u64 g, u64 m0) {
  const int lane = threadIdx.x % NEREUS_WARP;
  NEREUS_UNROLL
  for (int ks = 0; ks < KS; ++ks)
    NEREUS_UNROLL
    for (int e = 0; e < NEREUS_MMA_REGS; ++e) {
      const u64 m = m0 + nereus_mma_a_row(lane, e), c = ks * 16 + nereus_mma_a_col(lane, e);
      frags[ks].x[e] = m < s.rows() && c < s.d ? x[s.row_offset(seq, g, m) + c] : (bf16)0;
    }
}

// acc[nt] (16 rows × 16 keys, NT of them) = rows · tileᵀ: the rows' A fragments against BC keys
// of a shared [key][DP] tile.
template <int KS, int NT, int LD>
__device__ __forceinline__ void nereus_flash_scores(NereusMmaC (&acc)[NT], const NereusMmaA (&rows)[KS], const bf16* tile) {
  NEREUS_UNROLL
  for (int nt = 0; nt < NT; ++nt) {
    nereus_mma_zero(acc[nt]);
    NEREUS_UNROLL
    for (int ks = 0; ks < KS; ++ks) {
      NereusMmaB kb;
      nereus_mma_load_b(kb, tile + nt * 16 * LD + ks * 16, 1, LD);
      nereus_mma(acc[nt], rows[ks], kb);
    }
  }
}

// acc[ot] (16 rows × 16 of DP) += p · tile: a warp's [16][PLD] operand in shared memory times a
// shared [KN][LD] tile (KN rows along the product's k).
template <int KN, int OT, int PLD, int LD>
__device__ __forceinline__ void nereus_flash_accumulate(NereusMmaC (&acc)[OT], const bf16* p, const bf16* tile) {
  NEREUS_UNROLL
  for (int ks = 0; ks < KN / 16; ++ks) {
    NereusMmaA pa;
    nereus_mma_load_a(pa, p + ks * 16, PLD, 1);
    NEREUS_UNROLL
    for (int ot = 0; ot < OT; ++ot) {
      NereusMmaB vb;
      nereus_mma_load_b(vb, tile + ks * 16 * LD + ot * 16, LD, 1);
      nereus_mma(acc[ot], pa, vb);
    }
  }
}

// Forward: out[B,Tq,H,D] (bf16), lse[B,H,Tq] (f32, −inf for a query before its sequence's start).
// Grid (⌈Tq·G / 64⌉, K, B), NEREUS_FLASH_WARPS warps; keys above the block's last query are
// never loaded (causal block skipping).
template <int DP, int BC>
__device__ __forceinline__ void nereus_flash_forward_impl(bf16* __restrict__ out, float* __restrict__ lse,
                                                          const bf16* __restrict__ q, const bf16* __restrict__ k,
                                                          const bf16* __restrict__ v, const int* __restrict__ starts,
                                                          const NereusFlashShape s) {
  constexpr int LD = DP + 8, PLD = BC + 8, KS = DP / 16, NT = BC / 16, OT = DP / 16;
  __shared__ __align__(16) bf16 k_tile[BC * LD];
  __shared__ __align__(16) bf16 v_tile[BC * LD];
  __shared__ __align__(16) bf16 p_tiles[NEREUS_FLASH_WARPS * 16 * PLD];
  const int lane = threadIdx.x % NEREUS_WARP, warp = threadIdx.x / NEREUS_WARP;
  const u64 seq = blockIdx.z, g = blockIdx.y, m0 = (u64)blockIdx.x * NEREUS_FLASH_ROWS, wm0 = m0 + 16 * warp;
  if (seq >= s.b || g >= s.kv_heads || m0 >= s.rows()) return;  // the whole block leaves together
  const u64 first = starts ? (u64)starts[seq] : 0;
  const u64 last = (m0 + NEREUS_FLASH_ROWS < s.rows() ? m0 + NEREUS_FLASH_ROWS : s.rows()) - 1;
  const float scale = nereus_rsqrt((float)s.d), neg_inf = nereus_bits_to_f32(0xff800000u);
  bf16* p_warp = p_tiles + warp * 16 * PLD;
  NereusMmaA qa[KS];
  nereus_flash_row_fragments<KS>(qa, q, s, seq, g, wm0);
  // The lane's rows of C: their query positions and the online softmax's state.
  u64 pos[NEREUS_MMA_ROWS];
  bool live[NEREUS_MMA_ROWS];
  float run_max[NEREUS_MMA_ROWS], run_sum[NEREUS_MMA_ROWS], base[NEREUS_MMA_ROWS];
  NEREUS_UNROLL
  for (int e = 0; e < NEREUS_MMA_REGS; ++e) {
    const u64 m = wm0 + nereus_mma_c_row(lane, e);
    live[nereus_mma_c_slot(e)] = m < s.rows();
    pos[nereus_mma_c_slot(e)] = m < s.rows() ? s.position(m) : 0;
  }
  NEREUS_UNROLL
  for (int r = 0; r < NEREUS_MMA_ROWS; ++r) run_max[r] = neg_inf, run_sum[r] = 0.0f;
  NereusMmaC o[OT];
  NEREUS_UNROLL
  for (int ot = 0; ot < OT; ++ot) nereus_mma_zero(o[ot]);
  for (u64 j0 = first - first % BC; j0 <= s.position(last); j0 += BC) {
    const auto key_rows = [&](int r) { return j0 + r < s.tc ? (long long)s.key_offset(seq, g, j0 + r) : -1ll; };
    nereus_flash_stage<DP>(k_tile, LD, BC, k, s.d, key_rows);
    nereus_flash_stage<DP>(v_tile, LD, BC, v, s.d, key_rows);
    __syncthreads();
    NereusMmaC sc[NT];
    nereus_flash_scores<KS, NT, LD>(sc, qa, k_tile);
    float tile_max[NEREUS_MMA_ROWS];
    NEREUS_UNROLL
    for (int r = 0; r < NEREUS_MMA_ROWS; ++r) tile_max[r] = neg_inf;
    NEREUS_UNROLL
    for (int nt = 0; nt < NT; ++nt)
      NEREUS_UNROLL
      for (int e = 0; e < NEREUS_MMA_REGS; ++e) {
        const int r = nereus_mma_c_slot(e);
        const u64 j = j0 + nt * 16 + nereus_mma_c_col(lane, e);
        const float x = live[r] && j >= first && j <= pos[r] ? sc[nt].x[e] * scale : neg_inf;
        sc[nt].x[e] = x;
        tile_max[r] = fmaxf(tile_max[r], x);
      }
    float correction[NEREUS_MMA_ROWS];
    NEREUS_UNROLL
    for (int r = 0; r < NEREUS_MMA_ROWS; ++r) {
      const float new_max = fmaxf(run_max[r], nereus_mma_row_max(tile_max[r]));
      base[r] = new_max == neg_inf ? 0.0f : new_max;  // a row with no key yet: exp(−inf − 0) = 0
      correction[r] = nereus_exp(run_max[r] - base[r]);
      run_max[r] = new_max;
      run_sum[r] *= correction[r];
    }
    NEREUS_UNROLL
    for (int nt = 0; nt < NT; ++nt)
      NEREUS_UNROLL
      for (int e = 0; e < NEREUS_MMA_REGS; ++e) {
        const int r = nereus_mma_c_slot(e);
        // The sum in f32 (the log-sum-exp the backward pass recomputes from stays exact to f32);
        // the product takes the probability rounded to bf16.
        const float p = nereus_exp(sc[nt].x[e] - base[r]);
        run_sum[r] += p;
        p_warp[nereus_mma_c_row(lane, e) * PLD + nt * 16 + nereus_mma_c_col(lane, e)] = nereus_f32_to_bf16(p);
      }
    NEREUS_UNROLL
    for (int ot = 0; ot < OT; ++ot)
      NEREUS_UNROLL
      for (int e = 0; e < NEREUS_MMA_REGS; ++e) o[ot].x[e] *= correction[nereus_mma_c_slot(e)];
    nereus_syncwarp();
    nereus_flash_accumulate<BC, OT, PLD, LD>(o, p_warp, v_tile);
    __syncthreads();  // the tiles are restaged by the next key tile
  }
  float total[NEREUS_MMA_ROWS];
  NEREUS_UNROLL
  for (int r = 0; r < NEREUS_MMA_ROWS; ++r) total[r] = nereus_mma_row_sum(run_sum[r]);
  NEREUS_UNROLL
  for (int ot = 0; ot < OT; ++ot)
    NEREUS_UNROLL
    for (int e = 0; e < NEREUS_MMA_REGS; ++e) {
      const int r = nereus_mma_c_slot(e);
      const u64 m = wm0 + nereus_mma_c_row(lane, e), c = ot * 16 + nereus_mma_c_col(lane, e);
      if (m < s.rows() && c < s.d)
        out[s.row_offset(seq, g, m) + c] = nereus_f32_to_bf16(total[r] > 0.0f ? o[ot].x[e] / total[r] : 0.0f);
    }
  NEREUS_UNROLL
  for (int e = 0; e < NEREUS_MMA_REGS; ++e) {
    const int r = nereus_mma_c_slot(e);
    const u64 m = wm0 + nereus_mma_c_row(lane, e);
    if (nereus_mma_c_col(lane, e) == 0 && m < s.rows())
      lse[s.row_stat(seq, g, m)] = total[r] > 0.0f ? run_max[r] + nereus_log(total[r]) : neg_inf;
  }
}

// Backward, first pass: dq[B,Tq,H,D] (bf16, written) and delta[B,H,Tq] = Σ_c dout·out (f32, for
// the second pass). Per row block, over its key tiles: p = exp(s − lse), ds = p·(dout·vᵀ − delta),
// dq = scale · ds · k. Grid and block as the forward.
template <int DP, int BC>
__device__ __forceinline__ void nereus_flash_backward_dq_impl(bf16* __restrict__ dq, float* __restrict__ delta,
                                                              const bf16* __restrict__ dout,
                                                              const bf16* __restrict__ out,
                                                              const float* __restrict__ lse,
                                                              const bf16* __restrict__ q, const bf16* __restrict__ k,
                                                              const bf16* __restrict__ v,
                                                              const int* __restrict__ starts,
                                                              const NereusFlashShape s) {
  constexpr int LD = DP + 8, PLD = BC + 8, KS = DP / 16, NT = BC / 16, OT = DP / 16;
  __shared__ __align__(16) bf16 k_tile[BC * LD];
  __shared__ __align__(16) bf16 v_tile[BC * LD];
  __shared__ __align__(16) bf16 ds_tiles[NEREUS_FLASH_WARPS * 16 * PLD];
  __shared__ float row_delta[NEREUS_FLASH_ROWS];
  const int lane = threadIdx.x % NEREUS_WARP, warp = threadIdx.x / NEREUS_WARP;
  const u64 seq = blockIdx.z, g = blockIdx.y, m0 = (u64)blockIdx.x * NEREUS_FLASH_ROWS, wm0 = m0 + 16 * warp;
  if (seq >= s.b || g >= s.kv_heads || m0 >= s.rows()) return;
  const u64 first = starts ? (u64)starts[seq] : 0;
  const u64 last = (m0 + NEREUS_FLASH_ROWS < s.rows() ? m0 + NEREUS_FLASH_ROWS : s.rows()) - 1;
  const float scale = nereus_rsqrt((float)s.d);
  bf16* ds_warp = ds_tiles + warp * 16 * PLD;
  // delta for the warp's 16 rows: a warp sum per row (a loop kept rolled: unrolled, its 16 rows'
  // uniform offsets overflow gfx90a's scalar registers).
  NEREUS_NO_UNROLL
  for (int r = 0; r < 16; ++r) {
    const u64 m = wm0 + r;
    float partial = 0.0f;
    if (m < s.rows())
      for (u64 c = lane; c < s.d; c += NEREUS_WARP) {
        const u64 at = s.row_offset(seq, g, m) + c;
        partial += nereus_bf16_to_f32(dout[at]) * nereus_bf16_to_f32(out[at]);
      }
    const float sum = nereus_warp_sum(partial);
    if (lane == 0) {
      row_delta[16 * warp + r] = sum;
      if (m < s.rows()) delta[s.row_stat(seq, g, m)] = sum;
    }
  }
  nereus_syncwarp();
  NereusMmaA qa[KS], da[KS];
  nereus_flash_row_fragments<KS>(qa, q, s, seq, g, wm0);
  nereus_flash_row_fragments<KS>(da, dout, s, seq, g, wm0);
  u64 pos[NEREUS_MMA_ROWS];
  bool live[NEREUS_MMA_ROWS];
  float row_lse[NEREUS_MMA_ROWS], row_d[NEREUS_MMA_ROWS];
  NEREUS_UNROLL
  for (int e = 0; e < NEREUS_MMA_REGS; ++e) {
    const int r = nereus_mma_c_slot(e);
    const u64 m = wm0 + nereus_mma_c_row(lane, e);
    live[r] = m < s.rows();
    pos[r] = live[r] ? s.position(m) : 0;
    row_lse[r] = live[r] ? lse[s.row_stat(seq, g, m)] : 0.0f;
    row_d[r] = row_delta[16 * warp + nereus_mma_c_row(lane, e)];
  }
  NereusMmaC acc[OT];
  NEREUS_UNROLL
  for (int ot = 0; ot < OT; ++ot) nereus_mma_zero(acc[ot]);
  for (u64 j0 = first - first % BC; j0 <= s.position(last); j0 += BC) {
    const auto key_rows = [&](int r) { return j0 + r < s.tc ? (long long)s.key_offset(seq, g, j0 + r) : -1ll; };
    nereus_flash_stage<DP>(k_tile, LD, BC, k, s.d, key_rows);
    nereus_flash_stage<DP>(v_tile, LD, BC, v, s.d, key_rows);
    __syncthreads();
    NereusMmaC sc[NT], dp[NT];
    nereus_flash_scores<KS, NT, LD>(sc, qa, k_tile);
    nereus_flash_scores<KS, NT, LD>(dp, da, v_tile);
    NEREUS_UNROLL
    for (int nt = 0; nt < NT; ++nt)
      NEREUS_UNROLL
      for (int e = 0; e < NEREUS_MMA_REGS; ++e) {
        const int r = nereus_mma_c_slot(e);
        const u64 j = j0 + nt * 16 + nereus_mma_c_col(lane, e);
        const bool valid = live[r] && j >= first && j <= pos[r];
        const float p = valid ? nereus_exp(sc[nt].x[e] * scale - row_lse[r]) : 0.0f;
        ds_warp[nereus_mma_c_row(lane, e) * PLD + nt * 16 + nereus_mma_c_col(lane, e)] =
            nereus_f32_to_bf16(p * (dp[nt].x[e] - row_d[r]));
      }
    nereus_syncwarp();
    nereus_flash_accumulate<BC, OT, PLD, LD>(acc, ds_warp, k_tile);
    __syncthreads();
  }
  NEREUS_UNROLL
  for (int ot = 0; ot < OT; ++ot)
    NEREUS_UNROLL
    for (int e = 0; e < NEREUS_MMA_REGS; ++e) {
      const u64 m = wm0 + nereus_mma_c_row(lane, e), c = ot * 16 + nereus_mma_c_col(lane, e);
      if (m < s.rows() && c < s.d) dq[s.row_offset(seq, g, m) + c] = nereus_f32_to_bf16(scale * acc[ot].x[e]);
    }
}

// Which row of a BR-row tile C element e of n-tile nt stands for (the products with keys as rows).
__device__ __forceinline__ int nereus_flash_row_in_tile(int lane, int e, int nt) { return nt * 16 + nereus_mma_c_col(lane, e); }

// Backward, second pass: dk and dv [B,Tc,K,D] (bf16, written for keys below Tk). A block owns 64
// keys of one (sequence, key/value head), 16 per warp, and walks the row tiles (BR rows, every
// head of the group) whose queries can see them: pᵀ = exp(k·qᵀ − lse), dsᵀ = pᵀ·(v·doutᵀ − delta),
// dv += pᵀ·dout and dk += scale · dsᵀ·q, accumulated in registers: no atomics, no f32 scratch.
// Grid (⌈Tk / 64⌉, K, B).
template <int DP, int BR>
__device__ __forceinline__ void nereus_flash_backward_dkv_impl(bf16* __restrict__ dk, bf16* __restrict__ dv,
                                                               const bf16* __restrict__ dout,
                                                               const float* __restrict__ lse,
                                                               const float* __restrict__ delta,
                                                               const bf16* __restrict__ q,
                                                               const bf16* __restrict__ k,
                                                               const bf16* __restrict__ v,
                                                               const int* __restrict__ starts,
                                                               const NereusFlashShape s) {
  constexpr int LD = DP + 8, SLD = BR + 8, KS = DP / 16, NT = BR / 16, OT = DP / 16;
  __shared__ __align__(16) bf16 k_tile[NEREUS_FLASH_ROWS * LD];
  __shared__ __align__(16) bf16 v_tile[NEREUS_FLASH_ROWS * LD];
  __shared__ __align__(16) bf16 q_tile[BR * LD];
  __shared__ __align__(16) bf16 do_tile[BR * LD];
  __shared__ __align__(16) bf16 s_tiles[NEREUS_FLASH_WARPS * 16 * SLD];
  __shared__ float tile_lse[BR], tile_delta[BR];
  const int lane = threadIdx.x % NEREUS_WARP, warp = threadIdx.x / NEREUS_WARP;
  const u64 seq = blockIdx.z, g = blockIdx.y, j0 = (u64)blockIdx.x * NEREUS_FLASH_ROWS;
  if (seq >= s.b || g >= s.kv_heads || j0 >= s.tk) return;
  const u64 first = starts ? (u64)starts[seq] : 0, shift = s.tk - s.tq, kw0 = 16 * warp;
  const float scale = nereus_rsqrt((float)s.d);
  bf16* s_warp = s_tiles + warp * 16 * SLD;
  const auto key_rows = [&](int r) { return j0 + r < s.tc ? (long long)s.key_offset(seq, g, j0 + r) : -1ll; };
  nereus_flash_stage<DP>(k_tile, LD, NEREUS_FLASH_ROWS, k, s.d, key_rows);
  nereus_flash_stage<DP>(v_tile, LD, NEREUS_FLASH_ROWS, v, s.d, key_rows);
  // The lane's keys (rows of C) and their reach.
  u64 key[NEREUS_MMA_ROWS];
  NEREUS_UNROLL
  for (int e = 0; e < NEREUS_MMA_REGS; ++e) key[nereus_mma_c_slot(e)] = j0 + kw0 + nereus_mma_c_row(lane, e);
  NereusMmaC dkc[OT], dvc[OT];
  NEREUS_UNROLL
  for (int ot = 0; ot < OT; ++ot) nereus_mma_zero(dkc[ot]), nereus_mma_zero(dvc[ot]);
  // The first query that sees key j0 (or the sequence's first, if later), as a row tile.
  const u64 lowest = j0 > first ? j0 : first;
  const u64 first_query = lowest > shift ? lowest - shift : 0;
  const u64 m_begin = first_query * s.group() - first_query * s.group() % BR;
  for (u64 mt = m_begin; mt < s.rows(); mt += BR) {
    const auto query_rows = [&](int r) { return mt + r < s.rows() ? (long long)s.row_offset(seq, g, mt + r) : -1ll; };
    nereus_flash_stage<DP>(q_tile, LD, BR, q, s.d, query_rows);
    nereus_flash_stage<DP>(do_tile, LD, BR, dout, s.d, query_rows);
    for (int r = threadIdx.x; r < BR; r += blockDim.x) {
      const bool row = mt + r < s.rows();
      tile_lse[r] = row ? lse[s.row_stat(seq, g, mt + r)] : 0.0f;
      tile_delta[r] = row ? delta[s.row_stat(seq, g, mt + r)] : 0.0f;
    }
    __syncthreads();
    NereusMmaC sc[NT], dp[NT];
    NEREUS_UNROLL
    for (int nt = 0; nt < NT; ++nt) {
      nereus_mma_zero(sc[nt]);
      nereus_mma_zero(dp[nt]);
      NEREUS_UNROLL
      for (int ks = 0; ks < KS; ++ks) {
        NereusMmaA ka, va;
        NereusMmaB qb, db;
        nereus_mma_load_a(ka, k_tile + kw0 * LD + ks * 16, LD, 1);
        nereus_mma_load_a(va, v_tile + kw0 * LD + ks * 16, LD, 1);
        nereus_mma_load_b(qb, q_tile + nt * 16 * LD + ks * 16, 1, LD);
        nereus_mma_load_b(db, do_tile + nt * 16 * LD + ks * 16, 1, LD);
        nereus_mma(sc[nt], ka, qb);
        nereus_mma(dp[nt], va, db);
      }
    }
    NEREUS_UNROLL
    for (int nt = 0; nt < NT; ++nt)
      NEREUS_UNROLL
      for (int e = 0; e < NEREUS_MMA_REGS; ++e) {
        const int r = nereus_flash_row_in_tile(lane, e, nt);
        const u64 m = mt + r, j = key[nereus_mma_c_slot(e)];
        const bool valid = m < s.rows() && j >= first && j <= s.position(m);
        const float p = valid ? nereus_exp(sc[nt].x[e] * scale - tile_lse[r]) : 0.0f;
        sc[nt].x[e] = p;
        dp[nt].x[e] = p * (dp[nt].x[e] - tile_delta[r]);
        s_warp[nereus_mma_c_row(lane, e) * SLD + r] = nereus_f32_to_bf16(p);
      }
    nereus_syncwarp();
    nereus_flash_accumulate<BR, OT, SLD, LD>(dvc, s_warp, do_tile);
    nereus_syncwarp();  // every lane has read pᵀ before dsᵀ overwrites it
    NEREUS_UNROLL
    for (int nt = 0; nt < NT; ++nt)
      NEREUS_UNROLL
      for (int e = 0; e < NEREUS_MMA_REGS; ++e)
        s_warp[nereus_mma_c_row(lane, e) * SLD + nereus_flash_row_in_tile(lane, e, nt)] = nereus_f32_to_bf16(dp[nt].x[e]);
    nereus_syncwarp();
    nereus_flash_accumulate<BR, OT, SLD, LD>(dkc, s_warp, q_tile);
    __syncthreads();  // the tiles are restaged by the next row tile
  }
  NEREUS_UNROLL
  for (int ot = 0; ot < OT; ++ot)
    NEREUS_UNROLL
    for (int e = 0; e < NEREUS_MMA_REGS; ++e) {
      const u64 j = key[nereus_mma_c_slot(e)], c = ot * 16 + nereus_mma_c_col(lane, e);
      if (j < s.tc && c < s.d) {
        dk[s.key_offset(seq, g, j) + c] = nereus_f32_to_bf16(scale * dkc[ot].x[e]);
        dv[s.key_offset(seq, g, j) + c] = nereus_f32_to_bf16(dvc[ot].x[e]);
      }
    }
}

__device__ __forceinline__ NereusFlashShape nereus_flash_shape(u64 b, u64 tq, u64 tk, u64 tc, u64 heads, u64 kv_heads,
                                                               u64 d) {
  return NereusFlashShape{(unsigned int)b,     (unsigned int)tq,       (unsigned int)tk, (unsigned int)tc,
                          (unsigned int)heads, (unsigned int)kv_heads, (unsigned int)d};
}

// One entry point per padded head width DP (heads of width D ≤ DP run in the narrowest that fits).
#define NEREUS_FLASH_ENTRY_POINTS(DP, BC_FORWARD, BC_DQ, BR_DKV)                                                \
  NEREUS_KERNEL NEREUS_LAUNCH_BOUNDS(NEREUS_FLASH_THREADS) nereus_flash_forward_##DP(bf16* __restrict__ out, float* __restrict__ lse,                         \
                                          const bf16* __restrict__ q, const bf16* __restrict__ k,                  \
                                          const bf16* __restrict__ v, const int* __restrict__ starts, u64 b,       \
                                          u64 tq, u64 tk, u64 tc, u64 heads, u64 kv_heads, u64 d) {                \
    nereus_flash_forward_impl<DP, BC_FORWARD>(out, lse, q, k, v, starts,                                           \
                                              nereus_flash_shape(b, tq, tk, tc, heads, kv_heads, d));               \
  }                                                                                                                \
  NEREUS_KERNEL NEREUS_LAUNCH_BOUNDS(NEREUS_FLASH_THREADS) nereus_flash_backward_dq_##DP(                                                                     \
      bf16* __restrict__ dq, float* __restrict__ delta, const bf16* __restrict__ dout, const bf16* __restrict__ out, \
      const float* __restrict__ lse, const bf16* __restrict__ q, const bf16* __restrict__ k,                      \
      const bf16* __restrict__ v, const int* __restrict__ starts, u64 b, u64 tq, u64 tk, u64 tc, u64 heads,      \
      u64 kv_heads, u64 d) {                                                                                       \
    nereus_flash_backward_dq_impl<DP, BC_DQ>(dq, delta, dout, out, lse, q, k, v, starts,                           \
                                             nereus_flash_shape(b, tq, tk, tc, heads, kv_heads, d));                \
  }                                                                                                                \
  NEREUS_KERNEL NEREUS_LAUNCH_BOUNDS(NEREUS_FLASH_THREADS) nereus_flash_backward_dkv_##DP(                                                                    \
      bf16* __restrict__ dk, bf16* __restrict__ dv, const bf16* __restrict__ dout, const float* __restrict__ lse,  \
      const float* __restrict__ delta, const bf16* __restrict__ q, const bf16* __restrict__ k,                    \
      const bf16* __restrict__ v, const int* __restrict__ starts, u64 b, u64 tq, u64 tk, u64 tc, u64 heads,      \
      u64 kv_heads, u64 d) {                                                                                       \
    nereus_flash_backward_dkv_impl<DP, BR_DKV>(dk, dv, dout, lse, delta, q, k, v, starts,                          \
                                               nereus_flash_shape(b, tq, tk, tc, heads, kv_heads, d));              \
  }

// Tiles per width, chosen so that each kernel's static shared memory stays under 48 KiB (every
// backend's limit without opt-in) and its accumulators in registers (docs/kernels.md).
NEREUS_FLASH_ENTRY_POINTS(32, 64, 64, 64)
NEREUS_FLASH_ENTRY_POINTS(64, 64, 64, 64)
NEREUS_FLASH_ENTRY_POINTS(128, 64, 32, 16)

// Every entry point, for the grid emulator's table (crates/kernels/emulator/kernels.cpp).
#define NEREUS_FLASH_KERNELS(X)                                                                               \
  X(nereus_flash_forward_32) X(nereus_flash_backward_dq_32) X(nereus_flash_backward_dkv_32)                   \
  X(nereus_flash_forward_64) X(nereus_flash_backward_dq_64) X(nereus_flash_backward_dkv_64)                   \
  X(nereus_flash_forward_128) X(nereus_flash_backward_dq_128) X(nereus_flash_backward_dkv_128)
