// Optimizer::state_dict / load_state_dict: contents, exact resumption, and the strong
// guarantee of a failed load.
#include <catch2/catch.hpp>
#include <cstdint>
#include <cstring>
#include <functional>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "core/error.h"
#include "core/tensor.h"
#include "layers/parameter.h"
#include "optim/adam.h"
#include "optim/sgd.h"
#include "tests/optim/optim_test_util.h"

using namespace mixprec;

using namespace mixprec_test;

namespace {

// "fc.weight" [4, 3], "fc.bias" [3], "head" [5] (F16 working copies).
std::vector<Parameter> make_params(uint32_t seed) {
  std::vector<Parameter> params = {
      Parameter("fc.weight", Tensor::from_vector(random_values(12, seed), {4, 3})),
      Parameter("fc.bias", Tensor::from_vector(random_values(3, seed + 1), {3})),
      Parameter("head", Tensor::from_vector(random_values(5, seed + 2), {5}))};
  for (Parameter& p : params) p.set_working_dtype(DType::F16);
  return params;
}

// Same names, values and working dtypes, separate storage.
std::vector<Parameter> clone_params(const std::vector<Parameter>& params) {
  std::vector<Parameter> out;
  for (const Parameter& p : params) {
    out.emplace_back(p.name(), p.master().clone());
    out.back().set_working_dtype(p.working_dtype());
  }
  return out;
}

// Gradients of step `step`: "head" has none before step 3, "fc.bias" none in step 1.
void set_grads(const std::vector<Parameter>& params, int step, uint32_t seed) {
  for (size_t i = 0; i < params.size(); ++i) {
    Parameter p = params[i];
    const bool has_grad = !(i == 2 && step < 3) && !(i == 1 && step == 1);
    if (!has_grad) {
      p.zero_grad();
      continue;
    }
    p.working().set_grad(Tensor::from_vector(
        random_values(static_cast<size_t>(p.numel()), seed + 10 * static_cast<uint32_t>(step) +
                                                           static_cast<uint32_t>(i)),
        p.shape()));
  }
}

void train(Optimizer& opt, int from_step, int to_step, uint32_t seed) {
  for (int step = from_step; step < to_step; ++step) {
    set_grads(opt.params(), step, seed);
    opt.step();
  }
}

const Tensor* find(const OptimizerState& state, const std::string& key) {
  for (const auto& entry : state.tensors) {
    if (entry.first == key) return &entry.second;
  }
  return nullptr;
}

Tensor* find(OptimizerState& state, const std::string& key) {
  for (auto& entry : state.tensors) {
    if (entry.first == key) return &entry.second;
  }
  return nullptr;
}

void erase(OptimizerState& state, const std::string& key) {
  for (auto it = state.tensors.begin(); it != state.tensors.end(); ++it) {
    if (it->first == key) {
      state.tensors.erase(it);
      return;
    }
  }
  FAIL("no tensor " << key);
}

// Everything a load may write, by value.
struct Snapshot {
  int64_t steps_taken;
  double lr;
  std::vector<int64_t> param_steps;
  std::vector<std::vector<uint8_t>> buffers;  // empty when undefined

  static std::vector<uint8_t> bytes(const Tensor& t) {
    return t.defined() ? raw_bytes(t) : std::vector<uint8_t>{};
  }
  static Snapshot of(const Adam& opt) {
    Snapshot s{opt.steps_taken(), opt.lr(), {}, {}};
    for (size_t i = 0; i < opt.params().size(); ++i) {
      s.param_steps.push_back(opt.param_steps(i));
      s.buffers.push_back(bytes(opt.exp_avg(i)));
      s.buffers.push_back(bytes(opt.exp_avg_sq(i)));
    }
    return s;
  }
  static Snapshot of(const SGD& opt) {
    Snapshot s{opt.steps_taken(), opt.lr(), {}, {}};
    for (size_t i = 0; i < opt.params().size(); ++i) {
      s.buffers.push_back(bytes(opt.momentum_buffer(i)));
    }
    return s;
  }
  bool operator==(const Snapshot&) const = default;
};

}  // namespace

