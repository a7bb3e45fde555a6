// The convolution tuner and the non-deterministic switch (contract in conv_autotune.h; the
// switches are cuda/environment_switch.cpp's, the timing loop cuda/autotune.cpp's).
#include "cuda/conv_autotune.h"

namespace mixprec {

Autotuner& conv_autotuner() {
  static constinit Autotuner tuner("MIXPREC_CONV_AUTOTUNE", "autotune cuDNN convolution algorithms",
                                   "the heuristic's first algorithm");
  return tuner;
}

EnvironmentSwitch& conv_nondeterministic_switch() {
  static constinit EnvironmentSwitch on_off(
      "MIXPREC_CONV_NONDETERMINISTIC",
      "let convolutions use cuDNN algorithms that sum with atomics, not bit-repeatable",
      "deterministic convolution algorithms only");
  return on_off;
}

}  // namespace mixprec
