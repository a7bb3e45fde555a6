// build_gpt: nanoGPT's parameter names and count, its initialisation, a forward that matches
// a double-precision reimplementation of model.py's forward, causality, weight tying, input
// validation, and forward + backward under F16 and BF16.
#include <catch2/catch.hpp>
#include <cmath>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "core/autograd/grad_mode.h"
#include "core/autograd/node.h"
#include "core/generator.h"
#include "core/ops/ops.h"
#include "layer_test_util.h"
#include "layers/gpt.h"
#include "layers/model_builder.h"
#include "layers/transformer_block.h"

using namespace mixprec;
using namespace mixprec::layers_test;
using Catch::Contains;

namespace {

GptSpec tiny_spec(bool bias = true, bool tie = false) {
  GptSpec s;
  s.vocab_size = 11;
  s.block_size = 8;
  s.n_layer = 2;
  s.n_head = 2;
  s.n_embd = 8;
  s.dropout = 0.0;
  s.bias = bias;
  s.tie_weights = tie;
  return s;
}

std::shared_ptr<Module> build(const GptSpec& spec, uint64_t seed = 1) {
  Generator init(seed);
  return build_gpt(spec, init, std::make_shared<Generator>(seed + 100));
}

Tensor ids_tensor(const std::vector<int32_t>& ids, int64_t b, int64_t t) {
  return Tensor::from_ints(ids, {b, t});
}

std::vector<int32_t> random_ids(size_t n, int32_t vocab, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int32_t> dist(0, vocab - 1);
  std::vector<int32_t> out(n);
  for (int32_t& v : out) v = dist(rng);
  return out;
}

// Gives every parameter values far from its init (so that LayerNorm and bias terms matter),
// through load_state_dict; tied names get one value.
void randomise(Module& model, uint32_t seed) {
  const auto own = model.state_dict();
  std::map<std::string, Tensor> state;
  for (size_t i = 0; i < own.size(); ++i) {
    const auto& [name, t] = own[i];
    // A tied entry takes the value already drawn for the tensor's first name.
    size_t first = 0;
    while (!own[first].second.is_same(t)) ++first;
    state[name] =
        first < i ? state[own[first].first] : random_tensor(t.shape(), seed++, -0.5f, 0.5f);
  }
  model.load_state_dict(state);
}

// nanoGPT's GPT.forward in double, from the state dict.
Vec reference_forward(const Module& model, const GptSpec& s, const std::vector<int32_t>& ids,
                      int64_t b, int64_t t) {
  std::map<std::string, Vec> p;
  for (const auto& [name, tensor] : model.state_dict()) p[name] = to_double(tensor);
  auto get = [&](const std::string& name) -> const Vec& {
    static const Vec none;
    const auto it = p.find(name);
    return it == p.end() ? none : it->second;  // a missing bias is "no bias"
  };
  const int64_t c = s.n_embd, rows = b * t;
  Vec x(static_cast<size_t>(rows * c));
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t j = 0; j < c; ++j)
      x[r * c + j] = get("transformer.wte.weight")[ids[r] * c + j] +
                     get("transformer.wpe.weight")[(r % t) * c + j];
  for (int64_t l = 0; l < s.n_layer; ++l) {
    const std::string h = "transformer.h." + std::to_string(l) + ".";
    const Vec a = ref_layer_norm(x, c, get(h + "ln_1.weight"), get(h + "ln_1.bias"));
    const Vec qkv =
        ref_linear(a, rows, c, get(h + "attn.c_attn.weight"), get(h + "attn.c_attn.bias"), 3 * c);
    const Vec att = ref_linear(ref_causal_attention(qkv, b, t, c, s.n_head), rows, c,
                               get(h + "attn.c_proj.weight"), get(h + "attn.c_proj.bias"), c);
    for (size_t i = 0; i < x.size(); ++i) x[i] += att[i];
    Vec hidden = ref_linear(ref_layer_norm(x, c, get(h + "ln_2.weight"), get(h + "ln_2.bias")),
                            rows, c, get(h + "mlp.c_fc.weight"), get(h + "mlp.c_fc.bias"), 4 * c);
    for (double& v : hidden) v = ref_gelu(v);
    const Vec mlp = ref_linear(hidden, rows, 4 * c, get(h + "mlp.c_proj.weight"),
                               get(h + "mlp.c_proj.bias"), c);
    for (size_t i = 0; i < x.size(); ++i) x[i] += mlp[i];
  }
  x = ref_layer_norm(x, c, get("transformer.ln_f.weight"), get("transformer.ln_f.bias"));
  return ref_linear(x, rows, c, get("lm_head.weight"), {}, s.vocab_size);
}

