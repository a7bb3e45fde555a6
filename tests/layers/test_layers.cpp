// The layers one by one: torch's parameter names and shapes, torch's default initialisation
// (bounds and sample statistics), and forward against hand-worked numbers, double-precision
// references written from the formulas, or the op called directly with the same tensors.
#include <catch2/catch.hpp>
#include <cmath>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "core/generator.h"
#include "core/ops/ops.h"
#include "layer_test_util.h"
#include "layers/activations.h"
#include "layers/attention.h"
#include "layers/batch_norm2d.h"
#include "layers/conv2d.h"
#include "layers/dropout.h"
#include "layers/embedding.h"
#include "layers/flatten.h"
#include "layers/layer_norm.h"
#include "layers/linear.h"
#include "layers/pooling.h"
#include "layers/sequential.h"
#include "layers/transformer_block.h"

using namespace mixprec;
using namespace mixprec::layers_test;
using Catch::Contains;

namespace {

void set_values(const Parameter& p, const std::vector<float>& values) {
  Parameter handle = p;
  handle.master().copy_(Tensor::from_vector(values, p.shape()));
  handle.refresh_working();
}

std::vector<std::pair<std::string, Shape>> names_and_shapes(const Module& m) {
  std::vector<std::pair<std::string, Shape>> out;
  for (const auto& [name, t] : m.state_dict()) out.emplace_back(name, t.shape());
  return out;
}

// Every value within [-bound, bound], and the sample std of U(-bound, bound), bound / sqrt(3),
// within 2 % (the samples here number tens of thousands).
void check_uniform_init(const Tensor& t, double bound) {
  CHECK(max_abs(t) <= bound);
  const MeanStd s = sample_stats(t);
  CHECK(std::fabs(s.mean) < 0.02 * bound);
  CHECK(s.std == Approx(bound / std::sqrt(3.0)).epsilon(0.02));
}

}  // namespace

// ---- Linear ---------------------------------------------------------------------------------

TEST_CASE("Linear has torch's names and computes x W^T + b", "[layers][linear]") {
  Generator init(1);
  Linear fc(3, 2, true, init);
  CHECK(names_and_shapes(fc) ==
        std::vector<std::pair<std::string, Shape>>{{"weight", {2, 3}}, {"bias", {2}}});
  CHECK(fc.describe() == "Linear(in_features=3, out_features=2, bias=true)");
  set_values(fc.weight(), {1, 2, 3, 4, 5, 6});
  set_values(fc.bias(), {0.5f, -1.f});
  const Tensor x = Tensor::from_vector({1, 0, -1, 2, 1, 0.5f}, {2, 3});
  // Row 0: 1 - 3 + 0.5, 4 - 6 - 1; row 1: 2 + 2 + 1.5 + 0.5, 8 + 5 + 3 - 1.
  CHECK(fc(x).to_float_vector() == std::vector<float>{-1.5f, -3.f, 6.f, 15.f});

  // Any leading dims; the same numbers as the op on the same tensors.
  const Tensor x3 = random_tensor({2, 4, 3}, 7);
  const Tensor y = fc(x3);
  CHECK(y.shape() == Shape{2, 4, 2});
  CHECK(same_values(y, ops::linear(x3, fc.weight().working(), fc.bias().working())));

  Linear plain(3, 2, false, init);
  CHECK(!plain.bias().defined());
  CHECK(names_of(plain.state_dict()) == std::vector<std::string>{"weight"});
  CHECK(same_values(plain(x3), ops::linear(x3, plain.weight().working())));
  CHECK_THROWS_WITH(Linear(0, 2, true, init), Contains("in_features"));
}

TEST_CASE("Linear draws weight and bias from U(-1/sqrt(in), 1/sqrt(in))", "[layers][linear]") {
  Generator init(11);
  Linear fc(400, 300, true, init);
  const double bound = 1.0 / std::sqrt(400.0);
  check_uniform_init(fc.weight().master(), bound);
  CHECK(max_abs(fc.bias().master()) <= bound);
  CHECK(sample_stats(fc.bias().master()).std > 0.5 * bound / std::sqrt(3.0));  // not zeros

  // The same seed gives the same layer; the generator moved past both tensors.
  Generator again(11);
  Linear twin(400, 300, true, again);
  CHECK(same_values(twin.weight().master(), fc.weight().master()));
  CHECK(same_values(twin.bias().master(), fc.bias().master()));
  CHECK(again.offset() >= 400u * 300u + 300u);
}

