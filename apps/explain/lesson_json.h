// The JSON type of the lessons' --json output.
#pragma once

#include <nlohmann/json.hpp>

namespace mixprec::explain {

// Lesson results keep their keys in the order the lesson computes them (topics in the order
// of `mixprec explain all`), which is the order a reader follows.
using LessonJson = nlohmann::ordered_json;

}  // namespace mixprec::explain
