// The convolution tuner (contract in conv_autotune.h; the switch and timing loop are
// cuda/autotune.cpp's).
#include "cuda/conv_autotune.h"

namespace mixprec {

Autotuner& conv_autotuner() {
  static constinit Autotuner tuner("MIXPREC_CONV_AUTOTUNE", "autotune cuDNN convolution algorithms",
                                   "the heuristic's first deterministic algorithm");
  return tuner;
}

}  // namespace mixprec