Tensor lm_loss(const Tensor& logits, const std::vector<int32_t>& targets) {
  const int64_t v = logits.size(-1);
  return ops::cross_entropy(ops::reshape(logits, {-1, v}),
                            Tensor::from_ints(targets, {static_cast<int64_t>(targets.size())}));
}

// Two models of one spec and initialisation give the same logits on 2 x 8 ids drawn from
// `seed`, and, after a backward of the loss on targets drawn from seed + 1, the same
// gradient for every parameter.
void expect_same_logits_and_gradients(Module& a_model, Module& b_model, uint32_t seed) {
  const Tensor ids = ids_tensor(random_ids(16, 11, seed), 2, 8);
  const std::vector<int32_t> targets = random_ids(16, 11, seed + 1);
  const Tensor a = a_model(ids), b = b_model(ids);
  CHECK(same_values(a, b));
  lm_loss(a, targets).backward();
  lm_loss(b, targets).backward();
  const auto pa = a_model.named_parameters(), pb = b_model.named_parameters();
  REQUIRE(pa.size() == pb.size());
  for (size_t i = 0; i < pa.size(); ++i) {
    CAPTURE(pa[i].first);
    CHECK(same_values(pa[i].second.grad(), pb[i].second.grad()));
  }
}

}  // namespace

TEST_CASE("GPT's state dict has nanoGPT's keys in nanoGPT's order", "[layers][gpt]") {
  auto model = build(tiny_spec());
  const std::vector<std::string> nanogpt = {"transformer.wte.weight",
                                            "transformer.wpe.weight",
                                            "transformer.h.0.ln_1.weight",
                                            "transformer.h.0.ln_1.bias",
                                            "transformer.h.0.attn.c_attn.weight",
                                            "transformer.h.0.attn.c_attn.bias",
                                            "transformer.h.0.attn.c_proj.weight",
                                            "transformer.h.0.attn.c_proj.bias",
                                            "transformer.h.0.ln_2.weight",
                                            "transformer.h.0.ln_2.bias",
                                            "transformer.h.0.mlp.c_fc.weight",
                                            "transformer.h.0.mlp.c_fc.bias",
                                            "transformer.h.0.mlp.c_proj.weight",
                                            "transformer.h.0.mlp.c_proj.bias",
                                            "transformer.h.1.ln_1.weight",
                                            "transformer.h.1.ln_1.bias",
                                            "transformer.h.1.attn.c_attn.weight",
                                            "transformer.h.1.attn.c_attn.bias",
                                            "transformer.h.1.attn.c_proj.weight",
                                            "transformer.h.1.attn.c_proj.bias",
                                            "transformer.h.1.ln_2.weight",
                                            "transformer.h.1.ln_2.bias",
                                            "transformer.h.1.mlp.c_fc.weight",
                                            "transformer.h.1.mlp.c_fc.bias",
                                            "transformer.h.1.mlp.c_proj.weight",
                                            "transformer.h.1.mlp.c_proj.bias",
                                            "transformer.ln_f.weight",
                                            "transformer.ln_f.bias",
                                            "lm_head.weight"};
  const auto state = model->state_dict();
  CHECK(names_of(state) == nanogpt);
  std::map<std::string, Shape> shapes;
  for (const auto& [name, t] : state) shapes[name] = t.shape();
  CHECK(shapes["transformer.wte.weight"] == Shape{11, 8});
  CHECK(shapes["transformer.wpe.weight"] == Shape{8, 8});
  CHECK(shapes["transformer.h.1.attn.c_attn.weight"] == Shape{24, 8});
  CHECK(shapes["transformer.h.1.attn.c_attn.bias"] == Shape{24});
  CHECK(shapes["transformer.h.0.mlp.c_fc.weight"] == Shape{32, 8});
  CHECK(shapes["transformer.h.0.mlp.c_proj.weight"] == Shape{8, 32});
  CHECK(shapes["lm_head.weight"] == Shape{11, 8});
  for (const auto& [name, p] : model->named_parameters()) CHECK(p.name() == name);

  // Without bias, the bias entries go (nanoGPT's bias=False).
  auto nobias = build(tiny_spec(false));
  std::vector<std::string> expected;
  for (const std::string& name : nanogpt)
    if (name.size() < 5 || name.substr(name.size() - 5) != ".bias") expected.push_back(name);
  CHECK(names_of(nobias->state_dict()) == expected);
}

