// mixprec::Error is the one exception type of the framework. Its message says which op
// failed and why, with shapes and dtypes, so that a user can act on it without a debugger.
#pragma once

#include <sstream>
#include <stdexcept>
#include <string>

namespace mixprec {

class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& message) : std::runtime_error(message) {}
};

namespace detail {
template <class... Parts>
std::string concat(const Parts&... parts) {
  std::ostringstream out;
  (out << ... << parts);
  return out.str();
}
}  // namespace detail

}  // namespace mixprec

// Throws mixprec::Error with the streamed parts when `cond` is false.
#define MIXPREC_CHECK(cond, ...)                                          \
  do {                                                                    \
    if (!(cond)) throw ::mixprec::Error(::mixprec::detail::concat(__VA_ARGS__)); \
  } while (0)

#define MIXPREC_FAIL(...) throw ::mixprec::Error(::mixprec::detail::concat(__VA_ARGS__))
