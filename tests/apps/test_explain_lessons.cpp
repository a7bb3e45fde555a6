// The loss-scaling lessons of `mixprec explain` reproduce the worked examples of the
// loss-scaling explainer by running the framework. Each expected value is derived here
// independently: FP16 roundings with core/half.h's scalar conversion of the product the
// backward pass takes in FP32, unscaling as exact division by a power of two, norms and
// ideal updates in double. Where the explainer prints an exact value it is checked
// literally; where it says "approximately", with a tolerance of its printed digits.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "apps/explain/accumulation.h"
#include "apps/explain/clipping.h"
#include "apps/explain/distributed.h"
#include "apps/explain/formats.h"
#include "apps/explain/overflow.h"
#include "apps/explain/policies.h"
#include "apps/explain/topics.h"
#include "apps/explain/underflow.h"
#include "core/half.h"

namespace {

using namespace mixprec;
using namespace mixprec::explain;

// The FP16 value that a product taken in FP32 becomes when stored in FP16.
float fp16(float value) { return half_bits_to_float(float_to_half_bits(value)); }

// `text` with every run of spaces and line breaks made one space, so that a lesson's
// wrapped lines can be searched for a phrase.
std::string flat(const std::string& text) {
  std::string out;
  for (char c : text) {
    const bool space = c == ' ' || c == '\n';
    if (space && !out.empty() && out.back() == ' ') continue;
    out += space ? ' ' : c;
  }
  return out;
}

// Whether `text` holds the phrase `part`, however either is wrapped.
bool contains_phrase(const std::string& text, const std::string& part) {
  return flat(text).find(flat(part)) != std::string::npos;
}

}  // namespace

// ---- formats ---------------------------------------------------------------------------------

TEST_CASE("explain formats --json: landmarks of FP16, BF16 and FP32", "[apps][explain]") {
  const nlohmann::json j = explain_formats_json();
  CHECK(j.at("fp16_max").get<double>() == 65504.0);
  CHECK(j.at("fp16_min_normal").get<double>() == std::ldexp(1.0, -14));
  CHECK(j.at("fp16_min_subnormal").get<double>() == std::ldexp(1.0, -24));
  CHECK(j.at("fp16_epsilon").get<double>() == std::ldexp(1.0, -10));
  // BF16: 8 exponent bits like FP32, 7 mantissa bits; largest finite (2 - 2^-7) * 2^127.
  CHECK(j.at("bf16_max").get<double>() == std::ldexp(255.0, 120));
  CHECK(j.at("bf16_min_normal").get<double>() == std::ldexp(1.0, -126));
  CHECK(j.at("bf16_min_subnormal").get<double>() == std::ldexp(1.0, -133));
  CHECK(j.at("bf16_epsilon").get<double>() == std::ldexp(1.0, -7));
  using F = std::numeric_limits<float>;
  CHECK(j.at("fp32_max").get<double>() == static_cast<double>(F::max()));
  CHECK(j.at("fp32_min_normal").get<double>() == static_cast<double>(F::min()));
  CHECK(j.at("fp32_min_subnormal").get<double>() == static_cast<double>(F::denorm_min()));
  CHECK(j.at("fp32_epsilon").get<double>() == static_cast<double>(F::epsilon()));
  CHECK(j.size() == 12);
}

TEST_CASE("format_landmarks derives the bit patterns from the field widths", "[apps][explain]") {
  const FormatLandmarks h = format_landmarks(fp16_format());
  CHECK(h.bias == 15);
  CHECK(h.one_bits == 0x3C00);
  CHECK(h.largest_finite_bits == 0x7BFF);
  CHECK(h.smallest_normal_bits == 0x0400);
  CHECK(h.infinity_bits == 0x7C00);
  const FormatLandmarks b = format_landmarks(bf16_format());
  CHECK(b.bias == 127);
  CHECK(b.largest_finite_bits == 0x7F7F);
  CHECK(b.largest_finite == static_cast<double>(kBf16Max));
  CHECK(hex_pattern(fp16_format(), 0x095E) == "0x095E");
  CHECK(hex_pattern(fp32_format(), 0x3F800000) == "0x3F800000");
}

// ---- underflow (explainer section 3) ----------------------------------------------------------