TEST_CASE("a Linear built on a shared weight uses that parameter", "[layers][linear]") {
  Generator init(2);
  Embedding emb(5, 3, init);
  Linear head(emb.weight());
  CHECK(head.in_features() == 3);
  CHECK(head.out_features() == 5);
  CHECK(head.weight().is_same(emb.weight()));
  CHECK(!head.bias().defined());
  const Tensor x = random_tensor({2, 3}, 3);
  CHECK(same_values(head(x), ops::linear(x, emb.weight().master())));
}

// ---- Conv2d ---------------------------------------------------------------------------------

TEST_CASE("Conv2d has torch's names and equals conv2d on its tensors", "[layers][conv]") {
  Generator init(3);
  Conv2d conv(3, 8, 3, 2, 1, true, init);
  CHECK(names_and_shapes(conv) ==
        std::vector<std::pair<std::string, Shape>>{{"weight", {8, 3, 3, 3}}, {"bias", {8}}});
  CHECK(conv.describe() == "Conv2d(3, 8, kernel_size=3, stride=2, padding=1, bias=true)");
  const Tensor x = random_tensor({2, 3, 8, 8}, 4);
  const Tensor y = conv(x);
  CHECK(y.shape() == Shape{2, 8, 4, 4});  // (8 + 2 - 3) / 2 + 1
  CHECK(same_values(y, ops::conv2d(x, conv.weight().working(), conv.bias().working(), 2, 1)));

  // A 1x1 input channel, 2x2 kernel by hand: the sum of the window times the weights + b.
  Conv2d small(1, 1, 2, 1, 0, true, init);
  set_values(small.weight(), {1, 2, 3, 4});
  set_values(small.bias(), {0.25f});
  const Tensor img = Tensor::from_vector({1, 2, 3, 4, 5, 6, 7, 8, 9}, {1, 1, 3, 3});
  CHECK(small(img).to_float_vector() ==
        std::vector<float>{1 + 4 + 12 + 20 + 0.25f, 2 + 6 + 15 + 24 + 0.25f,
                           4 + 10 + 21 + 32 + 0.25f, 5 + 12 + 24 + 36 + 0.25f});

  Conv2d nobias(3, 4, 1, 1, 0, false, init);
  CHECK(names_of(nobias.state_dict()) == std::vector<std::string>{"weight"});
  CHECK_THROWS_WITH(Conv2d(3, 4, 0, 1, 0, true, init), Contains("kernel"));
}

TEST_CASE("Conv2d draws from U(-1/sqrt(fan_in), 1/sqrt(fan_in)), fan_in = C kh kw",
          "[layers][conv]") {
  Generator init(5);
  Conv2d conv(64, 64, 3, 1, 1, true, init);
  const double bound = 1.0 / std::sqrt(64.0 * 9.0);
  check_uniform_init(conv.weight().master(), bound);
  CHECK(max_abs(conv.bias().master()) <= bound);
}

// ---- BatchNorm2d ----------------------------------------------------------------------------

TEST_CASE("BatchNorm2d has torch's entries and initial values", "[layers][batchnorm]") {
  BatchNorm2d bn(3);
  CHECK(names_and_shapes(bn) ==
        std::vector<std::pair<std::string, Shape>>{{"weight", {3}},
                                                   {"bias", {3}},
                                                   {"running_mean", {3}},
                                                   {"running_var", {3}},
                                                   {"num_batches_tracked", {}}});
  CHECK(bn.weight().master().to_float_vector() == std::vector<float>{1, 1, 1});
  CHECK(bn.bias().master().to_float_vector() == std::vector<float>{0, 0, 0});
  CHECK(bn.running_mean().to_float_vector() == std::vector<float>{0, 0, 0});
  CHECK(bn.running_var().to_float_vector() == std::vector<float>{1, 1, 1});
  CHECK(bn.running_mean().dtype() == DType::F32);
  const auto state = bn.state_dict();
  CHECK(state[4].second.dtype() == DType::I32);
  CHECK(bn.num_batches_tracked() == 0);
  CHECK(names_of(bn.named_buffers()) ==
        std::vector<std::string>{"running_mean", "running_var", "num_batches_tracked"});
  CHECK(bn.parameters().size() == 2);
}

