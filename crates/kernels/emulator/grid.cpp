// kernels/emulator/grid.cpp: the grid emulator's scheduler (see grid.h).
//
// A launch runs its blocks one after another on the calling host thread. Each thread of a block
// is a fiber with its own stack. The scheduler resumes every runnable fiber until it finishes or
// waits at a barrier; then it releases a block barrier when every thread of the block waits at
// one, and a warp barrier (a shuffle) when every lane of that warp waits at one. Anything else
// (threads at different barriers, threads that exited before a barrier the others wait at, a
// shuffle whose warp has exited lanes or a partner lane that does not exist) is reported as the
// launch's error: CUDA and HIP leave it undefined, and on a device it hangs or reads garbage.
//
// Shuffles exchange through two slot buffers used alternately, so one barrier per shuffle
// suffices: a lane can be at most one shuffle ahead of the slowest lane of its warp, and that
// next shuffle writes the other buffer.

#include "grid.h"

#if !defined(__x86_64__)
#include <ucontext.h>
#endif

#include <cstdint>
#include <cstdio>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

namespace nereus_grid {
namespace {

enum class State { Runnable, AtBlockBarrier, AtWarpBarrier, Done };

constexpr size_t kStackBytes = 64 * 1024;
constexpr unsigned kMaxThreads = 1024;
constexpr unsigned kMaxDynamicShared = 160 * 1024;  // H100/H200's opt-in limit per block
constexpr unsigned kExchangeBytes = 64;              // what one lane may hand a warp exchange

// Switching between fibers. On x86-64, a six-register switch in assembly (below): glibc's
// swapcontext also saves and restores the signal mask, a system call per switch, which made half
// of the emulator's time. Elsewhere, ucontext.
#if defined(__x86_64__)
struct Context {
  void* sp = nullptr;  // the suspended stack: its callee-saved registers, then where to return
};
#else
struct Context {
  ucontext_t uc;
};
#endif

struct Fiber {
  Context context;
  Dim3 idx;
  State state = State::Runnable;
  unsigned shuffles = 0;  // shuffles done: picks the slot buffer
};

typedef void (*Body)(void* kernel, void** args);

struct Block {
  Dim3 idx, dim, grid;
  unsigned warp_size = 32;
  Body body = nullptr;
  void* kernel = nullptr;
  void** args = nullptr;
  std::vector<Fiber> fibers;
  std::vector<unsigned> slots[2];  // shuffle exchange, one value per thread
  std::vector<unsigned char> exchange[2];  // warp exchange, kExchangeBytes per thread
  unsigned char* shared = nullptr;
  Context scheduler;
  std::string error;
};

thread_local Block* current_block = nullptr;
thread_local Fiber* current_fiber = nullptr;
thread_local std::vector<std::unique_ptr<char[]>> stacks;
thread_local std::vector<unsigned char> dynamic;

#if defined(__x86_64__)
}  // namespace
}  // namespace nereus_grid

// Saves the callee-saved registers (and MXCSR, the x87 control word) on the current stack,
// stores its pointer in *from, switches to `to` and restores what was saved there.
extern "C" void nereus_grid_switch(void** from, void* to);
asm(R"(
  .text
  .p2align 4
  .globl nereus_grid_switch
  .hidden nereus_grid_switch
  .type nereus_grid_switch, @function
nereus_grid_switch:
  pushq %rbp
  pushq %rbx
  pushq %r12
  pushq %r13
  pushq %r14
  pushq %r15
  subq $8, %rsp
  stmxcsr (%rsp)
  fnstcw 4(%rsp)
  movq %rsp, (%rdi)
  movq %rsi, %rsp
  ldmxcsr (%rsp)
  fldcw 4(%rsp)
  addq $8, %rsp
  popq %r15
  popq %r14
  popq %r13
  popq %r12
  popq %rbx
  popq %rbp
  ret
  .size nereus_grid_switch, .-nereus_grid_switch
)");

