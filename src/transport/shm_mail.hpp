// Point-to-point within a server (send/recv): one mailbox per ordered pair
// of the members of a group's shared-memory channel, in the channel's
// segment after its rings (ShmChannel::mail_area).
//
// A mailbox is a single-producer single-consumer ring of kSlots chunk
// slots: the sender fills them in turn, the receiver empties them in the
// same order. A message of n bytes travels as ceil(n / kChunk) chunks (one
// for an empty message), each slot's header saying which message it belongs
// to, its tag, its whole length and where the chunk lies in it. Two counters
// only grow: `posted` (written by the sender alone) and `taken` (by the
// receiver alone), each on a cache line of its own; chunk c goes to slot
// c % kSlots once taken >= c + 1 - kSlots. So a sender is never more than a
// ring ahead, messages from one member to another arrive in the order they
// were sent, and pairs never wait for one another.
//
// A message larger than the mailbox (kSingleCopyMin and up) travels in one
// slot without its bytes where it can be read where it lies: in the sender's
// region of the group's symmetric heap (the receiver copies it from there,
// as the collectives read a heap block in place), or, where the members can
// read each other's memory (the channel's capabilities().reads_peer_memory),
// at its address in the sender's memory (ShmChannel::read_peer). The header
// says where (`where`, `remote`); the receiver copies the bytes straight into
// its output (one copy instead of two, no round trip per chunk) and takes
// the slot; the sender's send is done once the slot is taken (taken() says
// so), its buffer read.
//
// A receiver that finds a message it cannot take (another length, another
// tag) refuses the mailbox with what it expected: from then on both sides
// fail on it, in the same words. The mailbox does not wait: it answers
// whether a chunk or a slot is there; the engine's waits (engine/waits.hpp)
// sleep on the members' futex words through the channel
// (ShmChannel::sleep_until), woken by ShmChannel::wake after a put or a take.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>

#include "fastgather/status.hpp"

namespace fastgather::transport {

class ShmChannel;

struct alignas(64) ChunkHeader {
  uint64_t message = 0;  // from 1, per mailbox
  int64_t tag = 0;
  uint64_t total = 0;    // the whole message's bytes
  uint64_t offset = 0;   // where this chunk lies in it
  uint64_t len = 0;      // this chunk's bytes
  // Where the bytes are (single copy: the whole message, len = total):
  // kInSlot, or at `remote`, an address in the sender's memory or an offset
  // in its heap region.
  enum Where : uint64_t { kInSlot = 0, kInMemory = 1, kInHeap = 2 };
  uint64_t where = kInSlot;
  uint64_t remote = 0;
};

class ShmMail {
 public:
  static constexpr int kSlots = 4;
  static constexpr size_t kChunk = 16 << 10;
  // Messages that would not fit the mailbox at once go by single copy where
  // the channel can read peers' memory.
  static constexpr size_t kSingleCopyMin = kSlots * kChunk + 1;
  // Up to this many bytes, a message of 4 KiB pages is read by
  // process_vm_readv too: its cost per page is below the mailbox's, whose
  // chunks are each handed over with a wait (fg-bench send_recv, private
  // input, 2 ranks: 96 KB 9.6 us against 23-237, 384 KB 32 against 145-307);
  // above it, the mailbox's two pipelined copies win (through torch, 6 and
  // 24 MB 1.2-1.4x faster; docs/benchmarks.md). Huge pages go by single copy
  // at any size.
  static constexpr size_t kReadInPlaceMax = 2 << 20;
  // The bytes of `members` members' mailboxes (0 for one member).
  static size_t bytes(int members);
  // Lays out fresh mailboxes at `base` (the channel's creator does).
  static void format(std::byte* base, int members);

  // Over the mailboxes of `ch` (which outlives this).
  explicit ShmMail(ShmChannel& ch);
  ShmMail(const ShmMail&) = delete;
  ShmMail& operator=(const ShmMail&) = delete;

  ShmChannel& channel() const { return ch_; }

  // Sending to member `to` (channel member index).
  // A slot is free for this member's next chunk to `to`.
  bool room(int to) const;
  // Writes the next chunk (len <= kChunk bytes at data) and publishes it;
  // for a single copy (`where` not kInSlot), only the header: the receiver
  // reads the whole message (len = total) where `remote` says. Returns the
  // chunk's count (from 1), for taken().
  uint64_t put(int to, uint64_t message, int64_t tag, uint64_t total, uint64_t offset, const std::byte* data, size_t len,
               ChunkHeader::Where where = ChunkHeader::kInSlot, uint64_t remote = 0);
  // The receiver has taken this member's chunks to `to` up to `count`.
  bool taken(int to, uint64_t count) const;
  // The number the next message to `to` takes (from 1).
  uint64_t next_message(int to) { return ++sent_[to]; }

  // Receiving from member `from`.
  // The next chunk from `from` is there: its header (nullptr: not yet).
  const ChunkHeader* peek(int from) const;
  const std::byte* chunk(int from) const;
  // Frees the chunk peek() showed.
  void take(int from);
  uint64_t next_received(int from) { return ++received_[from]; }
  // One receive at a time per sender: a receive from `from` (named, or any
  // source) owns it while it takes a message, so that two never share one.
  bool claim(int from);
  void release(int from);

  // A receiver that cannot take what `from` sent: says so in `from`'s
  // mailbox to this member (sticky), and returns the words both sides see.
  Status refuse(int from, uint64_t expected_bytes, int64_t expected_tag);
  // The mailbox between `from` and `to` was refused (by `to`): the words, or Ok.
  Status refused(int from, int to) const;

 private:
  struct Box;
  Box& box(int from, int to) const;

  ShmChannel& ch_;
  int members_;
  int me_;
  std::byte* base_;
  std::unique_ptr<uint64_t[]> sent_;
  std::unique_ptr<uint64_t[]> received_;
  std::unique_ptr<std::atomic<bool>[]> receiving_;
};

}  // namespace fastgather::transport
