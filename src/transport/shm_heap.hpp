// A group's symmetric heap: one region per member on this server, all in one
// shared-memory segment that every member maps. A member allocates only from
// its own region; every member can read every region. An input that lies in
// its owner's region is read by the peers in place - no copy into a ring -
// which is what PyTorch's SymmetricMemory and MPI_Win_allocate_shared offer.
//
// The segment is sparse: pages exist once a block is allocated (commit()
// reserves them, so a full /dev/shm is an allocation error, not SIGBUS), and
// stay when the block is freed, for the next block there (as a caching
// allocator keeps them). Blocks are whole pages.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <mutex>
#include <optional>

#include "fastgather/status.hpp"
#include "transport/shm_segment.hpp"

namespace fastgather::transport {

class ShmHeap {
 public:
  static constexpr size_t kBlockAlign = 4096;
  static size_t segment_bytes(int members, size_t region_bytes) { return static_cast<size_t>(members) * region_bytes; }

  // segment: created or opened with ShmSegment::Pages::kOnDemand, of
  // segment_bytes(members, region_bytes) bytes; me: this member's region.
  ShmHeap(ShmSegment segment, int me, size_t region_bytes);

  // A block of at least `bytes` (at least one page) in this member's region.
  Result<std::byte*> allocate(size_t bytes);
  // Returns a block from allocate(); its pages stay for the next block.
  void release(std::byte* block);

  // Where [p, p + len) lies in this member's region, if it lies there whole.
  std::optional<uint64_t> own_offset(const void* p, size_t len) const {
    const auto a = reinterpret_cast<uintptr_t>(p), begin = reinterpret_cast<uintptr_t>(region(me_));
    if (a < begin || a - begin > region_bytes_ || len > region_bytes_ - (a - begin)) return std::nullopt;
    return a - begin;
  }
  const std::byte* member_data(int member, uint64_t offset) const { return region(member) + offset; }
  // Whether [offset, offset + len) lies within a member's region (a peer's word for it is checked).
  bool within(uint64_t offset, size_t len) const { return offset <= region_bytes_ && len <= region_bytes_ - offset; }
  void unlink_name() { segment_.unlink(); }

 private:
  std::byte* region(int member) const { return segment_.data() + static_cast<size_t>(member) * region_bytes_; }

  ShmSegment segment_;
  int me_;
  size_t region_bytes_;
  std::mutex mu_;
  std::map<size_t, size_t> free_;  // offset -> bytes, coalesced
  std::map<size_t, size_t> used_;  // offset -> bytes
  size_t committed_ = 0;           // pages below this offset exist
};

}  // namespace fastgather::transport