TEST_CASE("explain underflow: the 1e-8 gradient with and without S = 16384", "[apps][explain]") {
  const UnderflowLesson l = run_underflow_lesson();
  const float g = static_cast<float>(1e-8);  // the FP32 multiplier of the FP16 intermediate

  // Step 1: without scaling the FP16 gradient is 0, and SGD leaves w at 0.
  CHECK(fp16(g) == 0.0f);
  CHECK(l.fp16_unscaled == fp16(g));
  CHECK(l.fp16_unscaled == 0.0f);
  CHECK(l.fp16_unscaled_bits == 0x0000);
  CHECK(l.w_new_unscaled == 0.0f);

  // Step 2: the scaled loss.
  CHECK(l.loss == 0.125f);
  CHECK(l.loss_scaled == 16384.0 * 0.125);
  CHECK(l.loss_scaled == 2048.0f);
  CHECK(l.scaled_exact == Approx(0.00016384).epsilon(1e-12));

  // Step 3: backward multiplies S by the FP32 multiplier and rounds once to FP16.
  CHECK(l.fp16_scaled == fp16(16384.0f * g));
  CHECK(static_cast<double>(l.fp16_scaled) == 0.00016379356384277344);
  CHECK(l.fp16_scaled_bits == 0x095E);
  CHECK(l.grad_scale_tag == 16384.0);

  // Step 4: unscaling divides by a power of two, which is exact.
  CHECK(static_cast<double>(l.restored) == static_cast<double>(l.fp16_scaled) / 16384.0);
  CHECK(l.restored == Approx(9.99716576e-9).margin(5e-18));
  const double relative_error = std::fabs(static_cast<double>(l.restored) - 1e-8) / 1e-8 * 100.0;
  CHECK(l.relative_error_percent == relative_error);
  CHECK(l.relative_error_percent == Approx(0.0283).margin(5e-5));

  // Step 5: SGD with lr 0.1 from 0, in FP32; the ideal update in double.
  CHECK(l.scaled_stepped);
  CHECK(l.unscaled_stepped);
  CHECK(l.w_new_scaled == 0.0f - static_cast<float>(0.1) * l.restored);
  CHECK(l.w_new_scaled == Approx(-9.99716576e-10).epsilon(1e-7));
  CHECK(l.w_new_exact == 0.0 - 0.1 * 1e-8);
  CHECK(l.w_new_exact == Approx(-1e-9).epsilon(1e-15));
}

TEST_CASE("explain underflow follows the scale it is given", "[apps][explain]") {
  // dL/dh = S reaches the FP16 intermediate first (rounded to FP16), then backward multiplies
  // it by the FP32 multiplier and rounds again.
  for (double scale : {1.0, 1024.0, 32768.0}) {
    UnderflowSetup setup;
    setup.scale = scale;
    const UnderflowLesson l = run_underflow_lesson(setup);
    const float expected =
        fp16(fp16(static_cast<float>(scale)) * static_cast<float>(setup.true_grad));
    INFO("S = " << scale);
    CHECK(l.fp16_scaled == expected);
    CHECK(static_cast<double>(l.restored) == static_cast<double>(expected) / scale);
    CHECK(l.scaled_stepped);
    CHECK(l.w_new_scaled == 0.0f - static_cast<float>(setup.lr) * l.restored);
  }
  UnderflowSetup unscaled;
  unscaled.scale = 1.0;
  CHECK(run_underflow_lesson(unscaled).w_new_scaled == 0.0f);

  // 2^16 is past FP16's largest finite value: dL/dh itself overflows, and the step is skipped.
  UnderflowSetup too_large;
  too_large.scale = 65536.0;
  const UnderflowLesson overflowed = run_underflow_lesson(too_large);
  CHECK(std::isinf(fp16(65536.0f)));
  CHECK(std::isinf(overflowed.fp16_scaled));
  CHECK_FALSE(overflowed.scaled_stepped);
  CHECK(overflowed.w_new_scaled == 0.0f);
}

TEST_CASE("explain underflow: text and JSON carry the computed values", "[apps][explain]") {
  const UnderflowLesson l = run_underflow_lesson();
  const std::string text = underflow_text(l);
  INFO(text);
  CHECK(contains_phrase(text, "0.00016379356384277344"));
  CHECK(contains_phrase(text, "0x095E = 0|00010|0101011110"));
  CHECK(contains_phrase(text, "2048"));
  CHECK(contains_phrase(text, exact_text(l.restored)));
  CHECK(contains_phrase(text, exact_text(l.w_new_scaled)));

  const nlohmann::json j = underflow_json(l);
  CHECK(j.at("fp16_unscaled").get<double>() == 0.0);
  CHECK(j.at("loss_scaled").get<double>() == 2048.0);
  CHECK(j.at("fp16_scaled").get<double>() == 0.00016379356384277344);
  CHECK(j.at("fp16_scaled_hex") == "0x095E");
  CHECK(j.at("restored").get<double>() == static_cast<double>(l.restored));
  CHECK(j.at("relative_error_percent").get<double>() == l.relative_error_percent);
  CHECK(j.at("w_new_scaled").get<double>() == static_cast<double>(l.w_new_scaled));
  CHECK(j.at("w_new_unscaled").get<double>() == 0.0);
  CHECK(j.at("w_new_exact").get<double>() == l.w_new_exact);
  CHECK(j.at("steps").size() == 6);
}

// ---- overflow (explainer section 5) -----------------------------------------------------------