TEST_CASE("state_dict holds the scalars and CPU copies of the buffers", "[optim_state]") {
  std::vector<Parameter> params = make_params(1);
  AdamOptions o;
  o.lr = 0.01;
  AdamW opt(params, o, "main");
  train(opt, 0, 3, 50);
  opt.set_lr(0.004);
  const OptimizerState state = opt.state_dict();

  const nlohmann::json& s = state.scalars;
  CHECK(s.at("type") == "adamw");
  CHECK(s.at("name") == "main");
  CHECK(s.at("steps_taken") == 3);
  CHECK(s.at("lr") == 0.004);
  CHECK(s.at("params") == nlohmann::json({"fc.weight", "fc.bias", "head"}));
  // fc.bias had no gradient in step 1, head none at all.
  CHECK(s.at("param_steps") == nlohmann::json({3, 2, 0}));

  std::vector<std::string> keys;
  for (const auto& entry : state.tensors) keys.push_back(entry.first);
  CHECK(keys == std::vector<std::string>{"exp_avg.0", "exp_avg_sq.0", "exp_avg.1",
                                         "exp_avg_sq.1"});
  for (const auto& [key, t] : state.tensors) {
    CAPTURE(key);
    CHECK(t.device() == kCPU);
    CHECK(t.dtype() == DType::F32);
  }
  // Copies: equal now, unaffected by later steps.
  const std::vector<uint8_t> saved = raw_bytes(*find(state, "exp_avg_sq.1"));
  CHECK(saved == raw_bytes(opt.exp_avg_sq(1)));
  CHECK(!find(state, "exp_avg_sq.1")->is_same(opt.exp_avg_sq(1)));
  train(opt, 3, 4, 50);
  CHECK(raw_bytes(*find(state, "exp_avg_sq.1")) == saved);
  CHECK(raw_bytes(opt.exp_avg_sq(1)) != saved);

  SGD plain(params, {0.1});
  train(plain, 0, 1, 50);
  const OptimizerState plain_state = plain.state_dict();
  CHECK(plain_state.scalars.at("type") == "sgd");
  CHECK(plain_state.scalars.at("steps_taken") == 1);
  CHECK(plain_state.tensors.empty());
}

TEST_CASE("a loaded optimizer continues bit-identically", "[optim_state]") {
  struct Case {
    const char* label;
    std::function<std::unique_ptr<Optimizer>(std::vector<Parameter>)> make;
  };
  const Case cases[] = {
      {"sgd", [](std::vector<Parameter> p) {
         return std::make_unique<SGD>(std::move(p), SgdOptions{0.05, 0.9, 0.1, 0.01, false});
       }},
      {"sgd nesterov", [](std::vector<Parameter> p) {
         return std::make_unique<SGD>(std::move(p), SgdOptions{0.05, 0.8, 0.0, 0.0, true});
       }},
      {"adam", [](std::vector<Parameter> p) {
         return std::make_unique<Adam>(std::move(p), AdamOptions{0.01, 0.9, 0.99, 1e-8, 0.1, {}});
       }},
      {"adamw", [](std::vector<Parameter> p) {
         return std::make_unique<AdamW>(std::move(p), AdamOptions{0.01, 0.8, 0.95, 1e-6, 0.1, {}});
       }},
  };
  for (const Case& c : cases) {
    CAPTURE(c.label);
    std::vector<Parameter> pa = make_params(7);
    std::unique_ptr<Optimizer> a = c.make(pa);
    train(*a, 0, 3, 300);
    a->set_lr(0.02);  // as a schedule would; B must take it from the state
    OptimizerState state = a->state_dict();
    // Through text, as a checkpoint stores the scalars.
    state.scalars = nlohmann::json::parse(state.scalars.dump());

    std::vector<Parameter> pb = clone_params(pa);
    std::unique_ptr<Optimizer> b = c.make(pb);
    b->load_state_dict(state);
    CHECK(b->steps_taken() == 3);
    CHECK(b->lr() == 0.02);
    // The loaded buffers are the optimizer's own: changing the state later changes nothing.
    for (auto& entry : state.tensors) entry.second.fill_(123.0);

    // Steps 3 and 4: "head" gets its first gradient in step 3, so both fresh and restored
    // buffers are exercised.
    train(*a, 3, 5, 300);
    train(*b, 3, 5, 300);
    for (size_t i = 0; i < pa.size(); ++i) {
      CAPTURE(pa[i].name());
      CHECK(raw_bytes(pb[i].master()) == raw_bytes(pa[i].master()));
      CHECK(raw_bytes(pb[i].working()) == raw_bytes(pa[i].working()));
    }
    CHECK(b->steps_taken() == 5);
    if (auto* adam_a = dynamic_cast<Adam*>(a.get())) {
      auto* adam_b = dynamic_cast<Adam*>(b.get());
      REQUIRE(adam_b);
      for (size_t i = 0; i < pa.size(); ++i) {
        CHECK(adam_b->param_steps(i) == adam_a->param_steps(i));
        CHECK(raw_bytes(adam_b->exp_avg_sq(i)) == raw_bytes(adam_a->exp_avg_sq(i)));
      }
    }
  }
}

