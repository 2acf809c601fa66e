// What a rank needs to join a job: its place in it, where the job meets, how
// long it waits, its secret and settings. Plain data with the arithmetic of
// the layout (which server holds which ranks), used by every layer from the
// launcher up.
#pragma once

#include <chrono>
#include <cstddef>
#include <optional>
#include <string>

#include "fastgather/settings.hpp"
#include "fastgather/status.hpp"

namespace fastgather {

// The longest job token a HELLO carries (FG_TOKEN).
constexpr size_t kMaxTokenBytes = 1024;

struct Config {
  int rank = -1;
  int world_size = -1;
  std::string master_addr = "127.0.0.1";
  int master_port = 29500;
  int servers = 1;       // SERVER_NUM (0, with a caller's store: find out from host identities)
  int server_index = 0;  // SERVER_INDEX
  // A peer that has not arrived after this long fails the call (0: wait forever).
  // A peer whose process has died is detected within ~10 ms regardless.
  std::chrono::milliseconds timeout{600'000};
  std::string token;  // FG_TOKEN: every rank must present the same one to the store
  // A listening socket on master_port that world rank 0's store uses (a copy
  // of it) instead of binding the port itself: a spawner that chose a free
  // port keeps it for the job this way. -1: none.
  int store_listen_fd = -1;
  // Names the job's shared-memory segments (1 to 64 of [0-9A-Za-z_]), so that
  // a spawner can remove what its ranks left; empty: rank 0 makes one up.
  std::string job_id;
  // The library's tunables; unset: Settings::from_environment() at create.
  std::optional<Settings> settings;

  // World ranks sit on servers in consecutive blocks; when the world does not
  // divide evenly, the first world_size % servers servers hold one more.
  int first_rank_on(int server) const { return first_rank_on_server(world_size, servers, server); }
  int ranks_on(int server) const { return first_rank_on(server + 1) - first_rank_on(server); }
  int server_of(int r) const { return server_of_rank(world_size, servers, r); }
  Status validate() const;

  static int first_rank_on_server(int world_size, int servers, int server);
  static int server_of_rank(int world_size, int servers, int rank);
};

}  // namespace fastgather
