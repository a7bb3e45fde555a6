// Precision policy: parsing, working dtypes, default loss scaling, apply(), and a check
// that every op fp32_ops() lists really computes in FP32 on 16-bit inputs, against
// double-precision references and inputs chosen so that 16-bit arithmetic would visibly fail.
#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include <catch2/catch.hpp>

#include "amp/dynamic_loss_scale.h"
#include "amp/loss_scale.h"
#include "amp/precision.h"
#include "core/error.h"
#include "core/math_mode.h"
#include "core/ops/ops.h"
#include "core/tensor.h"
#include "layers/parameter.h"

using namespace mixprec;
using Catch::Matchers::Contains;

namespace {

// FP16 keeps 11 significant bits: one rounding is within 2^-11 relative.
constexpr double kHalfRounding = 1.0 / 2048.0;

// Restores the process-wide TF32 switch when a test that changes it ends, pass or fail.
struct Tf32Restore {
  bool saved = tf32_allowed();
  ~Tf32Restore() { set_tf32_allowed(saved); }
};

// |got - want| within `rel` of |want| plus `abs`, element by element.
void check_close(const std::vector<float>& got, const std::vector<double>& want, double rel,
                 double abs) {
  REQUIRE(got.size() == want.size());
  for (size_t i = 0; i < got.size(); ++i) {
    INFO("element " << i << ": got " << got[i] << ", want " << want[i]);
    CHECK(std::isfinite(got[i]));
    CHECK(std::abs(static_cast<double>(got[i]) - want[i]) <= rel * std::abs(want[i]) + abs);
  }
}

std::vector<double> softmax_reference(const std::vector<double>& row) {
  const double m = *std::max_element(row.begin(), row.end());
  double total = 0.0;
  for (double v : row) total += std::exp(v - m);
  std::vector<double> out;
  for (double v : row) out.push_back(std::exp(v - m) / total);
  return out;
}

}  // namespace

TEST_CASE("parse_precision accepts the documented names", "[amp][precision]") {
  CHECK(parse_precision("fp32") == Precision::FP32);
  CHECK(parse_precision("float32") == Precision::FP32);
  CHECK(parse_precision("fp16") == Precision::FP16);
  CHECK(parse_precision("float16") == Precision::FP16);
  CHECK(parse_precision("half") == Precision::FP16);
  CHECK(parse_precision("bf16") == Precision::BF16);
  CHECK(parse_precision("bfloat16") == Precision::BF16);
  for (Precision p : {Precision::FP32, Precision::FP16, Precision::BF16}) {
    CHECK(parse_precision(precision_name(p)) == p);
  }
  CHECK(precision_name(Precision::FP32) == "fp32");
  CHECK(precision_name(Precision::FP16) == "fp16");
  CHECK(precision_name(Precision::BF16) == "bf16");
  for (const char* bad : {"fp8", "float64", "", "bf 16", "tf32"}) {
    INFO(bad);
    REQUIRE_THROWS_AS(parse_precision(bad), Error);
    REQUIRE_THROWS_WITH(parse_precision(bad), Contains("fp32, fp16, bf16") &&
                                                  Contains("bfloat16") && Contains("half"));
  }
}

TEST_CASE("PrecisionPolicy working dtype and loss scaling per precision", "[amp][precision]") {
  PrecisionPolicy fp32{Precision::FP32};
  PrecisionPolicy fp16{Precision::FP16};
  PrecisionPolicy bf16{Precision::BF16};
  CHECK(fp32.working_dtype() == DType::F32);
  CHECK(fp16.working_dtype() == DType::F16);
  CHECK(bf16.working_dtype() == DType::BF16);
  CHECK_FALSE(fp32.needs_loss_scaling());
  CHECK(fp16.needs_loss_scaling());
  CHECK_FALSE(bf16.needs_loss_scaling());
  CHECK_FALSE(PrecisionPolicy{}.allow_tf32);

  const auto fp16_scale = fp16.default_loss_scale();
  REQUIRE(fp16_scale->kind() == "dynamic");
  CHECK(fp16_scale->scales_loss());
  CHECK(fp16_scale->scale() == 65536.0);
  const auto* dynamic = dynamic_cast<const DynamicLossScale*>(fp16_scale.get());
  REQUIRE(dynamic != nullptr);
  // PyTorch's GradScaler defaults.
  CHECK(dynamic->options().init_scale == 65536.0);
  CHECK(dynamic->options().growth_factor == 2.0);
  CHECK(dynamic->options().backoff_factor == 0.5);
  CHECK(dynamic->options().growth_interval == 2000);
  CHECK(dynamic->options().hysteresis == 1);

  for (const PrecisionPolicy& policy : {fp32, bf16}) {
    const auto scale = policy.default_loss_scale();
    CHECK(scale->kind() == "none");
    CHECK_FALSE(scale->scales_loss());
    CHECK(scale->scale() == 1.0);
  }
}

