// kernels/sample.cu: drawing the next token from one full-vocabulary row of f32 logits, exactly
// as the CPU engine's `sample_token` (crates/exec/src/engine/sampling.rs) defines it, without
// sorting the vocabulary:
//   p_i = exp((z_i − max) / T), so the most likely token has p = 1; in the order of p (ties by
//   lower id) the candidates are the longest prefix with p ≥ min_p and at most top_k entries (0
//   turns either cut off); the nucleus is the shortest prefix of the candidates whose mass
//   reaches top_p × theirs; the token is where the nucleus's cumulative mass, in that order,
//   first exceeds u·(nucleus mass).
// Every "where" question is answered by bisection over the bit patterns of positive floats
// (monotone in their value): 31 block-wide passes each, every pass a masked sum (or count) over
// the row. Within the level found, ties are resolved by id with a block scan. Greedy (or T ≤ 0)
// takes the lowest id at the maximum. u comes from the counter-based draws
// (`nereus_draw_uniform`, below: a token does not depend on the layout that produced the
// logits). Sums are f64 per thread and f32 trees across the block, so a draw within ~10⁻⁵ of a
// boundary may pick the neighbour the host's f64 sorted sums pick; the distribution is the same.
//
// Legend: R rows (sequences), V vocabulary. One block per row, blockDim.x a multiple of the warp.

struct NereusNucleus {
  float max, temperature;
};

// What a draw is told: the settings of the engine's `Sampling`.
struct NereusSampling {
  float temperature, top_p, min_p;
  u64 top_k;
  int greedy;
};

__device__ __forceinline__ float nereus_sample_p(const NereusNucleus& n, float z) {
  return nereus_exp((z - n.max) / n.temperature);
}

// Σ p_i over ids whose p lies in [lo, hi), over the block's row.
__device__ __forceinline__ float nereus_mass_between(const float* row, u64 v, const NereusNucleus& n, float lo, float hi,
                                                     float* scratch) {
  double s = 0.0;  // each thread's share in f64: a 128k vocabulary gives it 500 terms
  for (u64 c = threadIdx.x; c < v; c += blockDim.x) {
    const float p = nereus_sample_p(n, row[c]);
    if (p >= lo && p < hi) s += p;
  }
  return nereus_block_reduce((float)s, scratch, false);
}

// The largest positive float x with mass(p in [x, hi)) + below_hi ≥ target, by bisection on bits.
__device__ __forceinline__ float nereus_level(const float* row, u64 v, const NereusNucleus& n, float hi,
                                              float target, float* scratch) {
  unsigned int lo_bits = 0u, hi_bits = nereus_f32_to_bits(1.0f) + 1u;  // p ≤ 1 (the max has p = 1)
  while (hi_bits - lo_bits > 1u) {
    const unsigned int mid = lo_bits + (hi_bits - lo_bits) / 2u;
    if (nereus_mass_between(row, v, n, nereus_bits_to_f32(mid), hi, scratch) >= target) lo_bits = mid;
    else hi_bits = mid;
  }
  return nereus_bits_to_f32(lo_bits);
}

// The next float above a non-negative x.
__device__ __forceinline__ float nereus_next_up(float x) { return nereus_bits_to_f32(nereus_f32_to_bits(x) + 1u); }

// Whether column value z sits at `level`: by p (sampling) or by the raw logit (greedy, where
// exp(z − max) could round a near-maximum up to 1).
__device__ __forceinline__ bool nereus_at_level(const NereusNucleus& n, float z, float level, bool by_logit) {
  return by_logit ? z == level : nereus_sample_p(n, z) == level;
}

// The id of the `rank`-th (0-based) entry of the row at `level`, in id order (the last one when
// `rank` is past them, which float slack can cause); each thread scans a contiguous chunk and a
// block prefix over the chunk counts finds the owner. `counts` is shared, one per thread.
__device__ __forceinline__ int nereus_tied_id(const float* row, u64 v, const NereusNucleus& n, float level,
                                              unsigned int rank, bool by_logit, unsigned int* counts) {
  const u64 chunk = (v + blockDim.x - 1) / blockDim.x, begin = threadIdx.x * chunk;
  const u64 end = begin + chunk < v ? begin + chunk : v;
  unsigned int mine = 0;
  for (u64 c = begin; c < end; ++c) mine += nereus_at_level(n, row[c], level, by_logit);
  counts[threadIdx.x] = mine;
  __syncthreads();
  unsigned int before = 0, all = 0;
  for (unsigned int t = 0; t < blockDim.x; ++t) {
    before += t < threadIdx.x ? counts[t] : 0u;
    all += counts[t];
  }
  __syncthreads();  // counts is reused by the next call
  const unsigned int want = rank < all ? rank : all - 1u;
  int id = -1;
  if (want >= before && want < before + mine) {
    unsigned int seen = before;
    for (u64 c = begin; c < end && id < 0; ++c)
      if (nereus_at_level(n, row[c], level, by_logit) && seen++ == want) id = (int)c;
  }
  return id;  // only the owning thread holds it; the others hold −1
}

