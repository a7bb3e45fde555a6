// Opt-in autotuning of the CUDA backend's cuBLASLt GEMM algorithms. No CUDA headers, so that
// the switch can be set from anywhere that links the backend.
//
// Off (the default), each GEMM problem's plan (cuda/cuda_gemm.cpp) takes the heuristic's first
// algorithm: the same choice in every run, so results repeat bit for bit. On, the first call of
// each new problem asks cuBLASLt for up to kGemmAutotuneCandidates algorithms (with the same
// preferences: workspace limit, operand alignments, FP32 split-K partial sums for a 16-bit
// output), times every one on the backend's stream (cuda/autotune.h: one untimed call, then
// kGemmAutotuneTimedCalls timed ones, the lowest median wins) and keeps the winner in the
// plan.
//
// - Caller's data: tuning calls read the caller's A, B and C (cuBLASLt's C is an input only)
//   and write D into a scratch buffer of C's layout from the backend's caching allocator, so
//   C is never written by tuning, and with beta != 0 the real call reads C's prior content,
//   not a tuning result. The scratch buffer and the largest candidate's workspace are held
//   for the duration of the tuning only.
// - Cost: the tuning calls and one host wait on an event per new problem, on its first call
//   only; later calls of the problem run the kept algorithm with no extra work, as with
//   tuning off. The wait is not a CudaBackend::synchronize() and is not counted in its
//   host_syncs().
// - Numerics: every candidate computes the backend's semantics (FP32 accumulation, one
//   rounding of D), but algorithms may sum the k products in different orders (tiles,
//   split-K), so with autotune on the last bits of a result may differ from run to run when
//   timing picks a different algorithm. Off keeps today's deterministic choice.
// - Plans: whether a plan was tuned is part of its key, so the switch's value at the time of
//   a call picks the tuned or the heuristic plan of its problem, each built on first use under
//   that value and never rebuilt (a heuristic plan is not retuned by turning the switch on
//   later, and a tuned plan is not retimed).
// - Failures: a candidate whose launch fails is skipped; when every candidate fails, or the
//   scratch output cannot be allocated, the plan keeps the heuristic's first algorithm.
#pragma once

#include <cstddef>
#include <cstdint>

#include "cuda/autotune.h"

namespace mixprec {

// Most heuristic candidates asked for and timed per problem.
inline constexpr int kGemmAutotuneCandidates = 8;
// Timed calls per candidate, after one untimed call.
inline constexpr int kGemmAutotuneTimedCalls = kAutotuneTimedCalls;

// The GEMM tuner (Autotuner of MIXPREC_GEMM_AUTOTUNE): "1" on; "0" or unset off; any other
// value makes gemm_autotune_enabled() throw mixprec::Error naming the variable and its value,
// until set_gemm_autotune() is called. Thread-safe.
Autotuner& gemm_autotuner();
inline bool gemm_autotune_enabled() { return gemm_autotuner().enabled(); }
// Sets the switch for the GEMM calls that follow; the environment is then no longer read.
inline void set_gemm_autotune(bool on) { gemm_autotuner().set(on); }
// The value MIXPREC_GEMM_AUTOTUNE gives the switch, read now; throws mixprec::Error for a
// value other than "1", "0" or unset.
inline bool gemm_autotune_from_environment() { return gemm_autotuner().from_environment(); }
// Candidates timed so far by every GEMM tuning of this process: it grows on the first call of
// a new problem with the switch on (by the number of candidates when there are several), and
// never on a repeated one.
inline uint64_t gemm_autotune_candidates_timed() { return gemm_autotuner().candidates_timed(); }

class GemmAutotuneScope : public AutotuneScope {
 public:
  explicit GemmAutotuneScope(bool on) : AutotuneScope(gemm_autotuner(), on) {}
};

// One problem's candidates, in the heuristic's order, for cuda/cuda_gemm.cpp (the output is
// of the caller's C's layout).
using GemmTuning = TuningCandidates;
inline size_t pick_fastest_gemm_candidate(const GemmTuning& tuning, CUstream_st* stream,
                                          CachingAllocator& allocator) {
  return gemm_autotuner().pick_fastest(tuning, stream, allocator);
}

}  // namespace mixprec
