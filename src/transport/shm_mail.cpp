#include "transport/shm_mail.hpp"

#include <cstring>
#include <new>

#include <fmt/format.h>

#include "transport/shm_channel.hpp"

namespace fastgather::transport {

struct alignas(64) SenderLine {
  std::atomic<uint64_t> posted{0};  // chunks published (release)
};

struct alignas(64) ReceiverLine {
  std::atomic<uint64_t> taken{0};     // chunks freed (release)
  std::atomic<uint32_t> refused{0};   // 1: the receiver could not take a message (the fields below say why)
  uint64_t message = 0;
  uint64_t want_bytes = 0;
  int64_t want_tag = 0;
  uint64_t got_bytes = 0;
  int64_t got_tag = 0;
};

struct ShmMail::Box {
  SenderLine s;
  ReceiverLine r;
  ChunkHeader h[kSlots];
  std::byte data[kSlots][kChunk];
};

namespace {
size_t boxes(int members) { return members > 1 ? static_cast<size_t>(members) * static_cast<size_t>(members - 1) : 0; }
}  // namespace

size_t ShmMail::bytes(int members) {
  static_assert(sizeof(ChunkHeader) == 64 && alignof(Box) == 64 && sizeof(Box) % 64 == 0);
  return boxes(members) * sizeof(Box);
}

void ShmMail::format(std::byte* base, int members) {
  for (size_t b = 0; b < boxes(members); ++b) new (base + b * sizeof(Box)) Box();
}

ShmMail::ShmMail(ShmChannel& ch)
    : ch_(ch),
      members_(ch.members()),
      me_(ch.me()),
      base_(ch.mail_area()),
      sent_(std::make_unique<uint64_t[]>(static_cast<size_t>(members_))),
      received_(std::make_unique<uint64_t[]>(static_cast<size_t>(members_))),
      receiving_(std::make_unique<std::atomic<bool>[]>(static_cast<size_t>(members_))) {}

// Boxes of sender `from`, one per other member, in member order.
ShmMail::Box& ShmMail::box(int from, int to) const {
  const size_t slot = static_cast<size_t>(from) * static_cast<size_t>(members_ - 1) +
                      static_cast<size_t>(to < from ? to : to - 1);
  return *reinterpret_cast<Box*>(base_ + slot * sizeof(Box));
}

bool ShmMail::room(int to) const {
  const Box& b = box(me_, to);
  const uint64_t next = b.s.posted.load(std::memory_order_relaxed);  // ours alone
  return b.r.taken.load(std::memory_order_acquire) + kSlots > next;
}

uint64_t ShmMail::put(int to, uint64_t message, int64_t tag, uint64_t total, uint64_t offset, const std::byte* data,
                      size_t len, ChunkHeader::Where where, uint64_t remote) {
  Box& b = box(me_, to);
  const uint64_t c = b.s.posted.load(std::memory_order_relaxed);
  const size_t slot = c % kSlots;
  b.h[slot] = ChunkHeader{
      .message = message, .tag = tag, .total = total, .offset = offset, .len = len, .where = where, .remote = remote};
  if (len != 0 && where == ChunkHeader::kInSlot) std::memcpy(b.data[slot], data, len);
  b.s.posted.store(c + 1, std::memory_order_release);
  ch_.wake();
  return c + 1;
}

bool ShmMail::taken(int to, uint64_t count) const {
  return box(me_, to).r.taken.load(std::memory_order_acquire) >= count;
}

const ChunkHeader* ShmMail::peek(int from) const {
  const Box& b = box(from, me_);
  const uint64_t c = b.r.taken.load(std::memory_order_relaxed);  // ours alone
  if (b.s.posted.load(std::memory_order_acquire) <= c) return nullptr;
  return &b.h[c % kSlots];
}

const std::byte* ShmMail::chunk(int from) const {
  const Box& b = box(from, me_);
  return b.data[b.r.taken.load(std::memory_order_relaxed) % kSlots];
}

void ShmMail::take(int from) {
  Box& b = box(from, me_);
  b.r.taken.store(b.r.taken.load(std::memory_order_relaxed) + 1, std::memory_order_release);
  ch_.wake();
}

bool ShmMail::claim(int from) {
  bool free = false;
  return receiving_[from].compare_exchange_strong(free, true, std::memory_order_acquire);
}

void ShmMail::release(int from) { receiving_[from].store(false, std::memory_order_release); }

Status ShmMail::refuse(int from, uint64_t expected_bytes, int64_t expected_tag) {
  Box& b = box(from, me_);
  if (b.r.refused.load(std::memory_order_acquire) == 0) {
    const ChunkHeader* h = peek(from);
    b.r.message = h != nullptr ? h->message : 0;
    b.r.got_bytes = h != nullptr ? h->total : 0;
    b.r.got_tag = h != nullptr ? h->tag : 0;
    b.r.want_bytes = expected_bytes;
    b.r.want_tag = expected_tag;
    b.r.refused.store(1, std::memory_order_release);
    ch_.wake();
  }
  return refused(from, me_);
}

Status ShmMail::refused(int from, int to) const {
  const Box& b = box(from, to);
  if (b.r.refused.load(std::memory_order_acquire) == 0) return Status::Ok();
  const int sender = ch_.world_rank(from);
  const int receiver = ch_.world_rank(to);
  return {ErrorKind::kMismatch,
          fmt::format("{}: rank {} sent {} bytes with tag {} to rank {}, which receives {} bytes with tag {} "
                      "(message {} from rank {}: sizes and tags must match; sends from rank {} to rank {} fail from now on)",
                      ch_.label(), sender, b.r.got_bytes, b.r.got_tag, receiver, b.r.want_bytes, b.r.want_tag,
                      b.r.message, sender, sender, receiver),
          receiver == ch_.world_rank(me_) ? sender : receiver};
}

}  // namespace fastgather::transport
