// How bytes cross servers: UCX (UCP tag matching). One UcxContext per
// process; one NetChannel per group that spans servers, with its own worker
// and endpoints to the group's members on other servers, so that a failure
// breaks only the groups that lost a member.
//
// A message is identified by its tag: group id (16 bits), the member whose
// bytes it carries (12), the group's call counter (20) and the piece of the
// call (16: below 32767 a collective's pieces, 32767 the steps', from 32768
// point-to-point messages, their number in the call field). Members are
// never more than one call apart (a call completes only once every peer
// has sent its part of it), so the counter may wrap.
// The transport moves iovecs and reports completions; what the bytes mean,
// and in which order to post them, is the algorithm's business.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <atomic>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "fastgather/status.hpp"
#include "transport/capabilities.hpp"

namespace fastgather::transport {

constexpr int kMaxNetMembers = 1 << 12;
constexpr uint32_t kMaxNetPieces = 1u << 16;

struct NetIov {
  void* data;
  size_t len;
};

// Whether this process has UCX's libraries mapped at all (from
// /proc/self/maps: loaded by the first UcxContext, or by anyone else).
bool ucx_mapped();

// One per process: UCX's context (transports, their configuration). The
// first one loads UCX (ucx_api.hpp); a process that makes none never does.
class UcxContext {
 public:
  struct Options {
    // All servers share this host (simulated servers): keep UCX to TCP on the
    // loopback device, unless UCX_TLS / UCX_NET_DEVICES say otherwise.
    bool loopback = false;
  };
  static Result<std::unique_ptr<UcxContext>> create(const Options& options);
  ~UcxContext();
  UcxContext(const UcxContext&) = delete;
  UcxContext& operator=(const UcxContext&) = delete;
  // "UCX 1.13.1, UCX_TLS=tcp, ..." and the like.
  const std::string& describe() const;

  struct Impl;
  Impl* impl() const { return impl_.get(); }

