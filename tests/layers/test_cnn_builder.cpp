// build_cnn: the layer list becomes an nn.Sequential with torch's names, inferred channel
// and feature counts, and a forward that composes the layers in order; lists that cannot run
// fail at build time naming the layer; F16 and BF16 forward and backward work.
#include <catch2/catch.hpp>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "core/generator.h"
#include "core/ops/ops.h"
#include "layer_test_util.h"
#include "layers/activations.h"
#include "layers/batch_norm2d.h"
#include "layers/conv2d.h"
#include "layers/dropout.h"
#include "layers/flatten.h"
#include "layers/linear.h"
#include "layers/model_builder.h"
#include "layers/pooling.h"
#include "layers/sequential.h"

using namespace mixprec;
using namespace mixprec::layers_test;
using Catch::Contains;
using Kind = CnnLayerSpec::Kind;

namespace {

CnnLayerSpec conv(int64_t out, int64_t kernel, int64_t padding, int64_t stride = 1) {
  CnnLayerSpec l;
  l.kind = Kind::Conv;
  l.out = out;
  l.kernel = kernel;
  l.padding = padding;
  l.stride = stride;
  return l;
}
CnnLayerSpec pool(Kind kind, int64_t kernel, int64_t stride = 0, int64_t padding = 0) {
  CnnLayerSpec l;
  l.kind = kind;
  l.kernel = kernel;
  l.stride = stride;  // 0: the kernel, as the config loader's default
  l.padding = padding;
  return l;
}
CnnLayerSpec linear(int64_t out, bool bias = true) {
  CnnLayerSpec l;
  l.kind = Kind::Linear;
  l.out = out;
  l.bias = bias;
  return l;
}
CnnLayerSpec plain(Kind kind) {
  CnnLayerSpec l;
  l.kind = kind;
  return l;
}
CnnLayerSpec dropout(double p) {
  CnnLayerSpec l;
  l.kind = Kind::Dropout;
  l.p = p;
  return l;
}

// The MNIST classifier of the configs: conv32 k3 p1, bn, relu, maxpool2, conv64 k3 p1, bn,
// relu, maxpool2, flatten, linear128, relu, linear10.
CnnSpec mnist_spec() {
  CnnSpec spec;
  spec.in_channels = 1;
  spec.input_size = 28;
  spec.layers = {conv(32, 3, 1),       plain(Kind::BatchNorm),
                 plain(Kind::ReLU),    pool(Kind::MaxPool, 2),
                 conv(64, 3, 1),       plain(Kind::BatchNorm),
                 plain(Kind::ReLU),    pool(Kind::MaxPool, 2),
                 plain(Kind::Flatten), linear(128),
                 plain(Kind::ReLU),    linear(10)};
  return spec;
}

std::string build_error(const CnnSpec& spec) {
  Generator init(0);
  try {
    build_cnn(spec, init, std::make_shared<Generator>(1));
  } catch (const Error& e) {
    return e.what();
  }
  return "(no error)";
}

CnnSpec with_layers(std::vector<CnnLayerSpec> layers, int64_t size = 28, int64_t channels = 1) {
  CnnSpec spec;
  spec.in_channels = channels;
  spec.input_size = size;
  spec.layers = std::move(layers);
  return spec;
}

}  // namespace

TEST_CASE("cnn layer kinds have the config's names", "[layers][cnn]") {
  CHECK(std::string(cnn_layer_kind_name(Kind::Conv)) == "conv");
  CHECK(std::string(cnn_layer_kind_name(Kind::BatchNorm)) == "batchnorm");
  CHECK(std::string(cnn_layer_kind_name(Kind::ReLU)) == "relu");
  CHECK(std::string(cnn_layer_kind_name(Kind::GELU)) == "gelu");
  CHECK(std::string(cnn_layer_kind_name(Kind::MaxPool)) == "maxpool");
  CHECK(std::string(cnn_layer_kind_name(Kind::AvgPool)) == "avgpool");
  CHECK(std::string(cnn_layer_kind_name(Kind::Flatten)) == "flatten");
  CHECK(std::string(cnn_layer_kind_name(Kind::Linear)) == "linear");
  CHECK(std::string(cnn_layer_kind_name(Kind::Dropout)) == "dropout");
}

