// build_cnn: an nn.Sequential of the listed layers, with shapes inferred from the input.
//
// The builder walks the layer list with the shape each layer will see ([N, C, H, W] until a
// flatten, [N, F] after), so a list that cannot run fails here, naming the layer, and not at
// the first training step deep inside an op.
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "core/error.h"
#include "layers/activations.h"
#include "layers/batch_norm2d.h"
#include "layers/conv2d.h"
#include "layers/dropout.h"
#include "layers/flatten.h"
#include "layers/linear.h"
#include "layers/model_builder.h"
#include "layers/pooling.h"
#include "layers/sequential.h"

namespace mixprec {
namespace {

// The shape after the batch dimension: {C, H, W} or {F}.
using FeatureShape = std::vector<int64_t>;

std::string shape_with_batch(const FeatureShape& s) {
  std::ostringstream out;
  out << "[N";
  for (int64_t d : s) out << ", " << d;
  out << "]";
  return out.str();
}

struct LayerContext {
  size_t index;
  const CnnLayerSpec& layer;
  const FeatureShape& in;

  template <class... Parts>
  [[noreturn]] void fail(const Parts&... parts) const {
    MIXPREC_FAIL("model.layers[", index, "] (", cnn_layer_kind_name(layer.kind), "): ", parts...);
  }
  template <class... Parts>
  void check(bool cond, const Parts&... parts) const {
    if (!cond) fail(parts...);
  }
  void require_image(const char* after_flatten_hint) const {
    check(in.size() == 3, "expects a 4-D input [N, C, H, W], got ", shape_with_batch(in), "; ",
          after_flatten_hint);
  }
  // The sliding window must fit the padded input, else the output would be empty.
  void require_window_fits(int64_t kernel, int64_t padding) const {
    const int64_t h = in[1] + 2 * padding, w = in[2] + 2 * padding;
    check(h >= kernel && w >= kernel, "kernel ", kernel, " is larger than the padded input ", h,
          "x", w, " (input ", shape_with_batch(in), ", padding ", padding,
          "), so the spatial size would reach 0");
  }
};

// Whether layer i is a batchnorm that applies the relu right after it.
bool fuses_relu(const CnnSpec& spec, size_t i) {
  return spec.fuse_batchnorm_relu && i + 1 < spec.layers.size() &&
         spec.layers[i].kind == CnnLayerSpec::Kind::BatchNorm &&
         spec.layers[i + 1].kind == CnnLayerSpec::Kind::ReLU;
}

int64_t window_out(int64_t in, int64_t kernel, int64_t stride, int64_t padding) {
  return (in + 2 * padding - kernel) / stride + 1;
}

}  // namespace

std::shared_ptr<Module> build_cnn(const CnnSpec& spec, Generator& init,
                                  std::shared_ptr<Generator> dropout_gen, Device device) {
  MIXPREC_CHECK(spec.in_channels >= 1, "model.in_channels must be >= 1, got ", spec.in_channels);
  MIXPREC_CHECK(spec.input_size >= 1, "model.input_size must be >= 1, got ", spec.input_size);
  MIXPREC_CHECK(!spec.layers.empty(), "model.layers is empty: a cnn needs at least one layer");

  auto model = std::make_shared<Sequential>();
  FeatureShape shape{spec.in_channels, spec.input_size, spec.input_size};
  for (size_t i = 0; i < spec.layers.size(); ++i) {
    const CnnLayerSpec& layer = spec.layers[i];
    const LayerContext at{i, layer, shape};
    FeatureShape next = shape;
    switch (layer.kind) {
      case CnnLayerSpec::Kind::Conv: {
        at.require_image("a conv cannot follow a flatten");
        at.check(layer.out >= 1, "out channels must be >= 1, got ", layer.out);
        at.check(layer.kernel >= 1, "kernel must be >= 1, got ", layer.kernel);
        at.check(layer.stride >= 1, "stride must be >= 1, got ", layer.stride);
        at.check(layer.padding >= 0, "padding must be >= 0, got ", layer.padding);
        at.require_window_fits(layer.kernel, layer.padding);
        next = {layer.out, window_out(shape[1], layer.kernel, layer.stride, layer.padding),
                window_out(shape[2], layer.kernel, layer.stride, layer.padding)};
        model->append(std::make_shared<Conv2d>(shape[0], layer.out, layer.kernel, layer.stride,
                                               layer.padding, layer.bias, init, device));
        break;
      }
      case CnnLayerSpec::Kind::BatchNorm: {
        at.require_image("batchnorm is BatchNorm2d and normalises channels of [N, C, H, W]");
        auto norm = model->append(std::make_shared<BatchNorm2d>(shape[0], device));
        if (fuses_relu(spec, i)) norm->fuse_relu();
        break;
      }
      case CnnLayerSpec::Kind::ReLU:
        model->append(std::make_shared<ReLU>(i > 0 && fuses_relu(spec, i - 1)));
        break;
      case CnnLayerSpec::Kind::GELU:
        model->append(std::make_shared<GELU>());
        break;
      case CnnLayerSpec::Kind::MaxPool:
      case CnnLayerSpec::Kind::AvgPool: {
        at.require_image("pooling cannot follow a flatten");
        const int64_t stride = layer.stride <= 0 ? layer.kernel : layer.stride;
        at.check(layer.kernel >= 1, "kernel must be >= 1, got ", layer.kernel);
        at.check(layer.padding >= 0 && layer.padding <= layer.kernel / 2,
                 "padding must be in [0, kernel / 2 = ", layer.kernel / 2, "], got ",
                 layer.padding);
        at.require_window_fits(layer.kernel, layer.padding);
        next = {shape[0], window_out(shape[1], layer.kernel, stride, layer.padding),
                window_out(shape[2], layer.kernel, stride, layer.padding)};
        if (layer.kind == CnnLayerSpec::Kind::MaxPool)
          model->append(std::make_shared<MaxPool2d>(layer.kernel, stride, layer.padding));
        else
          model->append(std::make_shared<AvgPool2d>(layer.kernel, stride, layer.padding));
        break;
      }
      case CnnLayerSpec::Kind::Flatten: {
        int64_t features = 1;
        for (int64_t d : shape) features *= d;
        next = {features};
        model->append(std::make_shared<Flatten>());
        break;
      }
      case CnnLayerSpec::Kind::Linear:
        at.check(shape.size() == 1, "expects a 2-D input [N, features], got ",
                 shape_with_batch(shape), "; add a flatten before it");
        at.check(layer.out >= 1, "out features must be >= 1, got ", layer.out);
        next = {layer.out};
        model->append(std::make_shared<Linear>(shape[0], layer.out, layer.bias, init, device));
        break;
      case CnnLayerSpec::Kind::Dropout:
        at.check(layer.p >= 0.0 && layer.p < 1.0, "p must be in [0, 1), got ", layer.p);
        at.check(layer.p == 0.0 || dropout_gen != nullptr,
                 "dropout needs a generator for its masks, got none");
        model->append(std::make_shared<Dropout>(layer.p, dropout_gen));
        break;
    }
    shape = std::move(next);
  }
  model->assign_names();
  return model;
}

}  // namespace mixprec
