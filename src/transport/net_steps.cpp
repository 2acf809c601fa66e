#include "transport/net_steps.hpp"

#include <algorithm>
#include <cstring>
#include <span>

#include <fmt/format.h>

namespace fastgather::transport {
namespace {

// Members are never more than a step apart: the tag's 20 call bits may wrap.
uint32_t tag_call(uint64_t step) { return static_cast<uint32_t>(step & 0xfffff); }

}  // namespace

NetSteps::NetSteps(NetChannel& net, int members, size_t max_step_bytes)
    : net_(net), members_(members), max_step_(max_step_bytes), slots_(static_cast<size_t>(members) * 2) {
  for (int m = 0; m < members; ++m) {
    if (m == net.me()) continue;
    slot(m, 0).buf.resize(sizeof(PostHeader) + max_step_);
    slot(m, 1).buf.resize(sizeof(PostHeader) + max_step_);
  }
}

// A send buffer: a header for each peer (each says the length of its part),
// then the step's bytes.
size_t NetSteps::headers_bytes() const { return sizeof(PostHeader) * static_cast<size_t>(members_); }

// The send buffer of `step`: the one of step-2 is free again, since every
// peer has received that step before this member can post this one (a peer
// posts step-1 only once its wait for step-2 is over, and this member posts
// only once every peer's step-1 has arrived: the contract of channel.hpp).
std::byte* NetSteps::send_buffer(uint64_t step) {
  auto& b = send_bufs_[step & 1];
  if (b == nullptr) b = std::make_unique<std::byte[]>(headers_bytes() + max_step_);
  return b.get();
}

std::byte* NetSteps::claim(size_t len, uint32_t* offset) {
  *offset = 0;
  claimed_len_ = len;
  if (len > max_step_) {  // a schedule's bug (plans cut steps to capabilities().max_step_bytes): no write past a buffer
    abort({ErrorKind::kInvalidArgument, fmt::format("{}: a step of {} bytes, more than the {} a step holds", label(), len, max_step_)});
    oversize_.resize(len);
    return oversize_.data();
  }
  return send_buffer(step_) + headers_bytes();
}

void NetSteps::post(uint64_t step, const PostHeader& header, const void* inline_data, size_t inline_len, Readers readers) {
  std::byte* buf = send_buffer(step);
  size_t len = claimed_len_;
  claimed_len_ = 0;
  if (inline_data != nullptr || inline_len != 0) {
    if (inline_len > max_step_) {
      abort({ErrorKind::kInvalidArgument, fmt::format("{}: {} bytes inline, more than the {} a step holds", label(), inline_len, max_step_)});
      return;
    }
    len = inline_len;
    if (len != 0) std::memcpy(buf + headers_bytes(), inline_data, len);
  }
  send_step(step, header, buf, buf + headers_bytes(), len, readers);
}

void NetSteps::post_in_place(uint64_t step, const PostHeader& header, const std::byte* data, size_t len, Readers readers) {
  claimed_len_ = 0;
  send_step(step, header, send_buffer(step), data, len, readers);  // the buffer holds the headers only
}

void NetSteps::send_step(uint64_t step, const PostHeader& header, std::byte* buf, const std::byte* data, size_t len,
                         Readers readers) {
  if (!broken().ok()) return;
  // The peers' posts of this step, received where they are to land before
  // they come (what comes first waits in UCX's unexpected queue, one copy more).
  for (int p = 0; p < members_; ++p) {
    if (p != me() && !expect(p, step)) return;
  }
  for (int p = 0; p < members_; ++p) {
    if (p == me()) continue;
    size_t from = 0, part = len;  // what p reads
    if (readers.only >= 0 && p != readers.only) {
      part = 0;
    } else if (readers.each != 0) {
      from = std::min(readers.start(p), len);
      part = std::min(readers.most(), len - from);
    }
    if (part > max_step_) {  // a schedule's bug (plans cut steps to capabilities().max_step_bytes)
      abort({ErrorKind::kInvalidArgument, fmt::format("{}: a step of {} bytes for rank {}, more than the {} a step holds",
                                                      label(), part, world_rank(p), max_step_)});
      return;
    }
    auto* h = reinterpret_cast<PostHeader*>(buf) + p;
    *h = header;
    h->in_heap = 0;
    h->offset = static_cast<uint32_t>(part);  // the length of the part, checked on arrival
    const NetIov iov[2] = {{h, sizeof(PostHeader)}, {const_cast<std::byte*>(data) + from, part}};
    if (!net_.send(p, me(), tag_call(step), kStepPiece, std::span(iov, part == 0 ? 1 : 2)).ok()) return;  // broken: the next wait says why
  }
}

bool NetSteps::arrived(int member, uint64_t step) {
  Slot& s = slot(member, step);
  if (s.step != step && !expect(member, step)) return false;
  if (!s.done) take_completions();
  return s.done;
}

bool NetSteps::expect(int member, uint64_t step, std::byte* dst, size_t room) {
  Slot& s = slot(member, step);
  if (s.step != step) {
    if (s.step != 0 && !s.done) {  // the contract of channel.hpp broken: two receives into one buffer
      abort({ErrorKind::kInvalidArgument, fmt::format("{}: step {} of rank {} asked for before step {} arrived", label(),
                                                      step, world_rank(member), s.step)});
      return false;
    }
    s.step = step;
    s.done = false;
    s.dst = room != 0 ? dst : nullptr;
    s.room = room;
    // Into the buffer, or the header there, the bytes where they land and
    // what a peer that disagrees sends beyond their room into the buffer
    // (its header then differs, which lockstep names: a mismatch, not a
    // truncation that would break the channel).
    const NetIov whole{s.buf.data(), s.buf.size()};
    const NetIov split[3] = {{s.buf.data(), sizeof(PostHeader)}, {s.dst, s.room}, {s.buf.data() + sizeof(PostHeader), max_step_}};
    const int token = member * 2 + static_cast<int>(step & 1);
    const std::span<const NetIov> iov = s.dst != nullptr ? std::span<const NetIov>(split, 3) : std::span<const NetIov>(&whole, 1);
    if (!net_.recv(member, member, tag_call(step), kStepPiece, iov, token).ok()) return false;
  }
  return true;
}

void NetSteps::land(int member, uint64_t step, std::byte* dst, size_t len) { (void)expect(member, step, dst, len); }

void NetSteps::take_completions() {
  while (auto c = net_.poll_receive()) {
    Slot& d = slots_[static_cast<size_t>(c->token)];
    const int from = c->token / 2;
    const size_t said = c->length >= sizeof(PostHeader) ? sizeof(PostHeader) + d.header().offset : 0;
    if (said == 0 || c->length != said) {
      abort({ErrorKind::kMismatch,
             fmt::format("{}: rank {} sent a step of {} bytes, not a header and the {} bytes it announces", label(),
                         world_rank(from), c->length, said == 0 ? 0 : said - sizeof(PostHeader)),
             world_rank(from)});
      return;
    }
    // Landed, a part larger than its room can only come from a peer whose
    // header differs (a member's part of a step follows from the call its
    // header names): lockstep names the mismatch and reads none of it.
    d.done = true;
  }
}

Status NetSteps::check(int /*member*/) { return net_.check("waiting for a step", lost_since_); }

Status NetSteps::timed_out(int member, uint64_t step, std::chrono::milliseconds timeout) const {
  if (member == me()) {  // its own sends (engine::Sent)
    return {ErrorKind::kTimeout, fmt::format("{}: rank {}'s sends of step {} did not complete within {} ms", label(),
                                             world_rank(me()), step, timeout.count())};
  }
  const int who = world_rank(member);
  return {ErrorKind::kTimeout, fmt::format("{}: rank {} did not arrive within {} ms (rank {} waiting at step {})", label(),
                                           who, timeout.count(), world_rank(me()), step),
          who};
}

void NetSteps::sleep(int /*member*/, uint64_t /*step*/, std::chrono::nanoseconds slice) { net_.sleep(slice); }

}  // namespace fastgather::transport
