// kernels/sample.cu: drawing the next token from one full-vocabulary row of logits (f32, or the
// decode's bf16 read as they are), exactly as the CPU engine's `sample_token`
// (crates/exec/src/engine/sampling.rs) defines it, without sorting the vocabulary:
//   p_i = exp((z_i − max) / T), so the most likely token has p = 1; in the order of p (ties by
//   lower id) the candidates are the longest prefix with p ≥ min_p and at most top_k entries (0
//   turns either cut off); the nucleus is the shortest prefix of the candidates whose mass
//   reaches top_p × theirs; the token is where the nucleus's cumulative mass, in that order,
//   first exceeds u·(nucleus mass).
// A row is read three times in the common case (the histogram path, below): its maximum, a
// histogram of p that places every cut in a bucket, and one gather of the buckets the cuts fall
// in, sorted in shared memory. Rows whose cuts need a bucket too full to sort fall back to
// bisection over the bit patterns of positive floats (monotone in their value: 31 block-wide
// passes per cut). Greedy (or T ≤ 0) takes the lowest id at the maximum. u comes from the
// counter-based draws (`nereus_draw_uniform`, below: a token does not depend on the layout that
// produced the logits). The histogram's masses are fixed-point sums and the bisection's f64 per
// thread and f32 across the block, so a draw within ~10⁻⁵ of a boundary may pick the neighbour
// the host's f64 sorted sums pick; the distribution is the same.
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

// One row of logits, f32 or bf16 (the decode's own, read without a widening pass first).
struct NereusRow {
  const void* base;
  int is_bf16;
  __device__ __forceinline__ float operator[](u64 c) const {
    return is_bf16 ? nereus_bf16_to_f32(static_cast<const bf16*>(base)[c]) : static_cast<const float*>(base)[c];
  }
};

// The largest logit of the row; every thread of the block returns it.
__device__ __forceinline__ float nereus_row_max(NereusRow row, u64 v, float* scratch) {
  float m = nereus_bits_to_f32(0xff800000u);
  for (u64 c = threadIdx.x; c < v; c += blockDim.x) m = fmaxf(m, row[c]);
  return nereus_block_reduce(m, scratch, true);
}

__device__ __forceinline__ float nereus_sample_p(const NereusNucleus& n, float z) {
  return nereus_exp((z - n.max) / n.temperature);
}

// Σ p_i over ids whose p lies in [lo, hi), over the block's row.
__device__ __forceinline__ float nereus_mass_between(NereusRow row, u64 v, const NereusNucleus& n, float lo, float hi,
                                                     float* scratch) {
  double s = 0.0;  // each thread's share in f64: a 128k vocabulary gives it 500 terms
  for (u64 c = threadIdx.x; c < v; c += blockDim.x) {
    const float p = nereus_sample_p(n, row[c]);
    if (p >= lo && p < hi) s += p;
  }
  return nereus_block_reduce((float)s, scratch, false);
}

