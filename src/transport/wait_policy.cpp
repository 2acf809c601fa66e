#include "transport/wait_policy.hpp"

#include <algorithm>
#include <thread>

#include "base/env.hpp"

namespace fastgather::transport {
namespace {

std::chrono::nanoseconds env_us(const char* name, std::chrono::nanoseconds fallback) {
  const auto us = std::chrono::duration_cast<std::chrono::microseconds>(fallback).count();
  return std::chrono::microseconds(base::env_count_or(name, static_cast<uint64_t>(us)));
}

}  // namespace

WaitPolicy WaitPolicy::for_members(int members, std::chrono::milliseconds timeout) {
  WaitPolicy p;
  p.timeout = timeout;
  unsigned cores = std::max(1u, std::thread::hardware_concurrency());
  if (static_cast<unsigned>(members) > cores) {
    // A spinning waiter would hold the core the awaited peer needs.
    p.spin = std::chrono::microseconds(2);
    p.yield = std::chrono::microseconds(50);
  }
  p.spin = env_us("FG_SPIN_US", p.spin);
  p.yield = env_us("FG_YIELD_US", p.yield);
  return p;
}

}  // namespace fastgather::transport
