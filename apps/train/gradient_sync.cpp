#include "apps/train/gradient_sync.h"

#include <chrono>
#include <utility>

#include "core/autograd/grad_mode.h"
#include "core/error.h"
#include "core/math/norm.h"
#include "core/ops/ops.h"

namespace mixprec {

namespace {

// Adds the wall time of its scope to `total`.
class Timed {
 public:
  explicit Timed(double& total) : total_(total), start_(std::chrono::steady_clock::now()) {}
  ~Timed() {
    total_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
  }

 private:
  double& total_;
  std::chrono::steady_clock::time_point start_;
};

void collect_norms(Module& module, std::vector<BatchNorm2d*>& out) {
  if (auto* norm = dynamic_cast<BatchNorm2d*>(&module)) out.push_back(norm);
  for (auto& [name, child] : module.named_children()) collect_norms(*child, out);
}

std::vector<float> host_values(const Tensor& t) { return t.to(kCPU).to_float_vector(); }

void write_values(const Tensor& t, const std::vector<float>& values) {
  Tensor target = t;
  target.copy_(Tensor::from_vector(values, t.shape(), DType::F32, kCPU).to(t.device()));
}

}  // namespace

GradientSync::GradientSync(dist::Communicator& ranks, std::vector<Parameter> params,
                           Module& model)
    : ranks_(ranks), params_(std::move(params)) {
  std::vector<BatchNorm2d*> layers;
  collect_norms(model, layers);
  for (BatchNorm2d* layer : layers) norms_.push_back(NormLayer{layer, layer->momentum(), {}, {}, 0});
}

void GradientSync::begin_step() {
  recorded_.clear();
  microbatches_ = 0;
  for (NormLayer& n : norms_) {
    n.mean = host_values(n.layer->running_mean());
    n.var = host_values(n.layer->running_var());
    n.tracked = n.layer->num_batches_tracked();
    n.layer->set_momentum(1.0);
  }
}

void GradientSync::after_forward() {
  ++microbatches_;
  for (NormLayer& n : norms_) {
    for (const Tensor& stat : {n.layer->running_mean(), n.layer->running_var()}) {
      const std::vector<float> values = host_values(stat);
      recorded_.insert(recorded_.end(), values.begin(), values.end());
      write_values(stat, std::vector<float>(values.size(), 0.0f));
    }
  }
}

void GradientSync::replay_running_statistics() {
  if (norms_.empty()) return;
  const Tensor mine =
      Tensor::from_vector(recorded_, {static_cast<int64_t>(recorded_.size())}, DType::F32, kCPU);
  const std::vector<float> all = ranks_.all_gather(mine).to_float_vector();
  const size_t per_micro = recorded_.size() / static_cast<size_t>(microbatches_);
  const size_t per_rank = recorded_.size();
  const int n = ranks_.size();
  // One process's microbatch k is rank k mod N's local microbatch k / N.
  for (int64_t k = 0; k < microbatches_ * n; ++k) {
    size_t at = static_cast<size_t>(k % n) * per_rank + static_cast<size_t>(k / n) * per_micro;
    for (NormLayer& layer : norms_) {
      const float momentum = static_cast<float>(layer.momentum);
      for (std::vector<float>* running : {&layer.mean, &layer.var}) {
        for (float& r : *running) r = running_stat_update(r, all[at++], momentum);
      }
    }
  }
  for (NormLayer& layer : norms_) {
    write_values(layer.layer->running_mean(), layer.mean);
    write_values(layer.layer->running_var(), layer.var);
    layer.layer->set_num_batches_tracked(layer.tracked + microbatches_ * n);
    layer.layer->set_momentum(layer.momentum);
  }
}

void GradientSync::reduce_gradients() {
  Timed timed(seconds_);
  replay_running_statistics();
  NoGradGuard no_grad;
  std::vector<Tensor> grads;
  for (const Parameter& p : params_) {
    const Tensor g = p.grad();
    if (!g.defined()) continue;
    MIXPREC_CHECK(g.dtype() == DType::F32, "GradientSync: ", p.name(),
                  "'s gradient is ", describe(g), "; ranks sum F32 gradient buffers");
    grads.push_back(g);
  }
  if (grads.empty()) return;
  std::vector<Tensor> pieces;
  for (const Tensor& g : grads) pieces.push_back(ops::reshape(g.detach(), {-1}));
  flat_ = pieces.size() == 1 ? pieces.front().clone() : ops::concat(pieces, 0);
  ranks_.sum_in_rank_order(flat_);
  int64_t offset = 0;
  for (Tensor& g : grads) {
    const int64_t n = g.numel();
    g.copy_(ops::reshape(ops::slice(flat_, 0, offset, offset + n), g.shape()));
    offset += n;
  }
}

void GradientSync::after_step() {
  if (shards_ == nullptr) return;
  Timed timed(seconds_);
  shards_->share_masters();
}

Tensor GradientSync::reduce_loss(const Tensor& loss) {
  Timed timed(seconds_);
  NoGradGuard no_grad;
  Tensor total = ops::reshape(loss.detach().to(DType::F32), {1}).clone();
  ranks_.sum_in_rank_order(total);
  return ops::reshape(total, loss.shape());
}

}  // namespace mixprec
