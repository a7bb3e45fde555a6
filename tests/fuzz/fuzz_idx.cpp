// Fuzzes the IDX readers (apps/data/idx_file.h) with the bytes of a file, raw or gzip: the same
// bytes go to the image reader and to the label reader. A corrupt file must give a
// mixprec::Error; anything else (a crash, a sanitizer report, another exception, an
// allocation past -rss_limit_mb) is a bug.
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <span>

#include "apps/data/idx_file.h"
#include "core/error.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::span<const uint8_t> bytes(data, size);
  try {
    const mixprec::IdxImages images = mixprec::read_idx_images(bytes, "fuzz.idx");
    // A successful read holds exactly what its header announces.
    const uint64_t expected = static_cast<uint64_t>(images.count) * images.rows * images.cols;
    if (images.count < 1 || images.rows < 1 || images.cols < 1 ||
        images.pixels.size() != expected) {
      std::fprintf(stderr, "read_idx_images: %lld images of %lldx%lld but %zu pixels\n",
                   static_cast<long long>(images.count), static_cast<long long>(images.rows),
                   static_cast<long long>(images.cols), images.pixels.size());
      std::abort();
    }
  } catch (const mixprec::Error&) {
  }
  try {
    const std::vector<uint8_t> labels = mixprec::read_idx_labels(bytes, "fuzz.idx");
    if (labels.empty()) {
      std::fprintf(stderr, "read_idx_labels: no labels and no error\n");
      std::abort();
    }
  } catch (const mixprec::Error&) {
  }
  return 0;
}
