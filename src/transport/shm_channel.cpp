#include "transport/shm_channel.hpp"

#include "base/env.hpp"

#include <linux/futex.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cerrno>
#include <climits>
#include <cstdlib>
#include <cstring>
#include <thread>

#include <fmt/format.h>

#if defined(__x86_64__)
#include <immintrin.h>
#define FG_PAUSE() _mm_pause()
#else
#define FG_PAUSE() std::atomic_signal_fence(std::memory_order_seq_cst)
#endif

namespace fastgather::transport {
namespace {

constexpr uint64_t kMagic = 0x66672d73686d3031ULL;  // "fg-shm01"
constexpr size_t kCtlOffset = 64;

struct SegmentHeader {
  uint64_t magic;
  uint32_t members;
  uint32_t reserved;
  uint64_t ring_bytes;
};

size_t data_offset(int members) {
  size_t ctl_end = kCtlOffset + sizeof(MemberCtl) * static_cast<size_t>(members);
  return (ctl_end + 4095) & ~size_t{4095};
}

int futex_wait(std::atomic<uint32_t>* word, uint32_t expected, std::chrono::nanoseconds timeout) {
  timespec ts{static_cast<time_t>(timeout.count() / 1'000'000'000), static_cast<long>(timeout.count() % 1'000'000'000)};
  // Shared (not FUTEX_PRIVATE): the word lives in memory mapped by several processes.
  return static_cast<int>(::syscall(SYS_futex, reinterpret_cast<uint32_t*>(word), FUTEX_WAIT, expected, &ts, nullptr, 0));
}

void futex_wake_all(std::atomic<uint32_t>* word) {
  ::syscall(SYS_futex, reinterpret_cast<uint32_t*>(word), FUTEX_WAKE, INT_MAX, nullptr, nullptr, 0);
}

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

size_t ShmChannel::segment_bytes(int members, size_t ring_bytes) {
  return data_offset(members) + static_cast<size_t>(members) * ring_bytes;
}

void ShmChannel::format(std::byte* base, int members, size_t ring_bytes) {
  auto* h = reinterpret_cast<SegmentHeader*>(base);
  for (int m = 0; m < members; ++m) {
    new (base + kCtlOffset + sizeof(MemberCtl) * static_cast<size_t>(m)) MemberCtl();
  }
  h->members = static_cast<uint32_t>(members);
  h->ring_bytes = ring_bytes;
  std::atomic_thread_fence(std::memory_order_release);
  h->magic = kMagic;
}

ShmChannel::ShmChannel(ShmSegment segment, std::vector<int> world_ranks, int me, size_t ring_bytes,
                       WaitPolicy policy, std::string label)
    : segment_(std::move(segment)),
      world_ranks_(std::move(world_ranks)),
      members_(static_cast<int>(world_ranks_.size())),
      me_(me),
      ring_bytes_(ring_bytes),
      policy_(policy),
      label_(std::move(label)) {
  ctl_ = reinterpret_cast<MemberCtl*>(segment_.data() + kCtlOffset);
  data_ = segment_.data() + data_offset(members_);
  pidfds_.assign(static_cast<size_t>(members_), -1);
  pids_.assign(static_cast<size_t>(members_), 0);
}

ShmChannel::~ShmChannel() {
  for (int fd : pidfds_) {
    if (fd >= 0) ::close(fd);
  }
}

Status ShmChannel::check_format() const {
  const auto* h = reinterpret_cast<const SegmentHeader*>(segment_.data());
  if (h->magic != kMagic || h->members != static_cast<uint32_t>(members_) || h->ring_bytes != ring_bytes_) {
    return {ErrorKind::kSystem, fmt::format("{}: shared-memory segment {} has an unexpected layout", label_, segment_.name())};
  }
  return Status::Ok();
}

std::byte* ShmChannel::claim(size_t len, uint32_t* offset) {
  if (cursor_ + len > ring_bytes_) cursor_ = 0;
  *offset = static_cast<uint32_t>(cursor_);
  cursor_ += (len + 63) / 64 * 64;  // next step starts on its own cache line
  return data_ + static_cast<size_t>(me_) * ring_bytes_ + *offset;
}

void ShmChannel::publish_pid() { ctl(me_).wake.pid.store(static_cast<int32_t>(::getpid()), std::memory_order_release); }

Status ShmChannel::watch_members() {
  for (int m = 0; m < members_; ++m) {
    pids_[m] = ctl(m).wake.pid.load(std::memory_order_acquire);
    if (pids_[m] <= 0) return {ErrorKind::kSystem, fmt::format("{}: rank {} published no pid", label_, world_ranks_[m])};
    if (m == me_) continue;
    pidfds_[m] = static_cast<int>(::syscall(SYS_pidfd_open, pids_[m], 0));
    // Without pidfd (old kernels) member_dead() falls back to kill(pid, 0).
  }
  return Status::Ok();
}

bool ShmChannel::member_dead(int m) const {
  if (pidfds_[m] >= 0) {
    pollfd p{pidfds_[m], POLLIN, 0};
    return ::poll(&p, 1, 0) > 0;  // readable once the process has exited
  }
  return pids_[m] > 0 && ::kill(pids_[m], 0) != 0 && errno == ESRCH;
}

void ShmChannel::post(uint64_t step, const PostHeader& header, const void* inline_data, size_t inline_len) {
  PostLine& line = ctl(me_).post[step & 1];
  line.header = header;
  if (inline_len != 0) std::memcpy(line.inline_data, inline_data, inline_len);
  line.step.store(step, std::memory_order_release);
  // Dekker with slow_wait: either we see its sleepers count or it sees our step.
  std::atomic_thread_fence(std::memory_order_seq_cst);
  MemberLine& w = ctl(me_).wake;
  if (w.sleepers.load(std::memory_order_relaxed) != 0) {
    w.futex_word.fetch_add(1, std::memory_order_release);
    futex_wake_all(&w.futex_word);
  }
}

Result<const PostLine*> ShmChannel::wait(int member, uint64_t step) {
  const PostLine& line = ctl(member).post[step & 1];
  if (line.step.load(std::memory_order_acquire) >= step) return &line;
  if (!broken_.ok()) return broken_;
  if (Status s = slow_wait(member, step, line); !s.ok()) return s;
  return &line;
}

Status ShmChannel::slow_wait(int member, uint64_t step, const PostLine& line) {
  using Clock = std::chrono::steady_clock;
  const auto start = Clock::now();
  auto ready = [&] { return line.step.load(std::memory_order_acquire) >= step; };

  // 1. Spin: the peer is usually a few hundred nanoseconds away.
  while (Clock::now() - start < policy_.spin) {
    for (int i = 0; i < 64; ++i) {
      if (ready()) return Status::Ok();
      FG_PAUSE();
    }
    if (idle_) idle_();
  }
  // 2. Yield: let a peer sharing our core run.
  while (Clock::now() - start < policy_.spin + policy_.yield) {
    if (ready()) return Status::Ok();
    if (idle_) idle_();
    ::sched_yield();
  }
  // 3. Sleep on the member's futex, checking health between sleeps (in
  // short slices while there is other work to keep going).
  MemberLine& w = ctl(member).wake;
  const std::chrono::nanoseconds slice = idle_ ? std::chrono::nanoseconds(std::chrono::microseconds(100))
                                               : std::chrono::nanoseconds(policy_.sleep_slice);
  for (;;) {
    if (idle_) idle_();
    uint32_t seen = w.futex_word.load(std::memory_order_acquire);
    w.sleepers.fetch_add(1, std::memory_order_seq_cst);
    if (!ready()) futex_wait(&w.futex_word, seen, slice);
    w.sleepers.fetch_sub(1, std::memory_order_relaxed);
    if (ready()) return Status::Ok();

    const int who = world_ranks_[member];
    const int self = world_ranks_[me_];
    if (w.aborted.load(std::memory_order_acquire) != 0) {
      abort({ErrorKind::kPeerLost, fmt::format("{}: rank {} aborted the group while rank {} waited for it",
                                               label_, who, self), who});
      return broken_;
    }
    if (member_dead(member)) {
      abort({ErrorKind::kPeerLost, fmt::format("{}: rank {} (pid {}) died; rank {} was waiting for it",
                                               label_, who, pids_[member], self), who});
      return broken_;
    }
    if (policy_.timeout.count() > 0 && Clock::now() - start > policy_.timeout) {
      abort({ErrorKind::kTimeout, fmt::format("{}: rank {} did not arrive within {} ms (rank {} waiting at step {})",
                                              label_, who, policy_.timeout.count(), self, step), who});
      return broken_;
    }
  }
}

void ShmChannel::abort(Status why) {
  if (broken_.ok()) broken_ = std::move(why);
  MemberLine& w = ctl(me_).wake;
  w.aborted.store(1, std::memory_order_release);
  w.futex_word.fetch_add(1, std::memory_order_release);
  futex_wake_all(&w.futex_word);
}

}  // namespace fastgather::transport
