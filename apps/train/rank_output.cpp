#include "apps/train/rank_output.h"

#include <atomic>
#include <cstdlib>

namespace mixprec {
namespace {

std::atomic<bool> set_up{false};

}  // namespace

int launcher_rank() {
  for (const char* name : {"OMPI_COMM_WORLD_RANK", "PMIX_RANK"}) {
    const char* value = std::getenv(name);
    if (value != nullptr && *value != '\0') return std::atoi(value);
  }
  return 0;
}

int launcher_size() {
  const char* value = std::getenv("OMPI_COMM_WORLD_SIZE");
  return value != nullptr && std::atoi(value) > 0 ? std::atoi(value) : 1;
}

void mark_setup_done() { set_up = true; }

bool setup_done() { return set_up; }

bool reports_errors() { return launcher_rank() == 0 || set_up; }

std::string error_prefix() {
  const int rank = launcher_rank();
  return rank == 0 ? std::string() : "rank " + std::to_string(rank) + ": ";
}

}  // namespace mixprec
