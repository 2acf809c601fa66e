#include "transport/wait_policy.hpp"

#include <algorithm>
#include <thread>


namespace fastgather::transport {
WaitPolicy WaitPolicy::for_members(int members, std::chrono::milliseconds timeout, const Settings& settings) {
  WaitPolicy p;
  p.timeout = timeout;
  unsigned cores = std::max(1u, std::thread::hardware_concurrency());
  if (static_cast<unsigned>(members) > cores) {
    // A spinning waiter would hold the core the awaited peer needs.
    p.spin = std::chrono::microseconds(2);
    p.yield = std::chrono::microseconds(50);
  }
  p.report = settings.report_after;
  if (settings.spin) p.spin = *settings.spin;
  if (settings.yield) p.yield = *settings.yield;
  return p;
}

}  // namespace fastgather::transport
