// LR schedules at chosen steps against values worked out by hand from torch's StepLR and
// nanoGPT's get_lr.
#include <catch2/catch.hpp>
#include <cstdint>
#include <limits>

#include "optim/lr_schedule.h"

using namespace mixprec;

TEST_CASE("constant LR schedule", "[lr_schedule]") {
  const auto s = make_constant_schedule(3e-4);
  CHECK(s->lr_at(0) == 3e-4);
  CHECK(s->lr_at(123456) == 3e-4);
  CHECK(s->describe() == "constant(lr=0.0003)");
  CHECK_THROWS_WITH(make_constant_schedule(-1.0), Catch::Contains("base_lr"));
  CHECK_THROWS(make_constant_schedule(std::numeric_limits<double>::infinity()));
  CHECK_THROWS_WITH(s->lr_at(-1), Catch::Contains("steps_taken"));
}

TEST_CASE("step LR schedule changes the rate at multiples of step_size", "[lr_schedule]") {
  const auto s = make_step_schedule(0.1, 3, 0.5);
  CHECK(s->lr_at(0) == Approx(0.1));
  CHECK(s->lr_at(2) == Approx(0.1));
  CHECK(s->lr_at(3) == Approx(0.05));
  CHECK(s->lr_at(5) == Approx(0.05));
  CHECK(s->lr_at(6) == Approx(0.025));
  CHECK(s->lr_at(9) == Approx(0.0125));
  CHECK(s->lr_at(11) == Approx(0.0125));
  CHECK(s->describe() == "step(lr=0.1, step_size=3, gamma=0.5)");
  // gamma 1 and step_size 1 are allowed.
  CHECK(make_step_schedule(0.2, 1, 1.0)->lr_at(50) == Approx(0.2));
  CHECK(make_step_schedule(1.0, 1, 0.9)->lr_at(2) == Approx(0.81));

  CHECK_THROWS_WITH(make_step_schedule(0.1, 0, 0.5), Catch::Contains("step_size"));
  CHECK_THROWS_WITH(make_step_schedule(0.1, -2, 0.5), Catch::Contains("step_size"));
  CHECK_THROWS_WITH(make_step_schedule(0.1, 3, 0.0), Catch::Contains("gamma"));
  CHECK_THROWS_WITH(make_step_schedule(0.1, 3, 1.5), Catch::Contains("gamma"));
  CHECK_THROWS_WITH(make_step_schedule(-0.1, 3, 0.5), Catch::Contains("base_lr"));
  CHECK_THROWS(s->lr_at(-3));
}

TEST_CASE("warmup-cosine schedule follows nanoGPT's get_lr", "[lr_schedule]") {
  // base 1e-3, 10 warmup steps, cosine down to 1e-4 at step 110.
  const auto s = make_warmup_cosine_schedule(1e-3, 10, 110, 1e-4);
  // Warmup: (t + 1) / 10 * base.
  CHECK(s->lr_at(0) == Approx(1e-4));
  CHECK(s->lr_at(1) == Approx(2e-4));
  CHECK(s->lr_at(4) == Approx(5e-4));
  CHECK(s->lr_at(9) == Approx(1e-3));
  // Start of the decay: ratio 0, the full rate.
  CHECK(s->lr_at(10) == Approx(1e-3));
  // A quarter of the way: coeff = (1 + cos(pi / 4)) / 2 = 0.853553390593...
  CHECK(s->lr_at(35) == Approx(1e-4 + 0.8535533905932737 * 9e-4));
  // Midpoint: (base + min) / 2.
  CHECK(s->lr_at(60) == Approx(5.5e-4));
  // End of the decay and after it: min_lr.
  CHECK(s->lr_at(110) == Approx(1e-4));
  CHECK(s->lr_at(111) == 1e-4);
  CHECK(s->lr_at(100000) == 1e-4);
  CHECK(s->describe() == "cosine(lr=0.001, warmup=10, decay_steps=110, min_lr=0.0001)");

  // Never above base, never below min, and non-increasing once warmup is over.
  double previous = s->lr_at(10);
  for (int64_t t = 11; t < 130; ++t) {
    const double lr = s->lr_at(t);
    CHECK(lr <= previous);
    CHECK(lr >= 1e-4);
    previous = lr;
  }
}

TEST_CASE("warmup-cosine schedule edge cases", "[lr_schedule]") {
  // No warmup: the first update gets the full rate.
  const auto no_warmup = make_warmup_cosine_schedule(0.5, 0, 4, 0.1);
  CHECK(no_warmup->lr_at(0) == Approx(0.5));
  CHECK(no_warmup->lr_at(2) == Approx(0.3));  // midpoint
  CHECK(no_warmup->lr_at(4) == Approx(0.1));
  CHECK(no_warmup->lr_at(5) == Approx(0.1));

  // decay_steps == warmup_steps: warmup, then min_lr, with no 0 / 0 on the way.
  const auto no_decay = make_warmup_cosine_schedule(1.0, 4, 4, 0.2);
  CHECK(no_decay->lr_at(0) == Approx(0.25));
  CHECK(no_decay->lr_at(3) == Approx(1.0));
  CHECK(no_decay->lr_at(4) == Approx(0.2));
  CHECK(no_decay->lr_at(5) == Approx(0.2));
  const auto nothing = make_warmup_cosine_schedule(1.0, 0, 0, 0.2);
  CHECK(nothing->lr_at(0) == Approx(0.2));

  // min_lr == base_lr: flat after warmup.
  const auto flat = make_warmup_cosine_schedule(0.3, 2, 10, 0.3);
  CHECK(flat->lr_at(0) == Approx(0.15));
  CHECK(flat->lr_at(6) == Approx(0.3));

  using Catch::Contains;
  CHECK_THROWS_WITH(make_warmup_cosine_schedule(1e-3, -1, 10, 0.0), Contains("warmup_steps"));
  CHECK_THROWS_WITH(make_warmup_cosine_schedule(1e-3, 20, 10, 0.0),
                    Contains("decay_steps") && Contains("20") && Contains("10"));
  CHECK_THROWS_WITH(make_warmup_cosine_schedule(1e-3, 0, 10, -1e-5), Contains("min_lr"));
  CHECK_THROWS_WITH(make_warmup_cosine_schedule(1e-3, 0, 10, 2e-3), Contains("min_lr"));
  CHECK_THROWS_WITH(make_warmup_cosine_schedule(-1e-3, 0, 10, 0.0), Contains("base_lr"));
  CHECK_THROWS(no_warmup->lr_at(-1));
}