TEST_CASE("explain overflow: skip, backoff, retry and growth", "[apps][explain]") {
  const OverflowLesson l = run_overflow_lesson();
  REQUIRE(l.attempts.size() == 3);  // the overflow, then growth_interval = 2 finite steps
  const OverflowAttempt& first = l.attempts[0];
  const OverflowAttempt& retry = l.attempts[1];
  const OverflowAttempt& growth = l.attempts[2];

  // 10 * 8192 = 81920 is past the FP16 rounding midpoint above 65504.
  CHECK(first.scale == 8192.0);
  CHECK(first.scaled_exact == 81920.0);
  CHECK(float_to_half_bits(8192.0f * 10.0f) == 0x7C00);
  CHECK(std::isinf(first.scaled_grad));
  CHECK(first.scaled_grad > 0.0f);
  CHECK(first.skipped);
  CHECK_FALSE(first.reason.empty());
  CHECK(first.nonfinite_tensors == std::vector<std::string>{"w"});
  CHECK(first.w_after == 1.0f);
  CHECK(first.next_scale == 8192.0 * 0.5);
  CHECK(first.scale_event == "backed_off");

  // Retry at 4096: 40960 fits FP16 exactly; SGD with lr 0.01 takes w from 1 to 0.9.
  CHECK(retry.scale == 4096.0);
  CHECK(retry.scaled_grad == fp16(4096.0f * 10.0f));
  CHECK(retry.scaled_grad == 40960.0f);
  CHECK(retry.unscaled_grad == 10.0f);
  CHECK_FALSE(retry.skipped);
  CHECK(retry.reason.empty());
  CHECK(retry.w_after == 1.0f - static_cast<float>(0.01) * 10.0f);
  CHECK(retry.w_after == Approx(0.9).epsilon(1e-7));
  CHECK(retry.next_scale == 4096.0);
  CHECK(retry.scale_event == "kept");
  CHECK(retry.growth_tracker == 1);

  // The second consecutive finite step reaches growth_interval: 4096 * 2.
  CHECK_FALSE(growth.skipped);
  CHECK(growth.next_scale == 4096.0 * 2.0);
  CHECK(growth.scale_event == "grew");
  CHECK(growth.w_after == retry.w_after - static_cast<float>(0.01) * 10.0f);

  const nlohmann::json j = overflow_json(l);
  CHECK(j.at("scaled_grad") == "inf");
  CHECK(j.at("skipped") == true);
  CHECK(j.at("w_after_skip").get<double>() == 1.0);
  CHECK(j.at("scale_after_backoff").get<double>() == 4096.0);
  CHECK(j.at("scaled_grad_retry").get<double>() == 40960.0);
  CHECK(j.at("w_after_step").get<double>() == static_cast<double>(retry.w_after));
  CHECK(j.at("scale_after_growth").get<double>() == 8192.0);
  CHECK(j.at("attempts").size() == 3);
  CHECK(j.at("fp16_max").get<double>() == 65504.0);

  const std::string text = overflow_text(l);
  INFO(text);
  CHECK(contains_phrase(text, "81920"));
  CHECK(contains_phrase(text, "inf"));
  CHECK(contains_phrase(text, "8192 -> 4096"));
  CHECK(contains_phrase(text, "4096 -> 8192"));
  CHECK(contains_phrase(text, exact_text(retry.w_after)));
}

// ---- clipping (explainer section 7) -----------------------------------------------------------

TEST_CASE("explain clipping: unscale then clip, versus clip then unscale", "[apps][explain]") {
  const ClippingLesson l = run_clipping_lesson();
  CHECK(l.scaled_grad == std::vector<float>{3.0f * 16.0f, 4.0f * 16.0f});
  CHECK_FALSE(l.refusal.empty());

  // Correct order: norm sqrt(3^2 + 4^2) = 5, factor max_norm / (5 + 1e-6).
  CHECK(l.unscaled_grad == std::vector<float>{3.0f, 4.0f});
  CHECK(l.true_norm == Approx(std::sqrt(3.0 * 3.0 + 4.0 * 4.0)).epsilon(1e-12));
  const double factor = 1.0 / (5.0 + 1e-6);
  CHECK(l.plain_factor == 0.2);  // the explainer's "clip factor 1/5 = 0.2"
  CHECK(l.clip_factor == factor);
  REQUIRE(l.correct.size() == 2);
  CHECK(l.correct[0] == Approx(3.0 * factor).epsilon(1e-7));
  CHECK(l.correct[1] == Approx(4.0 * factor).epsilon(1e-7));
  CHECK(l.correct[0] == Approx(0.6).epsilon(1e-6));
  CHECK(l.correct[1] == Approx(0.8).epsilon(1e-6));
  CHECK(l.correct_norm == Approx(1.0).epsilon(1e-6));

  // Wrong order: the scaled norm 80 is clipped to 1, then divided by 16 again.
  CHECK(l.scaled_norm == Approx(80.0).epsilon(1e-12));
  const double wrong_factor = 1.0 / (80.0 + 1e-6);
  REQUIRE(l.wrong_order.size() == 2);
  CHECK(l.clipped_scaled[0] == Approx(48.0 * wrong_factor).epsilon(1e-7));
  CHECK(l.wrong_order[0] == Approx(48.0 * wrong_factor / 16.0).epsilon(1e-7));
  CHECK(l.wrong_order[1] == Approx(64.0 * wrong_factor / 16.0).epsilon(1e-7));
  CHECK(l.wrong_order[0] == Approx(0.0375).epsilon(1e-6));
  CHECK(l.wrong_order[1] == Approx(0.05).epsilon(1e-6));
  CHECK(l.wrong_order_norm == Approx(0.0625).epsilon(1e-6));
  CHECK(static_cast<double>(l.wrong_order[0]) == static_cast<double>(l.clipped_scaled[0]) / 16.0);

  const nlohmann::json j = clipping_json(l);
  CHECK(j.at("correct").size() == 2);
  CHECK(j.at("correct")[1].get<double>() == static_cast<double>(l.correct[1]));
  CHECK(j.at("wrong_order")[0].get<double>() == static_cast<double>(l.wrong_order[0]));
  CHECK(j.at("wrong_order_norm").get<double>() == l.wrong_order_norm);
  CHECK(j.at("refusal") == l.refusal);
  CHECK(j.at("plain_factor").get<double>() == 0.2);
  CHECK(j.at("clip_factor").get<double>() == factor);
  const std::string text = clipping_text(l);
  CHECK(contains_phrase(text, l.refusal));
  CHECK(contains_phrase(text, "[48, 64]"));
  CHECK(contains_phrase(text, "the clip factor is max_norm / norm = 1/5 = 0.2;"));
}