// The counter-based draw u ∈ [0, 1) of sequence `id` at position `pos` (the engine's
// `draw_uniform`, crates/exec/src/engine/sampling.rs): SplitMix64's finalizer chained over
// (seed, id, pos), its top 24 bits over 2^24, so f32 and the host's f64 hold the same value.
__device__ __forceinline__ u64 nereus_mix64(u64 z) {
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}
__device__ __forceinline__ float nereus_draw_uniform(u64 seed, u64 id, u64 pos) {
  const u64 bits = nereus_mix64(nereus_mix64(seed ^ nereus_mix64(id)) ^ pos);
  return (float)(bits >> 40) * (1.0f / 16777216.0f);
}

// Entries of the row whose p lies in [lo, ∞).
__device__ __forceinline__ float nereus_count_from(const float* row, u64 v, const NereusNucleus& n, float lo,
                                                   float* scratch) {
  float count = 0.0f;  // exact: a row has fewer than 2^24 entries
  for (u64 c = threadIdx.x; c < v; c += blockDim.x) count += nereus_sample_p(n, row[c]) >= lo ? 1.0f : 0.0f;
  return nereus_block_reduce(count, scratch, false);
}

// The largest positive float x with at least `k` entries at p ≥ x, by bisection on bits.
__device__ __forceinline__ float nereus_count_level(const float* row, u64 v, const NereusNucleus& n, float k,
                                                    float* scratch) {
  unsigned int lo_bits = 0u, hi_bits = nereus_f32_to_bits(1.0f) + 1u;
  while (hi_bits - lo_bits > 1u) {
    const unsigned int mid = lo_bits + (hi_bits - lo_bits) / 2u;
    if (nereus_count_from(row, v, n, nereus_bits_to_f32(mid), scratch) >= k) lo_bits = mid;
    else hi_bits = mid;
  }
  return nereus_bits_to_f32(lo_bits);
}

// A prefix of the row in the order of p: every entry above `level`, and the first `ties` (by id)
// of those at it; `above` is the mass above the level.
struct NereusPrefix {
  float level, ties, above;
  __device__ __forceinline__ float mass() const { return above + ties * level; }
};

// The candidates min_p and top_k leave (the whole row when both are off).
__device__ __forceinline__ NereusPrefix nereus_candidates(const float* row, u64 v, const NereusNucleus& n,
                                                          float min_p, u64 top_k, float* scratch) {
  // min_p's cut: every entry at p ≥ min_p (all of them for min_p = 0), ties included.
  float lowest = 2.0f;
  for (u64 c = threadIdx.x; c < v; c += blockDim.x) {
    const float p = nereus_sample_p(n, row[c]);
    if (p >= min_p) lowest = fminf(lowest, p);
  }
  lowest = -nereus_block_reduce(-lowest, scratch, true);
  const float kept = nereus_count_from(row, v, n, lowest, scratch);
  const float inf = nereus_bits_to_f32(0x7f800000u);
  if (top_k > 0 && (float)top_k < kept) {
    const float level = nereus_count_level(row, v, n, (float)top_k, scratch);
    const float above = nereus_mass_between(row, v, n, nereus_next_up(level), inf, scratch);
    const float ties = (float)top_k - nereus_count_from(row, v, n, nereus_next_up(level), scratch);
    return {level, ties, above};
  }
  const float above = nereus_mass_between(row, v, n, nereus_next_up(lowest), inf, scratch);
  return {lowest, kept - nereus_count_from(row, v, n, nereus_next_up(lowest), scratch), above};
}

// The nucleus: the shortest prefix of the candidates whose mass reaches top_p × theirs.
__device__ __forceinline__ NereusPrefix nereus_nucleus(const float* row, u64 v, const NereusNucleus& n,
                                                       const NereusPrefix& candidates, float top_p, float* scratch) {
  const float inf = nereus_bits_to_f32(0x7f800000u);
  const float want = top_p * candidates.mass();
  const float tau = nereus_level(row, v, n, inf, want, scratch);
  if (tau <= candidates.level) {
    // The mass runs out at the candidates' last level: take the ties it still needs there.
    const NereusPrefix& c = candidates;
    const float k = c.level > 0.0f ? fminf(fmaxf(ceilf((want - c.above) / c.level), 1.0f), c.ties) : c.ties;
    return {c.level, k, c.above};
  }
  const float above_tau = nereus_mass_between(row, v, n, nereus_next_up(tau), inf, scratch);
  // k = the ties at tau the mass still needs, at least one and at most all of them (rounding
  // in want − above_tau must not take in a token that is not there).
  float ties = 0.0f;
  for (u64 c = threadIdx.x; c < v; c += blockDim.x) ties += nereus_sample_p(n, row[c]) == tau ? 1.0f : 0.0f;
  ties = nereus_block_reduce(ties, scratch, false);
  const float k = tau > 0.0f ? fminf(fmaxf(ceilf((want - above_tau) / tau), 1.0f), ties) : 1.0f;
  return {tau, k, above_tau};
}

