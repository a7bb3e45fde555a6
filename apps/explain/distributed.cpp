#include "apps/explain/distributed.h"

#include <bit>
#include <cmath>
#include <cstdint>
#include <memory>
#include <utility>

#include "amp/dynamic_loss_scale.h"
#include "amp/grad_scaler.h"
#include "apps/explain/formats.h"
#include "apps/explain/topics.h"
#include "core/error.h"
#include "core/ops/ops.h"
#include "dist/reduction.h"
#include "layers/parameter.h"
#include "optim/sgd.h"

namespace mixprec::explain {
namespace {

// One simulated rank: its own copy of the model, optimizer and scaler, as a process of a
// data-parallel run has.
struct SimulatedRank {
  Parameter w;
  std::unique_ptr<SGD> sgd;
  GradScaler scaler;

  SimulatedRank(const DistributedSetup& s, const DynamicLossScaleOptions& scale_options)
      : w("w", Tensor::scalar(s.w_init)),
        scaler(std::make_unique<DynamicLossScale>(scale_options)) {
    w.set_working_dtype(DType::F16);
    SgdOptions sgd_options;
    sgd_options.lr = s.lr;
    sgd = std::make_unique<SGD>(std::vector<Parameter>{w}, sgd_options);
  }
};

// The largest magnitude in `values`, NaN winning: a non-finite result means some value was
// non-finite, the flag a rank would contribute to the MAX over ranks.
float overflow_flag(const std::vector<float>& values) {
  float flag = 0.0f;
  for (float v : values) flag = dist::max_nan_wins(flag, std::fabs(v));
  return flag;
}

DistributedRun run_scenario(const DistributedSetup& s, bool agreement) {
  DynamicLossScaleOptions scale_options;
  scale_options.init_scale = s.init_scale;
  scale_options.backoff_factor = s.backoff_factor;
  scale_options.growth_interval = s.growth_interval;
  std::vector<std::unique_ptr<SimulatedRank>> ranks;
  for (size_t r = 0; r < s.rank_grads.size(); ++r) {
    ranks.push_back(std::make_unique<SimulatedRank>(s, scale_options));
  }
  const int n = static_cast<int>(ranks.size());

  DistributedRun run;
  run.agreement = agreement;
  for (int step = 0; step < s.steps; ++step) {
    DistributedStep d;
    d.ranks.resize(ranks.size());
    std::vector<float> own(ranks.size());  // run r: rank r's buffer, as add_in_rank_order reads
    for (size_t r = 0; r < ranks.size(); ++r) {
      SimulatedRank& rank = *ranks[r];
      RankStep& rs = d.ranks[r];
      rs.scale = rank.scaler.scale_value();
      rank.sgd->zero_grad();
      const Tensor loss =
          ops::cast(ops::mul_scalar(rank.w.working(), s.rank_grads[r]), DType::F32);
      rank.scaler.scale(loss).backward();
      MIXPREC_CHECK(rank.w.grad().defined(),
                    "explain distributed: backward left no gradient on w");
      own[r] = static_cast<float>(rank.w.grad().item());
      rs.own_grad = own[r];
      rs.own_flag = overflow_flag(rank.w.grad().to_float_vector());
    }
    if (agreement) {
      // What GradientSync::reduce_gradients does before unscale: every rank's buffer becomes
      // the sum over ranks in rank order, so every rank's scaler checks the same bits.
      float sum = 0.0f;
      dist::add_in_rank_order(own.data(), n, 1, &sum);
      d.agreed_flag = 0.0f;
      for (const RankStep& rs : d.ranks) {
        d.agreed_flag = dist::max_nan_wins(d.agreed_flag, rs.own_flag);
      }
      for (const auto& rank : ranks) {
        Tensor grad = rank->w.grad();
        grad.copy_(Tensor::scalar(sum));
      }
    }
    for (size_t r = 0; r < ranks.size(); ++r) {
      SimulatedRank& rank = *ranks[r];
      RankStep& rs = d.ranks[r];
      rs.seen_grad = static_cast<float>(rank.w.grad().item());
      const StepResult result = rank.scaler.step(*rank.sgd);
      rs.skipped = result.skipped();
      rs.reason = result.reason;
      rs.w_after = static_cast<float>(rank.w.master().item());
      const StepTelemetry telemetry = rank.scaler.update();
      rs.next_scale = telemetry.next_scale;
      rs.scale_event = telemetry.scale_event;
      MIXPREC_CHECK(!agreement || rs.skipped == !std::isfinite(d.agreed_flag),
                    "explain distributed: rank ", r, "'s scaler ",
                    rs.skipped ? "skipped" : "stepped", " but the agreed flag is ",
                    exact_text(d.agreed_flag));
    }
    d.weights_equal = true;
    d.scales_equal = true;
    for (const RankStep& rs : d.ranks) {
      d.weights_equal = d.weights_equal && std::bit_cast<uint32_t>(rs.w_after) ==
                                               std::bit_cast<uint32_t>(d.ranks[0].w_after);
      d.scales_equal = d.scales_equal && rs.next_scale == d.ranks[0].next_scale;
    }
    run.steps.push_back(std::move(d));
  }
  return run;
}

std::string rank_cell(const std::string& text, size_t width) {
  return text.size() >= width ? text + " " : text + std::string(width - text.size(), ' ');
}

// One row per rank per step; columns padded by hand, so the table is not passed through
// wrap_text (which would collapse the padding).
std::string run_table(const DistributedRun& run) {
  std::string out = "  " + rank_cell("step", 6) + rank_cell("rank", 6) + rank_cell("S used", 8) +
                    rank_cell("own S*g", 10) + (run.agreement ? rank_cell("summed", 10) : "") +
                    rank_cell("outcome", 9) + rank_cell("w after", 21) + "S after\n";
  for (size_t i = 0; i < run.steps.size(); ++i) {
    for (size_t r = 0; r < run.steps[i].ranks.size(); ++r) {
      const RankStep& rs = run.steps[i].ranks[r];
      out += "  " + rank_cell(std::to_string(i + 1), 6) + rank_cell(std::to_string(r), 6) +
             rank_cell(shortest_text(rs.scale), 8) + rank_cell(shortest_text(rs.own_grad), 10) +
             (run.agreement ? rank_cell(shortest_text(rs.seen_grad), 10) : "") +
             rank_cell(rs.skipped ? "skipped" : "stepped", 9) +
             rank_cell(exact_text(rs.w_after), 21) +
             shortest_text(rs.next_scale) + "\n";
    }
  }
  return out;
}

// "w = a on rank 0, b on rank 1; S = c on rank 0, d on rank 1" after `step`.
std::string rank_state(const DistributedStep& step) {
  std::string w;
  std::string scale;
  for (size_t r = 0; r < step.ranks.size(); ++r) {
    const std::string sep = r == 0 ? "" : ", ";
    w += sep + exact_text(step.ranks[r].w_after) + " on rank " + std::to_string(r);
    scale += sep + shortest_text(step.ranks[r].next_scale) + " on rank " + std::to_string(r);
  }
  return "w = " + w + "; S = " + scale;
}

// "rank 0 stepped (S kept at 8192), rank 1 skipped (S 8192 -> 4096)".
std::string rank_outcomes(const DistributedStep& step) {
  std::string text;
  for (size_t r = 0; r < step.ranks.size(); ++r) {
    const RankStep& rs = step.ranks[r];
    text += (r == 0 ? "" : ", ") + std::string("rank ") + std::to_string(r) + " " +
            (rs.skipped ? "skipped" : "stepped") + " (" + rs.scale_event + ", S " +
            shortest_text(rs.scale) + " -> " + shortest_text(rs.next_scale) + ")";
  }
  return text;
}

bool ranks_agree(const DistributedStep& step) { return step.weights_equal && step.scales_equal; }

std::string setup_text(const DistributedLesson& l) {
  const DistributedSetup& s = l.setup;
  std::string grads;
  std::string overflow;
  for (size_t r = 0; r < s.rank_grads.size(); ++r) {
    grads += (r == 0 ? "" : ", ") + shortest_text(s.rank_grads[r]) + " on rank " +
             std::to_string(r);
    const RankStep& first = l.without_agreement.steps.front().ranks[r];
    overflow += (r == 0 ? "" : "; ") + std::string("rank ") + std::to_string(r) + ": " +
                shortest_text(first.scale) + " * " + shortest_text(s.rank_grads[r]) + " = " +
                shortest_text(first.scale * s.rank_grads[r]) + " -> " +
                exact_text(first.own_grad);
  }
  return std::to_string(s.rank_grads.size()) +
         " simulated ranks of a data-parallel run, each with its own copy of the same model: a "
         "parameter w (FP32 master " + exact_text(s.w_init) + ", FP16 working copy), its own "
         "GradScaler (DynamicLossScale: init " + shortest_text(s.init_scale) + ", backoff_factor " +
         shortest_text(s.backoff_factor) + ", growth_interval " +
         std::to_string(s.growth_interval) + ") and its own SGD (lr " + shortest_text(s.lr) +
         "). Each step every rank runs backward on its own microbatch, whose dL/dw is " + grads +
         " (each rank's share of the step's gradient). Backward stores S * dL/dw in FP16, where "
         "anything past " + exact_text(l.fp16_max) + " becomes inf; at step 1: " + overflow + ".";
}

std::string without_notice(const DistributedLesson& l) {
  const DistributedRun& run = l.without_agreement;
  size_t apart = run.steps.size();
  for (size_t i = 0; i < run.steps.size() && apart == run.steps.size(); ++i) {
    if (!ranks_agree(run.steps[i])) apart = i;
  }
  if (apart == run.steps.size()) {
    return "The ranks never saw different outcomes here, so they stayed together.";
  }
  bool stayed_apart = true;
  for (size_t i = apart; i < run.steps.size(); ++i) {
    stayed_apart = stayed_apart && !ranks_agree(run.steps[i]);
  }
  std::string text = "Step " + std::to_string(apart + 1) + ": " +
                     rank_outcomes(run.steps[apart]) + ". Now " + rank_state(run.steps[apart]) +
                     ".";
  if (stayed_apart && apart + 1 < run.steps.size()) {
    text += " Nothing brings them back: after step " + std::to_string(run.steps.size()) +
            ", " + rank_state(run.steps.back()) +
            ". From the skipped step on, the ranks train different models, and every later "
            "sum of their gradients mixes gradients taken at different weights.";
  }
  return text;
}

std::string with_notice(const DistributedLesson& l) {
  const DistributedRun& run = l.with_agreement;
  const DistributedStep& first = run.steps.front();
  std::string flags;
  for (const RankStep& rs : first.ranks) {
    flags += (flags.empty() ? "" : ", ") + shortest_text(rs.own_flag);
  }
  std::string text = "Step 1: every rank's buffer holds the sum " +
                     shortest_text(first.ranks.front().seen_grad) +
                     " and the agreed flag is max(" + flags + ") = " +
                     shortest_text(first.agreed_flag) + ": " + rank_outcomes(first) + ".";
  bool together = true;
  for (const DistributedStep& step : run.steps) together = together && ranks_agree(step);
  const DistributedStep& last = run.steps.back();
  if (together) {
    text += " After every step the ranks hold the same w and S, bit for bit (after step " +
            std::to_string(run.steps.size()) + ": w = " + exact_text(last.ranks[0].w_after) +
            ", S = " + shortest_text(last.ranks[0].next_scale) + ").";
  } else {
    text += " The ranks still part ways: after step " + std::to_string(run.steps.size()) +
            ", " + rank_state(last) + ".";
  }
  return text;
}

const char* kWithoutHeading =
    "Without agreement: each rank unscales, steps and updates from its own gradient.";
const char* kWithHeading =
    "With agreement: before unscale, every rank's gradient buffer becomes the rank-ordered sum "
    "((+0 + g_0) + g_1) + ... over the ranks, as the trainer's GradientSync does "
    "(dist::add_in_rank_order, the arithmetic of Communicator::sum_in_rank_order), so an inf "
    "on one rank is an inf on all. The ranks' overflow flags (each its largest |gradient|), "
    "reduced with the MAX in which NaN and Inf win (dist::max_nan_wins, the arithmetic of "
    "Communicator::max), give the same verdict where gradients are not summed; here every "
    "rank's decision is checked against it.";

std::string distributed_title() { return "Data parallelism: the ranks agree on a skipped step"; }

}  // namespace

DistributedLesson run_distributed_lesson(const DistributedSetup& setup) {
  MIXPREC_CHECK(setup.rank_grads.size() >= 2, "explain distributed: needs at least two ranks, "
                "got ", setup.rank_grads.size());
  MIXPREC_CHECK(setup.steps >= 1 && setup.steps <= 100,
                "explain distributed: steps must be in [1, 100], got ", setup.steps);
  DistributedLesson l;
  l.setup = setup;
  l.fp16_max = format_landmarks(fp16_format()).largest_finite;
  l.without_agreement = run_scenario(setup, false);
  l.with_agreement = run_scenario(setup, true);
  return l;
}

std::string distributed_text(const DistributedLesson& l) {
  std::string out = lesson_text(distributed_title(), {setup_text(l)});
  // Laid out as lesson_text lays out its steps, but the tables keep their column padding.
  for (const DistributedRun* run : {&l.without_agreement, &l.with_agreement}) {
    out += '\n';
    out += wrap_text(run->agreement ? kWithHeading : kWithoutHeading);
    out += '\n';
    out += run_table(*run);
    out += wrap_text(run->agreement ? with_notice(l) : without_notice(l));
    out += '\n';
  }
  return out;
}

LessonJson distributed_json(const DistributedLesson& l) {
  LessonJson j = LessonJson::object();
  LessonJson grads = LessonJson::array();
  for (double g : l.setup.rank_grads) grads.push_back(json_number(g));
  j["rank_grads"] = std::move(grads);
  j["w_init"] = json_number(l.setup.w_init);
  j["lr"] = json_number(l.setup.lr);
  j["init_scale"] = json_number(l.setup.init_scale);
  j["fp16_max"] = json_number(l.fp16_max);
  for (const DistributedRun* run : {&l.without_agreement, &l.with_agreement}) {
    LessonJson per_step = LessonJson::array();
    for (size_t i = 0; i < run->steps.size(); ++i) {
      const DistributedStep& d = run->steps[i];
      LessonJson step = LessonJson::object();
      step["step"] = i + 1;
      if (run->agreement) step["agreed_flag"] = json_number(d.agreed_flag);
      step["weights_equal"] = d.weights_equal;
      step["scales_equal"] = d.scales_equal;
      LessonJson ranks = LessonJson::array();
      for (size_t r = 0; r < d.ranks.size(); ++r) {
        const RankStep& rs = d.ranks[r];
        ranks.push_back({{"rank", r},
                         {"scale", json_number(rs.scale)},
                         {"own_grad", json_number(rs.own_grad)},
                         {"seen_grad", json_number(rs.seen_grad)},
                         {"own_flag", json_number(rs.own_flag)},
                         {"skipped", rs.skipped},
                         {"reason", rs.reason},
                         {"w_after", json_number(rs.w_after)},
                         {"next_scale", json_number(rs.next_scale)},
                         {"scale_event", rs.scale_event}});
      }
      step["ranks"] = std::move(ranks);
      per_step.push_back(std::move(step));
    }
    j[run->agreement ? "with_agreement" : "without_agreement"] = {
        {"agreement", run->agreement}, {"per_step", std::move(per_step)}};
  }
  j["steps"] = std::vector<std::string>{
      setup_text(l), kWithoutHeading + std::string("\n") + run_table(l.without_agreement) +
                         without_notice(l),
      kWithHeading + std::string("\n") + run_table(l.with_agreement) + with_notice(l)};
  return j;
}

std::string explain_distributed() { return distributed_text(run_distributed_lesson()); }
LessonJson explain_distributed_json() { return distributed_json(run_distributed_lesson()); }

}  // namespace mixprec::explain