TEST_CASE("a failed Adam state load leaves the optimizer unchanged", "[optim_state]") {
  // The optimizer under test, and a valid state from a different run over the same parameter
  // names: loading `good` would change every buffer, steps_taken and lr, so a load that
  // wrote anything before failing would show.
  std::vector<Parameter> params = make_params(3);
  AdamOptions options;
  options.lr = 0.01;
  Adam opt(params, options);
  train(opt, 0, 3, 500);
  AdamOptions other_options;
  other_options.lr = 0.05;
  Adam other(make_params(4), other_options);
  train(other, 0, 4, 900);
  const OptimizerState good = other.state_dict();
  const Snapshot before = Snapshot::of(opt);

  using Catch::Contains;
  auto expect_failure = [&](const char* label, const std::function<void(OptimizerState&)>& corrupt,
                            const std::string& expected) {
    CAPTURE(label);
    OptimizerState state = good;
    corrupt(state);
    CHECK_THROWS_AS(opt.load_state_dict(state), Error);
    CHECK_THROWS_WITH(opt.load_state_dict(state), Contains(expected));
    CHECK(Snapshot::of(opt) == before);
  };

  // A corruption that adds a zero tensor under `key`.
  auto append = [](const std::string& key, const Shape& shape) {
    return [key, shape](OptimizerState& s) { s.tensors.emplace_back(key, Tensor::zeros(shape)); };
  };

  expect_failure("type", [](OptimizerState& s) { s.scalars["type"] = "sgd"; },
                 "optimizer state is for 'sgd', this optimizer is 'adam'");
  expect_failure("adamw", [](OptimizerState& s) { s.scalars["type"] = "adamw"; },
                 "is for 'adamw'");
  expect_failure("no type", [](OptimizerState& s) { s.scalars.erase("type"); }, "type");
  expect_failure("scalars", [](OptimizerState& s) { s.scalars = nlohmann::json::array(); },
                 "object");
  expect_failure("no steps_taken", [](OptimizerState& s) { s.scalars.erase("steps_taken"); },
                 "steps_taken");
  expect_failure("negative steps_taken", [](OptimizerState& s) { s.scalars["steps_taken"] = -1; },
                 "steps_taken");
  expect_failure("no lr", [](OptimizerState& s) { s.scalars.erase("lr"); }, "lr");
  expect_failure("negative lr", [](OptimizerState& s) { s.scalars["lr"] = -0.5; }, "-0.5");
  expect_failure("fewer params",
                 [](OptimizerState& s) { s.scalars["params"].erase(2); },
                 "holds 2 parameters, this optimizer has 3");
  expect_failure("other names",
                 [](OptimizerState& s) { s.scalars["params"][2] = "tail"; },
                 "parameter 2 is \"tail\" in the optimizer state but 'head' here");
  expect_failure("other order",
                 [](OptimizerState& s) {
                   std::swap(s.scalars["params"][0], s.scalars["params"][1]);
                 },
                 "parameter 0 is \"fc.bias\"");
  expect_failure("shape",
                 [](OptimizerState& s) { *find(s, "exp_avg_sq.0") = Tensor::zeros({3}); },
                 "exp_avg_sq.0 has shape [3] but parameter 'fc.weight' has [4, 3]");
  expect_failure("dtype",
                 [](OptimizerState& s) {
                   Tensor* t = find(s, "exp_avg_sq.2");
                   *t = t->to(DType::F16);
                 },
                 "exp_avg_sq.2 is F16");
  expect_failure("undefined", [](OptimizerState& s) { *find(s, "exp_avg.2") = Tensor(); },
                 "exp_avg.2 is undefined");
  expect_failure("missing buffer", [](OptimizerState& s) { erase(s, "exp_avg_sq.2"); },
                 "lacks exp_avg_sq.2");
  expect_failure("index out of range",
                 append("exp_avg.3", {5}),
                 "exp_avg.3");
  expect_failure("not <buffer>.<index>",
                 append("exp_avg", {5}),
                 "'exp_avg' is not named");
  expect_failure("leading zero",
                 append("exp_avg.02", {5}),
                 "'exp_avg.02'");
  expect_failure("twice",
                 [](OptimizerState& s) { s.tensors.push_back(s.tensors.front()); }, "twice");
  expect_failure("unknown buffer",
                 append("momentum.1", {3}),
                 "'momentum.1' is not a buffer of adam");
  expect_failure("no param_steps", [](OptimizerState& s) { s.scalars.erase("param_steps"); },
                 "param_steps");
  expect_failure("short param_steps",
                 [](OptimizerState& s) { s.scalars["param_steps"] = {4, 4}; }, "param_steps");
  expect_failure("param_steps beyond steps_taken",
                 [](OptimizerState& s) { s.scalars["param_steps"][2] = 5; }, "param_steps[2]");
  expect_failure("buffers of a parameter never updated",
                 [](OptimizerState& s) {
                   s.scalars["param_steps"][2] = 0;
                 },
                 "holds exp_avg.2 but param_steps[2] is 0");

  // The unchanged optimizer still loads the good state afterwards.
  opt.load_state_dict(good);
  CHECK(opt.steps_taken() == 4);
  CHECK(opt.lr() == 0.05);
  CHECK(raw_bytes(opt.exp_avg(2)) == raw_bytes(other.exp_avg(2)));
  CHECK(opt.exp_avg(2).device() == kCPU);
  CHECK(!(Snapshot::of(opt) == before));
}