TEST_CASE("PrecisionPolicy::apply switches working dtypes and the TF32 switch",
          "[amp][precision]") {
  Tf32Restore restore;
  Parameter w("w", Tensor::from_vector({1.5f, -2.25f, 0.1f}, {3}));
  Parameter b("b", Tensor::from_vector({0.5f}, {1}));
  const std::vector<Parameter> params = {w, b};

  PrecisionPolicy fp16{Precision::FP16, true};
  fp16.apply(params);
  CHECK(tf32_allowed());
  for (const Parameter& p : {w, b}) {
    INFO(p.name());
    CHECK(p.working_dtype() == DType::F16);
    CHECK(p.working().dtype() == DType::F16);
    CHECK(p.master().dtype() == DType::F32);
  }
  // 0.1 is not representable: the master keeps the FP32 value, the copy the FP16 rounding.
  CHECK(w.master().get(2) == static_cast<double>(0.1f));
  CHECK(w.working().get(2) != static_cast<double>(0.1f));
  CHECK(std::abs(w.working().get(2) - 0.1) <= 0.1 * kHalfRounding);

  PrecisionPolicy bf16{Precision::BF16, false};
  bf16.apply(params);
  CHECK_FALSE(tf32_allowed());
  CHECK(w.working_dtype() == DType::BF16);
  CHECK(b.working().dtype() == DType::BF16);

  PrecisionPolicy fp32{Precision::FP32, true};
  fp32.apply(params);
  CHECK(tf32_allowed());
  CHECK(w.working_dtype() == DType::F32);
  CHECK(w.working().dtype() == DType::F32);
  CHECK(w.working().get(2) == static_cast<double>(0.1f));

  // An undefined parameter is rejected before anything changes.
  set_tf32_allowed(false);
  const std::vector<Parameter> with_undefined = {w, Parameter()};
  REQUIRE_THROWS_WITH(fp16.apply(with_undefined), Contains("parameter 1") &&
                                                      Contains("undefined"));
  CHECK(w.working_dtype() == DType::F32);
  CHECK_FALSE(tf32_allowed());
}

TEST_CASE("PrecisionPolicy::describe states the dtypes and TF32", "[amp][precision]") {
  const std::string fp16_off = PrecisionPolicy{Precision::FP16, false}.describe();
  CHECK_THAT(fp16_off, Contains("fp16") && Contains("FP16 activations") &&
                           Contains("FP32 master weights") && Contains("TF32 off"));
  const std::string bf16_on = PrecisionPolicy{Precision::BF16, true}.describe();
  CHECK_THAT(bf16_on, Contains("bf16") && Contains("BF16 activations") && Contains("TF32 on"));
  const std::string fp32_off = PrecisionPolicy{Precision::FP32, false}.describe();
  CHECK_THAT(fp32_off, Contains("fp32") && Contains("TF32 off"));
}

TEST_CASE("fp32_ops lists the ops checked below", "[amp][precision]") {
  // Each entry is an op of core/ops/ops.h with a test case below that shows it computing in
  // FP32 on F16 input; a new entry needs a new check.
  const std::vector<std::string_view> expected = {
      "softmax", "log_softmax", "cross_entropy", "mse_loss", "layer_norm",
      "batch_norm2d", "sum", "mean", "causal_attention"};
  CHECK(fp32_ops() == expected);
}

