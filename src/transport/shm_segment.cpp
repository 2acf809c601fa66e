#include "transport/shm_segment.hpp"

#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <random>

#include <fmt/format.h>

namespace fastgather::transport {
namespace {

constexpr const char* kPrefix = "fg-";

Result<ShmSegment> fail(const std::string& what, const std::string& name) {
  return Status{ErrorKind::kSystem, fmt::format("{} shared-memory segment {}: {}", what, name, std::strerror(errno))};
}

void* map(int fd, size_t bytes, ShmSegment::Pages pages) {
  const int populate = pages == ShmSegment::Pages::kPopulated ? MAP_POPULATE : 0;  // no page faults mid-collective
  return ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED | populate, fd, 0);
}

}  // namespace

void ShmSegment::keep_or_close(ShmSegment& seg, int fd, Pages pages) {
  if (pages == Pages::kOnDemand) {
    seg.fd_ = fd;
  } else {
    ::close(fd);
  }
}

Status ShmSegment::commit(size_t offset, size_t len) {
  if (fd_ < 0) return {ErrorKind::kInvalidArgument, fmt::format("shared-memory segment {} was mapped populated", name_)};
  if (offset > size_ || len > size_ - offset) {
    return {ErrorKind::kInvalidArgument, fmt::format("[{}, +{}) is outside the {}-byte segment {}", offset, len, size_, name_)};
  }
  const int rc = ::posix_fallocate(fd_, static_cast<off_t>(offset), static_cast<off_t>(len));
  if (rc == 0) return Status::Ok();
  return {rc == ENOSPC ? ErrorKind::kResourceExhausted : ErrorKind::kSystem,
          fmt::format("cannot reserve {} bytes of shared memory (segment {}): {}", len, name_, std::strerror(rc))};
}

std::string ShmSegment::job_prefix(const std::string& job_id) { return fmt::format("/{}{}-", kPrefix, job_id); }

std::string ShmSegment::segment_name(const std::string& job_id, int creator_pid, int serial) {
  // The random part: anyone can list /dev/shm and read a job's id and its
  // ranks' pids there, and a name they can predict is one they can create
  // first (O_EXCL then refuses ours).
  std::random_device rd;
  return fmt::format("{}{}-{}r{:08x}{:08x}", job_prefix(job_id), creator_pid, serial, rd(), rd());
}

Result<ShmSegment> ShmSegment::create(const std::string& name, size_t bytes, Pages pages) {
  int fd = ::shm_open(name.c_str(), O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
  if (fd < 0) return fail("cannot create", name);
  ShmSegment seg;
  seg.name_ = name;
  seg.owns_name_ = true;
  if (::ftruncate(fd, static_cast<off_t>(bytes)) != 0) {
    auto r = fail("cannot size", name);
    ::close(fd);
    ::shm_unlink(name.c_str());
    return r;
  }
  void* p = map(fd, bytes, pages);
  if (p == MAP_FAILED) {
    auto r = fail("cannot map", name);
    ::close(fd);
    ::shm_unlink(name.c_str());
    return r;
  }
  keep_or_close(seg, fd, pages);
  seg.addr_ = p;
  seg.size_ = bytes;
  return seg;
}

Result<ShmSegment> ShmSegment::open(const std::string& name, size_t bytes, Pages pages) {
  int fd = ::shm_open(name.c_str(), O_RDWR | O_CLOEXEC, 0600);
  if (fd < 0) return fail("cannot open", name);
  struct stat st {};
  if (::fstat(fd, &st) != 0 || static_cast<size_t>(st.st_size) < bytes) {
    ::close(fd);
    return Status{ErrorKind::kSystem,
                  fmt::format("shared-memory segment {} holds {} bytes, expected {}", name, st.st_size, bytes)};
  }
  void* p = map(fd, bytes, pages);
  if (p == MAP_FAILED) {
    auto r = fail("cannot map", name);
    ::close(fd);
    return r;
  }
  ShmSegment seg;
  keep_or_close(seg, fd, pages);
  seg.name_ = name;
  seg.addr_ = p;
  seg.size_ = bytes;
  return seg;
}

ShmSegment ShmSegment::alias_of(const ShmSegment& other) {
  ShmSegment seg;
  seg.name_ = other.name_;
  seg.addr_ = other.addr_;
  seg.size_ = other.size_;
  seg.owns_map_ = false;
  return seg;
}

ShmSegment::ShmSegment(ShmSegment&& o) noexcept { *this = std::move(o); }

ShmSegment& ShmSegment::operator=(ShmSegment&& o) noexcept {
  if (this != &o) {
    release();  // what this one held; its members stay alive to take o's
    name_ = std::move(o.name_);
    addr_ = o.addr_;
    size_ = o.size_;
    owns_name_ = o.owns_name_;
    owns_map_ = o.owns_map_;
    fd_ = o.fd_;
    o.fd_ = -1;
    o.addr_ = nullptr;
    o.size_ = 0;
    o.owns_name_ = false;
  }
  return *this;
}

ShmSegment::~ShmSegment() { release(); }

void ShmSegment::release() {
  unlink();
  if (addr_ != nullptr && owns_map_) ::munmap(addr_, size_);
  addr_ = nullptr;
  size_ = 0;
  if (fd_ >= 0) ::close(fd_);
  fd_ = -1;
}

void ShmSegment::unlink() {
  if (owns_name_) ::shm_unlink(name_.c_str());
  owns_name_ = false;
}

namespace {
template <typename Pred>
int sweep(Pred&& should_remove) {
  DIR* d = ::opendir("/dev/shm");
  if (d == nullptr) return 0;
  int removed = 0;
  while (dirent* e = ::readdir(d)) {
    std::string n = e->d_name;
    if (n.rfind(kPrefix, 0) != 0) continue;
    if (should_remove(n) && ::shm_unlink(("/" + n).c_str()) == 0) ++removed;
  }
  ::closedir(d);
  return removed;
}
}  // namespace

int ShmSegment::sweep_stale() {
  return sweep([](const std::string& n) {
    // fg-<job>-<pid>-<serial>r<random>[h]
    auto last = n.rfind('-');
    if (last == std::string::npos || last == 0) return false;
    auto prev = n.rfind('-', last - 1);
    if (prev == std::string::npos) return false;
    int pid = std::atoi(n.substr(prev + 1, last - prev - 1).c_str());
    return pid > 0 && ::kill(pid, 0) != 0 && errno == ESRCH;
  });
}

int ShmSegment::sweep_job(const std::string& job_id) {
  const std::string prefix = std::string(kPrefix) + job_id + "-";
  return sweep([&](const std::string& n) { return n.rfind(prefix, 0) == 0; });
}

}  // namespace fastgather::transport
