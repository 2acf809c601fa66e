// A collective in flight, as torch's Work. It only adapts: the library's
// requests make progress on the caller's thread when it waits (no hand-off:
// a blocking call runs where it was made), and in the library's progress
// thread otherwise (Request::drive_in_background); the Future is completed
// from the library's completion threads (Request::on_complete), never from
// a thread that must drive other requests, so a Future callback may start
// a collective and wait for it.
#pragma once

#include <functional>
#include <memory>
#include <mutex>
#include <vector>

#include "common.hpp"

namespace fastgather_torch {

class ProcessGroupFastgather;

// What a collective holds until it completes: the library's requests (in the
// order started; each completes after the ones before it), the tensors they
// read and write, and what to do once they have (copy into non-contiguous
// outputs). Settled once, by whoever finds it complete first.
struct Flight {
  std::mutex mu;
  std::vector<fg::Request> requests;
  std::vector<at::Tensor> keep;      // alive until settled
  std::function<void()> on_success;  // after the requests, once
  bool settled = false;
  fg::Status status;
  int source = -1;  // a receive from any source: the group rank it came from, once complete

  // Under mu, every request complete: their status, then the copy-back.
  void settle();
};

class FastgatherWork : public c10d::Work {
 public:
  FastgatherWork(c10::intrusive_ptr<ProcessGroupFastgather> pg, int rank, c10d::OpType type,
                 std::vector<at::Tensor> result);
  // In flight still (dropped by Python, async_op=True): the flight goes to
  // the library, which completes and settles it; nothing here blocks.
  ~FastgatherWork() override;

  bool isCompleted() override;
  bool wait(std::chrono::milliseconds timeout) override;
  std::vector<at::Tensor> result() override { return result_; }
  // A receive from any source, once complete: who sent it.
  int sourceRank() const override;
  c10::intrusive_ptr<c10::ivalue::Future> getFuture() override;
  void abort() override;

  Flight& flight() { return *flight_; }
  // Every request started. In the background (async_op=True, send, recv): the
  // last one is handed to the library's progress thread, which drives it
  // while the caller's thread is elsewhere. Else (a blocking call: torch
  // waits on the Work at once) nothing is handed over: the wait drives it on
  // the caller's thread, and a Work dropped unwaited goes to the library then.
  void submitted(bool in_background = true);

 private:
  // Settles (if nobody has) and tells waiters and the future.
  void complete();
  void publish();
  void complete_future();

  c10::intrusive_ptr<ProcessGroupFastgather> pg_;
  std::vector<at::Tensor> result_;
  std::shared_ptr<Flight> flight_ = std::make_shared<Flight>();
  bool future_asked_ = false;                       // on_complete registered (flight mu)
  c10::intrusive_ptr<c10::ivalue::Future> future_;  // made on request (mutex_)
  bool future_done_ = false;                        // marked or given the error (mutex_)
};

}  // namespace fastgather_torch
