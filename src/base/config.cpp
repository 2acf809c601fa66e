// Config (include/fastgather/config.hpp): its checks and the layout's arithmetic.
#include "fastgather/config.hpp"

#include <algorithm>

#include <fmt/format.h>

namespace fastgather {

Status Config::validate() const {
  if (world_size < 1) return {ErrorKind::kInvalidArgument, fmt::format("world size {} must be at least 1", world_size)};
  if (rank < 0 || rank >= world_size) {
    return {ErrorKind::kInvalidArgument, fmt::format("rank {} is outside world size {}", rank, world_size)};
  }
  if (servers < 1 || world_size < servers) {
    return {ErrorKind::kInvalidArgument,
            fmt::format("world size {} cannot fill {} servers (every server needs a rank)", world_size, servers)};
  }
  if (server_index < 0 || server_index >= servers) {
    return {ErrorKind::kInvalidArgument, fmt::format("server index {} is outside 0..{}", server_index, servers - 1)};
  }
  if (server_of(rank) != server_index) {
    return {ErrorKind::kInvalidArgument,
            fmt::format("rank {} belongs to server {} (ranks {}..{}), not server {}", rank, server_of(rank),
                        first_rank_on(server_of(rank)), first_rank_on(server_of(rank) + 1) - 1, server_index)};
  }
  if (master_port < 1 || master_port > 65535) {
    return {ErrorKind::kInvalidArgument, fmt::format("port {} is not a TCP port every rank can find (1..65535)", master_port)};
  }
  if (token.size() > kMaxTokenBytes) {
    return {ErrorKind::kInvalidArgument,
            fmt::format("the job token (FG_TOKEN) is {} bytes; at most {}", token.size(), kMaxTokenBytes)};
  }
  return Status::Ok();
}

int Config::first_rank_on_server(int world, int servers, int server) {
  const int q = world / servers, rem = world % servers;
  return server * q + std::min(server, rem);
}

int Config::server_of_rank(int world, int servers, int r) {
  const int q = world / servers, rem = world % servers;
  if (q == 0) return r;  // more servers than ranks: refused by validate()
  const int big = rem * (q + 1);  // ranks on the servers that hold q+1
  return r < big ? r / (q + 1) : rem + (r - big) / q;
}

}  // namespace fastgather
