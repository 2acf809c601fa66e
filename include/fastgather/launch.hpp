// Launch without a launcher, as the original script did: TP, DP,
// SERVER_NUM, SERVER_INDEX, MASTER_IP and PORT describe the job; this
// server's ranks are spawned as processes by run_local_ranks().
#pragma once

#include <signal.h>

#include <chrono>
#include <functional>
#include <optional>
#include <string>

#include "fastgather/config.hpp"
#include "fastgather/status.hpp"

namespace fastgather {

// Sanity bounds, checked before anything is allocated or forked.
constexpr int kMaxWorldSize = 4096;   // the network tag has 12 bits for a group member
constexpr int kMaxLocalRanks = 512;   // processes one spawner starts on one server

struct LaunchPlan {
  int tp = 1;
  int dp = 2;
  int servers = 1;
  int server_index = 0;
  std::string master_addr = "127.0.0.1";  // the same fields, spelled as in Config
  // 0: not given (PORT unset). A spawner that starts every rank of the job
  // (one server) then takes any free port, so that two jobs on one machine
  // never meet on one; ranks started by another launcher, or several
  // servers, need one port all know: kDefaultPort.
  int master_port = 0;
  static constexpr int kDefaultPort = 29500;
  int port() const { return master_port != 0 ? master_port : kDefaultPort; }
  std::chrono::milliseconds timeout{600'000};
  std::string token;
  std::string job_id;  // Config::job_id of every rank (run_local_ranks sets one)

  int world_size() const { return tp * dp; }
  // This server's ranks: a consecutive block (see Config::first_rank_on).
  int first_local_rank() const { return Config::first_rank_on_server(world_size(), servers, server_index); }
  int local_ranks() const { return first_local_rank_of(server_index + 1) - first_local_rank(); }
  Status validate() const;  // every server gets at least one rank, ...
  Config config_for_rank(int rank) const;

 private:
  int first_local_rank_of(int server) const { return Config::first_rank_on_server(world_size(), servers, server); }
};

// Every environment variable fastgather reads: name, what it accepts, meaning
// and default, one a line (all are checked before anything is forked).
std::string environment_help();

// A TCP port that is free on addr now (for PORT, where another launcher
// starts the ranks and they cannot be handed a socket); nullopt if none.
std::optional<int> free_tcp_port(const std::string& addr);

// A fresh random secret for FG_TOKEN / LaunchPlan::token (128 bits, hex).
std::string new_job_secret();

// Reads TP, DP, SERVER_NUM, SERVER_INDEX, MASTER_IP, PORT, FG_TIMEOUT_MS and
// FG_TOKEN over `defaults`.
Result<LaunchPlan> launch_plan_from_env(LaunchPlan defaults = {});

// Forks `count` processes running body(index) (its return value is the exit
// status) and supervises them until all have ended:
// - each dies with the supervisor (PR_SET_PDEATHSIG), whatever kills it;
// - SIGINT, SIGTERM and SIGHUP sent to the supervisor are passed on to them;
// - once one fails (non-zero status or a signal), the others get `grace` to
//   end on their own (peers of a failed rank report it within milliseconds),
//   then SIGTERM, then SIGKILL after `kill_after`;
// - every failure is printed with its label ("rank 3 exited with status 1").
// Returns 0 if all returned 0, 128+signal if stopped by a signal, else 1.
struct ProcessOptions {
  std::string what = "rank";
  int first_label = 0;  // label of index 0 in messages
  int death_signal = SIGKILL;
  std::chrono::milliseconds grace{2000};
  std::chrono::milliseconds kill_after{2000};
  std::function<void(int index)> in_child;  // first thing in the child (CPU binding, environment)
};
int run_processes(int count, const std::function<int(int index)>& body, const ProcessOptions& options = {});

// Runs body(config) once per rank of this server. If this process already is
// a rank (FG_RANK set by a spawner, or an MPI launcher's rank variables), it
// runs body for that rank only. Otherwise it forks local_ranks()
// processes under run_processes(), removes any shared memory the job left,
// and returns 0 only if every rank returned 0. With one server and no
// FG_TOKEN, the ranks use a secret of the spawner's own (new_job_secret()).
int run_local_ranks(const LaunchPlan& plan, const std::function<int(const Config&)>& body);

}  // namespace fastgather
