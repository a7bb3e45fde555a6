// GEMM (cuBLASLt), convolutions (cuDNN) and batch normalisation, CUDA against the CPU backend.
// GPU outputs are poisoned first; tolerances are per dtype and relative to the magnitude of
// what was summed into each element (sum of |terms|), widened with the square root of the
// accumulation length where FP32 sums of different order meet.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <sstream>
#include <string>
#include <vector>

#include "backend_agreement.h"
#include "core/error.h"
#include "core/math_mode.h"
#include "fused_batch_norm_relu_check.h"
#include "gemm_magnitude.h"
#include "tests/error_message.h"

namespace {

using namespace mixprec;
using namespace mixprec::cuda_test;
using mixprec_test::error_message;

constexpr DType kGemmTypes[][2] = {{DType::F32, DType::F32},  {DType::F16, DType::F16},
                                   {DType::F16, DType::F32},  {DType::BF16, DType::BF16},
                                   {DType::BF16, DType::F32}};


// Sets the TF32 switch for one scope.
class Tf32Scope {
 public:
  explicit Tf32Scope(bool allowed) : saved_(tf32_allowed()) { set_tf32_allowed(allowed); }
  ~Tf32Scope() { set_tf32_allowed(saved_); }
  Tf32Scope(const Tf32Scope&) = delete;
  Tf32Scope& operator=(const Tf32Scope&) = delete;

 private:
  bool saved_;
};


// ---- GEMM ---------------------------------------------------------------------------------

struct GemmCase {
  int64_t m, n, k;
};

// C's starting content on both backends: poison (NaN) when beta == 0, so a GEMM that reads C
// then fails; random values otherwise.
Tensor initial_c(const Shape& shape, DType dtype, float beta, std::mt19937& rng) {
  if (beta != 0.0f) return random_tensor(shape, dtype, rng);
  Tensor c = Tensor::empty(shape, dtype);
  poison(c);
  return c;
}

// Runs one GEMM on both backends from the same inputs and compares.
void check_gemm(const GemmDesc& d, const Tensor& a, const Tensor& b, const Tensor& c0) {
  Tensor expected = c0.clone();
  cpu_backend().gemm(d, a, b, expected);
  Tensor actual = c0.to(gpu());
  gpu_backend().gemm(d, a.to(gpu()), b.to(gpu()), actual);
  expect_close(expected, actual, accumulation_tolerance(c0.dtype(), d.k),
               gemm_magnitude(d, a, b, c0));
}

}  // namespace

TEST_CASE("cuda gemm matches the CPU for every dtype pair, transpose and odd shape", "[cuda]") {
  MIXPREC_REQUIRE_CUDA();
  std::mt19937 rng(31);
  const GemmCase cases[] = {{1, 1, 1}, {7, 13, 5}, {127, 65, 33}, {256, 256, 256}};
  for (const auto& types : kGemmTypes) {
    for (const GemmCase& s : cases) {
      for (int flags = 0; flags < 4; ++flags) {
        for (const auto& [alpha, beta] : {std::pair{1.0f, 0.0f}, std::pair{-0.75f, 1.5f}}) {
          GemmDesc d;
          d.trans_a = (flags & 1) != 0;
          d.trans_b = (flags & 2) != 0;
          d.m = s.m;
          d.n = s.n;
          d.k = s.k;
          d.alpha = alpha;
          d.beta = beta;
          INFO(types[0] << " x " << types[0] << " -> " << types[1] << ", " << s.m << "x" << s.n
                        << "x" << s.k << ", trans " << d.trans_a << d.trans_b << ", alpha "
                        << alpha << ", beta " << beta);
          const Tensor a = random_tensor(d.trans_a ? Shape{s.k, s.m} : Shape{s.m, s.k}, types[0], rng);
          const Tensor b = random_tensor(d.trans_b ? Shape{s.n, s.k} : Shape{s.k, s.n}, types[0], rng);
          check_gemm(d, a, b, initial_c({s.m, s.n}, types[1], beta, rng));
        }
      }
    }
  }
}

