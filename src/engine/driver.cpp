#include "engine/driver.hpp"

#include "engine/progress.hpp"

#include <sched.h>

#include <algorithm>
#include <cstdio>
#include <array>
#include <new>
#include <vector>

#include <fmt/format.h>

#if defined(__x86_64__)
#include <immintrin.h>
#define FG_PAUSE() _mm_pause()
#else
#define FG_PAUSE() std::atomic_signal_fence(std::memory_order_seq_cst)
#endif

namespace fastgather::engine {
namespace {

// Frames are a few hundred bytes; a handful are live per operation.
constexpr size_t kClassBytes = 128;
constexpr size_t kClasses = 32;  // up to 4 KiB; larger frames go to operator new
constexpr size_t kKeepPerClass = 16;

struct FramePool {
  std::array<std::vector<void*>, kClasses> free;
  ~FramePool();
};
thread_local FramePool pool;
// False once this thread's pool is gone (a frame freed later, at exit, by a
// static object's destructor, goes straight back to operator delete).
thread_local bool pool_alive = true;

FramePool::~FramePool() {
  pool_alive = false;
  for (auto& list : free) {
    for (void* p : list) ::operator delete(p);
  }
}

size_t class_of(size_t bytes) { return (bytes + kClassBytes - 1) / kClassBytes; }

// While the UCX worker has work in flight, sleeps on a shared-memory futex
// are kept this short so that the network keeps moving.
constexpr auto kSliceWithNetwork = std::chrono::microseconds(100);

}  // namespace

void* frame_alloc(size_t bytes) {
  const size_t c = class_of(bytes);
  if (c < kClasses && pool_alive) {
    auto& list = pool.free[c];
    if (!list.empty()) {
      void* p = list.back();
      list.pop_back();
      return p;
    }
    return ::operator new(c * kClassBytes);
  }
  return ::operator new(bytes);
}

void frame_free(void* p, size_t bytes) noexcept {
  const size_t c = class_of(bytes);
  if (c < kClasses && pool_alive && pool.free[c].size() < kKeepPerClass) {
    try {
      pool.free[c].push_back(p);
      return;
    } catch (...) {
    }
  }
  ::operator delete(p);
}

Driver::Driver(Task<Status> op, DriveOptions options) : op_(std::move(op)), opt_(options) {}

void Driver::suspended(Waiter* w) {
  current_ = w;
  wait_began_ = Clock::now();
  spin_ = opt_.policy.spin;
  spin_yield_ = opt_.policy.spin + opt_.policy.yield;
  // The awaited peer last ran on this CPU: it posts only once this thread
  // lets it have the CPU, so the wait skips its spin and starts by yielding
  // (settings.spin and .yield, where set, decide instead).
  if (opt_.policy.adapt && w->comes_from_cpu(::sched_getcpu())) {
    spin_yield_ -= spin_;
    spin_ = Clock::duration::zero();
  }
  crowd_asked_ = !opt_.policy.adapt;
  next_report_ = opt_.policy.report;
  if (!deadline_set_) {
    deadline_set_ = true;
    if (opt_.policy.timeout.count() > 0) deadline_ = wait_began_ + opt_.policy.timeout;
  }
}

// A long wait is news before it is an error: whom this rank waits for and
// where, as the timeout would say it, with how long it has waited. Then at
// twice the time, and so on, at least once a minute.
void Driver::report(Clock::duration waited) {
  const auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(waited);
  const Status s = current_->timed_out(ms);
  const std::string left = opt_.policy.timeout.count() > 0
                               ? fmt::format("the call fails at {} ms", opt_.policy.timeout.count())
                               : std::string("no timeout");
  std::fprintf(stderr, "fastgather: still waiting after %.1f s: %s; %s\n", static_cast<double>(ms.count()) / 1e3,
               s.message().c_str(), left.c_str());
  next_report_ = std::min<Clock::duration>(2 * next_report_, next_report_ + std::chrono::minutes(1));
}

// The result first, then done(): another thread that sees done() reads it.
void Driver::finish() {
  result_ = {ErrorKind::kSystem, "the operation ended with an exception"};
  try {
    result_ = op_.take();  // rethrows what the operation threw
  } catch (...) {
    mark_done();
    throw;
  }
  mark_done();
}

// Sequentially consistent with watched_by() and Progress::watch's look at
// done(): either the watcher sees it done, or this sees the watcher.
void Driver::mark_done() {
  done_.store(true, std::memory_order_seq_cst);
  if (Progress* p = watcher_.load(std::memory_order_seq_cst)) p->completed();
}

void Driver::start() {
  if (started_) return;
  started_ = true;
  op_.handle().promise().driver = this;
  op_.handle().resume();
  if (op_.done()) finish();
}

void Driver::resume() {
  Waiter* w = current_;
  current_ = nullptr;
  w->resume_point.resume();
  if (op_.done()) finish();
}

// On a crowded host a waiter gives its core away almost at once (see
// WaitPolicy::adapt); on a quiet one it spins, then yields, then sleeps.
// Asked once per wait, once it has outlasted the short spin.
void Driver::ask_about_the_crowd(Clock::duration waited) {
  if (crowd_asked_ || waited < opt_.policy.contended_spin) return;
  crowd_asked_ = true;
  const int own = opt_.policy.own_on_host;
  const bool crowded = opt_.policy.crowded != nullptr ? opt_.policy.crowded(own) : transport::host_oversubscribed(own);
  if (!crowded) return;
  spin_ = std::min<Clock::duration>(spin_, opt_.policy.contended_spin);
  spin_yield_ = spin_;
}

bool Driver::round(Clock::duration waited) {
  Waiter& w = *current_;
  if (w.ready()) return true;
  ask_about_the_crowd(waited);
  if (waited < spin_yield_) return false;
  Status why;
  if (opt_.aborted != nullptr && opt_.aborted->load(std::memory_order_acquire) != 0) {
    why = {ErrorKind::kAborted, "the communicator was aborted"};
  } else {
    why = w.check();
    // A peer may post its last step and exit between ready() above and this
    // check: what arrived before it left counts.
    if (!why.ok() && w.ready()) return true;
  }
  if (why.ok() && Clock::now() > deadline_) {
    // Said in the words torch's tests (and users' scripts) look for.
    const Status t = w.timed_out(opt_.policy.timeout);
    why = {t.kind(), "Timed out waiting: " + t.message(), t.peer()};
  }
  if (why.ok()) {
    if (opt_.policy.report.count() > 0 && waited >= next_report_) report(waited);
    return false;
  }
  w.error = w.fail(why);
  return true;
}

bool Driver::test() {
  if (!started_) start();
  while (!done()) {
    if (opt_.net != nullptr && opt_.net->busy()) opt_.net->progress();
    if (!round(Clock::now() - wait_began_)) return false;
    resume();
  }
  return true;
}

bool Driver::wait_until(Clock::time_point until, const std::atomic<int>* yield) {
  if (!started_) start();
  const bool bounded = until != Clock::time_point::max();
  while (!done()) {
    // The one wait loop: whatever is awaited, the network keeps moving.
    for (;;) {
      const bool net_busy = opt_.net != nullptr && opt_.net->busy();
      if (net_busy) opt_.net->progress();
      const auto now = Clock::now();
      const auto waited = now - wait_began_;
      if (round(waited)) break;
      if (bounded && now >= until) return false;
      if (yield != nullptr && yield->load(std::memory_order_relaxed) != 0) return false;
      if (waited < spin_) {
        for (int i = 0; i < 64 && !current_->ready(); ++i) FG_PAUSE();
      } else if (waited < spin_yield_) {
        ::sched_yield();
      } else {
        // Before sleeping: a hand for the other groups, whose peers may be
        // waiting on this rank there while this rank waits here.
        const bool elsewhere = opt_.others && opt_.others();
        if (current_->ready()) break;  // it may have come meanwhile
        auto slice = net_busy || elsewhere ? std::chrono::nanoseconds(kSliceWithNetwork)
                                           : std::chrono::nanoseconds(opt_.policy.sleep_slice);
        if (bounded) slice = std::min<std::chrono::nanoseconds>(slice, until - now);
        current_->sleep(slice);
      }
    }
    resume();
  }
  return true;
}

Status Driver::run(Task<Status> op, const DriveOptions& options) {
  Driver d(std::move(op), options);
  d.wait();
  return d.result();
}

// ------------------------------------------------------------------ Queue

Queue::Hold::Hold(Queue& q) : q_(q) {
  // Held by another thread for one round of try_progress, or by the
  // progress thread (which lets go when it sees wanted_); this thread
  // sleeps on the flag meanwhile (a futex), and is woken when it is let go.
  if (!q_.held_.test_and_set(std::memory_order_acquire)) return;
  q_.wanted_.fetch_add(1, std::memory_order_relaxed);
  while (q_.held_.test_and_set(std::memory_order_acquire)) q_.held_.wait(true, std::memory_order_relaxed);
  q_.wanted_.fetch_sub(1, std::memory_order_relaxed);
}

Queue::Hold::~Hold() { q_.release(); }

void Queue::release() {
  held_.clear(std::memory_order_release);
  held_.notify_all();
}

bool Queue::try_progress() {
  if (held_.test_and_set(std::memory_order_acquire)) return false;
  bool pending = false;
  try {
    if (!ops_.empty()) {
      ops_.front()->test();
      pop_done();
    }
    pending = !ops_.empty();
  } catch (...) {
    // The operation is done, with a status saying it ended on an exception;
    // its owner sees that. Nothing to throw into another group's wait.
    pop_done();
  }
  release();
  return pending;
}

void Queue::pop_done() {
  while (!ops_.empty() && ops_.front()->done()) {
    ops_.pop_front();
    if (!ops_.empty()) ops_.front()->start();
  }
}

void Queue::push(std::shared_ptr<Driver> op) {
  ops_.push_back(std::move(op));
  if (ops_.size() == 1) ops_.front()->start();
  pop_done();
}

bool Queue::test(Driver& op) {
  while (!op.done() && !ops_.empty()) {
    if (!ops_.front()->test()) return false;
    pop_done();
  }
  return op.done();
}

bool Queue::wait_until(Driver& op, Clock::time_point until, const std::atomic<int>* yield) {
  while (!op.done() && !ops_.empty()) {
    if (!ops_.front()->wait_until(until, yield)) return false;
    pop_done();
  }
  return op.done();
}

bool Queue::lend_a_hand(Driver& op, Clock::time_point until) {
  if (wanted_.load(std::memory_order_relaxed) != 0 || held_.test_and_set(std::memory_order_acquire)) return false;
  try {
    (void)wait_until(op, until, &wanted_);
  } catch (...) {
    // As in try_progress: the operation is done, its status saying so.
    pop_done();
  }
  release();
  return true;
}

void Queue::drain() {
  while (!ops_.empty()) {
    ops_.front()->wait();
    pop_done();
  }
}

}  // namespace fastgather::engine