TEST_CASE("FP32 op: softmax and log_softmax of F16 logits whose exp overflows FP16",
          "[amp][precision]") {
  // exp(20) = 4.9e8 is far beyond FP16's 65504.
  const std::vector<double> row = {20.0, 19.0, 18.0, 10.0};
  const Tensor x = Tensor::from_vector({20.f, 19.f, 18.f, 10.f}, {1, 4}, DType::F16);
  const std::vector<double> probs = softmax_reference(row);

  const Tensor y = ops::softmax(x);
  CHECK(y.dtype() == DType::F16);
  check_close(y.to_float_vector(), probs, kHalfRounding, 1e-7);

  std::vector<double> log_probs;
  for (double p : probs) log_probs.push_back(std::log(p));
  const Tensor log_y = ops::log_softmax(x);
  CHECK(log_y.dtype() == DType::F16);
  check_close(log_y.to_float_vector(), log_probs, kHalfRounding, 1e-6);
}

TEST_CASE("FP32 op: cross_entropy of F16 logits returns an F32 loss", "[amp][precision]") {
  const std::vector<std::vector<double>> rows = {{20.0, 10.0, 0.0}, {1000.0, 998.0, -3.0}};
  const std::vector<int32_t> labels = {0, 1};
  double want = 0.0;
  for (size_t i = 0; i < rows.size(); ++i) {
    const std::vector<double> p = softmax_reference(rows[i]);
    want -= std::log(p[labels[i]]) / static_cast<double>(rows.size());
  }
  const Tensor logits =
      Tensor::from_vector({20.f, 10.f, 0.f, 1000.f, 998.f, -3.f}, {2, 3}, DType::F16);
  const Tensor loss = ops::cross_entropy(logits, Tensor::from_ints(labels, {2}));
  CHECK(loss.dtype() == DType::F32);
  // Row 0 contributes ~4.5e-5, below FP16's resolution near row 1's ~2.13: only an FP32
  // loss keeps it.
  CHECK(std::abs(loss.item() - want) <= 1e-6 * want);
}

TEST_CASE("FP32 op: mse_loss of F16 inputs whose squares overflow FP16", "[amp][precision]") {
  // 300^2 = 90000 > 65504, and 90000 itself is not an FP16 value.
  const Tensor a = Tensor::from_vector({300.f, -300.f}, {2}, DType::F16);
  const Tensor b = Tensor::from_vector({0.f, 0.f}, {2}, DType::F16);
  const Tensor loss = ops::mse_loss(a, b);
  CHECK(loss.dtype() == DType::F32);
  CHECK(loss.item() == 90000.0);
}

TEST_CASE("FP32 op: layer_norm statistics of F16 input with a large mean",
          "[amp][precision]") {
  // Rows of 1000 + 0.5k and 1500 + k (k = 0..7), all exact FP16 values. FP16 statistics
  // would lose the spread entirely (the squares reach 2.25e6 > 65504).
  std::vector<float> values;
  std::vector<std::vector<double>> rows(2);
  for (int k = 0; k < 8; ++k) rows[0].push_back(1000.0 + 0.5 * k);
  for (int k = 0; k < 8; ++k) rows[1].push_back(1500.0 + k);
  std::vector<double> want;
  const double eps = 1e-5;
  for (const auto& row : rows) {
    double mean = 0.0;
    for (double v : row) mean += v / 8.0;
    double var = 0.0;
    for (double v : row) var += (v - mean) * (v - mean) / 8.0;
    for (double v : row) {
      values.push_back(static_cast<float>(v));
      want.push_back((v - mean) / std::sqrt(var + eps));
    }
  }
  const Tensor x = Tensor::from_vector(values, {2, 8}, DType::F16);
  const Tensor y = ops::layer_norm(x, Tensor(), Tensor(), eps);
  CHECK(y.dtype() == DType::F16);
  // One FP16 rounding of the output, plus FP32 arithmetic far below it.
  check_close(y.to_float_vector(), want, kHalfRounding, 1e-4);
}

