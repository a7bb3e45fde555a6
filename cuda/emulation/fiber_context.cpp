#include "cuda/emulation/fiber_context.h"

#include <cstdint>
#include <cstring>

#if defined(__x86_64__)

// mixprec_emulation_switch(void** save, void* load): pushes the registers the System V ABI
// makes the callee preserve, stores the stack pointer at *save, loads `load` as the stack
// pointer and pops the same registers from it; `ret` continues where that context switched
// away (or at its entry, for a fresh stack laid out by prepare_context). The floating-point
// control words are not switched: every fiber runs with the OS thread's.
extern "C" void mixprec_emulation_switch(void** save, void* load);
asm(R"(
  .text
  .p2align 4
  .globl mixprec_emulation_switch
  .hidden mixprec_emulation_switch
  .type mixprec_emulation_switch, @function
mixprec_emulation_switch:
  pushq %rbp
  pushq %rbx
  pushq %r12
  pushq %r13
  pushq %r14
  pushq %r15
  movq %rsp, (%rdi)
  movq %rsi, %rsp
  popq %r15
  popq %r14
  popq %r13
  popq %r12
  popq %rbx
  popq %rbp
  ret
  .size mixprec_emulation_switch, .-mixprec_emulation_switch
  .section .note.GNU-stack,"",@progbits
  .text
)");

namespace mixprec::emulation {

void prepare_context(FiberContext& fiber, void* stack, size_t size, void (*entry)()) {
  // From the top of the stack, 16-byte aligned: a null return address for `entry` (which
  // never returns), the address `ret` jumps to, and six zeroed registers to pop. `entry`
  // then starts with the stack pointer 8 past a multiple of 16, as after a call.
  auto top = (reinterpret_cast<uintptr_t>(stack) + size) & ~uintptr_t{15};
  auto* slots = reinterpret_cast<void**>(top);
  slots[-1] = nullptr;
  slots[-2] = reinterpret_cast<void*>(entry);
  for (int i = 3; i <= 8; ++i) slots[-i] = nullptr;
  fiber.stack_pointer = &slots[-8];
}

void switch_context(FiberContext& from, FiberContext& to) {
  mixprec_emulation_switch(&from.stack_pointer, to.stack_pointer);
}

}  // namespace mixprec::emulation

#else

namespace mixprec::emulation {

void prepare_context(FiberContext& fiber, void* stack, size_t size, void (*entry)()) {
  getcontext(&fiber.context);
  fiber.context.uc_stack.ss_sp = stack;
  fiber.context.uc_stack.ss_size = size;
  fiber.context.uc_link = nullptr;
  makecontext(&fiber.context, entry, 0);
}

void switch_context(FiberContext& from, FiberContext& to) { swapcontext(&from.context, &to.context); }

}  // namespace mixprec::emulation

#endif
