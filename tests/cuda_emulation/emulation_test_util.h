// Shared by the tests of the emulated CUDA libraries (cuBLASLt, cuDNN).
#pragma once

#include <limits>

namespace emulation_test {

// What an output is filled with before a call, so that an element the call fails to write
// shows.
inline constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();

}  // namespace emulation_test