TEST_CASE("GPT's parameter count follows from its config", "[layers][gpt]") {
  const int64_t v = 11, t = 8, c = 8, l = 2;
  // Per block: ln_1, ln_2 (2C each with bias), c_attn 3C^2 + 3C, attn.c_proj C^2 + C,
  // c_fc 4C^2 + 4C, mlp.c_proj 4C^2 + C.
  const int64_t with_bias = v * c + t * c + l * (12 * c * c + 13 * c) + 2 * c + v * c;
  const int64_t without_bias = v * c + t * c + l * (12 * c * c + 2 * c) + c + v * c;
  CHECK(build(tiny_spec(true))->parameter_count() == with_bias);
  CHECK(build(tiny_spec(false))->parameter_count() == without_bias);
  CHECK(build(tiny_spec(true, true))->parameter_count() == with_bias - v * c);
}

TEST_CASE("GPT starts from nanoGPT's initialisation", "[layers][gpt]") {
  GptSpec spec;
  spec.vocab_size = 64;
  spec.block_size = 32;
  spec.n_layer = 3;
  spec.n_head = 4;
  spec.n_embd = 256;
  auto model = build(spec, 17);
  const double proj_std = 0.02 / std::sqrt(2.0 * 3.0);
  for (const auto& [name, p] : model->named_parameters()) {
    CAPTURE(name);
    const Tensor m = p.master();
    const bool is_bias = name.size() > 5 && name.substr(name.size() - 5) == ".bias";
    if (name.find(".ln_") != std::string::npos) {
      CHECK(max_abs_diff(m, Vec(static_cast<size_t>(m.numel()), is_bias ? 0.0 : 1.0)) == 0.0);
    } else if (is_bias) {
      CHECK(max_abs(m) == 0.0);
    } else {
      const MeanStd s = sample_stats(m);
      const bool proj = name.find("c_proj.weight") != std::string::npos;
      CHECK(std::fabs(s.mean) < 0.05 * (proj ? proj_std : 0.02));
      CHECK(s.std == Approx(proj ? proj_std : 0.02).epsilon(0.03));
    }
  }
}

TEST_CASE("GPT's forward matches a double reimplementation of nanoGPT's forward", "[layers][gpt]") {
  for (bool tie : {false, true}) {
    for (bool bias : {true, false}) {
      CAPTURE(tie, bias);
      const GptSpec spec = tiny_spec(bias, tie);
      auto model = build(spec, 3);
      randomise(*model, 50);
      const int64_t b = 2, t = 6;
      const std::vector<int32_t> ids = random_ids(b * t, 11, 9);
      const Tensor logits = (*model)(ids_tensor(ids, b, t));
      REQUIRE(logits.shape() == Shape{b, t, 11});
      CHECK(max_abs_diff(logits, reference_forward(*model, spec, ids, b, t)) < 2e-5);
      // A full block is accepted.
      CHECK((*model)(ids_tensor(random_ids(8, 11, 1), 1, 8)).shape() == Shape{1, 8, 11});
    }
  }
}

TEST_CASE("a GPT logit depends only on the tokens up to its position", "[layers][gpt]") {
  auto model = build(tiny_spec(), 4);
  randomise(*model, 70);
  const int64_t t = 7, changed = 3;
  std::vector<int32_t> ids = random_ids(t, 11, 5);
  const Tensor before = (*model)(ids_tensor(ids, 1, t));
  ids[changed] = (ids[changed] + 5) % 11;
  const Tensor after = (*model)(ids_tensor(ids, 1, t));
  const std::vector<float> x = before.to_float_vector(), y = after.to_float_vector();
  for (int64_t pos = 0; pos < t; ++pos) {
    CAPTURE(pos);
    double diff = 0.0;
    for (int64_t k = 0; k < 11; ++k)
      diff = std::max(diff, std::fabs(double(x[pos * 11 + k]) - y[pos * 11 + k]));
    if (pos < changed)
      CHECK(diff == 0.0);
    else
      CHECK(diff > 1e-4);
  }
}

