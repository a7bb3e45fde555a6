// distributed.shard_optimizer (ZeRO stage 1): each FP32 master and its optimizer state is
// owned by one rank, which alone updates it; after the step every rank gathers the updated
// masters of the others. The gradients are still summed over every rank (GradientSync), so
// the skip decision, the clip norm and the update of each parameter are those of the
// replicated optimizer: the two give the same bits.
//
// A parameter's owner is the rank with the fewest elements owned so far when its turn comes,
// in parameter order (the lowest such rank on a tie): balanced, and the same on every rank.
#pragma once

#include <cstdint>
#include <vector>

#include "dist/communicator.h"
#include "layers/parameter.h"
#include "optim/optimizer.h"

namespace mixprec {

class OptimizerShards {
 public:
  // Hands `optimizer` the parameters this rank owns (Optimizer::set_owned, which drops the
  // others' state, such as a checkpoint's restored in full).
  OptimizerShards(dist::Communicator& ranks, std::vector<Parameter> params, Optimizer& optimizer);

  // owners()[i]: the rank that owns params[i].
  const std::vector<int>& owners() const { return owners_; }

  // After the step: every master becomes its owner's (one all-gather), and the working
  // copies follow.
  void share_masters();

  // The optimizer's whole state as one process would save it: each parameter's buffers and
  // per-parameter scalars from its owner (a collective: every rank calls it).
  OptimizerState gather_state() const;


 private:
  dist::Communicator& ranks_;
  std::vector<Parameter> params_;
  Optimizer& optimizer_;
  std::vector<int> owners_;
};

// Bytes of optimizer state `optimizer` holds (its buffers; a sharded one's own share).
int64_t optimizer_state_bytes(const Optimizer& optimizer);

}  // namespace mixprec
