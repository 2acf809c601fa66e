// The one interface every schedule runs over (algo/lockstep.hpp): a group's
// members take numbered steps; in each, a member posts a header and its
// bytes, and reads its peers' posts of the same step. The shared-memory
// channel (shm_channel.hpp) and the steps over UCX (net_steps.hpp) implement
// it; what one can do that the other cannot (read a peer's memory, a shared
// heap, bytes inline with the announcement) is data, in capabilities(), that
// the planner reads: a schedule never asks which channel it runs on.
//
// The contract a schedule keeps, and a channel relies on: a member posts
// step t+1 only after it has read the posts of step t it waits for, so no
// member is ever more than one step ahead of a peer that waits for it; a
// peer's bytes of step t stay readable until this member posts again.
//
// A channel does not wait. It answers whether a peer's step has arrived and
// whether the peer is still there, and sleeps when asked; the engine
// (engine/driver.hpp, engine/waits.hpp) owns the one wait loop around it.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>

#include "fastgather/status.hpp"
#include "transport/capabilities.hpp"

namespace fastgather::transport {

class ShmHeap;  // shm_heap.hpp

// What a member says of a step besides its bytes.
struct PostHeader {
  uint64_t bytes = 0;  // payload of the whole call per member
  uint64_t aux = 0;    // op-specific (k for the fused op)
  uint8_t op = 0;
  uint8_t algo = 0;    // which schedule: members must agree, or their steps would not line up
  uint8_t dtype = 0;
  uint8_t in_heap = 0;  // 1: this step's bytes are in the member's symmetric-heap region, not its ring
  uint32_t offset = 0;  // where this step's bytes start in the member's ring (or heap region)
  // Same collective with the same shape (where the bytes sit may differ).
  bool same_call(const PostHeader& o) const {
    return bytes == o.bytes && aux == o.aux && op == o.op && algo == o.algo && dtype == o.dtype;
  }
};

// Which peers read which bytes of a post: a channel that sends each peer
// its own copy (NetSteps) sends each only what it reads; one that
// publishes a post for all to read (shared memory) ignores it.
struct Readers {
  int only = -1;    // the one peer that reads the bytes (-1: every peer; the others still see the header)
  // each non-zero: peer d reads `length` bytes (0: each) from base + d x each
  // of the post on, clipped to the post's length.
  size_t each = 0;
  size_t base = 0;
  size_t length = 0;
  // Where peer `d`'s part starts in the post, and how long it is at most.
  size_t start(int d) const { return base + each * static_cast<size_t>(d); }
  size_t most() const { return length != 0 ? length : each; }
};

class Channel {
 public:
  virtual ~Channel() = default;

  virtual int members() const = 0;
  virtual int me() const = 0;
  // The job's rank of `member`, for error messages; label() names the group.
  virtual int world_rank(int member) const = 0;
  virtual const std::string& label() const = 0;
  virtual Capabilities capabilities() const = 0;

  // Steps are numbered from 1, the same on every member.
  virtual uint64_t next_step() = 0;
  virtual uint64_t last_step() const = 0;
  // Room for len <= capabilities().max_step_bytes bytes of this member's next
  // post; *offset goes into the step's PostHeader.
  virtual std::byte* claim(size_t len, uint32_t* offset) = 0;
  // Publishes this member's step: the header, and either inline bytes
  // (at most capabilities().inline_bytes) or the bytes claimed for it, of
  // which each peer reads what `readers` says. A failure breaks the channel
  // (broken()), which the next wait sees.
  virtual void post(uint64_t step, const PostHeader& header, const void* inline_data = nullptr, size_t inline_len = 0,
                    Readers readers = {}) = 0;
  // Whether `member` has posted `step` (its bytes are then visible here).
  virtual bool arrived(int member, uint64_t step) = 0;
  // A post that arrived: its header, and where the part of its bytes that
  // this member reads is readable (inline_data: the post carried them
  // inline; mine: where that part starts in the post, Readers::start(me()))
  // until this member posts again.
  virtual const PostHeader& header(int member, uint64_t step) const = 0;
  virtual const std::byte* bytes(int member, uint64_t step, bool inline_data, size_t mine = 0) const = 0;

  // Posting bytes where they lie. in_place(): whether this member's len
  // bytes at `data` may be posted so (with capabilities().shared_heap: their
  // offset in this member's heap region, where peers read them; with
  // sends_from_source: 0, from anywhere) or must be copied (nullopt). Then
  // post_in_place() posts them (the header's in_heap and offset set from
  // in_place()); they must stay unchanged until the call ends: a heap's
  // readers say "done reading" in a last step, a channel that sends them
  // says sent().
  virtual std::optional<uint64_t> in_place(const std::byte* /*data*/, size_t /*len*/) const { return std::nullopt; }
  virtual void post_in_place(uint64_t step, const PostHeader& header, const std::byte* /*data*/, size_t /*len*/,
                             Readers readers) {
    post(step, header, nullptr, 0, readers);
  }
  // Whether every post's bytes have left this member's memory.
  virtual bool sent() { return true; }
  // With capabilities().receives_in_place, before this member posts `step`:
  // member's part of that step (at most len bytes) is to land at dst, and
  // bytes() will say dst. Ignored by a channel whose peers' posts are read
  // where they lie.
  virtual void land(int /*member*/, uint64_t /*step*/, std::byte* /*dst*/, size_t /*len*/) {}

  // Whether `member` is still there: an error once it died or left.
  virtual Status check(int member) = 0;
  // The words for a wait on `member`'s `step` that outlasted `timeout`.
  virtual Status timed_out(int member, uint64_t step, std::chrono::milliseconds timeout) const = 0;
  // Blocks until `member` may have posted `step`, at most `slice`.
  virtual void sleep(int member, uint64_t step, std::chrono::nanoseconds slice) = 0;
  // The CPU `member` last posted from (-1: not known): a peer that waits for
  // its next post on that same CPU cannot see it come by spinning.
  virtual int member_cpu(int /*member*/) const { return -1; }

  // Sticky: once a wait failed (timeout, lost member, mismatch), every later
  // call fails with the same status, and peers learn it where they can.
  virtual const Status& broken() const = 0;
  virtual void abort(Status why) = 0;

  // With capabilities().shared_heap: the members' symmetric heap, where a
  // step's bytes may lie in place (PostHeader::in_heap). Null otherwise.
  virtual const ShmHeap* heap() const { return nullptr; }
  // With capabilities().reads_peer_memory: copies len bytes at `remote` in
  // member's memory to dst.
  virtual Status read_peer(int member, std::byte* dst, uint64_t remote, size_t len);
  // Whether more tasks want this host's cores than it has, beyond the job's
  // own ranks (host_oversubscribed, sampled at most every 10 ms): there every
  // step a schedule waits for costs a time slice, so saving steps pays more
  // than it costs elsewhere (single copy of ordinary memory: allgather.cpp).
  virtual bool crowded() const { return false; }
};

}  // namespace fastgather::transport
