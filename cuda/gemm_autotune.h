// Opt-in autotuning of the CUDA backend's cuBLASLt GEMM algorithms. No CUDA headers, so that
// the switch can be set from anywhere that links the backend.
//
// Off (the default), each GEMM problem's plan (cuda/cuda_gemm.cpp) takes the heuristic's first
// algorithm: the same choice in every run, so results repeat bit for bit. On, the first call of
// each new problem asks cuBLASLt for up to kGemmAutotuneCandidates algorithms (with the same
// preferences: workspace limit, operand alignments, FP32 split-K partial sums for a 16-bit
// output), times every one on the backend's stream with cudaEvents (one untimed call, then
// kGemmAutotuneTimedCalls timed ones) and keeps the one of lowest median time in the plan. The
// median, not the minimum: one disturbed call (a clock change, another process's kernel)
// moves neither the figure nor the ranking, and no candidate wins on its one luckiest call.
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
#include <functional>
#include <vector>

// The CUDA runtime's stream type (cudaStream_t is CUstream_st*), declared here so that this
// header needs no CUDA header.
struct CUstream_st;

namespace mixprec {

class CachingAllocator;

// Most heuristic candidates asked for and timed per problem.
inline constexpr int kGemmAutotuneCandidates = 8;
// Timed calls per candidate, after one untimed call.
inline constexpr int kGemmAutotuneTimedCalls = 3;

// The process-wide switch. Its starting value comes from the environment variable
// MIXPREC_GEMM_AUTOTUNE ("1" on; "0" or unset off), read on the first call of
// gemm_autotune_enabled() unless set_gemm_autotune() came first; any other value of the
// variable makes that call (and every later one, until set_gemm_autotune) throw
// mixprec::Error naming the variable and its value. Thread-safe.
bool gemm_autotune_enabled();
// Sets the switch for the GEMM calls that follow; the environment is then no longer read.
void set_gemm_autotune(bool on);

// Sets the switch for one scope and puts the previous value back at its end (a benchmark or
// test that compares tuned with untuned GEMMs).
class GemmAutotuneScope {
 public:
  explicit GemmAutotuneScope(bool on) : previous_(gemm_autotune_enabled()) {
    set_gemm_autotune(on);
  }
  ~GemmAutotuneScope() { set_gemm_autotune(previous_); }
  GemmAutotuneScope(const GemmAutotuneScope&) = delete;
  GemmAutotuneScope& operator=(const GemmAutotuneScope&) = delete;

 private:
  bool previous_;
};
// The value MIXPREC_GEMM_AUTOTUNE gives the switch, read now; throws mixprec::Error for a
// value other than "1", "0" or unset.
bool gemm_autotune_from_environment();

// Candidates timed so far by every tuning of this process (those whose launches all
// succeeded), for tests and logs: it grows on the first call of a new problem with the switch
// on (by the number of candidates when there are several), and never on a repeated one.
uint64_t gemm_autotune_candidates_timed();

// ---- the tuner (used by cuda/cuda_gemm.cpp) ----------------------------------------------

// One problem's candidates, in the heuristic's order.
struct GemmTuning {
  // Workspace bytes of each candidate; its size is the number of candidates.
  std::vector<size_t> workspace_bytes;
  // Bytes of the scratch output, of the caller's C's layout.
  size_t output_bytes = 0;
  // Queues one call of candidate `index` on the stream, writing D to `output` and using
  // `workspace` (at least workspace_bytes[index] bytes, null when that is 0); returns false
  // when the launch failed.
  std::function<bool(size_t index, void* output, void* workspace)> launch;
};

// Times the candidates on `stream` (allocating from `allocator`) as described above, and
// returns the index of the one with the lowest median time; 0, with nothing timed, when
// there are fewer than two candidates, when none could be timed or when the scratch output
// cannot be allocated. Waits for the stream once. Throws mixprec::Error for a CUDA error of
// the events themselves.
size_t pick_fastest_gemm_candidate(const GemmTuning& tuning, CUstream_st* stream,
                                   CachingAllocator& allocator);

}  // namespace mixprec
