#include "apps/train/recorded_step.h"

#include <optional>
#include <utility>

#include "core/error.h"

namespace mixprec {
namespace {

bool same_layout(const Tensor& a, const Tensor& b) {
  return a.defined() == b.defined() &&
         (!a.defined() || (a.shape() == b.shape() && a.dtype() == b.dtype()));
}

// An index tensor's bounds are known and inside [0, *upper); without an upper bound an index
// tensor does not fit, since the recording could not check it. Other dtypes always fit.
bool indices_fit(const Tensor& t, std::optional<int64_t> upper) {
  if (!t.defined() || t.dtype() != DType::I32) return true;
  const auto bounds = t.index_bounds();
  return upper && bounds && bounds->lowest >= 0 && bounds->highest < *upper;
}

}  // namespace

RecordedStep::RecordedStep(Session& s, Optimizer& optimizer, DeferredSteps& deferred,
                           const LrSchedule& schedule, std::unique_ptr<StepGraphs> graphs)
    : s_(s), optimizer_(optimizer), deferred_(deferred), schedule_(schedule),
      graphs_(std::move(graphs)) {
  MIXPREC_CHECK(graphs_ != nullptr, "RecordedStep: no step graphs for ", s.device);
}

void RecordedStep::end_window() {
  graphs_->drop();
  loss_ = Tensor();
}

bool RecordedStep::stage(const std::vector<Batch>& batches) {
  const std::optional<int64_t> input_upper = s_.data->input_index_bound();
  for (const Batch& batch : batches) {
    if (!indices_fit(batch.inputs, input_upper) ||
        !indices_fit(batch.targets, s_.data->num_classes()))
      return false;
  }
  bool fits = fixed_.size() == batches.size();
  for (size_t i = 0; fits && i < batches.size(); ++i)
    fits = same_layout(fixed_[i].inputs, batches[i].inputs) &&
           same_layout(fixed_[i].targets, batches[i].targets);
  if (!fits) {
    // New tensors: a recording that read the old ones ends here.
    end_window();
    fixed_.clear();
    for (const Batch& batch : batches) {
      Batch fixed;
      fixed.inputs = Tensor::empty(batch.inputs.shape(), batch.inputs.dtype(), s_.device);
      fixed.targets = Tensor::empty(batch.targets.shape(), batch.targets.dtype(), s_.device);
      fixed_.push_back(std::move(fixed));
    }
  }
  for (size_t i = 0; i < batches.size(); ++i) {
    fixed_[i].inputs.copy_(batches[i].inputs);
    fixed_[i].targets.copy_(batches[i].targets);
    fixed_[i].number = batches[i].number;
    fixed_[i].epoch = batches[i].epoch;
    fixed_[i].input_scan = batches[i].input_scan;
  }
  return true;
}

std::vector<std::vector<double>> RecordedStep::host_buffers() const {
  std::vector<std::vector<double>> values;
  for (const auto& [name, buffer] : s_.model->named_buffers()) {
    if (!buffer.device().is_cpu()) continue;
    std::vector<double> v(static_cast<size_t>(buffer.numel()));
    for (int64_t i = 0; i < buffer.numel(); ++i) v[static_cast<size_t>(i)] = buffer.get(i);
    values.push_back(std::move(v));
  }
  return values;
}

void RecordedStep::move_host_buffers() {
  size_t k = 0;
  for (auto& [name, buffer] : s_.model->named_buffers()) {
    if (!buffer.device().is_cpu()) continue;
    const std::vector<double>& move = host_moves_.at(k++);
    for (int64_t i = 0; i < buffer.numel(); ++i) {
      const double by = move[static_cast<size_t>(i)];
      if (by != 0.0) buffer.set(i, buffer.get(i) + by);
    }
  }
}

uint64_t RecordedStep::dropout_offset() const {
  return s_.dropout_gen ? s_.dropout_gen->offset() : 0;
}

void RecordedStep::record(int64_t step, const StepHooks& hooks) {
  recorded_base_ = dropout_offset();
  const std::vector<std::vector<double>> before = host_buffers();
  try {
    graphs_->record(
        [&] { loss_ = take_step(s_, optimizer_, deferred_, schedule_, fixed_, hooks); },
        recorded_base_);
  } catch (const std::exception& e) {
    MIXPREC_FAIL("train.cuda_graph: recording step ", step, " failed: ", e.what(),
                 ". Set train.cuda_graph: false to train without recording the step");
  }
  // The counters the step's dropout masks took, which each replay takes anew.
  dropout_draws_ = dropout_offset() - recorded_base_;
  const std::vector<std::vector<double>> after = host_buffers();
  host_moves_.assign(after.size(), {});
  for (size_t k = 0; k < after.size(); ++k) {
    host_moves_[k].resize(after[k].size());
    for (size_t i = 0; i < after[k].size(); ++i) host_moves_[k][i] = after[k][i] - before[k][i];
  }
  ++recordings_;
}

std::optional<Tensor> RecordedStep::take(int64_t step, const std::vector<Batch>& batches,
                                         const StepHooks& hooks) {
  if (!graphs_->recorded() && !optimizer_.buffers_started()) return std::nullopt;
  if (hooks.eager_only || !stage(batches)) {
    end_window();
    return std::nullopt;
  }
  if (graphs_->recorded()) {
    const uint64_t base = dropout_offset();
    graphs_->replay(base);
    if (s_.dropout_gen) s_.dropout_gen->set_state(s_.dropout_gen->seed(), base + dropout_draws_);
    deferred_.add_replayed_step();
    move_host_buffers();
    ++replays_;
  } else {
    // Recording moved the Generator past this step's draws already.
    record(step, hooks);
    graphs_->replay(recorded_base_);
    deferred_.keep_captured_step();
  }
  return loss_.clone();
}

}  // namespace mixprec
