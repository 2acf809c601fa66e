// Progress owned by the library: a communicator's requests that their owner
// has handed over (Request::drive_in_background, Request::on_complete) are
// driven by the communicator's progress thread whenever nobody else drives
// them, and their completion callbacks run on completion threads - never on
// a thread that drives requests. So a callback may start collectives and
// wait for them (torch's PowerSGD hook waits on an all-reduce inside a
// Future callback): the progress thread keeps driving meanwhile, and that
// collective's own completion runs on another completion thread.
//
// The progress thread leaves a request alone for a grace after it was handed
// over (Progress::kGrace, longer while owners keep up): a caller that waits
// at once (a blocking call through torch) drives it on its own thread, with
// no hand-off. While it drives, it lets go of the
// group as soon as another thread asks for it (Queue::Hold), so an owner
// coming back to wait never waits behind it for long.
#pragma once

#include <chrono>
#include <functional>
#include <memory>

#include "engine/driver.hpp"
#include "fastgather/status.hpp"

namespace fastgather::engine {

// Runs each posted function on a thread of its own for as long as it runs:
// one that blocks (waiting for another request's completion) never holds up
// the next. Threads are kept while idle for kIdle, then leave; at most
// kMaxThreads at once, after which posts wait in order for a free one.
class Completions {
 public:
  static constexpr int kMaxThreads = 64;
  static constexpr auto kIdle = std::chrono::seconds(2);

  Completions();
  ~Completions();  // shutdown()
  Completions(const Completions&) = delete;
  Completions& operator=(const Completions&) = delete;

  void post(std::function<void()> fn);
  // Runs what was posted, then joins the threads (a call from one of them
  // leaves that one to finish on its own). A later post runs on a thread of
  // its own, never on the caller's.
  void shutdown();

  struct State;

 private:
  std::shared_ptr<State> st_;
};

using Completion = std::function<void(const Status&)>;

class Progress {
 public:
  // How long a handed-over request is left to its owner before the
  // progress thread drives it: a blocking call through torch is done well
  // before (tens of microseconds at most sizes), a request left while its
  // owner computes is driven from then on. While owners complete their
  // requests themselves the thread looks less and less often, up to
  // kMaxGrace: on a host whose cores the ranks keep busy each look preempts
  // a rank (through torch at 96 KB, a look every 250 us made a blocking
  // all-gather 5-15 us slower: docs/benchmarks.md); once it has had to drive
  // one, kGrace again. After kLinger without any request it sleeps until the
  // next is handed over.
  static constexpr auto kGrace = std::chrono::microseconds(500);
  static constexpr auto kMaxGrace = std::chrono::milliseconds(4);
  static constexpr auto kLinger = std::chrono::milliseconds(100);
  // The longest the progress thread waits in the engine at a time before
  // looking at its list again (an owner asking for the group ends it sooner).
  static constexpr auto kSlice = std::chrono::microseconds(200);

  Progress();
  ~Progress();  // shutdown()
  Progress(const Progress&) = delete;
  Progress& operator=(const Progress&) = delete;

  // `op` (started on `queue`) is driven by the progress thread once kGrace
  // has passed and it is still incomplete; with `done`, done(op's result) is
  // posted to the completion threads once it has completed. Watching an op
  // again adds `done` to it (each done runs once).
  void watch(const std::shared_ptr<Driver>& op, Queue* queue, Completion done);
  // `queue`'s operations have all completed (it was drained) and it is
  // going: their callbacks are posted, and the progress thread lets go of it.
  void forget(Queue* queue);
  // Stops the progress thread, posts the callbacks of whatever it watched
  // (their operations must have completed: the queues were drained) and
  // waits for every callback. Idempotent.
  void shutdown();

  // A watched operation with a callback has just completed (Driver::finish).
  void completed();

  struct State;

 private:
  std::shared_ptr<State> st_;
};

}  // namespace fastgather::engine
