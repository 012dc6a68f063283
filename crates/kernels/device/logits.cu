// logits.cu: the LM head's log-softmax statistics over a vocabulary shard, the backward through
// log p(target), and greedy argmax. The f64 references they are checked against, and their launches, are in
// crates/bench/src/selftest/kernels/ (`nereus selftest kernels`, docs/kernels.md).
//
// Legend: R rows, C columns (the local vocab shard). Row kernels: one block per row (grid-stride
// over rows), blockDim.x a multiple of the warp and at most 1024. Element-wise: 1-D grid-stride.

// The largest of a bf16 row of C values, on every thread of the block.
__device__ __forceinline__ float nereus_row_max(const bf16* row, u64 cols, float* scratch) {
  float m = nereus_bits_to_f32(0xff800000u);
  for (u64 c = threadIdx.x; c < cols; c += blockDim.x) m = fmaxf(m, nereus_bf16_to_f32(row[c]));
  return nereus_block_reduce(m, scratch, true);
}

// The LM head's per-row statistics over one vocab shard (or one chunk of it): row_max[R] and
// row_sum[R] = Σ exp(l − row_max), and the target's logit where the target falls in this shard
// [shard_start, shard_start + C) (else −inf). With `fold` set they are merged into the values
// already there (an earlier chunk's; online softmax, Milakov & Gimelshein 2018):
//   max' = max(m, m_c),  sum' = sum · exp(m − max') + sum_c · exp(m_c − max'),
// the target's logit taken from the chunk that holds it. The fused LM head folds its vocabulary
// chunks one after another this way, so the full logits never exist at once. Under TP the
// shards' (max, sum, target) are combined across ranks (on the host: lse = M + log Σ_r sum_r ·
// exp(max_r − M), M the largest max) before the log-prob is read. Where lse and logp are given
// (the last chunk of a rank holding the whole vocabulary: the combine is the identity) lse[R]
// and logp[R] = target − lse are written too, so nothing leaves the device.
NEREUS_KERNEL nereus_logits_row_stats(float* __restrict__ row_max, float* __restrict__ row_sum,
                                      float* __restrict__ target_logit, float* __restrict__ lse,
                                      float* __restrict__ logp, const bf16* __restrict__ logits,
                                      const int* __restrict__ targets, u64 rows, u64 cols, u64 shard_start, int fold) {
  __shared__ float scratch[1024 / NEREUS_WARP];
  const float neg_inf = nereus_bits_to_f32(0xff800000u);
  NEREUS_ROWS(row, rows) {
    const bf16* lr = logits + row * cols;  // [C]
    float m = nereus_row_max(lr, cols, scratch);
    float s = 0.0f;
    for (u64 c = threadIdx.x; c < cols; c += blockDim.x) s += nereus_exp(nereus_bf16_to_f32(lr[c]) - m);
    s = nereus_block_reduce(s, scratch, false);
    if (threadIdx.x == 0) {
      const long long t = (long long)targets[row] - (long long)shard_start;
      const bool held = t >= 0 && t < (long long)cols;
      float target = held ? nereus_bf16_to_f32(lr[t]) : neg_inf;
      if (fold) {
        const float m0 = row_max[row], merged = fmaxf(m0, m);
        s = row_sum[row] * nereus_exp(m0 - merged) + s * nereus_exp(m - merged);
        m = merged;
        if (!held) target = target_logit[row];
      }
      row_max[row] = m;
      row_sum[row] = s;
      target_logit[row] = target;
      if (lse) {
        const float l = m + nereus_log(s);
        lse[row] = l;
        logp[row] = target - l;
      }
    }
  }
}

// Mean next-token cross-entropy on the device, for one micro-batch of R = B·T rows of log p
// (row r is position r % T of its sequence; the last position has no next token): the gradient
// with respect to log p, dlogp[r] = −inv_count for counted rows and 0 for the last position, and
// the loss −inv_count · Σ_counted logp added to loss[0] (which the step reads once, at its end).
// inv_count is 1 / (counted positions of the global batch). One block; blockDim.x a multiple of
// the warp and at most 1024.
NEREUS_KERNEL nereus_cross_entropy(float* __restrict__ dlogp, float* __restrict__ loss, const float* __restrict__ logp,
                                   u64 rows, u64 seq_len, float inv_count) {
  __shared__ float scratch[1024 / NEREUS_WARP];
  float partial = 0.0f;
  for (u64 r = threadIdx.x; r < rows; r += blockDim.x) {
    const bool counted = r % seq_len != seq_len - 1;
    dlogp[r] = counted ? -inv_count : 0.0f;
    if (counted) partial -= logp[r];
  }
  partial = nereus_block_reduce(partial, scratch, false);
  if (threadIdx.x == 0) loss[0] += partial * inv_count;
}

// The LM head's backward through log p(target) over one vocab shard (or chunk), given each row's
// global log-sum-exp (after the chunks' fold and the TP combine) and the loss's gradient g[R]
// with respect to log p:
//   dlogits[R,C] = g · (onehot(target − shard_start) − exp(l − lse))
// dlogits may be logits itself (the fused head turns its chunk of logits into their gradient in
// place): each element is read and then written by the same thread.
NEREUS_KERNEL nereus_logprob_backward(bf16* dlogits, const bf16* logits, const float* __restrict__ lse,
                                      const float* __restrict__ dlogp, const int* __restrict__ targets, u64 rows,
                                      u64 cols, u64 shard_start) {
  NEREUS_GRID_STRIDE(i, rows * cols) {
    const u64 row = i / cols, col = i % cols;
    const float p = nereus_exp(nereus_bf16_to_f32(logits[i]) - lse[row]);
    const float hit = (long long)targets[row] - (long long)shard_start == (long long)col ? 1.0f : 0.0f;
    dlogits[i] = nereus_f32_to_bf16(dlogp[row] * (hit - p));
  }
}

// Greedy decoding over one vocab shard: tokens[R] = the lowest column holding the row's largest
// logit (the host combines shards by (value, shard_start + column)); values[R] that logit.
NEREUS_KERNEL nereus_argmax(int* __restrict__ tokens, float* __restrict__ values, const bf16* __restrict__ logits,
                            u64 rows, u64 cols) {
  __shared__ float scratch[1024 / NEREUS_WARP];
  const float neg_inf = nereus_bits_to_f32(0xff800000u);
  NEREUS_ROWS(row, rows) {
    const bf16* lr = logits + row * cols;  // [C]
    const float m = nereus_row_max(lr, cols, scratch);
    // The lowest column at the maximum, as the largest −column (exact in f32 below 2^24 columns).
    float first = neg_inf;
    for (u64 c = threadIdx.x; c < cols; c += blockDim.x)
      if (nereus_bf16_to_f32(lr[c]) == m) first = fmaxf(first, -(float)c);
    first = nereus_block_reduce(first, scratch, true);
    if (threadIdx.x == 0) {
      tokens[row] = (int)(-first);
      values[row] = m;
    }
  }
}

// Every entry point, for the grid emulator's table (crates/kernels/emulator/kernels.cpp).
#define NEREUS_LOGITS_KERNELS(X) \
  X(nereus_logits_row_stats) X(nereus_cross_entropy) X(nereus_logprob_backward) X(nereus_argmax)
