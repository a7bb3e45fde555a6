#include "apps/explain/policies.h"

#include <utility>

#include "amp/dynamic_loss_scale.h"
#include "amp/no_loss_scale.h"
#include "amp/static_loss_scale.h"
#include "apps/explain/topics.h"
#include "core/error.h"

namespace mixprec::explain {
namespace {

std::vector<PolicyStep> trace(LossScalePolicy& policy, const std::vector<bool>& sequence) {
  std::vector<PolicyStep> steps;
  for (bool overflow : sequence) {
    PolicyStep s;
    s.overflow = overflow;
    s.scale = policy.scale();
    s.event = scale_event_name(policy.update(overflow).event);
    s.next_scale = policy.scale();
    s.growth_tracker = policy.growth_tracker();
    s.hysteresis_left = policy.hysteresis_left();
    steps.push_back(std::move(s));
  }
  return steps;
}

DynamicLossScaleOptions dynamic_options(const PoliciesSetup& setup, int hysteresis,
                                        HysteresisMode mode) {
  DynamicLossScaleOptions o;
  o.init_scale = setup.init_scale;
  o.growth_factor = setup.growth_factor;
  o.backoff_factor = setup.backoff_factor;
  o.growth_interval = setup.growth_interval;
  o.hysteresis = hysteresis;
  o.hysteresis_mode = mode;
  return o;
}

std::string dynamic_settings(const DynamicLossScaleOptions& o) {
  return "DynamicLossScale(init " + shortest_text(o.init_scale) + ", growth_interval " +
         std::to_string(o.growth_interval) + ", backoff " + shortest_text(o.backoff_factor) +
         ", growth " + shortest_text(o.growth_factor) + ", hysteresis " +
         std::to_string(o.hysteresis) +
         (o.hysteresis > 1 ? ", hysteresis_mode " + hysteresis_mode_name(o.hysteresis_mode)
                          : std::string()) +
         ", min_scale " + shortest_text(o.min_scale) + ", max_scale " +
         shortest_text(o.max_scale) + ")";
}

// The 1-based numbers of the steps whose event is `event`.
std::vector<size_t> steps_with(const PolicyTrace& t, const std::string& event) {
  std::vector<size_t> found;
  for (size_t i = 0; i < t.steps.size(); ++i) {
    if (t.steps[i].event == event) found.push_back(i + 1);
  }
  return found;
}

// "none", "3", "3 and 5", "2, 3 and 9".
std::string step_list(const std::vector<size_t>& steps) {
  if (steps.empty()) return "none";
  std::string text;
  for (size_t i = 0; i < steps.size(); ++i) {
    if (i > 0) text += i + 1 == steps.size() ? " and " : ", ";
    text += std::to_string(steps[i]);
  }
  return text;
}

size_t overflow_count(const PolicyTrace& t) {
  size_t count = 0;
  for (const PolicyStep& s : t.steps) count += s.overflow;
  return count;
}

double final_scale(const PolicyTrace& t) { return t.steps.back().next_scale; }

std::string none_notice(const PolicyTrace& t) {
  return "S stays " + shortest_text(final_scale(t)) + " and nothing is multiplied; the " +
         std::to_string(overflow_count(t)) + " non-finite steps (" +
         step_list(steps_with(t, "overflow_tolerated")) +
         ") are real Inf/NaN, skipped by GradScaler, and the policy has nothing to adjust.";
}

std::string static_notice(const PolicyTrace& t) {
  return "S stays " + shortest_text(final_scale(t)) + " through all " +
         std::to_string(overflow_count(t)) + " overflows (steps " +
         step_list(steps_with(t, "overflow_tolerated")) +
         "): each is skipped, and nothing makes the next step any less likely to overflow, so a "
         "static scale has to be chosen small enough by hand.";
}

std::string dynamic_notice(const PolicyTrace& t, int growth_interval) {
  return "Every overflow (steps " + step_list(steps_with(t, "backed_off")) +
         ") backs off at once and restarts the growth tracker, and S grows only after " +
         std::to_string(growth_interval) + " finite steps in a row (steps " +
         step_list(steps_with(t, "grew")) + "), ending at " + shortest_text(final_scale(t)) +
         ".";
}

std::string reset_notice(const PolicyTrace& t) {
  const std::vector<size_t> tolerated = steps_with(t, "overflow_tolerated");
  const std::vector<size_t> backed_off = steps_with(t, "backed_off");
  return "hysteresis_left is refilled only by a growth: the overflows at steps " +
         step_list(tolerated) + " are tolerated, but those at steps " + step_list(backed_off) +
         " find hysteresis_left at 1 and back off, even where finite steps came between; S "
         "ends at " + shortest_text(final_scale(t)) + ".";
}

std::string consecutive_notice(const PolicyTrace& t, const PolicyTrace& reset) {
  return "Every finite step refills hysteresis_left, so only a run of overflows backs off: "
         "steps " + step_list(steps_with(t, "overflow_tolerated")) +
         " are tolerated and only step " + step_list(steps_with(t, "backed_off")) +
         " backs off; S ends at " + shortest_text(final_scale(t)) + " where reset_on_growth "
         "ends at " + shortest_text(final_scale(reset)) + ".";
}

std::string floor_notice(const PolicyTrace& t, const PoliciesSetup& s) {
  std::vector<size_t> capped;
  for (size_t i = 0; i < t.steps.size(); ++i) {
    const PolicyStep& step = t.steps[i];
    if (!step.overflow && step.event == "kept" && step.growth_tracker == 0) capped.push_back(i + 1);
  }
  return "Backoff stops at min_scale " + shortest_text(s.floor_min_scale) + " (backed_off at "
         "step " + step_list(steps_with(t, "backed_off")) + "; at steps " +
         step_list(steps_with(t, "overflow_at_floor")) +
         " there is nothing lower, the event is overflow_at_floor and floor_policy decides "
         "whether to go on), and growth stops at max_scale " + shortest_text(s.floor_max_scale) +
         " (at step " + step_list(capped) +
         " the tracker completes an interval and restarts, but S is kept).";
}

std::string cell(const std::string& text, size_t width) {
  return text.size() >= width ? text : text + std::string(width - text.size(), ' ');
}

// One row per step; columns padded by hand, so the table is not passed through wrap_text.
std::string trace_table(const PolicyTrace& t) {
  std::string out =
      "  step  overflow?  S used  event               S next  growth tracker  hysteresis left\n";
  for (size_t i = 0; i < t.steps.size(); ++i) {
    const PolicyStep& s = t.steps[i];
    out += "  " + cell(std::to_string(i + 1), 6) + cell(s.overflow ? "OVF" : "ok", 11) +
           cell(shortest_text(s.scale), 8) + cell(s.event, 20) +
           cell(shortest_text(s.next_scale), 8) + cell(std::to_string(s.growth_tracker), 16) +
           std::to_string(s.hysteresis_left) + "\n";
  }
  return out;
}

std::string sequence_text(const std::vector<bool>& sequence) {
  std::string text;
  for (bool overflow : sequence) text += std::string(text.empty() ? "" : " ") + (overflow ? "OVF" : "ok");
  return text;
}

std::vector<const PolicyTrace*> traces(const PoliciesLesson& l) {
  return {&l.none, &l.static_scale, &l.dynamic, &l.reset_on_growth, &l.consecutive,
          &l.floor_ceiling};
}

std::string intro(const PoliciesLesson& l) {
  return "Each policy below is fed the same per-step overflow flags, as GradScaler::update "
         "passes them after unscaling (" + std::to_string(l.setup.sequence.size()) +
         " steps, OVF = a non-finite gradient):\n  " + sequence_text(l.setup.sequence) +
         "\nEach row shows S as the step used it, the event update() reported, and the "
         "policy's state after the update.";
}

std::string trace_heading(const PolicyTrace& t) { return t.name + ": " + t.settings; }

}  // namespace

PoliciesLesson run_policies_lesson(const PoliciesSetup& setup) {
  MIXPREC_CHECK(!setup.sequence.empty() && !setup.floor_sequence.empty(),
                "explain policies: the overflow sequences must not be empty");
  PoliciesLesson l;
  l.setup = setup;

  NoLossScale none;
  l.none = {"none", "NoLossScale", "", trace(none, setup.sequence)};
  l.none.notice = none_notice(l.none);

  StaticLossScale fixed(setup.init_scale);
  l.static_scale = {"static", "StaticLossScale(" + shortest_text(setup.init_scale) + ")", "",
                    trace(fixed, setup.sequence)};
  l.static_scale.notice = static_notice(l.static_scale);

  const DynamicLossScaleOptions plain = dynamic_options(setup, 1, HysteresisMode::ResetOnGrowth);
  DynamicLossScale dynamic(plain);
  l.dynamic = {"dynamic", dynamic_settings(plain), "", trace(dynamic, setup.sequence)};
  l.dynamic.notice = dynamic_notice(l.dynamic, setup.growth_interval);

  const DynamicLossScaleOptions reset =
      dynamic_options(setup, setup.hysteresis, HysteresisMode::ResetOnGrowth);
  DynamicLossScale reset_policy(reset);
  l.reset_on_growth = {"hysteresis_reset_on_growth", dynamic_settings(reset), "",
                       trace(reset_policy, setup.sequence)};
  l.reset_on_growth.notice = reset_notice(l.reset_on_growth);

  const DynamicLossScaleOptions consecutive =
      dynamic_options(setup, setup.hysteresis, HysteresisMode::Consecutive);
  DynamicLossScale consecutive_policy(consecutive);
  l.consecutive = {"hysteresis_consecutive", dynamic_settings(consecutive), "",
                   trace(consecutive_policy, setup.sequence)};
  l.consecutive.notice = consecutive_notice(l.consecutive, l.reset_on_growth);

  DynamicLossScaleOptions bounded = dynamic_options(setup, 1, HysteresisMode::ResetOnGrowth);
  bounded.init_scale = setup.floor_init_scale;
  bounded.min_scale = setup.floor_min_scale;
  bounded.max_scale = setup.floor_max_scale;
  DynamicLossScale bounded_policy(bounded);
  l.floor_ceiling = {"floor_and_ceiling", dynamic_settings(bounded), "",
                     trace(bounded_policy, setup.floor_sequence)};
  l.floor_ceiling.notice = floor_notice(l.floor_ceiling, setup);
  return l;
}

std::string policies_text(const PoliciesLesson& l) {
  std::string out = lesson_text("Loss-scale policies: how S moves", {intro(l)});
  // The blocks are laid out as lesson_text lays out its steps, but the tables keep their
  // column padding, which wrap_text would collapse.
  for (const PolicyTrace* t : traces(l)) {
    out += '\n';
    out += wrap_text(trace_heading(*t));
    out += '\n';
    if (t == &l.floor_ceiling) {
      out += wrap_text("  its own sequence: " + sequence_text(l.setup.floor_sequence));
      out += '\n';
    }
    out += trace_table(*t);
    out += wrap_text(t->notice);
    out += '\n';
  }
  return out;
}

LessonJson policies_json(const PoliciesLesson& l) {
  const auto booleans = [](const std::vector<bool>& flags) {
    LessonJson array = LessonJson::array();
    for (bool flag : flags) array.push_back(flag);
    return array;
  };
  LessonJson j = LessonJson::object();
  j["sequence"] = booleans(l.setup.sequence);
  std::vector<std::string> steps{intro(l)};
  for (const PolicyTrace* t : traces(l)) {
    LessonJson p = LessonJson::object();
    if (t == &l.floor_ceiling) p["sequence"] = booleans(l.setup.floor_sequence);
    p["settings"] = t->settings;
    LessonJson scale = LessonJson::array();
    LessonJson event = LessonJson::array();
    LessonJson next_scale = LessonJson::array();
    LessonJson growth_tracker = LessonJson::array();
    LessonJson hysteresis_left = LessonJson::array();
    for (const PolicyStep& s : t->steps) {
      scale.push_back(json_number(s.scale));
      event.push_back(s.event);
      next_scale.push_back(json_number(s.next_scale));
      growth_tracker.push_back(s.growth_tracker);
      hysteresis_left.push_back(s.hysteresis_left);
    }
    p["scale"] = std::move(scale);
    p["event"] = std::move(event);
    p["next_scale"] = std::move(next_scale);
    p["growth_tracker"] = std::move(growth_tracker);
    p["hysteresis_left"] = std::move(hysteresis_left);
    p["notice"] = t->notice;
    j[t->name] = std::move(p);
    steps.push_back(trace_heading(*t) + "\n" + trace_table(*t) + t->notice);
  }
  j["steps"] = std::move(steps);
  return j;
}

std::string explain_policies() { return policies_text(run_policies_lesson()); }
LessonJson explain_policies_json() { return policies_json(run_policies_lesson()); }

}  // namespace mixprec::explain
