// Sets (or with null, unsets) one environment variable for a scope and puts its previous
// value (or its absence) back at the end: the autotune switches' tests.
#pragma once

#include <cstdlib>
#include <optional>
#include <string>

namespace mixprec::cuda_test {

class EnvironmentScope {
 public:
  EnvironmentScope(const char* name, const char* value) : name_(name) {
    if (const char* old = std::getenv(name)) saved_ = old;
    apply(value);
  }
  ~EnvironmentScope() { apply(saved_ ? saved_->c_str() : nullptr); }
  EnvironmentScope(const EnvironmentScope&) = delete;
  EnvironmentScope& operator=(const EnvironmentScope&) = delete;

 private:
  void apply(const char* value) const {
    if (value == nullptr) {
      unsetenv(name_.c_str());
    } else {
      setenv(name_.c_str(), value, 1);
    }
  }
  std::string name_;
  std::optional<std::string> saved_;
};

}  // namespace mixprec::cuda_test
