// A table-driven sweep over every op of core/ops/ops.h, in the manner of ggml's
// test-backend-ops. Each table entry draws random shapes (extents 1 to 7, odd ones included;
// ranks 0-5 where the op takes any rank, else the op's own) and op parameters from a
// std::mt19937 seeded by the entry's name, builds random inputs, and on every draw checks:
//   1. the FP32 gradient of every floating input against finite differences (gradcheck);
//   2. the F16 and BF16 forward and backward against the F32 ones. Both runs see the same
//      values (the inputs are rounded to the 16-bit format first), so only the op's own
//      roundings are measured, and the tolerance is a few units of the format's precision
//      relative to the largest reference value;
//   3. an input with a zero extent throws mixprec::Error naming the op.
// A failure prints the entry, the draw and the drawn shapes and parameters.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <numeric>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "core/autograd/grad_mode.h"
#include "core/error.h"
#include "gradcheck.h"

namespace mixprec {
namespace {

using Catch::Contains;
using namespace testing;
using Rng = std::mt19937;

constexpr int64_t kMaxExtent = 7;
// Rank of the ops that take any rank.
constexpr int64_t kMaxRank = 5;
// Draws per entry. Entries that cycle through configurations (trans flags, keepdim, bias,
// optional weights) do so with the draw index, so each configuration gets several draws.
constexpr int kDraws = 16;
// Elements of all inputs of one case together: gradcheck runs two forwards per element.
constexpr int64_t kMaxElements = 300;
// F16/BF16 against F32, in units of the format's rtol (low_precision_rtol): the output and
// the gradient are each rounded once or twice.
constexpr double kLowTol = 2.0;

int64_t draw_int(Rng& rng, int64_t low, int64_t high) {
  return std::uniform_int_distribution<int64_t>(low, high)(rng);
}
bool coin(Rng& rng) { return draw_int(rng, 0, 1) == 1; }
double draw_real(Rng& rng, double low, double high) {
  return std::uniform_real_distribution<double>(low, high)(rng);
}

// Rank in [min_rank, max_rank], extents in [1, max_extent], at most max_numel elements.
Shape random_shape(Rng& rng, int64_t min_rank, int64_t max_rank, int64_t max_numel = 200,
                   int64_t max_extent = kMaxExtent) {
  const int64_t rank = draw_int(rng, min_rank, max_rank);
  for (;;) {
    Shape s(static_cast<size_t>(rank));
    for (int64_t& e : s) e = draw_int(rng, 1, max_extent);
    if (shape_numel(s) <= max_numel) return s;
  }
}

// A random index into a container of `size` (> 0) elements.
size_t random_index(Rng& rng, size_t size) {
  return static_cast<size_t>(draw_int(rng, 0, static_cast<int64_t>(size) - 1));
}

// `s` with one random extent set to 0 (a scalar becomes [0]).
Shape with_zero(Rng& rng, Shape s) {
  if (s.empty()) return {0};
  s[random_index(rng, s.size())] = 0;
  return s;
}

// A dimension index of a rank-`rank` tensor, sometimes written from the end.
int64_t random_dim(Rng& rng, int64_t rank) {
  const int64_t d = draw_int(rng, 0, rank - 1);
  return coin(rng) ? d - rank : d;
}

Tensor uniform(Rng& rng, const Shape& s, float low = -1.f, float high = 1.f) {
  return random_tensor(s, rng(), low, high);
}

// |x| in [low, high] with random signs: away from relu's kink by more than gradcheck's eps,
// and from a denominator's zero.
Tensor away_from_zero(Rng& rng, const Shape& s, float low, float high) {
  const std::vector<float> u = uniform(rng, s).to_float_vector();
  std::vector<float> v(u.size());
  for (size_t i = 0; i < u.size(); ++i)
    v[i] = (u[i] < 0 ? -1.f : 1.f) * (low + (high - low) * std::abs(u[i]));
  return Tensor::from_vector(v, s);
}

// Distinct values 0.02 apart (far more than twice gradcheck's eps) in random order, so no
// max-pool window holds a near-tie; none is 0.
Tensor distinct(Rng& rng, const Shape& s) {
  const int64_t n = shape_numel(s);
  std::vector<float> v(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) v[i] = 0.02f * (static_cast<float>(i - n / 2) + 0.5f);
  std::shuffle(v.begin(), v.end(), rng);
  return Tensor::from_vector(v, s);
}

// Rows along the last dim whose values are a random offset plus a shuffled ramp of step 0.3
// (jittered): every row with two or more values has a standard deviation of at least 0.1,
// so gradcheck's step is small against it and layer_norm stays near-linear over the step.
Tensor spread_rows(Rng& rng, const Shape& s) {
  const int64_t d = s.back(), rows = shape_numel(s) / d;
  std::vector<float> v;
  std::vector<int64_t> ramp(static_cast<size_t>(d));
  for (int64_t r = 0; r < rows; ++r) {
    std::iota(ramp.begin(), ramp.end(), 0);
    std::shuffle(ramp.begin(), ramp.end(), rng);
    const double offset = draw_real(rng, -1.0, 1.0);
    for (int64_t step : ramp)
      v.push_back(static_cast<float>(offset + 0.3 * static_cast<double>(step) +
                                     draw_real(rng, -0.05, 0.05)));
  }
  return Tensor::from_vector(v, s);
}

// I32 values in [0, upper).
Tensor random_ids(Rng& rng, const Shape& s, int64_t upper) {
  std::vector<int32_t> v(static_cast<size_t>(shape_numel(s)));
  for (int32_t& id : v) id = static_cast<int32_t>(draw_int(rng, 0, upper - 1));
  return Tensor::from_ints(v, s);
}

// One draw of one entry: inputs (F32 floating tensors, every one gradchecked, and I32
// labels/ids), the function under test, and the same function's input with a zero extent.
struct Case {
  std::string params;                // drawn op parameters, printed on failure
  std::vector<Tensor> inputs;        // F32 floating inputs and I32 labels/ids
  TensorFn fn;
  std::vector<Tensor> empty_inputs;  // left empty for the ops that accept an empty input
  GradcheckOptions grad = {};
  bool f32_output = false;           // the op returns F32 whatever its inputs' dtype
  // Smallest gradient scale that the 16-bit backward is compared at (see check_backward).
  double grad_floor = 1e-6;
};

struct Entry {
  const char* op;       // the op's name, as its error messages spell it
  const char* variant;  // which configuration of the op the draws cover
  std::function<Case(Rng&, int draw)> make;
};

// ---- the table ------------------------------------------------------------------------------

using Unary = Tensor (*)(const Tensor&);

// `reads_output`: the derivative is computed from the op's rounded output through a
// difference that cancels (tanh: 1 - y^2, sigmoid: y (1 - y)), so in F16/BF16 its error is
// a fraction of the incoming gradient, not of the (possibly tiny) result.
Entry unary(const char* op, Unary f, float low, float high, bool keep_off_zero = false,
            bool reads_output = false) {
  return {op, "random rank 0-5", [=](Rng& rng, int) {
            const Shape s = random_shape(rng, 0, kMaxRank);
            Case c;
            c.inputs = {keep_off_zero ? away_from_zero(rng, s, 0.1f, 1.f)
                                      : uniform(rng, s, low, high)};
            c.fn = [f](const std::vector<Tensor>& in) { return f(in[0]); };
            if (reads_output) c.grad_floor = 0.25;
            c.empty_inputs = {uniform(rng, with_zero(rng, s))};
            return c;
          }};
}

Entry scalar_op(const char* op, bool multiply) {
  return {op, "random rank 0-5", [=](Rng& rng, int) {
            const Shape s = random_shape(rng, 0, kMaxRank);
            const double scalar = draw_real(rng, -2.0, 2.0);
            Case c;
            c.params = "scalar " + std::to_string(scalar);
            c.inputs = {uniform(rng, s)};
            c.fn = [=](const std::vector<Tensor>& in) {
              return multiply ? ops::mul_scalar(in[0], scalar) : ops::add_scalar(in[0], scalar);
            };
            c.empty_inputs = {uniform(rng, with_zero(rng, s))};
            return c;
          }};
}

// An operand shape that broadcasts to `out`: random leading dims dropped, random dims 1.
Shape broadcast_operand(Rng& rng, const Shape& out) {
  if (coin(rng)) return out;
  const int64_t rank = static_cast<int64_t>(out.size());
  Shape s(out.begin() + draw_int(rng, 0, rank), out.end());
  for (int64_t& e : s)
    if (draw_int(rng, 0, 2) == 0) e = 1;
  return s;
}

Entry binary(const char* op, Tensor (*f)(const Tensor&, const Tensor&), bool denominator) {
  return {op, "random broadcast shapes", [=](Rng& rng, int) {
            const Shape out = random_shape(rng, 0, kMaxRank, 140);
            const Shape sa = broadcast_operand(rng, out), sb = broadcast_operand(rng, out);
            Case c;
            c.params = "a " + shape_str(sa) + " b " + shape_str(sb);
            auto make_b = [&](const Shape& s) {
              return denominator ? away_from_zero(rng, s, 0.5f, 1.5f) : uniform(rng, s);
            };
            c.inputs = {uniform(rng, sa), make_b(sb)};
            c.fn = [f](const std::vector<Tensor>& in) { return f(in[0], in[1]); };
            // Zero one extent of a and the same (right-aligned) extent of b unless b
            // broadcasts there, so the shapes stay compatible.
            Shape ea = sa, eb = sb;
            if (ea.empty()) {
              ea = {0};
              if (!eb.empty() && eb.back() != 1) eb.back() = 0;
            } else {
              const int64_t d = draw_int(rng, 0, static_cast<int64_t>(ea.size()) - 1);
              ea[d] = 0;
              const int64_t from_end = static_cast<int64_t>(ea.size()) - 1 - d;
              const int64_t db = static_cast<int64_t>(eb.size()) - 1 - from_end;
              if (db >= 0 && eb[db] != 1) eb[db] = 0;
            }
            c.empty_inputs = {uniform(rng, ea), make_b(eb)};
            return c;
          }};
}

Entry reduction(const char* op, bool mean, bool all_dims) {
  return {op, all_dims ? "all elements" : "random dims, keepdim both ways",
          [=](Rng& rng, int draw) {
            const Shape s = random_shape(rng, all_dims ? 0 : 1, kMaxRank);
            const int64_t rank = static_cast<int64_t>(s.size());
            std::vector<int64_t> dims;
            if (!all_dims) {
              for (int64_t d = 0; d < rank; ++d)
                if (coin(rng)) dims.push_back(coin(rng) ? d - rank : d);
              if (dims.empty()) dims.push_back(random_dim(rng, rank));
              std::shuffle(dims.begin(), dims.end(), rng);
            }
            const bool keepdim = draw % 2 == 0;
            Case c;
            if (!all_dims) c.params = "dims " + shape_str(dims) + (keepdim ? " keepdim" : "");
            c.inputs = {uniform(rng, s)};
            c.fn = [=](const std::vector<Tensor>& in) {
              if (all_dims) return mean ? ops::mean(in[0]) : ops::sum(in[0]);
              return mean ? ops::mean(in[0], dims, keepdim) : ops::sum(in[0], dims, keepdim);
            };
            c.empty_inputs = {uniform(rng, with_zero(rng, s))};
            return c;
          }};
}

enum class MatmulLayout { Plain, Batched, SharedB };

Entry matmul_entry(MatmulLayout layout) {
  const char* variant = layout == MatmulLayout::Plain     ? "2-D, all trans flags"
                        : layout == MatmulLayout::Batched ? "batched, all trans flags"
                                                          : "2-D b over a batch, all trans flags";
  return {"matmul", variant, [=](Rng& rng, int draw) {
            const bool trans_a = draw & 1, trans_b = draw & 2;
            const int64_t max_mkn = layout == MatmulLayout::Plain ? 6 : 5;
            Shape batch;
            if (layout != MatmulLayout::Plain) batch = random_shape(rng, 1, 2, 6, 3);
            int64_t m = draw_int(rng, 1, max_mkn), k = draw_int(rng, 1, max_mkn),
                    n = draw_int(rng, 1, max_mkn);
            auto shapes = [&](const Shape& bt, int64_t m_, int64_t k_, int64_t n_) {
              Shape a = bt, b = layout == MatmulLayout::Batched ? bt : Shape{};
              a.insert(a.end(), {trans_a ? k_ : m_, trans_a ? m_ : k_});
              b.insert(b.end(), {trans_b ? n_ : k_, trans_b ? k_ : n_});
              return std::vector<Shape>{a, b};
            };
            const std::vector<Shape> s = shapes(batch, m, k, n);
            Case c;
            c.params = std::string("trans_a ") + (trans_a ? "1" : "0") + " trans_b " +
                       (trans_b ? "1" : "0");
            c.inputs = {uniform(rng, s[0]), uniform(rng, s[1])};
            c.fn = [=](const std::vector<Tensor>& in) {
              return ops::matmul(in[0], in[1], trans_a, trans_b);
            };
            switch (draw_int(rng, 0, batch.empty() ? 2 : 3)) {
              case 0: m = 0; break;
              case 1: k = 0; break;
              case 2: n = 0; break;
              default: batch = with_zero(rng, batch);
            }
            const std::vector<Shape> e = shapes(batch, m, k, n);
            c.empty_inputs = {uniform(rng, e[0]), uniform(rng, e[1])};
            return c;
          }};
}

Entry linear_entry() {
  return {"linear", "2-D and 3-D x, with and without bias", [](Rng& rng, int draw) {
            const bool has_bias = draw % 2 == 0;
            const int64_t lead_rank = (draw / 2) % 2 == 0 ? 1 : 2;  // x 2-D or 3-D
            const Shape lead = random_shape(rng, lead_rank, lead_rank, 12, 5);
            int64_t in = draw_int(rng, 1, 6), out = draw_int(rng, 1, 6);
            auto build = [&](const Shape& ld, int64_t in_, int64_t out_) {
              Shape x = ld;
              x.push_back(in_);
              std::vector<Tensor> t{uniform(rng, x), uniform(rng, {out_, in_})};
              if (has_bias) t.push_back(uniform(rng, {out_}));
              return t;
            };
            Case c;
            c.params = has_bias ? "bias" : "no bias";
            c.inputs = build(lead, in, out);
            c.fn = [](const std::vector<Tensor>& in) {
              return ops::linear(in[0], in[1], in.size() > 2 ? in[2] : Tensor());
            };
            Shape empty_lead = lead;
            switch (draw_int(rng, 0, 2)) {
              case 0: empty_lead = with_zero(rng, lead); break;
              case 1: in = 0; break;
              default: out = 0;
            }
            c.empty_inputs = build(empty_lead, in, out);
            return c;
          }};
}

Entry conv2d_entry() {
  return {"conv2d", "random stride 1-2, padding 0-1, kernel 1-3, with/without bias",
          [](Rng& rng, int draw) {
            const bool has_bias = draw % 2 == 0;
            int64_t n, ch, o, k, stride, pad, h, w;
            do {
              n = draw_int(rng, 1, 2), ch = draw_int(rng, 1, 3), o = draw_int(rng, 1, 3);
              k = draw_int(rng, 1, 3), stride = draw_int(rng, 1, 2), pad = draw_int(rng, 0, 1);
              const int64_t min_hw = std::max<int64_t>(1, k - 2 * pad);
              h = draw_int(rng, min_hw, 6), w = draw_int(rng, min_hw, 6);
            } while (n * ch * h * w + o * ch * k * k + o > kMaxElements);
            auto build = [&](int64_t n_, int64_t c_, int64_t o_) {
              std::vector<Tensor> t{uniform(rng, {n_, c_, h, w}), uniform(rng, {o_, c_, k, k})};
              if (has_bias) t.push_back(uniform(rng, {o_}));
              return t;
            };
            Case c;
            c.params = "kernel " + std::to_string(k) + " stride " + std::to_string(stride) +
                       " padding " + std::to_string(pad) + (has_bias ? " bias" : " no bias");
            c.inputs = build(n, ch, o);
            c.fn = [=](const std::vector<Tensor>& in) {
              return ops::conv2d(in[0], in[1], in.size() > 2 ? in[2] : Tensor(), stride, pad);
            };
            switch (draw_int(rng, 0, 2)) {
              case 0: n = 0; break;
              case 1: ch = 0; break;
              default: o = 0;
            }
            c.empty_inputs = build(n, ch, o);
            return c;
          }};
}

Entry pool_entry(bool is_max) {
  return {is_max ? "max_pool2d" : "avg_pool2d", "random kernel 1-3, stride, padding",
          [=](Rng& rng, int) {
            const int64_t k = draw_int(rng, 1, 3), pad = draw_int(rng, 0, k / 2);
            const int64_t stride = coin(rng) ? -1 : draw_int(rng, 1, 3);
            const int64_t min_hw = std::max<int64_t>(1, k - 2 * pad);
            const Shape s{draw_int(rng, 1, 2), draw_int(rng, 1, 3), draw_int(rng, min_hw, 7),
                          draw_int(rng, min_hw, 7)};
            Case c;
            c.params = "kernel " + std::to_string(k) + " stride " + std::to_string(stride) +
                       " padding " + std::to_string(pad);
            c.inputs = {is_max ? distinct(rng, s) : uniform(rng, s)};
            c.fn = [=](const std::vector<Tensor>& in) {
              return is_max ? ops::max_pool2d(in[0], k, stride, pad)
                            : ops::avg_pool2d(in[0], k, stride, pad);
            };
            Shape e = s;
            e[static_cast<size_t>(draw_int(rng, 0, 1))] = 0;  // N or C
            c.empty_inputs = {uniform(rng, e)};
            return c;
          }};
}

Entry softmax_entry(bool log) {
  return {log ? "log_softmax" : "softmax", "random rank 1-5", [=](Rng& rng, int) {
            const Shape s = random_shape(rng, 1, kMaxRank);
            Case c;
            c.inputs = {uniform(rng, s, -3.f, 3.f)};
            c.fn = [log](const std::vector<Tensor>& in) {
              return log ? ops::log_softmax(in[0]) : ops::softmax(in[0]);
            };
            // The backward reads the rounded output: y (g - sum(g y)) cancels, so its 16-bit
            // error is a fraction of the incoming gradient rather than of the result.
            c.grad_floor = 0.25;
            c.empty_inputs = {uniform(rng, with_zero(rng, s))};
            return c;
          }};
}

Entry cross_entropy_entry() {
  return {"cross_entropy", "random N, C", [](Rng& rng, int) {
            const int64_t n = draw_int(rng, 1, kMaxExtent), classes = draw_int(rng, 1, kMaxExtent);
            Case c;
            c.inputs = {uniform(rng, {n, classes}, -3.f, 3.f), random_ids(rng, {n}, classes)};
            c.fn = [](const std::vector<Tensor>& in) { return ops::cross_entropy(in[0], in[1]); };
            c.f32_output = true;
            if (coin(rng))
              c.empty_inputs = {uniform(rng, {0, classes}), random_ids(rng, {0}, classes)};
            else
              c.empty_inputs = {uniform(rng, {n, 0}), Tensor::zeros({n}, DType::I32)};
            return c;
          }};
}

Entry mse_loss_entry() {
  return {"mse_loss", "random rank 0-5", [](Rng& rng, int) {
            const Shape s = random_shape(rng, 0, kMaxRank, 140);
            Case c;
            c.inputs = {uniform(rng, s), uniform(rng, s)};
            c.fn = [](const std::vector<Tensor>& in) { return ops::mse_loss(in[0], in[1]); };
            c.f32_output = true;
            const Shape e = with_zero(rng, s);
            c.empty_inputs = {uniform(rng, e), uniform(rng, e)};
            return c;
          }};
}

Entry layer_norm_entry() {
  return {"layer_norm", "rank 1-4, weight and bias each present or not",
          [](Rng& rng, int draw) {
            const bool has_weight = draw & 1, has_bias = draw & 2;
            const Shape s = random_shape(rng, 1, 4, 160);
            auto build = [&](const Shape& x) {
              std::vector<Tensor> t{shape_numel(x) > 0 ? spread_rows(rng, x) : uniform(rng, x)};
              if (has_weight) t.push_back(uniform(rng, {x.back()}, 0.5f, 1.5f));
              if (has_bias) t.push_back(uniform(rng, {x.back()}));
              return t;
            };
            Case c;
            c.params = std::string(has_weight ? "weight" : "no weight") +
                       (has_bias ? " bias" : " no bias");
            c.inputs = build(s);
            c.fn = [=](const std::vector<Tensor>& in) {
              return ops::layer_norm(in[0], has_weight ? in[1] : Tensor(),
                                     has_bias ? in.back() : Tensor());
            };
            c.empty_inputs = build(with_zero(rng, s));
            return c;
          }};
}

Entry batch_norm_entry(bool training) {
  return {"batch_norm2d", training ? "training" : "eval", [=](Rng& rng, int) {
            // At least three values per channel, so no batch variance is near 0.
            Shape s;
            do {
              s = {draw_int(rng, 1, 3), draw_int(rng, 1, 3), draw_int(rng, 1, 5),
                   draw_int(rng, 1, 5)};
            } while (shape_numel(s) > 180 || s[0] * s[2] * s[3] < 3);
            const Tensor running_mean = uniform(rng, {s[1]}, -0.5f, 0.5f);
            const Tensor running_var = uniform(rng, {s[1]}, 0.5f, 1.5f);
            auto build = [&](const Shape& x) {
              return std::vector<Tensor>{uniform(rng, x, -2.f, 2.f),
                                         uniform(rng, {x[1]}, 0.5f, 1.5f), uniform(rng, {x[1]})};
            };
            Case c;
            c.inputs = build(s);
            c.fn = [=](const std::vector<Tensor>& in) {
              // Fresh copies each call: every forward of a gradcheck sees the same statistics.
              Tensor rm = running_mean.clone(), rv = running_var.clone();
              return ops::batch_norm2d(in[0], in[1], in[2], rm, rv, training);
            };
            c.empty_inputs = build(with_zero(rng, s));
            return c;
          }};
}

Entry embedding_entry() {
  return {"embedding", "ids of rank 0-2", [](Rng& rng, int) {
            const int64_t vocab = draw_int(rng, 1, kMaxExtent), d = draw_int(rng, 1, 6);
            const Shape ids = random_shape(rng, 0, 2, 20, 5);
            Case c;
            c.inputs = {uniform(rng, {vocab, d}), random_ids(rng, ids, vocab)};
            c.fn = [](const std::vector<Tensor>& in) { return ops::embedding(in[0], in[1]); };
            c.empty_inputs = {uniform(rng, {vocab, 0}), c.inputs[1]};
            return c;
          }};
}

Entry dropout_entry(const char* variant, bool training, bool zero_p) {
  return {"dropout", variant, [=](Rng& rng, int) {
            const Shape s = random_shape(rng, 0, kMaxRank);
            const double p = zero_p ? 0.0 : draw_real(rng, 0.1, 0.7);
            const uint64_t seed = rng();
            Case c;
            c.params = "p " + std::to_string(p);
            c.inputs = {uniform(rng, s)};
            c.fn = [=](const std::vector<Tensor>& in) {
              Generator gen(seed);  // the same mask on every forward
              return ops::dropout(in[0], p, training, gen);
            };
            // dropout accepts an empty input (it returns it), so there is no empty case.
            return c;
          }};
}

// numel split into a random shape of rank 1-kMaxRank (in random order).
Shape random_factorisation(Rng& rng, int64_t numel) {
  const int64_t rank = draw_int(rng, 1, kMaxRank);
  Shape s;
  int64_t left = numel;
  for (int64_t i = 0; i + 1 < rank; ++i) {
    std::vector<int64_t> divisors;
    for (int64_t d = 1; d <= left; ++d)
      if (left % d == 0) divisors.push_back(d);
    const int64_t d = divisors[random_index(rng, divisors.size())];
    s.push_back(d);
    left /= d;
  }
  s.push_back(left);
  std::shuffle(s.begin(), s.end(), rng);
  return s;
}

Entry reshape_entry() {
  return {"reshape", "random target shape, sometimes with -1", [](Rng& rng, int) {
            const Shape s = random_shape(rng, 1, kMaxRank);
            Shape target = random_factorisation(rng, shape_numel(s));
            if (coin(rng)) target[random_index(rng, target.size())] = -1;
            Case c;
            c.params = "to " + shape_str(target);
            c.inputs = {uniform(rng, s)};
            c.fn = [=](const std::vector<Tensor>& in) { return ops::reshape(in[0], target); };
            // reshape accepts an empty input, so there is no empty case.
            return c;
          }};
}

Entry flatten_entry() {
  return {"flatten", "random start_dim <= end_dim", [](Rng& rng, int) {
            const Shape s = random_shape(rng, 1, kMaxRank);
            const int64_t rank = static_cast<int64_t>(s.size());
            const int64_t start = draw_int(rng, 0, rank - 1), end = draw_int(rng, start, rank - 1);
            const int64_t start_arg = coin(rng) ? start - rank : start;
            const int64_t end_arg = coin(rng) ? end - rank : end;
            Case c;
            c.params = "start_dim " + std::to_string(start_arg) + " end_dim " +
                       std::to_string(end_arg);
            c.inputs = {uniform(rng, s)};
            c.fn = [=](const std::vector<Tensor>& in) {
              return ops::flatten(in[0], start_arg, end_arg);
            };
            // flatten accepts an empty input, so there is no empty case.
            return c;
          }};
}

Entry transpose_entry() {
  return {"transpose", "random dims of rank 1-5", [](Rng& rng, int) {
            const Shape s = random_shape(rng, 1, kMaxRank);
            const int64_t rank = static_cast<int64_t>(s.size());
            const int64_t d0 = random_dim(rng, rank), d1 = random_dim(rng, rank);
            Case c;
            c.params = "dims " + std::to_string(d0) + ", " + std::to_string(d1);
            c.inputs = {uniform(rng, s)};
            c.fn = [=](const std::vector<Tensor>& in) { return ops::transpose(in[0], d0, d1); };
            c.empty_inputs = {uniform(rng, with_zero(rng, s))};
            return c;
          }};
}

Entry permute_entry() {
  return {"permute", "random permutation of rank 1-5", [](Rng& rng, int) {
            const Shape s = random_shape(rng, 1, kMaxRank);
            const int64_t rank = static_cast<int64_t>(s.size());
            std::vector<int64_t> perm(static_cast<size_t>(rank));
            std::iota(perm.begin(), perm.end(), 0);
            std::shuffle(perm.begin(), perm.end(), rng);
            for (int64_t& p : perm)
              if (coin(rng)) p -= rank;
            Case c;
            c.params = "perm " + shape_str(perm);
            c.inputs = {uniform(rng, s)};
            c.fn = [=](const std::vector<Tensor>& in) { return ops::permute(in[0], perm); };
            c.empty_inputs = {uniform(rng, with_zero(rng, s))};
            return c;
          }};
}

Entry concat_entry() {
  return {"concat", "2-3 pieces along a random dim", [](Rng& rng, int) {
            const Shape base = random_shape(rng, 1, kMaxRank, 60);
            const int64_t rank = static_cast<int64_t>(base.size());
            const int64_t dim = random_dim(rng, rank);
            const size_t d = static_cast<size_t>(dim < 0 ? dim + rank : dim);
            const int64_t pieces = draw_int(rng, 2, 3);
            std::vector<Shape> shapes;
            int64_t total = 0;
            do {
              shapes.clear();
              total = 0;
              for (int64_t i = 0; i < pieces; ++i) {
                Shape s = base;
                s[d] = draw_int(rng, 1, 5);
                shapes.push_back(s);
                total += shape_numel(s);
              }
            } while (total > kMaxElements);
            Case c;
            c.params = "dim " + std::to_string(dim);
            for (const Shape& s : shapes) c.inputs.push_back(uniform(rng, s));
            c.fn = [=](const std::vector<Tensor>& in) { return ops::concat(in, dim); };
            // One piece empty along the concatenated dim (the others stay compatible).
            const size_t which = static_cast<size_t>(draw_int(rng, 0, pieces - 1));
            for (size_t i = 0; i < shapes.size(); ++i) {
              Shape s = shapes[i];
              if (i == which) s[d] = 0;
              c.empty_inputs.push_back(uniform(rng, s));
            }
            return c;
          }};
}

Entry split_entry() {
  return {"split", "random sizes along a random dim", [](Rng& rng, int) {
            const Shape s = random_shape(rng, 1, kMaxRank);
            const int64_t rank = static_cast<int64_t>(s.size());
            const int64_t dim = random_dim(rng, rank);
            int64_t left = s[static_cast<size_t>(dim < 0 ? dim + rank : dim)];
            std::vector<int64_t> sizes;
            while (left > 0) {
              sizes.push_back(draw_int(rng, 1, left));
              left -= sizes.back();
            }
            Case c;
            c.params = "sizes " + shape_str(sizes) + " dim " + std::to_string(dim);
            c.inputs = {uniform(rng, s)};
            // The pieces joined back in reverse order: one output that depends on every piece.
            c.fn = [=](const std::vector<Tensor>& in) {
              std::vector<Tensor> pieces = ops::split(in[0], sizes, dim);
              std::reverse(pieces.begin(), pieces.end());
              return ops::concat(pieces, dim);
            };
            c.empty_inputs = {uniform(rng, with_zero(rng, s))};
            return c;
          }};
}

Entry slice_entry() {
  return {"slice", "random in-range bounds along a random dim", [](Rng& rng, int) {
            const Shape s = random_shape(rng, 1, kMaxRank);
            const int64_t rank = static_cast<int64_t>(s.size());
            const int64_t dim = random_dim(rng, rank);
            const int64_t extent = s[static_cast<size_t>(dim < 0 ? dim + rank : dim)];
            const int64_t start = draw_int(rng, 0, extent - 1);
            const int64_t end = draw_int(rng, start + 1, extent);
            const int64_t start_arg = coin(rng) ? start - extent : start;
            const int64_t end_arg = end < extent && coin(rng) ? end - extent : end;
            Case c;
            c.params = "dim " + std::to_string(dim) + " [" + std::to_string(start_arg) + ", " +
                       std::to_string(end_arg) + ")";
            c.inputs = {uniform(rng, s)};
            c.fn = [=](const std::vector<Tensor>& in) {
              return ops::slice(in[0], dim, start_arg, end_arg);
            };
            c.empty_inputs = {uniform(rng, with_zero(rng, s))};
            return c;
          }};
}

Entry attention_entry() {
  return {"causal_attention", "random B, H, T, D", [](Rng& rng, int) {
            const Shape s{draw_int(rng, 1, 2), draw_int(rng, 1, 2), draw_int(rng, 1, 5),
                          draw_int(rng, 1, 4)};
            Case c;
            c.inputs = {uniform(rng, s), uniform(rng, s), uniform(rng, s)};
            c.fn = [](const std::vector<Tensor>& in) {
              return ops::causal_attention(in[0], in[1], in[2]);
            };
            const Shape e = with_zero(rng, s);
            c.empty_inputs = {uniform(rng, e), uniform(rng, e), uniform(rng, e)};
            return c;
          }};
}

Entry cast_entry() {
  return {"cast", "F32 -> F16 -> F32", [](Rng& rng, int) {
            const Shape s = random_shape(rng, 0, kMaxRank);
            Case c;
            c.inputs = {uniform(rng, s)};
            c.fn = [](const std::vector<Tensor>& in) {
              return ops::cast(ops::cast(in[0], DType::F16), DType::F32);
            };
            // The forward is F16's staircase: a step of 0.05 keeps its rounding (half an F16
            // ulp, at most 2.5e-4 below 1) well inside the tolerance of the slope 1.
            c.grad.eps = 0.05;
            c.f32_output = true;
            // cast accepts an empty input, so there is no empty case.
            return c;
          }};
}

const std::vector<Entry>& sweep_table() {
  static const std::vector<Entry> table = {
      binary("add", ops::add, false),
      binary("sub", ops::sub, false),
      binary("mul", ops::mul, false),
      binary("div", ops::div, true),
      scalar_op("add_scalar", false),
      scalar_op("mul_scalar", true),
      unary("neg", ops::neg, -1.f, 1.f),
      unary("exp", ops::exp, -2.f, 2.f),
      unary("log", ops::log, 0.5f, 2.f),
      unary("sqrt", ops::sqrt, 0.3f, 2.f),
      unary("square", ops::square, -2.f, 2.f),
      unary("relu", ops::relu, -1.f, 1.f, /*keep_off_zero=*/true),
      unary("gelu", ops::gelu, -3.f, 3.f),
      unary("sigmoid", ops::sigmoid, -3.f, 3.f, false, /*reads_output=*/true),
      unary("tanh", ops::tanh, -3.f, 3.f, false, /*reads_output=*/true),
      reduction("sum", false, true),
      reduction("sum", false, false),
      reduction("mean", true, true),
      reduction("mean", true, false),
      matmul_entry(MatmulLayout::Plain),
      matmul_entry(MatmulLayout::Batched),
      matmul_entry(MatmulLayout::SharedB),
      linear_entry(),
      conv2d_entry(),
      pool_entry(true),
      pool_entry(false),
      softmax_entry(false),
      softmax_entry(true),
      cross_entropy_entry(),
      mse_loss_entry(),
      layer_norm_entry(),
      batch_norm_entry(true),
      batch_norm_entry(false),
      embedding_entry(),
      dropout_entry("training, fixed generator seed", true, false),
      dropout_entry("p = 0", true, true),
      dropout_entry("eval", false, false),
      reshape_entry(),
      flatten_entry(),
      transpose_entry(),
      permute_entry(),
      concat_entry(),
      split_entry(),
      slice_entry(),
      attention_entry(),
      cast_entry(),
  };
  return table;
}

// ---- the checks -----------------------------------------------------------------------------

// FNV-1a: each entry's seed depends only on its own name, not on its place in the table.
uint32_t seed_of(const Entry& e) {
  uint32_t h = 2166136261u;
  for (const char* p : {e.op, "/", e.variant})
    for (; *p; ++p) h = (h ^ static_cast<uint8_t>(*p)) * 16777619u;
  return h;
}

double max_abs(const Tensor& t) {
  double m = 0;
  for (float v : t.to_float_vector()) m = std::max(m, static_cast<double>(std::abs(v)));
  return m;
}

std::vector<Tensor> rounded_to(const std::vector<Tensor>& inputs, DType dtype) {
  std::vector<Tensor> out;
  for (const Tensor& t : inputs)
    out.push_back(is_floating(t.dtype()) ? t.detach().to(dtype).to(DType::F32) : t);
  return out;
}

// The forward in `dtype` against F32 on the same (rounded) values, within tol units of the
// format's rtol relative to the element and to the largest reference value.
void check_forward(const std::string& label, const Case& c, const std::vector<Tensor>& rounded,
                   DType dtype) {
  double scale;
  {
    NoGradGuard no_grad;
    scale = std::max(1.0, max_abs(c.fn(rounded)));
  }
  check_low_precision(label, c.fn, rounded, dtype, kLowTol * scale);
}

// One backward in `dtype` and the same in F32 on the same values (and the same incoming
// gradient). Every floating input's gradient keeps its dtype and matches within tol units of
// the format's rtol relative to the largest reference gradient (or to grad_floor when that
// is larger).
void check_backward(const std::string& label, const Case& c, const std::vector<Tensor>& rounded,
                    DType dtype, uint64_t seed) {
  std::vector<Tensor> low, full;
  for (const Tensor& t : rounded) {
    const bool floating = is_floating(t.dtype());
    low.push_back(floating ? t.detach().to(dtype).set_requires_grad(true) : t);
    full.push_back(floating ? t.detach().clone().set_requires_grad(true) : t);
  }
  const Tensor y = c.fn(low);
  REQUIRE(y.dtype() == (c.f32_output ? DType::F32 : dtype));
  const Tensor g = random_tensor(y.shape(), seed, -1.f, 1.f, y.dtype());
  y.backward(g);
  c.fn(full).backward(g.to(DType::F32));
  const double tol = kLowTol * low_precision_rtol(dtype);
  for (size_t i = 0; i < low.size(); ++i) {
    if (!is_floating(low[i].dtype())) continue;
    const std::string what =
        label + " grad " + std::to_string(i) + " " + std::string(dtype_name(dtype));
    INFO(what);
    REQUIRE(low[i].grad().defined());
    REQUIRE(low[i].grad().dtype() == dtype);
    const Tensor reference = full[i].grad();
    require_close(low[i].grad(), reference, tol,
                  tol * std::max(max_abs(reference), c.grad_floor), what);
  }
}

std::string describe_inputs(const std::vector<Tensor>& inputs) {
  std::ostringstream out;
  for (size_t i = 0; i < inputs.size(); ++i) out << (i ? ", " : "") << describe(inputs[i]);
  return out.str();
}

TEST_CASE("op sweep: every op on random shapes, FP32 gradients, F16/BF16, empty input",
          "[sweep]") {
  for (const Entry& entry : sweep_table()) {
    DYNAMIC_SECTION(entry.op << " (" << entry.variant << ")") {
      Rng rng(seed_of(entry));
      for (int draw = 0; draw < kDraws; ++draw) {
        Case c = entry.make(rng, draw);
        const std::string label = std::string(entry.op) + " (" + entry.variant + ") draw " +
                                  std::to_string(draw) + ": " + describe_inputs(c.inputs) +
                                  (c.params.empty() ? "" : " " + c.params);
        INFO(label);
        int64_t floating_numel = 0;
        for (Tensor& t : c.inputs)
          if (is_floating(t.dtype())) {
            t.set_requires_grad(true);
            floating_numel += t.numel();
          }
        REQUIRE(floating_numel <= kMaxElements);

        gradcheck(label, c.fn, c.inputs, c.grad);

        for (DType dtype : {DType::F16, DType::BF16}) {
          const std::vector<Tensor> rounded = rounded_to(c.inputs, dtype);
          check_forward(label, c, rounded, dtype);
          check_backward(label, c, rounded, dtype, rng());
        }

        if (!c.empty_inputs.empty()) {
          INFO("empty input: " << describe_inputs(c.empty_inputs));
          REQUIRE_THROWS_AS(c.fn(c.empty_inputs), Error);
          REQUIRE_THROWS_WITH(c.fn(c.empty_inputs), Contains(entry.op) && Contains("empty"));
        }
      }
    }
  }
}

// Every op of core/ops/ops.h has an entry (the list below is the header's, in its order).
TEST_CASE("op sweep: the table covers every op", "[sweep]") {
  const std::vector<std::string> declared = {
      "cast", "reshape", "flatten", "transpose", "permute", "concat", "split", "slice",
      "add", "sub", "mul", "div", "add_scalar", "mul_scalar", "neg", "exp", "log", "sqrt",
      "square", "relu", "gelu", "sigmoid", "tanh", "sum", "mean", "matmul", "linear", "conv2d",
      "max_pool2d", "avg_pool2d", "softmax", "log_softmax", "cross_entropy", "mse_loss",
      "layer_norm", "batch_norm2d", "embedding", "dropout", "causal_attention"};
  for (const std::string& op : declared) {
    INFO(op);
    CHECK(std::any_of(sweep_table().begin(), sweep_table().end(),
                      [&](const Entry& e) { return op == e.op; }));
  }
}

}  // namespace
}  // namespace mixprec
