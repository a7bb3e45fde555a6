// Bit-exact tensors inside JSON (optimizer buffers in state.json): {"dtype": "F32", "shape":
// [..], "data": "<base64 of the little-endian bytes>"}.
#pragma once

#include <string>

#include <nlohmann/json.hpp>

#include "core/tensor.h"

namespace mixprec {

nlohmann::json tensor_to_json(const Tensor& tensor);
// Throws mixprec::Error naming `what` when a field is missing or of the wrong type, the
// dtype is unknown, the base64 is malformed, or the byte count does not match the shape.
Tensor tensor_from_json(const nlohmann::json& value, const std::string& what);

// True when no array or object inside `value` lies more than `levels` levels deep (a number
// is 0 levels deep, [1] is 1, {"a": [1]} is 2). The recursion stops at `levels`, so asking
// about a value nested a million levels deep is safe; copying it (or dump()) is not.
bool json_nested_within(const nlohmann::json& value, int levels);

// `value` as it should appear in an error message: its JSON text, cut to 120 characters
// ("..." marks the cut), or "an array (an object) nested more than 16 levels deep" for a
// value that is.
// Unlike dump(), the recursion is bounded, so that a hostile file nested a million levels
// deep gives an error message, not a stack overflow.
std::string json_excerpt(const nlohmann::json& value);

}  // namespace mixprec