// The largest positive float x with mass(p in [x, hi)) + below_hi ≥ target, by bisection on bits.
__device__ __forceinline__ float nereus_level(NereusRow row, u64 v, const NereusNucleus& n, float hi,
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
__device__ __forceinline__ int nereus_tied_id(NereusRow row, u64 v, const NereusNucleus& n, float level,
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
__device__ __forceinline__ float nereus_count_from(NereusRow row, u64 v, const NereusNucleus& n, float lo,
                                                   float* scratch) {
  float count = 0.0f;  // exact: a row has fewer than 2^24 entries
  for (u64 c = threadIdx.x; c < v; c += blockDim.x) count += nereus_sample_p(n, row[c]) >= lo ? 1.0f : 0.0f;
  return nereus_block_reduce(count, scratch, false);
}

// The largest positive float x with at least `k` entries at p ≥ x, by bisection on bits.
__device__ __forceinline__ float nereus_count_level(NereusRow row, u64 v, const NereusNucleus& n, float k,
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
__device__ __forceinline__ NereusPrefix nereus_candidates(NereusRow row, u64 v, const NereusNucleus& n,
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
__device__ __forceinline__ NereusPrefix nereus_nucleus(NereusRow row, u64 v, const NereusNucleus& n,
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

// The draw of one row with uniform u by bisection (about 65–100 passes over the row): the
// histogram path's fallback when a bucket it must sort holds more entries than its buffer.
// Every thread of the block returns it.
__device__ __forceinline__ int nereus_draw_row_bisect(NereusRow row, u64 v, const NereusSampling& s, float u,
                                               float* scratch, unsigned int* counts, int* chosen) {
  const float inf = nereus_bits_to_f32(0x7f800000u);
  if (threadIdx.x == 0) *chosen = 0;  // ordered before the owner's write by the reductions' barriers
  const float m = nereus_row_max(row, v, scratch);
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

// ---- The histogram path: three passes over the row in the common case ----------------------
// Pass 1 finds the maximum (p is relative to it). Pass 2 counts the row into buckets of p
// (nereus_sample_bucket: bucket 0 holds p = 1, the maximum and its ties; 1,023 buckets of 1/32
// octave below it down to about 2^-32; 33 of 1/4 octave down to 2^-40; the last holds p < 2^-40,
// whose fixed-point mass is 0), each with its entries' count and mass, the mass in fixed point
// (p·2^40 rounded down, integer atomics: the sums do not depend on the threads' order, so a
// draw is reproducible), and the min-p candidates' count and mass. Inclusive prefix sums over
// the buckets then say in which bucket each cut falls: the top-k candidates (by count), the
// nucleus (by mass) and the draw (by mass). Pass 3 gathers the entries of the buckets those cuts
// need (a window of adjacent buckets) into shared memory, sorts them by (p desc, id asc) — the
// host's order — and resolves every cut inside the window exactly. A window that would not fit
// is narrowed to the bucket one cut needs (a pass per cut); a top-k cut among the massless
// entries needs no gather (their order moves no mass); a single bucket that holds more than
// NEREUS_SAMPLE_GATHER entries (a nearly flat row: thousands of logits within 0.02·T of each
// other) falls back to bisection.
#define NEREUS_SAMPLE_FINE 1024    // buckets of 1/32 octave from p = 1 down
#define NEREUS_SAMPLE_COARSE 33    // buckets of 1/4 octave from 2^-32 to 2^-40
#define NEREUS_SAMPLE_BUCKETS (NEREUS_SAMPLE_FINE + NEREUS_SAMPLE_COARSE + 1)
#define NEREUS_SAMPLE_MASSLESS (NEREUS_SAMPLE_BUCKETS - 1)
#define NEREUS_SAMPLE_GATHER 2048

// What the histogram path keeps in shared memory (about 46 KB of the 48 KB a block may hold).
struct NereusSampleShared {
  unsigned int count[NEREUS_SAMPLE_BUCKETS];  // then: entries in buckets 0..b
  u64 mass[NEREUS_SAMPLE_BUCKETS];            // then: fixed-point mass of buckets 0..b
  u64 keys[NEREUS_SAMPLE_GATHER];             // the window's entries, (p bits, ~id), sorted descending
  u64 prefix[NEREUS_SAMPLE_GATHER];           // fixed-point mass of the window's first j + 1 entries
  u64 lanes[64];                              // the prefix sums' per-lane totals
  float scratch[1024 / NEREUS_WARP];
  u64 min_p_mass;
  unsigned int min_p_count, gathered, window_lo, window_hi;
  int chosen;
};

// The bucket of probability p ∈ [0, 1], monotone (a smaller p never has a smaller bucket): the
// fine buckets by the top 5 mantissa bits, then the coarse ones by the top 2, then
// NEREUS_SAMPLE_MASSLESS for p < 2^-40 (and NaN).
__device__ __forceinline__ unsigned int nereus_sample_bucket(float p) {
  const unsigned int bits = nereus_f32_to_bits(p);
  const unsigned int fine = (nereus_f32_to_bits(1.0f) >> 18) - (bits >> 18);
  if (fine < NEREUS_SAMPLE_FINE) return fine;
  const unsigned int coarse = (nereus_f32_to_bits(2.3283064365386963e-10f) >> 21) - (bits >> 21);  // from 2^-32
  return coarse < NEREUS_SAMPLE_COARSE ? NEREUS_SAMPLE_FINE + coarse : NEREUS_SAMPLE_MASSLESS;
}

// p in fixed point: p·2^40 rounded down (exact for p ≥ 2^-16; 0 below 2^-40 and for NaN).
__device__ __forceinline__ u64 nereus_sample_fixed(float p) { return p == p ? (u64)(p * 1099511627776.0f) : 0u; }

// A gathered entry's sort key: larger p first, then lower id.
__device__ __forceinline__ u64 nereus_sample_key(float p, u64 id) {
  return ((u64)nereus_f32_to_bits(p) << 32) | (u64)(0xffffffffu - (unsigned int)id);
}

// In-place inclusive prefix sums of a[0..n) in shared memory, by the first warp (each lane a
// contiguous run; `lanes` holds their totals). Every thread of the block must call it.
template <typename T>
__device__ __forceinline__ void nereus_prefix_sums(T* a, unsigned int n, u64* lanes) {
  const unsigned int lane = threadIdx.x, per = (n + NEREUS_WARP - 1) / NEREUS_WARP;
  const unsigned int begin = lane * per < n ? lane * per : n, end = begin + per < n ? begin + per : n;
  __syncthreads();
  if (threadIdx.x < NEREUS_WARP) {
    u64 total = 0;
    for (unsigned int i = begin; i < end; ++i) total += a[i];
    lanes[lane] = total;
  }
  __syncthreads();
  if (threadIdx.x < NEREUS_WARP) {
    u64 run = 0;
    for (unsigned int t = 0; t < lane; ++t) run += lanes[t];
    for (unsigned int i = begin; i < end; ++i) {
      run += a[i];
      a[i] = (T)run;
    }
  }
  __syncthreads();
}

// Passes 1 and 2: the maximum, then the buckets' counts and masses as prefix sums, and the
// min-p candidates'. Every thread returns the maximum.
__device__ __forceinline__ float nereus_sample_histogram(NereusRow row, u64 v, float temperature, float min_p,
                                                         NereusSampleShared& sh) {
  const float m = nereus_row_max(row, v, sh.scratch);
  for (unsigned int b = threadIdx.x; b < NEREUS_SAMPLE_BUCKETS; b += blockDim.x) sh.count[b] = 0u, sh.mass[b] = 0u;
  if (threadIdx.x == 0) sh.min_p_count = 0u, sh.min_p_mass = 0u, sh.window_lo = 1u, sh.window_hi = 0u;
  __syncthreads();
  const NereusNucleus n = {m, temperature};
  unsigned int kept = 0, massless = 0;
  u64 kept_mass = 0;
  for (u64 c = threadIdx.x; c < v; c += blockDim.x) {
    const float p = nereus_sample_p(n, row[c]);
    const unsigned int b = nereus_sample_bucket(p);
    const u64 fixed = nereus_sample_fixed(p);
    if (b == NEREUS_SAMPLE_MASSLESS) {
      massless += 1u;  // most of a peaked row: counted per thread, not on one contended address
    } else {
      atomicAdd(&sh.count[b], 1u);
      atomicAdd(&sh.mass[b], fixed);
    }
    if (p >= min_p) kept += 1u, kept_mass += fixed;
  }
  atomicAdd(&sh.count[NEREUS_SAMPLE_MASSLESS], massless);
  atomicAdd(&sh.min_p_count, kept);
  atomicAdd(&sh.min_p_mass, kept_mass);
  nereus_prefix_sums(sh.count, NEREUS_SAMPLE_BUCKETS, sh.lanes);
  nereus_prefix_sums(sh.mass, NEREUS_SAMPLE_BUCKETS, sh.lanes);
  return m;
}

// Entries (or mass) in the buckets before b.
__device__ __forceinline__ unsigned int nereus_count_before(const NereusSampleShared& sh, unsigned int b) {
  return b ? sh.count[b - 1] : 0u;
}
__device__ __forceinline__ u64 nereus_mass_before(const NereusSampleShared& sh, unsigned int b) {
  return b ? sh.mass[b - 1] : 0u;
}

// The first bucket whose prefix holds at least k entries (k ≥ 1, at most the row).
__device__ __forceinline__ unsigned int nereus_bucket_of_rank(const NereusSampleShared& sh, unsigned int k) {
  unsigned int lo = 0, hi = NEREUS_SAMPLE_BUCKETS - 1;
  while (lo < hi) {
    const unsigned int mid = (lo + hi) / 2;
    if (sh.count[mid] >= k) hi = mid;
    else lo = mid + 1;
  }
  return lo;
}

// The first non-empty bucket whose prefix mass reaches `target` (strictly exceeds it when
// `strict`); the last bucket when none does (float slack).
__device__ __forceinline__ unsigned int nereus_bucket_of_mass(const NereusSampleShared& sh, u64 target, bool strict) {
  unsigned int lo = 0, hi = NEREUS_SAMPLE_BUCKETS - 1;
  while (lo < hi) {
    const unsigned int mid = (lo + hi) / 2;
    if (sh.count[mid] > 0u && (strict ? sh.mass[mid] > target : sh.mass[mid] >= target)) hi = mid;
    else lo = mid + 1;
  }
  return lo;
}

// Pass 3: gathers the entries of buckets [lo, hi] (at most NEREUS_SAMPLE_GATHER), sorts them
// into the host's order (bitonic, in shared memory) and sums their masses.
__device__ __forceinline__ void nereus_sample_gather(NereusRow row, u64 v, const NereusNucleus& n, unsigned int lo,
                                                     unsigned int hi, NereusSampleShared& sh) {
  __syncthreads();  // every thread is done reading the previous window
  if (threadIdx.x == 0) sh.gathered = 0u, sh.window_lo = lo, sh.window_hi = hi;
  __syncthreads();
  for (u64 c = threadIdx.x; c < v; c += blockDim.x) {
    const float p = nereus_sample_p(n, row[c]);
    const unsigned int b = nereus_sample_bucket(p);
    if (b >= lo && b <= hi) sh.keys[atomicAdd(&sh.gathered, 1u)] = nereus_sample_key(p, c);
  }
  __syncthreads();
  const unsigned int count = sh.gathered;
  unsigned int width = 1;
  while (width < count) width *= 2;
  for (unsigned int i = count + threadIdx.x; i < width; i += blockDim.x) sh.keys[i] = 0u;  // below every entry
  for (unsigned int k = 2; k <= width; k *= 2) {
    for (unsigned int j = k / 2; j > 0; j /= 2) {
      __syncthreads();
      for (unsigned int i = threadIdx.x; i < width; i += blockDim.x) {
        const unsigned int partner = i ^ j;
        if (partner <= i) continue;
        const u64 a = sh.keys[i], b = sh.keys[partner];
        if ((i & k) == 0 ? a < b : a > b) sh.keys[i] = b, sh.keys[partner] = a;  // descending runs first
      }
    }
  }
  __syncthreads();
  for (unsigned int i = threadIdx.x; i < count; i += blockDim.x)
    sh.prefix[i] = nereus_sample_fixed(nereus_bits_to_f32((unsigned int)(sh.keys[i] >> 32)));
  nereus_prefix_sums(sh.prefix, count, sh.lanes);
}

// Makes sure the window holds bucket b, gathering [from, b] when that fits (a window that
// also serves the cuts still to come), else [b, b]. False when b alone does not fit.
__device__ __forceinline__ bool nereus_sample_window(NereusRow row, u64 v, const NereusNucleus& n, unsigned int b,
                                                     unsigned int from, NereusSampleShared& sh) {
  if (sh.window_lo <= b && b <= sh.window_hi) return true;
  const unsigned int upto = sh.count[b];
  if (upto - nereus_count_before(sh, b) > NEREUS_SAMPLE_GATHER) return false;
  if (from > b || upto - nereus_count_before(sh, from) > NEREUS_SAMPLE_GATHER) from = b;
  nereus_sample_gather(row, v, n, from, b, sh);
  return true;
}

// The mass of the first k entries (k ≥ 1; its bucket in the window).
__device__ __forceinline__ u64 nereus_mass_of_first(const NereusSampleShared& sh, unsigned int k) {
  const unsigned int lo = sh.window_lo;
  return nereus_mass_before(sh, lo) + sh.prefix[k - nereus_count_before(sh, lo) - 1];
}

// The number of leading entries whose mass first reaches `target` (exceeds it when `strict`),
// within the window (the bucket where it happens is in it).
__device__ __forceinline__ unsigned int nereus_rank_of_mass(const NereusSampleShared& sh, u64 target, bool strict) {
  const unsigned int lo = sh.window_lo;
  const u64 before = nereus_mass_before(sh, lo);
  unsigned int a = 0, b = sh.gathered > 0u ? sh.gathered - 1 : 0u;
  while (a < b) {
    const unsigned int mid = (a + b) / 2;
    const u64 mass = before + sh.prefix[mid];
    if (strict ? mass > target : mass >= target) b = mid;
    else a = mid + 1;
  }
  return nereus_count_before(sh, lo) + a + 1;
}

// The highest bucket the draw can land in once a cut is known to fall in bucket b: the draw's
// target is at least u·top_p times the mass above b. A window from there down to b usually
// serves every cut with one gather.
__device__ __forceinline__ unsigned int nereus_draw_reach(const NereusSampleShared& sh, unsigned int b, float u,
                                                          float top_p) {
  return nereus_bucket_of_mass(sh, (u64)((double)u * top_p * (double)nereus_mass_before(sh, b)), true);
}

// The draw of one row with uniform u, sampling (not greedy); -1 when a bucket is too full for
// the window (the caller then bisects). Every thread of the block returns it.
__device__ __forceinline__ int nereus_draw_sampled(NereusRow row, u64 v, const NereusSampling& s, float u,
                                                   NereusSampleShared& sh) {
  const float m = nereus_sample_histogram(row, v, s.temperature, s.min_p, sh);
  const NereusNucleus n = {m, s.temperature};
  const float top_p = fminf(s.top_p, 1.0f);
  // The candidates: the min-p cut (at least the most likely entry), then at most top_k.
  unsigned int candidates = sh.min_p_count > 0u ? sh.min_p_count : 1u;
  if (s.top_k > 0 && s.top_k < (u64)candidates) candidates = (unsigned int)s.top_k;
  u64 total = sh.min_p_mass;
  if (candidates != sh.min_p_count) {
    const unsigned int b = nereus_bucket_of_rank(sh, candidates);
    if (b == NEREUS_SAMPLE_MASSLESS) {
      total = nereus_mass_before(sh, b);  // the cut falls among entries of no mass
    } else {
      if (!nereus_sample_window(row, v, n, b, nereus_draw_reach(sh, b, u, top_p), sh)) return -1;
      total = nereus_mass_of_first(sh, candidates);
    }
  }
  unsigned int kept = candidates;
  u64 kept_mass = total;
  if (top_p < 1.0f) {  // the nucleus: the fewest leading candidates whose mass reaches top_p of theirs
    const u64 want = (u64)ceil((double)top_p * (double)total);
    const unsigned int b = nereus_bucket_of_mass(sh, want, false);
    if (!nereus_sample_window(row, v, n, b, nereus_draw_reach(sh, b, u, top_p), sh)) return -1;
    const unsigned int k = nereus_rank_of_mass(sh, want, false);
    if (k < kept) kept = k, kept_mass = nereus_mass_of_first(sh, k);
  }
  // The draw: the first entry whose cumulative mass exceeds u·(the nucleus's mass).
  const u64 target = (u64)((double)u * (double)kept_mass);
  const unsigned int b = nereus_bucket_of_mass(sh, target, true);
  if (!nereus_sample_window(row, v, n, b, b, sh)) return -1;
  unsigned int rank = nereus_rank_of_mass(sh, target, true);
  if (rank > kept) rank = kept;  // never past the nucleus (guarded: target < its mass)
  const u64 key = sh.keys[rank - nereus_count_before(sh, sh.window_lo) - 1];
  return (int)(0xffffffffu - (unsigned int)key);
}

// The draw of one row with uniform u; every thread of the block returns it.
__device__ __forceinline__ int nereus_draw_row(NereusRow row, u64 v, const NereusSampling& s, float u,
                                               NereusSampleShared& sh) {
  if (!s.greedy && s.temperature > 0.0f) {
    const int id = nereus_draw_sampled(row, v, s, u, sh);
    __syncthreads();  // the next row (or the fallback) reuses the shared memory
    if (id >= 0) return id;
  }
  // Greedy, or a bucket too full to sort: the bisection path (its scratch overlays the window).
  return nereus_draw_row_bisect(row, v, s, u, sh.scratch, reinterpret_cast<unsigned int*>(sh.keys), &sh.chosen);
}

// drawn[R]: the draw for each row of logits[R, V] (f32, or bf16 where logits_bf16 is set),
// sequence ids[r] at position pos + *position
// (position: a decode's row counter in device memory, or null; the draws of
// `nereus_draw_uniform`, so a draw depends on neither the layout nor the batch). Rows whose
// done[r] is set (sequences that have ended; done may be null) are not drawn.
NEREUS_KERNEL nereus_sample(int* __restrict__ drawn, const void* __restrict__ logits, const u64* __restrict__ ids,
                            const int* __restrict__ done, u64 rows, u64 v, u64 seed, u64 pos, float temperature,
                            float top_p, float min_p, u64 top_k, int greedy, int logits_bf16,
                            const int* __restrict__ position) {
  if (position) pos += (u64)*position;
  __shared__ NereusSampleShared shared;
  const NereusSampling s = {temperature, top_p, min_p, top_k, greedy};
  NEREUS_ROWS(r, rows) {
    if (done && done[r]) continue;  // the same for the whole block: no barrier is skipped by part of it
    const float u = nereus_draw_uniform(seed, ids[r], pos);
    const u64 row_bytes = v * (logits_bf16 ? 2 : 4);
    const NereusRow row = {static_cast<const unsigned char*>(logits) + r * row_bytes, logits_bf16};
    const int id = nereus_draw_row(row, v, s, u, shared);
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
