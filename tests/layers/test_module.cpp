// Module: torch's naming and ordering of parameters, buffers and state-dict entries, tied
// weights, load_state_dict (strict and not), train/eval propagation and assign_names.
#include <catch2/catch.hpp>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "core/autograd/grad_mode.h"
#include "core/autograd/node.h"
#include "core/ops/ops.h"
#include "layer_test_util.h"
#include "layers/module.h"

using namespace mixprec;
using namespace mixprec::layers_test;
using Catch::Contains;

namespace {

// weight [2, 3], bias [2], buffer stat [2].
class Leaf : public Module {
 public:
  Leaf() {
    weight = register_parameter("weight", Tensor::from_vector({1, 2, 3, 4, 5, 6}, {2, 3}));
    bias = register_parameter("bias", Tensor::from_vector({0.5f, -0.5f}, {2}));
    stat = &register_buffer("stat", Tensor::zeros({2}));
  }
  Tensor forward(const Tensor& x) override {
    return ops::linear(x, weight.working(), bias.working());
  }
  std::string describe() const override { return "Leaf"; }
  Parameter weight, bias;
  Tensor* stat;
};

// child c (a Leaf), then an I32 buffer `count`.
class Inner : public Module {
 public:
  Inner() {
    c = register_module("c", std::make_shared<Leaf>());
    count = &register_buffer("count", Tensor::zeros({}, DType::I32));
  }
  Tensor forward(const Tensor& x) override { return c->forward(x); }
  std::string describe() const override { return "Inner"; }
  std::shared_ptr<Leaf> c;
  Tensor* count;
};

// Registration order deliberately mixes children and parameters: child a, parameter scale,
// child b. torch lists a module's own parameters before its children whatever the order.
class Tree : public Module {
 public:
  Tree() {
    a = register_module("a", std::make_shared<Leaf>());
    scale = register_parameter("scale", Tensor::ones({1}));
    b = register_module("b", std::make_shared<Inner>());
  }
  Tensor forward(const Tensor& x) override { return b->forward(a->forward(x)); }
  std::string describe() const override { return "Tree"; }
  std::shared_ptr<Leaf> a;
  std::shared_ptr<Inner> b;
  Parameter scale;
};

class SharedWeight : public Module {
 public:
  explicit SharedWeight(const Parameter& w) { register_shared_parameter("weight", w); }
  Tensor forward(const Tensor& x) override { return x; }
  std::string describe() const override { return "SharedWeight"; }
};

// emb (a Leaf) and head, whose `weight` is emb's.
class Tied : public Module {
 public:
  Tied() {
    emb = register_module("emb", std::make_shared<Leaf>());
    head = register_module("head", std::make_shared<SharedWeight>(emb->weight));
  }
  Tensor forward(const Tensor& x) override { return x; }
  std::string describe() const override { return "Tied"; }
  std::shared_ptr<Leaf> emb;
  std::shared_ptr<SharedWeight> head;
};

// Exposes registration for the error tests.
class Open : public Module {
 public:
  Tensor forward(const Tensor& x) override { return x; }
  std::string describe() const override { return "Open"; }
  using Module::register_buffer;
  using Module::register_module;
  using Module::register_parameter;
  using Module::register_shared_parameter;
};

std::map<std::string, Tensor> clone_state(const Module& m) {
  std::map<std::string, Tensor> out;
  for (const auto& [name, t] : m.state_dict()) out[name] = t.clone();
  return out;
}

std::vector<std::string> param_names(const Module& m) {
  std::vector<std::string> out;
  for (const auto& [name, p] : m.named_parameters()) out.push_back(name);
  return out;
}

}  // namespace

