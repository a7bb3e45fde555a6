// The GEMM tuner (contract in gemm_autotune.h; the switch and timing loop are
// cuda/autotune.cpp's).
#include "cuda/gemm_autotune.h"

namespace mixprec {

Autotuner& gemm_autotuner() {
  static constinit Autotuner tuner("MIXPREC_GEMM_AUTOTUNE", "autotune cuBLASLt GEMM algorithms",
                                   "the heuristic's first algorithm");
  return tuner;
}

}  // namespace mixprec
