// Steps over UCX: the channel interface (channel.hpp) on a NetChannel, so
// that the schedules written for shared memory (algo/allgather.cpp,
// algo/reduce.cpp) run unchanged between servers. A step is one UCX message
// from each member to each peer: the member's header, then its bytes.
//
// Buffers: a member's post is sent from where it lies (post_in_place) or
// copied into the send buffer of its step's parity (claim()), and each peer
// is sent the header and the part of the post it reads (Readers: all of it,
// nothing but the header, or its own slice); a buffer is reused two steps
// later, when every peer has received what was sent from it. A peer's post of step
// t lands in its receive buffer of parity t: this member reads step t's bytes before it posts
// t+1, and a peer is never more than a step ahead (the contract of
// channel.hpp), so two buffers per peer suffice. The receives of a step are
// posted with this member's own post of it, before its sends.
//
// Every message is checked on arrival: the header's offset field carries
// the step's length, which must be what arrived and at most a step.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "transport/channel.hpp"
#include "transport/net_channel.hpp"

namespace fastgather::transport {

class NetSteps final : public Channel {
 public:
  // Steps among every member of `net` (each on a server of its own, so that
  // `net` has an endpoint to every peer), of at most max_step_bytes each.
  NetSteps(NetChannel& net, int members, size_t max_step_bytes);

  int members() const override { return members_; }
  int me() const override { return net_.me(); }
  int world_rank(int member) const override { return net_.world_rank(member); }
  const std::string& label() const override { return net_.label(); }
  // A step is as large as a UCX piece; nothing rides inline (a post is a
  // message either way), no peer's memory, no shared heap; bytes are sent
  // from where they lie and received where they land, where the schedule
  // allows.
  Capabilities capabilities() const override {
    return {.max_step_bytes = max_step_, .pipeline_bytes = max_step_, .sends_from_source = true, .receives_in_place = true};
  }

  uint64_t next_step() override { return ++step_; }
  uint64_t last_step() const override { return step_; }
  std::byte* claim(size_t len, uint32_t* offset) override;
  void post(uint64_t step, const PostHeader& header, const void* inline_data = nullptr, size_t inline_len = 0,
            Readers readers = {}) override;
  bool arrived(int member, uint64_t step) override;
  const PostHeader& header(int member, uint64_t step) const override { return slot(member, step).header(); }
  // The message holds only the part this member reads: where it landed.
  const std::byte* bytes(int member, uint64_t step, bool /*inline_data*/, size_t /*mine*/) const override {
    const Slot& s = slot(member, step);
    return s.dst != nullptr ? s.dst : s.buf.data() + sizeof(PostHeader);
  }
  std::optional<uint64_t> in_place(const std::byte*, size_t) const override { return 0; }
  void post_in_place(uint64_t step, const PostHeader& header, const std::byte* data, size_t len, Readers readers) override;
  bool sent() override { return net_.poll_sends(); }
  void land(int member, uint64_t step, std::byte* dst, size_t len) override;

  Status check(int member) override;
  Status timed_out(int member, uint64_t step, std::chrono::milliseconds timeout) const override;
  void sleep(int member, uint64_t step, std::chrono::nanoseconds slice) override;
  const Status& broken() const override { return net_.broken(); }
  void abort(Status why) override { net_.fail(std::move(why)); }

  // The piece number a step's messages carry in their tag (an Exchange on
  // the same NetChannel numbers its pieces below it).
  static constexpr uint32_t kStepPiece = NetChannel::kPointToPointPiece - 1;
  static_assert(NetChannel::capabilities().max_pieces <= kStepPiece && (kStepPiece & NetChannel::kPointToPointPiece) == 0);

 private:
  struct Slot {
    std::vector<std::byte> buf;  // header, then at most a step of bytes
    uint64_t step = 0;           // the step a receive was posted for (0: none)
    bool done = false;
    // Where the step's bytes land instead (land()), and their room there.
    std::byte* dst = nullptr;
    size_t room = 0;
    const PostHeader& header() const { return *reinterpret_cast<const PostHeader*>(buf.data()); }
  };
  Slot& slot(int member, uint64_t step) { return slots_[static_cast<size_t>(member) * 2 + (step & 1)]; }
  const Slot& slot(int member, uint64_t step) const { return slots_[static_cast<size_t>(member) * 2 + (step & 1)]; }
  // Posts the receive of member's post of `step` (its bytes into dst, room
  // bytes, where given; else into the slot's buffer), unless it is posted
  // already; false when the channel broke.
  bool expect(int member, uint64_t step, std::byte* dst = nullptr, size_t room = 0);
  // Takes every receive that completed since the last look.
  void take_completions();
  std::byte* send_buffer(uint64_t step);
  // Sends each peer the header and its part of len bytes at data (headers in buf).
  void send_step(uint64_t step, const PostHeader& header, std::byte* buf, const std::byte* data, size_t len, Readers readers);
  size_t headers_bytes() const;

  NetChannel& net_;
  int members_;
  size_t max_step_;
  uint64_t step_ = 0;
  std::vector<Slot> slots_;  // two per member (its own unused)
  // Send buffers, by step parity (send_buffer()), made at first use.
  std::unique_ptr<std::byte[]> send_bufs_[2];
  size_t claimed_len_ = 0;
  std::vector<std::byte> oversize_;  // where a step too large for a buffer is written, never sent
  std::optional<std::chrono::steady_clock::time_point> lost_since_;
};

}  // namespace fastgather::transport
