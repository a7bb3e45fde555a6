// Opt-in autotuning of the CUDA backend's cuDNN convolution algorithms, the counterpart of
// cuda/gemm_autotune.h (PyTorch users know it as torch.backends.cudnn.benchmark), and the
// switch that admits non-deterministic algorithms (at the end). No CUDA headers, so that the
// switches can be set from anywhere that links the backend.
//
// Off (the default), each convolution pass's plan (cuda/cuda_conv.cpp) takes the first
// algorithm of cuDNN's heuristic ranking that is deterministic and fits the workspace limit:
// the same choice in every run, so results repeat bit for bit. On, the first call of each new
// problem (pass, shapes, stride, padding, dtype, TF32 switch) times every such algorithm the
// heuristic offers on the backend's stream (cuda/autotune.h: one untimed call, then
// kAutotuneTimedCalls timed ones, the lowest median wins) and keeps the winner in the plan.
//
// - Determinism is kept: algorithms that sum with atomics in a run-dependent order are never
//   candidates (unless no deterministic one is offered at all, as without tuning, or the
//   non-deterministic switch below is on), so a tuned run repeats its own bits as long as
//   timing picks the same algorithms.
// - Caller's data: tuning calls read the caller's inputs and write into a scratch output of
//   the pass's output size, with beta = 0; the caller's output (which for a forward pass with
//   bias already holds the bias) is written only by the real call.
// - Cost: the tuning calls and one host wait on an event per new problem, on its first call
//   only; the wait is not counted in CudaBackend::host_syncs().
// - Numerics: algorithms may sum in different orders, so with autotune on the last bits of a
//   result may differ from those of the untuned plan, and from run to run when timing picks
//   differently. Off keeps the heuristic's choice.
// - Plans: whether a plan was tuned is part of its key, as for GEMMs: a heuristic plan is not
//   retuned by turning the switch on later, and a tuned plan is not retimed.
// - Failures: a candidate whose launch fails is skipped; when every candidate fails, or the
//   scratch memory cannot be allocated, the plan keeps the heuristic's choice.
#pragma once

#include <cstdint>

#include "cuda/autotune.h"

namespace mixprec {

// The convolution tuner (Autotuner of MIXPREC_CONV_AUTOTUNE): "1" on; "0" or unset off; any
// other value makes conv_autotune_enabled() throw mixprec::Error naming the variable and its
// value, until set_conv_autotune() is called. Thread-safe.
Autotuner& conv_autotuner();
inline bool conv_autotune_enabled() { return conv_autotuner().enabled(); }
inline void set_conv_autotune(bool on) { conv_autotuner().set(on); }
inline bool conv_autotune_from_environment() { return conv_autotuner().from_environment(); }
// Candidates timed so far by every convolution tuning of this process: it grows on the first
// call of a new problem with the switch on, when two or more algorithms qualify, and never on
// a repeated one.
inline uint64_t conv_autotune_candidates_timed() { return conv_autotuner().candidates_timed(); }

class ConvAutotuneScope : public AutotuneScope {
 public:
  explicit ConvAutotuneScope(bool on) : AutotuneScope(conv_autotuner(), on) {}
};

// MIXPREC_CONV_NONDETERMINISTIC ("1" on; "0" or unset off; EnvironmentSwitch's rules), or
// set_conv_nondeterministic(): on, a convolution plan chooses among all of cuDNN's ranked
// algorithms, those that sum with atomics included (PyTorch's default, with
// torch.backends.cudnn.deterministic = False): the heuristic's first one, or with autotuning
// the fastest of all. Off (the default), deterministic ones only, so that a run repeats its
// bits. The switch's value is part of a plan's key, as the autotune switch's is, so plans made
// under one setting are never reused under the other.
EnvironmentSwitch& conv_nondeterministic_switch();
inline bool conv_nondeterministic_allowed() { return conv_nondeterministic_switch().enabled(); }
inline void set_conv_nondeterministic(bool on) { conv_nondeterministic_switch().set(on); }

class ConvNondeterministicScope : public SwitchScope {
 public:
  explicit ConvNondeterministicScope(bool on) : SwitchScope(conv_nondeterministic_switch(), on) {}
};

}  // namespace mixprec
