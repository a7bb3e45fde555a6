#include "cuda/emulation/thread_scheduler.h"

#include <sys/mman.h>
#include <unistd.h>

#include <exception>
#include <string>
#include <vector>

#include "core/error.h"
#include "cuda/emulation/fiber_context.h"

#if defined(__SANITIZE_ADDRESS__)
#define MIXPREC_EMULATION_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define MIXPREC_EMULATION_ASAN 1
#endif
#endif

#if defined(MIXPREC_EMULATION_ASAN)
#include <sanitizer/asan_interface.h>
#include <sanitizer/common_interface_defs.h>
#endif

namespace mixprec::emulation {
namespace {

constexpr unsigned kWarpSize = 32;
constexpr unsigned kMaxBlockThreads = 1024;
// Kernel frames are small, but sanitizer builds enlarge them several times over. The pages
// are reserved, not committed: only the depth a thread really uses costs memory.
constexpr size_t kStackBytes = size_t{256} << 10;

enum class State { kReady, kAtBlockBarrier, kAtWarpBarrier, kDone };

struct Fiber {
  FiberContext context;
  State state = State::kReady;
  // The pending warp exchange: what this lane deposited, where its result goes.
  const void* deposit = nullptr;
  void* receive = nullptr;
  size_t bytes = 0;
  unsigned source_lane = 0;
};

// One stack per thread of the largest block so far, each with a guard page below it so that
// an overflow faults instead of corrupting the neighbour.
class StackPool {
 public:
  ~StackPool() {
    for (void* region : regions_) munmap(region, kStackBytes + page());
  }
  void* stack(size_t index) {
    while (regions_.size() <= index) {
      void* region = mmap(nullptr, kStackBytes + page(), PROT_READ | PROT_WRITE,
                          MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | MAP_STACK, -1, 0);
      if (region == MAP_FAILED) MIXPREC_FAIL("cuda emulation: cannot map a thread stack");
      mprotect(region, page(), PROT_NONE);
      regions_.push_back(region);
    }
    return static_cast<char*>(regions_[index]) + page();
  }

