#include "algo/allgather.hpp"

#include <cstring>
#include <string>

#include <fmt/format.h>

#include "fastgather/tensor.hpp"

namespace fastgather::algo {
namespace {

constexpr ProtocolRule kRules[] = {
    {transport::kInlineBytes, Protocol::kInline, "inline"},
    {SIZE_MAX, Protocol::kRing, "ring"},
};

std::string describe(const GatherCall& call, const transport::PostHeader& h) {
  auto dt = static_cast<DType>(h.dtype);
  std::string s = fmt::format("{} {} bytes of {}", op_name(static_cast<OpCode>(h.op)), h.bytes,
                              h.bytes == 0 && h.dtype == 0 ? "-" : dtype_name(dt));
  if (call.op == OpCode::kAllGatherMatmul) s += fmt::format(" with {}={}", call.aux_name, h.aux);
  return s;
}

// Compares a peer's header with ours; on a mismatch appends a sentence.
void compare(const transport::ShmChannel& ch, const GatherCall& call, const transport::PostHeader& mine,
             int peer, const transport::PostHeader& theirs, std::string* why) {
  if (theirs.same_call(mine)) return;
  if (!why->empty()) *why += "; ";
  *why += fmt::format("rank {} sent {}, rank {} expected {}", ch.world_rank(peer), describe(call, theirs),
                      ch.world_rank(ch.me()), describe(call, mine));
}

}  // namespace

const char* op_name(OpCode op) {
  switch (op) {
    case OpCode::kAllGather: return "all_gather";
    case OpCode::kAllGatherMatmul: return "all_gather_matmul";
    case OpCode::kBarrier: return "barrier";
  }
  return "unknown-op";
}

std::span<const ProtocolRule> protocol_table() { return kRules; }

const ProtocolRule& choose_protocol(size_t bytes) {
  for (const auto& r : kRules) {
    if (bytes <= r.max_bytes) return r;
  }
  return kRules[std::size(kRules) - 1];
}

size_t max_piece(const transport::ShmChannel& channel, size_t align) {
  return channel.max_step_bytes() / align * align;
}

Status gather(transport::ShmChannel& ch, const GatherCall& call, PieceSink sink) {
  if (!ch.broken().ok()) return ch.broken();
  const int n = ch.members();
  const int me = ch.me();
  transport::PostHeader mine{call.bytes, call.aux, static_cast<uint16_t>(call.op), static_cast<uint16_t>(call.dtype), 0};
  const Protocol protocol = choose_protocol(call.bytes).protocol;
  const size_t chunk = protocol == Protocol::kInline ? call.bytes : max_piece(ch, call.align);
  if (protocol == Protocol::kRing && chunk == 0) {
    return {ErrorKind::kUnsupported, fmt::format("{}: a {}-byte row exceeds the {}-byte step of a {}-byte ring",
                                                 ch.label(), call.align, ch.max_step_bytes(), ch.ring_bytes())};
  }
  std::string mismatch;
  size_t offset = 0;
  bool first = true;
  // At least one step even for 0 bytes, so disagreeing sizes are noticed.
  while (first || offset < call.bytes) {
    const size_t len = std::min(chunk, call.bytes - offset);
    const uint64_t step = ch.next_step();
    if (protocol == Protocol::kInline) {
      ch.post(step, mine, call.input, len);
    } else {
      uint32_t at = 0;
      std::byte* dst = ch.claim(len, &at);
      if (len != 0) std::memcpy(dst, call.input + offset, len);
      mine.offset = at;
      ch.post(step, mine);
    }
    if (first && call.bytes != 0) sink(me, 0, call.input, call.bytes);
    // Start with the next member so peers do not all read the same one first.
    for (int i = 1; i < n; ++i) {
      const int peer = (me + i) % n;
      auto line = ch.wait(peer, step);
      if (!line.ok()) return line.status();
      if (first) compare(ch, call, mine, peer, line.value()->header, &mismatch);
      if (!mismatch.empty() || len == 0) continue;  // still wait for all: keeps steps in lockstep
      const std::byte* src = protocol == Protocol::kInline
                                 ? reinterpret_cast<const std::byte*>(line.value()->inline_data)
                                 : ch.member_data(peer, line.value()->header.offset);
      sink(peer, offset, src, len);
    }
    if (!mismatch.empty()) return {ErrorKind::kMismatch, fmt::format("{}: {}", ch.label(), mismatch)};
    first = false;
    offset += len;
  }
  return Status::Ok();
}

}  // namespace fastgather::algo
