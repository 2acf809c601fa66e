// src/launch: the launcher's room. The original script's launch (TP, DP, SERVER_NUM,
// SERVER_INDEX, MASTER_IP, PORT), the one fork-and-supervise loop
// (run_processes) that the library's launch helper and fg-bench use,
// CPU binding, and the sweep of a job's segments. Above transport (it sweeps
// shared memory), beside core (it never builds a communicator itself).
#include <fcntl.h>
#include <sched.h>
#include <sys/prctl.h>
#include <sys/random.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <cstdlib>
#include <optional>
#include <random>
#include <thread>
#include <vector>

#include <fmt/format.h>

#include "fastgather/launch.hpp"
#include "base/env.hpp"
#include "bootstrap/tcp_store.hpp"
#include "transport/shm_segment.hpp"

namespace fastgather {
namespace {

Status read_int(const char* name, int* out) {
  auto v = base::env_count(name);
  if (!v.ok()) return v.status();
  if (v.value()) *out = static_cast<int>(*v.value());
  return Status::Ok();
}

// Rank and size given by a launcher (mpirun, srun) or our spawner, if any;
// read strictly (a launcher's variable with garbage in it is an error that
// names it, not rank 0 of 0).
Result<std::optional<std::pair<int, int>>> launcher_rank() {
  const std::pair<const char*, const char*> kVars[] = {
      {"FG_RANK", "FG_WORLD_SIZE"},
      {"OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE"},
      {"PMI_RANK", "PMI_SIZE"},
      {"PMIX_RANK", "PMIX_SIZE"},
  };
  for (auto [r, s] : kVars) {
    const auto rv = base::env_text(r), sv = base::env_text(s);
    if (!rv || !sv) continue;
    auto size = base::parse_count(*sv, 1, kMaxWorldSize, fmt::format("environment variable {}", s));
    if (!size.ok()) return size.status();
    auto rank = base::parse_count(*rv, 0, size.value() - 1, fmt::format("environment variable {}", r));
    if (!rank.ok()) return rank.status();
    return std::optional<std::pair<int, int>>{{static_cast<int>(rank.value()), static_cast<int>(size.value())}};
  }
  return std::optional<std::pair<int, int>>{};
}

// CPUs this process may run on (0 if unknown).
int allowed_cpus() {
  cpu_set_t set;
  return ::sched_getaffinity(0, sizeof(set), &set) == 0 ? CPU_COUNT(&set) : 0;
}

// Like Open MPI's default binding: with no more ranks than CPUs, each rank
// stays on one allowed CPU, so two ranks never share a core and caches stay
// warm. FG_BIND=none turns it off.
bool should_bind(int local_ranks, int cpus) {
  auto v = base::env_word("FG_BIND");
  if (v.ok() && v.value() && *v.value() == "none") return false;
  return local_ranks <= cpus;
}

void bind_to_cpu(int local_index) {
  cpu_set_t allowed, one;
  if (::sched_getaffinity(0, sizeof(allowed), &allowed) != 0) return;
  int seen = 0;
  for (int cpu = 0; cpu < CPU_SETSIZE; ++cpu) {
    if (!CPU_ISSET(cpu, &allowed)) continue;
    if (seen++ == local_index) {
      CPU_ZERO(&one);
      CPU_SET(cpu, &one);
      ::sched_setaffinity(0, sizeof(one), &one);
      return;
    }
  }
}

}  // namespace

Status LaunchPlan::validate() const {
  auto bad = [](std::string why) { return Status{ErrorKind::kInvalidArgument, std::move(why)}; };
  if (tp < 1 || dp < 1) return bad(fmt::format("TP={} and DP={} must be at least 1", tp, dp));
  // Checked in 64 bits before world_size() multiplies them.
  const int64_t world = int64_t{tp} * dp;
  if (world > kMaxWorldSize) {
    return bad(fmt::format("TP*DP = {}*{} = {} ranks; fastgather supports at most {} ranks in a job", tp, dp, world,
                           kMaxWorldSize));
  }
  if (servers < 1) return bad(fmt::format("SERVER_NUM={} must be at least 1", servers));
  if (world < servers) {
    return bad(fmt::format("TP*DP = {}*{} = {} ranks cannot fill SERVER_NUM={} servers", tp, dp, world, servers));
  }
  if (server_index < 0 || server_index >= servers) {
    return bad(fmt::format("SERVER_INDEX={} is outside 0..{}", server_index, servers - 1));
  }
  if (master_addr.empty()) return bad("the rendezvous host (MASTER_IP, --master) is empty");
  if (master_port < 0 || master_port > 65535) {
    return bad(fmt::format("PORT={} is not a TCP port every rank can find (1..65535)", master_port));
  }
  if (timeout.count() < 0) return bad(fmt::format("FG_TIMEOUT_MS={} must be 0 (never) or more", timeout.count()));
  if (local_ranks() > kMaxLocalRanks) {
    return bad(fmt::format("TP*DP = {} ranks over SERVER_NUM={} puts {} ranks on server {}; fastgather starts at most "
                           "{} ranks per server (each is a process with its own shared-memory ring)",
                           world, servers, local_ranks(), server_index, kMaxLocalRanks));
  }
  return Status::Ok();
}

Config LaunchPlan::config_for_rank(int rank) const {
  Config c;
  c.rank = rank;
  c.world_size = world_size();
  c.master_addr = master_addr;
  c.master_port = port();
  c.servers = servers;
  c.server_index = server_index;
  c.timeout = timeout;
  c.token = token;
  c.job_id = job_id;
  return c;
}

Result<LaunchPlan> launch_plan_from_env(LaunchPlan p) {
  for (auto [name, field] : {std::pair{"TP", &p.tp}, {"DP", &p.dp}, {"SERVER_NUM", &p.servers},
                             {"SERVER_INDEX", &p.server_index}, {"PORT", &p.master_port}}) {
    if (Status s = read_int(name, field); !s.ok()) return s;
  }
  if (auto t = base::env_count("FG_TIMEOUT_MS"); !t.ok()) {
    return t.status();
  } else if (t.value()) {
    p.timeout = std::chrono::milliseconds(*t.value());
  }
  if (const auto ip = base::env_text("MASTER_IP", /*empty_counts=*/true)) {
    // Set but empty is a mistake (a variable the script forgot to fill), not "the default".
    if (ip->empty()) return Status{ErrorKind::kInvalidArgument, "MASTER_IP is set but empty; unset it for 127.0.0.1"};
    p.master_addr = *ip;
  }
  if (Status s = base::check_environment(); !s.ok()) return s;
  if (const auto tok = base::env_text("FG_TOKEN")) p.token = *tok;
  if (Status s = p.validate(); !s.ok()) return s;
  return p;
}

namespace {

// Set by the stop-signal handler of a supervising process; 0 when none came.
volatile sig_atomic_t g_stop_signal = 0;
void on_stop_signal(int sig) { g_stop_signal = sig; }
constexpr int kStopSignals[] = {SIGINT, SIGTERM, SIGHUP};

// Installs the forwarding handlers for as long as it lives.
class StopSignals {
 public:
  StopSignals() {
    g_stop_signal = 0;
    struct sigaction sa {};
    sa.sa_handler = on_stop_signal;
    ::sigemptyset(&sa.sa_mask);
    for (size_t i = 0; i < std::size(kStopSignals); ++i) ::sigaction(kStopSignals[i], &sa, &old_[i]);
  }
  ~StopSignals() {
    for (size_t i = 0; i < std::size(kStopSignals); ++i) ::sigaction(kStopSignals[i], &old_[i], nullptr);
  }
  // In a child: the default actions again (a child must die of these).
  static void reset_in_child() {
    for (int sig : kStopSignals) ::signal(sig, SIG_DFL);
  }

