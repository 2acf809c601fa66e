#include "harness.hpp"

#include "pattern.hpp"

#include "bootstrap/tcp_store.hpp"

#include <arpa/inet.h>
#include <dirent.h>
#include <fcntl.h>
#include <grp.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <cerrno>
#include <thread>

#include <fmt/format.h>
#include <gtest/gtest.h>

namespace fgtest {

namespace {

std::string read_small_file(const std::string& path) {
  std::string out;
  if (FILE* f = std::fopen(path.c_str(), "r")) {
    char buf[512];
    size_t n = std::fread(buf, 1, sizeof(buf) - 1, f);
    out.assign(buf, n);
    std::fclose(f);
  }
  while (!out.empty() && (out.back() == '\n' || out.back() == '\0')) out.pop_back();
  return out;
}

// Where a hung rank is, told before it is killed: each thread's kernel wait
// channel and system call, and every thread's stack where gdb is installed
// (the test command installs it). A hang that happens once in many CI runs
// then explains itself in the log.
std::string describe_hung(pid_t pid) {
  std::string out = fmt::format("\n  [where rank process {} was:", pid);
  if (DIR* d = ::opendir(fmt::format("/proc/{}/task", pid).c_str())) {
    while (dirent* e = ::readdir(d)) {
      if (e->d_name[0] == '.') continue;
      const std::string t = fmt::format("/proc/{}/task/{}/", pid, e->d_name);
      out += fmt::format("\n   thread {} ({}): wchan {}, syscall {}", e->d_name, read_small_file(t + "comm"),
                         read_small_file(t + "wchan"), read_small_file(t + "syscall"));
    }
    ::closedir(d);
  }
  const std::string cmd = fmt::format(
      "command -v gdb >/dev/null && timeout 60 gdb -p {} -batch -nx -ex 'thread apply all bt 30' 2>&1 | grep -E '^(#|Thread)'",
      pid);
  if (FILE* p = ::popen(cmd.c_str(), "r")) {
    std::string bt;
    char buf[4096];
    size_t n;
    while ((n = std::fread(buf, 1, sizeof(buf), p)) > 0 && bt.size() < (64u << 10)) bt.append(buf, n);
    ::pclose(p);
    if (!bt.empty()) out += "\n" + bt;
  }
  return out + "]";
}

}  // namespace

bool reap_all_children(std::chrono::milliseconds within, std::chrono::milliseconds every) {
  const auto until = std::chrono::steady_clock::now() + within;
  for (;;) {
    while (::waitpid(-1, nullptr, WNOHANG) > 0) {
    }
    if (::waitpid(-1, nullptr, WNOHANG) < 0 && errno == ECHILD) return true;
    if (std::chrono::steady_clock::now() >= until) return false;
    std::this_thread::sleep_for(every);
  }
}

int free_port() {
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in sa{};
  sa.sin_family = AF_INET;
  sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  sa.sin_port = 0;
  ::bind(fd, reinterpret_cast<sockaddr*>(&sa), sizeof(sa));
  socklen_t len = sizeof(sa);
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&sa), &len);
  ::close(fd);
  return ntohs(sa.sin_port);
}

JobOptions two_servers(std::string token, std::chrono::milliseconds timeout) {
  JobOptions o;
  o.servers = 2;
  o.token = std::move(token);
  o.timeout = timeout;
  return o;
}

