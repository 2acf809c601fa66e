// The shared-memory channel of one group: per member, two post lines
// (rotated by step parity) and a data ring. It moves bytes and announces
// steps; it makes no decisions about algorithms.
//
// Synchronisation, in the shape of Open MPI's xhc and MPICH's release_gather:
// - every member owns a monotonically increasing step counter, published
//   with a release store on a cache line only that member writes;
// - a step's header and up to kInlineBytes of data share that line, so a
//   small message costs one line transfer;
// - post lines rotate by step parity: a member that has posted step t has
//   finished reading everyone's step t-1, so step t+1 can reuse the parity
//   of t-1 without a closing barrier (DeepSpeed/vLLM shm);
// - data goes to the next free bytes of the member's ring, not to a fixed
//   slot: writing over lines a peer read moments ago costs an invalidation
//   per line (several times the copy itself: docs/benchmarks.md), so lines are
//   reused only after the whole ring has gone round. A step takes at most a
//   quarter of the ring, so it never overlaps the previous step's bytes, the
//   only ones a peer may still be reading;
// - the channel does not wait: it answers whether a step has arrived, whether
//   a member is alive, and sleeps on a member's futex when asked. The engine
//   (engine/driver.hpp) owns the one wait loop around it.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "fastgather/status.hpp"
#include "transport/capabilities.hpp"
#include "transport/channel.hpp"
#include "transport/shm_heap.hpp"
#include "transport/shm_segment.hpp"
#include "transport/wait_policy.hpp"

namespace fastgather::transport {

constexpr size_t kInlineBytes = 32;

struct alignas(64) PostLine {
  std::atomic<uint64_t> step{0};  // stored last, with release
  PostHeader header;
  unsigned char inline_data[kInlineBytes];
};
static_assert(sizeof(PostLine) == 64);

struct alignas(64) MemberLine {
  std::atomic<uint32_t> futex_word{0};  // bumped on a post while someone sleeps
  std::atomic<uint32_t> sleepers{0};    // waiters asleep on futex_word
  std::atomic<int32_t> pid{0};
  std::atomic<uint32_t> aborted{0};  // this member gave up on the group
  // Single copy: where a peer may read this member's probe word, and what
  // this member found reading every peer's (0 not yet, 1 all read, 2 refused).
  std::atomic<uint64_t> probe_addr{0};
  std::atomic<uint32_t> read_verdict{0};
  // The CPU this member last posted from (-1: none yet). Stored only when it
  // changes, so the line stays in its readers' caches between migrations.
  std::atomic<int32_t> cpu{-1};
};

struct MemberCtl {
  PostLine post[2];
  MemberLine wake;
};

class ShmChannel final : public Channel {
 public:
  static size_t segment_bytes(int members, size_t ring_bytes);
  // The creator formats a fresh segment; the others attach to it. `me` is
  // this process's member index. Call publish_pid() then, once every member
  // is attached (a barrier), watch_members().
  // world_ranks[m] names member m in error messages; label names the group.
  ShmChannel(ShmSegment segment, std::vector<int> world_ranks, int me, size_t ring_bytes, std::string label);
  ~ShmChannel() override;

  // pipeline_bytes: see pipeline_bytes() (0: max_step_bytes()).
  static void format(std::byte* base, int members, size_t ring_bytes, size_t pipeline_bytes = 0);
  // What format() makes of a wanted pipeline_bytes: whole cache lines, at
  // least one, at most max_step_bytes().
  static size_t pipeline_bytes_for(size_t ring_bytes, size_t wanted);
  Status check_format() const;
  void publish_pid();
  Status watch_members();  // opens a pidfd per member: death is noticed at once
  void unlink_name() { segment_.unlink(); }

  int members() const override { return members_; }
  int world_rank(int member) const override { return world_ranks_[member]; }
  int me() const override { return me_; }
  size_t ring_bytes() const { return ring_bytes_; }
  // Largest step payload: a quarter of the ring, in whole cache lines.
  size_t max_step_bytes() const { return max_step_bytes_for(ring_bytes_); }
  static size_t max_step_bytes_for(size_t ring_bytes) { return ring_bytes / 4 / 64 * 64; }
  // The step in which a large block is streamed through the ring, so that
  // peers start reading its first piece while its owner copies the next:
  // the creator's choice (format()), the same for every member, so their
  // steps line up.
  size_t pipeline_bytes() const { return pipeline_bytes_; }
  const std::string& label() const override { return label_; }
  // What this channel can do (single copy and the heap as set so far).
  Capabilities capabilities() const override {
    return {.inline_bytes = kInlineBytes, .max_step_bytes = max_step_bytes(), .pipeline_bytes = pipeline_bytes_,
            .reads_peer_memory = single_copy_ && members_ > 1, .shared_heap = heap_ != nullptr};
  }

