#include "limits.hpp"

#include <sched.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <vector>

#include <fmt/format.h>

#include "algo/copy_in.hpp"
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
  alignas(64) std::atomic<uint64_t> arrived{0};  // "both at once": arrivals at the start line
};

// The whole measurement takes a second or two; past this, something is wrong.
constexpr auto kMeasureWithin = std::chrono::seconds(120);

// The other side of a spin wait: the helper (seen from the measuring
// process) or the measuring process (seen from the helper). A spin ends
// when its condition holds, the partner is gone, or the deadline passes,
// so a measurement whose partner was killed never spins on alone.
class Partner {
 public:
  static Partner helper(pid_t pid) { return Partner(pid, false); }
  static Partner parent(pid_t pid) { return Partner(pid, true); }
  template <typename Done>
  bool spin_until(Done done) {
    for (uint64_t i = 0; !done(); ++i) {
      if ((i & 0x3fff) == 0 && !(Clock::now() < deadline_ && alive())) return false;
    }
    return true;
  }

 private:
  Partner(pid_t pid, bool is_parent) : pid_(pid), is_parent_(is_parent) {}
  bool alive() {
    if (is_parent_) return ::getppid() == pid_;
    int st = 0;
    return ::waitpid(pid_, &st, WNOHANG) == 0;  // 0: still running
  }
  pid_t pid_;
  bool is_parent_;
  Clock::time_point deadline_ = Clock::now() + kMeasureWithin;
};

// Private memory as fastgather's outputs get it (Tensor: huge pages from 1 MiB).
struct Output {
  explicit Output(size_t bytes) : bytes(std::max<size_t>(bytes, 1)) {
    void* p = ::mmap(nullptr, this->bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    data = p == MAP_FAILED ? nullptr : static_cast<char*>(p);
    if (data != nullptr) {
      ::madvise(data, this->bytes, MADV_HUGEPAGE);
      std::memset(data, 0, this->bytes);
    }
  }
  ~Output() {
    if (data != nullptr) ::munmap(data, bytes);
  }
  size_t bytes;
  char* data = nullptr;
};

// Both CPUs at once, as two ranks of an all-gather: each copies the block the
// other wrote into the first half of its output and its own block into the
// second. Both start together (a spin barrier); returns this CPU's times.
// With `streaming`, the copies use streaming stores (algo::copy_out), as
// fastgather's do for large outputs; the bound takes the faster way.
// Empty when the partner went away or the deadline passed.
std::vector<double> copy_both(Shared* sh, const char* peer_block, const char* own_block, char* out, size_t bytes,
                              bool streaming, int reps, uint64_t* round, Partner& partner) {
  std::vector<double> t;
  for (int i = 0; i < reps; ++i) {
    ++*round;
    sh->arrived.fetch_add(1, std::memory_order_acq_rel);
    const uint64_t all = 2 * *round;
    if (!partner.spin_until([&] { return sh->arrived.load(std::memory_order_acquire) >= all; })) return {};
    auto t0 = Clock::now();
    auto* o = reinterpret_cast<std::byte*>(out);
    algo::copy_out(o, reinterpret_cast<const std::byte*>(peer_block), bytes, streaming);
    algo::copy_out(o + bytes, reinterpret_cast<const std::byte*>(own_block), bytes, streaming);
    std::atomic_signal_fence(std::memory_order_seq_cst);
    t.push_back(std::chrono::duration<double, std::micro>(Clock::now() - t0).count());
  }
  return t;
}

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