TEST_CASE("cuda gemm batches with strides, broadcast operands and gaps in C", "[cuda]") {
  MIXPREC_REQUIRE_CUDA();
  std::mt19937 rng(32);
  const int64_t batch = 5, m = 9, n = 6, k = 11;
  for (const auto& types : kGemmTypes) {
    // A shared by the whole batch; B shared; both batched with C strided past m * n, whose
    // gap elements must keep their poison.
    const int64_t strides[][3] = {{0, k * n, m * n}, {m * k, 0, m * n}, {m * k, k * n, m * n + 7}};
    for (const auto& st : strides) {
      for (int flags = 0; flags < 4; ++flags) {
        for (const float beta : {0.0f, 0.5f}) {
          GemmDesc d;
          d.trans_a = (flags & 1) != 0;
          d.trans_b = (flags & 2) != 0;
          d.m = m;
          d.n = n;
          d.k = k;
          d.batch = batch;
          d.stride_a = st[0];
          d.stride_b = st[1];
          d.stride_c = st[2];
          d.alpha = 1.25f;
          d.beta = beta;
          INFO(types[0] << " -> " << types[1] << ", strides " << st[0] << "/" << st[1] << "/"
                        << st[2] << ", trans " << d.trans_a << d.trans_b << ", beta " << beta);
          const Tensor a = random_tensor({(batch - 1) * st[0] + m * k}, types[0], rng);
          const Tensor b = random_tensor({(batch - 1) * st[1] + k * n}, types[0], rng);
          Tensor c0 = initial_c({(batch - 1) * st[2] + m * n}, types[1], beta, rng);
          if (beta != 0.0f && st[2] != m * n) {
            // Gaps keep whatever they held: poison them so a write there shows.
            std::vector<float> v = c0.to_float_vector();
            for (int64_t p = 0; p + 1 < batch; ++p)
              for (int64_t g = m * n; g < st[2]; ++g) v[p * st[2] + g] = std::nanf("");
            c0 = Tensor::from_vector(v, c0.shape(), c0.dtype());
          }
          check_gemm(d, a, b, c0);
        }
      }
    }
  }
}

TEST_CASE("cuda gemm with k = 0 scales C by beta, or zeroes it without reading it", "[cuda]") {
  MIXPREC_REQUIRE_CUDA();
  for (const auto& types : kGemmTypes) {
    INFO(types[0] << " -> " << types[1]);
    GemmDesc d;
    d.m = 3;
    d.n = 4;
    d.k = 0;
    d.batch = 2;
    d.stride_c = 12;
    const Tensor a = Tensor::empty({0}, types[0], gpu());
    const Tensor b = Tensor::empty({0}, types[0], gpu());
    Tensor zeroed = poisoned({24}, types[1]);
    gpu_backend().gemm(d, a, b, zeroed);
    for (float v : zeroed.to_float_vector()) CHECK(v == 0.0f);

    std::vector<float> start(24);
    for (size_t i = 0; i < start.size(); ++i) start[i] = static_cast<float>(i) - 8.0f;
    Tensor scaled = Tensor::from_vector(start, {24}, types[1], gpu());
    d.beta = -0.5f;
    gpu_backend().gemm(d, a, b, scaled);
    const std::vector<float> got = scaled.to_float_vector();
    // Halves of small integers are exact in every dtype.
    for (size_t i = 0; i < start.size(); ++i) CHECK(got[i] == -0.5f * start[i]);
  }
}

TEST_CASE("cuda gemm refuses the dtype combinations the contract excludes", "[cuda]") {
  MIXPREC_REQUIRE_CUDA();
  GemmDesc d;
  d.m = d.n = d.k = 2;
  const auto gemm_with = [&](DType da, DType db, DType dc) {
    const Tensor a = Tensor::zeros({2, 2}, da, gpu());
    const Tensor b = Tensor::zeros({2, 2}, db, gpu());
    Tensor c = Tensor::zeros({2, 2}, dc, gpu());
    return error_message([&] { gpu_backend().gemm(d, a, b, c); });
  };
  const DType refused[][3] = {{DType::F32, DType::F32, DType::F16},
                              {DType::F32, DType::F32, DType::BF16},
                              {DType::F16, DType::BF16, DType::F32},
                              {DType::F16, DType::F16, DType::BF16},
                              {DType::BF16, DType::BF16, DType::F16}};
  for (const auto& t : refused) {
    const std::string message = gemm_with(t[0], t[1], t[2]);
    INFO(t[0] << ", " << t[1] << " -> " << t[2] << ": " << message);
    CHECK(message.rfind("gemm: dtype mismatch", 0) == 0);
  }
  const std::string integer = gemm_with(DType::I32, DType::I32, DType::I32);
  INFO(integer);
  CHECK(integer.rfind("gemm: unsupported dtype", 0) == 0);
}

