#include "apps/explain/topics.h"

#include <charconv>
#include <cmath>
#include <cstdio>
#include <system_error>

#include "apps/explain/accumulation.h"
#include "apps/explain/clipping.h"
#include "apps/explain/distributed.h"
#include "apps/explain/formats.h"
#include "apps/explain/overflow.h"
#include "apps/explain/policies.h"
#include "apps/explain/underflow.h"

namespace mixprec::explain {
namespace {

constexpr std::string_view kAll = "all";

std::vector<Topic> make_topics() {
  return {
      {"formats", "FP32, FP16 and BF16: layout, range, precision, worked conversions",
       explain_formats, explain_formats_json},
      {"underflow", "A tiny gradient lost in FP16 backward, and saved by loss scaling",
       explain_underflow, explain_underflow_json},
      {"overflow", "A scaled gradient overflows FP16: skipped step, backoff, growth",
       explain_overflow, explain_overflow_json},
      {"clipping", "Why gradients are unscaled before clip_grad_norm", explain_clipping,
       explain_clipping_json},
      {"accumulation", "One loss scale per effective batch; count-weighted microbatches",
       explain_accumulation, explain_accumulation_json},
      {"distributed", "Two ranks, one overflow: why the ranks must agree to skip a step",
       explain_distributed, explain_distributed_json},
      {"policies", "How static, dynamic and hysteresis loss-scale policies move S",
       explain_policies, explain_policies_json},
      {kAll, "Every lesson above, in order", explain_all, explain_all_json},
  };
}

}  // namespace

const std::vector<Topic>& topics() {
  static const std::vector<Topic> all = make_topics();
  return all;
}

const std::vector<Topic>& lessons() {
  static const std::vector<Topic> lessons = [] {
    std::vector<Topic> list;
    for (const Topic& topic : topics()) {
      if (topic.name != kAll) list.push_back(topic);
    }
    return list;
  }();
  return lessons;
}

const Topic* find_topic(std::string_view name) {
  for (const Topic& topic : topics()) {
    if (topic.name == name) return &topic;
  }
  return nullptr;
}

std::string explain_all() {
  std::string out;
  for (const Topic& lesson : lessons()) {
    if (!out.empty()) out += "\n";
    out += lesson.text();
  }
  return out;
}

LessonJson explain_all_json() {
  LessonJson all = LessonJson::object();
  for (const Topic& lesson : lessons()) all[std::string(lesson.name)] = lesson.json();
  return all;
}

std::string exact_text(double value) {
  char text[40];
  std::snprintf(text, sizeof text, "%.17g", value);
  return text;
}

std::string shortest_text(double value) {
  if (!std::isfinite(value)) return exact_text(value);
  char text[40];
  const std::to_chars_result result = std::to_chars(text, text + sizeof text, value);
  return result.ec == std::errc() ? std::string(text, result.ptr) : exact_text(value);
}

std::string wrap_text(const std::string& text, size_t width) {
  std::string out;
  size_t start = 0;
  while (start <= text.size()) {
    size_t end = text.find('\n', start);
    const bool last = end == std::string::npos;
    if (last) end = text.size();
    const std::string line = text.substr(start, end - start);
    const size_t indent = line.find_first_not_of(' ');
    if (indent == std::string::npos) {
      out += line;
    } else {
      const std::string continuation(indent == 0 ? 0 : indent + 2, ' ');
      std::string current(indent, ' ');
      bool empty = true;
      size_t pos = indent;
      while (pos < line.size()) {
        size_t space = line.find(' ', pos);
        if (space == std::string::npos) space = line.size();
        const std::string word = line.substr(pos, space - pos);
        pos = space + 1;
        if (word.empty()) continue;
        if (!empty && current.size() + 1 + word.size() > width) {
          out += current + "\n";
          current = continuation;
          empty = true;
        }
        current += (empty ? "" : " ") + word;
        empty = false;
      }
      out += current;
    }
    if (last) break;
    out += "\n";
    start = end + 1;
  }
  return out;
}

LessonJson json_number(double value) {
  if (std::isnan(value)) return "nan";
  if (std::isinf(value)) return value > 0 ? "inf" : "-inf";
  return value;
}

LessonJson json_numbers(const std::vector<float>& values) {
  LessonJson array = LessonJson::array();
  for (float v : values) array.push_back(json_number(v));
  return array;
}

std::string lesson_text(const std::string& title, const std::vector<std::string>& steps) {
  std::string out = title + "\n" + std::string(title.size(), '=') + "\n";
  for (const std::string& step : steps) {
    out += '\n';
    out += wrap_text(step);
    out += '\n';
  }
  return out;
}

}  // namespace mixprec::explain