// ---- accumulation (explainer section 8) -------------------------------------------------------

TEST_CASE("explain accumulation: one scale, count-weighted microbatches", "[apps][explain]") {
  const AccumulationLesson l = run_accumulation_lesson();
  const float s = 16384.0f;
  const float g1 = static_cast<float>(1e-8);
  const float g2 = static_cast<float>(2e-8);

  // Equal microbatches of 2 samples: each loss weighted by 2/4; one FP16 rounding per term.
  const float equal_1 = fp16(fp16(s * 0.5f) * g1);
  const float equal_2 = fp16(fp16(s * 0.5f) * g2);
  REQUIRE(l.equal.buffer_after.size() == 2);
  CHECK(l.equal.losses == std::vector<float>{0.125f, 0.125f});
  CHECK(l.equal.scaled_losses == std::vector<float>{0.125f * 16384 * 2 / 4, 0.125f * 16384 * 2 / 4});
  CHECK(l.equal.buffer_after[0] == equal_1);
  CHECK(l.equal.buffer_after[1] == equal_1 + equal_2);
  CHECK(static_cast<double>(l.equal.restored_mean) ==
        static_cast<double>(equal_1 + equal_2) / 16384.0);
  CHECK(l.equal.restored_mean == Approx(1.5e-8).epsilon(1e-3));
  CHECK(l.equal.expected_mean == (2 * 1e-8 + 2 * 2e-8) / 4);
  CHECK(l.equal.stepped);

  // 3 samples and 1 sample: weights 3/4 and 1/4.
  const float unequal_1 = fp16(fp16(s * 0.75f) * g1);
  const float unequal_2 = fp16(fp16(s * 0.25f) * g2);
  REQUIRE(l.unequal.buffer_after.size() == 2);
  CHECK(l.unequal.scaled_losses == std::vector<float>{0.125f * 16384 * 3 / 4, 0.125f * 16384 / 4});
  CHECK(l.unequal.buffer_after[0] == unequal_1);
  CHECK(l.unequal.buffer_after[1] == unequal_1 + unequal_2);
  CHECK(static_cast<double>(l.unequal.restored_mean) ==
        static_cast<double>(unequal_1 + unequal_2) / 16384.0);
  CHECK(l.unequal.expected_mean == (3 * 1e-8 + 1 * 2e-8) / 4);
  CHECK(l.unequal.restored_mean == Approx(1.25e-8).epsilon(1e-3));
  CHECK(l.unequal.naive_mean_of_means == (1e-8 + 2e-8) / 2);
  CHECK(l.unequal.naive_mean_of_means == Approx(1.5e-8).epsilon(1e-12));
  // The weighted restoration is much closer to the sample mean than the naive average is.
  CHECK(std::fabs(l.unequal.restored_mean - 1.25e-8) < 0.01 * std::fabs(1.5e-8 - 1.25e-8));

  CHECK_FALSE(l.update_inside_window_error.empty());

  const nlohmann::json j = accumulation_json(l);
  CHECK(j.at("restored_mean").get<double>() == static_cast<double>(l.equal.restored_mean));
  CHECK(j.at("unequal_restored_mean").get<double>() ==
        static_cast<double>(l.unequal.restored_mean));
  CHECK(j.at("unequal_expected_mean").get<double>() == l.unequal.expected_mean);
  CHECK(j.at("naive_mean_of_means").get<double>() == l.unequal.naive_mean_of_means);
  CHECK(j.at("update_inside_window_error") == l.update_inside_window_error);
  const std::string text = accumulation_text(l);
  CHECK(contains_phrase(text, exact_text(l.unequal.restored_mean)));
  CHECK(contains_phrase(text, l.update_inside_window_error));
}

// ---- distributed ------------------------------------------------------------------------------