TEST_CASE("cuda FP32 gemm keeps every input bit unless TF32 is allowed", "[cuda]") {
  MIXPREC_REQUIRE_CUDA();
  // (1 + 2^-12) * 1 + 1 * (-1) = 2^-12 exactly in FP32; TF32 keeps 10 fraction bits, rounds
  // the first input to 1 and returns 0.
  const float tiny = std::ldexp(1.0f, -12);
  const Tensor a = Tensor::from_vector({1.0f + tiny, 1.0f}, {1, 2}, DType::F32, gpu());
  const Tensor b = Tensor::from_vector({1.0f, -1.0f}, {2, 1}, DType::F32, gpu());
  GemmDesc d;
  d.m = 1;
  d.n = 1;
  d.k = 2;
  {
    Tf32Scope scope(false);
    Tensor c = poisoned({1, 1}, DType::F32);
    gpu_backend().gemm(d, a, b, c);
    CHECK(c.to_float_vector()[0] == tiny);
  }
  {
    // Allowed, the result may lose the low bits, within TF32's rounding of the inputs.
    Tf32Scope scope(true);
    Tensor c = poisoned({1, 1}, DType::F32);
    gpu_backend().gemm(d, a, b, c);
    CHECK(std::fabs(c.to_float_vector()[0] - tiny) <= tiny);
  }
}

// ---- convolution ----------------------------------------------------------------------------

namespace {

struct ConvCase {
  int64_t n, c, h, w, o, kh, kw;
  Conv2dDesc desc;
};

// Odd channel counts, 1x1 and non-square filters, stride and padding on either axis.
const std::vector<ConvCase>& conv_cases() {
  static const std::vector<ConvCase> cases = {
      {2, 3, 9, 7, 5, 3, 3, {1, 1, 1, 1}},  {3, 1, 8, 8, 4, 5, 5, {2, 2, 2, 2}},
      {1, 7, 11, 6, 3, 1, 1, {1, 1, 0, 0}}, {2, 5, 10, 9, 6, 3, 2, {2, 1, 0, 1}},
      {4, 16, 8, 8, 8, 3, 3, {1, 1, 1, 1}}, {2, 3, 5, 5, 1, 5, 5, {1, 1, 0, 0}}};
  return cases;
}

Shape output_shape(const ConvCase& s) {
  return {s.n, s.o, (s.h + 2 * s.desc.pad_h - s.kh) / s.desc.stride_h + 1,
          (s.w + 2 * s.desc.pad_w - s.kw) / s.desc.stride_w + 1};
}

std::string conv_label(const ConvCase& s, DType dtype) {
  std::ostringstream out;
  out << "x [" << s.n << "," << s.c << "," << s.h << "," << s.w << "], w [" << s.o << "," << s.c
      << "," << s.kh << "," << s.kw << "], stride " << s.desc.stride_h << "x" << s.desc.stride_w
      << ", pad " << s.desc.pad_h << "x" << s.desc.pad_w << ", " << dtype;
  return out.str();
}

}  // namespace

TEST_CASE("cuda conv2d forward matches the CPU with and without bias", "[cuda]") {
  MIXPREC_REQUIRE_CUDA();
  std::mt19937 rng(41);
  for (const ConvCase& s : conv_cases()) {
    for (DType dtype : kFloatingTypes) {
      for (const bool with_bias : {false, true}) {
        INFO(conv_label(s, dtype) << (with_bias ? ", bias" : ", no bias"));
        const Tensor x = random_tensor({s.n, s.c, s.h, s.w}, dtype, rng);
        const Tensor w = random_tensor({s.o, s.c, s.kh, s.kw}, dtype, rng);
        const Tensor bias = random_tensor({s.o}, dtype, rng);
        const Shape ys = output_shape(s);
        Tensor expected = Tensor::empty(ys, dtype);
        cpu_backend().conv2d(x, w, with_bias ? &bias : nullptr, s.desc, expected);
        // The magnitude: the same convolution of |x| and |w| (plus |bias|), in F32.
        const Tensor abs_bias = abs_of(bias);
        Tensor magnitude = Tensor::empty(ys, DType::F32);
        cpu_backend().conv2d(abs_of(x), abs_of(w), with_bias ? &abs_bias : nullptr, s.desc,
                             magnitude);
        Tensor actual = poisoned(ys, dtype);
        const Tensor gpu_bias = bias.to(gpu());
        gpu_backend().conv2d(x.to(gpu()), w.to(gpu()), with_bias ? &gpu_bias : nullptr, s.desc,
                             actual);
        expect_close(expected, actual, accumulation_tolerance(dtype, s.c * s.kh * s.kw),
                     magnitude.to_float_vector());
      }
    }
  }
}

