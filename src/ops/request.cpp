#include "ops/request.hpp"

namespace fastgather {

Request::Request(std::shared_ptr<State> state) : state_(std::move(state)) {}
Request::Request(Request&&) noexcept = default;

Request& Request::operator=(Request&& o) noexcept {
  if (this != &o) {
    this->~Request();
    new (this) Request(std::move(o));
  }
  return *this;
}

Request::~Request() {
  if (!state_ || state_->driver->done()) return;
  try {
    engine::Queue::Hold hold(*state_->queue);
    state_->queue->wait(*state_->driver);
  } catch (...) {
    // An exception from a sink (bad_alloc, say) has nowhere to go from here.
  }
}

// A done request never touches its queue again: its group may be gone.
bool Request::test() {
  if (!state_ || state_->driver->done()) return true;
  engine::Queue::Hold hold(*state_->queue);
  return state_->queue->test(*state_->driver);
}

bool Request::wait_for(std::chrono::microseconds timeout) {
  if (!state_ || state_->driver->done()) return true;
  engine::Queue::Hold hold(*state_->queue);
  return state_->queue->wait_until(*state_->driver, engine::Clock::now() + timeout);
}

void Request::drive_in_background() { on_complete(nullptr); }

void Request::on_complete(std::function<void(const Status&)> done) {
  if (!state_ || state_->progress == nullptr) {
    if (done) done(wait());
    return;
  }
  state_->progress->watch(state_->driver, state_->queue, std::move(done));
}

Status Request::wait() {
  if (!state_) return Status::Ok();
  if (!state_->driver->done()) {
    engine::Queue::Hold hold(*state_->queue);
    state_->queue->wait(*state_->driver);
  }
  return state_->driver->result();
}

}  // namespace fastgather
