// Fuzzes the safetensors reader (apps/checkpoint/safetensors.h) with the bytes of a file. A
// corrupt file must give a mixprec::Error; anything else (a crash, a sanitizer report, another
// exception such as one of nlohmann::json's type errors, an allocation past -rss_limit_mb) is
// a bug.
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <span>

#include "apps/checkpoint/safetensors.h"
#include "core/error.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  try {
    const mixprec::SafetensorsFile file =
        mixprec::read_safetensors(std::span<const uint8_t>(data, size), "fuzz.safetensors");
    // The tensors' data comes from the file, so it cannot be larger than the file.
    size_t total = 0;
    for (const auto& [name, tensor] : file.tensors) {
      if (!tensor.defined()) {
        std::fprintf(stderr, "read_safetensors: tensor '%s' is undefined\n", name.c_str());
        std::abort();
      }
      total += tensor.nbytes();
    }
    if (total > size) {
      std::fprintf(stderr, "read_safetensors: %zu bytes of tensors from a %zu-byte file\n", total,
                   size);
      std::abort();
    }
  } catch (const mixprec::Error&) {
  }
  return 0;
}
