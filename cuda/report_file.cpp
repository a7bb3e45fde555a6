#include "cuda/report_file.h"

#include <cstdio>

namespace mixprec {

void write_report_file(const char* variable, const std::string& path, const std::string& text) {
  if (path == "-") {
    std::fputs(text.c_str(), stderr);
    return;
  }
  if (std::FILE* file = std::fopen(path.c_str(), "w")) {
    std::fputs(text.c_str(), file);
    std::fclose(file);
  } else {
    std::fprintf(stderr, "%s: cannot write %s\n", variable, path.c_str());
  }
}

}  // namespace mixprec