TEST_CASE("FP32 op: batch_norm2d statistics of F16 input with a large mean",
          "[amp][precision]") {
  // x [2, 1, 2, 2] = 1000 + 0.5k, k = 0..7: mean 1001.75, biased variance 1.3125.
  std::vector<float> values;
  std::vector<double> xs;
  for (int k = 0; k < 8; ++k) {
    xs.push_back(1000.0 + 0.5 * k);
    values.push_back(static_cast<float>(xs.back()));
  }
  const double mean = 1001.75, var = 1.3125, eps = 1e-5, momentum = 0.1;
  std::vector<double> want;
  for (double v : xs) want.push_back((v - mean) / std::sqrt(var + eps));

  const Tensor x = Tensor::from_vector(values, {2, 1, 2, 2}, DType::F16);
  const Tensor weight = Tensor::ones({1}, DType::F16);
  const Tensor bias = Tensor::zeros({1}, DType::F16);
  Tensor running_mean = Tensor::zeros({1});
  Tensor running_var = Tensor::ones({1});
  const Tensor y = ops::batch_norm2d(x, weight, bias, running_mean, running_var, true, momentum,
                                     eps);
  CHECK(y.dtype() == DType::F16);
  check_close(y.to_float_vector(), want, kHalfRounding, 1e-4);
  // 0.1 * 1001.75 = 100.175: FP16 would store 100.1875 (spacing 0.0625 there).
  CHECK(std::abs(running_mean.get(0) - momentum * mean) <= 1e-5 * momentum * mean);
  const double unbiased = var * 8.0 / 7.0;
  const double want_var = (1.0 - momentum) * 1.0 + momentum * unbiased;
  CHECK(std::abs(running_var.get(0) - want_var) <= 1e-5 * want_var);
}

TEST_CASE("FP32 op: sum and mean of F16 accumulate in FP32", "[amp][precision]") {
  // An FP16 accumulator stalls at 2048 (2048 + 1 rounds back to 2048).
  const Tensor ones = Tensor::ones({4096}, DType::F16);
  const Tensor total = ops::sum(ones);
  CHECK(total.dtype() == DType::F16);
  CHECK(total.item() == 4096.0);
  // 1000 * 100 = 1e5 overflows an FP16 accumulator; the mean itself is representable.
  const Tensor hundreds = Tensor::full({10, 100}, 100.0, DType::F16);
  CHECK(ops::mean(hundreds).item() == 100.0);
  const Tensor row_means = ops::mean(hundreds, {1});
  for (float v : row_means.to_float_vector()) CHECK(v == 100.0f);
}

TEST_CASE("FP32 op: causal_attention scores beyond FP16's range", "[amp][precision]") {
  // D = 4, so scores are q.k / 2. q1.k0 / 2 = 131072 and q1.k1 / 2 = 131072.5 are both far
  // beyond 65504 but exact in FP32; their difference (0.5) decides the softmax.
  const Tensor q = Tensor::from_vector({512.f, 1.f, 0.f, 0.f, 512.f, 1.f, 0.f, 0.f},
                                       {1, 1, 2, 4}, DType::F16);
  const Tensor k = Tensor::from_vector({512.f, 0.f, 0.f, 0.f, 512.f, 1.f, 0.f, 0.f},
                                       {1, 1, 2, 4}, DType::F16);
  const std::vector<double> v0 = {1.0, 2.0, 3.0, 4.0}, v1 = {-1.0, 0.0, 1.0, 2.0};
  const Tensor v = Tensor::from_vector({1.f, 2.f, 3.f, 4.f, -1.f, 0.f, 1.f, 2.f}, {1, 1, 2, 4},
                                       DType::F16);
  const Tensor out = ops::causal_attention(q, k, v);
  CHECK(out.dtype() == DType::F16);

  const double p11 = 1.0 / (1.0 + std::exp(-0.5));
  const double p10 = 1.0 - p11;
  std::vector<double> want = v0;  // position 0 sees only itself
  for (size_t j = 0; j < 4; ++j) want.push_back(p10 * v0[j] + p11 * v1[j]);
  // The F16 probabilities (one rounding) times v, then the output's rounding.
  check_close(out.to_float_vector(), want, 3 * kHalfRounding, 3 * kHalfRounding);
}