TEST_CASE("cuda conv2d backward data and filter match the CPU and repeat their bits", "[cuda]") {
  MIXPREC_REQUIRE_CUDA();
  std::mt19937 rng(42);
  for (const ConvCase& s : conv_cases()) {
    for (DType dtype : kFloatingTypes) {
      INFO(conv_label(s, dtype));
      const Shape xs{s.n, s.c, s.h, s.w}, ws{s.o, s.c, s.kh, s.kw}, ys = output_shape(s);
      const Tensor x = random_tensor(xs, dtype, rng);
      const Tensor w = random_tensor(ws, dtype, rng);
      const Tensor dy = random_tensor(ys, dtype, rng);
      const Tensor gx = x.to(gpu()), gw = w.to(gpu()), gdy = dy.to(gpu());

      Tensor dx_expected = Tensor::empty(xs, dtype);
      cpu_backend().conv2d_backward_data(dy, w, s.desc, dx_expected);
      Tensor dx_magnitude = Tensor::empty(xs, DType::F32);
      cpu_backend().conv2d_backward_data(abs_of(dy), abs_of(w), s.desc, dx_magnitude);
      Tensor dx = poisoned(xs, dtype);
      gpu_backend().conv2d_backward_data(gdy, gw, s.desc, dx);
      expect_close(dx_expected, dx, accumulation_tolerance(dtype, s.o * s.kh * s.kw),
                   dx_magnitude.to_float_vector());

      Tensor dw_expected = Tensor::empty(ws, dtype), db_expected = Tensor::empty({s.o}, dtype);
      cpu_backend().conv2d_backward_filter(x, dy, s.desc, dw_expected, &db_expected);
      Tensor dw_magnitude = Tensor::empty(ws, DType::F32),
             db_magnitude = Tensor::empty({s.o}, DType::F32);
      cpu_backend().conv2d_backward_filter(abs_of(x), abs_of(dy), s.desc, dw_magnitude,
                                           &db_magnitude);
      Tensor dw = poisoned(ws, dtype), db = poisoned({s.o}, dtype);
      gpu_backend().conv2d_backward_filter(gx, gdy, s.desc, dw, &db);
      const int64_t pixels = s.n * ys[2] * ys[3];
      expect_close(dw_expected, dw, accumulation_tolerance(dtype, pixels),
                   dw_magnitude.to_float_vector());
      expect_close(db_expected, db, accumulation_tolerance(dtype, pixels),
                   db_magnitude.to_float_vector());

      // Deterministic algorithms: a second run gives the same bits, dbias-less too.
      Tensor dx2 = poisoned(xs, dtype), dw2 = poisoned(ws, dtype);
      gpu_backend().conv2d_backward_data(gdy, gw, s.desc, dx2);
      gpu_backend().conv2d_backward_filter(gx, gdy, s.desc, dw2, nullptr);
      expect_bits_equal(dx, dx2);
      expect_bits_equal(dw, dw2);
    }
  }
}

TEST_CASE("cuda FP32 conv2d keeps every input bit unless TF32 is allowed", "[cuda]") {
  MIXPREC_REQUIRE_CUDA();
  // A 1x1 filter over two channels: (1 + 2^-12) * 1 + 1 * (-1) = 2^-12 at every pixel.
  Tf32Scope scope(false);
  const float tiny = std::ldexp(1.0f, -12);
  const int64_t pixels = 64;
  std::vector<float> xv(2 * pixels);
  std::fill(xv.begin(), xv.begin() + pixels, 1.0f + tiny);
  std::fill(xv.begin() + pixels, xv.end(), 1.0f);
  const Tensor x = Tensor::from_vector(xv, {1, 2, 8, 8}, DType::F32, gpu());
  const Tensor w = Tensor::from_vector({1.0f, -1.0f}, {1, 2, 1, 1}, DType::F32, gpu());
  Tensor y = poisoned({1, 1, 8, 8}, DType::F32);
  gpu_backend().conv2d(x, w, nullptr, Conv2dDesc{}, y);
  for (float v : y.to_float_vector()) CHECK(v == tiny);
}

