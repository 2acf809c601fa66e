// Launch without a launcher, as the original script did: TP, DP,
// SERVER_NUM, SERVER_INDEX, MASTER_IP and PORT describe the job; this
// server's ranks are spawned as processes by run_local_ranks().
#pragma once

#include <functional>
#include <string>

#include "fastgather/communicator.hpp"
#include "fastgather/status.hpp"

namespace fastgather {

struct LaunchPlan {
  int tp = 1;
  int dp = 2;
  int servers = 1;
  int server_index = 0;
  std::string master_ip = "127.0.0.1";
  int port = 29500;
  int timeout_ms = 5000;
  std::string token;

  int world_size() const { return tp * dp; }
  // This server's ranks: a consecutive block (see Config::first_rank_on).
  int first_local_rank() const { return Config::first_rank_on_server(world_size(), servers, server_index); }
  int local_ranks() const { return first_local_rank_of(server_index + 1) - first_local_rank(); }
  Status validate() const;  // every server gets at least one rank, ...
  Config config_for_rank(int rank) const;

 private:
  int first_local_rank_of(int server) const { return Config::first_rank_on_server(world_size(), servers, server); }
};

// Reads TP, DP, SERVER_NUM, SERVER_INDEX, MASTER_IP, PORT, FG_TIMEOUT_MS and
// FG_TOKEN over `defaults`.
Result<LaunchPlan> launch_plan_from_env(LaunchPlan defaults = {});

// Runs body(config) once per rank of this server. If this process already is
// a rank (FG_RANK set by a spawner, or an MPI launcher's rank variables), it
// runs body for that rank only. Otherwise it forks local_ranks()
// processes, waits for all of them, removes any shared memory the job left,
// and returns 0 only if every rank returned 0.
int run_local_ranks(const LaunchPlan& plan, const std::function<int(const Config&)>& body);

}  // namespace fastgather