TEST_CASE("build_cnn gives the MNIST classifier torch's nn.Sequential state dict",
          "[layers][cnn]") {
  Generator init(42);
  auto model = build_cnn(mnist_spec(), init, std::make_shared<Generator>(1));
  std::vector<std::pair<std::string, Shape>> got;
  for (const auto& [name, t] : model->state_dict()) got.emplace_back(name, t.shape());
  const std::vector<std::pair<std::string, Shape>> torch = {{"0.weight", {32, 1, 3, 3}},
                                                            {"0.bias", {32}},
                                                            {"1.weight", {32}},
                                                            {"1.bias", {32}},
                                                            {"1.running_mean", {32}},
                                                            {"1.running_var", {32}},
                                                            {"1.num_batches_tracked", {}},
                                                            {"4.weight", {64, 32, 3, 3}},
                                                            {"4.bias", {64}},
                                                            {"5.weight", {64}},
                                                            {"5.bias", {64}},
                                                            {"5.running_mean", {64}},
                                                            {"5.running_var", {64}},
                                                            {"5.num_batches_tracked", {}},
                                                            {"9.weight", {128, 3136}},
                                                            {"9.bias", {128}},
                                                            {"11.weight", {10, 128}},
                                                            {"11.bias", {10}}};
  CHECK(got == torch);
  const int64_t count =
      (32 * 9 + 32) + 2 * 32 + (64 * 32 * 9 + 64) + 2 * 64 + (128 * 3136 + 128) + (10 * 128 + 10);
  CHECK(model->parameter_count() == count);
  // Names were assigned and the working dtype left at F32.
  for (const auto& [name, p] : model->named_parameters()) {
    CHECK(p.name() == name);
    CHECK(p.working_dtype() == DType::F32);
  }
  // The layers are the kinds listed, with torch's default init bounds from the inferred sizes.
  auto* seq = dynamic_cast<Sequential*>(model.get());
  REQUIRE(seq != nullptr);
  REQUIRE(seq->size() == 12);
  CHECK(dynamic_cast<Conv2d*>(seq->at(0).get()) != nullptr);
  CHECK(dynamic_cast<BatchNorm2d*>(seq->at(5).get())->num_features() == 64);
  CHECK(dynamic_cast<MaxPool2d*>(seq->at(7).get())->stride() == 2);
  CHECK(dynamic_cast<Flatten*>(seq->at(8).get()) != nullptr);
  auto* fc = dynamic_cast<Linear*>(seq->at(9).get());
  REQUIRE(fc != nullptr);
  CHECK(fc->in_features() == 3136);
  const double bound = 1.0 / std::sqrt(3136.0);
  CHECK(max_abs(fc->weight().master()) <= bound);
  CHECK(sample_stats(fc->weight().master()).std == Approx(bound / std::sqrt(3.0)).epsilon(0.02));
}

TEST_CASE("the built CNN composes its layers in order", "[layers][cnn]") {
  Generator init(7);
  auto model = build_cnn(mnist_spec(), init, std::make_shared<Generator>(1));
  const Tensor x = random_tensor({3, 1, 28, 28}, 31, 0.f, 1.f);
  const Tensor y = (*model)(x);
  CHECK(y.shape() == Shape{3, 10});
  CHECK(all_finite(y));

  // In eval mode, against the ops applied by hand to the model's tensors.
  model->eval();
  auto p = [&](const std::string& name) {
    for (const auto& [n, param] : model->named_parameters())
      if (n == name) return param.working();
    FAIL("no parameter " << name);
    return Tensor();
  };
  auto buffer = [&](const std::string& name) {
    for (const auto& [n, t] : model->named_buffers())
      if (n == name) return t;
    FAIL("no buffer " << name);
    return Tensor();
  };
  Tensor rm1 = buffer("1.running_mean"), rv1 = buffer("1.running_var");
  Tensor rm5 = buffer("5.running_mean"), rv5 = buffer("5.running_var");
  Tensor h = ops::conv2d(x, p("0.weight"), p("0.bias"), 1, 1);
  h = ops::max_pool2d(ops::relu(ops::batch_norm2d(h, p("1.weight"), p("1.bias"), rm1, rv1, false)),
                      2, 2);
  h = ops::conv2d(h, p("4.weight"), p("4.bias"), 1, 1);
  h = ops::max_pool2d(ops::relu(ops::batch_norm2d(h, p("5.weight"), p("5.bias"), rm5, rv5, false)),
                      2, 2);
  h = ops::reshape(h, {3, 3136});
  h = ops::linear(ops::relu(ops::linear(h, p("9.weight"), p("9.bias"))), p("11.weight"),
                  p("11.bias"));
  CHECK(same_values((*model)(x), h));
}

