// Recording and replaying the device work of one training step (train.cuda_graph), for code
// that knows no CUDA: Backend::make_step_graphs() gives one on a backend that can (a CUDA
// graph per recording, cuda/cuda_graph.h), null elsewhere.
//
// A recording holds the work that `body` queues on the device, with the memory it used:
// each replay runs that work again on the same tensors, reading what they hold then. Nothing
// runs while recording. All recordings of one StepGraphs share one pool of device memory, so
// a step recorded again (after each resolve of the deferred steps) reuses the memory of the
// recording it replaces.
#pragma once

#include <functional>

namespace mixprec {

class StepGraphs {
 public:
  virtual ~StepGraphs() = default;
  // Records what `body` queues, in place of the previous recording (which is dropped
  // first). Throws mixprec::Error saying what the device refused (a host read, an upload of
  // caller data, the kernel profile); there is no recording then.
  virtual void record(const std::function<void()>& body) = 0;
  // Queues one run of the recording; throws when there is none.
  virtual void replay() = 0;
  // Forgets the recording, after waiting for its replays (its memory stays in the pool).
  virtual void drop() = 0;
  virtual bool recorded() const = 0;
};

}  // namespace mixprec