 private:
  struct sigaction old_[std::size(kStopSignals)] {};
};

// A process that outlives the spawner only to remove the job's segments:
// it holds the read end of a pipe whose write end the spawner and every rank
// it forks hold, so it wakes once all of them are gone, however they went (a
// SIGKILL of the spawner kills the ranks through their death signal, and
// neither can clean up then: a segment made but not yet unlinked would stay
// in /dev/shm). Forked twice, so that it is nobody's child to wait for; it
// ignores the stop signals (a Ctrl-C to the job's process group must not
// take it first), keeps no other descriptor (its standard ones are
// /dev/null), and exits after the sweep.
// Returns the write end (-1: none could be made; the spawner's own sweep at
// the end is then all there is).
int start_segment_reaper(const std::string& job) {
  int fds[2];
  if (::pipe2(fds, 0) != 0) return -1;  // not close-on-exec: the ranks keep the write end
  std::fflush(nullptr);
  const pid_t middle = ::fork();
  if (middle < 0) {
    ::close(fds[0]);
    ::close(fds[1]);
    return -1;
  }
  if (middle == 0) {
    if (::fork() != 0) ::_exit(0);  // the reaper is its child, then init's (or a subreaper's)
    for (int sig : kStopSignals) ::signal(sig, SIG_IGN);
    ::setsid();  // no terminal's signals either
    // Nothing of the job's but the pipe: not its output either (a reader of
    // the job's stdout would otherwise wait for the reaper's end too).
    if (const int null = ::open("/dev/null", O_RDWR | O_CLOEXEC); null >= 0) {
      for (int fd = 0; fd < 3; ++fd) ::dup2(null, fd);
    }
    for (int fd = 3; fd < 4096; ++fd) {
      if (fd != fds[0]) ::close(fd);
    }
    char c;
    for (;;) {
      const ssize_t r = ::read(fds[0], &c, 1);
      if (r < 0 && errno == EINTR) continue;
      if (r <= 0) break;  // every write end closed (or the pipe failed): sweep
    }
    transport::ShmSegment::sweep_job(job);
    ::_exit(0);
  }
  ::close(fds[0]);
  while (::waitpid(middle, nullptr, 0) < 0 && errno == EINTR) {
  }
  return fds[1];
}

std::string labels(const std::vector<pid_t>& pids, int first) {
  std::string out;
  for (size_t i = 0; i < pids.size(); ++i) {
    if (pids[i] > 0) out += fmt::format("{}{}", out.empty() ? "" : ", ", first + static_cast<int>(i));
  }
  return out;
}

}  // namespace

int run_processes(int count, const std::function<int(int index)>& body, const ProcessOptions& options) {
  using Clock = std::chrono::steady_clock;
  const char* what = options.what.c_str();
  const pid_t parent = ::getpid();
  StopSignals stop_signals;
  std::fflush(nullptr);
  std::vector<pid_t> pids;
  for (int i = 0; i < count; ++i) {
    if (g_stop_signal != 0) break;
    pid_t pid = ::fork();
    if (pid < 0) {
      std::fprintf(stderr, "fastgather: cannot start %s %d: %s\n", what, options.first_label + i, std::strerror(errno));
      break;
    }
    if (pid == 0) {
      StopSignals::reset_in_child();
      // Die with the supervisor, whatever kills it; if it is already gone, do not start.
      ::prctl(PR_SET_PDEATHSIG, options.death_signal);
      if (::getppid() != parent) ::_exit(1);
      if (options.in_child) options.in_child(i);
      int rc = body(i);
      std::fflush(nullptr);
      ::_exit(rc);
    }
    pids.push_back(pid);
  }

  int failed = pids.size() == static_cast<size_t>(count) ? 0 : 1;
  int stopped_by = 0;
  size_t alive = pids.size();
  auto term_at = Clock::time_point::max(), kill_at = Clock::time_point::max();
  if (failed) term_at = Clock::now();  // could not start them all: stop the rest
  while (alive > 0) {
    if (g_stop_signal != 0 && stopped_by == 0) {
      stopped_by = g_stop_signal;
      std::fprintf(stderr, "fastgather: signal %d (%s); passing it to %s %s\n", stopped_by, ::strsignal(stopped_by),
                   alive == 1 ? what : (options.what + "s").c_str(), labels(pids, options.first_label).c_str());
      for (pid_t p : pids) {
        if (p > 0) ::kill(p, stopped_by);
      }
      kill_at = std::min(kill_at, Clock::now() + options.kill_after);
    }
    const auto now = Clock::now();
    if (now >= term_at) {
      // Those still running after a failure would only wait for it: end the job.
      std::fprintf(stderr, "fastgather: stopping %s %s after the failure above\n", what,
                   labels(pids, options.first_label).c_str());
      for (pid_t p : pids) {
        if (p > 0) ::kill(p, SIGTERM);
      }
      term_at = Clock::time_point::max();
      kill_at = std::min(kill_at, now + options.kill_after);
    }
    if (now >= kill_at) {
      std::fprintf(stderr, "fastgather: %s %s did not stop; killing\n", what, labels(pids, options.first_label).c_str());
      for (pid_t p : pids) {
        if (p > 0) ::kill(p, SIGKILL);
      }
      kill_at = Clock::time_point::max();
    }
    int status = 0;
    pid_t pid = ::waitpid(-1, &status, WNOHANG);
    if (pid == 0) {
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
      continue;
    }
    if (pid < 0) {
      if (errno == EINTR) continue;
      break;
    }
    for (size_t i = 0; i < pids.size(); ++i) {
      if (pids[i] != pid) continue;
      pids[i] = -1;
      --alive;
      const int label = options.first_label + static_cast<int>(i);
      bool bad = false;
      if (WIFSIGNALED(status)) {
        // Ranks stopped on purpose (a signal passed on, or after a failure) are not news.
        if (stopped_by == 0 && !failed) {
          std::fprintf(stderr, "fastgather: %s %d was killed by signal %d (%s)\n", what, label, WTERMSIG(status),
                       ::strsignal(WTERMSIG(status)));
        }
        bad = true;
      } else if (WIFEXITED(status) && WEXITSTATUS(status) != 0) {
        std::fprintf(stderr, "fastgather: %s %d exited with status %d\n", what, label, WEXITSTATUS(status));
        bad = true;
      }
      if (bad && !failed) {
        failed = 1;
        if (stopped_by == 0) term_at = Clock::now() + options.grace;
      }
    }
  }
  if (stopped_by != 0) return 128 + stopped_by;
  return failed;
}

std::string environment_help() { return base::describe_environment(); }

std::optional<int> free_tcp_port(const std::string& addr) {
  auto fd = bootstrap::listen_on(addr, 0);
  if (!fd.ok()) return std::nullopt;
  const int port = bootstrap::bound_port(fd.value());
  ::close(fd.value());
  return port != 0 ? std::optional<int>(port) : std::nullopt;
}

std::string new_job_secret() {
  // 128 bits from the kernel's generator.
  unsigned char bytes[16];
  size_t got = 0;
  while (got < sizeof(bytes)) {
    const ssize_t n = ::getrandom(bytes + got, sizeof(bytes) - got, 0);
    if (n > 0) {
      got += static_cast<size_t>(n);
    } else if (errno != EINTR) {
      std::fprintf(stderr, "fastgather: getrandom: %s\n", std::strerror(errno));
      std::abort();  // no secret is better than a guessable one
    }
  }
  std::string hex;
  for (unsigned char b : bytes) hex += fmt::format("{:02x}", b);
  return hex;
}

int run_local_ranks(const LaunchPlan& plan, const std::function<int(const Config&)>& body) {
  if (Status s = plan.validate(); !s.ok()) {
    std::fprintf(stderr, "fastgather: %s\n", s.to_string().c_str());
    return 2;
  }
  auto launched = launcher_rank();
  if (!launched.ok()) {
    std::fprintf(stderr, "fastgather: %s\n", launched.status().to_string().c_str());
    return 2;
  }
  if (launched.value()) {
    const auto [rank, size] = *launched.value();
    LaunchPlan p = plan;
    if (size != p.world_size() || rank < 0 || rank >= size) {
      std::fprintf(stderr, "fastgather: the launcher started rank %d of %d but TP*DP = %d\n", rank, size, p.world_size());
      return 2;
    }
    p.server_index = Config::server_of_rank(p.world_size(), p.servers, rank);
    return body(p.config_for_rank(rank));
  }

  // Spawn this server's ranks. All segments are named after the job id, so
  // whatever the ranks leave behind (a SIGKILL at the wrong moment) is removed here.
  std::random_device rd;
  const std::string job = fmt::format("{:08x}{:08x}", rd(), rd());
  LaunchPlan p = plan;
  p.job_id = job;  // handed to the ranks in their Config, as the token is
  // All ranks are ours and no port was asked for: any free one, taken now
  // and handed to rank 0's store as the listening socket itself (no other
  // job can take it in between), its number to the others in their Config.
  int listen_fd = -1;
  if (p.servers == 1 && p.master_port == 0) {
    auto fd = bootstrap::listen_on(p.master_addr, 0);
    if (!fd.ok()) {
      std::fprintf(stderr, "fastgather: %s\n", fd.status().to_string().c_str());
      return 2;
    }
    listen_fd = fd.value();
    p.master_port = bootstrap::bound_port(listen_fd);
  }
  // All ranks are ours: a secret of our own, handed to them in memory (fork)
  // and never written anywhere another user can read, keeps everyone else
  // out of the store: another job that finds the same port, and a local
  // user who can list the job's segments in /dev/shm.
  if (p.servers == 1 && p.token.empty()) p.token = new_job_secret();
  const int local = p.local_ranks();
  const int first = p.first_local_rank();
  const int cpus = allowed_cpus();
  const bool bind = should_bind(local, cpus);
  // With the whole job fitting this host's CPUs, bind by world rank: servers
  // simulated on one host then never share a CPU; otherwise by local index.
  const bool by_world_rank = p.world_size() <= cpus;
  ProcessOptions po;
  po.what = "rank";
  po.first_label = first;
  po.in_child = [&](int i) {
    if (bind) bind_to_cpu(by_world_rank ? first + i : i);
    if (listen_fd >= 0 && first + i != 0) ::close(listen_fd);  // rank 0's alone
  };
  const int reaper = start_segment_reaper(job);
  const int rc = run_processes(local, [&](int i) {
    Config c = p.config_for_rank(first + i);
    if (c.rank == 0) c.store_listen_fd = listen_fd;
    return body(c);
  }, po);
  if (listen_fd >= 0) ::close(listen_fd);
  transport::ShmSegment::sweep_job(job);
  if (reaper >= 0) ::close(reaper);  // the reaper sweeps once more and ends
  return rc;
}

}  // namespace fastgather
