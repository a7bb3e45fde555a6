// The message of the mixprec::Error a piece of code throws, for tests that check what an
// error says.
#pragma once

#include <string>

#include <catch2/catch.hpp>

#include "core/error.h"

namespace mixprec_test {

// Runs `body`, which must throw mixprec::Error, and returns its message; fails the test
// when `body` throws nothing (any other exception passes through).
template <class Body>
std::string error_message(Body&& body) {
  try {
    body();
  } catch (const mixprec::Error& e) {
    return e.what();
  }
  FAIL("no mixprec::Error was thrown");
  return {};
}

}  // namespace mixprec_test