TEST_CASE("BatchNorm2d normalises with batch statistics in training and running ones in eval",
          "[layers][batchnorm]") {
  const int64_t n = 4, c = 2, hw = 3;
  BatchNorm2d bn(c);
  set_values(bn.weight(), {2.f, 0.5f});
  set_values(bn.bias(), {0.1f, -1.f});
  const Tensor x = random_tensor({n, c, hw, 1}, 21, -2.f, 3.f);
  const Vec xv = to_double(x);
  const double eps = 1e-5, w[2] = {2.0, 0.5}, b[2] = {0.1, -1.0};

  Vec mean(c, 0.0), var(c, 0.0);
  const double m = static_cast<double>(n * hw);
  for (int64_t i = 0; i < n; ++i)
    for (int64_t ch = 0; ch < c; ++ch)
      for (int64_t k = 0; k < hw; ++k) mean[ch] += xv[(i * c + ch) * hw + k] / m;
  for (int64_t i = 0; i < n; ++i)
    for (int64_t ch = 0; ch < c; ++ch)
      for (int64_t k = 0; k < hw; ++k) {
        const double dx = xv[(i * c + ch) * hw + k] - mean[ch];
        var[ch] += dx * dx / m;  // biased, for normalising
      }
  auto reference = [&](const Vec& mu, const Vec& sigma2) {
    Vec y(xv.size());
    for (int64_t i = 0; i < n; ++i)
      for (int64_t ch = 0; ch < c; ++ch)
        for (int64_t k = 0; k < hw; ++k) {
          const size_t at = static_cast<size_t>((i * c + ch) * hw + k);
          y[at] = (xv[at] - mu[ch]) / std::sqrt(sigma2[ch] + eps) * w[ch] + b[ch];
        }
    return y;
  };

  const Tensor y = bn(x);
  CHECK(max_abs_diff(y, reference(mean, var)) < 1e-5);
  CHECK(bn.num_batches_tracked() == 1);
  // running = 0.9 running + 0.1 batch, with the unbiased variance.
  Vec run_mean(c), run_var(c);
  for (int64_t ch = 0; ch < c; ++ch) {
    run_mean[ch] = 0.1 * mean[ch];
    run_var[ch] = 0.9 + 0.1 * var[ch] * m / (m - 1.0);
  }
  CHECK(max_abs_diff(bn.running_mean(), run_mean) < 1e-6);
  CHECK(max_abs_diff(bn.running_var(), run_var) < 1e-6);
  bn(x);
  CHECK(bn.num_batches_tracked() == 2);

  bn.eval();
  const Tensor before_mean = bn.running_mean().clone();
  Vec rm = to_double(bn.running_mean()), rv = to_double(bn.running_var());
  const Tensor ye = bn(x);
  CHECK(max_abs_diff(ye, reference(rm, rv)) < 1e-5);
  CHECK(same_values(bn.running_mean(), before_mean));
  CHECK(bn.num_batches_tracked() == 2);
}

TEST_CASE("BatchNorm2d keeps F32 running statistics under an F16 working dtype",
          "[layers][batchnorm]") {
  BatchNorm2d bn(3);
  for (Parameter p : bn.parameters()) p.set_working_dtype(DType::F16);
  const Tensor x = random_tensor({2, 3, 4, 4}, 5, -1.f, 1.f, DType::F16);
  const Tensor y = bn(x);
  CHECK(y.dtype() == DType::F16);
  CHECK(bn.running_mean().dtype() == DType::F32);
  CHECK(bn.running_var().dtype() == DType::F32);
  CHECK(bn.running_mean().to_float_vector() != std::vector<float>{0, 0, 0});
}

// ---- LayerNorm, Embedding -------------------------------------------------------------------

