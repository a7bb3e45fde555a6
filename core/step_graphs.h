// Recording and replaying the device work of one training step (train.cuda_graph), for code
// that knows no CUDA: Backend::make_step_graphs() gives one on a backend that can (a CUDA
// graph per recording, cuda/cuda_graph.h), null elsewhere.
//
// A recording holds the work that `body` queues on the device, with the memory it used:
// each replay runs that work again on the same tensors, reading what they hold then. Nothing
// runs while recording. All recordings of one StepGraphs share one pool of device memory, so
// a step recorded again (after each resolve of the deferred steps) reuses the memory of the
// recording it replaces.
//
// Dropout masks: a recording made at dropout offset `base` (the model's dropout Generator's
// offset when the step starts) draws, at a replay given `base'`, the masks that the step
// would draw eagerly at offset base' (each call's key moved by base' - base). The caller
// moves its Generator past the step's draws after each replay.
#pragma once

#include <cstdint>
#include <functional>

namespace mixprec {

class StepGraphs {
 public:
  virtual ~StepGraphs() = default;
  // Records what `body` queues, in place of the previous recording (which is dropped
  // first). Throws mixprec::Error saying what the device refused (a host read, an upload of
  // caller data, the kernel profile); there is no recording then.
  // `dropout_base` is the dropout Generator's offset as the body starts (0 without one).
  virtual void record(const std::function<void()>& body, uint64_t dropout_base) = 0;
  // Queues one run of the recording, its dropout masks drawn from `dropout_base` on; throws
  // when there is none.
  virtual void replay(uint64_t dropout_base) = 0;
  // Forgets the recording, after waiting for its replays (its memory stays in the pool).
  virtual void drop() = 0;
  virtual bool recorded() const = 0;
};

}  // namespace mixprec
