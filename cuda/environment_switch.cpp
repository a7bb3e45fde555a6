// The environment-driven switch (contract in environment_switch.h).
#include "cuda/environment_switch.h"

#include <cstdlib>
#include <string_view>

#include "core/error.h"

namespace mixprec {

bool EnvironmentSwitch::from_environment() const {
  const char* text = std::getenv(variable_);
  if (text == nullptr) return false;
  const std::string_view value(text);
  if (value == "1") return true;
  if (value == "0") return false;
  MIXPREC_FAIL("environment variable ", variable_, "=\"", value, "\" is not a valid value: use 1 (",
               on_meaning_, ") or 0 / unset (", off_meaning_, ")");
}

bool EnvironmentSwitch::enabled() {
  int state = state_.load(std::memory_order_acquire);
  if (state == kUnread) {
    // Throws, leaving the switch unread, for a bad value: every query reports it until the
    // variable is fixed or the switch is set.
    const int from_env = from_environment() ? kOn : kOff;
    // A concurrent set() wins over the environment.
    state = kUnread;
    if (!state_.compare_exchange_strong(state, from_env, std::memory_order_acq_rel))
      return state == kOn;
    state = from_env;
  }
  return state == kOn;
}

void EnvironmentSwitch::set(bool on) { state_.store(on ? kOn : kOff, std::memory_order_release); }

}  // namespace mixprec
