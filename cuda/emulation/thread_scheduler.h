// Runs a CUDA kernel's threads on the CPU, for testing kernels on machines without a GPU.
//
// A launch of `grid` blocks of `block` threads runs the blocks one after another. The threads
// of a block are fibers on the calling thread's stack pool, switched only at the points where
// CUDA threads wait for each other: __syncthreads() (the whole block) and the warp shuffles
// (the 32 lanes of a warp). Between those points each thread runs alone, in an order that
// alternates from block to block (ascending thread index in even blocks, descending in odd
// ones), so a kernel that reads another thread's data without a barrier sees stale values in
// one of the two orders.
//
// What a real GPU would leave undefined is an error here (mixprec::Error naming the block and
// thread): a barrier that some thread of the block never reaches, or that it reaches after
// exiting, and a shuffle whose warp is not complete. Everything runs on the calling thread;
// two launches on different OS threads are independent.
//
// Not emulated: timing, the memory model across blocks (blocks never run concurrently, so a
// race between blocks goes unseen), and shared memory's undefined contents at block start
// (a kernel's __shared__ arrays are function-local statics that keep the last block's data).
#pragma once

#include <cstdint>
#include <cstring>
#include <functional>

#include <vector_types.h>

namespace mixprec::emulation {

// The built-in variables of the running thread.
struct ThreadPosition {
  uint3 thread_index{0, 0, 0};
  uint3 block_index{0, 0, 0};
  dim3 block_dim{1, 1, 1};
  dim3 grid_dim{1, 1, 1};
};

// The position of the thread that is running now; valid only inside run_grid's body.
const ThreadPosition& position();

// Runs body once per thread of the grid (each call sees its own position()). Throws
// mixprec::Error for an empty or oversized launch (as cudaErrorInvalidConfiguration would),
// a barrier not reached by every thread of its group, and any exception a thread throws.
void run_grid(dim3 grid, dim3 block, const std::function<void()>& body);

// __syncthreads(): waits until every thread of the block has arrived.
void sync_block();

// __syncwarp() with a full mask, and the exchange behind the shuffles: every lane of the
// warp deposits `bytes` bytes of `value`, waits for the whole warp, and receives the bytes
// that lane `source_lane` deposited.
void warp_exchange(const void* value, void* received, size_t bytes, unsigned source_lane);

}  // namespace mixprec::emulation