TEST_CASE("LayerNorm normalises the last dimension with optional bias", "[layers][layernorm]") {
  LayerNorm ln(4, true);
  CHECK(names_and_shapes(ln) ==
        std::vector<std::pair<std::string, Shape>>{{"weight", {4}}, {"bias", {4}}});
  CHECK(ln.weight().master().to_float_vector() == std::vector<float>{1, 1, 1, 1});
  CHECK(ln.bias().master().to_float_vector() == std::vector<float>{0, 0, 0, 0});
  set_values(ln.weight(), {1.f, 2.f, 0.5f, -1.f});
  set_values(ln.bias(), {0.f, 0.1f, 0.2f, 0.3f});
  const Tensor x = random_tensor({2, 3, 4}, 8, -3.f, 3.f);
  CHECK(max_abs_diff(ln(x), ref_layer_norm(to_double(x), 4, {1, 2, 0.5, -1}, {0, 0.1, 0.2, 0.3})) <
        1e-5);

  LayerNorm plain(4, false);
  CHECK(names_of(plain.state_dict()) == std::vector<std::string>{"weight"});
  CHECK(max_abs_diff(plain(x), ref_layer_norm(to_double(x), 4, {1, 1, 1, 1}, {})) < 1e-5);
}

TEST_CASE("Embedding looks up rows and starts from N(0, 1)", "[layers][embedding]") {
  Generator init(9);
  Embedding emb(1000, 64, init);
  CHECK(names_and_shapes(emb) ==
        std::vector<std::pair<std::string, Shape>>{{"weight", {1000, 64}}});
  const MeanStd s = sample_stats(emb.weight().master());
  CHECK(std::fabs(s.mean) < 0.02);
  CHECK(s.std == Approx(1.0).epsilon(0.02));

  const Tensor ids = Tensor::from_ints({3, 999, 0, 3}, {2, 2});
  const Tensor y = emb(ids);
  REQUIRE(y.shape() == Shape{2, 2, 64});
  const std::vector<float> w = emb.weight().master().to_float_vector();
  std::vector<float> expected;
  for (int32_t row : {3, 999, 0, 3})
    expected.insert(expected.end(), w.begin() + row * 64, w.begin() + (row + 1) * 64);
  CHECK(y.to_float_vector() == expected);
  CHECK_THROWS_WITH(emb(Tensor::from_ints({1000}, {1})), Contains("1000"));
}

// ---- Dropout, activations, pooling, flatten -------------------------------------------------

TEST_CASE("Dropout draws its masks from its generator in training only", "[layers][dropout]") {
  auto gen = std::make_shared<Generator>(5);
  Dropout drop(0.5, gen);
  CHECK(drop.describe() == "Dropout(p=0.5)");
  const Tensor x = Tensor::ones({4000});
  const Tensor y = drop(x);
  // About half dropped, survivors scaled by 1 / (1 - p) = 2.
  int zeros = 0, twos = 0;
  for (float v : y.to_float_vector()) {
    zeros += v == 0.f;
    twos += v == 2.f;
  }
  CHECK(zeros + twos == 4000);
  CHECK(std::abs(zeros - 2000) < 200);
  Generator same(5);
  CHECK(same_values(y, ops::dropout(x, 0.5, true, same)));
  CHECK(gen->offset() == same.offset());

  drop.eval();
  const uint64_t offset = gen->offset();
  CHECK(same_values(drop(x), x));
  CHECK(gen->offset() == offset);  // no mask drawn

  Dropout none(0.0, nullptr);  // p = 0 needs no generator
  CHECK(same_values(none(x), x));
  CHECK_THROWS_WITH(Dropout(0.1, nullptr), Contains("generator"));
  CHECK_THROWS_WITH(Dropout(1.0, gen), Contains("[0, 1)"));
}

TEST_CASE("ReLU and GELU (tanh form) apply elementwise", "[layers][activations]") {
  const Tensor x = Tensor::from_vector({-2.f, -0.5f, 0.f, 0.3f, 1.7f, 4.f}, {2, 3});
  ReLU relu;
  CHECK(relu(x).to_float_vector() == std::vector<float>{0, 0, 0, 0.3f, 1.7f, 4.f});
  GELU gelu;
  Vec ref;
  for (float v : x.to_float_vector()) ref.push_back(ref_gelu(v));
  CHECK(max_abs_diff(gelu(x), ref) < 1e-6);
  CHECK(relu.parameters().empty());
  CHECK(gelu.state_dict().empty());
}

