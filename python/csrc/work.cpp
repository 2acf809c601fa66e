#include "work.hpp"

#include "backend.hpp"

namespace fastgather_torch {

void Flight::settle() {
  for (fg::Request& r : requests) {
    fg::Status s = r.wait();  // complete: returns its status
    if (status.ok() && !s.ok()) status = s;
  }
  settled = true;
  if (status.ok() && on_success) {
    try {
      on_success();
    } catch (const std::exception& e) {
      status = {fg::ErrorKind::kSystem, std::string("copying into the outputs: ") + e.what()};
    }
  }
  requests.clear();
  keep.clear();
  on_success = nullptr;
}

FastgatherWork::FastgatherWork(c10::intrusive_ptr<ProcessGroupFastgather> pg, int rank, c10d::OpType type,
                               std::vector<at::Tensor> result)
    : c10d::Work(rank, type), pg_(std::move(pg)), result_(std::move(result)) {}

FastgatherWork::~FastgatherWork() {
  std::lock_guard<std::mutex> lock(flight_->mu);
  if (flight_->settled || flight_->requests.empty()) return;
  flight_->requests.back().on_complete([f = flight_](const fg::Status&) {
    std::lock_guard<std::mutex> l(f->mu);
    if (!f->settled) f->settle();
  });
}

int FastgatherWork::sourceRank() const {
  std::lock_guard<std::mutex> lock(flight_->mu);
  TORCH_CHECK(flight_->settled && flight_->status.ok() && flight_->source >= 0,
              "fastgather: sourceRank() is known only once a receive from any source has completed");
  return flight_->source;
}

void FastgatherWork::submitted(bool in_background) {
  std::lock_guard<std::mutex> lock(flight_->mu);
  if (flight_->requests.empty()) {
    flight_->settle();
  } else if (in_background) {
    flight_->requests.back().drive_in_background();
  }
}

void FastgatherWork::complete() {
  {
    std::lock_guard<std::mutex> lock(flight_->mu);
    if (!flight_->settled) flight_->settle();
  }
  publish();
}

void FastgatherWork::publish() {
  fg::Status status;
  {
    std::lock_guard<std::mutex> lock(flight_->mu);
    if (!flight_->settled) return;
    status = flight_->status;
  }
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (completed_) return;
  }
  finish(status.ok() ? nullptr : exception_of(status));
  complete_future();
}

// Once the work is complete and someone asked for its future: exactly once,
// whichever of publish() and getFuture() comes second.
void FastgatherWork::complete_future() {
  c10::intrusive_ptr<c10::ivalue::Future> fut;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (!future_ || !completed_ || future_done_) return;
    future_done_ = true;
    fut = future_;
  }
  if (exception_) {
    fut->setError(exception_);
  } else {
    fut->markCompleted(c10::IValue(result_));
  }
}

bool FastgatherWork::isCompleted() {
  bool settled = false;
  {
    std::unique_lock<std::mutex> lock(flight_->mu, std::try_to_lock);
    if (lock.owns_lock()) {  // else another thread waits for it, or settles it
      if (!flight_->settled) {
        bool all = true;
        for (fg::Request& r : flight_->requests) {
          if (!r.test()) {
            all = false;
            break;
          }
        }
        if (all) flight_->settle();
      }
      settled = flight_->settled;
    }
  }
  if (settled) publish();
  std::lock_guard<std::mutex> lock(mutex_);
  return completed_;
}

bool FastgatherWork::wait(std::chrono::milliseconds timeout) {
  const bool forever = timeout == kNoTimeout;
  const auto deadline = forever ? Clock::time_point::max() : Clock::now() + timeout;
  bool done = true;
  {
    // The engine's own wait, on this thread (without a timeout, the group's
    // own deadline is the only one).
    std::lock_guard<std::mutex> lock(flight_->mu);
    if (!flight_->settled) {
      for (fg::Request& r : flight_->requests) {
        if (forever) {
          (void)r.wait();
          continue;
        }
        const auto left = std::chrono::duration_cast<std::chrono::microseconds>(deadline - Clock::now());
        if (!r.wait_for(std::max(left, std::chrono::microseconds(0)))) {
          done = false;
          break;
        }
      }
      if (done) flight_->settle();
    }
  }
  if (!done) {
    C10_THROW_ERROR(DistBackendError,
                    c10::str("fastgather: ", c10d::opTypeToString(opType_), " was not complete after wait(timeout=",
                             timeout.count(), " ms); it is still in flight (wait again, or destroy the group)"));
  }
  publish();
  std::lock_guard<std::mutex> lock(mutex_);
  if (exception_) std::rethrow_exception(exception_);
  return true;
}

c10::intrusive_ptr<c10::ivalue::Future> FastgatherWork::getFuture() {
  c10::intrusive_ptr<c10::ivalue::Future> fut;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (!future_) future_ = c10::make_intrusive<c10::ivalue::Future>(c10::ListType::create(c10::TensorType::get()));
    fut = future_;
  }
  {
    // Completed by the library once the requests are: its callbacks run on
    // its completion threads, where a Future callback may wait on another
    // collective while the progress thread drives that one.
    std::lock_guard<std::mutex> lock(flight_->mu);
    if (!flight_->settled && !future_asked_) {
      future_asked_ = true;
      flight_->requests.back().on_complete(
          [w = c10::intrusive_ptr<FastgatherWork>::reclaim_copy(this)](const fg::Status&) { w->complete(); });
    }
  }
  publish();  // already settled: complete it now
  complete_future();
  return fut;
}

void FastgatherWork::abort() { pg_->abort(); }

}  // namespace fastgather_torch