  uint64_t next_step() override { return ++step_; }
  uint64_t last_step() const override { return step_; }
  // Room for len <= max_step_bytes() bytes in this member's ring; *offset
  // goes into the step's PostHeader.
  std::byte* claim(size_t len, uint32_t* offset) override;
  const std::byte* member_data(int member, uint32_t offset) const {
    return data_ + static_cast<size_t>(member) * ring_bytes_ + offset;
  }
  // Where a step's bytes are: the member's ring, or its heap region.
  const std::byte* member_data(int member, const PostHeader& h) const {
    return h.in_heap != 0 && heap_ != nullptr ? heap_->member_data(member, h.offset) : member_data(member, h.offset);
  }
  // The group's symmetric heap (null: none), with the same member indices.
  // The channel reads from it; the group owns it.
  void set_heap(const ShmHeap* heap) { heap_ = heap; }
  const ShmHeap* heap() const override { return heap_; }
  // In place: in this member's heap region, where peers read them.
  std::optional<uint64_t> in_place(const std::byte* data, size_t len) const override {
    return heap_ != nullptr ? heap_->own_offset(data, len) : std::nullopt;
  }
  // Publishes this member's step, with header and optional inline bytes.
  // Every peer reads the post where it lies: readers changes nothing.
  void post(uint64_t step, const PostHeader& header, const void* inline_data = nullptr, size_t inline_len = 0,
            Readers readers = {}) override;
  // Single copy (CMA): a member reads a peer's bytes straight from the peer's
  // memory with process_vm_readv. Every member must be able to read every
  // other (ptrace permission; containers and seccomp may refuse), so the
  // members probe each other once, when the group is made, and use it only
  // when all succeeded. Call publish_probe() before the attach barrier and
  // probe_peers() after watch_members(); then wait (engine::verdict) for
  // every member's verdict, and set_single_copy() with what they said.
  void publish_probe();
  // Probes every peer (unless `try_it` is false: then it only says no) and
  // publishes this member's verdict, waking whoever waits for it; true when
  // it read every peer. *why says what refused it.
  bool probe_peers(bool try_it, std::string* why);
  // A member's verdict: none yet, or whether it read every peer.
  std::optional<bool> verdict(int member) const;
  // Sleeps until member publishes its verdict, at most `slice`.
  void sleep_for_verdict(int member, std::chrono::nanoseconds slice);
  void set_single_copy(bool all) { single_copy_ = all; }
  // The job's ranks on this host (the communicator's count): no crowd.
  void set_own_on_host(int ranks) { own_on_host_ = ranks; }
  bool crowded() const override { return host_oversubscribed(own_on_host_); }
  bool single_copy() const { return single_copy_; }
  // Copies len bytes at `remote` in member's memory to dst.
  Status read_peer(int member, std::byte* dst, uint64_t remote, size_t len) override;
  // The bytes read_peer() has copied so far (which way a message went).
  uint64_t bytes_read_from_peers() const { return bytes_read_.load(std::memory_order_relaxed); }

  // The CPU `member` last posted from (-1: not known): a peer that waits for
  // its next post on that same CPU cannot see it come by spinning.
  int member_cpu(int member) const override { return ctl(member).wake.cpu.load(std::memory_order_relaxed); }

  // Whether `member` has posted `step` (acquire: its bytes are visible).
  bool arrived(int member, uint64_t step) override {
    return ctl(member).post[step & 1].step.load(std::memory_order_acquire) >= step;
  }
  const PostLine& line(int member, uint64_t step) const { return ctl(member).post[step & 1]; }
  const PostHeader& header(int member, uint64_t step) const override { return line(member, step).header; }
  const std::byte* bytes(int member, uint64_t step, bool inline_data, size_t mine = 0) const override {
    const PostLine& l = line(member, step);
    return (inline_data ? reinterpret_cast<const std::byte*>(l.inline_data) : member_data(member, l.header)) + mine;
  }
  // Where the members' mailboxes lie (shm_mail.hpp), after the rings.
  std::byte* mail_area() const { return mail_; }
  // Wakes the peers asleep on this member's futex word: after a post, or
  // anything else they may wait for (a mailbox's chunk or freed slot).
  void wake();
  // Sleeps on `member`'s futex word until ready() (checked after this
  // member counts as a sleeper), member aborts, or `slice` passes.
  void sleep_until(int member, const std::function<bool()>& ready, std::chrono::nanoseconds slice);

  // Whether `member` is still there: an error once it died or aborted.
  Status check(int member) override;
  // The words for a wait on `member`'s `step` that outlasted `timeout`.
  Status timed_out(int member, uint64_t step, std::chrono::milliseconds timeout) const override;
  // Sleeps on `member`'s futex until it posts (or aborts) or `slice` passes.
  void sleep(int member, uint64_t step, std::chrono::nanoseconds slice) override;

  // A group that timed out or lost a member stays broken: every later call
  // returns the same error, and peers see this member as aborted.
  const Status& broken() const override { return broken_; }
  void abort(Status why) override;
  // From any thread, or a signal handler (atomics and a futex wake only):
  // peers see this member aborted, and every sleeper on the segment wakes
  // to look. The waiting thread then ends its call (engine/driver.hpp).
  void abort_now() noexcept;

 private:
  MemberCtl& ctl(int m) const { return ctl_[m]; }
  bool member_dead(int m) const;

  ShmSegment segment_;
  std::vector<int> world_ranks_;
  int members_;
  int me_;
  size_t ring_bytes_;
  size_t pipeline_bytes_ = 0;
  size_t cursor_ = 0;
  std::string label_;
  MemberCtl* ctl_ = nullptr;
  std::byte* data_ = nullptr;
  std::byte* mail_ = nullptr;
  const ShmHeap* heap_ = nullptr;
  uint64_t step_ = 0;
  int published_cpu_ = -1;
  std::vector<int> pidfds_;
  std::vector<int> pids_;
  Status broken_;
  bool single_copy_ = false;
  int own_on_host_ = 0;  // set_own_on_host
  uint64_t probe_word_ = 0;
  std::atomic<uint64_t> bytes_read_{0};
};

}  // namespace fastgather::transport
