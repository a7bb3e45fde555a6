// A process-wide on/off switch whose starting value comes from an environment variable: the
// autotuners' switches (cuda/autotune.h) and the convolutions' choice of non-deterministic
// algorithms (cuda/conv_autotune.h). No CUDA headers.
//
// The variable is read on the first call of enabled() unless set() came first: "1" on, "0"
// or unset off; any other value makes that call (and every later one, until set()) throw
// mixprec::Error naming the variable, its value and what 1 and 0 mean (`on_meaning`,
// `off_meaning`). Thread-safe. Objects of static storage duration only (the strings are not
// copied).
#pragma once

#include <atomic>

namespace mixprec {

class EnvironmentSwitch {
 public:
  constexpr EnvironmentSwitch(const char* variable, const char* on_meaning,
                              const char* off_meaning)
      : variable_(variable), on_meaning_(on_meaning), off_meaning_(off_meaning) {}
  EnvironmentSwitch(const EnvironmentSwitch&) = delete;
  EnvironmentSwitch& operator=(const EnvironmentSwitch&) = delete;

  bool enabled();
  // Sets the switch for the calls that follow; the environment is then no longer read.
  void set(bool on);
  // The value the environment variable gives, read now; throws as described above.
  bool from_environment() const;

 private:
  enum State : int { kUnread, kOff, kOn };
  const char* variable_;
  const char* on_meaning_;
  const char* off_meaning_;
  std::atomic<int> state_{kUnread};
};

// Sets a switch for one scope and puts the previous value back at its end (a benchmark or
// test that compares both settings).
class SwitchScope {
 public:
  SwitchScope(EnvironmentSwitch& on_off, bool on) : switch_(on_off), previous_(on_off.enabled()) {
    switch_.set(on);
  }
  ~SwitchScope() { switch_.set(previous_); }
  SwitchScope(const SwitchScope&) = delete;
  SwitchScope& operator=(const SwitchScope&) = delete;

 private:
  EnvironmentSwitch& switch_;
  bool previous_;
};

}  // namespace mixprec