// The draw of one row with uniform u; every thread of the block returns it.
__device__ __forceinline__ int nereus_draw_row(const float* row, u64 v, const NereusSampling& s, float u,
                                               float* scratch, unsigned int* counts, int* chosen) {
  const float inf = nereus_bits_to_f32(0x7f800000u);
  if (threadIdx.x == 0) *chosen = 0;  // ordered before the owner's write by the reductions' barriers
  float m = nereus_bits_to_f32(0xff800000u);
  for (u64 c = threadIdx.x; c < v; c += blockDim.x) m = fmaxf(m, row[c]);
  m = nereus_block_reduce(m, scratch, true);
  const NereusNucleus n = {m, s.temperature > 0.0f ? s.temperature : 1.0f};
  int id;
  if (s.greedy || s.temperature <= 0.0f) {
    id = nereus_tied_id(row, v, n, m, 0u, true, counts);
  } else {
    const NereusPrefix candidates = nereus_candidates(row, v, n, s.min_p, s.top_k, scratch);
    const NereusPrefix kept = nereus_nucleus(row, v, n, candidates, s.top_p, scratch);
    // Invert the nucleus's cumulative mass at u·kept: the first level whose cumulative mass
    // exceeds the target (≥ the next float up), never below the nucleus's; then the tie within it.
    const float target = u * kept.mass();
    const float sigma = fmaxf(nereus_level(row, v, n, inf, nereus_next_up(target), scratch), kept.level);
    const float above_sigma = nereus_mass_between(row, v, n, nereus_next_up(sigma), inf, scratch);
    float j = sigma > 0.0f ? fmaxf(floorf((target - above_sigma) / sigma), 0.0f) : 0.0f;
    if (sigma == kept.level) j = fminf(j, kept.ties - 1.0f);
    id = nereus_tied_id(row, v, n, sigma, (unsigned int)j, false, counts);
  }
  if (id >= 0) *chosen = id;
  __syncthreads();
  id = *chosen;
  __syncthreads();  // the next row reuses the shared scratch
  return id;
}

// drawn[R]: the draw for each row of logits[R, V], sequence ids[r] at position pos + *position
// (position: a decode's row counter in device memory, or null; the draws of
// `nereus_draw_uniform`, so a draw depends on neither the layout nor the batch). Rows whose
// done[r] is set (sequences that have ended; done may be null) are not drawn.
NEREUS_KERNEL nereus_sample(int* __restrict__ drawn, const float* __restrict__ logits, const u64* __restrict__ ids,
                            const int* __restrict__ done, u64 rows, u64 v, u64 seed, u64 pos, float temperature,
                            float top_p, float min_p, u64 top_k, int greedy, const int* __restrict__ position) {
  if (position) pos += (u64)*position;
  __shared__ float scratch[1024 / NEREUS_WARP];
  __shared__ unsigned int counts[1024];
  __shared__ int chosen;
  const NereusSampling s = {temperature, top_p, min_p, top_k, greedy};
  NEREUS_ROWS(r, rows) {
    if (done && done[r]) continue;  // the same for the whole block: no barrier is skipped by part of it
    const float u = nereus_draw_uniform(seed, ids[r], pos);
    const int id = nereus_draw_row(logits + r * v, v, s, u, scratch, counts, &chosen);
    if (threadIdx.x == 0) drawn[r] = id;
  }
}

// One decode step's bookkeeping, sequence r per thread: an unfinished sequence takes drawn[r]
// at position pos + *position of tokens[B, Tc], its length grows, and it ends at a stop id
// (stops[S]) or at the last position; a finished one holds `eos` there. last[r] is what the next
// step embeds. With a row counter (position, not null) the step then advances it by one: the
// launch is then one block, so that every thread has read it before thread 0 moves it.
NEREUS_KERNEL nereus_decode_advance(int* __restrict__ tokens, int* __restrict__ lengths, int* __restrict__ done,
                                    int* __restrict__ last, const int* __restrict__ drawn,
                                    const int* __restrict__ stops, u64 rows, u64 t_cap, u64 pos, u64 n_stops,
                                    int eos, int* __restrict__ position) {
  // With a row counter the launch must be one block (see above): another would race its move.
  if (position && gridDim.x * gridDim.y * gridDim.z != 1) return;
  if (position) pos += (u64)*position;
  NEREUS_GRID_STRIDE(r, rows) {
    int token = eos;
    if (!done[r]) {
      token = drawn[r];
      lengths[r] += 1;
      bool stop = pos + 1 >= t_cap;
      for (u64 s = 0; s < n_stops; ++s) stop = stop || token == stops[s];
      done[r] = stop ? 1 : 0;
    }
    tokens[r * t_cap + pos] = token;
    last[r] = token;
  }
  if (position) {  // the same for the whole block: no barrier is skipped by part of it
    __syncthreads();
    if (threadIdx.x == 0) *position += 1;
  }
}

// Every entry point, for the grid emulator's table (crates/kernels/emulator/kernels.cpp).
#define NEREUS_SAMPLE_KERNELS(X) X(nereus_sample) X(nereus_decode_advance)
