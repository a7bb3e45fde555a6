// The execution context of one emulated GPU thread (cuda/emulation/thread_scheduler.cpp):
// its own stack, entered and left only by explicit switches on one OS thread.
//
// On x86-64 a switch saves the callee-saved registers on the current stack and swaps stack
// pointers, about as costly as a function call. Elsewhere it is ucontext's swapcontext,
// which also saves the signal mask with a system call per switch, some fifty times slower.
#pragma once

#include <cstddef>

#if !defined(__x86_64__)
#include <ucontext.h>
#endif

namespace mixprec::emulation {

struct FiberContext {
#if defined(__x86_64__)
  void* stack_pointer = nullptr;
#else
  ucontext_t context{};
#endif
};

// Makes `fiber` start `entry` on the `size` bytes at `stack` at its first switch_context into
// it. `entry` must never return: it ends by switching away for good.
void prepare_context(FiberContext& fiber, void* stack, size_t size, void (*entry)());

// Saves the running context into `from` and continues `to`; returns when something switches
// back to `from`.
void switch_context(FiberContext& from, FiberContext& to);

}  // namespace mixprec::emulation
