// The registered CUDA backend as a CudaBackend, for the tests of what only it has (its
// allocator, graphs, pinned uploads, autotuning). Kept out of backend_agreement.h because it
// brings in the CUDA headers.
#pragma once

#include "cuda/cuda_backend.h"
#include "tests/cuda/backend_agreement.h"

namespace mixprec::cuda_test {

inline CudaBackend& cuda_backend() { return dynamic_cast<CudaBackend&>(gpu_backend()); }

}  // namespace mixprec::cuda_test
