#include "core/math_mode.h"

#include <atomic>

namespace mixprec {
namespace {
std::atomic<bool> g_tf32_allowed{false};
}  // namespace

bool tf32_allowed() { return g_tf32_allowed.load(std::memory_order_relaxed); }
void set_tf32_allowed(bool allowed) { g_tf32_allowed.store(allowed, std::memory_order_relaxed); }

}  // namespace mixprec
