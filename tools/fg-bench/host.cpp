#include "host.hpp"

#include <fcntl.h>
#include <sched.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <utility>

#include <fmt/format.h>

#include "report.hpp"

namespace fastgather::bench {

double available_bytes() {
  std::ifstream f("/proc/meminfo");
  std::string key;
  double kb = 0;
  std::string unit;
  while (f >> key >> kb >> unit) {
    if (key == "MemAvailable:") return kb * 1024;
  }
  return 0;
}

// The largest case's buffers on one rank, estimated from the shapes (in
// doubles: absurd sizes must not overflow on the way to being refused),
// times the ranks on this host, against what the machine has available.
Status check_memory(const Options& o, const LaunchPlan& plan, int ranks_here) {
  DType ag{}, mm{};
  parse_dtype(o.dtype, &ag);
  parse_dtype(o.mm_dtype, &mm);
  const double g = plan.dp, sets = o.dv ? 8 : 1;
  double worst = 0;
  int64_t worst_m = 0;
  for (int64_t m : o.ms) {
    const double bytes = static_cast<double>(m) * static_cast<double>(o.hidden) * static_cast<double>(dtype_size(ag));
    // Input and output per buffer set; the staged list's flat temporary.
    const double gather = sets * bytes * (1 + g) + bytes * g;
    // Fused: x1 sets, gather_out, output, x2, and the unfused path's fp32 copies.
    const double rows = bytes / (static_cast<double>(o.hidden) * static_cast<double>(dtype_size(mm)));
    const double fused = sets * bytes + bytes * g + rows * g * static_cast<double>(o.n) * (dtype_size(mm) + 4.0) +
                         static_cast<double>(o.hidden) * static_cast<double>(o.n) * 8 + rows * g * static_cast<double>(o.hidden) * 4;
    const double need = std::max(gather, fused);
    if (need > worst) worst = need, worst_m = m;
  }
  const double have = available_bytes();
  const double total = worst * ranks_here;
  if (have > 0 && total > 0.9 * have) {
    return {ErrorKind::kResourceExhausted,
            fmt::format("--m {} with --hidden {} needs about {} per rank for its buffers; {} ranks on this host need {}, "
                        "but this machine has {} available: use a smaller --m or --hidden",
                        worst_m, o.hidden, human_bytes(worst), ranks_here, human_bytes(total), human_bytes(have))};
  }
  return Status::Ok();
}

std::string cpu_model() {
  std::ifstream f("/proc/cpuinfo");
  std::string line;
  while (std::getline(f, line)) {
    if (line.rfind("model name", 0) == 0) return line.substr(line.find(':') + 2);
  }
  return "unknown";
}

Place place_now() {
  static const Place host = [] {
    Place p;
    std::ifstream f("/proc/sys/kernel/random/boot_id");
    std::string id;
    std::getline(f, id);
    p.host = static_cast<uint32_t>(std::hash<std::string>{}(id) & 0xfffff);
    p.cores = static_cast<int>(std::clamp(::sysconf(_SC_NPROCESSORS_ONLN), 1L, 4095L));
    return p;
  }();
  Place p = host;
  const int cpu = ::sched_getcpu();
  p.cpu = cpu >= 0 && cpu < 4095 ? cpu : -1;
  return p;
}

// host (20 bits), cores (12), cpu + 1 (12): 44 bits, exact in a double.
double encode(const Place& p) {
  const uint64_t v = static_cast<uint64_t>(p.host & 0xfffff) << 24 | static_cast<uint64_t>(p.cores & 0xfff) << 12 |
                     static_cast<uint64_t>((p.cpu + 1) & 0xfff);
  return static_cast<double>(v);
}

Place decode(double d) {
  const auto v = static_cast<uint64_t>(d);
  return {static_cast<uint32_t>(v >> 24 & 0xfffff), static_cast<int>(v >> 12 & 0xfff), static_cast<int>(v & 0xfff) - 1};
}

bool evenly_placed(const std::vector<Place>& ranks) {
  std::map<uint32_t, int> on_host;
  std::map<std::pair<uint32_t, int>, int> on_cpu;
  std::map<uint32_t, int> cores;
  for (const Place& p : ranks) {
    ++on_host[p.host];
    cores[p.host] = std::max(p.cores, 1);
    if (p.cpu >= 0) ++on_cpu[{p.host, p.cpu}];
  }
  for (const auto& [where, n] : on_cpu) {
    const int fair = (on_host[where.first] + cores[where.first] - 1) / cores[where.first];
    if (n > fair) return false;
  }
  return true;
}

Status check_writable(const char* flag, const std::string& path) {
  if (path.empty()) return Status::Ok();
  const std::filesystem::path p(path);
  const std::filesystem::path dir = p.has_parent_path() ? p.parent_path() : std::filesystem::path(".");
  std::error_code ec;
  if (!std::filesystem::is_directory(dir, ec)) {
    return {ErrorKind::kInvalidArgument, fmt::format("{} {}: the folder {} does not exist", flag, path, dir.string())};
  }
  const bool exists = std::filesystem::exists(p, ec);
  if (exists && std::filesystem::is_directory(p, ec)) {
    return {ErrorKind::kInvalidArgument, fmt::format("{} {}: is a folder", flag, path)};
  }
  if (::access(exists ? path.c_str() : dir.c_str(), W_OK) != 0) {
    return {ErrorKind::kInvalidArgument, fmt::format("{} {}: cannot be written ({})", flag, path, std::strerror(errno))};
  }
  // Permission is not room: a test write where writing changes nothing that
  // the run would not overwrite anyway (a device or a pipe: one newline),
  // and free space on the folder's file system for a file.
  if (exists && !std::filesystem::is_regular_file(p, ec)) {
    const int fd = ::open(path.c_str(), O_WRONLY | O_NONBLOCK | O_CLOEXEC);
    const bool wrote = fd >= 0 && ::write(fd, "\n", 1) == 1;
    const int err = errno;
    if (fd >= 0) ::close(fd);
    if (!wrote) return {ErrorKind::kInvalidArgument, fmt::format("{} {}: a test write failed ({})", flag, path, std::strerror(err))};
    return Status::Ok();
  }
  struct statvfs fs {};
  if (::statvfs(dir.c_str(), &fs) == 0 && fs.f_bavail == 0) {
    return {ErrorKind::kInvalidArgument, fmt::format("{} {}: no space left on the file system of {}", flag, path, dir.string())};
  }
  return Status::Ok();
}

}  // namespace fastgather::bench