TEST_CASE("MaxPool2d and AvgPool2d default their stride to the kernel", "[layers][pool]") {
  const Tensor x =
      Tensor::from_vector({1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16}, {1, 1, 4, 4});
  MaxPool2d max2(2);
  CHECK(max2.stride() == 2);
  CHECK(max2.describe() == "MaxPool2d(kernel_size=2, stride=2, padding=0)");
  CHECK(max2(x).to_float_vector() == std::vector<float>{6, 8, 14, 16});
  AvgPool2d avg2(2);
  CHECK(avg2(x).to_float_vector() == std::vector<float>{3.5f, 5.5f, 11.5f, 13.5f});
  AvgPool2d avg_s1(2, 1);
  const Tensor y = avg_s1(x);
  CHECK(y.shape() == Shape{1, 1, 3, 3});
  CHECK(y.get(0) == 3.5);
  CHECK(y.get(4) == 8.5);
  MaxPool2d padded(3, 1, 1);
  CHECK(same_values(padded(x), ops::max_pool2d(x, 3, 1, 1)));
  CHECK_THROWS_WITH(MaxPool2d(2, 2, 2), Contains("padding"));
}

TEST_CASE("Flatten keeps the batch dimension", "[layers][flatten]") {
  const Tensor x = random_tensor({2, 3, 4, 5}, 2);
  Flatten flatten;
  const Tensor y = flatten(x);
  CHECK(y.shape() == Shape{2, 60});
  CHECK(y.to_float_vector() == x.to_float_vector());
}

// ---- Sequential -----------------------------------------------------------------------------

TEST_CASE("Sequential names children by index and chains them", "[layers][sequential]") {
  Generator init(4);
  Sequential seq;
  auto fc1 = seq.append(std::make_shared<Linear>(3, 5, true, init));
  seq.append(std::make_shared<ReLU>());
  auto fc2 = seq.append(std::make_shared<Linear>(5, 2, false, init));
  CHECK(seq.size() == 3);
  CHECK(seq.at(1)->describe() == "ReLU()");
  CHECK_THROWS_WITH(seq.at(3), Contains("out of range"));
  seq.assign_names();
  CHECK(names_of(seq.state_dict()) == std::vector<std::string>{"0.weight", "0.bias", "2.weight"});
  CHECK(fc2->weight().name() == "2.weight");
  CHECK_THAT(seq.describe(), Contains("(0): Linear(in_features=3, out_features=5, bias=true)"));

  const Tensor x = random_tensor({4, 3}, 6);
  const Tensor expected =
      ops::linear(ops::relu(ops::linear(x, fc1->weight().working(), fc1->bias().working())),
                  fc2->weight().working());
  CHECK(same_values(seq(x), expected));
  Sequential empty;
  CHECK(same_values(empty(x), x));
}

// ---- attention, MLP, block ------------------------------------------------------------------

TEST_CASE("CausalSelfAttention has nanoGPT's names and matches a double reference",
          "[layers][attention]") {
  Generator init(12);
  const int64_t b = 2, t = 5, c = 8, h = 2;
  CausalSelfAttention attn(c, h, true, 0.0, nullptr, init);
  CHECK(names_and_shapes(attn) ==
        std::vector<std::pair<std::string, Shape>>{{"c_attn.weight", {24, 8}},
                                                   {"c_attn.bias", {24}},
                                                   {"c_proj.weight", {8, 8}},
                                                   {"c_proj.bias", {8}}});
  const Tensor x = random_tensor({b, t, c}, 13, -2.f, 2.f);
  const Vec qkv = ref_linear(to_double(x), b * t, c, to_double(attn.c_attn()->weight().master()),
                             to_double(attn.c_attn()->bias().master()), 3 * c);
  const Vec y = ref_causal_attention(qkv, b, t, c, h);
  const Vec out = ref_linear(y, b * t, c, to_double(attn.c_proj()->weight().master()),
                             to_double(attn.c_proj()->bias().master()), c);
  const Tensor got = attn(x);
  CHECK(got.shape() == Shape{b, t, c});
  CHECK(max_abs_diff(got, out) < 1e-5);

  CHECK_THROWS_WITH(CausalSelfAttention(10, 3, true, 0.0, nullptr, init), Contains("divisible"));
  CHECK_THROWS_WITH(attn(random_tensor({2, 5, 6}, 1)), Contains("[B, T, 8]"));
}