TEST_CASE("state_dict lists own parameters, own buffers, then children, as torch",
          "[layers][module]") {
  Tree tree;
  const std::vector<std::string> expected = {"scale",   "a.weight",   "a.bias",   "a.stat",
                                             "b.count", "b.c.weight", "b.c.bias", "b.c.stat"};
  const auto state = tree.state_dict();
  CHECK(names_of(state) == expected);
  // Entries are the masters and the buffers themselves, not copies.
  CHECK(state[0].second.is_same(tree.scale.master()));
  CHECK(state[1].second.is_same(tree.a->weight.master()));
  CHECK(state[3].second.is_same(*tree.a->stat));
  CHECK(state[4].second.is_same(*tree.b->count));
  CHECK(state[4].second.dtype() == DType::I32);

  CHECK(param_names(tree) ==
        std::vector<std::string>{"scale", "a.weight", "a.bias", "b.c.weight", "b.c.bias"});
  CHECK(names_of(tree.named_buffers()) ==
        std::vector<std::string>{"a.stat", "b.count", "b.c.stat"});
  const auto children = tree.named_children();
  REQUIRE(children.size() == 2);
  CHECK(children[0].first == "a");
  CHECK(children[0].second.get() == tree.a.get());
  CHECK(children[1].first == "b");
  CHECK(tree.parameters().size() == 5);
  CHECK(tree.parameter_count() == 1 + 6 + 2 + 6 + 2);
}

TEST_CASE("assign_names gives every parameter its dotted name", "[layers][module]") {
  Tree tree;
  CHECK(tree.a->weight.name() == "weight");  // its local name until the root names it
  tree.assign_names();
  for (const auto& [name, p] : tree.named_parameters()) {
    CHECK(p.name() == name);
    CHECK(p.master().name() == name);
  }
  CHECK(tree.b->c->weight.name() == "b.c.weight");
  CHECK(tree.b->count->name() == "b.count");

  tree.assign_names("model");
  CHECK(tree.scale.name() == "model.scale");
  CHECK(tree.b->c->bias.name() == "model.b.c.bias");

  // Under F16 the working copy is renamed too.
  tree.a->weight.set_working_dtype(DType::F16);
  tree.assign_names();
  CHECK(tree.a->weight.working().name() == "a.weight");
  CHECK_THROWS_WITH(tree.a->weight.set_name(""), Contains("non-empty"));
}

TEST_CASE("a module called by operator() names its ops with its path", "[layers][module]") {
  Tree tree;
  CHECK(tree.b->c->path().empty());  // no path until the root names the tree
  tree.assign_names();
  CHECK(tree.path().empty());
  CHECK(tree.a->path() == "a");
  CHECK(tree.b->c->path() == "b.c");

  Tensor x = Tensor::from_vector({1, 1, 1}, {1, 3});
  x.set_requires_grad(true);
  // A grandchild called directly (as GPT::forward calls its blocks) still carries its whole
  // path; ops outside every module carry none, and the scope ends with the call.
  const Tensor y = (*tree.b->c)(x);
  REQUIRE(y.grad_fn() != nullptr);
  CHECK(y.grad_fn()->layer == "b.c");
  CHECK(ops::mul(y, y).grad_fn()->layer.empty());
  CHECK((*tree.a)(x).grad_fn()->layer == "a");

  // Anomaly mode names the layer whose output overflowed.
  tree.b->c->weight.master().fill_(3e38);
  tree.b->c->weight.refresh_working();
  AnomalyModeGuard anomaly;
  CHECK_THROWS_WITH((*tree.b->c)(x), Contains("in layer 'b.c'") && Contains("Inf or NaN"));
}