TEST_CASE("cuda conv2d refuses mismatched dtypes and shapes as the CPU does", "[cuda]") {
  MIXPREC_REQUIRE_CUDA();
  const Tensor x = Tensor::zeros({1, 2, 5, 5}, DType::F16, gpu());
  const Tensor w32 = Tensor::zeros({3, 2, 3, 3}, DType::F32, gpu());
  Tensor y = Tensor::zeros({1, 3, 3, 3}, DType::F16, gpu());
  const std::string mixed =
      error_message([&] { gpu_backend().conv2d(x, w32, nullptr, Conv2dDesc{}, y); });
  INFO(mixed);
  CHECK(mixed.rfind("conv2d: dtype mismatch", 0) == 0);
  const Tensor w = Tensor::zeros({3, 2, 3, 3}, DType::F16, gpu());
  Tensor wrong = Tensor::zeros({1, 3, 4, 4}, DType::F16, gpu());
  const std::string shapes =
      error_message([&] { gpu_backend().conv2d(x, w, nullptr, Conv2dDesc{}, wrong); });
  INFO(shapes);
  CHECK(shapes.rfind("conv2d: inconsistent shapes", 0) == 0);
}

// ---- batch normalisation ----------------------------------------------------------------------

namespace {

// 4-D and 2-D inputs; one value per (sample, channel) with two samples; a channel of 1023
// values; several splits per channel; and over 2^20 values per channel (the most splits, the
// last one short).
const std::vector<Shape>& bn_shapes() {
  static const std::vector<Shape> shapes = {{4, 3, 5, 7},   {2, 5, 1, 1},      {3, 6},
                                            {1, 7, 33, 31}, {64, 4, 16, 16},   {17, 2, 241, 263}};
  return shapes;
}

struct BnState {
  Tensor x, weight, bias, running_mean, running_var;
};

BnState bn_inputs(const Shape& shape, DType dtype, std::mt19937& rng) {
  const int64_t c = shape[1];
  // Off-centre values, so the mean matters; positive running variances.
  return {random_tensor(shape, dtype, rng, 1.0f, 3.0f), random_tensor({c}, dtype, rng, 0.5f, 1.5f),
          random_tensor({c}, dtype, rng), random_tensor({c}, DType::F32, rng),
          random_tensor({c}, DType::F32, rng, 0.5f, 2.0f)};
}

struct BnResult {
  Tensor y, save_mean, save_invstd, running_mean, running_var;
};

BnResult run_bn(Backend& backend, Device device, const BnState& in, bool training,
                bool relu = false) {
  const int64_t c = in.x.size(1);
  BnResult r{device == kCPU ? Tensor::empty(in.x.shape(), in.x.dtype())
                            : poisoned(in.x.shape(), in.x.dtype()),
             device == kCPU ? Tensor::empty({c}) : poisoned({c}, DType::F32),
             device == kCPU ? Tensor::empty({c}) : poisoned({c}, DType::F32),
             in.running_mean.clone().to(device), in.running_var.clone().to(device)};
  backend.batch_norm(in.x.to(device), in.weight.to(device), in.bias.to(device), r.running_mean,
                     r.running_var, training, 0.1f, 1e-5f, relu, r.y, r.save_mean,
                     r.save_invstd);
  return r;
}

std::string bn_label(const Shape& shape, DType dtype, bool training) {
  std::ostringstream out;
  out << "x " << shape_str(shape) << ", " << dtype << (training ? ", training" : ", eval");
  return out.str();
}

}  // namespace

