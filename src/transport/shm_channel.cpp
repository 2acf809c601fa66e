#include "transport/shm_channel.hpp"

#include "base/env.hpp"
#include "transport/shm_mail.hpp"

#include <linux/futex.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cstdlib>
#include <cstring>

#include <fmt/format.h>


namespace fastgather::transport {
namespace {

constexpr uint64_t kMagic = 0x66672d73686d3032ULL;  // "fg-shm02"
constexpr size_t kCtlOffset = 64;

struct SegmentHeader {
  uint64_t magic;
  uint32_t members;
  uint32_t pipeline_bytes;  // the creator's choice, so that every member cuts blocks alike
  uint64_t ring_bytes;
};

size_t data_offset(int members) {
  size_t ctl_end = kCtlOffset + sizeof(MemberCtl) * static_cast<size_t>(members);
  return (ctl_end + 4095) & ~size_t{4095};
}

// The mailboxes (shm_mail.hpp) follow the rings, on a page of their own.
size_t mail_offset(int members, size_t ring_bytes) {
  return (data_offset(members) + static_cast<size_t>(members) * ring_bytes + 4095) & ~size_t{4095};
}

int futex_wait(std::atomic<uint32_t>* word, uint32_t expected, std::chrono::nanoseconds timeout) {
  timespec ts{static_cast<time_t>(timeout.count() / 1'000'000'000), static_cast<long>(timeout.count() % 1'000'000'000)};
  // Shared (not FUTEX_PRIVATE): the word lives in memory mapped by several processes.
  return static_cast<int>(::syscall(SYS_futex, reinterpret_cast<uint32_t*>(word), FUTEX_WAIT, expected, &ts, nullptr, 0));
}

void futex_wake_all(std::atomic<uint32_t>* word) {
  ::syscall(SYS_futex, reinterpret_cast<uint32_t*>(word), FUTEX_WAKE, INT_MAX, nullptr, nullptr, 0);
}

}  // namespace

size_t ShmChannel::segment_bytes(int members, size_t ring_bytes) {
  return mail_offset(members, ring_bytes) + ShmMail::bytes(members);
}

size_t ShmChannel::pipeline_bytes_for(size_t ring_bytes, size_t wanted) {
  const size_t max_step = max_step_bytes_for(ring_bytes);
  return wanted == 0 ? max_step : std::clamp<size_t>(wanted / 64 * 64, 64, max_step);
}

void ShmChannel::format(std::byte* base, int members, size_t ring_bytes, size_t pipeline_bytes) {
  auto* h = reinterpret_cast<SegmentHeader*>(base);
  for (int m = 0; m < members; ++m) {
    new (base + kCtlOffset + sizeof(MemberCtl) * static_cast<size_t>(m)) MemberCtl();
  }
  ShmMail::format(base + mail_offset(members, ring_bytes), members);
  h->members = static_cast<uint32_t>(members);
  h->ring_bytes = ring_bytes;
  h->pipeline_bytes = static_cast<uint32_t>(pipeline_bytes_for(ring_bytes, pipeline_bytes));
  std::atomic_thread_fence(std::memory_order_release);
  h->magic = kMagic;
}

ShmChannel::ShmChannel(ShmSegment segment, std::vector<int> world_ranks, int me, size_t ring_bytes,
                       std::string label)
    : segment_(std::move(segment)),
      world_ranks_(std::move(world_ranks)),
      members_(static_cast<int>(world_ranks_.size())),
      me_(me),
      ring_bytes_(ring_bytes),
      label_(std::move(label)) {
  ctl_ = reinterpret_cast<MemberCtl*>(segment_.data() + kCtlOffset);
  data_ = segment_.data() + data_offset(members_);
  mail_ = segment_.data() + mail_offset(members_, ring_bytes_);
  pipeline_bytes_ = reinterpret_cast<const SegmentHeader*>(segment_.data())->pipeline_bytes;  // checked by check_format()
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
  if (h->magic != kMagic || h->members != static_cast<uint32_t>(members_) || h->ring_bytes != ring_bytes_ ||
      pipeline_bytes_ < 64 || pipeline_bytes_ % 64 != 0 || pipeline_bytes_ > max_step_bytes()) {
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

void ShmChannel::post(uint64_t step, const PostHeader& header, const void* inline_data, size_t inline_len, Readers) {
  PostLine& line = ctl(me_).post[step & 1];
  line.header = header;
  if (inline_len != 0) std::memcpy(line.inline_data, inline_data, inline_len);
  line.step.store(step, std::memory_order_release);
  if (const int cpu = ::sched_getcpu(); cpu != published_cpu_) {
    published_cpu_ = cpu;
    ctl(me_).wake.cpu.store(cpu, std::memory_order_relaxed);
  }
  wake();
}

void ShmChannel::wake() {
  // Dekker with sleep(): either we see its sleepers count or it sees our step.
  std::atomic_thread_fence(std::memory_order_seq_cst);
  MemberLine& w = ctl(me_).wake;
  if (w.sleepers.load(std::memory_order_relaxed) != 0) {
    w.futex_word.fetch_add(1, std::memory_order_release);
    futex_wake_all(&w.futex_word);
  }
}

Status ShmChannel::check(int member) {
  const int who = world_ranks_[member];
  const int self = world_ranks_[me_];
  if (ctl(member).wake.aborted.load(std::memory_order_acquire) != 0) {
    return {ErrorKind::kPeerLost, fmt::format("{}: rank {} aborted the group while rank {} waited for it", label_, who, self),
            who};
  }
  if (member_dead(member)) {
    return {ErrorKind::kPeerLost,
            fmt::format("{}: rank {} (pid {}) died; rank {} was waiting for it", label_, who, pids_[member], self), who};
  }
  return Status::Ok();
}

Status ShmChannel::timed_out(int member, uint64_t step, std::chrono::milliseconds timeout) const {
  const int who = world_ranks_[member];
  return {ErrorKind::kTimeout, fmt::format("{}: rank {} did not arrive within {} ms (rank {} waiting at step {})", label_,
                                           who, timeout.count(), world_ranks_[me_], step),
          who};
}

void ShmChannel::sleep(int member, uint64_t step, std::chrono::nanoseconds slice) {
  MemberLine& w = ctl(member).wake;
  const uint32_t seen = w.futex_word.load(std::memory_order_acquire);
  // Dekker with post(): either it sees our sleepers count or we see its step.
  w.sleepers.fetch_add(1, std::memory_order_seq_cst);
  if (!arrived(member, step) && w.aborted.load(std::memory_order_acquire) == 0) futex_wait(&w.futex_word, seen, slice);
  w.sleepers.fetch_sub(1, std::memory_order_relaxed);
}

void ShmChannel::sleep_until(int member, const std::function<bool()>& ready, std::chrono::nanoseconds slice) {
  MemberLine& w = ctl(member).wake;
  const uint32_t seen = w.futex_word.load(std::memory_order_acquire);
  // Dekker with wake(): either it sees our sleepers count or we see what it did.
  w.sleepers.fetch_add(1, std::memory_order_seq_cst);
  if (!ready() && w.aborted.load(std::memory_order_acquire) == 0) futex_wait(&w.futex_word, seen, slice);
  w.sleepers.fetch_sub(1, std::memory_order_relaxed);
}

void ShmChannel::abort(Status why) {
  if (broken_.ok()) broken_ = std::move(why);
  MemberLine& w = ctl(me_).wake;
  w.aborted.store(1, std::memory_order_release);
  w.futex_word.fetch_add(1, std::memory_order_release);
  futex_wake_all(&w.futex_word);
}

void ShmChannel::abort_now() noexcept {
  ctl(me_).wake.aborted.store(1, std::memory_order_release);
  for (int m = 0; m < members_; ++m) {
    MemberLine& w = ctl(m).wake;
    w.futex_word.fetch_add(1, std::memory_order_release);
    futex_wake_all(&w.futex_word);
  }
}

namespace {
constexpr uint64_t kProbe = 0x66672d636d613031ULL;  // "fg-cma01"
}  // namespace

void ShmChannel::publish_probe() {
  probe_word_ = kProbe;
  // Where Yama restricts ptrace to descendants (ptrace_scope 1), siblings
  // may read each other only if they say so (as Open MPI's vader does).
  ::prctl(PR_SET_PTRACER, PR_SET_PTRACER_ANY, 0, 0, 0);
  ctl(me_).wake.probe_addr.store(reinterpret_cast<uint64_t>(&probe_word_), std::memory_order_release);
}

bool ShmChannel::probe_peers(bool try_it, std::string* why) {
  bool all = try_it;
  for (int m = 0; m < members_ && all; ++m) {
    if (m == me_) continue;
    uint64_t got = 0;
    iovec local{&got, sizeof(got)};
    iovec remote{reinterpret_cast<void*>(ctl(m).wake.probe_addr.load(std::memory_order_acquire)), sizeof(got)};
    const ssize_t r = ::process_vm_readv(pids_[m], &local, 1, &remote, 1, 0);
    if (r != static_cast<ssize_t>(sizeof(got)) || got != kProbe) {
      all = false;
      if (why != nullptr) {
        *why = r < 0 ? fmt::format("process_vm_readv from rank {}: {}", world_ranks_[m], std::strerror(errno))
                     : fmt::format("process_vm_readv from rank {} read the wrong bytes", world_ranks_[m]);
      }
    }
  }
  MemberLine& w = ctl(me_).wake;
  w.read_verdict.store(all ? 1 : 2, std::memory_order_release);
  // As post() does: a member asleep waiting for this verdict is woken.
  std::atomic_thread_fence(std::memory_order_seq_cst);
  if (w.sleepers.load(std::memory_order_relaxed) != 0) {
    w.futex_word.fetch_add(1, std::memory_order_release);
    futex_wake_all(&w.futex_word);
  }
  return all;
}

std::optional<bool> ShmChannel::verdict(int member) const {
  const uint32_t v = ctl(member).wake.read_verdict.load(std::memory_order_acquire);
  if (v == 0) return std::nullopt;
  return v == 1;
}

void ShmChannel::sleep_for_verdict(int member, std::chrono::nanoseconds slice) {
  MemberLine& w = ctl(member).wake;
  const uint32_t seen = w.futex_word.load(std::memory_order_acquire);
  w.sleepers.fetch_add(1, std::memory_order_seq_cst);
  if (!verdict(member) && w.aborted.load(std::memory_order_acquire) == 0) futex_wait(&w.futex_word, seen, slice);
  w.sleepers.fetch_sub(1, std::memory_order_relaxed);
}

Status ShmChannel::read_peer(int member, std::byte* dst, uint64_t remote, size_t len) {
  const size_t whole = len;
  while (len > 0) {
    iovec local{dst, len};
    iovec from{reinterpret_cast<void*>(remote), len};
    const ssize_t r = ::process_vm_readv(pids_[member], &local, 1, &from, 1, 0);
    if (r <= 0) {
      const int err = r < 0 ? errno : EIO;
      if (err == EINTR) continue;
      const int who = world_ranks_[member];
      Status s = err == ESRCH ? Status{ErrorKind::kPeerLost, fmt::format("{}: rank {} died while rank {} read its bytes",
                                                                         label_, who, world_ranks_[me_]), who}
                              : Status{ErrorKind::kSystem, fmt::format("{}: reading rank {}'s bytes: {}", label_, who,
                                                                       std::strerror(err)), who};
      abort(s);
      return broken_;
    }
    dst += r;
    remote += static_cast<uint64_t>(r);
    len -= static_cast<size_t>(r);
  }
  bytes_read_.fetch_add(whole, std::memory_order_relaxed);  // copied, as bytes_read_from_peers() says
  return Status::Ok();
}

}  // namespace fastgather::transport
