// CaptureGate (cuda/capture_gate.h), checked without a device: while one thread holds the gate
// closed (a CUDA graph capture), another thread's pass() waits until it opens, and the closing
// thread's own pass() goes through at once.
#include <catch2/catch.hpp>

#include <atomic>
#include <chrono>
#include <thread>

#include "cuda/capture_gate.h"

namespace {

using mixprec::CaptureGate;

// Spins until `flag` is set (bounded, so that a broken gate fails instead of hanging).
bool wait_for(const std::atomic<bool>& flag) {
  const auto give_up = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  while (!flag.load()) {
    if (std::chrono::steady_clock::now() > give_up) return false;
    std::this_thread::yield();
  }
  return true;
}

TEST_CASE("capture gate: another thread's passage waits while the gate is closed",
          "[cuda][capture]") {
  CaptureGate gate;
  std::atomic<bool> about_to_pass{false}, passed{false};
  std::thread other;
  {
    const auto closed = gate.close();
    other = std::thread([&] {
      about_to_pass.store(true);
      const auto passage = gate.pass();
      passed.store(true);
    });
    REQUIRE(wait_for(about_to_pass));
    // The other thread is at the gate; give it ample time to (wrongly) get through.
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    CHECK_FALSE(passed.load());
    // The capturing thread itself passes while the gate is closed (its allocations go on).
    {
      const auto own = gate.pass();
      CHECK_FALSE(passed.load());
    }
  }
  // Opened: the other thread gets through.
  CHECK(wait_for(passed));
  other.join();
}

TEST_CASE("capture gate: close waits for passages already inside", "[cuda][capture]") {
  CaptureGate gate;
  std::atomic<bool> inside{false}, leave{false}, closed_flag{false};
  std::thread other([&] {
    const auto passage = gate.pass();
    inside.store(true);
    wait_for(leave);
  });
  REQUIRE(wait_for(inside));
  std::thread closer([&] {
    const auto closed = gate.close();
    closed_flag.store(true);
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  CHECK_FALSE(closed_flag.load());
  leave.store(true);
  CHECK(wait_for(closed_flag));
  other.join();
  closer.join();
  // Once the closer has let go, another thread passes again.
  std::atomic<bool> passed_again{false};
  std::thread later([&] {
    const auto passage = gate.pass();
    passed_again.store(true);
  });
  CHECK(wait_for(passed_again));
  later.join();
}

}  // namespace