TEST_CASE("tied GPT weights are one parameter under two names", "[layers][gpt]") {
  auto model = build(tiny_spec(true, true));
  auto* gpt = dynamic_cast<GPT*>(model.get());
  REQUIRE(gpt != nullptr);
  CHECK(gpt->lm_head()->weight().is_same(gpt->wte()->weight()));
  CHECK(gpt->lm_head()->weight().name() == "transformer.wte.weight");
  const auto state = model->state_dict();
  CHECK(state.front().first == "transformer.wte.weight");
  CHECK(state.back().first == "lm_head.weight");
  CHECK(state.back().second.is_same(state.front().second));
  for (const auto& [name, p] : model->named_parameters()) CHECK(name != "lm_head.weight");

  // The tied gradient is the sum of the embedding's and the head's: compare with an untied
  // model holding the same values.
  auto untied = build(tiny_spec(true, false));
  std::map<std::string, Tensor> values;
  for (const auto& [name, t] : model->state_dict()) values[name] = t.clone();
  untied->load_state_dict(values);
  const std::vector<int32_t> ids = random_ids(12, 11, 3), targets = random_ids(12, 11, 4);
  lm_loss((*model)(ids_tensor(ids, 2, 6)), targets).backward();
  lm_loss((*untied)(ids_tensor(ids, 2, 6)), targets).backward();
  Tensor g_wte, g_head;
  for (const auto& [name, p] : untied->named_parameters()) {
    if (name == "transformer.wte.weight") g_wte = p.grad();
    if (name == "lm_head.weight") g_head = p.grad();
  }
  REQUIRE(g_wte.defined());
  REQUIRE(g_head.defined());
  CHECK(max_abs_diff(gpt->wte()->weight().grad(), ops::add(g_wte, g_head)) < 1e-6);
}

TEST_CASE("GPT rejects bad configs and bad token ids with clear messages", "[layers][gpt]") {
  GptSpec spec = tiny_spec();
  spec.vocab_size = 0;
  CHECK_THROWS_WITH(build(spec), Contains("vocab_size must be >= 1, got 0"));
  spec = tiny_spec();
  spec.n_embd = 10;
  spec.n_head = 3;
  CHECK_THROWS_WITH(build(spec), Contains("n_embd (10) must be divisible by n_head (3)"));
  spec = tiny_spec();
  spec.n_layer = 0;
  CHECK_THROWS_WITH(build(spec), Contains("n_layer"));
  spec = tiny_spec();
  spec.block_size = 0;
  CHECK_THROWS_WITH(build(spec), Contains("block_size"));
  spec = tiny_spec();
  spec.dropout = 1.0;
  CHECK_THROWS_WITH(build(spec), Contains("dropout"));

  auto model = build(tiny_spec());
  CHECK_THROWS_WITH((*model)(ids_tensor(std::vector<int32_t>(9, 1), 1, 9)),
                    Contains("9 tokens is longer than block_size = 8"));
  CHECK_THROWS_WITH((*model)(ids_tensor({1, 2, 11}, 1, 3)),
                    Contains("token ids must be in [0, vocab_size = 11)") && Contains("holds 11"));
  CHECK_THROWS_WITH((*model)(ids_tensor({1, -1}, 1, 2)), Contains("vocab_size = 11"));
  CHECK_THROWS_WITH((*model)(Tensor::zeros({1, 3})), Contains("expects token ids I32 [B, T]"));
  CHECK_THROWS_WITH((*model)(Tensor::from_ints({1, 2, 3}, {3})), Contains("I32 [B, T]"));
}

TEST_CASE("GPT dropout draws from the caller's generator in training only", "[layers][gpt]") {
  GptSpec spec = tiny_spec();
  spec.dropout = 0.2;
  Generator init(6);
  auto gen = std::make_shared<Generator>(8);
  auto model = build_gpt(spec, init, gen);
  const Tensor ids = ids_tensor(random_ids(12, 11, 2), 2, 6);
  const Tensor a = (*model)(ids), b = (*model)(ids);
  CHECK(max_abs_diff(a, b) > 0.0);
  model->eval();
  const uint64_t offset = gen->offset();
  CHECK(same_values((*model)(ids), (*model)(ids)));
  CHECK(gen->offset() == offset);
  Generator again(6);
  CHECK_THROWS_WITH(build_gpt(spec, again, nullptr), Contains("generator"));
}

TEST_CASE("GPT runs forward and backward in F32, F16 and BF16 with F32 parameter gradients",
          "[layers][gpt][amp]") {
  for (DType dtype : {DType::F32, DType::F16, DType::BF16}) {
    for (bool tie : {false, true}) {
      CAPTURE(dtype, tie);
      auto model = build(tiny_spec(true, tie), 12);
      for (Parameter p : model->parameters()) p.set_working_dtype(dtype);
      const std::vector<int32_t> ids = random_ids(16, 11, 13);
      const Tensor logits = (*model)(ids_tensor(ids, 2, 8));
      CHECK(logits.dtype() == dtype);
      CHECK(all_finite(logits));
      lm_loss(logits, random_ids(16, 11, 14)).backward();
      check_all_grads(*model);
    }
  }
}