namespace nereus_grid {
namespace {

void switch_to(Context& from, Context& to) { nereus_grid_switch(&from.sp, to.sp); }

[[noreturn]] void fiber_main();

// A fresh stack whose first switch "returns" into fiber_main as if called: the saved registers
// (zero), MXCSR and x87 control word at their defaults, then fiber_main's address.
void start(Context& c, char* stack, size_t bytes) {
  auto top = reinterpret_cast<uintptr_t>(stack + bytes) & ~uintptr_t{15};
  auto* sp = reinterpret_cast<uint64_t*>(top - 72);  // ≡ 8 mod 16 after the ret, as after a call
  const uint32_t mxcsr = 0x1f80;
  const uint16_t x87 = 0x037f;
  std::memset(sp, 0, 72);
  std::memcpy(sp, &mxcsr, sizeof mxcsr);
  std::memcpy(reinterpret_cast<char*>(sp) + 4, &x87, sizeof x87);
  sp[7] = reinterpret_cast<uint64_t>(&fiber_main);
  c.sp = sp;
}
#else
void switch_to(Context& from, Context& to) { swapcontext(&from.uc, &to.uc); }

void fiber_main();

void start(Context& c, char* stack, size_t bytes) {
  getcontext(&c.uc);
  c.uc.uc_stack.ss_sp = stack;
  c.uc.uc_stack.ss_size = bytes;
  c.uc.uc_link = nullptr;
  makecontext(&c.uc, fiber_main, 0);
}
#endif

void yield() { switch_to(current_fiber->context, current_block->scheduler); }

// A fiber's whole life: the kernel body, then back to the scheduler for good.
void fiber_main() {
  current_block->body(current_block->kernel, current_block->args);
  current_fiber->state = State::Done;
  yield();
  __builtin_unreachable();
}

unsigned linear(const Fiber& f, const Dim3& dim) { return f.idx.x + dim.x * (f.idx.y + dim.y * f.idx.z); }

// Releases the barrier the live threads wait at; false (with `error` set) when none can be.
bool release(Block& b) {
  const unsigned n = b.fibers.size();
  unsigned live = 0, at_block = 0;
  for (const Fiber& f : b.fibers) {
    live += f.state != State::Done;
    at_block += f.state == State::AtBlockBarrier;
  }
  if (at_block == n) {
    for (Fiber& f : b.fibers) f.state = State::Runnable;
    return true;
  }
  if (at_block == live) {
    char text[256];
    std::snprintf(text, sizeof text,
                  "block (%u,%u,%u): %u of %u threads exited without reaching a __syncthreads the others wait at "
                  "(a barrier in divergent code)",
                  b.idx.x, b.idx.y, b.idx.z, n - live, n);
    b.error = text;
    return false;
  }
  bool released = false;
  for (unsigned base = 0; base < n; base += b.warp_size) {
    const unsigned end = base + b.warp_size < n ? base + b.warp_size : n;
    bool all_at_warp = true;
    for (unsigned t = base; t < end; ++t) all_at_warp &= b.fibers[t].state == State::AtWarpBarrier;
    if (!all_at_warp) continue;
    for (unsigned t = base; t < end; ++t) b.fibers[t].state = State::Runnable;
    released = true;
  }
  if (!released) {
    char text[256];
    std::snprintf(text, sizeof text,
                  "block (%u,%u,%u) cannot go on: %u of %u live threads wait at __syncthreads, the others at a "
                  "warp shuffle whose warp is not all there (divergent barrier or exited lanes)",
                  b.idx.x, b.idx.y, b.idx.z, at_block, live);
    b.error = text;
  }
  return released;
}

// Runs one block to completion; false with `b.error` set when it cannot finish.
bool run_block(Block& b) {
  const unsigned n = b.dim.x * b.dim.y * b.dim.z;
  b.fibers.assign(n, Fiber{});
  b.slots[0].assign(n, 0);
  b.slots[1].assign(n, 0);
  while (stacks.size() < n) stacks.emplace_back(new char[kStackBytes]);
  for (unsigned t = 0; t < n; ++t) {
    Fiber& f = b.fibers[t];
    f.idx = Dim3{t % b.dim.x, (t / b.dim.x) % b.dim.y, t / (b.dim.x * b.dim.y)};
    start(f.context, stacks[t].get(), kStackBytes);
  }
  for (;;) {
    bool any_live = false;
    for (Fiber& f : b.fibers) {
      if (f.state != State::Runnable) {
        any_live |= f.state != State::Done;
        continue;
      }
      current_fiber = &f;
      switch_to(b.scheduler, f.context);
      any_live |= f.state != State::Done;
    }
    if (!b.error.empty()) return false;
    if (!any_live) return true;
    if (!release(b)) return false;
  }
}

}  // namespace

const Dim3& thread_idx() { return current_fiber->idx; }
const Dim3& block_idx() { return current_block->idx; }
const Dim3& block_dim() { return current_block->dim; }
const Dim3& grid_dim() { return current_block->grid; }
unsigned char* dynamic_shared() { return current_block->shared; }

void sync_block() {
  current_fiber->state = State::AtBlockBarrier;
  yield();
}

unsigned int shuffle_xor(unsigned int value, int lane_mask) {
  Block& b = *current_block;
  Fiber& f = *current_fiber;
  const unsigned me = linear(f, b.dim), lane = me % b.warp_size;
  std::vector<unsigned>& slots = b.slots[f.shuffles++ % 2];
  slots[me] = value;
  f.state = State::AtWarpBarrier;
  yield();
  const unsigned partner = me - lane + (lane ^ static_cast<unsigned>(lane_mask));
  if (static_cast<unsigned>(lane_mask) >= b.warp_size || partner >= b.fibers.size()) {
    if (b.error.empty()) b.error = "a warp shuffle named a lane outside the warp (lane mask " + std::to_string(lane_mask) + ")";
    return value;
  }
  return slots[partner];
}

// A barrier of the calling thread's warp, with each lane's `bytes` handed to all (the warp
// matrix multiply's emulation gathers its operands' fragments through it). The exchange buffers
// alternate with the shuffles' (one counter), so one barrier per exchange suffices here too.
void warp_exchange(const void* mine, unsigned bytes, void* all) {
  Block& b = *current_block;
  Fiber& f = *current_fiber;
  const unsigned me = linear(f, b.dim), lane = me % b.warp_size, base = me - lane;
  std::vector<unsigned char>& buffer = b.exchange[f.shuffles++ % 2];
  if (buffer.size() < b.fibers.size() * kExchangeBytes) buffer.resize(b.fibers.size() * kExchangeBytes);
  if (bytes > kExchangeBytes) {
    if (b.error.empty()) b.error = "a warp exchange of " + std::to_string(bytes) + " bytes a lane (at most 64)";
    bytes = kExchangeBytes;
  }
  std::memcpy(&buffer[me * kExchangeBytes], mine, bytes);
  f.state = State::AtWarpBarrier;
  yield();
  if (base + b.warp_size > b.fibers.size()) {
    if (b.error.empty()) b.error = "a warp exchange in a block whose last warp is not full";
    return;
  }
  for (unsigned l = 0; l < b.warp_size; ++l)
    std::memcpy(static_cast<unsigned char*>(all) + l * bytes, &buffer[(base + l) * kExchangeBytes], bytes);
}

}  // namespace nereus_grid

