#include "transport/wait_policy.hpp"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <cstring>
#include <string>

namespace fastgather::transport {

namespace {

// The host's online cores: not this process's affinity, which ranks pinned
// apart would count differently.
int host_cores() {
  static const int cores = static_cast<int>(std::max(1L, ::sysconf(_SC_NPROCESSORS_ONLN)));
  return cores;
}

}  // namespace

bool ranks_outnumber_cores(int ranks) { return ranks > host_cores(); }

WaitPolicy WaitPolicy::for_members(int members, std::chrono::milliseconds timeout, const Settings& settings) {
  WaitPolicy p;
  p.timeout = timeout;
  if (ranks_outnumber_cores(members)) {
    // A spinning waiter would hold the core the awaited peer needs.
    p.spin = std::chrono::microseconds(2);
    p.yield = std::chrono::microseconds(50);
  }
  p.report = settings.report_after;
  if (settings.spin) p.spin = *settings.spin;
  if (settings.yield) p.yield = *settings.yield;
  p.adapt = !settings.spin && !settings.yield;
  return p;
}

namespace {

using Clock = std::chrono::steady_clock;
constexpr auto kSampleEvery = std::chrono::milliseconds(10);

// procs_running from /proc/stat; -1 where it cannot be read. The line comes
// after one line per core and the interrupt counts (hundreds of KiB on
// large hosts): the whole file is read.
int procs_running() {
  const int fd = ::open("/proc/stat", O_RDONLY | O_CLOEXEC);
  if (fd < 0) return -1;
  std::string text;
  char buf[16 << 10];
  for (ssize_t r; (r = ::read(fd, buf, sizeof(buf))) > 0;) text.append(buf, static_cast<size_t>(r));
  ::close(fd);
  const char* key = "\nprocs_running ";
  const size_t at = text.find(key);
  return at == std::string::npos ? -1 : std::atoi(text.c_str() + at + std::strlen(key));
}

std::atomic<int64_t> g_next_sample{0};  // steady_clock nanoseconds
std::atomic<int> g_running{-1};          // procs_running, as last sampled
std::atomic<int> g_pretend{-1};          // tests: 0 or 1, the answer

}  // namespace

void pretend_host_oversubscribed(int answer) { g_pretend.store(answer, std::memory_order_relaxed); }

bool host_oversubscribed(int own_on_host) {
  if (const int p = g_pretend.load(std::memory_order_relaxed); p >= 0) return p != 0;
  const int64_t now = Clock::now().time_since_epoch().count();
  int64_t next = g_next_sample.load(std::memory_order_relaxed);
  if (now >= next && g_next_sample.compare_exchange_strong(next, now + std::chrono::nanoseconds(kSampleEvery).count(),
                                                            std::memory_order_relaxed)) {
    g_running.store(procs_running(), std::memory_order_relaxed);
  }
  return oversubscribed(g_running.load(std::memory_order_relaxed), host_cores(), own_on_host);
}

// Two more than the cores (or the own ranks): one more is the noise of a
// quiet host (the sampling rank's spawner waking to reap, a kernel thread)
// beside ranks that fill its cores, and read as a crowd it sent quiet ranks to
// sleep. The own ranks, where they outnumber the cores, are no crowd: a rank
// that sleeps while its peer shares its core pays a futex wake-up and a
// cross-core wake for each step, one that yields hands the core over at once.
bool oversubscribed(int running, int cores, int own_on_host) {
  return running > std::max(cores, own_on_host) + 1;
}

}  // namespace fastgather::transport
