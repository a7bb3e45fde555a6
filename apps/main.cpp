#include <exception>
#include <iostream>

#include "apps/cli.h"

#if MIXPREC_WITH_CUDA
#include "cuda/register.h"
#endif

int main(int argc, char** argv) {
#if MIXPREC_WITH_CUDA
  // Before any command runs, so that every command can place tensors on cuda:0. Without a
  // device this returns false and the program stays on the CPU; a device that exists but
  // cannot be set up is reported, and the CPU still works (`mixprec device` says why).
  try {
    mixprec::register_cuda_backend();
  } catch (const std::exception& e) {
    std::cerr << "warning: the CUDA backend could not be set up, running on the CPU only: "
              << e.what() << "\n";
  }
#endif
  return mixprec::run_cli(argc, argv, std::cout, std::cerr);
}