TEST_CASE("cuda batch_norm forward matches the CPU, running statistics included", "[cuda]") {
  MIXPREC_REQUIRE_CUDA();
  std::mt19937 rng(51);
  const Tolerance f32 = tolerance_for(DType::F32);
  for (const Shape& shape : bn_shapes()) {
    for (DType dtype : kFloatingTypes) {
      for (const bool training : {true, false}) {
        INFO(bn_label(shape, dtype, training));
        const BnState in = bn_inputs(shape, dtype, rng);
        const BnResult expected = run_bn(cpu_backend(), kCPU, in, training);
        const BnResult actual = run_bn(gpu_backend(), gpu(), in, training);
        expect_close(expected.y, actual.y);
        expect_close(expected.save_mean, actual.save_mean, f32);
        expect_close(expected.save_invstd, actual.save_invstd, f32);
        expect_close(expected.running_mean, actual.running_mean, f32);
        expect_close(expected.running_var, actual.running_var, f32);
        if (!training) {
          // Eval reads the running statistics, leaves them alone and saves the mean as is.
          expect_bits_equal(in.running_mean, actual.running_mean);
          expect_bits_equal(in.running_var, actual.running_var);
          expect_bits_equal(in.running_mean, actual.save_mean);
        }
      }
    }
  }
}

TEST_CASE("cuda batch_norm training statistics follow the definition", "[cuda]") {
  MIXPREC_REQUIRE_CUDA();
  // One channel of four values 1, 2, 3, 6: mean 3, biased variance 3.5, unbiased 14/3.
  const Tensor x = Tensor::from_vector({1.0f, 2.0f, 3.0f, 6.0f}, {2, 1, 2, 1}, DType::F32, gpu());
  const Tensor weight = Tensor::from_vector({2.0f}, {1}, DType::F32, gpu());
  const Tensor bias = Tensor::from_vector({0.5f}, {1}, DType::F32, gpu());
  Tensor running_mean = Tensor::from_vector({1.0f}, {1}, DType::F32, gpu());
  Tensor running_var = Tensor::from_vector({2.0f}, {1}, DType::F32, gpu());
  Tensor y = poisoned({2, 1, 2, 1}, DType::F32);
  Tensor save_mean = poisoned({1}, DType::F32), save_invstd = poisoned({1}, DType::F32);
  const float eps = 0.5f, momentum = 0.25f;
  gpu_backend().batch_norm(x, weight, bias, running_mean, running_var, true, momentum, eps,
                           false, y, save_mean, save_invstd);
  const double invstd = 1.0 / std::sqrt(3.5 + eps);  // 0.5
  CHECK(save_mean.to_float_vector()[0] == Approx(3.0).epsilon(1e-6));
  CHECK(save_invstd.to_float_vector()[0] == Approx(invstd).epsilon(1e-6));
  CHECK(running_mean.to_float_vector()[0] == Approx(0.75 * 1.0 + 0.25 * 3.0).epsilon(1e-6));
  CHECK(running_var.to_float_vector()[0] == Approx(0.75 * 2.0 + 0.25 * 14.0 / 3.0).epsilon(1e-6));
  const std::vector<float> yv = y.to_float_vector();
  const double xs[] = {1, 2, 3, 6};
  for (int i = 0; i < 4; ++i) CHECK(yv[i] == Approx((xs[i] - 3.0) * invstd * 2.0 + 0.5).epsilon(1e-6));
}