TEST_CASE("explain distributed: without agreement the ranks part ways", "[apps][explain]") {
  const DistributedLesson l = run_distributed_lesson();
  const DistributedRun& run = l.without_agreement;
  REQUIRE(run.steps.size() == 3);
  const float lr = static_cast<float>(0.01);

  // Step 1 at S = 8192: rank 0's 8192 * 0.5 = 4096 fits FP16, rank 1's 8192 * 10 = 81920
  // rounds to inf; each rank decides from its own gradient.
  const DistributedStep& first = run.steps[0];
  REQUIRE(first.ranks.size() == 2);
  const RankStep& r0 = first.ranks[0];
  const RankStep& r1 = first.ranks[1];
  CHECK(float_to_half_bits(8192.0f * 10.0f) == 0x7C00);
  CHECK(r0.scale == 8192.0);
  CHECK(r0.own_grad == fp16(8192.0f * 0.5f));
  CHECK(r0.seen_grad == 4096.0f);
  CHECK_FALSE(r0.skipped);
  CHECK(r0.w_after == 1.0f - lr * 0.5f);
  CHECK(r0.next_scale == 8192.0);
  CHECK(r0.scale_event == "kept");
  CHECK(std::isinf(r1.own_grad));
  CHECK(std::isinf(r1.seen_grad));
  CHECK(r1.skipped);
  CHECK_FALSE(r1.reason.empty());
  CHECK(r1.w_after == 1.0f);
  CHECK(r1.next_scale == 4096.0);
  CHECK(r1.scale_event == "backed_off");
  CHECK_FALSE(first.weights_equal);
  CHECK_FALSE(first.scales_equal);

  // The same microbatches again: both ranks now step, but from different weights and scales,
  // and they never meet again.
  const DistributedStep& second = run.steps[1];
  CHECK(second.ranks[1].scale == 4096.0);
  CHECK(second.ranks[1].own_grad == 40960.0f);
  CHECK_FALSE(second.ranks[0].skipped);
  CHECK_FALSE(second.ranks[1].skipped);
  CHECK(second.ranks[0].w_after == r0.w_after - lr * 0.5f);
  CHECK(second.ranks[1].w_after == 1.0f - lr * 10.0f);
  for (const DistributedStep& step : run.steps) {
    CHECK_FALSE(step.weights_equal);
    CHECK_FALSE(step.scales_equal);
    CHECK(step.ranks[0].w_after != step.ranks[1].w_after);
    CHECK(step.ranks[0].next_scale == 8192.0);
    CHECK(step.ranks[1].next_scale == 4096.0);
  }
  CHECK(run.steps[2].ranks[1].w_after == second.ranks[1].w_after - lr * 10.0f);
}

TEST_CASE("explain distributed: with agreement both ranks skip and halve", "[apps][explain]") {
  const DistributedLesson l = run_distributed_lesson();
  const DistributedRun& run = l.with_agreement;
  REQUIRE(run.steps.size() == 3);
  const float lr = static_cast<float>(0.01);

  // Step 1: the rank-ordered sum (+0 + 4096) + inf is inf on both ranks, and the MAX of the
  // flags (4096, inf) is inf: both skip, both halve S, both keep w = 1.
  const DistributedStep& first = run.steps[0];
  REQUIRE(first.ranks.size() == 2);
  CHECK(first.ranks[0].own_grad == 4096.0f);
  CHECK(std::isinf(first.ranks[1].own_grad));
  CHECK(first.ranks[0].own_flag == 4096.0f);
  CHECK(std::isinf(first.ranks[1].own_flag));
  CHECK(std::isinf(first.agreed_flag));
  for (const RankStep& rs : first.ranks) {
    CHECK(std::isinf(rs.seen_grad));
    CHECK(rs.skipped);
    CHECK(rs.w_after == 1.0f);
    CHECK(rs.next_scale == 8192.0 * 0.5);
    CHECK(rs.scale_event == "backed_off");
  }
  CHECK(first.weights_equal);
  CHECK(first.scales_equal);

  // Step 2 at S = 4096: 2048 + 40960 = 43008 on both ranks, unscaled 10.5.
  const DistributedStep& second = run.steps[1];
  CHECK(second.ranks[0].own_grad == 2048.0f);
  CHECK(second.ranks[1].own_grad == 40960.0f);
  CHECK(second.agreed_flag == 40960.0f);
  for (const RankStep& rs : second.ranks) {
    CHECK(rs.seen_grad == 43008.0f);
    CHECK_FALSE(rs.skipped);
    CHECK(rs.w_after == 1.0f - lr * 10.5f);
    CHECK(rs.next_scale == 4096.0);
  }
  for (const DistributedStep& step : run.steps) {
    CHECK(step.weights_equal);
    CHECK(step.scales_equal);
  }
  CHECK(run.steps[2].ranks[0].w_after == second.ranks[0].w_after - lr * 10.5f);
}

