// The op table's entries (tests/ops/op_table.h) and the random draws they are built from.
#include "tests/ops/op_table.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <numeric>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "core/generator.h"
#include "core/ops/ops.h"

namespace mixprec::op_table {
namespace {

using testing::random_tensor;

constexpr int64_t kMaxExtent = 7;
// Rank of the ops that take any rank.
constexpr int64_t kMaxRank = 5;

int64_t draw_int(OpRng& rng, int64_t low, int64_t high) {
  return std::uniform_int_distribution<int64_t>(low, high)(rng);
}
bool coin(OpRng& rng) { return draw_int(rng, 0, 1) == 1; }
double draw_real(OpRng& rng, double low, double high) {
  return std::uniform_real_distribution<double>(low, high)(rng);
}

// Rank in [min_rank, max_rank], extents in [1, max_extent], at most max_numel elements.
// Extents past kMaxExtent are drawn one at a time within what the budget leaves (then
// shuffled), where drawing all and rejecting would rarely fit a rank-5 shape.
Shape random_shape(OpRng& rng, int64_t min_rank, int64_t max_rank, int64_t max_numel = 200,
                   int64_t max_extent = kMaxExtent) {
  const int64_t rank = draw_int(rng, min_rank, max_rank);
  if (max_extent > kMaxExtent) {
    Shape s;
    int64_t left = max_numel;
    for (int64_t i = 0; i < rank; ++i) {
      s.push_back(draw_int(rng, 1, std::max<int64_t>(1, std::min(max_extent, left))));
      left /= s.back();
    }
    std::shuffle(s.begin(), s.end(), rng);
    return s;
  }
  for (;;) {
    Shape s(static_cast<size_t>(rank));
    for (int64_t& e : s) e = draw_int(rng, 1, max_extent);
    if (shape_numel(s) <= max_numel) return s;
  }
}

// A random index into a container of `size` (> 0) elements.
size_t random_index(OpRng& rng, size_t size) {
  return static_cast<size_t>(draw_int(rng, 0, static_cast<int64_t>(size) - 1));
}

// `s` with one random extent set to 0 (a scalar becomes [0]).
Shape with_zero(OpRng& rng, Shape s) {
  if (s.empty()) return {0};
  s[random_index(rng, s.size())] = 0;
  return s;
}

// A dimension index of a rank-`rank` tensor, sometimes written from the end.
int64_t random_dim(OpRng& rng, int64_t rank) {
  const int64_t d = draw_int(rng, 0, rank - 1);
  return coin(rng) ? d - rank : d;
}

// The index into a Shape of random_dim's `dim`, counted from the front.
size_t dim_index(int64_t dim, int64_t rank) { return static_cast<size_t>(dim < 0 ? dim + rank : dim); }

Tensor uniform(OpRng& rng, const Shape& s, float low = -1.f, float high = 1.f) {
  return random_tensor(s, rng(), low, high);
}

// |x| in [low, high] with random signs: away from relu's kink by more than gradcheck's eps,
// and from a denominator's zero.
Tensor away_from_zero(OpRng& rng, const Shape& s, float low, float high) {
  const std::vector<float> u = uniform(rng, s).to_float_vector();
  std::vector<float> v(u.size());
  for (size_t i = 0; i < u.size(); ++i)
    v[i] = (u[i] < 0 ? -1.f : 1.f) * (low + (high - low) * std::abs(u[i]));
  return Tensor::from_vector(v, s);
}

// Distinct values 0.02 apart (far more than twice gradcheck's eps) in random order, so no
// max-pool window holds a near-tie; none is 0.
Tensor distinct(OpRng& rng, const Shape& s) {
  const int64_t n = shape_numel(s);
  std::vector<float> v(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) v[i] = 0.02f * (static_cast<float>(i - n / 2) + 0.5f);
  std::shuffle(v.begin(), v.end(), rng);
  return Tensor::from_vector(v, s);
}

// Rows along the last dim whose values are a random offset plus a shuffled ramp of step 0.3
// (jittered): every row with two or more values has a standard deviation of at least 0.1,
// so gradcheck's step is small against it and layer_norm stays near-linear over the step.
Tensor spread_rows(OpRng& rng, const Shape& s) {
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
Tensor random_ids(OpRng& rng, const Shape& s, int64_t upper) {
  std::vector<int32_t> v(static_cast<size_t>(shape_numel(s)));
  for (int32_t& id : v) id = static_cast<int32_t>(draw_int(rng, 0, upper - 1));
  return Tensor::from_ints(v, s);
}

// ---- the table ------------------------------------------------------------------------------

using Unary = Tensor (*)(const Tensor&);

// `reads_output`: the derivative is computed from the op's rounded output through a
// difference that cancels (tanh: 1 - y^2, sigmoid: y (1 - y)), so in F16/BF16 its error is
// a fraction of the incoming gradient, not of the (possibly tiny) result.
OpEntry unary(const char* op, Unary f, float low, float high, bool keep_off_zero = false,
            bool reads_output = false) {
  return {op, "random rank 0-5", [=](OpRng& rng, int, const OpSizes& z) {
            const Shape s = random_shape(rng, 0, kMaxRank, z.pick(200, 2000), z.pick(kMaxExtent, 70));
            OpCase c;
            c.inputs = {keep_off_zero ? away_from_zero(rng, s, 0.1f, 1.f)
                                      : uniform(rng, s, low, high)};
            c.fn = [f](const std::vector<Tensor>& in) { return f(in[0]); };
            if (reads_output) c.grad_floor = 0.25;
            c.empty_inputs = {uniform(rng, with_zero(rng, s))};
            return c;
          }};
}

OpEntry scalar_op(const char* op, bool multiply) {
  return {op, "random rank 0-5", [=](OpRng& rng, int, const OpSizes& z) {
            const Shape s = random_shape(rng, 0, kMaxRank, z.pick(200, 2000), z.pick(kMaxExtent, 70));
            const double scalar = draw_real(rng, -2.0, 2.0);
            OpCase c;
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
Shape broadcast_operand(OpRng& rng, const Shape& out) {
  if (coin(rng)) return out;
  const int64_t rank = static_cast<int64_t>(out.size());
  Shape s(out.begin() + draw_int(rng, 0, rank), out.end());
  for (int64_t& e : s)
    if (draw_int(rng, 0, 2) == 0) e = 1;
  return s;
}

OpEntry binary(const char* op, Tensor (*f)(const Tensor&, const Tensor&), bool denominator) {
  return {op, "random broadcast shapes", [=](OpRng& rng, int, const OpSizes& z) {
            const Shape out = random_shape(rng, 0, kMaxRank, z.pick(140, 1400), z.pick(kMaxExtent, 70));
            const Shape sa = broadcast_operand(rng, out), sb = broadcast_operand(rng, out);
            OpCase c;
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

OpEntry reduction(const char* op, bool mean, bool all_dims) {
  return {op, all_dims ? "all elements" : "random dims, keepdim both ways",
          [=](OpRng& rng, int draw, const OpSizes& z) {
            const Shape s = random_shape(rng, all_dims ? 0 : 1, kMaxRank, z.pick(200, 2000),
                                         z.pick(kMaxExtent, 70));
            const int64_t rank = static_cast<int64_t>(s.size());
            std::vector<int64_t> dims;
            if (!all_dims) {
              for (int64_t d = 0; d < rank; ++d)
                if (coin(rng)) dims.push_back(coin(rng) ? d - rank : d);
              if (dims.empty()) dims.push_back(random_dim(rng, rank));
              std::shuffle(dims.begin(), dims.end(), rng);
            }
            const bool keepdim = draw % 2 == 0;
            OpCase c;
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

OpEntry matmul_entry(MatmulLayout layout) {
  const char* variant = layout == MatmulLayout::Plain     ? "2-D, all trans flags"
                        : layout == MatmulLayout::Batched ? "batched, all trans flags"
                                                          : "2-D b over a batch, all trans flags";
  return {"matmul", variant, [=](OpRng& rng, int draw, const OpSizes& z) {
            const bool trans_a = draw & 1, trans_b = draw & 2;
            const int64_t max_mkn = layout == MatmulLayout::Plain ? z.pick(6, 64) : z.pick(5, 32);
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
            OpCase c;
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

// linear, or linear_gelu (the same shapes, gelu applied in the GEMM's epilogue).
OpEntry linear_entry(bool gelu) {
  return {gelu ? "linear_gelu" : "linear", "2-D and 3-D x, with and without bias",
          [=](OpRng& rng, int draw, const OpSizes& z) {
            const bool has_bias = draw % 2 == 0;
            const int64_t lead_rank = (draw / 2) % 2 == 0 ? 1 : 2;  // x 2-D or 3-D
            const Shape lead = random_shape(rng, lead_rank, lead_rank, z.pick(12, 120), z.pick(5, 40));
            int64_t in = draw_int(rng, 1, z.pick(6, 64)), out = draw_int(rng, 1, z.pick(6, 64));
            auto build = [&](const Shape& ld, int64_t in_, int64_t out_) {
              Shape x = ld;
              x.push_back(in_);
              std::vector<Tensor> t{uniform(rng, x), uniform(rng, {out_, in_})};
              if (has_bias) t.push_back(uniform(rng, {out_}));
              return t;
            };
            OpCase c;
            c.params = has_bias ? "bias" : "no bias";
            c.inputs = build(lead, in, out);
            c.fn = [=](const std::vector<Tensor>& in) {
              const Tensor bias = in.size() > 2 ? in[2] : Tensor();
              return gelu ? ops::linear_gelu(in[0], in[1], bias) : ops::linear(in[0], in[1], bias);
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

OpEntry conv2d_entry() {
  return {"conv2d", "random stride 1-2, padding 0-1, kernel 1-3 a side, with/without bias",
          [](OpRng& rng, int draw, const OpSizes& z) {
            const bool has_bias = draw % 2 == 0;
            int64_t n, ch, o, kh, kw, stride, pad, h, w;
            do {
              n = draw_int(rng, 1, 2), ch = draw_int(rng, 1, z.pick(3, 16));
              o = draw_int(rng, 1, z.pick(3, 16));
              kh = draw_int(rng, 1, 3), kw = draw_int(rng, 1, 3);
              stride = draw_int(rng, 1, 2), pad = draw_int(rng, 0, 1);
              h = draw_int(rng, std::max<int64_t>(1, kh - 2 * pad), z.pick(6, 24));
              w = draw_int(rng, std::max<int64_t>(1, kw - 2 * pad), z.pick(6, 24));
            } while (n * ch * h * w + o * ch * kh * kw + o > z.pick(kOpMaxElements, 6000));
            auto build = [&](int64_t n_, int64_t c_, int64_t o_) {
              std::vector<Tensor> t{uniform(rng, {n_, c_, h, w}), uniform(rng, {o_, c_, kh, kw})};
              if (has_bias) t.push_back(uniform(rng, {o_}));
              return t;
            };
            OpCase c;
            c.params = "kernel " + std::to_string(kh) + "x" + std::to_string(kw) + " stride " +
                       std::to_string(stride) + " padding " + std::to_string(pad) +
                       (has_bias ? " bias" : " no bias");
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

OpEntry pool_entry(bool is_max) {
  return {is_max ? "max_pool2d" : "avg_pool2d", "random kernel 1-3, stride, padding",
          [=](OpRng& rng, int, const OpSizes& z) {
            const int64_t k = draw_int(rng, 1, 3), pad = draw_int(rng, 0, k / 2);
            const int64_t stride = coin(rng) ? -1 : draw_int(rng, 1, 3);
            const int64_t min_hw = std::max<int64_t>(1, k - 2 * pad);
            const Shape s{draw_int(rng, 1, 2), draw_int(rng, 1, z.pick(3, 8)),
                          draw_int(rng, min_hw, z.pick(7, 40)), draw_int(rng, min_hw, z.pick(7, 40))};
            OpCase c;
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

OpEntry softmax_entry(bool log) {
  return {log ? "log_softmax" : "softmax", "random rank 1-5", [=](OpRng& rng, int, const OpSizes& z) {
            const Shape s = random_shape(rng, 1, kMaxRank, z.pick(200, 2000), z.pick(kMaxExtent, 70));
            OpCase c;
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

OpEntry cross_entropy_entry() {
  return {"cross_entropy", "random N, C", [](OpRng& rng, int, const OpSizes& z) {
            const int64_t n = draw_int(rng, 1, z.pick(kMaxExtent, 300)),
                          classes = draw_int(rng, 1, z.pick(kMaxExtent, 300));
            OpCase c;
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

OpEntry mse_loss_entry() {
  return {"mse_loss", "random rank 0-5", [](OpRng& rng, int, const OpSizes& z) {
            const Shape s = random_shape(rng, 0, kMaxRank, z.pick(140, 1400), z.pick(kMaxExtent, 70));
            OpCase c;
            c.inputs = {uniform(rng, s), uniform(rng, s)};
            c.fn = [](const std::vector<Tensor>& in) { return ops::mse_loss(in[0], in[1]); };
            c.f32_output = true;
            const Shape e = with_zero(rng, s);
            c.empty_inputs = {uniform(rng, e), uniform(rng, e)};
            return c;
          }};
}

OpEntry layer_norm_entry() {
  return {"layer_norm", "rank 1-4, weight and bias each present or not",
          [](OpRng& rng, int draw, const OpSizes& z) {
            const bool has_weight = draw & 1, has_bias = draw & 2;
            const Shape s = random_shape(rng, 1, 4, z.pick(160, 3000), z.pick(kMaxExtent, 70));
            auto build = [&](const Shape& x) {
              std::vector<Tensor> t{shape_numel(x) > 0 ? spread_rows(rng, x) : uniform(rng, x)};
              if (has_weight) t.push_back(uniform(rng, {x.back()}, 0.5f, 1.5f));
              if (has_bias) t.push_back(uniform(rng, {x.back()}));
              return t;
            };
            OpCase c;
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

OpEntry batch_norm_entry(bool training) {
  return {"batch_norm2d", training ? "training" : "eval", [=](OpRng& rng, int, const OpSizes& z) {
            // At least three values per channel, so no batch variance is near 0.
            Shape s;
            do {
              s = {draw_int(rng, 1, z.pick(3, 4)), draw_int(rng, 1, z.pick(3, 16)),
                   draw_int(rng, 1, z.pick(5, 24)), draw_int(rng, 1, z.pick(5, 24))};
            } while (shape_numel(s) > z.pick(180, 3000) || s[0] * s[2] * s[3] < 3);
            const Tensor running_mean = uniform(rng, {s[1]}, -0.5f, 0.5f);
            const Tensor running_var = uniform(rng, {s[1]}, 0.5f, 1.5f);
            auto build = [&](const Shape& x) {
              return std::vector<Tensor>{uniform(rng, x, -2.f, 2.f),
                                         uniform(rng, {x[1]}, 0.5f, 1.5f), uniform(rng, {x[1]})};
            };
            OpCase c;
            c.inputs = build(s);
            c.fn = [=](const std::vector<Tensor>& in) {
              // Fresh copies each call, on the input's device: every forward of a gradcheck
              // sees the same statistics.
              Tensor rm = running_mean.to(in[0].device()).clone();
              Tensor rv = running_var.to(in[0].device()).clone();
              return ops::batch_norm2d(in[0], in[1], in[2], rm, rv, training);
            };
            c.empty_inputs = build(with_zero(rng, s));
            return c;
          }};
}

OpEntry embedding_entry() {
  return {"embedding", "ids of rank 0-2", [](OpRng& rng, int, const OpSizes& z) {
            const int64_t vocab = draw_int(rng, 1, z.pick(kMaxExtent, 300)),
                          d = draw_int(rng, 1, z.pick(6, 70));
            const Shape ids = random_shape(rng, 0, z.pick(2, 3), z.pick(20, 4000), z.pick(5, 40));
            OpCase c;
            c.inputs = {uniform(rng, {vocab, d}), random_ids(rng, ids, vocab)};
            c.fn = [](const std::vector<Tensor>& in) { return ops::embedding(in[0], in[1]); };
            c.empty_inputs = {uniform(rng, {vocab, 0}), c.inputs[1]};
            return c;
          }};
}

// dropout, or dropout_add (a residual plus the dropout of x, in one pass).
OpEntry dropout_entry(const char* variant, bool training, bool zero_p, bool add = false) {
  return {add ? "dropout_add" : "dropout", variant, [=](OpRng& rng, int, const OpSizes& z) {
            const Shape s = random_shape(rng, 0, kMaxRank, z.pick(add ? 140 : 200, 2000),
                                         z.pick(kMaxExtent, 70));
            const double p = zero_p ? 0.0 : draw_real(rng, 0.1, 0.7);
            const uint64_t seed = rng();
            OpCase c;
            c.params = "p " + std::to_string(p);
            c.inputs = {uniform(rng, s)};
            if (add) c.inputs.push_back(uniform(rng, s));
            c.fn = [=](const std::vector<Tensor>& in) {
              Generator gen(seed);  // the same mask on every forward
              return add ? ops::dropout_add(in[1], in[0], p, training, gen)
                         : ops::dropout(in[0], p, training, gen);
            };
            // dropout accepts an empty input (it returns it), so there is no empty case.
            return c;
          }};
}

// numel split into a random shape of rank 1-kMaxRank (in random order).
Shape random_factorisation(OpRng& rng, int64_t numel) {
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

OpEntry reshape_entry() {
  return {"reshape", "random target shape, sometimes with -1", [](OpRng& rng, int, const OpSizes& z) {
            const Shape s = random_shape(rng, 1, kMaxRank, z.pick(200, 2000), z.pick(kMaxExtent, 70));
            Shape target = random_factorisation(rng, shape_numel(s));
            if (coin(rng)) target[random_index(rng, target.size())] = -1;
            OpCase c;
            c.params = "to " + shape_str(target);
            c.inputs = {uniform(rng, s)};
            c.fn = [=](const std::vector<Tensor>& in) { return ops::reshape(in[0], target); };
            // reshape accepts an empty input, so there is no empty case.
            return c;
          }};
}

OpEntry flatten_entry() {
  return {"flatten", "random start_dim <= end_dim", [](OpRng& rng, int, const OpSizes& z) {
            const Shape s = random_shape(rng, 1, kMaxRank, z.pick(200, 2000), z.pick(kMaxExtent, 70));
            const int64_t rank = static_cast<int64_t>(s.size());
            const int64_t start = draw_int(rng, 0, rank - 1), end = draw_int(rng, start, rank - 1);
            const int64_t start_arg = coin(rng) ? start - rank : start;
            const int64_t end_arg = coin(rng) ? end - rank : end;
            OpCase c;
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

OpEntry transpose_entry() {
  return {"transpose", "random dims of rank 1-5", [](OpRng& rng, int, const OpSizes& z) {
            const Shape s = random_shape(rng, 1, kMaxRank, z.pick(200, 2000), z.pick(kMaxExtent, 70));
            const int64_t rank = static_cast<int64_t>(s.size());
            const int64_t d0 = random_dim(rng, rank), d1 = random_dim(rng, rank);
            OpCase c;
            c.params = "dims " + std::to_string(d0) + ", " + std::to_string(d1);
            c.inputs = {uniform(rng, s)};
            c.fn = [=](const std::vector<Tensor>& in) { return ops::transpose(in[0], d0, d1); };
            c.empty_inputs = {uniform(rng, with_zero(rng, s))};
            return c;
          }};
}

OpEntry permute_entry() {
  return {"permute", "random permutation of rank 1-5", [](OpRng& rng, int, const OpSizes& z) {
            const Shape s = random_shape(rng, 1, kMaxRank, z.pick(200, 2000), z.pick(kMaxExtent, 70));
            const int64_t rank = static_cast<int64_t>(s.size());
            std::vector<int64_t> perm(static_cast<size_t>(rank));
            std::iota(perm.begin(), perm.end(), 0);
            std::shuffle(perm.begin(), perm.end(), rng);
            for (int64_t& p : perm)
              if (coin(rng)) p -= rank;
            OpCase c;
            c.params = "perm " + shape_str(perm);
            c.inputs = {uniform(rng, s)};
            c.fn = [=](const std::vector<Tensor>& in) { return ops::permute(in[0], perm); };
            c.empty_inputs = {uniform(rng, with_zero(rng, s))};
            return c;
          }};
}

OpEntry concat_entry() {
  return {"concat", "2-3 pieces along a random dim", [](OpRng& rng, int, const OpSizes& z) {
            const Shape base = random_shape(rng, 1, kMaxRank, z.pick(60, 600), z.pick(kMaxExtent, 70));
            const int64_t rank = static_cast<int64_t>(base.size());
            const int64_t dim = random_dim(rng, rank);
            const size_t d = dim_index(dim, rank);
            const int64_t pieces = draw_int(rng, 2, 3);
            std::vector<Shape> shapes;
            int64_t total = 0;
            do {
              shapes.clear();
              total = 0;
              for (int64_t i = 0; i < pieces; ++i) {
                Shape s = base;
                s[d] = draw_int(rng, 1, z.pick(5, 40));
                shapes.push_back(s);
                total += shape_numel(s);
              }
            } while (total > z.pick(kOpMaxElements, 6000));
            OpCase c;
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

OpEntry split_entry() {
  return {"split", "random sizes along a random dim", [](OpRng& rng, int, const OpSizes& z) {
            const Shape s = random_shape(rng, 1, kMaxRank, z.pick(200, 2000), z.pick(kMaxExtent, 70));
            const int64_t rank = static_cast<int64_t>(s.size());
            const int64_t dim = random_dim(rng, rank);
            int64_t left = s[dim_index(dim, rank)];
            std::vector<int64_t> sizes;
            while (left > 0) {
              sizes.push_back(draw_int(rng, 1, left));
              left -= sizes.back();
            }
            OpCase c;
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

OpEntry slice_entry() {
  return {"slice", "random in-range bounds along a random dim", [](OpRng& rng, int, const OpSizes& z) {
            const Shape s = random_shape(rng, 1, kMaxRank, z.pick(200, 2000), z.pick(kMaxExtent, 70));
            const int64_t rank = static_cast<int64_t>(s.size());
            const int64_t dim = random_dim(rng, rank);
            const int64_t extent = s[dim_index(dim, rank)];
            const int64_t start = draw_int(rng, 0, extent - 1);
            const int64_t end = draw_int(rng, start + 1, extent);
            const int64_t start_arg = coin(rng) ? start - extent : start;
            const int64_t end_arg = end < extent && coin(rng) ? end - extent : end;
            OpCase c;
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

// causal_attention, without or with attention dropout (training, a fixed generator seed).
OpEntry attention_entry(bool with_dropout) {
  return {"causal_attention", with_dropout ? "random B, H, T, D, dropout" : "random B, H, T, D",
          [=](OpRng& rng, int, const OpSizes& z) {
            const Shape s{draw_int(rng, 1, 2), draw_int(rng, 1, 2), draw_int(rng, 1, z.pick(5, 40)),
                          draw_int(rng, 1, z.pick(4, 32))};
            const double p = with_dropout ? draw_real(rng, 0.1, 0.5) : 0.0;
            const uint64_t seed = rng();
            OpCase c;
            if (with_dropout) c.params = "p " + std::to_string(p);
            c.inputs = {uniform(rng, s), uniform(rng, s), uniform(rng, s)};
            c.fn = [=](const std::vector<Tensor>& in) {
              if (!with_dropout) return ops::causal_attention(in[0], in[1], in[2]);
              Generator gen(seed);  // the same mask on every forward
              return ops::causal_attention(in[0], in[1], in[2], p, true, gen);
            };
            const Shape e = with_zero(rng, s);
            c.empty_inputs = {uniform(rng, e), uniform(rng, e), uniform(rng, e)};
            return c;
          }};
}

OpEntry split_heads_entry() {
  return {"split_heads", "random B, T, H, D", [](OpRng& rng, int, const OpSizes& z) {
            const int64_t b = draw_int(rng, 1, z.pick(2, 4)), t = draw_int(rng, 1, z.pick(5, 76)),
                          h = draw_int(rng, 1, z.pick(3, 4)), d = draw_int(rng, 1, z.pick(4, 70));
            OpCase c;
            c.params = "n_head " + std::to_string(h);
            c.inputs = {uniform(rng, {b, t, 3 * h * d})};
            // q, k and v joined back out of order: one output that depends on every head.
            c.fn = [h](const std::vector<Tensor>& in) {
              const std::vector<Tensor> qkv = ops::split_heads(in[0], h);
              return ops::concat({qkv[2], qkv[0], qkv[1]}, 1);
            };
            c.empty_inputs = {uniform(rng, {b, 0, 3 * h * d})};
            return c;
          }};
}

OpEntry cast_entry() {
  return {"cast", "F32 -> F16 -> F32", [](OpRng& rng, int, const OpSizes& z) {
            const Shape s = random_shape(rng, 0, kMaxRank, z.pick(200, 2000), z.pick(kMaxExtent, 70));
            OpCase c;
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

// `e` marked as moving values without arithmetic: its F16/BF16 results are the F32 ones
// rounded, bit for bit (as are the backends', so backend_bits too).
OpEntry moves(OpEntry e) {
  e.backend_bits = {true, true};
  e.low_precision_exact = true;
  return e;
}

// `e` with the passes that must agree bit for bit between the backends.
OpEntry bits(OpEntry e, bool forward, bool backward) {
  e.backend_bits = {forward, backward};
  return e;
}

}  // namespace

// Bit-for-bit backend agreement follows the backend primitives' own tests: one rounding of
// one arithmetic op (binary, square, relu), data movement (views, permutes, narrow copies,
// gathers, the heads' split), casts, max pooling and dropout masks. The rest (libm against
// CUDA math, fused multiply-adds, sums in another order) agrees within a tolerance.
const std::vector<OpEntry>& op_entries() {
  static const std::vector<OpEntry> table = {
      bits(binary("add", ops::add, false), true, false),
      bits(binary("sub", ops::sub, false), true, false),
      bits(binary("mul", ops::mul, false), true, false),
      bits(binary("div", ops::div, true), true, false),
      scalar_op("add_scalar", false),
      scalar_op("mul_scalar", true),
      unary("neg", ops::neg, -1.f, 1.f),
      unary("exp", ops::exp, -2.f, 2.f),
      unary("log", ops::log, 0.5f, 2.f),
      unary("sqrt", ops::sqrt, 0.3f, 2.f),
      bits(unary("square", ops::square, -2.f, 2.f), true, false),
      bits(unary("relu", ops::relu, -1.f, 1.f, /*keep_off_zero=*/true), true, false),
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
      linear_entry(false),
      linear_entry(true),
      conv2d_entry(),
      bits(pool_entry(true), true, true),
      pool_entry(false),
      softmax_entry(false),
      softmax_entry(true),
      cross_entropy_entry(),
      mse_loss_entry(),
      layer_norm_entry(),
      batch_norm_entry(true),
      batch_norm_entry(false),
      bits(embedding_entry(), true, false),
      bits(dropout_entry("training, fixed generator seed", true, false), true, true),
      bits(dropout_entry("p = 0", true, true), true, true),
      bits(dropout_entry("eval", false, false), true, true),
      bits(dropout_entry("training, fixed generator seed", true, false, true), true, true),
      bits(dropout_entry("eval", false, false, true), true, true),
      moves(reshape_entry()),
      moves(flatten_entry()),
      moves(transpose_entry()),
      moves(permute_entry()),
      moves(concat_entry()),
      moves(split_entry()),
      moves(slice_entry()),
      moves(split_heads_entry()),
      attention_entry(false),
      attention_entry(true),
      bits(cast_entry(), true, true),
  };
  return table;
}

uint32_t op_seed(const OpEntry& entry) {
  uint32_t h = 2166136261u;
  for (const char* p : {entry.op, "/", entry.variant})
    for (; *p; ++p) h = (h ^ static_cast<uint8_t>(*p)) * 16777619u;
  return h;
}

std::string case_label(const OpEntry& entry, int draw, const OpCase& c) {
  std::ostringstream out;
  out << entry.op << " (" << entry.variant << ") draw " << draw << ": ";
  for (size_t i = 0; i < c.inputs.size(); ++i) out << (i ? ", " : "") << describe(c.inputs[i]);
  if (!c.params.empty()) out << " " << c.params;
  return out.str();
}

}  // namespace mixprec::op_table