TEST_CASE("tied parameters appear once in parameters() and under both names in state_dict",
          "[layers][module]") {
  Tied tied;
  tied.assign_names();
  const auto params = tied.named_parameters();
  REQUIRE(params.size() == 2);
  CHECK(params[0].first == "emb.weight");
  CHECK(params[1].first == "emb.bias");
  CHECK(tied.parameter_count() == 6 + 2);
  CHECK(tied.emb->weight.name() == "emb.weight");  // the first name wins

  const auto state = tied.state_dict();
  CHECK(names_of(state) ==
        std::vector<std::string>{"emb.weight", "emb.bias", "emb.stat", "head.weight"});
  CHECK(state[3].second.is_same(state[0].second));

  // Loading writes the one tensor (both names carry the same value in a saved dict).
  std::map<std::string, Tensor> values = clone_state(tied);
  const Tensor w = Tensor::from_vector({6, 5, 4, 3, 2, 1}, {2, 3});
  values["emb.weight"] = w;
  values["head.weight"] = w;
  tied.load_state_dict(values);
  CHECK(tied.emb->weight.master().to_float_vector() == w.to_float_vector());
  // Strict loading needs both names, as in torch.
  values.erase("head.weight");
  CHECK_THROWS_WITH(tied.load_state_dict(values), Contains("head.weight"));
}

TEST_CASE("strict load_state_dict lists every problem and writes nothing", "[layers][module]") {
  Tree tree;
  std::map<std::string, Tensor> state = clone_state(tree);
  state["scale"] = Tensor::from_vector({7.f}, {1});
  state.erase("a.bias");
  state.erase("b.c.stat");
  state["extra.weight"] = Tensor::zeros({3});
  state["b.c.weight"] = Tensor::zeros({3, 2});
  try {
    tree.load_state_dict(state);
    FAIL("load_state_dict should have thrown");
  } catch (const Error& e) {
    const std::string msg = e.what();
    CHECK_THAT(msg, Contains("missing keys (2)"));
    CHECK_THAT(msg, Contains("a.bias"));
    CHECK_THAT(msg, Contains("b.c.stat"));
    CHECK_THAT(msg, Contains("unexpected keys (1)"));
    CHECK_THAT(msg, Contains("extra.weight"));
    CHECK_THAT(msg, Contains("b.c.weight: expected [2, 3] got [3, 2]"));
    CHECK_THAT(msg, Contains("nothing was loaded"));
  }
  CHECK(tree.scale.master().get(0) == 1.0);  // untouched

  // A value of the wrong kind is refused as well.
  std::map<std::string, Tensor> bad = clone_state(tree);
  bad["b.count"] = Tensor::zeros({}, DType::F32);
  bad["scale"] = Tensor::from_vector({7.f}, {1});
  CHECK_THROWS_WITH(tree.load_state_dict(bad), Contains("b.count: expected an I32 value"));
  CHECK(tree.scale.master().get(0) == 1.0);
  bad["b.count"] = Tensor::zeros({}, DType::I32);
  bad["a.stat"] = Tensor::from_ints({1, 2}, {2});
  CHECK_THROWS_WITH(tree.load_state_dict(bad), Contains("a.stat: expected a floating value"));
}

TEST_CASE("load_state_dict converts dtypes and writes masters and buffers", "[layers][module]") {
  Tree tree;
  std::map<std::string, Tensor> state = clone_state(tree);
  // 0.1 is not exact in F16: the master receives the F16 value widened.
  state["a.weight"] = Tensor::from_vector({0.1f, 0.2f, 0.3f, 0.4f, 0.5f, 0.6f}, {2, 3}, DType::F16);
  state["b.count"] = Tensor::from_ints({5}, {});
  state["b.c.stat"] = Tensor::from_vector({3.f, -3.f}, {2}, DType::BF16);
  tree.load_state_dict(state);
  CHECK(tree.a->weight.master().dtype() == DType::F32);
  CHECK(tree.a->weight.master().to_float_vector() == state["a.weight"].to_float_vector());
  CHECK(tree.a->weight.master().get(0) != 0.1f);
  CHECK(tree.b->count->get(0) == 5.0);
  CHECK(tree.b->c->stat->to_float_vector() == std::vector<float>{3.f, -3.f});
  CHECK(tree.b->c->stat->dtype() == DType::F32);
}

