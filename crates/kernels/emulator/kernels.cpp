// emulator/kernels.cpp: every kernel source in device/, compiled for the grid emulator at one
// warp width (-DNEREUS_WARP_SIZE=32 or 64; build.rs builds both). Its table names each kernel
// and the byte size of each parameter; the Rust side resolves a kernel's index once (`find`),
// launches by index, and checks its typed argument structs against the sizes. Arguments arrive
// as cuLaunchKernel takes them: an array of pointers to the values.

#include <stddef.h>
#include <string.h>

#include <tuple>
#include <type_traits>
#include <utility>

#include "grid.h"

#define NEREUS_CONCAT2(a, b, c) a##b##c
#define NEREUS_CONCAT(a, b, c) NEREUS_CONCAT2(a, b, c)
#define NEREUS_GRID_EXPORT(suffix) NEREUS_CONCAT(nereus_grid_w, NEREUS_WARP_SIZE, suffix)
// The prelude's helpers depend on the warp width, so each width's build has its own namespace:
// both link into one binary without two definitions of one inline function.
#define nereus_kernels NEREUS_CONCAT(nereus_kernels_w, NEREUS_WARP_SIZE, )

namespace nereus_kernels {
#include "../device/prelude.h"
#include "../device/pack.cu"
#include "../device/cast.cu"
#include "../device/norm.cu"
#include "../device/swiglu.cu"
#include "../device/rope.cu"
#include "../device/embedding.cu"
#include "../device/attention.cu"
#include "../device/flash_attention.cu"
#include "../device/decode_attention.cu"
#include "../device/logits.cu"
#include "../device/adamw.cu"
#include "../device/sample.cu"
#include "../device/probe.cu"
}  // namespace nereus_kernels

namespace {

typedef void (*Body)(void* kernel, void** args);

template <typename... A, size_t... I>
void call(void (*kernel)(A...), void** args, std::index_sequence<I...>) {
  kernel(*static_cast<std::remove_reference_t<A>*>(args[I])...);
}

template <typename... A>
Body body_of(void (*)(A...)) {
  return [](void* kernel, void** args) {
    call(reinterpret_cast<void (*)(A...)>(kernel), args, std::index_sequence_for<A...>{});
  };
}

// The most parameters any kernel takes.
constexpr size_t kMaxParams = 24;

struct Entry {
  const char* name;
  void* kernel;
  Body body;
  size_t params;
  size_t sizes[kMaxParams];
};

template <typename... A>
Entry entry_of(const char* name, void (*kernel)(A...)) {
  static_assert(sizeof...(A) <= kMaxParams, "raise kMaxParams");
  return Entry{name, reinterpret_cast<void*>(kernel), body_of(kernel), sizeof...(A), {sizeof(A)...}};
}

#define NEREUS_ENTRY(k) entry_of(#k, &nereus_kernels::k),
const Entry kEntries[] = {
    NEREUS_PACK_KERNELS(NEREUS_ENTRY) NEREUS_CAST_KERNELS(NEREUS_ENTRY) NEREUS_NORM_KERNELS(NEREUS_ENTRY)
        NEREUS_SWIGLU_KERNELS(NEREUS_ENTRY) NEREUS_ROPE_KERNELS(NEREUS_ENTRY) NEREUS_EMBEDDING_KERNELS(NEREUS_ENTRY)
            NEREUS_ATTENTION_KERNELS(NEREUS_ENTRY) NEREUS_FLASH_KERNELS(NEREUS_ENTRY)
                NEREUS_DECODE_ATTENTION_KERNELS(NEREUS_ENTRY)
                NEREUS_LOGITS_KERNELS(NEREUS_ENTRY) NEREUS_ADAMW_KERNELS(NEREUS_ENTRY)
                    NEREUS_SAMPLE_KERNELS(NEREUS_ENTRY) NEREUS_PROBE_KERNELS(NEREUS_ENTRY)};
constexpr size_t kEntryCount = sizeof kEntries / sizeof kEntries[0];

}  // namespace

extern "C" int nereus_grid_launch(Body body, void* kernel, void** args, const unsigned grid[3], const unsigned block[3],
                                  unsigned shared_bytes, unsigned warp_size, char* error, size_t error_len);

// The index of kernel `name` in the table, or -1.
extern "C" long NEREUS_GRID_EXPORT(_find)(const char* name) {
  for (size_t i = 0; i < kEntryCount; ++i)
    if (strcmp(kEntries[i].name, name) == 0) return (long)i;
  return -1;
}

// Launches kernel `index`; 0 on success, 1 with the reason in `error`, 2 when no kernel has that
// index.
extern "C" int NEREUS_GRID_EXPORT(_launch)(size_t index, const unsigned grid[3], const unsigned block[3],
                                           unsigned shared_bytes, void** args, char* error, size_t error_len) {
  if (index >= kEntryCount) return 2;
  const Entry& e = kEntries[index];
  return nereus_grid_launch(e.body, e.kernel, args, grid, block, shared_bytes, NEREUS_WARP_SIZE, error, error_len);
}

// The name of kernel `i`, or null past the last one; its parameters' byte sizes in `sizes` (at
// most `max` of them) and their count in `params`.
extern "C" const char* NEREUS_GRID_EXPORT(_kernel)(size_t i, size_t* sizes, size_t max, size_t* params) {
  if (i >= kEntryCount) return nullptr;
  const Entry& e = kEntries[i];
  *params = e.params;
  for (size_t p = 0; p < e.params && p < max; ++p) sizes[p] = e.sizes[p];
  return e.name;
}