TEST_CASE("a failed SGD state load leaves the optimizer unchanged", "[optim_state]") {
  std::vector<Parameter> params = make_params(5);
  SGD opt(params, {0.1, 0.9});
  train(opt, 0, 3, 700);
  SGD other(make_params(6), {0.2, 0.5});
  train(other, 0, 5, 800);
  const OptimizerState good = other.state_dict();
  const Snapshot before = Snapshot::of(opt);
  REQUIRE(find(good, "momentum.1"));

  auto expect_failure = [&](SGD& target, const OptimizerState& state,
                            const std::string& expected) {
    const Snapshot snapshot = Snapshot::of(target);
    CHECK_THROWS_WITH(target.load_state_dict(state), Catch::Contains(expected));
    CHECK(Snapshot::of(target) == snapshot);
  };

  Adam adam(make_params(6), {});
  train(adam, 0, 2, 800);
  expect_failure(opt, adam.state_dict(),
                 "optimizer state is for 'adam', this optimizer is 'sgd'");

  OptimizerState bad = good;
  *find(bad, "momentum.1") = Tensor::zeros({1, 3});
  expect_failure(opt, bad, "momentum.1 has shape [1, 3] but parameter 'fc.bias' has [3]");

  bad = good;
  bad.tensors.emplace_back("exp_avg.0", Tensor::zeros({4, 3}));
  expect_failure(opt, bad, "'exp_avg.0' is not a buffer of sgd");

  // Momentum buffers cannot go into an SGD without momentum: they would be ignored.
  SGD plain(params, {0.1});
  expect_failure(plain, good, "momentum 0");
  CHECK(Snapshot::of(opt) == before);

  opt.load_state_dict(good);
  CHECK(opt.steps_taken() == 5);
  CHECK(opt.lr() == 0.2);
  CHECK(raw_bytes(opt.momentum_buffer(1)) == raw_bytes(other.momentum_buffer(1)));
}