TEST_CASE("CausalSelfAttention drops out attention probabilities and the residual in training",
          "[layers][attention]") {
  Generator init(14);
  const int64_t b = 2, t = 5, c = 8, h = 2;
  auto gen = std::make_shared<Generator>(3);
  CausalSelfAttention attn(c, h, true, 0.2, gen, init);
  const Tensor x = random_tensor({b, t, c}, 15);
  attn.eval();
  const Tensor deterministic = attn(x);
  CHECK(gen->offset() == 0);  // evaluation draws nothing
  attn.train();
  const Tensor dropped = attn(x);
  // nanoGPT's two masks: B*H*T*T attention probabilities, then B*T*C residual outputs.
  CHECK(gen->offset() == static_cast<uint64_t>(b * h * t * t + b * t * c));
  CHECK(dropped.to_float_vector() != deterministic.to_float_vector());
}

TEST_CASE("Block is pre-norm: x + attn(ln_1(x)), then + mlp(ln_2(.))", "[layers][block]") {
  Generator init(14);
  const int64_t c = 8;
  Block block(c, 2, true, 0.0, nullptr, init);
  CHECK(names_of(block.state_dict()) ==
        std::vector<std::string>{"ln_1.weight", "ln_1.bias", "attn.c_attn.weight",
                                 "attn.c_attn.bias", "attn.c_proj.weight", "attn.c_proj.bias",
                                 "ln_2.weight", "ln_2.bias", "mlp.c_fc.weight", "mlp.c_fc.bias",
                                 "mlp.c_proj.weight", "mlp.c_proj.bias"});
  CHECK(block.mlp()->c_fc()->weight().shape() == Shape{32, 8});
  CHECK(block.mlp()->c_proj()->weight().shape() == Shape{8, 32});
  set_values(block.ln_2()->weight(), std::vector<float>(c, 1.5f));  // not the identity init

  const int64_t b = 2, t = 3;
  const Tensor x = random_tensor({b, t, c}, 15, -1.f, 1.f);
  auto weights = [](const std::shared_ptr<Linear>& l) { return to_double(l->weight().master()); };
  auto biases = [](const std::shared_ptr<Linear>& l) { return to_double(l->bias().master()); };
  const Vec xv = to_double(x);
  const Vec ones(c, 1.0), zeros(c, 0.0), ln2w(c, 1.5);
  // Attention branch.
  const Vec a_in = ref_layer_norm(xv, c, ones, zeros);
  const Vec qkv = ref_linear(a_in, b * t, c, weights(block.attn()->c_attn()),
                             biases(block.attn()->c_attn()), 3 * c);
  const Vec a_out = ref_linear(ref_causal_attention(qkv, b, t, c, 2), b * t, c,
                               weights(block.attn()->c_proj()), biases(block.attn()->c_proj()), c);
  Vec h1(xv.size());
  for (size_t i = 0; i < xv.size(); ++i) h1[i] = xv[i] + a_out[i];
  // MLP branch.
  Vec hidden = ref_linear(ref_layer_norm(h1, c, ln2w, zeros), b * t, c,
                          weights(block.mlp()->c_fc()), biases(block.mlp()->c_fc()), 4 * c);
  for (double& v : hidden) v = ref_gelu(v);
  const Vec m_out = ref_linear(hidden, b * t, 4 * c, weights(block.mlp()->c_proj()),
                               biases(block.mlp()->c_proj()), c);
  Vec expected(xv.size());
  for (size_t i = 0; i < xv.size(); ++i) expected[i] = h1[i] + m_out[i];
  CHECK(max_abs_diff(block(x), expected) < 1e-5);
}
