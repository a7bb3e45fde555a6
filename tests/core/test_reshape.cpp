// reshape and flatten keep 16-bit values; their gradients are the op table's
// (tests/ops/op_table.h).
#include "gradcheck.h"

using namespace mixprec;
using namespace mixprec::testing;

TEST_CASE("reshape and flatten keep F16 and BF16 values bit for bit", "[reshape]") {
  const Tensor x = random_tensor({4, 3, 2}, 5);
  for (DType dtype : {DType::F16, DType::BF16}) {
    const Tensor low = x.to(dtype);
    const Tensor r = ops::flatten(low.reshape({2, 12}), 0);
    REQUIRE(r.dtype() == dtype);
    for (int64_t i = 0; i < x.numel(); ++i) CHECK(r.get(i) == low.get(i));
  }
}
