#include "limits.hpp"

#include <sched.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstring>
#include <vector>

#include <fmt/format.h>

#include "report.hpp"
#include "stats.hpp"

namespace fastgather::bench {
namespace {

using Clock = std::chrono::steady_clock;

void pin(int cpu) {
  if (cpu < 0) return;
  cpu_set_t s;
  CPU_ZERO(&s);
  CPU_SET(cpu, &s);
  ::sched_setaffinity(0, sizeof(s), &s);
}

int reps_for(size_t bytes) { return static_cast<int>(std::clamp<size_t>((64u << 20) / std::max<size_t>(bytes, 1), 20, 2000)); }

struct Shared {
  alignas(64) std::atomic<uint64_t> turn{0};
};

}  // namespace

Limits measure_limits(const std::vector<size_t>& sizes_in, int cpu_a, int cpu_b) {
  Limits l;
  l.cpu_a = cpu_a;
  l.cpu_b = cpu_b;
  std::vector<size_t> sizes = sizes_in;
  std::sort(sizes.begin(), sizes.end());
  sizes.erase(std::unique(sizes.begin(), sizes.end()), sizes.end());
  const size_t max_bytes = sizes.empty() ? 64 : std::max<size_t>(sizes.back(), 64);

  cpu_set_t saved;
  ::sched_getaffinity(0, sizeof(saved), &saved);
  pin(cpu_a);

  // Local memcpy: warm source and destination.
  {
    std::vector<char> a(max_bytes, 1), b(max_bytes, 2);
    for (size_t s : sizes) {
      std::vector<double> t;
      for (int i = 0; i < reps_for(s); ++i) {
        auto t0 = Clock::now();
        std::memcpy(b.data(), a.data(), s);
        std::atomic_signal_fence(std::memory_order_seq_cst);
        t.push_back(std::chrono::duration<double, std::micro>(Clock::now() - t0).count());
      }
      l.local.push_back({s, summarize(t).median});
    }
  }

  // Ping-pong and peer-written copies against a helper on cpu_b.
  const size_t map_bytes = 4096 + max_bytes;
  void* mem = ::mmap(nullptr, map_bytes, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  if (mem == MAP_FAILED) return l;
  auto* sh = new (mem) Shared();
  char* buf = static_cast<char*>(mem) + 4096;
  std::vector<char> dst(max_bytes);
  constexpr int kPings = 20000;
  std::vector<int> reps;
  for (size_t s : sizes) reps.push_back(reps_for(s));
  std::fflush(nullptr);
  pid_t helper = ::fork();
  if (helper == 0) {
    pin(cpu_b);
    uint64_t turn = 1;
    for (int i = 0; i < kPings; ++i, turn += 2) {  // answer pings: odd -> even
      while (sh->turn.load(std::memory_order_acquire) != turn) {
      }
      sh->turn.store(turn + 1, std::memory_order_release);
    }
    for (size_t k = 0; k < sizes.size(); ++k) {
      for (int i = 0; i < reps[k]; ++i, turn += 2) {  // write the buffer, hand it over
        while (sh->turn.load(std::memory_order_acquire) != turn) {
        }
        std::memset(buf, static_cast<int>(turn & 0xff), sizes[k]);
        sh->turn.store(turn + 1, std::memory_order_release);
      }
    }
    ::_exit(0);
  }
  uint64_t turn = 1;
  auto t0 = Clock::now();
  for (int i = 0; i < kPings; ++i, turn += 2) {
    sh->turn.store(turn, std::memory_order_release);
    while (sh->turn.load(std::memory_order_acquire) != turn + 1) {
    }
  }
  l.rtt_ns = std::chrono::duration<double, std::nano>(Clock::now() - t0).count() / kPings;
  for (size_t k = 0; k < sizes.size(); ++k) {
    std::vector<double> t;
    for (int i = 0; i < reps[k]; ++i, turn += 2) {
      sh->turn.store(turn, std::memory_order_release);
      while (sh->turn.load(std::memory_order_acquire) != turn + 1) {
      }
      auto c0 = Clock::now();
      std::memcpy(dst.data(), buf, sizes[k]);
      std::atomic_signal_fence(std::memory_order_seq_cst);
      t.push_back(std::chrono::duration<double, std::micro>(Clock::now() - c0).count());
    }
    l.peer.push_back({sizes[k], summarize(t).median});
  }
  int status = 0;
  ::waitpid(helper, &status, 0);
  ::munmap(mem, map_bytes);
  ::sched_setaffinity(0, sizeof(saved), &saved);
  return l;
}

double copy_us(const std::vector<CopyPoint>& p, size_t bytes) {
  if (p.empty() || bytes == 0) return 0;
  if (bytes <= p.front().bytes) return p.front().us * static_cast<double>(bytes) / static_cast<double>(p.front().bytes);
  for (size_t i = 1; i < p.size(); ++i) {
    if (bytes <= p[i].bytes) {
      const double x0 = std::log(static_cast<double>(p[i - 1].bytes)), x1 = std::log(static_cast<double>(p[i].bytes));
      const double y0 = std::log(std::max(p[i - 1].us, 1e-6)), y1 = std::log(std::max(p[i].us, 1e-6));
      const double x = std::log(static_cast<double>(bytes));
      return std::exp(y0 + (y1 - y0) * (x - x0) / (x1 - x0));
    }
  }
  return p.back().us * static_cast<double>(bytes) / static_cast<double>(p.back().bytes);
}

double all_gather_limit_us(const Limits& l, size_t bytes, int ranks, int remote_blocks) {
  const int local = ranks - remote_blocks;
  const double shm = l.rtt_ns / 2e3 + (local - 1) * copy_us(l.peer, bytes) + copy_us(l.local, bytes);
  if (remote_blocks == 0 || l.wire.empty()) return shm;
  const CopyPoint& big = l.wire.back();
  const double us_per_byte = big.bytes > 0 ? big.us / static_cast<double>(big.bytes) : 0;
  const double wire = copy_us(l.wire, bytes) + (remote_blocks - 1) * us_per_byte * static_cast<double>(bytes);
  return std::max(shm, wire);
}

std::string format_limits(const Limits& l) {
  std::string s = fmt::format("### Machine limits (CPU {} <-> CPU {})\n\ncache-line round trip: {:.0f} ns\n\n", l.cpu_a,
                              l.cpu_b, l.rtt_ns);
  s += "| bytes | local memcpy (us) | GB/s | copy of peer-written data (us) | GB/s |\n|---:|---:|---:|---:|---:|\n";
  for (size_t i = 0; i < l.local.size() && i < l.peer.size(); ++i) {
    const double b = static_cast<double>(l.local[i].bytes);
    s += fmt::format("| {} | {:.2f} | {:.1f} | {:.2f} | {:.1f} |\n", human_bytes(b), l.local[i].us,
                     l.local[i].us > 0 ? b / l.local[i].us / 1e3 : 0.0, l.peer[i].us,
                     l.peer[i].us > 0 ? b / l.peer[i].us / 1e3 : 0.0);
  }
  if (!l.wire.empty()) {
    s += fmt::format("\nBetween servers ({}): one message, one way (half the median round trip)\n\n"
                     "| bytes | one way (us) | GB/s |\n|---:|---:|---:|\n", l.wire_path);
    for (const CopyPoint& p : l.wire) {
      const double b = static_cast<double>(p.bytes);
      s += fmt::format("| {} | {:.2f} | {:.2f} |\n", human_bytes(b), p.us, p.us > 0 ? b / p.us / 1e3 : 0.0);
    }
  }
  return s;
}

}  // namespace fastgather::bench
