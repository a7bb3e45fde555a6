// safetensors files (https://huggingface.co/docs/safetensors): an 8-byte little-endian header
// length, a JSON header {"name": {"dtype", "shape", "data_offsets": [begin, end]}, ...,
// "__metadata__": {string: string}}, then the raw little-endian bytes. torch and the
// `safetensors` package read what is written here.
#pragma once

#include <cstdint>
#include <map>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "core/tensor.h"

namespace mixprec {

struct SafetensorsFile {
  std::map<std::string, Tensor> tensors;  // on the CPU, in the stored dtype
  std::map<std::string, std::string> metadata;
};

// Writes F32, F16, BF16 and I32 tensors (any device; copied to the host) in the given order.
// A 0-dim tensor is stored with shape []. Throws for duplicate names. Writes to a temporary
// file in the same folder, fsyncs it, then renames it over `path`, so a reader never sees a
// half-written file.
void write_safetensors(const std::string& path,
                       const std::vector<std::pair<std::string, Tensor>>& tensors,
                       const std::map<std::string, std::string>& metadata = {});

// Reads a file written by anyone. Throws mixprec::Error naming the path and the problem:
// missing file, shorter than 8 bytes, header length beyond the file, header not JSON or not
// an object, an entry without dtype/shape/data_offsets, an unsupported dtype (F32, F16, BF16,
// I32 and I64 are read; I64 is narrowed to I32 and must fit), offsets that are out of order,
// overlap, leave gaps, or do not match shape x dtype size, data past the end of the file.
SafetensorsFile read_safetensors(const std::string& path);
// The same from a file's whole content in memory, with the same checks; `name` stands for the
// path in messages.
SafetensorsFile read_safetensors(std::span<const uint8_t> bytes, const std::string& name);

}  // namespace mixprec