using nereus_grid::Block;
using nereus_grid::Dim3;

// Runs `body(kernel, args)` as a launch of grid × block threads at the given warp width. 0 on
// success; otherwise 1 with the reason in `error` (NUL-terminated, at most `error_len` bytes).
extern "C" int nereus_grid_launch(nereus_grid::Body body, void* kernel, void** args, const unsigned grid[3],
                                  const unsigned block[3], unsigned shared_bytes, unsigned warp_size, char* error,
                                  size_t error_len) {
  auto fail = [&](const std::string& why) {
    std::snprintf(error, error_len, "%s", why.c_str());
    return 1;
  };
  const unsigned long long threads = 1ull * block[0] * block[1] * block[2];
  if (threads == 0 || threads > nereus_grid::kMaxThreads)
    return fail("a block of " + std::to_string(threads) + " threads (1 to 1024 run)");
  if (1ull * grid[0] * grid[1] * grid[2] == 0) return fail("an empty grid");
  // CUDA's and HIP's limits, so a launch the emulator accepts is one a device accepts.
  if (grid[0] > 2147483647u || grid[1] > 65535u || grid[2] > 65535u)
    return fail("a grid of (" + std::to_string(grid[0]) + ", " + std::to_string(grid[1]) + ", " +
                std::to_string(grid[2]) + ") blocks (at most 2^31 - 1, 65535, 65535)");
  if (block[0] > 1024u || block[1] > 1024u || block[2] > 64u)
    return fail("a block of (" + std::to_string(block[0]) + ", " + std::to_string(block[1]) + ", " +
                std::to_string(block[2]) + ") threads (at most 1024, 1024, 64 per dimension)");
  if (shared_bytes > nereus_grid::kMaxDynamicShared)
    return fail(std::to_string(shared_bytes) + " bytes of dynamic shared memory (at most 163840)");
  if (nereus_grid::current_block != nullptr) return fail("a launch from inside a kernel");
  nereus_grid::dynamic.assign(shared_bytes + 16, 0);
  Block b;
  b.dim = Dim3{block[0], block[1], block[2]};
  b.grid = Dim3{grid[0], grid[1], grid[2]};
  b.warp_size = warp_size;
  b.body = body;
  b.kernel = kernel;
  b.args = args;
  const auto base = reinterpret_cast<size_t>(nereus_grid::dynamic.data());
  b.shared = nereus_grid::dynamic.data() + ((16 - base % 16) % 16);
  nereus_grid::current_block = &b;
  int status = 0;
  for (unsigned z = 0; z < grid[2] && status == 0; ++z)
    for (unsigned y = 0; y < grid[1] && status == 0; ++y)
      for (unsigned x = 0; x < grid[0] && status == 0; ++x) {
        b.idx = Dim3{x, y, z};
        if (!nereus_grid::run_block(b)) status = fail(b.error);
      }
  nereus_grid::current_block = nullptr;
  nereus_grid::current_fiber = nullptr;
  return status;
}