TEST_CASE("build_cnn infers shapes through strides, padding, pools and other kinds",
          "[layers][cnn]") {
  Generator init(3);
  auto gen = std::make_shared<Generator>(9);
  // 3x20x20 -> conv8 k5 s2 p0 -> 8x8x8 -> avgpool 2 (stride 1) -> 8x7x7 -> gelu, dropout,
  // maxpool 3 p1 (stride 3) -> 8x3x3 -> flatten 72 -> linear 5 without bias.
  auto model = build_cnn(
      with_layers({conv(8, 5, 0, 2), pool(Kind::AvgPool, 2, 1), plain(Kind::GELU), dropout(0.25),
                   pool(Kind::MaxPool, 3, 0, 1), plain(Kind::Flatten), linear(5, false)},
                  20, 3),
      init, gen);
  const auto state = model->state_dict();
  REQUIRE(state.size() == 3);
  CHECK(state[0].first == "0.weight");
  CHECK(state[0].second.shape() == Shape{8, 3, 5, 5});
  CHECK(state[2].first == "6.weight");
  CHECK(state[2].second.shape() == Shape{5, 72});
  const Tensor x = random_tensor({2, 3, 20, 20}, 4);
  CHECK((*model)(x).shape() == Shape{2, 5});
  // Dropout draws from the caller's generator in training only.
  const uint64_t before = gen->offset();
  (*model)(x);
  CHECK(gen->offset() > before);
  model->eval();
  const uint64_t after = gen->offset();
  CHECK(same_values((*model)(x), (*model)(x)));
  CHECK(gen->offset() == after);

  // A linear right after the input when it is already flat: flatten of [N, C, H, W] first.
  auto flat = build_cnn(with_layers({plain(Kind::Flatten), linear(4)}, 5, 2), init, gen);
  CHECK(flat->state_dict()[0].second.shape() == Shape{4, 50});
}

TEST_CASE("build_cnn names the layer that does not fit", "[layers][cnn]") {
  CHECK(build_error(with_layers({conv(32, 3, 1), plain(Kind::BatchNorm), plain(Kind::ReLU),
                                 pool(Kind::MaxPool, 2), conv(64, 3, 1), plain(Kind::ReLU),
                                 pool(Kind::MaxPool, 2), linear(10)})) ==
        "model.layers[7] (linear): expects a 2-D input [N, features], got [N, 64, 7, 7]; add a "
        "flatten before it");
  CHECK_THAT(build_error(with_layers({plain(Kind::Flatten), linear(10), conv(4, 3, 1)})),
             Contains("model.layers[2] (conv): expects a 4-D input [N, C, H, W], got [N, 10]"));
  CHECK_THAT(build_error(with_layers({plain(Kind::Flatten), plain(Kind::BatchNorm)})),
             Contains("model.layers[1] (batchnorm): expects a 4-D input"));
  CHECK_THAT(build_error(with_layers({plain(Kind::Flatten), pool(Kind::AvgPool, 2)})),
             Contains("model.layers[1] (avgpool)"));
  // 4x4 -> conv k3 -> 2x2; a 3x3 pool does not fit.
  CHECK_THAT(build_error(with_layers({conv(2, 3, 0), pool(Kind::MaxPool, 3)}, 4)),
             Contains("model.layers[1] (maxpool): kernel 3 is larger than the padded input 2x2"));
  // 28 -> 14 -> 7 -> 3 -> 1 -> a fifth pool would reach 0.
  CHECK_THAT(build_error(with_layers({pool(Kind::MaxPool, 2), pool(Kind::MaxPool, 2),
                                      pool(Kind::MaxPool, 2), pool(Kind::MaxPool, 2),
                                      pool(Kind::MaxPool, 2)})),
             Contains("model.layers[4] (maxpool)") && Contains("reach 0"));
  CHECK_THAT(build_error(with_layers({conv(2, 7, 1)}, 4)), Contains("model.layers[0] (conv)"));
  CHECK_THAT(build_error(with_layers({conv(0, 3, 1)})),
             Contains("model.layers[0] (conv): out channels must be >= 1, got 0"));
  CHECK_THAT(build_error(with_layers({conv(4, 3, 1, 0)})), Contains("stride must be >= 1"));
  CHECK_THAT(build_error(with_layers({plain(Kind::Flatten), linear(0)})),
             Contains("model.layers[1] (linear): out features must be >= 1"));
  CHECK_THAT(build_error(with_layers({dropout(1.0)})),
             Contains("model.layers[0] (dropout): p must be in [0, 1)"));
  CHECK_THAT(build_error(with_layers({pool(Kind::MaxPool, 2, 0, 2)})),
             Contains("model.layers[0] (maxpool): padding must be in [0, kernel / 2 = 1]"));
  CHECK_THAT(build_error(with_layers({})), Contains("model.layers is empty"));
  CHECK_THAT(build_error(with_layers({plain(Kind::ReLU)}, 0)), Contains("model.input_size"));
  Generator init(0);
  CHECK_THROWS_WITH(build_cnn(with_layers({dropout(0.5)}), init, nullptr), Contains("generator"));
}