TEST_CASE("explain distributed: a NaN on one rank wins the flag and the sum", "[apps][explain]") {
  DistributedSetup setup;
  setup.rank_grads = {std::numeric_limits<double>::quiet_NaN(), 0.5, 0.25};
  setup.steps = 1;
  const DistributedLesson l = run_distributed_lesson(setup);
  const DistributedStep& with = l.with_agreement.steps[0];
  CHECK(std::isnan(with.agreed_flag));
  for (const RankStep& rs : with.ranks) {
    CHECK(std::isnan(rs.seen_grad));
    CHECK(rs.skipped);
    CHECK(rs.next_scale == 4096.0);
  }
  const DistributedStep& without = l.without_agreement.steps[0];
  CHECK(without.ranks[0].skipped);
  CHECK_FALSE(without.ranks[1].skipped);
  CHECK_FALSE(without.ranks[2].skipped);
  CHECK_THROWS_WITH(run_distributed_lesson(DistributedSetup{{1.0}}),
                    Catch::Contains("at least two ranks"));
}

TEST_CASE("explain distributed: text and JSON carry both scenarios", "[apps][explain]") {
  const DistributedLesson l = run_distributed_lesson();
  const nlohmann::json j = distributed_json(l);
  CHECK(j.at("rank_grads") == nlohmann::json({0.5, 10.0}));
  CHECK(j.at("init_scale").get<double>() == 8192.0);
  CHECK(j.at("fp16_max").get<double>() == 65504.0);
  const nlohmann::json& without = j.at("without_agreement");
  const nlohmann::json& with = j.at("with_agreement");
  CHECK(without.at("agreement") == false);
  CHECK(with.at("agreement") == true);
  REQUIRE(without.at("per_step").size() == 3);
  REQUIRE(with.at("per_step").size() == 3);
  const nlohmann::json& apart = without.at("per_step")[0];
  CHECK(apart.at("weights_equal") == false);
  CHECK(apart.at("scales_equal") == false);
  CHECK_FALSE(apart.contains("agreed_flag"));
  CHECK(apart.at("ranks")[0].at("skipped") == false);
  CHECK(apart.at("ranks")[0].at("w_after").get<double>() ==
        static_cast<double>(l.without_agreement.steps[0].ranks[0].w_after));
  CHECK(apart.at("ranks")[1].at("own_grad") == "inf");
  CHECK(apart.at("ranks")[1].at("skipped") == true);
  CHECK(apart.at("ranks")[1].at("next_scale").get<double>() == 4096.0);
  const nlohmann::json& together = with.at("per_step")[0];
  CHECK(together.at("agreed_flag") == "inf");
  CHECK(together.at("weights_equal") == true);
  for (const nlohmann::json& rank : together.at("ranks")) {
    CHECK(rank.at("seen_grad") == "inf");
    CHECK(rank.at("skipped") == true);
    CHECK(rank.at("w_after").get<double>() == 1.0);
    CHECK(rank.at("next_scale").get<double>() == 4096.0);
  }
  CHECK(j.at("steps").size() == 3);

  const std::string text = distributed_text(l);
  INFO(text);
  CHECK(contains_phrase(text, "rank 1: 8192 * 10 = 81920 -> inf"));
  CHECK(contains_phrase(text, "rank 0 stepped (kept, S 8192 -> 8192), rank 1 skipped "
                              "(backed_off, S 8192 -> 4096)"));
  CHECK(contains_phrase(text, "w = " + exact_text(l.without_agreement.steps[0].ranks[0].w_after) +
                                  " on rank 0, 1 on rank 1; S = 8192 on rank 0, 4096 on rank 1"));
  CHECK(contains_phrase(text, "the agreed flag is max(4096, inf) = inf: rank 0 skipped "
                              "(backed_off, S 8192 -> 4096), rank 1 skipped"));
  CHECK(contains_phrase(text, "bit for bit"));
  // The tables keep their columns: rank 1's skipped row in the first table.
  CHECK(text.find("\n  1     1     8192    inf       skipped  1                    4096\n") !=
        std::string::npos);
}

// ---- policies ---------------------------------------------------------------------------------

namespace {

// The columns of a trace, for comparing against sequences derived by hand.
std::vector<double> scales_of(const PolicyTrace& t) {
  std::vector<double> out;
  for (const PolicyStep& s : t.steps) out.push_back(s.scale);
  return out;
}
std::vector<std::string> events_of(const PolicyTrace& t) {
  std::vector<std::string> out;
  for (const PolicyStep& s : t.steps) out.push_back(s.event);
  return out;
}
std::vector<double> next_scales_of(const PolicyTrace& t) {
  std::vector<double> out;
  for (const PolicyStep& s : t.steps) out.push_back(s.next_scale);
  return out;
}
std::vector<int> trackers_of(const PolicyTrace& t) {
  std::vector<int> out;
  for (const PolicyStep& s : t.steps) out.push_back(s.growth_tracker);
  return out;
}
std::vector<int> hysteresis_of(const PolicyTrace& t) {
  std::vector<int> out;
  for (const PolicyStep& s : t.steps) out.push_back(s.hysteresis_left);
  return out;
}

}  // namespace

