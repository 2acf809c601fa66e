// RAII over one POSIX shared-memory segment: created 0600 under a name that
// carries the job id and the creator's pid, so a crash leaves nothing a later
// run cannot reclaim (sweep_stale removes segments whose creator is dead).
#pragma once

#include <cstddef>
#include <string>

#include "fastgather/status.hpp"

namespace fastgather::transport {

class ShmSegment {
 public:
  // How pages come: kPopulated maps every page at once (no page fault
  // mid-collective); kOnDemand maps none and keeps the descriptor open, so
  // that commit() can reserve a range first (a symmetric heap: large,
  // sparse, used where allocated).
  enum class Pages { kPopulated, kOnDemand };
  // name: see segment_name().
  static Result<ShmSegment> create(const std::string& name, size_t bytes, Pages pages = Pages::kPopulated);
  static Result<ShmSegment> open(const std::string& name, size_t bytes, Pages pages = Pages::kPopulated);

  ShmSegment(ShmSegment&& other) noexcept;
  ShmSegment& operator=(ShmSegment&& other) noexcept;
  ShmSegment(const ShmSegment&) = delete;
  ShmSegment& operator=(const ShmSegment&) = delete;
  ~ShmSegment();

  // A second handle on the same mapping that neither unmaps nor unlinks: two
  // members of one channel in one process (tests) then share addresses, so
  // ThreadSanitizer sees both sides of every access.
  static ShmSegment alias_of(const ShmSegment& other);

  // Removes the name once every member has mapped it; the mapping stays.
  void unlink();
  std::byte* data() const { return static_cast<std::byte*>(addr_); }
  size_t size() const { return size_; }
  const std::string& name() const { return name_; }
  // kOnDemand only: gives [offset, offset + len) its pages now, so that a
  // full /dev/shm is an error here rather than SIGBUS at the first touch.
  Status commit(size_t offset, size_t len);

  // "/fg-<job>-<pid>-<serial>r<random>": a fresh, unpredictable name each call.
  static std::string segment_name(const std::string& job_id, int creator_pid, int serial);
  // What every segment name of the job starts with ("/fg-<job>-").
  static std::string job_prefix(const std::string& job_id);
  // Unlinks /dev/shm/fg-* segments whose creator process no longer exists.
  // Returns how many were removed.
  static int sweep_stale();
  // Unlinks every segment of one job (a spawner's cleanup after its ranks exit).
  static int sweep_job(const std::string& job_id);

 private:
  ShmSegment() = default;
  static void keep_or_close(ShmSegment& seg, int fd, Pages pages);
  void release();  // unlinks (if it owns the name), unmaps, closes
  std::string name_;
  void* addr_ = nullptr;
  size_t size_ = 0;
  bool owns_name_ = false;
  bool owns_map_ = true;
  int fd_ = -1;  // kOnDemand: kept for commit()
};

}  // namespace fastgather::transport
