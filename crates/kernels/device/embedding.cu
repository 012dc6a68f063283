// embedding.cu: the token embedding forward and backward over a vocabulary shard, bf16 in
// memory, f32 gradient accumulators. The CPU engine's ops (crates/exec/src/engine/ops/embedding.rs)
// define the semantics; the f64 references are in crates/bench/src/selftest/kernels/reference.rs.
//
// Legend: N tokens, C model width, V local vocab rows starting at global row v0. 1-D grid-stride.

// out[N,C] = W[token − v0] where this rank holds the row, else zero (a TP all-reduce completes it).
NEREUS_KERNEL nereus_embedding_forward(bf16* __restrict__ out, const int* __restrict__ tokens,
                                       const bf16* __restrict__ w, u64 n, u64 c, u64 v0, u64 v) {
  NEREUS_GRID_STRIDE(i, n * c) {
    const long long row = (long long)tokens[i / c] - (long long)v0;
    out[i] = row >= 0 && row < (long long)v ? w[(u64)row * c + i % c] : (bf16)0;
  }
}

// dW[token − v0] += dy (f32 accumulators, atomically: tokens repeat).
NEREUS_KERNEL nereus_embedding_backward(float* __restrict__ dw, const bf16* __restrict__ dy,
                                        const int* __restrict__ tokens, u64 n, u64 c, u64 v0, u64 v) {
  NEREUS_GRID_STRIDE(i, n * c) {
    const long long row = (long long)tokens[i / c] - (long long)v0;
    if (row >= 0 && row < (long long)v) atomicAdd(&dw[(u64)row * c + i % c], nereus_bf16_to_f32(dy[i]));
  }
}

// Every entry point, for the grid emulator's table (crates/kernels/emulator/kernels.cpp).
#define NEREUS_EMBEDDING_KERNELS(X) X(nereus_embedding_forward) X(nereus_embedding_backward)
