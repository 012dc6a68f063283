// kernels/emulator/kernels.cpp: every kernel source in kernels/, compiled for the grid emulator
// at one warp width (-DNEREUS_WARP_SIZE=32 or 64; build.rs builds both), with a launch entry
// point that finds a kernel by name and unpacks its arguments as cuLaunchKernel does (an array
// of pointers to the values), so the Rust side launches every backend alike.

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
#include "../prelude.h"
#include "../pack.cu"
#include "../engine.cu"
#include "../attention.cu"
#include "../flash_attention.cu"
#include "../sample.cu"
#include "../probe.cu"
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

struct Entry {
  const char* name;
  void* kernel;
  Body body;
};

#define NEREUS_ENTRY(k) Entry{#k, reinterpret_cast<void*>(&nereus_kernels::k), body_of(&nereus_kernels::k)},
const Entry kEntries[] = {NEREUS_PACK_KERNELS(NEREUS_ENTRY) NEREUS_ENGINE_KERNELS(NEREUS_ENTRY)
                             NEREUS_ATTENTION_KERNELS(NEREUS_ENTRY)
                             NEREUS_FLASH_KERNELS(NEREUS_ENTRY)
                             NEREUS_SAMPLE_KERNELS(NEREUS_ENTRY)
                             NEREUS_PROBE_KERNELS(NEREUS_ENTRY)};

}  // namespace

extern "C" int nereus_grid_launch(Body body, void* kernel, void** args, const unsigned grid[3], const unsigned block[3],
                                  unsigned shared_bytes, unsigned warp_size, char* error, size_t error_len);

// Launches kernel `name`; 0 on success, 1 with the reason in `error`, 2 when no kernel has that name.
extern "C" int NEREUS_GRID_EXPORT(_launch)(const char* name, const unsigned grid[3], const unsigned block[3],
                                           unsigned shared_bytes, void** args, char* error, size_t error_len) {
  for (const Entry& e : kEntries)
    if (strcmp(e.name, name) == 0)
      return nereus_grid_launch(e.body, e.kernel, args, grid, block, shared_bytes, NEREUS_WARP_SIZE, error, error_len);
  return 2;
}

// The name of kernel `i`, or null past the last one.
extern "C" const char* NEREUS_GRID_EXPORT(_kernel)(size_t i) {
  return i < sizeof kEntries / sizeof kEntries[0] ? kEntries[i].name : nullptr;
}
