#include "cuda/report_file.h"

#include <cstdio>

namespace mixprec {

void write_report_file(const char* variable, const std::string& path, const std::string& text) {
  if (path == "-") {
    std::fputs(text.c_str(), stderr);
    return;
  }
  std::FILE* file = std::fopen(path.c_str(), "w");
  bool written = file != nullptr;
  if (file != nullptr) {
    written = std::fputs(text.c_str(), file) >= 0;
    written = std::fclose(file) == 0 && written;  // a full disk may show only at the close
  }
  if (!written) std::fprintf(stderr, "%s: cannot write %s\n", variable, path.c_str());
}

}  // namespace mixprec