TEST_CASE("non-strict load_state_dict ignores missing and unexpected names", "[layers][module]") {
  Tree tree;
  std::map<std::string, Tensor> state;
  state["scale"] = Tensor::from_vector({3.f}, {1});
  state["b.c.bias"] = Tensor::from_vector({9.f, 8.f}, {2});
  state["not.a.name"] = Tensor::zeros({4});
  CHECK_THROWS(tree.load_state_dict(state, /*strict=*/true));
  CHECK(tree.scale.master().get(0) == 1.0);
  tree.load_state_dict(state, /*strict=*/false);
  CHECK(tree.scale.master().get(0) == 3.0);
  CHECK(tree.b->c->bias.master().to_float_vector() == std::vector<float>{9.f, 8.f});
  CHECK(tree.a->bias.master().to_float_vector() == std::vector<float>{0.5f, -0.5f});

  // Shape mismatches throw even when not strict, and nothing is written.
  state["scale"] = Tensor::from_vector({4.f}, {1});
  state["a.bias"] = Tensor::zeros({3});
  CHECK_THROWS_WITH(tree.load_state_dict(state, false), Contains("a.bias: expected [2] got [3]"));
  CHECK(tree.scale.master().get(0) == 3.0);
}

TEST_CASE("load_state_dict refreshes the F16 and BF16 working copies", "[layers][module]") {
  for (DType dtype : {DType::F16, DType::BF16}) {
    CAPTURE(dtype);
    Tree tree;
    for (Parameter p : tree.parameters()) p.set_working_dtype(dtype);
    const std::vector<float> values = {0.1f, -0.7f, 1.3f, 1000.1f, 3e-3f, -2.2f};
    std::map<std::string, Tensor> state = clone_state(tree);
    state["b.c.weight"] = Tensor::from_vector(values, {2, 3});
    tree.load_state_dict(state);
    const Parameter& w = tree.b->c->weight;
    CHECK(w.master().to_float_vector() == values);
    CHECK(w.working().dtype() == dtype);
    // The working copy is the rounding of the new master, not the old value.
    CHECK(w.working().to_float_vector() ==
          Tensor::from_vector(values, {2, 3}, dtype).to_float_vector());
  }
}

TEST_CASE("train() and eval() reach every descendant", "[layers][module]") {
  Tree tree;
  CHECK(tree.is_training());
  CHECK(tree.b->c->is_training());
  tree.eval();
  CHECK(!tree.is_training());
  CHECK(!tree.a->is_training());
  CHECK(!tree.b->is_training());
  CHECK(!tree.b->c->is_training());
  tree.b->train();
  CHECK(!tree.is_training());
  CHECK(tree.b->c->is_training());
  tree.train();
  CHECK(tree.a->is_training());
}

TEST_CASE("registration refuses duplicate, dotted and empty names", "[layers][module]") {
  Open m;
  m.register_parameter("w", Tensor::ones({2}));
  CHECK_THROWS_WITH(m.register_parameter("w", Tensor::ones({2})), Contains("already registered"));
  CHECK_THROWS_WITH(m.register_buffer("w", Tensor::ones({2})), Contains("already registered"));
  CHECK_THROWS_WITH(m.register_module("w", std::make_shared<Leaf>()),
                    Contains("already registered"));
  CHECK_THROWS_WITH(m.register_parameter("a.b", Tensor::ones({2})), Contains("'.'"));
  CHECK_THROWS_WITH(m.register_parameter("", Tensor::ones({2})), Contains("empty"));
  CHECK_THROWS_WITH(m.register_shared_parameter("s", Parameter()), Contains("undefined"));
  CHECK_THROWS(m.register_module("child", std::shared_ptr<Leaf>()));
  // A buffer returned by reference is the one state_dict shows.
  Tensor& buf = m.register_buffer("buf", Tensor::zeros({2}));
  buf.fill_(4.0);
  CHECK(m.state_dict()[1].first == "buf");
  CHECK(m.state_dict()[1].second.get(1) == 4.0);
}