TEST_CASE("explain policies: each policy's trace over the scripted overflows", "[apps][explain]") {
  const PoliciesLesson l = run_policies_lesson();
  // Steps:        1   2   3    4   5    6   7   8   9    10   11  12  13
  // overflow:     ok  ok  OVF  ok  OVF  ok  ok  ok  OVF  OVF  ok  ok  ok
  const std::vector<bool> sequence{false, false, true,  false, true,  false, false,
                                   false, true,  true,  false, false, false};
  REQUIRE(l.setup.sequence == sequence);
  const std::string K = "kept", G = "grew", B = "backed_off", T = "overflow_tolerated",
                    F = "overflow_at_floor";

  // NoLossScale and StaticLossScale never move S; an overflow is absorbed (tolerated), a
  // finite step keeps S, and neither has a tracker or hysteresis.
  const std::vector<std::string> fixed_events{K, K, T, K, T, K, K, K, T, T, K, K, K};
  CHECK(scales_of(l.none) == std::vector<double>(13, 1.0));
  CHECK(next_scales_of(l.none) == std::vector<double>(13, 1.0));
  CHECK(events_of(l.none) == fixed_events);
  CHECK(scales_of(l.static_scale) == std::vector<double>(13, 1024.0));
  CHECK(next_scales_of(l.static_scale) == std::vector<double>(13, 1024.0));
  CHECK(events_of(l.static_scale) == fixed_events);
  CHECK(trackers_of(l.static_scale) == std::vector<int>(13, 0));
  CHECK(hysteresis_of(l.static_scale) == std::vector<int>(13, 0));

  // Hysteresis 1, interval 3: each overflow halves S and zeroes the tracker; the third finite
  // step in a row doubles S and zeroes it.
  CHECK(scales_of(l.dynamic) ==
        std::vector<double>{1024, 1024, 1024, 512, 512, 256, 256, 256, 512, 256, 128, 128, 128});
  CHECK(events_of(l.dynamic) == std::vector<std::string>{K, K, B, K, B, K, K, G, B, B, K, K, G});
  CHECK(next_scales_of(l.dynamic) ==
        std::vector<double>{1024, 1024, 512, 512, 256, 256, 256, 512, 256, 128, 128, 128, 256});
  CHECK(trackers_of(l.dynamic) == std::vector<int>{1, 2, 0, 1, 0, 1, 2, 0, 0, 0, 1, 2, 0});
  CHECK(hysteresis_of(l.dynamic) == std::vector<int>(13, 1));

  // Hysteresis 2, refilled only on growth: step 3 spends the spare overflow, step 5 (with
  // hysteresis_left 1) backs off, the growth at step 8 refills it, step 9 spends it again and
  // step 10 backs off. A backoff leaves hysteresis_left at 1.
  const PolicyTrace& r = l.reset_on_growth;
  CHECK(scales_of(r) ==
        std::vector<double>{1024, 1024, 1024, 1024, 1024, 512, 512, 512, 1024, 1024, 512, 512,
                            512});
  CHECK(events_of(r) == std::vector<std::string>{K, K, T, K, B, K, K, G, T, B, K, K, G});
  CHECK(next_scales_of(r) ==
        std::vector<double>{1024, 1024, 1024, 1024, 512, 512, 512, 1024, 1024, 512, 512, 512,
                            1024});
  CHECK(trackers_of(r) == std::vector<int>{1, 2, 0, 1, 0, 1, 2, 0, 0, 0, 1, 2, 0});
  CHECK(hysteresis_of(r) == std::vector<int>{2, 2, 1, 1, 1, 1, 1, 2, 1, 1, 1, 1, 2});

  // Hysteresis 2, refilled by every finite step: the separated overflows at 3 and 5 are both
  // tolerated, so S keeps growing at step 8; only the run 9-10 backs off, at its second step.
  const PolicyTrace& c = l.consecutive;
  CHECK(scales_of(c) ==
        std::vector<double>{1024, 1024, 1024, 1024, 1024, 1024, 1024, 1024, 2048, 2048, 1024,
                            1024, 1024});
  CHECK(events_of(c) == std::vector<std::string>{K, K, T, K, T, K, K, G, T, B, K, K, G});
  CHECK(next_scales_of(c) ==
        std::vector<double>{1024, 1024, 1024, 1024, 1024, 1024, 1024, 2048, 2048, 1024, 1024,
                            1024, 2048});
  CHECK(trackers_of(c) == std::vector<int>{1, 2, 0, 1, 0, 1, 2, 0, 0, 0, 1, 2, 0});
  CHECK(hysteresis_of(c) == std::vector<int>{2, 2, 1, 2, 1, 2, 2, 2, 1, 1, 2, 2, 2});

  // init 2, min 1, max 4, interval 3, over OVF OVF OVF then 9 finite steps: one backoff to the
  // floor, two overflows at the floor, growth to 2 and 4, then the growth to 8 is capped at 4,
  // so the twelfth step completes an interval but keeps S.
  const PolicyTrace& f = l.floor_ceiling;
  CHECK(scales_of(f) == std::vector<double>{2, 1, 1, 1, 1, 1, 2, 2, 2, 4, 4, 4});
  CHECK(events_of(f) == std::vector<std::string>{B, F, F, K, K, G, K, K, G, K, K, K});
  CHECK(next_scales_of(f) == std::vector<double>{1, 1, 1, 1, 1, 2, 2, 2, 4, 4, 4, 4});
  CHECK(trackers_of(f) == std::vector<int>{0, 0, 0, 1, 2, 0, 1, 2, 0, 1, 2, 0});
  CHECK(hysteresis_of(f) == std::vector<int>(12, 1));
}

