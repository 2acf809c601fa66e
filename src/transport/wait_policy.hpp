// How the engine waits for a peer: spin, then yield, then sleep (a futex or
// the UCX worker's event fd). One policy for both transports; the deadline
// is per operation (engine/driver.hpp).
#pragma once

#include <chrono>

#include "fastgather/settings.hpp"

namespace fastgather::transport {

struct WaitPolicy {
  std::chrono::nanoseconds spin{20'000};
  std::chrono::nanoseconds yield{200'000};
  std::chrono::milliseconds timeout{600'000};  // per operation; 0: never
  // A wait that has lasted this long is reported on stderr (whom it waits
  // for, and where), and again at growing intervals; 0: never.
  std::chrono::milliseconds report{5000};
  // One sleep on the futex before health and deadline are checked again; a
  // post wakes the sleeper at once, so this bounds only how soon a death or
  // the deadline is noticed.
  std::chrono::milliseconds sleep_slice{10};
  // While more tasks want this host's cores than it has (host_oversubscribed),
  // a waiter spins this long and sleeps at once after: every microsecond it
  // spins is one the awaited peer, or what shares its core, does not run,
  // and a sleeper is woken by the post itself. False where settings.spin or
  // .yield were set (they decide then).
  bool adapt = true;
  std::chrono::nanoseconds contended_spin{2'000};
  // The job's own ranks on this host: they are no crowd of strangers, and
  // between them yielding hands the core straight to the rank that shares it.
  int own_on_host = 0;
  bool (*crowded)(int own_on_host) = nullptr;  // what says the host is oversubscribed (null: host_oversubscribed)
  // Spins less when members outnumber cores; settings.spin and .yield
  // (FG_SPIN_US, FG_YIELD_US), where set, decide instead.
  static WaitPolicy for_members(int members, std::chrono::milliseconds timeout, const Settings& settings = {});
};

// Whether at least two more tasks are runnable on this host than it has
// cores, or than the job has ranks on it where those are more (the kernel's
// procs_running, /proc/stat), as last sampled: at most every 10 ms per
// process. Asked only by a wait that has outlasted contended_spin, so that a
// wait whose data comes at once never pays for the sample. Our own ranks
// count among the runnable (a waiter that spins or yields is one): where
// they alone outnumber the cores, only tasks beyond them make a crowd.
bool host_oversubscribed(int own_on_host = 0);
// Tests: what host_oversubscribed answers from now on, whatever /proc/stat
// says (-1: /proc/stat again).
void pretend_host_oversubscribed(int answer);
// The rule it applies to a count of runnable tasks.
bool oversubscribed(int running, int cores, int own_on_host);
// Whether `ranks` processes are more than this host's cores (online, as
// every process on the host counts them alike: the same answer for every
// member, so plans may depend on it).
bool ranks_outnumber_cores(int ranks);

}  // namespace fastgather::transport