  // Ping-pong and peer-written copies against a helper on cpu_b; then both
  // at once. The blocks are shared memory of 4 KiB pages, as the group's
  // symmetric heap is: buf (the helper's), buf_a (this CPU's).
  const size_t map_bytes = 4096 + 2 * max_bytes;
  void* mem = ::mmap(nullptr, map_bytes, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  if (mem == MAP_FAILED) return l;
  auto* sh = new (mem) Shared();
  char* buf = static_cast<char*>(mem) + 4096;
  char* buf_a = buf + max_bytes;
  std::memset(buf_a, 0x5a, max_bytes);
  std::vector<char> dst(max_bytes);
  constexpr int kPings = 20000;
  std::vector<int> reps;
  for (size_t s : sizes) reps.push_back(reps_for(s));
  std::fflush(nullptr);
  const pid_t me = ::getpid();
  pid_t helper = ::fork();
  if (helper == 0) {
    // Dies with the measuring process, whatever kills it (and gives up if
    // that already happened, or if the measurement stalls).
    ::prctl(PR_SET_PDEATHSIG, SIGKILL);
    Partner parent = Partner::parent(me);
    if (::getppid() != me) ::_exit(1);
    pin(cpu_b);
    uint64_t turn = 1;
    for (int i = 0; i < kPings; ++i, turn += 2) {  // answer pings: odd -> even
      if (!parent.spin_until([&] { return sh->turn.load(std::memory_order_acquire) == turn; })) ::_exit(1);
      sh->turn.store(turn + 1, std::memory_order_release);
    }
    for (size_t k = 0; k < sizes.size(); ++k) {
      for (int i = 0; i < reps[k]; ++i, turn += 2) {  // write the buffer, hand it over
        if (!parent.spin_until([&] { return sh->turn.load(std::memory_order_acquire) == turn; })) ::_exit(1);
        std::memset(buf, static_cast<int>(turn & 0xff), sizes[k]);
        sh->turn.store(turn + 1, std::memory_order_release);
      }
    }
    Output out(2 * max_bytes);
    uint64_t round = 0;
    for (size_t k = 0; k < sizes.size() && out.data != nullptr; ++k) {
      for (bool streaming : {false, true}) {
        if (copy_both(sh, buf_a, buf, out.data, sizes[k], streaming, reps[k], &round, parent).empty()) ::_exit(1);
      }
    }
    ::_exit(0);
  }
  if (helper < 0) {
    ::munmap(mem, map_bytes);
    ::sched_setaffinity(0, sizeof(saved), &saved);
    l.error = fmt::format("cannot start the helper: {}", std::strerror(errno));
    return l;
  }
  Partner partner = Partner::helper(helper);
  // What is left when the helper is gone or the deadline passed: the helper
  // stopped, the memory given back, the figures so far, and why.
  auto give_up = [&](const char* during) {
    ::kill(helper, SIGKILL);
    ::waitpid(helper, nullptr, 0);
    ::munmap(mem, map_bytes);
    ::sched_setaffinity(0, sizeof(saved), &saved);
    l.error = fmt::format("the helper on CPU {} stopped answering during {} (or {} s passed); figures after it are missing",
                          cpu_b, during, kMeasureWithin.count());
    return l;
  };
  uint64_t turn = 1;
  auto t0 = Clock::now();
  for (int i = 0; i < kPings; ++i, turn += 2) {
    sh->turn.store(turn, std::memory_order_release);
    if (!partner.spin_until([&] { return sh->turn.load(std::memory_order_acquire) == turn + 1; })) {
      return give_up("the ping-pong");
    }
  }
  l.rtt_ns = std::chrono::duration<double, std::nano>(Clock::now() - t0).count() / kPings;
  for (size_t k = 0; k < sizes.size(); ++k) {
    std::vector<double> t;
    for (int i = 0; i < reps[k]; ++i, turn += 2) {
      sh->turn.store(turn, std::memory_order_release);
      if (!partner.spin_until([&] { return sh->turn.load(std::memory_order_acquire) == turn + 1; })) {
        return give_up("the peer-written copies");
      }
      auto c0 = Clock::now();
      std::memcpy(dst.data(), buf, sizes[k]);
      std::atomic_signal_fence(std::memory_order_seq_cst);
      t.push_back(std::chrono::duration<double, std::micro>(Clock::now() - c0).count());
    }
    l.peer.push_back({sizes[k], summarize(t).median});
  }
  {
    Output out(2 * max_bytes);
    uint64_t round = 0;
    for (size_t k = 0; k < sizes.size() && out.data != nullptr; ++k) {
      double best = 0;
      for (bool streaming : {false, true}) {
        const auto times = copy_both(sh, buf, buf_a, out.data, sizes[k], streaming, reps[k], &round, partner);
        if (times.empty()) return give_up("the copies of both CPUs at once");
        const double us = summarize(times).median;
        best = best == 0 ? us : std::min(best, us);
      }
      l.both.push_back({sizes[k], best});
    }
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
  // Two members on this server: what the two CPUs measured doing it at once.
  // Otherwise one CPU's copies while the others idle (optimistic: they share
  // the memory bandwidth too).
  const double shm = l.rtt_ns / 2e3 + (local == 2 && !l.both.empty()
                                           ? copy_us(l.both, bytes)
                                           : (local - 1) * copy_us(l.peer, bytes) + copy_us(l.local, bytes));
  if (remote_blocks == 0 || l.wire.empty()) return shm;
  const CopyPoint& big = l.wire.back();
  const double us_per_byte = big.bytes > 0 ? big.us / static_cast<double>(big.bytes) : 0;
  const double wire = copy_us(l.wire, bytes) + (remote_blocks - 1) * us_per_byte * static_cast<double>(bytes);
  return std::max(shm, wire);
}

double reduction_limit_us(const Limits& l, size_t bytes, int ranks, bool all_reduce) {
  const size_t chunk = bytes / static_cast<size_t>(std::max(ranks, 1));
  const double peers = (ranks - 1) * copy_us(l.peer, chunk);
  const double scatter = l.rtt_ns / 2e3 + peers + copy_us(l.local, chunk);
  return all_reduce ? scatter + l.rtt_ns / 2e3 + peers : scatter;
}

double send_recv_limit_us(const Limits& l, size_t bytes, bool across) {
  if (across && !l.wire.empty()) return copy_us(l.wire, bytes);
  return l.rtt_ns / 2e3 + copy_us(l.peer, bytes);
}

std::string format_limits(const Limits& l) {
  std::string s = fmt::format("### Machine limits (CPU {} <-> CPU {})\n\ncache-line round trip: {:.0f} ns\n\n", l.cpu_a,
                              l.cpu_b, l.rtt_ns);
  if (!l.error.empty()) s += fmt::format("Not measured to the end: {}.\n\n", l.error);
  s += "| bytes | local memcpy (us) | GB/s | copy of peer-written data (us) | GB/s | both CPUs at once: peer's + own block, faster of regular and streaming stores (us) | GB/s per CPU |\n"
       "|---:|---:|---:|---:|---:|---:|---:|\n";
  for (size_t i = 0; i < l.local.size() && i < l.peer.size(); ++i) {
    const double b = static_cast<double>(l.local[i].bytes);
    const double both = i < l.both.size() ? l.both[i].us : 0;
    s += fmt::format("| {} | {:.2f} | {:.1f} | {:.2f} | {:.1f} | {:.2f} | {:.1f} |\n", human_bytes(b), l.local[i].us,
                     l.local[i].us > 0 ? b / l.local[i].us / 1e3 : 0.0, l.peer[i].us,
                     l.peer[i].us > 0 ? b / l.peer[i].us / 1e3 : 0.0, both, both > 0 ? 2 * b / both / 1e3 : 0.0);
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
