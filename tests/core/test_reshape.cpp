// reshape and flatten: finite-difference gradients and low-precision forwards.
#include "core/autograd/grad_mode.h"
#include "gradcheck.h"

using namespace mixprec;
using namespace mixprec::testing;

TEST_CASE("reshape and flatten pass gradients through unchanged in layout", "[reshape]") {
  Tensor x = random_tensor({3, 5, 7}, 11);
  x.set_requires_grad(true);
  // The square makes the gradient depend on the element, so a permuted layout would fail.
  gradcheck("reshape", [](const std::vector<Tensor>& in) {
    return ops::square(in[0].reshape({7, -1}));
  }, {x});
  gradcheck("flatten", [](const std::vector<Tensor>& in) {
    return ops::square(ops::flatten(in[0], 1));
  }, {x});
  gradcheck("flatten all", [](const std::vector<Tensor>& in) {
    return ops::square(ops::flatten(in[0]));
  }, {x});
}

TEST_CASE("reshape and flatten keep F16 and BF16 values bit for bit", "[reshape]") {
  const Tensor x = random_tensor({4, 3, 2}, 5);
  for (DType dtype : {DType::F16, DType::BF16}) {
    const Tensor low = x.to(dtype);
    const Tensor r = ops::flatten(low.reshape({2, 12}), 0);
    REQUIRE(r.dtype() == dtype);
    for (int64_t i = 0; i < x.numel(); ++i) CHECK(r.get(i) == low.get(i));
  }
}
