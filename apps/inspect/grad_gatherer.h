// Gathers a model's gradients for `mixprec inspect`: |activation gradient| per layer output
// and |weight gradient| per parameter, into GradHistograms and one ScaleProfile.
//
// Layers are every leaf module (a module without children) and every transformer Block,
// named by their dotted module path ("0", "transformer.h.1", "transformer.h.0.attn.c_attn").
// While the gatherer lives, each of them carries a forward hook that puts ops::grad_tap on
// its output, so backward hands each output's gradient to the gatherer; the destructor
// removes the hooks (and replaces none: a module that already had a hook is an error).
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "apps/data/batch.h"
#include "apps/inspect/grad_histogram.h"
#include "core/device.h"
#include "layers/module.h"

namespace mixprec::inspect {

struct NamedHistogram {
  std::string name;  // dotted module path (activations) or parameter name (weights)
  GradHistogram histogram;
};

struct GatheredGradients {
  // Module-tree order; layers whose output received no gradient (e.g. it never reached the
  // loss) are left out.
  std::vector<NamedHistogram> activations;
  // One per parameter of model.named_parameters(), in that order (a parameter without a
  // gradient has elements 0).
  std::vector<NamedHistogram> weights;
  ScaleProfile profile;  // every non-zero value of both kinds
};

class GradGatherer {
 public:
  // `model` must outlive the gatherer. `scale` is the S of the histograms' scaled counts.
  GradGatherer(Module& model, double scale);
  ~GradGatherer();
  GradGatherer(const GradGatherer&) = delete;
  GradGatherer& operator=(const GradGatherer&) = delete;

  // The layer names that carry a tap, in module-tree order.
  std::vector<std::string> layer_names() const;

  // One forward (train mode, as training runs it) and one backward of the unscaled mean
  // cross-entropy of `batch` through the model in FP32 (apps/train/batch_loss.h), counting
  // every activation and weight gradient; the parameters' gradients are dropped afterwards.
  // The model's parameters must be F32 (the FP32 shadow of a mixed-precision model).
  void gather_batch(const Batch& batch, Device device);

  // What was gathered over every gather_batch call so far.
  GatheredGradients result() const;

 private:
  struct Layer {
    std::string name;
    std::shared_ptr<Module> module;
    GradHistogram histogram;
  };
  void record(size_t layer, const Tensor& grad);

  Module& model_;
  double scale_;
  std::vector<Layer> layers_;
  std::vector<NamedHistogram> weights_;
  ScaleProfile profile_;
};

}  // namespace mixprec::inspect