 private:
  static size_t page() { return static_cast<size_t>(sysconf(_SC_PAGESIZE)); }
  std::vector<void*> regions_;
};

// The scheduler of the launch running on this OS thread.
struct Launch {
  const std::function<void()>* body = nullptr;
  std::vector<Fiber> fibers;
  size_t running = 0;
  FiberContext scheduler;
  std::exception_ptr error;
  bool active = false;
#if defined(MIXPREC_EMULATION_ASAN)
  const void* scheduler_stack_bottom = nullptr;
  size_t scheduler_stack_size = 0;
#endif
};

thread_local ThreadPosition current_position;
thread_local Launch launch_state;
thread_local StackPool stack_pool;

std::string describe(const uint3& v) {
  return "(" + std::to_string(v.x) + ", " + std::to_string(v.y) + ", " + std::to_string(v.z) + ")";
}

uint3 thread_index_of(size_t linear, const dim3& block) {
  const auto x = static_cast<unsigned>(linear % block.x);
  const auto y = static_cast<unsigned>(linear / block.x % block.y);
  const auto z = static_cast<unsigned>(linear / (size_t{block.x} * block.y));
  return {x, y, z};
}

// Switches from the scheduler into fiber `index` until it waits or ends.
void resume(Launch& launch, size_t index) {
  launch.running = index;
  current_position.thread_index = thread_index_of(index, current_position.block_dim);
#if defined(MIXPREC_EMULATION_ASAN)
  void* fake_stack = nullptr;
  __sanitizer_start_switch_fiber(&fake_stack, stack_pool.stack(index), kStackBytes);
#endif
  switch_context(launch.scheduler, launch.fibers[index].context);
#if defined(MIXPREC_EMULATION_ASAN)
  __sanitizer_finish_switch_fiber(fake_stack, nullptr, nullptr);
#endif
}

// Switches from the running fiber back to the scheduler (it has set its state).
void yield_to_scheduler(Launch& launch) {
  Fiber& self = launch.fibers[launch.running];
#if defined(MIXPREC_EMULATION_ASAN)
  void* fake_stack = nullptr;
  __sanitizer_start_switch_fiber(self.state == State::kDone ? nullptr : &fake_stack,
                                 launch.scheduler_stack_bottom, launch.scheduler_stack_size);
#endif
  switch_context(self.context, launch.scheduler);
#if defined(MIXPREC_EMULATION_ASAN)
  __sanitizer_finish_switch_fiber(fake_stack, nullptr, nullptr);
#endif
}

void fiber_entry() {
  Launch& launch = launch_state;
#if defined(MIXPREC_EMULATION_ASAN)
  __sanitizer_finish_switch_fiber(nullptr, &launch.scheduler_stack_bottom,
                                  &launch.scheduler_stack_size);
#endif
  try {
    (*launch.body)();
  } catch (...) {
    if (!launch.error) launch.error = std::current_exception();
  }
  launch.fibers[launch.running].state = State::kDone;
  yield_to_scheduler(launch);
}

[[noreturn]] void fail_at(size_t linear, const char* what) {
  MIXPREC_FAIL("cuda emulation: thread ", describe(thread_index_of(linear, current_position.block_dim)),
               " of block ", describe(current_position.block_index), " ", what);
}

// Completes the exchange of every lane of warp [first, end) and makes the lanes ready.
void release_warp(Launch& launch, size_t first, size_t end) {
  if (end - first != kWarpSize)
    fail_at(first, "shuffles in a warp of fewer than 32 threads (the block size is not a multiple of 32)");
  for (size_t lane = first; lane < end; ++lane) {
    Fiber& f = launch.fibers[lane];
    if (f.source_lane >= kWarpSize) fail_at(lane, "shuffles from a lane outside its warp");
    const Fiber& source = launch.fibers[first + f.source_lane];
    if (source.bytes != f.bytes) fail_at(lane, "shuffles a value of another size than its source lane");
    if (f.receive != nullptr) std::memcpy(f.receive, source.deposit, f.bytes);
  }
  for (size_t lane = first; lane < end; ++lane) launch.fibers[lane].state = State::kReady;
}

// After every ready fiber has run to its next wait: opens the barriers that every thread of
// their group has reached. Throws when a barrier can never open.
void open_barriers(Launch& launch) {
  const size_t n = launch.fibers.size();
  bool opened = false;
  for (size_t first = 0; first < n; first += kWarpSize) {
    const size_t end = std::min(n, first + kWarpSize);
    size_t waiting = 0, done = 0;
    for (size_t lane = first; lane < end; ++lane) {
      waiting += launch.fibers[lane].state == State::kAtWarpBarrier;
      done += launch.fibers[lane].state == State::kDone;
    }
    if (waiting == 0) continue;
    if (done > 0) {
      for (size_t lane = first; lane < end; ++lane)
        if (launch.fibers[lane].state == State::kDone)
          fail_at(lane, "exited while other lanes of its warp wait in a warp shuffle");
    }
    if (waiting == end - first) {
      release_warp(launch, first, end);
      opened = true;
    }
  }
  if (opened) return;
  size_t at_block = 0, done = 0;
  for (const Fiber& f : launch.fibers) {
    at_block += f.state == State::kAtBlockBarrier;
    done += f.state == State::kDone;
  }
  if (at_block == 0) return;
  if (done > 0) {
    for (size_t i = 0; i < n; ++i)
      if (launch.fibers[i].state == State::kDone)
        fail_at(i, "exited while other threads of its block wait in __syncthreads()");
  }
  if (at_block + done < n) {
    for (size_t i = 0; i < n; ++i)
      if (launch.fibers[i].state == State::kAtWarpBarrier)
        fail_at(i, "waits in a warp shuffle while other threads of its warp wait in __syncthreads()");
  }
  for (Fiber& f : launch.fibers) f.state = State::kReady;
}

void run_block(Launch& launch, size_t threads, bool descending) {
  launch.fibers.assign(threads, Fiber{});
  for (size_t i = 0; i < threads; ++i) {
    Fiber& f = launch.fibers[i];
#if defined(MIXPREC_EMULATION_ASAN)
    // The frames a thread was in when it switched away for the last time (or when its launch
    // failed) never return, so AddressSanitizer's marks of their redzones would stay on the
    // stack and flag the next thread to run there; every thread starts on a clean stack.
    __asan_unpoison_memory_region(stack_pool.stack(i), kStackBytes);
#endif
    prepare_context(f.context, stack_pool.stack(i), kStackBytes, fiber_entry);
  }
  size_t done = 0;
  while (done < threads) {
    for (size_t k = 0; k < threads; ++k) {
      const size_t i = descending ? threads - 1 - k : k;
      if (launch.fibers[i].state != State::kReady) continue;
      resume(launch, i);
      if (launch.error) std::rethrow_exception(launch.error);
    }
    done = 0;
    for (const Fiber& f : launch.fibers) done += f.state == State::kDone;
    if (done < threads) open_barriers(launch);
  }
}

Fiber& running_fiber(const char* what) {
  Launch& launch = launch_state;
  if (!launch.active) MIXPREC_FAIL("cuda emulation: ", what, " called outside a kernel");
  return launch.fibers[launch.running];
}

}  // namespace

const ThreadPosition& position() { return current_position; }

void run_grid(dim3 grid, dim3 block, const std::function<void()>& body) {
  Launch& launch = launch_state;
  if (launch.active) MIXPREC_FAIL("cuda emulation: a kernel launched a kernel (not supported)");
  const size_t threads = size_t{block.x} * block.y * block.z;
  const size_t blocks = size_t{grid.x} * grid.y * grid.z;
  if (threads == 0 || threads > kMaxBlockThreads || block.z > 64 || blocks == 0 ||
      grid.x > 2147483647u || grid.y > 65535 || grid.z > 65535)
    MIXPREC_FAIL("cuda emulation: invalid launch configuration: grid ", describe({grid.x, grid.y, grid.z}),
                 ", block ", describe({block.x, block.y, block.z}));
  launch.body = &body;
  launch.error = nullptr;
  launch.active = true;
  current_position.block_dim = block;
  current_position.grid_dim = grid;
  try {
    size_t linear_block = 0;
    for (unsigned z = 0; z < grid.z; ++z)
      for (unsigned y = 0; y < grid.y; ++y)
        for (unsigned x = 0; x < grid.x; ++x, ++linear_block) {
          current_position.block_index = {x, y, z};
          run_block(launch, threads, linear_block % 2 == 1);
        }
  } catch (...) {
    launch.active = false;
    launch.fibers.clear();
    throw;
  }
  launch.active = false;
  launch.fibers.clear();
}

void sync_block() {
  Fiber& self = running_fiber("__syncthreads()");
  self.state = State::kAtBlockBarrier;
  yield_to_scheduler(launch_state);
}

void warp_exchange(const void* value, void* received, size_t bytes, unsigned source_lane) {
  Fiber& self = running_fiber("a warp shuffle");
  self.deposit = value;
  self.receive = received;
  self.bytes = bytes;
  self.source_lane = source_lane;
  self.state = State::kAtWarpBarrier;
  yield_to_scheduler(launch_state);
}

}  // namespace mixprec::emulation