TEST_CASE("cuda batch_norm backward matches the CPU in training and eval", "[cuda]") {
  MIXPREC_REQUIRE_CUDA();
  std::mt19937 rng(52);
  for (const Shape& shape : bn_shapes()) {
    for (DType dtype : kFloatingTypes) {
      for (const bool training : {true, false}) {
        INFO(bn_label(shape, dtype, training));
        const int64_t c = shape[1];
        const BnState in = bn_inputs(shape, dtype, rng);
        // The statistics both backends differentiate through: the CPU's.
        const BnResult fwd = run_bn(cpu_backend(), kCPU, in, training);
        const Tensor dy = random_tensor(shape, dtype, rng);

        Tensor dx_e = Tensor::empty(shape, dtype), dw_e = Tensor::empty({c}, dtype),
               db_e = Tensor::empty({c}, dtype);
        cpu_backend().batch_norm_backward(in.x, in.weight, fwd.save_mean, fwd.save_invstd, dy,
                                          training, nullptr, dx_e, dw_e, db_e);
        Tensor dx = poisoned(shape, dtype), dw = poisoned({c}, dtype), db = poisoned({c}, dtype);
        const Tensor gx = in.x.to(gpu()), gw = in.weight.to(gpu()), gdy = dy.to(gpu());
        const Tensor gmean = fwd.save_mean.to(gpu()), ginvstd = fwd.save_invstd.to(gpu());
        gpu_backend().batch_norm_backward(gx, gw, gmean, ginvstd, gdy, training, nullptr, dx, dw,
                                          db);

        // Magnitudes, in double from the definition: per channel sum |dy * xhat| and sum |dy|;
        // per element |scale| * (|dy| + |mean dy| + |xhat * mean(dy * xhat)|).
        const std::vector<float> xv = in.x.to_float_vector(), dyv = dy.to_float_vector(),
                                 wv = in.weight.to_float_vector(),
                                 mv = fwd.save_mean.to_float_vector(),
                                 iv = fwd.save_invstd.to_float_vector();
        const int64_t inner = in.x.numel() / (shape[0] * c), count = shape[0] * inner;
        std::vector<float> mag_w(c), mag_b(c), mag_x(xv.size());
        for (int64_t ch = 0; ch < c; ++ch) {
          double sw = 0, sb = 0, mean_g = 0, mean_gx = 0;
          for (int64_t s = 0; s < shape[0]; ++s)
            for (int64_t i = 0; i < inner; ++i) {
              const size_t k = static_cast<size_t>((s * c + ch) * inner + i);
              const double xhat = (xv[k] - mv[ch]) * static_cast<double>(iv[ch]);
              sw += std::fabs(dyv[k] * xhat);
              sb += std::fabs(dyv[k]);
              mean_g += dyv[k];
              mean_gx += dyv[k] * xhat;
            }
          mag_w[ch] = static_cast<float>(sw);
          mag_b[ch] = static_cast<float>(sb);
          mean_g /= count;
          mean_gx /= count;
          for (int64_t s = 0; s < shape[0]; ++s)
            for (int64_t i = 0; i < inner; ++i) {
              const size_t k = static_cast<size_t>((s * c + ch) * inner + i);
              const double xhat = (xv[k] - mv[ch]) * static_cast<double>(iv[ch]);
              const double terms = training ? std::fabs(dyv[k]) + std::fabs(mean_g) +
                                                  std::fabs(xhat * mean_gx)
                                            : std::fabs(dyv[k]);
              mag_x[k] = static_cast<float>(std::fabs(wv[ch] * iv[ch]) * terms);
            }
        }
        expect_close(dx_e, dx, tolerance_for(dtype), mag_x);
        expect_close(dw_e, dw, tolerance_for(dtype), mag_w);
        expect_close(db_e, db, tolerance_for(dtype), mag_b);
      }
    }
  }
}

TEST_CASE("cuda batch_norm repeats its bits from run to run", "[cuda]") {
  MIXPREC_REQUIRE_CUDA();
  std::mt19937 rng(53);
  for (DType dtype : kFloatingTypes) {
    INFO(dtype);
    const Shape shape{64, 4, 16, 16};
    const BnState in = bn_inputs(shape, dtype, rng);
    const BnResult first = run_bn(gpu_backend(), gpu(), in, true);
    const BnResult second = run_bn(gpu_backend(), gpu(), in, true);
    expect_bits_equal(first.y, second.y);
    expect_bits_equal(first.save_mean, second.save_mean);
    expect_bits_equal(first.save_invstd, second.save_invstd);
    expect_bits_equal(first.running_var, second.running_var);

    const Tensor dy = random_tensor(shape, dtype, rng).to(gpu());
    const Tensor gx = in.x.to(gpu()), gw = in.weight.to(gpu());
    Tensor dx[2] = {poisoned(shape, dtype), poisoned(shape, dtype)};
    Tensor dw[2] = {poisoned({4}, dtype), poisoned({4}, dtype)};
    Tensor db[2] = {poisoned({4}, dtype), poisoned({4}, dtype)};
    for (int run = 0; run < 2; ++run) {
      gpu_backend().batch_norm_backward(gx, gw, first.save_mean, first.save_invstd, dy, true,
                                        nullptr, dx[run], dw[run], db[run]);
    }
    expect_bits_equal(dx[0], dx[1]);
    expect_bits_equal(dw[0], dw[1]);
    expect_bits_equal(db[0], db[1]);
  }
}

TEST_CASE("cuda batch norm with relu fused is relu(batch norm) bit for bit", "[cuda]") {
  MIXPREC_REQUIRE_CUDA();
  mixprec::testing::check_fused_batch_norm_relu(gpu());
}