TEST_CASE("the CNN runs forward and backward in F16 and BF16 with F32 parameter gradients",
          "[layers][cnn][amp]") {
  for (DType dtype : {DType::F32, DType::F16, DType::BF16}) {
    CAPTURE(dtype);
    Generator init(5);
    auto model = build_cnn(mnist_spec(), init, std::make_shared<Generator>(1));
    for (Parameter p : model->parameters()) p.set_working_dtype(dtype);
    const Tensor x = random_tensor({4, 1, 28, 28}, 8, 0.f, 1.f, dtype);
    const Tensor logits = (*model)(x);
    CHECK(logits.dtype() == dtype);
    CHECK(logits.shape() == Shape{4, 10});
    CHECK(all_finite(logits));
    const Tensor loss = ops::cross_entropy(logits, Tensor::from_ints({0, 3, 7, 9}, {4}));
    loss.backward();
    check_all_grads(*model);
    // The running statistics stayed F32.
    for (const auto& [name, t] : model->named_buffers())
      if (name.find("running") != std::string::npos) CHECK(t.dtype() == DType::F32);
  }
}

TEST_CASE("build_cnn fuses each batchnorm with the relu after it, with the same numbers",
          "[layers][cnn]") {
  CnnSpec unfused_spec = mnist_spec();
  unfused_spec.fuse_batchnorm_relu = false;
  for (DType dtype : {DType::F32, DType::F16, DType::BF16}) {
    CAPTURE(dtype);
    Generator init_fused(5), init_plain(5);
    auto fused = build_cnn(mnist_spec(), init_fused, std::make_shared<Generator>(1));
    auto plain = build_cnn(unfused_spec, init_plain, std::make_shared<Generator>(1));
    // The same layers under the same names; only the batchnorms say that they apply the relu.
    auto* fused_seq = dynamic_cast<Sequential*>(fused.get());
    auto* plain_seq = dynamic_cast<Sequential*>(plain.get());
    REQUIRE(fused_seq != nullptr);
    REQUIRE(plain_seq != nullptr);
    REQUIRE(fused_seq->size() == plain_seq->size());
    CHECK(dynamic_cast<BatchNorm2d*>(fused_seq->at(1).get())->fused_relu());
    CHECK(dynamic_cast<BatchNorm2d*>(fused_seq->at(5).get())->fused_relu());
    CHECK_FALSE(dynamic_cast<BatchNorm2d*>(plain_seq->at(1).get())->fused_relu());
    CHECK_THAT(fused_seq->at(2)->describe(), Contains("fused"));
    CHECK(plain_seq->at(2)->describe() == "ReLU()");
    CHECK(fused_seq->at(10)->describe() == "ReLU()");  // after a linear: not fused

    for (auto* model : {fused.get(), plain.get()}) {
      for (Parameter p : model->parameters()) p.set_working_dtype(dtype);
    }
    const Tensor x = random_tensor({4, 1, 28, 28}, 8, -1.f, 1.f, dtype);
    const Tensor labels = Tensor::from_ints({0, 3, 7, 9}, {4});
    const Tensor fused_logits = (*fused)(x);
    const Tensor plain_logits = (*plain)(x);
    CHECK(same_values(fused_logits, plain_logits));
    ops::cross_entropy(fused_logits, labels).backward();
    ops::cross_entropy(plain_logits, labels).backward();
    const auto fused_params = fused->named_parameters();
    const auto plain_params = plain->named_parameters();
    REQUIRE(fused_params.size() == plain_params.size());
    for (size_t i = 0; i < fused_params.size(); ++i) {
      INFO(fused_params[i].first);
      CHECK(fused_params[i].first == plain_params[i].first);
      CHECK(same_values(fused_params[i].second.grad(), plain_params[i].second.grad()));
    }
    for (const auto& [name, t] : fused->named_buffers()) {
      for (const auto& [plain_name, plain_t] : plain->named_buffers())
        if (plain_name == name) CHECK(same_values(t, plain_t));
    }
  }
}
