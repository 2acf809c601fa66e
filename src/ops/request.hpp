// How the ops hand a collective (a coroutine) to the engine: queued on its
// group as a Request, or run at once on this thread when the group has
// nothing in flight (the blocking calls: no shared state, no allocation).
#pragma once

#include <memory>
#include <span>
#include <vector>

#include <fmt/format.h>

#include "core/group_impl.hpp"
#include "engine/driver.hpp"
#include "engine/progress.hpp"
#include "engine/waits.hpp"
#include "fastgather/ops.hpp"

namespace fastgather {

struct Request::State {
  std::shared_ptr<engine::Driver> driver;
  engine::Queue* queue = nullptr;
  std::shared_ptr<engine::Progress> progress;  // the communicator's (it may be finalized)
};

inline engine::Task<Status> fail_with(Status s) { co_return s; }

struct RequestAccess {
  static Status aborted(const Group& g) {
    return {ErrorKind::kAborted, fmt::format("{}: the communicator was aborted", g.describe())};
  }
  static bool is_aborted(const Group::Impl& gi) {
    return gi.aborted != nullptr && gi.aborted->load(std::memory_order_acquire) != 0;
  }
  // On `queue` (the group's collectives' unless given: point-to-point runs
  // on queues of its own, Group::Impl::sends and receives).
  static Request start(Group& g, engine::Task<Status> op, engine::Queue* queue = nullptr) {
    Group::Impl& gi = *impl_of(g);
    engine::Queue& q = queue != nullptr ? *queue : gi.queue;
    if (is_aborted(gi)) op = fail_with(aborted(g));
    auto state = std::make_shared<Request::State>();
    state->driver = std::make_shared<engine::Driver>(std::move(op), gi.drive_options());
    state->queue = &q;
    state->progress = gi.progress;
    engine::Queue::Hold hold(q);
    q.push(state->driver);
    return Request(std::move(state));
  }
  // A request that failed before it was queued (its arguments): complete,
  // with `why`.
  static Request failed(Group& g, Status why) {
    Group::Impl& gi = *impl_of(g);
    auto state = std::make_shared<Request::State>();
    state->driver = std::make_shared<engine::Driver>(fail_with(std::move(why)), gi.drive_options());
    state->driver->start();  // to its end: it waits for nothing
    state->queue = &gi.queue;
    state->progress = gi.progress;
    return Request(std::move(state));
  }
  // After a call between servers: its sends still in flight driven to their
  // end in the background (NetChannel::start_flush), on a queue of the
  // group's that nothing waits behind, by the progress thread once nobody
  // else drives it. Costs nothing where none is in flight.
  static void flush_in_background(Group::Impl& gi) {
    if (gi.net == nullptr || gi.progress == nullptr) return;
    const uint64_t mark = gi.net->start_flush();
    if (mark == 0) return;
    auto driver = std::make_shared<engine::Driver>(flush_op(*gi.net, mark), gi.drive_options());
    {
      engine::Queue::Hold hold(gi.flushes);
      gi.flushes.push(driver);
    }
    gi.progress->watch(driver, &gi.flushes, nullptr);
  }
  static engine::Task<Status> flush_op(transport::NetChannel& net, uint64_t mark) {
    co_return co_await engine::flushed(net, mark);
  }
  static Status run(Group& g, engine::Task<Status> op, engine::Queue* queue = nullptr) {
    Group::Impl& gi = *impl_of(g);
    engine::Queue& q = queue != nullptr ? *queue : gi.queue;
    if (is_aborted(gi)) return aborted(g);
    {
      engine::Queue::Hold hold(q);
      if (q.empty()) return engine::Driver::run(std::move(op), gi.drive_options());
    }
    return start(g, std::move(op), &q).wait();
  }
};

namespace ops {

// A request's own copy of an argument: the value itself, a vector for a span.
template <class T>
T own(const T& x) {
  return x;
}
template <class T>
std::vector<T> own(std::span<const T> s) {
  return {s.begin(), s.end()};
}

// Runs `Op` over arguments that live in this frame (a request's copies).
template <auto Op, class... Args>
engine::Task<Status> owning(Group& g, Args... args) {
  co_return co_await Op(g, args...);
}

// Every op's one way in, as NCCL's ncclEnqueueCheck: `Op` is the op's
// coroutine (argument checks, plan, schedule) over references to its
// arguments. call<Op> runs it on the caller's arguments where they are (no
// copy; with nothing in flight on the group, on a Driver on the stack);
// start<Op> queues it as a Request over copies it owns while in flight.
template <auto Op, class... Args>
Status call(Group& g, const Args&... args) {
  return RequestAccess::run(g, Op(g, args...));
}
template <auto Op, class... Args>
Request start(Group& g, const Args&... args) {
  return RequestAccess::start(g, owning<Op>(g, own(args)...));
}

}  // namespace ops

}  // namespace fastgather