 private:
  explicit UcxContext(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

// One per group that spans servers (owned by its NetChannel): groups never
// share a worker, so different groups may be driven from different threads,
// and one group's failure or traffic never touches another's.
class UcxWorker {
 public:
  static Result<std::unique_ptr<UcxWorker>> create(UcxContext& context);
  ~UcxWorker();
  UcxWorker(const UcxWorker&) = delete;
  UcxWorker& operator=(const UcxWorker&) = delete;
  // The worker's address, to publish through the rendezvous store.
  const std::string& address() const;

  struct Impl;
  Impl* impl() const { return impl_.get(); }

 private:
  explicit UcxWorker(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

class NetChannel {
 public:
  // world_ranks[m] names member m; addresses[m] is its worker address ("" for
  // members this member never talks to over the network, itself included).
  static Result<std::unique_ptr<NetChannel>> connect(std::unique_ptr<UcxWorker> worker, uint16_t group_id,
                                                     std::vector<int> world_ranks, int me,
                                                     const std::vector<std::string>& addresses, std::string label);
  ~NetChannel();
  NetChannel(const NetChannel&) = delete;
  NetChannel& operator=(const NetChannel&) = delete;

  int me() const { return me_; }
  int world_rank(int member) const { return world_ranks_[member]; }
  const std::string& label() const { return label_; }
  // What every NetChannel can do: post every piece at once, each received
  // where it lands; no more pieces than the tag numbers below the steps'
  // (NetSteps::kStepPiece, the last number without kPointToPointPiece's bit).
  static constexpr Capabilities capabilities() { return {.max_pieces = kMaxNetPieces / 2 - 1, .many_in_flight = true}; }
  // The bit of the piece number that marks a point-to-point message; the
  // piece's other 15 bits hold its tag's fold (point_to_point_piece).
  static constexpr uint32_t kPointToPointPiece = kMaxNetPieces / 2;
  static uint32_t point_to_point_piece(int64_t tag);
  // Every member calls this once per collective, in the same order.
  uint32_t next_call() { return ++call_; }

  // Nonblocking. `owner` is the member whose bytes the message carries (the
  // sender, or a server leader forwarding for it); `token` comes back from
  // poll_receive() when a receive completes. Buffers must stay valid until
  // poll_receive()/poll_sends() has reported them, or until the channel broke.
  Status send(int to, int owner, uint32_t call, uint32_t piece, std::span<const NetIov> iov);
  // The bytes this member has handed to send() so far, headers included:
  // what it put on the wire (tests hold the schedules to their byte counts).
  uint64_t bytes_sent() const { return bytes_sent_.load(std::memory_order_relaxed); }
  Status recv(int from, int owner, uint32_t call, uint32_t piece, std::span<const NetIov> iov, int token);
  struct Completion {
    int token;
    size_t length;  // bytes received (a shorter message than posted is the caller's to judge)
  };
  // Point-to-point (ops/p2p.cpp): this member's next message to `to`, and
  // the next one from `from`. Each pair and direction numbers its messages
  // alike (the tag's call field), so that they are taken in the order they
  // were sent; the piece marks them point-to-point and carries the fold of
  // the user's tag (point_to_point_piece), which a receive from any source
  // looks for; a receive from one member takes its next message whatever
  // the fold (the message carries its whole tag: the caller compares it).
  // Each is known by the id it returns, and only by it: poll_receive() and
  // poll_sends() ignore them, so that a collective never waits for a send
  // whose receiver has not come, nor takes a receive meant for a send/recv.
  Result<uint64_t> send_message(int to, int64_t tag, std::span<const NetIov> iov);
  Result<uint64_t> recv_message(int from, std::span<const NetIov> iov);
  // A receive from any of the members `from`: the first (from a different
  // one each time) whose next message has arrived with `tag`'s fold, its
  // receive posted into iov as recv_message(member, iov) would; nothing
  // when no such message is here yet (it progresses the worker first). A
  // member's next message carrying another tag is left for another receive;
  // tags of the same fold (1 and 32768) are told apart only by the caller,
  // once the message is taken.
  struct AnyMessage {
    uint64_t id;
    int from;
  };
  Result<std::optional<AnyMessage>> recv_any_message(std::span<const int> from, int64_t tag, std::span<const NetIov> iov);
  // Whether the message is sent / received (its length), or its error;
  // once it says so the id is forgotten.
  Result<bool> message_sent(uint64_t id);
  Result<std::optional<size_t>> message_received(uint64_t id);
  // The channel does not wait (the engine does, engine/driver.hpp). It says:
  // a receive that completed since the last call (each reported once);
  std::optional<Completion> poll_receive();
  // whether every send posted so far has completed;
  bool poll_sends();
  // A call may end with a rendezvous send in flight whose bytes the
  // receiver fetches through this member's progress; a member whose call is
  // done may go on to wait on something else (another library's
  // collective) with nobody progressing UCX, and its peer would wait
  // forever (seen through torch across two hosts: a gloo all_gather after a
  // fastgather all_reduce hung). start_flush() marks the sends posted so
  // far: 0 when none of them is in flight, else the mark for flushed(mark),
  // which progresses and polls, true once none of those sends is in flight.
  // Later sends are not waited for: while calls keep coming, each flush
  // still ends.
  uint64_t start_flush();
  bool flushed(uint64_t mark);
  // whether anything is in flight (then the worker needs progress());
  bool busy() const;
  // whether what is awaited can still come: an error once a peer is lost
  // (after a short grace, during which what others sent still arrives; the
  // caller keeps `lost_since` between calls of one wait), or an operation
  // failed (a truncated message is a kMismatch);
  Status check(const char* what, std::optional<std::chrono::steady_clock::time_point>& lost_since);
  // the words for a wait that outlasted `timeout`;
  Status timed_out(const char* what, std::chrono::milliseconds timeout) const;
  // and it sleeps until the worker has events, at most `slice`.
  void sleep(std::chrono::nanoseconds slice);

  // Sticky: after a timeout, a lost peer or a mismatch, every later call
  // fails with the same status. fail() cancels what is in flight. Written
  // once, then published: any thread may ask.
  const Status& broken() const { return failed_.load(std::memory_order_acquire) ? broken_ : ok_; }
  void fail(Status why);

  // Closing, in the way of Open MPI's UCX layer: every rank starts a flushing
  // close of its endpoints, progresses until they are closed (closed()), and
  // keeps progressing in a fence until every rank is done, so that nobody's
  // last bytes are lost to a peer that has already gone.
  void begin_close();
  bool closed();  // polls; true once every close has completed
  void progress();

  struct Impl;

 private:
  NetChannel() = default;
  size_t pending_receives() const;
  // recv(), with the bits of the tag that must match (mask).
  Status post_recv(int from, uint64_t tag, uint64_t mask, std::span<const NetIov> iov, int token);
  std::unique_ptr<Impl> impl_;
  std::vector<int> world_ranks_;
  int me_ = -1;
  uint32_t call_ = 0;
  std::string label_;
  Status broken_;
  std::atomic<bool> failed_{false};  // broken_ is written
  std::atomic<uint64_t> bytes_sent_{0};
  Status ok_;
  // A group's collectives and its sends and receives (each on a queue of
  // their own, engine/driver.hpp) may be driven by different threads at
  // once: every call that touches the worker or the lists of operations
  // holds this (recursive: fail() from inside send()).
  mutable std::recursive_mutex mu_;
};

}  // namespace fastgather::transport
