// train.cuda_graph: the deferred training step (take_step) recorded once per window,
// the steps between two host reads, and replayed for the window's other steps
// (core/step_graphs.h; a CUDA graph on a GPU), so that a step costs the host one launch
// instead of one per kernel. The steps are those of the run without it, bit for bit.
//
// Each step:
// - The microbatches are copied into fixed device tensors that the recording reads (index
//   tensors keep their bounds, so the index checks need no device read).
// - Without a recording in this window: once the optimizer's buffers all exist
//   (Optimizer::buffers_started), take_step runs as the recording's body (its
//   host bookkeeping counts this step; nothing runs on the device then), and the recording
//   is replayed once; before that, take() returns nullopt and the caller takes the step
//   eagerly.
// - With one: a replay, then the host's bookkeeping of a step (DeferredSteps's
//   add_replayed_step; the host-side counters that the recorded forward moved, BatchNorm's
//   num_batches_tracked, moved again by as much; the dropout Generator moved past the step's
//   masks, which the replay drew from its offset on: core/step_graphs.h).
// - The loss returned is a copy: the recording rewrites its own at every replay.
// A step that does not fit the window's recording (other microbatch shapes, index tensors
// whose bounds are unknown or outside the data's: [0, classes) for targets,
// [0, BatchSource::input_index_bound()) for inputs), or whose hooks say eager_only (an
// injected fault), ends the window and returns nullopt, so the caller takes it eagerly with
// its usual checks. The caller ends the window itself at each resolve (the window's learning
// rates and step counts end there).
// Refused with mixprec::Error at the first recording: anything the device refuses to record
// (a host read or an upload inside the step, the kernel profile).
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <vector>

#include "amp/deferred_steps.h"
#include "apps/data/batch.h"
#include "apps/train/optimizer_step.h"
#include "apps/train/session.h"
#include "core/step_graphs.h"
#include "optim/lr_schedule.h"
#include "optim/optimizer.h"

namespace mixprec {

class RecordedStep {
 public:
  // Everything given outlives this object. `graphs` comes from the device's
  // Backend::make_step_graphs() and must not be null.
  RecordedStep(Session& s, Optimizer& optimizer, DeferredSteps& deferred,
               const LrSchedule& schedule, std::unique_ptr<StepGraphs> graphs);

  // Takes step `step` through the recording (see above): its loss, or nullopt for the
  // caller to take it eagerly.
  std::optional<Tensor> take(int64_t step, const std::vector<Batch>& batches,
                             const StepHooks& hooks);
  // The next step records anew.
  void end_window();

  int64_t recordings() const { return recordings_; }
  int64_t replays() const { return replays_; }

 private:
  // Copies `batches` into fixed_ (made anew, ending the window, when their shapes differ);
  // false when an index tensor's bounds do not fit.
  bool stage(const std::vector<Batch>& batches);
  void record(int64_t step, const StepHooks& hooks);
  // The host-side (CPU) buffers of the model, as values.
  std::vector<std::vector<double>> host_buffers() const;
  void move_host_buffers();
  // The dropout Generator's offset (0 without one).
  uint64_t dropout_offset() const;

  Session& s_;
  Optimizer& optimizer_;
  DeferredSteps& deferred_;
  const LrSchedule& schedule_;
  std::unique_ptr<StepGraphs> graphs_;
  std::vector<Batch> fixed_;
  Tensor loss_;  // the recording's own loss
  std::vector<std::vector<double>> host_moves_;  // per host buffer: what one step adds
  uint64_t recorded_base_ = 0;  // the dropout offset the recording was made at
  uint64_t dropout_draws_ = 0;  // the counters one step's masks take
  int64_t recordings_ = 0;
  int64_t replays_ = 0;
};

}  // namespace mixprec
