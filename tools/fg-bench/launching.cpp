#include "launching.hpp"

#include <unistd.h>

#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "mpi_comparator.hpp"

namespace fastgather::bench {
namespace {
constexpr const char* kReexecMarker = "FG_BENCH_UNDER_MPIRUN";

}  // namespace

void maybe_reexec_under_mpirun(int argc, char** argv, const LaunchPlan& plan, bool simulate) {
  if (!mpi::built() || mpi::launched() || std::getenv(kReexecMarker) != nullptr) return;
  if (std::getenv("FG_NO_MPIRUN") != nullptr || ::access("/usr/bin/mpirun", X_OK) != 0) return;
  if (plan.servers != 1 && !simulate) return;  // on real servers, start it under mpirun yourself
  const bool oversubscribed = plan.world_size() > sysconf(_SC_NPROCESSORS_ONLN);
  ::setenv(kReexecMarker, "1", 1);
  ::setenv("TP", std::to_string(plan.tp).c_str(), 1);
  ::setenv("DP", std::to_string(plan.dp).c_str(), 1);
  // mpirun starts the ranks: they need one port they all know, and one
  // secret (every process of this user may read our environment; no one else).
  const int port = plan.master_port != 0 ? plan.master_port : free_tcp_port(plan.master_addr).value_or(plan.port());
  ::setenv("PORT", std::to_string(port).c_str(), 1);
  if (std::getenv("FG_TOKEN") == nullptr) ::setenv("FG_TOKEN", new_job_secret().c_str(), 1);
  ::setenv("MASTER_IP", plan.master_addr.c_str(), 1);
  ::setenv("FG_TIMEOUT_MS", std::to_string(plan.timeout.count()).c_str(), 1);
  std::vector<std::string> args = {"mpirun", "--allow-run-as-root", "-np", std::to_string(plan.world_size()),
                                   "--bind-to", oversubscribed ? "none" : "core"};
  if (oversubscribed) args.push_back("--oversubscribe");
  if (simulate) {
    // Simulated servers: MPI over TCP too (see mpi_line).
    ::setenv("SERVER_NUM", std::to_string(plan.servers).c_str(), 1);
    for (const char* a : {"--mca", "pml", "ob1", "--mca", "btl", "tcp,self"}) args.push_back(a);
  }
  for (const char* v : {kReexecMarker, "TP", "DP", "PORT", "MASTER_IP", "FG_TIMEOUT_MS", "FG_TOKEN", "FG_RING_BYTES",
                        "SERVER_NUM"}) {
    if (std::getenv(v) != nullptr) {
      args.push_back("-x");
      args.push_back(v);
    }
  }
  char self[4096] = {};
  if (::readlink("/proc/self/exe", self, sizeof(self) - 1) <= 0) return;
  args.push_back(self);
  for (int i = 1; i < argc; ++i) args.push_back(argv[i]);
  if (argc == 1) args.push_back("--compare");  // keep the no-argument run's meaning
  std::vector<char*> cargs;
  for (auto& a : args) cargs.push_back(a.data());
  cargs.push_back(nullptr);
  std::fflush(nullptr);
  ::execvp("mpirun", cargs.data());
  std::fprintf(stderr, "fg-bench: could not start mpirun; running without the MPI comparator\n");
}

int simulate_servers(const LaunchPlan& plan, const std::function<int(const Config&)>& body) {
  // More ranks than CPUs: each spawner would pin its first rank to the first
  // CPU, and so on; leave placement to the kernel instead.
  if (plan.world_size() > sysconf(_SC_NPROCESSORS_ONLN)) ::setenv("FG_BIND", "none", 0);
  ProcessOptions po;
  po.what = "server";
  // A spawner ends on SIGTERM by passing it to its ranks and cleaning up.
  po.death_signal = SIGTERM;
  po.grace = plan.timeout + std::chrono::seconds(2);
  po.kill_after = std::chrono::seconds(5);
  // Every server is ours too: a secret of our own, as a one-server spawner
  // makes, and a free port unless one was asked for.
  const std::string token = plan.token.empty() ? new_job_secret() : plan.token;
  const int port = plan.master_port != 0 ? plan.master_port : free_tcp_port(plan.master_addr).value_or(plan.port());
  return run_processes(plan.servers, [&](int s) {
    LaunchPlan p = plan;
    p.server_index = s;
    p.token = token;
    p.master_port = port;
    return run_local_ranks(p, body);
  }, po);
}

}  // namespace fastgather::bench