TEST_CASE("GPT's fused c_fc + gelu gives the unfused model's FP32 logits and gradients",
          "[layers][gpt][epilogue]") {
  Generator init(3);
  const auto gen = std::make_shared<Generator>(4);
  for (bool bias : {true, false}) {
    CAPTURE(bias);
    CHECK_THAT(Mlp(8, bias, 0.0, gen, init, kCPU, true).c_fc()->describe(),
               Contains("+ GELU (fused)"));
    CHECK_THAT(Mlp(8, bias, 0.0, gen, init, kCPU, false).c_fc()->describe(), !Contains("fused"));

    GptSpec unfused_spec = tiny_spec(bias);
    unfused_spec.fuse_linear_gelu = false;
    auto fused = build(tiny_spec(bias), 21);
    auto unfused = build(unfused_spec, 21);
    // The built models' first MLP: fused as the spec says.
    const auto c_fc_of = [](const std::shared_ptr<Module>& model) {
      const auto& gpt = dynamic_cast<const GPT&>(*model);
      return std::dynamic_pointer_cast<Block>(gpt.blocks()->named_children().front().second)
          ->mlp()
          ->c_fc()
          ->describe();
    };
    CHECK_THAT(c_fc_of(fused), Contains("+ GELU (fused)"));
    CHECK_THAT(c_fc_of(unfused), !Contains("fused"));
    expect_same_logits_and_gradients(*fused, *unfused, 22);
  }
}

TEST_CASE("a GPT block's residual adds in the dropouts' pass give the separate ops' bits",
          "[layers][gpt][dropout]") {
  for (DType dtype : {DType::F32, DType::F16}) {
    CAPTURE(dtype);
    GptSpec spec = tiny_spec();
    spec.dropout = 0.3;
    auto fused = build(spec, 31), separate = build(spec, 31);
    for (auto* model : {&fused, &separate})
      for (Parameter p : (*model)->parameters()) p.set_working_dtype(dtype);
    // A hook on a branch keeps its output a tensor of its own: the block then adds it
    // separately, after the branch's own dropout.
    const auto& gpt = dynamic_cast<const GPT&>(*separate);
    for (const auto& [name, child] : gpt.blocks()->named_children()) {
      const auto block = std::dynamic_pointer_cast<Block>(child);
      block->attn()->set_forward_hook([](const Tensor& out) { return out; });
      block->mlp()->set_forward_hook([](const Tensor& out) { return out; });
    }
    // What each first block ends with: the fused op, or the add after the dropout.
    const auto first_block = [](const std::shared_ptr<Module>& model) {
      const auto& g = dynamic_cast<const GPT&>(*model);
      return std::dynamic_pointer_cast<Block>(g.blocks()->named_children().front().second);
    };
    const Tensor x = Tensor::ones({2, 8, 8}, dtype).set_requires_grad(true);
    CHECK((*first_block(fused))(x).grad_fn()->name() == "dropout_add");
    CHECK((*first_block(separate))(x).grad_fn()->name() == "add");

    expect_same_logits_and_gradients(*fused, *separate, 32);

    // A hook on a branch's dropout itself: the dropout's output exists and is seen, and the
    // block adds it separately, with the same bits again.
    auto watched = build(spec, 31), plain = build(spec, 31);
    for (auto* model : {&watched, &plain})
      for (Parameter p : (*model)->parameters()) p.set_working_dtype(dtype);
    int seen = 0;
    for (const auto& [name, child] : dynamic_cast<const GPT&>(*watched).blocks()->named_children()) {
      const auto block = std::dynamic_pointer_cast<Block>(child);
      for (const auto& branch : {block->attn()->named_children(), block->mlp()->named_children()})
        for (const auto& [child_name, module] : branch)
          if (child_name == "resid_dropout" || child_name == "dropout")
            module->set_forward_hook([&seen](const Tensor& out) {
              ++seen;
              return out;
            });
    }
    // Both models draw the same masks: each runs its first block once first.
    CHECK((*first_block(watched))(x).grad_fn()->name() == "add");
    CHECK((*first_block(plain))(x).grad_fn()->name() == "dropout_add");
    expect_same_logits_and_gradients(*watched, *plain, 34);
    CHECK(seen == 2 + 2 * 2);  // the first block's two dropouts, then all four in the GPT
  }
}

