// The original script's launch: TP, DP, SERVER_NUM, SERVER_INDEX, MASTER_IP
// and PORT; this server's ranks become processes forked here.
#include <sched.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <thread>
#include <vector>

#include <fmt/format.h>

#include "fastgather/launch.hpp"
#include "transport/shm_segment.hpp"

namespace fastgather {
namespace {

Status read_int(const char* name, int* out) {
  const char* v = std::getenv(name);
  if (v == nullptr || *v == '\0') return Status::Ok();
  char* end = nullptr;
  long x = std::strtol(v, &end, 10);
  if (*end != '\0' || x < 0 || x > 1'000'000) {
    return {ErrorKind::kInvalidArgument, fmt::format("environment variable {}='{}' is not a count", name, v)};
  }
  *out = static_cast<int>(x);
  return Status::Ok();
}

// Rank and size given by a launcher (mpirun, srun), if any.
bool launcher_rank(int* rank, int* size) {
  const std::pair<const char*, const char*> kVars[] = {
      {"FG_RANK", "FG_WORLD_SIZE"},
      {"OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE"},
      {"PMI_RANK", "PMI_SIZE"},
      {"PMIX_RANK", "PMIX_SIZE"},
  };
  for (auto [r, s] : kVars) {
    const char* rv = std::getenv(r);
    const char* sv = std::getenv(s);
    if (rv != nullptr && sv != nullptr) {
      *rank = std::atoi(rv);
      *size = std::atoi(sv);
      return true;
    }
  }
  return false;
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
  const char* v = std::getenv("FG_BIND");
  if (v != nullptr && std::string(v) == "none") return false;
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
  if (tp < 1 || dp < 1) return {ErrorKind::kInvalidArgument, fmt::format("TP={} and DP={} must be at least 1", tp, dp)};
  if (servers < 1) return {ErrorKind::kInvalidArgument, fmt::format("SERVER_NUM={} must be at least 1", servers)};
  if (world_size() < servers) {
    return {ErrorKind::kInvalidArgument,
            fmt::format("TP*DP = {}*{} = {} ranks cannot fill SERVER_NUM={} servers", tp, dp, world_size(), servers)};
  }
  if (server_index < 0 || server_index >= servers) {
    return {ErrorKind::kInvalidArgument, fmt::format("SERVER_INDEX={} is outside 0..{}", server_index, servers - 1)};
  }
  if (port < 0 || port > 65535) return {ErrorKind::kInvalidArgument, fmt::format("PORT={} is not a TCP port", port)};
  return Status::Ok();
}

Config LaunchPlan::config_for_rank(int rank) const {
  Config c;
  c.rank = rank;
  c.world_size = world_size();
  c.master_addr = master_ip;
  c.master_port = port;
  c.servers = servers;
  c.server_index = server_index;
  c.timeout = std::chrono::milliseconds(timeout_ms);
  c.token = token;
  return c;
}

Result<LaunchPlan> launch_plan_from_env(LaunchPlan p) {
  for (auto [name, field] : {std::pair{"TP", &p.tp}, {"DP", &p.dp}, {"SERVER_NUM", &p.servers},
                             {"SERVER_INDEX", &p.server_index}, {"PORT", &p.port}, {"FG_TIMEOUT_MS", &p.timeout_ms}}) {
    if (Status s = read_int(name, field); !s.ok()) return s;
  }
  if (const char* ip = std::getenv("MASTER_IP"); ip != nullptr && *ip != '\0') p.master_ip = ip;
  if (const char* tok = std::getenv("FG_TOKEN"); tok != nullptr) p.token = tok;
  if (Status s = p.validate(); !s.ok()) return s;
  return p;
}

int run_local_ranks(const LaunchPlan& plan, const std::function<int(const Config&)>& body) {
  if (Status s = plan.validate(); !s.ok()) {
    std::fprintf(stderr, "fastgather: %s\n", s.to_string().c_str());
    return 2;
  }
  int rank = -1, size = -1;
  if (launcher_rank(&rank, &size)) {
    LaunchPlan p = plan;
    if (size != p.world_size()) {
      std::fprintf(stderr, "fastgather: the launcher started %d ranks but TP*DP = %d\n", size, p.world_size());
      return 2;
    }
    p.server_index = Config::server_of_rank(p.world_size(), p.servers, rank);
    return body(p.config_for_rank(rank));
  }

  // Spawn this server's ranks. All segments are named after the job id, so
  // whatever the ranks leave behind (a SIGKILL at the wrong moment) is removed here.
  std::random_device rd;
  const std::string job = fmt::format("{:08x}{:08x}", rd(), rd());
  const int local = plan.local_ranks();
  const int first = plan.first_local_rank();
  const int cpus = allowed_cpus();
  const bool bind = should_bind(local, cpus);
  // With the whole job fitting this host's CPUs, bind by world rank: servers
  // simulated on one host then never share a CPU; otherwise by local index.
  const bool by_world_rank = plan.world_size() <= cpus;
  std::fflush(nullptr);
  std::vector<pid_t> pids;
  for (int i = 0; i < local; ++i) {
    const int r = first + i;
    pid_t pid = ::fork();
    if (pid < 0) {
      std::perror("fastgather: fork");
      for (pid_t p : pids) ::kill(p, SIGKILL);
      break;
    }
    if (pid == 0) {
      if (bind) bind_to_cpu(by_world_rank ? r : i);
      ::setenv("FG_JOB_ID", job.c_str(), 1);
      ::setenv("FG_RANK", std::to_string(r).c_str(), 1);
      ::setenv("FG_WORLD_SIZE", std::to_string(plan.world_size()).c_str(), 1);
      int rc = body(plan.config_for_rank(r));
      std::fflush(nullptr);
      ::_exit(rc);
    }
    pids.push_back(pid);
  }

  int failed = pids.size() == static_cast<size_t>(local) ? 0 : 1;
  size_t alive = pids.size();
  std::chrono::steady_clock::time_point kill_at = std::chrono::steady_clock::time_point::max();
  while (alive > 0) {
    int status = 0;
    pid_t pid = ::waitpid(-1, &status, WNOHANG);
    if (pid == 0) {
      if (std::chrono::steady_clock::now() > kill_at) {
        // Survivors should have failed on their own by now; do not hang the job.
        for (size_t i = 0; i < pids.size(); ++i) {
          if (pids[i] > 0) {
            std::fprintf(stderr, "fastgather: rank %d did not exit after a peer failed; killing it\n",
                         first + static_cast<int>(i));
            ::kill(pids[i], SIGKILL);
          }
        }
        kill_at = std::chrono::steady_clock::time_point::max();
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
      continue;
    }
    if (pid < 0) break;
    for (size_t i = 0; i < pids.size(); ++i) {
      if (pids[i] != pid) continue;
      pids[i] = -1;
      --alive;
      const int r = first + static_cast<int>(i);
      bool bad = false;
      if (WIFSIGNALED(status)) {
        std::fprintf(stderr, "fastgather: rank %d was killed by signal %d\n", r, WTERMSIG(status));
        bad = true;
      } else if (WIFEXITED(status) && WEXITSTATUS(status) != 0) {
        std::fprintf(stderr, "fastgather: rank %d exited with status %d\n", r, WEXITSTATUS(status));
        bad = true;
      }
      if (bad && !failed) {
        failed = 1;
        kill_at = std::chrono::steady_clock::now() + std::chrono::milliseconds(plan.timeout_ms) + std::chrono::seconds(10);
      }
    }
  }
  transport::ShmSegment::sweep_job(job);
  return failed;
}

}  // namespace fastgather
