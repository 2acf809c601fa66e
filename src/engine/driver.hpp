// The progress engine: one wait loop for every transport, one deadline per
// operation.
//
// An operation is a Task<Status> (a collective written as a coroutine). When
// it needs something that has not happened yet - a peer's post in shared
// memory, a UCX receive, its sends' completion - it co_awaits a Waiter
// (waits.hpp), and its driver takes over: the driver alone spins, yields and
// sleeps, keeps the group's UCX worker progressing whatever is awaited,
// checks the peers' health, and ends the wait on the operation's deadline or
// on the communicator's abort. The transports only answer "ready?",
// "healthy?" and "sleep until something may have changed".
//
// Operations on one group run in the order they were started (a Queue per
// group): members must agree on the order of collectives, and a later one
// starts only once the one before it has completed.
#pragma once

#include <atomic>
#include <chrono>
#include <coroutine>
#include <deque>
#include <functional>
#include <memory>

#include "engine/task.hpp"
#include "fastgather/status.hpp"
#include "transport/net_channel.hpp"
#include "transport/wait_policy.hpp"

namespace fastgather::engine {

using Clock = std::chrono::steady_clock;

// What a suspended operation waits for.
class Waiter {
 public:
  virtual ~Waiter() = default;
  // Cheap test; true once the awaited thing has happened. May be called
  // again after it said true (before the coroutine resumes): it must keep
  // saying so, and not take a second thing from the channel.
  virtual bool ready() = 0;
  // The peers' health: an error ends the wait.
  virtual Status check() = 0;
  // The words for a wait that reached the operation's deadline.
  virtual Status timed_out(std::chrono::milliseconds timeout) = 0;
  // Marks the channel failed (sticky) after the wait ended on `why`; returns
  // the channel's error (the first one, should it have failed before).
  virtual Status fail(const Status& why) = 0;
  // Blocks until the awaited thing may have happened, at most `slice`.
  virtual void sleep(std::chrono::nanoseconds slice) = 0;
  // Whether what is awaited comes from a process that last ran on `cpu`
  // (this thread's): while this thread spins there, it cannot run.
  virtual bool comes_from_cpu(int /*cpu*/) { return false; }

  Status error;  // why the wait ended without the awaited thing (Ok otherwise)
  std::coroutine_handle<> resume_point;

  // co_await support shared by every waiter (each adds await_ready and
  // await_resume): the suspended coroutine is handed to its driver.
  template <class P>
  void await_suspend(std::coroutine_handle<P> h);
};

struct DriveOptions {
  // policy.timeout is the whole operation's, from its first wait (0: none).
  // Counted from the first wait rather than the start so that a call that
  // never waits reads no clock; the two are the few microseconds of copying
  // in apart.
  transport::WaitPolicy policy;
  const std::atomic<int>* aborted = nullptr;  // the communicator's abort flag (non-zero: aborted)
  transport::NetChannel* net = nullptr;       // progressed while anything is in flight on it
  // The communicator's other groups: one non-blocking round for each whose
  // queue is not being driven by someone else; true when any has work
  // pending (then this wait sleeps in short slices). Null: none.
  std::function<bool()> others;
};

class Progress;  // progress.hpp

class Driver {
 public:
  Driver(Task<Status> op, DriveOptions options);
  Driver(const Driver&) = delete;
  Driver& operator=(const Driver&) = delete;

  // Runs the operation until its first wait (or to its end).
  void start();
  bool started() const { return started_; }
  // Any thread may ask (the progress thread, a completion callback); the
  // result is written before done() says true.
  bool done() const { return done_.load(std::memory_order_acquire); }
  // Progresses without blocking; true once done. Health and the deadline are
  // checked here too, so a caller that only ever tests still learns of a
  // lost peer or a timeout.
  bool test();
  // Blocks until done.
  void wait() { wait_until(Clock::time_point::max()); }
  // Blocks until done or `until` (the operation's own deadline still ends
  // it with an error), or until `yield` (when set) is non-zero: another
  // thread asks for the queue. True once done.
  bool wait_until(Clock::time_point until, const std::atomic<int>* yield = nullptr);
  const Status& result() const { return result_; }

  // For waiters (Waiter::await_suspend).
  void suspended(Waiter* w);
  // Told when this operation completes (null: nobody), from the thread that completes it.
  void watched_by(Progress* p) { watcher_.store(p, std::memory_order_seq_cst); }

  // Runs a whole operation on this thread (the blocking calls).
  static Status run(Task<Status> op, const DriveOptions& options);

 private:
  void resume();
  // One round: progress, test, and (past spin and yield) health, deadline
  // and abort. Ends the current wait with an error when there is one.
  // Returns true when the wait ended (ready or failed).
  bool round(Clock::duration waited);
  void report(Clock::duration waited);
  void finish();
  void mark_done();

  Task<Status> op_;
  DriveOptions opt_;
  Waiter* current_ = nullptr;
  Clock::time_point wait_began_{};
  Clock::time_point deadline_ = Clock::time_point::max();
  Clock::duration next_report_{};  // of the current wait
  // The current wait's budgets: spin until spin_, then yield until spin_yield_.
  Clock::duration spin_{}, spin_yield_{};
  bool crowd_asked_ = false;  // of the current wait
  void ask_about_the_crowd(Clock::duration waited);
  bool deadline_set_ = false;
  bool started_ = false;
  std::atomic<bool> done_{false};
  std::atomic<Progress*> watcher_{nullptr};
  Status result_;
};

template <class P>
void Waiter::await_suspend(std::coroutine_handle<P> h) {
  resume_point = h;
  h.promise().driver->suspended(this);
}

// The operations started on one group, oldest first. Whoever drives them
// holds the queue: the group's own thread (test, wait, a blocking call), or
// another group's wait loop lending a hand (try_progress), one at a time.
class Queue {
 public:
  // Whoever holds the queue drives it; a Hold waits for it. While a thread
  // waits here, a holder lending a hand (lend_a_hand) lets go.
  class Hold {
   public:
    explicit Hold(Queue& q);
    ~Hold();
    Hold(const Hold&) = delete;
    Hold& operator=(const Hold&) = delete;

   private:
    Queue& q_;
  };
  // Unless someone holds it: one non-blocking round for the oldest
  // operation. True when operations remain.
  bool try_progress();

  // Starts it at once when nothing is ahead of it.
  void push(std::shared_ptr<Driver> op);
  bool empty() const { return ops_.empty(); }
  // Progress up to `op` without blocking; true once `op` is done.
  bool test(Driver& op);
  // Completes everything up to and including `op`.
  void wait(Driver& op) { wait_until(op, Clock::time_point::max()); }
  // The same, giving up (without an error) at `until`, or when `yield` (when
  // set) is non-zero; true once `op` is done.
  bool wait_until(Driver& op, Clock::time_point until, const std::atomic<int>* yield = nullptr);
  // The progress thread's turn (progress.hpp), unless someone holds the
  // queue or asks for it: drives up to `op` until `until`, letting go as soon
  // as another thread asks for the queue. False when it did not get the queue.
  bool lend_a_hand(Driver& op, Clock::time_point until);
  // Completes everything started.
  void drain();

 private:
  void pop_done();
  void release();  // lets go of held_, waking a Hold that waits for it
  std::deque<std::shared_ptr<Driver>> ops_;
  std::atomic_flag held_ = ATOMIC_FLAG_INIT;
  std::atomic<int> wanted_{0};  // threads waiting in Hold
};

}  // namespace fastgather::engine