namespace {

// The logits [B, V] of position `pos` in full-sequence logits [B, T, V].
std::vector<float> logits_at(const Tensor& logits, int64_t pos) {
  const int64_t b = logits.size(0), t = logits.size(1), v = logits.size(2);
  const std::vector<float> all = logits.to(DType::F32).to_float_vector();
  std::vector<float> out;
  for (int64_t i = 0; i < b; ++i)
    for (int64_t k = 0; k < v; ++k) out.push_back(all[(i * t + pos) * v + k]);
  return out;
}

// Reads ids [B, T] into a fresh cache: the first `prompt` positions in one call, then one
// position per call. Returns the largest |cached - full| over every position from prompt - 1
// on, relative to the largest |full logit|.
double cached_against_full(GPT& gpt, const std::vector<int32_t>& ids, int64_t b, int64_t t,
                           int64_t prompt) {
  NoGradGuard no_grad;
  const Tensor full = gpt(ids_tensor(ids, b, t));
  KvCache cache;
  double worst = 0.0, largest = 0.0;
  for (int64_t pos = prompt - 1; pos < t; ++pos) {
    const int64_t start = pos == prompt - 1 ? 0 : pos;
    std::vector<int32_t> chunk;
    for (int64_t i = 0; i < b; ++i)
      for (int64_t j = start; j <= pos; ++j) chunk.push_back(ids[i * t + j]);
    const Tensor got = gpt.forward_cached(ids_tensor(chunk, b, pos + 1 - start), cache);
    REQUIRE(got.shape() == Shape{b, 11});
    CHECK(cache.length == pos + 1);
    const std::vector<float> want = logits_at(full, pos), have = got.to(DType::F32).to_float_vector();
    for (size_t k = 0; k < want.size(); ++k) {
      worst = std::max(worst, std::fabs(double(want[k]) - have[k]));
      largest = std::max(largest, std::fabs(double(want[k])));
    }
  }
  return worst / largest;
}

}  // namespace

TEST_CASE("GPT's cached decoding gives the full forward's logits at every position",
          "[layers][gpt]") {
  for (bool tie : {false, true}) {
    for (bool bias : {true, false}) {
      for (int64_t prompt : {1, 3, 8}) {
        CAPTURE(tie, bias, prompt);
        auto model = build(tiny_spec(bias, tie), 21);
        randomise(*model, 80);
        model->eval();
        const std::vector<int32_t> ids = random_ids(16, 11, 22);
        // FP32 rounding: the cached path sums the same products in another order.
        CHECK(cached_against_full(static_cast<GPT&>(*model), ids, 2, 8, prompt) < 1e-5);
      }
    }
  }
}

TEST_CASE("GPT's cached decoding in F16 and BF16 stays within the format's rounding",
          "[layers][gpt][amp]") {
  for (DType dtype : {DType::F16, DType::BF16}) {
    CAPTURE(dtype);
    auto model = build(tiny_spec(), 23);
    randomise(*model, 90);
    model->eval();
    for (Parameter p : model->parameters()) p.set_working_dtype(dtype);
    const std::vector<int32_t> ids = random_ids(8, 11, 24);
    // Both paths round every activation to the format; they differ where a sum's order moves
    // a rounding, a few units of the format's last place at most after two layers.
    const double unit = dtype == DType::F16 ? 1.0 / 1024 : 1.0 / 128;
    CHECK(cached_against_full(static_cast<GPT&>(*model), ids, 1, 8, 2) < 8 * unit);
  }
}

TEST_CASE("GPT's cache refuses a position past block_size and two new positions at once",
          "[layers][gpt]") {
  auto model = build(tiny_spec(), 25);
  model->eval();
  GPT& gpt = static_cast<GPT&>(*model);
  NoGradGuard no_grad;
  KvCache cache;
  gpt.forward_cached(ids_tensor(random_ids(6, 11, 26), 1, 6), cache);
  CHECK_THROWS_WITH(gpt.forward_cached(ids_tensor({1, 2}, 1, 2), cache),
                    Contains("one new position at a time, got 2"));
  gpt.forward_cached(ids_tensor({1}, 1, 1), cache);
  gpt.forward_cached(ids_tensor({2}, 1, 1), cache);
  CHECK(cache.length == 8);
  CHECK_THROWS_WITH(gpt.forward_cached(ids_tensor({3}, 1, 1), cache),
                    Contains("a sequence of 9 tokens is longer than block_size = 8"));
  CHECK(cache.length == 8);
}