TEST_CASE("cuda batch_norm fused with relu matches the CPU, forward and backward", "[cuda]") {
  MIXPREC_REQUIRE_CUDA();
  std::mt19937 rng(54);
  // The fused forms against the CPU's own (the test above compares them with the GPU's
  // unfused composition instead). Centred outputs: about half of them are cut by the relu.
  const std::vector<Shape> shapes = {{4, 3, 5, 7}, {3, 6}, {1, 7, 33, 31}};
  for (const Shape& shape : shapes) {
    for (DType dtype : kFloatingTypes) {
      for (const bool training : {true, false}) {
        INFO(bn_label(shape, dtype, training) << ", relu fused");
        const int64_t c = shape[1];
        const BnState in = bn_inputs(shape, dtype, rng);
        const BnResult expected = run_bn(cpu_backend(), kCPU, in, training, true);
        const BnResult actual = run_bn(gpu_backend(), gpu(), in, training, true);
        expect_close(expected.y, actual.y);
        expect_close(expected.save_mean, actual.save_mean, tolerance_for(DType::F32));
        expect_close(expected.save_invstd, actual.save_invstd, tolerance_for(DType::F32));

        // The backward through the relu: both backends recompute the forward's output from
        // x and the CPU's statistics, so the same elements are cut.
        const Tensor dy = random_tensor(shape, dtype, rng);
        Tensor dx_e = Tensor::empty(shape, dtype), dw_e = Tensor::empty({c}, dtype),
               db_e = Tensor::empty({c}, dtype);
        cpu_backend().batch_norm_backward(in.x, in.weight, expected.save_mean,
                                          expected.save_invstd, dy, training, &in.bias, dx_e,
                                          dw_e, db_e);
        Tensor dx = poisoned(shape, dtype), dw = poisoned({c}, dtype), db = poisoned({c}, dtype);
        const Tensor gbias = in.bias.to(gpu());
        gpu_backend().batch_norm_backward(in.x.to(gpu()), in.weight.to(gpu()),
                                          expected.save_mean.to(gpu()),
                                          expected.save_invstd.to(gpu()), dy.to(gpu()), training,
                                          &gbias, dx, dw, db);
        // Bounds on what is summed, whichever elements the relu cuts: per channel sum |dy|
        // and sum |dy * xhat|; per element |scale| (|dy| + mean |dy| + |xhat| mean |dy xhat|).
        const std::vector<float> xv = in.x.to_float_vector(), dyv = dy.to_float_vector(),
                                 wv = in.weight.to_float_vector(),
                                 mv = expected.save_mean.to_float_vector(),
                                 iv = expected.save_invstd.to_float_vector();
        const int64_t inner = in.x.numel() / (shape[0] * c), count = shape[0] * inner;
        std::vector<float> mag_w(c), mag_b(c), mag_x(xv.size());
        for (int64_t ch = 0; ch < c; ++ch) {
          double sw = 0, sb = 0;
          for (int64_t sample = 0; sample < shape[0]; ++sample)
            for (int64_t i = 0; i < inner; ++i) {
              const size_t k = static_cast<size_t>((sample * c + ch) * inner + i);
              sw += std::fabs(dyv[k] * (xv[k] - mv[ch]) * static_cast<double>(iv[ch]));
              sb += std::fabs(dyv[k]);
            }
          mag_w[ch] = static_cast<float>(sw);
          mag_b[ch] = static_cast<float>(sb);
          for (int64_t sample = 0; sample < shape[0]; ++sample)
            for (int64_t i = 0; i < inner; ++i) {
              const size_t k = static_cast<size_t>((sample * c + ch) * inner + i);
              const double xhat = (xv[k] - mv[ch]) * static_cast<double>(iv[ch]);
              const double terms = training ? std::fabs(dyv[k]) + sb / static_cast<double>(count) +
                                                  std::fabs(xhat) * sw / static_cast<double>(count)
                                            : std::fabs(dyv[k]);
              mag_x[k] = static_cast<float>(std::fabs(wv[ch] * iv[ch]) * terms);
            }
        }
        expect_close(dx_e, dx, tolerance_for(dtype), mag_x);
        expect_close(dw_e, dw, tolerance_for(dtype), mag_w);
        expect_close(db_e, db, tolerance_for(dtype), mag_b);
      }
    }
  }
}
