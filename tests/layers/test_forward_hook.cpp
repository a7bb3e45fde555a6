// Module's forward hook: module(input) hands each output to the hook, containers call their
// children that way, and what the hook returns is what the model computes with.
#include <functional>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "core/ops/ops.h"
#include "layer_test_util.h"
#include "layers/activations.h"
#include "layers/linear.h"
#include "layers/model_builder.h"
#include "layers/sequential.h"

using namespace mixprec;
using namespace mixprec::layers_test;

namespace {

// Every module of the tree with its dotted path ("" for the root).
void walk(const std::string& path, const std::shared_ptr<Module>& module,
          std::vector<std::pair<std::string, std::shared_ptr<Module>>>& out) {
  out.emplace_back(path, module);
  for (const auto& [name, child] : module->named_children())
    walk(path.empty() ? name : path + "." + name, child, out);
}

}  // namespace

TEST_CASE("a forward hook sees the module's output and replaces it", "[layers][hook]") {
  Generator init(3);
  auto linear = std::make_shared<Linear>(4, 3, true, init);
  const Tensor x = random_tensor({2, 4}, 9);
  const Tensor plain = (*linear)(x);
  CHECK_FALSE(linear->has_forward_hook());

  Tensor seen;
  linear->set_forward_hook([&](const Tensor& out) {
    seen = out;
    return ops::mul_scalar(out, 2.0);
  });
  CHECK(linear->has_forward_hook());
  const Tensor hooked = (*linear)(x);
  REQUIRE(seen.defined());
  CHECK(same_values(seen, plain));
  const std::vector<float> p = plain.to_float_vector(), h = hooked.to_float_vector();
  for (size_t i = 0; i < p.size(); ++i) CHECK(h[i] == 2.0f * p[i]);
  // forward() itself bypasses the hook.
  CHECK(same_values(linear->forward(x), plain));

  linear->set_forward_hook(nullptr);
  CHECK_FALSE(linear->has_forward_hook());
  CHECK(same_values((*linear)(x), plain));
}

TEST_CASE("Sequential calls its children through their hooks", "[layers][hook]") {
  Generator init(5);
  auto seq = std::make_shared<Sequential>();
  auto first = seq->append(std::make_shared<Linear>(3, 4, true, init));
  seq->append(std::make_shared<ReLU>());
  auto last = seq->append(std::make_shared<Linear>(4, 2, true, init));
  const Tensor x = random_tensor({5, 3}, 2);
  const Tensor plain = (*seq)(x);

  std::vector<std::string> order;
  for (size_t i = 0; i < seq->size(); ++i) {
    const std::string name = std::to_string(i);
    seq->at(i)->set_forward_hook([&order, name](const Tensor& out) {
      order.push_back(name);
      return out;
    });
  }
  CHECK(same_values((*seq)(x), plain));  // identity hooks change nothing
  CHECK(order == std::vector<std::string>{"0", "1", "2"});

  // A hook on the first layer that zeroes its output: ReLU(0) = 0, so the model's output is
  // the last layer's bias on every row.
  first->set_forward_hook([](const Tensor& out) { return ops::mul_scalar(out, 0.0); });
  const std::vector<float> y = (*seq)(x).to_float_vector();
  const std::vector<float> bias = last->bias().master().to_float_vector();
  for (int64_t row = 0; row < 5; ++row)
    for (int64_t col = 0; col < 2; ++col) CHECK(y[row * 2 + col] == bias[col]);
}

TEST_CASE("every leaf and every block of a GPT is called through its hook", "[layers][hook]") {
  const GptSpec spec{.vocab_size = 11, .block_size = 6, .n_layer = 2, .n_head = 2, .n_embd = 8,
                     .dropout = 0.1};
  Generator init(7);
  auto model = build_gpt(spec, init, std::make_shared<Generator>(8));
  const Tensor ids = Tensor::from_ints({1, 2, 3, 4, 5, 6, 7, 8}, {2, 4});
  std::vector<std::pair<std::string, std::shared_ptr<Module>>> modules;
  walk("", model, modules);

  std::map<std::string, int> calls;
  std::set<std::string> expected;
  for (const auto& [path, module] : modules) {
    // The ModuleDict `transformer` has no forward; everything else is called once.
    if (path == "transformer") continue;
    expected.insert(path);
    module->set_forward_hook([&calls, path = path](const Tensor& out) {
      ++calls[path];
      return out;
    });
  }
  (*model)(ids);
  std::set<std::string> called;
  for (const auto& [path, count] : calls) {
    INFO(path);
    CHECK(count == 1);
    called.insert(path);
  }
  CHECK(called == expected);
  // The hooks reach the inner modules of a block, not only the top level.
  CHECK(called.count("transformer.h.1.attn.c_attn") == 1);
  CHECK(called.count("transformer.h.0.mlp.gelu") == 1);
  CHECK(called.count("transformer.h.0") == 1);
}

TEST_CASE("a forward hook with grad_tap sees the gradient of a layer's output",
          "[layers][hook]") {
  Generator init(11);
  auto seq = std::make_shared<Sequential>();
  auto first = seq->append(std::make_shared<Linear>(3, 2, false, init));
  auto second = seq->append(std::make_shared<Linear>(2, 1, false, init));
  std::vector<float> seen;
  first->set_forward_hook([&](const Tensor& out) {
    return ops::grad_tap(out, [&](const Tensor& g) { seen = g.to_float_vector(); });
  });
  const Tensor x = random_tensor({4, 3}, 1);
  ops::sum((*seq)(x)).backward();
  // d sum(h W2^T) / dh = W2 on every row.
  const std::vector<float> w2 = second->weight().master().to_float_vector();
  REQUIRE(seen.size() == 8);
  for (int64_t row = 0; row < 4; ++row)
    for (int64_t col = 0; col < 2; ++col) CHECK(seen[row * 2 + col] == w2[col]);
}