TEST_CASE("explain policies: text and JSON carry the traces", "[apps][explain]") {
  const PoliciesLesson l = run_policies_lesson();
  const nlohmann::json j = policies_json(l);
  CHECK(j.at("sequence") == nlohmann::json(l.setup.sequence));
  for (const PolicyTrace* t : {&l.none, &l.static_scale, &l.dynamic, &l.reset_on_growth,
                               &l.consecutive, &l.floor_ceiling}) {
    INFO(t->name);
    REQUIRE(j.contains(t->name));
    const nlohmann::json& p = j.at(t->name);
    REQUIRE(p.at("scale").size() == t->steps.size());
    for (size_t i = 0; i < t->steps.size(); ++i) {
      CHECK(p.at("scale")[i].get<double>() == t->steps[i].scale);
      CHECK(p.at("event")[i] == t->steps[i].event);
      CHECK(p.at("next_scale")[i].get<double>() == t->steps[i].next_scale);
      CHECK(p.at("growth_tracker")[i].get<int>() == t->steps[i].growth_tracker);
      CHECK(p.at("hysteresis_left")[i].get<int>() == t->steps[i].hysteresis_left);
    }
  }
  CHECK(j.at("floor_and_ceiling").at("sequence") == nlohmann::json(l.setup.floor_sequence));

  const std::string text = policies_text(l);
  CHECK(contains_phrase(text, "ok ok OVF ok OVF ok ok ok OVF OVF ok ok ok"));
  // The consecutive trace's step 10: an overflow at S = 2048 backs off to 1024.
  CHECK(text.find("  10    OVF        2048    backed_off          1024    0               1\n") !=
        std::string::npos);
  CHECK(contains_phrase(text, l.consecutive.notice));
  CHECK(contains_phrase(l.consecutive.notice, "ends at 2048 where reset_on_growth ends at 1024"));
  CHECK(contains_phrase(l.floor_ceiling.notice, "at steps 2 and 3"));
  CHECK(contains_phrase(l.floor_ceiling.notice, "at step 12"));
}

// ---- registry and rendering -------------------------------------------------------------------

TEST_CASE("explain topics: the registry in reading order", "[apps][explain]") {
  std::vector<std::string> names;
  for (const Topic& topic : topics()) names.emplace_back(topic.name);
  CHECK(names == std::vector<std::string>{"formats", "underflow", "overflow", "clipping",
                                          "accumulation", "distributed", "policies", "all"});
  CHECK(lessons().size() == 7);
  CHECK(find_topic("clipping") != nullptr);
  CHECK(find_topic("colours") == nullptr);
  const nlohmann::json all = explain_all_json();
  CHECK(all.size() == 7);
  CHECK(all.at("distributed").at("with_agreement").at("per_step")[0].at("agreed_flag") == "inf");
  CHECK(all.at("underflow").at("fp16_scaled").get<double>() == 0.00016379356384277344);
}

TEST_CASE("explain rendering: wrap_text breaks lines at spaces", "[apps][explain]") {
  CHECK(wrap_text("aaa bbb ccc", 7) == "aaa bbb\nccc");
  CHECK(wrap_text("  aaa bbb ccc", 9) == "  aaa bbb\n    ccc");
  CHECK(wrap_text("one\n\ntwo three", 5) == "one\n\ntwo\nthree");
  CHECK(wrap_text("unbreakable-word x", 4) == "unbreakable-word\nx");
  for (const Topic& lesson : lessons()) {
    if (lesson.name == "formats") continue;  // a table, laid out by hand
    const std::string text = lesson.text();
    size_t longest = 0;
    for (size_t start = 0, end; start < text.size(); start = end + 1) {
      end = text.find('\n', start);
      if (end == std::string::npos) end = text.size();
      const std::string line = text.substr(start, end - start);
      if (line.find(' ') != std::string::npos) longest = std::max(longest, line.size());
    }
    INFO(lesson.name);
    CHECK(longest <= 96);
  }
}

TEST_CASE("explain rendering: exact, shortest and JSON numbers", "[apps][explain]") {
  CHECK(exact_text(0.9f) == "0.89999997615814209");
  CHECK(exact_text(std::ldexp(1.0, -24)) == "5.9604644775390625e-08");
  CHECK(shortest_text(0.1) == "0.1");
  CHECK(shortest_text(1e-8) == "1e-08");
  CHECK(shortest_text(16384.0) == "16384");
  CHECK(json_number(INFINITY) == "inf");
  CHECK(json_number(-INFINITY) == "-inf");
  CHECK(json_number(NAN) == "nan");
  CHECK(json_number(0.5).get<double>() == 0.5);
  CHECK(json_numbers({1.0f, INFINITY}) == LessonJson::array({1.0, "inf"}));
}