std::vector<RankResult> run_job(int world, const RankBody& body, const JobOptions& options) {
  // UCX's memory hooks (installed when libucm loads, in this process too)
  // hold a lock while another thread maps or unmaps memory; a rank forked at
  // that moment inherits it held and hangs in ucp_init for good. Ranks that
  // start UCX are not forked while a thread that allocates runs here: a
  // store the test needs runs in a process of its own (StoreProcess).
  // (OpenBLAS's idle workers allocate nothing.)
  if (options.servers > 1 && fastgather::bootstrap::TcpStoreServer::running() > 0) {
    ADD_FAILURE() << "run_job: ranks that start UCX must not be forked while this process runs a store's thread "
                     "(run the test's store in a StoreProcess)";
    return std::vector<RankResult>(static_cast<size_t>(world));
  }
  const int port = options.port != 0 ? options.port : free_port();
  std::vector<pid_t> pids(world, -1);
  std::vector<int> pipes(world, -1);
  std::fflush(nullptr);
  for (int r = 0; r < world; ++r) {
    int p[2];
    if (::pipe2(p, O_CLOEXEC) != 0) std::abort();
    pid_t pid = ::fork();
    if (pid == 0) {
      ::close(p[0]);
      fastgather::Config c;
      c.rank = r;
      c.world_size = world;
      c.master_addr = "127.0.0.1";
      c.master_port = port;
      c.timeout = options.timeout;
      c.token = options.token;
      c.servers = options.servers;
      c.server_index = c.server_of(r);
      std::string err;
      try {
        err = body(c);
      } catch (const std::exception& e) {
        err = std::string("exception: ") + e.what();
      }
      if (!err.empty()) (void)!::write(p[1], err.data(), err.size());
      ::close(p[1]);
      ::_exit(err.empty() ? 0 : 1);
    }
    ::close(p[1]);
    pids[r] = pid;
    pipes[r] = p[0];
  }
  std::vector<RankResult> results(world);
  for (int r = 0; r < world; ++r) results[r].pid = pids[r];
  std::vector<bool> done(world, false);
  int remaining = world;
  const auto deadline = std::chrono::steady_clock::now() + options.hang_limit;
  while (remaining > 0) {
    for (int r = 0; r < world; ++r) {  // drain pipes so a chatty rank never blocks
      char buf[4096];
      ssize_t n;
      ::fcntl(pipes[r], F_SETFL, O_NONBLOCK);
      while ((n = ::read(pipes[r], buf, sizeof(buf))) > 0) results[r].error.append(buf, n);
    }
    bool reaped = false;
    for (int r = 0; r < world; ++r) {  // only our own children: jobs may run side by side
      int status = 0;
      if (done[r] || ::waitpid(pids[r], &status, WNOHANG) != pids[r]) continue;
      done[r] = true;
      reaped = true;
      --remaining;
      results[r].exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
      results[r].signal = WIFSIGNALED(status) ? WTERMSIG(status) : 0;
    }
    if (reaped) continue;
    if (std::chrono::steady_clock::now() > deadline) {
      for (int r = 0; r < world; ++r) {
        if (!done[r]) {
          results[r].error += " [HANG: killed by the test harness]" + describe_hung(pids[r]);
          ::kill(pids[r], SIGKILL);
        }
      }
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  for (int r = 0; r < world; ++r) {
    char buf[4096];
    ssize_t n;
    while ((n = ::read(pipes[r], buf, sizeof(buf))) > 0) results[r].error.append(buf, n);
    ::close(pipes[r]);
  }
  return results;
}

void expect_all_ok(const std::vector<RankResult>& results) {
  for (size_t r = 0; r < results.size(); ++r) {
    EXPECT_EQ(results[r].exit_code, 0) << "rank " << r << " (signal " << results[r].signal << "): " << results[r].error;
  }
}

void fill_pattern(void* dst, size_t bytes, int rank, uint64_t it) { fastgather::pattern::fill(dst, bytes, rank, it); }

long long check_pattern(const void* src, size_t bytes, int rank, uint64_t it) {
  return fastgather::pattern::find_mismatch(src, bytes, rank, it);
}

std::vector<std::string> fg_segments() {
  std::vector<std::string> out;
  if (DIR* d = ::opendir("/dev/shm")) {
    while (dirent* e = ::readdir(d)) {
      if (std::strncmp(e->d_name, "fg-", 3) == 0) out.emplace_back(e->d_name);
    }
    ::closedir(d);
  }
  return out;
}

}  // namespace fgtest

namespace fgtest {
std::vector<std::string> segments_of(const std::vector<RankResult>& ranks) {
  std::vector<std::string> out;
  for (const std::string& n : fg_segments()) {
    for (const RankResult& r : ranks) {
      if (n.find(fmt::format("-{}-", r.pid)) != std::string::npos) out.push_back(n);
    }
  }
  return out;
}
}  // namespace fgtest

namespace fgtest {
fastgather::Status gather_bytes(fastgather::Group& g, size_t bytes, fastgather::DType dtype) {
  using namespace fastgather;
  const int64_t count = static_cast<int64_t>(bytes / dtype_size(dtype));
  Tensor in = Tensor::zeros(dtype, {count}), out = Tensor::zeros(dtype, {count * g.size()});
  return all_gather(g, in.view(), out.view());
}

std::string gather_mixed_sizes(const fastgather::Config& c, int tp, int dp, std::vector<size_t> sizes,
                               uint64_t iterations) {
  using namespace fastgather;
  auto comm = Communicator::create(c);
  RANK_OK(comm.status());
  auto sub = (*comm)->tp_group_of_dp(tp, dp);
  RANK_OK(sub.status());
  Group& g = *sub.value();
  const size_t max = *std::max_element(sizes.begin(), sizes.end());
  Tensor in = Tensor::empty(DType::kU8, {static_cast<int64_t>(max)});
  Tensor out = Tensor::empty(DType::kU8, {static_cast<int64_t>(max) * g.size()});
  for (uint64_t it = 0; it < iterations; ++it) {
    const size_t b = sizes[it % sizes.size()];
    fill_pattern(in.data(), b, c.rank, it);
    RANK_OK(all_gather(g, TensorView(in.data(), DType::kU8, {static_cast<int64_t>(b)}),
                       TensorView(out.data(), DType::kU8, {static_cast<int64_t>(b) * g.size()})));
    for (int i = 0; i < g.size(); ++i) {
      RANK_CHECK(check_pattern(out.data_as<char>() + i * b, b, g.ranks()[i], it) < 0, "call {} member {}", it, i);
    }
  }
  return "";
}
int as_nobody(const std::function<int()>& f) {
  std::fflush(nullptr);
  pid_t pid = ::fork();
  if (pid == 0) {
    if (::setgroups(0, nullptr) != 0 || ::setgid(65534) != 0 || ::setuid(65534) != 0) ::_exit(99);
    ::_exit(f());
  }
  int st = 0;
  ::waitpid(pid, &st, 0);
  return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
}

double rss_bytes() {
  long pages = 0, resident = 0;
  FILE* f = std::fopen("/proc/self/statm", "r");
  if (f != nullptr && std::fscanf(f, "%ld %ld", &pages, &resident) != 2) resident = 0;
  if (f != nullptr) std::fclose(f);
  return static_cast<double>(resident) * static_cast<double>(::sysconf(_SC_PAGESIZE));
}

}  // namespace fgtest
