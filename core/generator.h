// Generator: a seed and a counter offset. Each random fill or dropout mask takes the next
// block of counters, so a run is reproducible from its seed and the state can be saved and
// restored exactly (two integers).
#pragma once

#include <cstdint>

#include "core/philox.h"

namespace mixprec {

class Generator {
 public:
  explicit Generator(uint64_t seed = 0) : seed_(seed) {}
  uint64_t seed() const { return seed_; }
  uint64_t offset() const { return offset_; }
  void set_state(uint64_t seed, uint64_t offset) {
    seed_ = seed;
    offset_ = offset;
  }
  // Reserves `count` counters and returns the key of the first.
  PhiloxKey next(uint64_t count) {
    const PhiloxKey key{seed_, offset_};
    offset_ += count;
    return key;
  }

 private:
  uint64_t seed_ = 0;
  uint64_t offset_ = 0;
};

// The process-wide default generator (used when an op is given none).
Generator& default_generator();

}  // namespace mixprec
