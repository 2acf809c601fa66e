#include "transport/shm_heap.hpp"

#include <fmt/format.h>

namespace fastgather::transport {

ShmHeap::ShmHeap(ShmSegment segment, int me, size_t region_bytes)
    : segment_(std::move(segment)), me_(me), region_bytes_(region_bytes) {
  if (region_bytes_ != 0) free_.emplace(0, region_bytes_);
}

Result<std::byte*> ShmHeap::allocate(size_t bytes) {
  if (bytes > region_bytes_) {
    return Status{ErrorKind::kResourceExhausted,
                  fmt::format("{} bytes do not fit this rank's {}-byte symmetric heap (FG_SYMMETRIC_BYTES)", bytes, region_bytes_)};
  }
  const size_t need = std::max<size_t>((bytes + kBlockAlign - 1) / kBlockAlign * kBlockAlign, kBlockAlign);
  std::lock_guard<std::mutex> lock(mu_);
  auto it = free_.begin();
  while (it != free_.end() && it->second < need) ++it;  // first fit: blocks are few and large
  if (it == free_.end()) {
    size_t largest = 0;
    for (const auto& [off, len] : free_) largest = std::max(largest, len);
    return Status{ErrorKind::kResourceExhausted,
                  fmt::format("no room for {} bytes in this rank's {}-byte symmetric heap (largest free block {} bytes; "
                              "raise FG_SYMMETRIC_BYTES or free tensors)",
                              bytes, region_bytes_, largest)};
  }
  const size_t off = it->first;
  const size_t end = off + need;
  if (end > committed_) {
    const size_t base = static_cast<size_t>(me_) * region_bytes_;
    if (Status s = segment_.commit(base + committed_, end - committed_); !s.ok()) return s;
    committed_ = end;
  }
  const size_t rest = it->second - need;
  free_.erase(it);
  if (rest != 0) free_.emplace(end, rest);
  used_.emplace(off, need);
  return region(me_) + off;
}

void ShmHeap::release(std::byte* block) {
  std::lock_guard<std::mutex> lock(mu_);
  auto u = used_.find(static_cast<size_t>(block - region(me_)));
  if (u == used_.end()) return;  // not ours: nothing to give back
  size_t off = u->first, len = u->second;
  used_.erase(u);
  auto next = free_.lower_bound(off);
  if (next != free_.end() && next->first == off + len) {  // merge with the block after
    len += next->second;
    next = free_.erase(next);
  }
  if (next != free_.begin()) {  // and with the one before
    auto prev = std::prev(next);
    if (prev->first + prev->second == off) {
      prev->second += len;
      return;
    }
  }
  free_.emplace(off, len);
}

}  // namespace fastgather::transport
