// Bit-exact tensors inside JSON (optimizer buffers in state.json): {"dtype": "F32", "shape":
// [..], "data": "<base64 of the little-endian bytes>"}.
#pragma once

#include <nlohmann/json.hpp>

#include "core/tensor.h"

namespace mixprec {

nlohmann::json tensor_to_json(const Tensor& tensor);
// Throws mixprec::Error naming `what` when a field is missing or of the wrong type, the
// dtype is unknown, the base64 is malformed, or the byte count does not match the shape.
Tensor tensor_from_json(const nlohmann::json& value, const std::string& what);

}  // namespace mixprec
