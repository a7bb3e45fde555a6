// The `mixprec explain` topics: a registry of lessons, each printable as text for a reader or
// as one JSON object for a program, and the number rendering they share.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "apps/explain/lesson_json.h"

namespace mixprec::explain {

struct Topic {
  std::string_view name;     // the subcommand: `mixprec explain <name>`
  std::string_view summary;  // one line, for --help
  std::string (*text)();     // the lesson for a reader
  LessonJson (*json)();  // the same lesson's results as one JSON object
};

// The lessons in reading order: formats, underflow, overflow, clipping, accumulation,
// distributed (which builds on overflow's skip and backoff), policies.
const std::vector<Topic>& lessons();
// Every topic the CLI offers: the lessons, then "all".
const std::vector<Topic>& topics();
// The topic called `name`, or nullptr.
const Topic* find_topic(std::string_view name);

// Every lesson's text, in order, separated by a blank line.
std::string explain_all();
// {"formats": {...}, "underflow": {...}, ...}: every lesson's JSON under its name.
LessonJson explain_all_json();

// ---- rendering shared by the lessons ------------------------------------------------------

// A stored FP32/FP16/BF16 value (widened to double) with 17 significant digits: enough to
// show every such value exactly, so the reader sees what the hardware holds
// ("0.00016379356384277344", "0.89999997615814209").
std::string exact_text(double value);
// The shortest decimal that reads back as the same double ("0.1", "1e-08"): for settings
// and for results computed in double, where 17 digits would only show binary noise.
std::string shortest_text(double value);
// `text` with each line broken at spaces to at most `width` columns where its words allow.
// Continuation lines of an indented line are indented two more columns; a word longer than
// the width stays whole.
std::string wrap_text(const std::string& text, size_t width = 96);
// A lesson as text: the title, underlined, then each step wrapped, one blank line apart.
std::string lesson_text(const std::string& title, const std::vector<std::string>& steps);
// A JSON number, or "inf" / "-inf" / "nan" as a string for a non-finite value (JSON has no
// number for them).
LessonJson json_number(double value);
LessonJson json_numbers(const std::vector<float>& values);

}  // namespace mixprec::explain
