// Fixed-width vectors for the CPU kernels' reductions, through the GCC/Clang vector
// extension: the compiler maps a vector onto the target's registers (one AVX-512 register, two
// AVX ones, four SSE ones) and every operation is lane by lane. A sum kept in kLanes lanes
// (value k of a run to lane k mod kLanes, lanes added in order at the end) therefore has the
// same order, and the same result, on every target; a single accumulator would be a serial
// chain of dependent adds that no compiler may reorder.
#pragma once

#include <cstdint>
#include <cstring>

namespace mixprec::cpu {

inline constexpr int kLanes = 8;

using Floats8 = float __attribute__((vector_size(kLanes * sizeof(float))));
using Doubles8 = double __attribute__((vector_size(kLanes * sizeof(double))));

// v = eight floats from p (any alignment). Vectors go by reference rather than by value:
// built for a baseline x86-64 (MIXPREC_NATIVE=OFF), GCC warns that passing these vectors by
// value has another ABI with AVX enabled.
inline void load8(const float* p, Floats8& v) { std::memcpy(&v, p, sizeof v); }

// d = f widened to double, lane by lane.
inline void widen8(const Floats8& f, Doubles8& d) { d = __builtin_convertvector(f, Doubles8); }

// acc lane k mod kLanes += term(k) for k in [0, len), len values from the start of a run (or
// of a block of it that starts at a multiple of kLanes): term8(k, acc) adds the terms of
// k .. k + kLanes - 1 as one vector, term(k) returns a single one for the tail.
template <class Term8, class Term>
void add_to_lanes(Doubles8& acc, int64_t len, const Term8& term8, const Term& term) {
  int64_t k = 0;
  for (; k + kLanes <= len; k += kLanes) term8(k, acc);
  for (; k < len; ++k) acc[k % kLanes] += term(k);
}

// acc += the eight values at p, widened to double.
inline void add_widened(const float* p, Doubles8& acc) {
  Floats8 f;
  load8(p, f);
  Doubles8 d;
  widen8(f, d);
  acc += d;
}

// The lanes added in lane order.
template <class Vec>
auto lane_total(const Vec& v) {
  auto total = v[0];
  for (int j = 1; j < kLanes; ++j) total += v[j];
  return total;
}

}  // namespace mixprec::cpu
