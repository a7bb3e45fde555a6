// What the ranks of a data-parallel run exchange inside a training step: after backward, the
// gradients and the step's loss, summed over ranks in rank order (dist/communicator.h), so
// that every rank holds the bits that one process taking all the step's microbatches would.
//
// Why that holds: a process with accumulation_steps A adds each microbatch's gradient into
// zeroed F32 buffers in turn, ((+0 + g_0) + g_1) + ..., and the rank-ordered sum adds the
// ranks' buffers in the same order. With one microbatch per rank (A = 1) the sums are the
// same additions; with A > 1 each rank first sums its own microbatches, so the result equals
// one process's to FP32 rounding, not bit for bit.
#pragma once

#include <vector>

#include "apps/train/optimizer_shards.h"
#include "core/tensor.h"
#include "dist/communicator.h"
#include "layers/batch_norm2d.h"
#include "layers/module.h"
#include "layers/parameter.h"

namespace mixprec {

// Batch norm: one process updates the running statistics once per microbatch, in microbatch
// order; each rank only sees its own. So during a step every rank records its microbatches'
// batch statistics instead (momentum 1 from zeroed buffers leaves exactly the batch values),
// and reduce_gradients gathers them and replays every update in one process's order, with
// the kernel's own arithmetic (core/math/norm.h's running_stat_update): every rank ends with
// the running statistics and num_batches_tracked of one process.
class GradientSync {
 public:
  // `model`: its BatchNorm2d layers have their running statistics kept in step as above.
  GradientSync(dist::Communicator& ranks, std::vector<Parameter> params, Module& model);

  int ranks() const { return ranks_.size(); }

  // Before a step's first forward, and after each microbatch's forward.
  void begin_step();
  void after_forward();
  // After the optimizer's step: with a sharded optimizer, every rank takes the masters their
  // owners updated (OptimizerShards::share_masters).
  void after_step();
  void shard(OptimizerShards* shards) { shards_ = shards; }

  // Every trainable parameter's F32 .grad becomes the rank-ordered sum over ranks, through
  // one flat buffer (one collective a step). Parameters without a .grad on this rank must
  // have none on every rank (the same model on every rank makes it so).
  void reduce_gradients();
  // `loss`, this rank's share of the step's loss (an F32 scalar), summed over ranks in rank
  // order: the step's loss.
  Tensor reduce_loss(const Tensor& loss);

  // Wall time spent in this rank's exchanges so far (the collectives and the copies around
  // them), for summary.json.
  double seconds() const { return seconds_; }

 private:
  struct NormLayer {
    BatchNorm2d* layer;
    double momentum;               // the layer's own, restored after the step
    std::vector<float> mean, var;  // the running statistics as the step started
    int64_t tracked = 0;
  };
  void replay_running_statistics();

  dist::Communicator& ranks_;
  std::vector<Parameter> params_;
  std::vector<NormLayer> norms_;
  std::vector<float> recorded_;  // per microbatch, per layer: its batch mean, then variance
  int64_t microbatches_ = 0;     // this rank's, in this step
  Tensor flat_;  // F32 [total gradient elements]: the last step's gradients, one buffer
  double seconds_ = 0.0;
  OptimizerShards* shards_ = nullptr;
};

}  // namespace mixprec
